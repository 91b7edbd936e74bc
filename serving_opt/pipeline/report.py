"""The optimize and validate reports as people read them; JSON via core.rendering."""

from __future__ import annotations

from serving_opt.core.rendering import human_bytes, printable, ratio, table


def _agreement_cell(output) -> str:
    """``0.9995 [0.9972, 0.9999]``: the agreement and its 95% interval, when counted."""
    if output.agreement is None:
        return "-"
    interval = getattr(output, "interval", None)
    if not interval:
        return f"{output.agreement:.4f}"
    return f"{output.agreement:.4f} [{interval[0]:.4f}, {interval[1]:.4f}]"



def format_optimize_report(report) -> str:
    """The optimize report as aligned tables: outcome, sizes, stages, parity, latency."""
    out = []
    verdict = f"published {printable(report.output_dir)}" if report.published \
        else "NOT published"
    out.append(f"serving-opt optimize: {verdict}")
    out.append(f"  input      {printable(report.input_dir)} ({report.model_kind}, "
               f"{'frozen' if report.frozen else 'variables kept'}: {report.freeze_note})")
    out.append(f"  signatures {printable(', '.join(report.signatures))}")
    out.append(f"  transforms {printable(report.transforms or 'none')}")
    out.append(f"  grappler   {','.join(report.grappler_passes) or 'none'} "
               f"x{report.grappler_rounds}")
    for line in getattr(report, "transform_passes", ()):
        out.append(f"    pass     {printable(line)}")
    graph_def = getattr(report, "graph_def", {}) or {}
    if "input" in graph_def:
        feeds = ", ".join(f"{k}={v}" for k, v in graph_def["input"]["inputs"].items())
        out.append(f"  graphdef   in: serving_default takes {printable(feeds)}")
    if "output" in graph_def:
        out.append(f"  graphdef   out: {graph_def['output']['file']} "
                   f"({human_bytes(graph_def['output']['size_bytes'])}) in the version "
                   "directory")
    pinning = getattr(report, "input_shapes", {}) or {}
    if pinning:
        from serving_opt.savedmodel import shapes as shapes_lib

        pinned = shapes_lib.describe(pinning["pinned"])
        nodes = (f"; {pinning['nodes_unpinned']} -> {pinning['nodes_pinned']} nodes"
                 if "nodes_pinned" in pinning else "")
        out.append(f"  shapes     {printable(pinned)}: "
                   + ("kept" if pinning["kept"] else "not kept")
                   + f" ({printable(pinning.get('reason', ''))}{nodes})")
    if getattr(report, "sandbox", ""):
        out.append(f"  sandbox    {report.sandbox}")
    kept = sorted(getattr(report, "variables_kept", ()), key=lambda v: -v.nbytes)
    for var in kept[:5]:
        out.append(f"  kept       {printable(var.name)} as a variable: {printable(var.reason)}")
    if len(kept) > 5:
        rest = kept[5:]
        out.append(f"  kept       ... and {len(rest)} more as variables "
                   f"({human_bytes(sum(v.nbytes for v in rest))}; all in the JSON report)")
    for w in report.warnings:
        out.append(f"  warning    {printable(w)}")
    out.append("")
    before, after = report.size_before, report.size_after
    rows = []
    for label, attr in (("total", "total"), ("saved_model.pb", "saved_model_pb"),
                        ("variables", "variables"), ("assets", "assets"),
                        ("assets.extra", "assets_extra")):
        b = getattr(before, attr)
        a = getattr(after, attr) if after else None
        rows.append([label, human_bytes(b), human_bytes(a), ratio(b, a)])
    rows.append(["nodes", report.nodes_before, report.nodes_after,
                 ratio(report.nodes_before, report.nodes_after)])
    out.append(table(["size", "before", "after", "after/before"], rows))
    attempts = getattr(report, "attempts", ())
    if attempts:
        out.append("")
        out.append(table(["attempt", "configuration", "verdict", "then", "why"],
                         [[i, a.candidate.describe(), a.outcome, a.then, a.reason]
                          for i, a in enumerate(attempts, 1)]))
    out.append("")
    out.append(table(["stage", "seconds", "nodes", "note"],
                     [[s.name, f"{s.seconds:.2f}", s.nodes, s.note] for s in report.stages]))
    if report.ops_removed or report.ops_added:
        out.append("")
        changes = [f"-{n} {op}" for op, n in report.ops_removed.items()]
        changes += [f"+{n} {op}" for op, n in report.ops_added.items()]
        out.append("op changes: " + printable(", ".join(changes)))
    if report.parity is not None:
        out.append("")
        p = report.parity
        out.append(f"parity (atol={p.atol:g}, rtol={p.rtol:g}, {p.batches_run} batches; "
                   f"inputs: {', '.join(sorted(set(p.input_sources.values()))) or '-'})")
        lossy = any(getattr(o, "agreement", None) is not None for o in p.outputs)
        out.append(table(
            ["signature", "output", "dtype", "elements", "mismatches", "max abs diff",
             "max rel diff"] + (["top-1 agreement"] if lossy else []) + ["ok"],
            [[o.signature, o.output, o.dtype, o.elements, o.mismatches, f"{o.max_abs_diff:.3g}",
              f"{o.max_rel_diff:.3g}"]
             + ([_agreement_cell(o)] if lossy else [])
             + [("yes " + o.detail).strip() if o.ok else f"NO {o.detail}".strip()]
             for o in p.outputs],
        ))
    quantized = getattr(report, "quantized", ())
    if quantized:
        out.append("")
        out.append(table(["quantized weight", "as", "dequantized", "before", "after"],
                         [[q.name, q.mode, q.dequantized, human_bytes(q.bytes_before),
                           human_bytes(q.bytes_after)] for q in quantized]))
    cold = getattr(report, "cold_start", None)
    if cold is not None:
        out.append("")
        out.append(format_cold_start(cold))
    if report.benchmark is not None:
        out.append("")
        out.append(format_benchmark(report.benchmark))
    if getattr(report, "validation", None) is not None:
        out.append("")
        out.append(format_validation_report(report.validation))
    return "\n".join(out)


def format_cold_start(cold) -> str:
    """The cold-start table: load time, first request, the serving process's peak and
    steady (held) memory apart, and how much of it the runtime alone is.
    """
    out: list[str] = []
    b, a = cold.before, cold.after
    out.append(f"cold start (fresh process each, session loader, Grappler on; "
               f"median of {cold.rounds})")
    out.append(table(["measure", "before", "after", "after/before"], [
        ["load time (s)", f"{b.load_seconds:.3f}", f"{a.load_seconds:.3f}",
         ratio(b.load_seconds, a.load_seconds)],
        ["first request (ms)", f"{b.first_request_seconds * 1000:.1f}",
         f"{a.first_request_seconds * 1000:.1f}",
         ratio(b.first_request_seconds, a.first_request_seconds)],
        ["serving peak RSS", human_bytes(b.peak_rss_bytes), human_bytes(a.peak_rss_bytes),
         ratio(b.peak_rss_bytes, a.peak_rss_bytes)],
        *_steady_rss_rows(b, a),
        ["  of which the runtime", human_bytes(b.runtime_rss_bytes),
         human_bytes(a.runtime_rss_bytes), ""],
    ]))
    return "\n".join(out)


def _steady_rss_rows(before, after) -> list[list[str]]:
    """The cold-start table's steady-RSS row: what the serving process holds after its
    first request (private memory, measured by a forked probe), apart from its peak; none
    for reports measured before it was."""
    b, a = getattr(before, "steady_rss_bytes", 0), getattr(after, "steady_rss_bytes", 0)
    if not (b and a):
        return []
    return [["serving steady RSS (held)", human_bytes(b), human_bytes(a), ratio(b, a)]]


def format_benchmark(b) -> str:
    """The benchmark's table: per batch size the runs made and the interval of the pairs'
    after/before ratio, then the batch sizes the budget skipped and why.
    """
    budget = getattr(b, "budget_seconds", None)
    sizing = "" if budget is None else (
        f"; runs sized to {budget:.0f} s of the "
        + (f"{b.measure_seconds:g} s budget" if getattr(b, "measure_seconds", None)
           else "budget") + ", --measure_seconds")
    out = [f"benchmark of {printable(b.signature)} (same process, interleaved, Grappler on "
           f"at load{sizing})"]
    ratios = {r.batch_size: r for r in getattr(b, "ratios", ())}
    rows = [["load time (s)", f"{b.load_seconds_before:.3f}", f"{b.load_seconds_after:.3f}",
             ratio(b.load_seconds_before, b.load_seconds_after), "", ""]]
    for lb, la in zip(b.before, b.after):
        pairs = ratios.get(lb.batch_size)
        rows.append([f"p50 batch {lb.batch_size} (ms)", f"{lb.p50_ms:.3f}",
                     f"{la.p50_ms:.3f}", ratio(lb.p50_ms, la.p50_ms), min(lb.runs, la.runs),
                     pairs.describe() if pairs else ""])
        rows.append([f"p99 batch {lb.batch_size} (ms)", f"{lb.p99_ms:.3f}",
                     f"{la.p99_ms:.3f}", ratio(lb.p99_ms, la.p99_ms), "", ""])
    out.append(table(["measure", "before", "after", "after/before", "runs",
                      "pairs' median after/before (interval, confidence)"], rows))
    out.extend(f"  {printable(s.reason)}" for s in getattr(b, "skipped", ()))
    return "\n".join(out)


def format_validation_report(report) -> str:
    """The validation report as a table of checks plus the load phase."""
    verdict = "VALIDATED" if report.ok else "NOT VALIDATED"
    out = [f"serving-opt validate: {verdict} {printable(report.model_name)} version "
           f"{report.version} ({report.backend}: {printable(report.backend_note)})",
           f"  server     {printable(getattr(report, 'server', '') or report.backend)}",
           f"  tensorflow {getattr(report, 'tensorflow_version', '') or 'unknown'}",
           f"  sandbox    {getattr(report, 'sandbox', '') or 'unknown'}",
           f"  protocols  {', '.join(getattr(report, 'protocols', ('grpc',)))}",
           f"  model base {printable(report.model_base)}",
           f"  reference  {printable(report.reference_dir)}"]
    if getattr(report, "runtime_note", ""):
        out.append(f"  note       {printable(report.runtime_note)}")
    if report.warmup_file:
        out.append(f"  warmup     {printable(report.warmup_file)}")
    out.append("")
    out.append(table(["check", "ok", "detail"],
                     [[c.name, "yes" if c.ok else "NO", c.detail] for c in report.checks]))
    if report.load_test is not None:
        rest_lt = getattr(report, "rest_load_test", None)
        first = "gRPC" if "grpc" in getattr(report, "protocols", ("grpc",)) else "REST"
        loads = [(first, report.load_test)] + ([("REST", rest_lt)] if rest_lt else [])
        out.append("")
        out.append(table(
            ["load phase", "clients", "seconds", "requests", "errors", "req/s", "p50 ms",
             "p99 ms"],
            [[name, lt.concurrency, f"{lt.seconds:.1f}", lt.requests, lt.errors,
              f"{lt.requests_per_second:.0f}", f"{lt.p50_ms:.2f}", f"{lt.p99_ms:.2f}"]
             for name, lt in loads]))
    if report.failures:
        out.append("")
        out.extend(f"FAILED: {printable(f)}" for f in report.failures)
        if report.server_log_tail:
            out.append("server log (last lines):")
            out.extend("  " + printable(line)
                       for line in report.server_log_tail.rstrip().splitlines())
    return "\n".join(out)
