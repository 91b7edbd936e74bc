"""``--input_shapes``: the candidate built again with its inputs pinned, and kept only
where it measures faster than the same candidate unpinned.

    staging = pin_if_faster(run, frozen_graph, staging, build_rest)

Pinning lets the transforms and Grappler fold what depended only on the input's shape
(Shape ops, a resize's size, anchor grids), but the published signature then accepts
that shape alone. So the pinned graph has to earn it: it is built from the same frozen
graph, proven by the same gates, then both are timed side by side, in one measuring
process, at the pinned shape. It is kept when its latency is lower with 95% confidence;
otherwise (slower, within noise, not buildable, not measured, or no node fewer, which
is not timed) the unpinned candidate goes on, and the report says why
(``OptimizeReport.input_shapes``).
"""

from __future__ import annotations

from collections.abc import Callable

from serving_opt.errors import first_line
from serving_opt.pipeline import proving
from serving_opt.pipeline.run import Run
from serving_opt.savedmodel import shapes as shapes_lib
from serving_opt.savedmodel import writer
from serving_opt.savedmodel.graph import ServingGraph
from serving_opt.stages import benchmark as benchmark_lib

# The share of --measure_seconds the pinned/unpinned comparison may take.
BUDGET_FRACTION = 0.25


def pin_if_faster(run: Run, frozen: ServingGraph, staging: str,
                  build_rest: Callable[[ServingGraph], str], built_from: tuple) -> str:
    """The staging directory to go on with: the pinned candidate's (``staging`` is then
    discarded) or ``staging`` itself. ``build_rest`` builds, writes and proves a
    candidate from a frozen graph (inline .. parity), as it built ``staging``;
    ``built_from`` is the run's snapshot from before it did.

    The run record ends as the taken build's, with one ``pin_shapes`` stage saying why.
    """
    pinned = run.source.pinned
    described = shapes_lib.describe(pinned)
    record = {"pinned": {k: {a: list(d) for a, d in v.items()} for k, v in pinned.items()},
              "kept": False}
    unpinned_nodes = run.graph.node_count() if run.graph is not None else 0
    start = run.snapshot()
    run.progress("-", f"building the candidate again with {described} (--input_shapes)")
    try:
        pinned_staging = build_rest(shapes_lib.pin_graph(frozen, pinned))
    except Exception as e:  # noqa: BLE001 - the unpinned candidate stands on its own
        run.restore(start)
        return _unpinned(run, record, staging, f"the pinned graph failed: {first_line(e)}")
    pinned_graph = run.graph
    record.update(nodes_unpinned=unpinned_nodes, nodes_pinned=pinned_graph.node_count())
    if record["nodes_pinned"] >= unpinned_nodes:
        # Nothing folded: it can only serve fewer shapes. Not worth the measuring time
        # (two more loads of the model: minutes for a 1 GB one).
        run.restore(start)
        writer.discard(pinned_staging)
        return _unpinned(run, record, staging, f"it folds nothing ({unpinned_nodes} -> "
                                               f"{record['nodes_pinned']} nodes), so it "
                                               "was not timed")
    end = run.snapshot()
    try:
        ratio, bench_note = _compare(run, staging, pinned_staging)
    except BaseException:
        writer.discard(pinned_staging)
        raise
    run.restore(end)  # the comparison's stage: its figure goes into pin_shapes's note
    if ratio is not None:
        record["ratio"] = {"batch_size": ratio.batch_size, "median": ratio.median,
                           "low": ratio.low, "high": ratio.high,
                           "confidence": ratio.confidence, "pairs": ratio.pairs}
    if ratio is None or ratio.high >= 1.0:
        run.restore(start)
        writer.discard(pinned_staging)
        return _unpinned(run, record, staging, bench_note)
    # Kept: the record is the pinned build's; the unpinned build's stages go.
    run.forget_between(built_from, start)
    writer.discard(staging)
    record.update(kept=True, reason=bench_note)
    run.input_shapes = record
    with run.stage("pin_shapes", None) as stage:
        stage.done(pinned_graph, f"{described}: kept, {bench_note}")
    run.warn(f"--input_shapes: the published signatures accept only {described}")
    return pinned_staging


def _unpinned(run: Run, record: dict, staging: str, reason: str) -> str:
    record["reason"] = reason
    run.input_shapes = record
    with run.stage("pin_shapes", None) as stage:
        stage.done(run.graph, f"{shapes_lib.describe(run.source.pinned)}: not kept, {reason}")
    run.warn(f"--input_shapes: published without pinning: {reason}")
    return staging


def _compare(run: Run, unpinned: str, pinned: str):
    """(ratio pinned/unpinned latency at the measured batch size or None, a note)."""
    import time

    settings = run.plan.measure
    if settings.benchmark_runs == 0:
        return None, "not measured (--benchmark_runs=0), and pinning is kept only where " \
                     "it measures faster"
    keys = run.source.keys
    key = next((k for k in keys if k in run.source.pinned), keys[0])
    sizes = proving.measured_batch_sizes(run)[:1]
    share = settings.measure_seconds * BUDGET_FRACTION
    runs = settings.benchmark_runs or benchmark_lib.MAX_RUNS
    with run.stage("pin_compare", f"timing the pinned candidate against the unpinned one, "
                                  f"side by side (batch {sizes[0]}, up to {share:.0f} s)",
                   step="-") as stage:
        report = benchmark_lib.benchmark_in_fresh_process(
            unpinned, pinned, run.plan.tags, key,
            schedule=benchmark_lib.BenchmarkSchedule(
                batch_sizes=sizes, runs=runs, loads=1,
                deadline=None if settings.benchmark_runs else time.monotonic() + share),
            inputs=benchmark_lib.BenchmarkInputs(
                examples=run.plan.inputs.examples, seed=run.plan.inputs.seed,
                shapes=run.source.pinned),
            progress=lambda line: run.progress("-", line))
        ratio = report.ratio(sizes[0])
        stage.done(run.graph, ratio.describe() if ratio else "not measured")
    if ratio is None:
        return None, f"batch {sizes[0]} could not be timed within {share:.0f} s"
    verdict = "faster" if ratio.high < 1.0 else \
        "slower" if ratio.low > 1.0 else "no faster within the noise"
    return ratio, (f"latency pinned/unpinned {ratio.describe()} at batch {sizes[0]} over "
                   f"{ratio.pairs} pairs: {verdict}")
