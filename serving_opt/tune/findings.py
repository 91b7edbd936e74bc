"""The sentences of a tuning report: what was gained, what limits it, how noisy."""

from __future__ import annotations

from serving_opt.tune.prove import ProvenPoint


def _point(points, label: str, workload: str, protocol: str) -> ProvenPoint | None:
    for point in points:
        if (point.label, point.workload, point.protocol) == (label, workload, protocol):
            return point
    return None


def upstream_rows_per_second(report, workload: str, protocol: str) -> tuple[float, str] | None:
    """Upstream's batching defaults as measured: the mean of the first and the last
    measurement where both were made (the machine drifts between them), and how."""
    from serving_opt.tune.report import AGAIN_LABEL, UPSTREAM_LABEL

    first = _point(report.proven, UPSTREAM_LABEL, workload, protocol)
    if first is None:
        return None
    again = _point(report.proven, AGAIN_LABEL, workload, protocol)
    if again is None:
        return first.measured.rows_per_second, "measured once"
    return ((first.measured.rows_per_second + again.measured.rows_per_second) / 2,
            "mean of first and last")


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def findings(report) -> tuple[str, ...]:
    """Comparisons per workload and protocol, the ceiling, the drift, how close it came."""
    from serving_opt.tune.report import AGAIN_LABEL, DEFAULT_LABEL, UPSTREAM_LABEL

    out = []
    points = report.proven
    # The comparison is of what tune hands the user: the recommended (measured best).
    chosen_label = report.recommended_label
    for workload in ("closed", "open"):
        for protocol in ("grpc", "rest"):
            tuned = _point(points, chosen_label, workload, protocol)
            default = _point(points, DEFAULT_LABEL, workload, protocol)
            upstream = _point(points, UPSTREAM_LABEL, workload, protocol)
            if tuned is None or default is None:
                continue
            t, d = tuned.measured, default.measured
            text = (f"{workload}/{protocol}: {chosen_label} {t.rows_per_second:,.0f} rows/s "
                    f"(p99 {t.p99_ms:.1f} ms): {_x(t.rows_per_second, d.rows_per_second)} "
                    f"{DEFAULT_LABEL} ({d.rows_per_second:,.0f} rows/s, p99 {d.p99_ms:.1f} ms)")
            if upstream is not None:
                u = upstream.measured
                rows, how = upstream_rows_per_second(report, workload, protocol)
                text += (f", {_x(t.rows_per_second, rows)} {UPSTREAM_LABEL} "
                         f"({rows:,.0f} rows/s, {how}; p99 {u.p99_ms:.1f} ms first)")
            if workload == "open":
                text += "; at a fixed rate rows/s only show what was answered"
            out.append(text)
    if report.recommendation is not None and chosen_label:
        settings = report.recommendation.settings
        out.append(f"recommended: {chosen_label} ({settings.describe()}), "
                   f"the {report.recommendation.basis}")
    if report.ceiling_rows_per_second > 0:
        best_measured = max((p.measured.rows_per_second for p in points
                             if p.workload == "closed"), default=0.0)
        how = report.ceiling_how or f"batch {report.ceiling_batch_size}"
        ceiling = report.ceiling_rows_per_second
        if best_measured:
            out.append(f"in-process ceiling: one session run alone does {ceiling:,.0f} rows/s "
                       f"({how}); the best proven closed-loop point reached "
                       f"{best_measured / ceiling:.0%} of it")
    again = next((p for p in points if p.label == AGAIN_LABEL), None)
    first = next((p for p in points if again is not None and p.label == UPSTREAM_LABEL
                  and (p.workload, p.protocol) == (again.workload, again.protocol)), None)
    if again is not None and first is not None and first.measured.rows_per_second > 0:
        a, b = first.measured, again.measured
        drift = b.rows_per_second / a.rows_per_second - 1
        out.append(f"machine drift: {UPSTREAM_LABEL} measured {a.rows_per_second:,.0f} rows/s "
                   f"(p99 {a.p99_ms:.0f} ms) first and {b.rows_per_second:,.0f} rows/s "
                   f"(p99 {b.p99_ms:.0f} ms) last, {drift:+.0%}: differences between "
                   "settings smaller than that are this machine's noise")
    if report.recommendation is None:
        closest = min((p for p in points if p.measured.ok), key=lambda p: p.measured.p99_ms,
                      default=None)
        if closest is not None:
            out.append(f"no proven setting met the objective; the lowest p99 measured was "
                       f"{closest.measured.p99_ms:.0f} ms ({closest.label}: "
                       f"{closest.settings.describe()}): raise --slo_p99_ms, or lower "
                       "--clients/--rate")
    return tuple(out)


def notes(report) -> tuple[str, ...]:
    """How it was measured, honestly."""
    out = []
    if report.backend == "local":
        out.append("proven on serving-opt's local TF-Serving-compatible server (a stand-in: "
                   "its --enable_batching batches like upstream's BatchingSession, but its "
                   "per-request cost is a Python server's); no Docker engine or "
                   "tensorflow_model_server binary ran here. TF Serving's C++ server spends "
                   "less per request, so its figures are expected higher")
    else:
        out.append(f"proven on {report.server}")
    out.append(f"{report.cores} cores; the load generator runs on the same machine and "
               "takes CPU from the server")
    return tuple(out)
