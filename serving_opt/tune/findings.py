"""The sentences of a tuning report: what was gained, what limits it, and how far to
trust the model.

Example:
    >>> findings(report)[0]
    'closed/grpc: tuned 612 rows/s (p99 88 ms): 1.79x TF Serving default ...'
"""

from __future__ import annotations

import math

from serving_opt.tune.prove import FLAG_DIFFERENCE, ProvenPoint


def _point(points, label: str, workload: str, protocol: str) -> ProvenPoint | None:
    for point in points:
        if (point.label, point.workload, point.protocol) == (label, workload, protocol):
            return point
    return None


def upstream_rows_per_second(report, workload: str, protocol: str) -> tuple[float, str] | None:
    """Upstream's batching defaults as measured: the mean of the first and the last
    measurement where both were made (the machine drifts between them), and how.

    Example:
        >>> upstream_rows_per_second(report, "closed", "grpc")
        (189.0, 'mean of first and last')
    """
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
    """Comparisons per workload and protocol, the ceiling, the server's cost, the model."""
    from serving_opt.tune.report import AGAIN_LABEL, DEFAULT_LABEL, TUNED_LABEL, UPSTREAM_LABEL

    out = []
    points = report.proven
    # The comparison is of what tune hands the user: the recommended (measured best)
    # setting, which is the model's first choice unless a runner-up measured better.
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
    if report.recommendation is not None and chosen_label != TUNED_LABEL:
        settings = report.recommendation.settings
        out.append(f"recommended: {chosen_label} ({settings.describe()}), "
                   f"the {report.recommendation.basis}")
    if report.ceiling_rows_per_second > 0:
        best_measured = max((p.measured.rows_per_second for p in points
                             if p.workload == "closed"), default=0.0)
        how = report.ceiling_how or f"batch {report.ceiling_batch_size}"
        scale = _ceiling_scale(report)
        ceiling = report.ceiling_rows_per_second / scale
        if best_measured:
            text = f"in-process ceiling: the session alone does {ceiling:,.0f} rows/s ({how})"
            if scale != 1.0:
                text += (f" at the machine speed of its calibration ("
                         f"{report.ceiling_rows_per_second:,.0f} as profiled)")
            out.append(text + f"; the best proven closed-loop point reached "
                       f"{best_measured / ceiling:.0%} of it")
    several = len({c.threads for c in report.calibrations}) > 1
    for calibration in report.calibrations:
        service = calibration.service
        run_ms = calibration.run_s * service.run_scale * 1000
        where = calibration.protocol
        if several:
            where += f", threads {calibration.threads.describe()}"
        text = (f"server cost per request ({where}): {service.parallel_s * 1000:.2f} ms "
                f"outside a {run_ms:.2f} ms session run")
        rows = report.objective.rows_per_request
        if service.cpu_s > 0:
            text += (f", and {service.cpu_s * 1000:.2f} ms of processor time taken from the "
                     "runs (the server's own work and the load generator's, on the same "
                     f"{report.cores} cores): at most {report.cores / service.cpu_s * rows:,.0f}"
                     " rows/s even if the runs cost nothing")
        if service.serial_s > 0:
            text += (f"; {service.serial_s * 1000:.2f} ms of it spent one request at a time: "
                     f"at most {rows / service.serial_s:,.0f} rows/s")
        if service.run_scale != 1.0:
            text += (f"; in the server a session run took {service.run_scale:.2f}x its "
                     "profiled time")
        if service.parallel_s * 1000 > run_ms:
            text += "; the server's own delay dominates the model's"
        out.append(text)
    again = next((p for p in points if p.label == AGAIN_LABEL), None)
    first = next((p for p in points if again is not None and p.label == UPSTREAM_LABEL
                  and (p.workload, p.protocol) == (again.workload, again.protocol)), None)
    if again is not None and first is not None and first.measured.rows_per_second > 0:
        a, b = first.measured, again.measured
        drift = b.rows_per_second / a.rows_per_second - 1
        out.append(f"machine drift: {UPSTREAM_LABEL} measured {a.rows_per_second:,.0f} rows/s "
                   f"(p99 {a.p99_ms:.0f} ms) first and {b.rows_per_second:,.0f} rows/s "
                   f"(p99 {b.p99_ms:.0f} ms) last, {drift:+.0%}: differences between "
                   "settings, or between model and measurement, smaller than that are "
                   "this machine's noise")
    judged = [p for p in points if p.predicted is not None and not p.calibration]
    close = [p for p in judged if not p.flagged]
    if judged:
        text = (f"model vs measurement: within {FLAG_DIFFERENCE:.0%} on rows/s and p99 at "
                f"{len(close)} of {len(judged)} predicted points")
        flagged = [p for p in judged if p.flagged]
        if flagged:
            text += "; off at " + "; ".join(
                f"{p.label} {p.workload}/{p.protocol} (rows/s {_pct(p.throughput_error)}, "
                f"p99 {_pct(p.p99_error)})" for p in flagged)
        out.append(text)
    search = report.search
    if search.padding_cost:
        out.append(search.padding_cost)
    if search.best is not None and search.open_capacity > 0:
        out.append(f"the model's best setting sustains up to {search.open_capacity:,.0f} "
                   f"requests/s of open-loop (Poisson) traffic with p99 under "
                   f"{report.objective.slo_p99_ms:g} ms")
    if search.best is None:
        closest = min((c for c in search.front), key=lambda c: c.primary().p99_ms,
                      default=None)
        if closest is not None:
            out.append(f"no setting meets the objective in the model; the lowest p99 is "
                       f"{closest.primary().p99_ms:.0f} ms ({closest.settings.describe()}): "
                       "raise --slo_p99_ms, or lower --clients/--rate")
    return tuple(out)


def _ceiling_scale(report) -> float:
    """The run scale fitted for the ceiling's thread setting (else the first fit's)."""
    for calibration in report.calibrations:
        if calibration.threads == report.ceiling_threads:
            return calibration.service.run_scale
    return report.calibrations[0].service.run_scale if report.calibrations else 1.0


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.0%}"


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
               "takes CPU from the server, as the issue's measurements did")
    return tuple(out)
