"""Stages 6b-9 of optimize: what a written candidate must pass, and how it is measured.

The target runtime's op registry, the parity gate (exact, or the lossy gate with
``--quantize``), the compare gate, the TF2 loader's check; then the cold start and the
benchmark, both models side by side, and the measures on which the candidate is worse.
Each wraps stages of ``serving_opt.stages`` in the run record; a refused candidate
raises (ParityError, ServingOptError) and :mod:`serving_opt.pipeline.attempts` judges it.

    prove(run, graph, staging)
    worse = measure(run, staging)      # [] or ["load time 1.40x ...", ...]
"""

from __future__ import annotations

import dataclasses
import time

from serving_opt.core import gates, measuring
from serving_opt.errors import ParityError, first_line
from serving_opt.pipeline import plan as plan_lib
from serving_opt.pipeline.run import Run
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader, unbound_variables
from serving_opt.savedmodel import shapes as shapes_lib
from serving_opt.savedmodel.graph import ServingGraph
from serving_opt.stages import benchmark as benchmark_lib
from serving_opt.stages import coldstart, parity
from serving_opt.stages import regression as regression_lib
from serving_opt.stages.tf2_load import check_loads_in_tf2


def check_target_runtime(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 6b: every op and attr written must be in the target TF Serving's TensorFlow.

    The registry was resolved before any work (``worker.resolve_target``: installing a
    runtime needs the network, which no sandbox has). The written file is checked (the
    writer strips attrs at their default value, as TF does, so a new attr left at its
    default does not count).
    """
    from serving_opt.serving import runtime as runtime_lib

    target = plan_lib.target_version(run.plan)
    with run.stage("target_check", f"checking ops against TensorFlow {target}'s registry",
                   step="-") as stage:
        if run.target_registry is None:
            stage.done(graph, f"skipped: no TensorFlow {runtime_lib.major_minor(target)} "
                       f"runtime here (--serving_version={target} installs one)")
            return
        tf_version, source, registry = run.target_registry
        saved_model = loader.read_saved_model(staging)
        checked = sum(runtime_lib.check_graph(mg.graph_def, registry, tf_version)
                      for mg in saved_model.meta_graphs)
        stage.done(graph, f"{checked} nodes: every op and attr is in TensorFlow "
                   f"{tf_version} ({source})")


def _lossy_gate(run: Run) -> gates.LossyGate | None:
    gate = run.plan.gate
    return gates.LossyGate(gate.min_top1_agreement, gate.max_probability_error) \
        if run.plan.build.lossy else None


def prove(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 7: the parity gate on every signature, then the TF2 loader's structure check."""
    plan, keys = run.plan, run.source.keys
    batch_size, batches = plan.gate.parity_batch_size, plan.gate.parity_batches
    lossy = _lossy_gate(run)
    if lossy is not None:
        # An agreement rate is a proportion: 32 rows cannot tell 99.5% from 97%.
        batch_size, batches = max(batch_size, 64), max(batches, 8)
    pinned_batch = shapes_lib.batch_size(run.source.pinned)
    if pinned_batch is not None:
        # The pinned batch is the only one a pinned candidate takes: more batches instead.
        batches = max(batches, -(-batch_size * batches // pinned_batch))
        batch_size = pinned_batch
    with run.stage("parity", f"parity gate on {len(keys)} signature(s)") as stage:
        def gate_on(num_batches: int):
            return parity.check_parity(
                run.model_dir, staging, plan.tags, keys,
                inputs=parity.ParityInputs(
                    user_inputs=plan.user_inputs, batch_size=batch_size,
                    num_batches=num_batches, seed=plan.inputs.seed, shapes=run.source.pinned),
                atol=plan.tolerance.atol, rtol=plan.tolerance.rtol, lossy=lossy)

        started = time.monotonic()
        report = gate_on(batches)
        if lossy is not None:
            report = _until_decided(run, report, gate_on, batches,
                                    first_round=time.monotonic() - started)
            _warn_synthesized(run, report)
        run.parity = report
        stage.done(graph, report.summary())
        if not report.ok:
            if not run.frozen:
                run.warn(f"variables kept: {run.freeze_note}")
            lossy_work = list(plan.lossy) + ([f"--quantize={plan.build.quantize}"]
                                              if lossy is not None else [])
            fix = (f"drop the lossy work ({', '.join(lossy_work)}), or loosen the gate if the "
                   "drift is acceptable" if lossy_work else
                   "no lossy transform was asked for: report this; --freeze=never or "
                   "--transforms=none narrows down which step changed the answers")
            error = ParityError(f"{report.summary()}; nothing was published", fix)
            error.difference = report.summary()  # what differed, without the verdict
            raise error
    if plan.gate.compare_examples:
        compare_gate(run, graph, staging)
    with run.stage("tf2_load", "checking it loads with tf.saved_model.load", step="-") as stage:
        # The session loader ran in the gate; TF2's loader must take the result too.
        stage.done(graph, check_loads_in_tf2(staging, run.model_dir, plan.tags,
                                             graph.signature_defs))


# The share of --measure_seconds the lossy gate may spend drawing more rows while an
# agreement interval straddles its threshold.
UNDECIDED_BUDGET_FRACTION = 0.25
# Each round draws this many times the rows of the last.
UNDECIDED_GROWTH = 4


def decided_refusals(report) -> list:
    """The outputs refused for certain: a verdict that failed and is not the point
    estimate of a straddling interval (a value moved past ``--max_probability_error``,
    an agreement interval wholly below its threshold, a broken output). More rows
    cannot undo any of them, so the report is refused whatever the undecided say."""
    return [o for o in report.outputs if not o.ok and not o.undecided]


def _until_decided(run: Run, report, gate_on, batches: int, first_round: float = 0.0):
    """The lossy gate's sequential draw: while an agreement interval straddles the
    threshold and no other output decided a refusal already, run the gate again on
    ``UNDECIDED_GROWTH`` times the synthesized rows, as long as that round fits in a
    quarter of ``--measure_seconds`` (the user's ``--examples`` are all used already:
    there is nothing more to draw). Returns the last report; an output still undecided
    keeps its point estimate's verdict, and a warning gives its interval, or, when a
    refusal is certain, names the output and criterion that decided it."""
    budget = run.plan.measure.measure_seconds * UNDECIDED_BUDGET_FRACTION
    drawn = run.plan.user_inputs is None
    started = time.monotonic()
    last_round = first_round  # seconds the last round took
    while report.undecided() and drawn and not decided_refusals(report):
        spent = time.monotonic() - started
        # A round of 4x the rows takes at most about 4x the last (the loads are shared).
        if budget <= 0 or spent + last_round * UNDECIDED_GROWTH > budget:
            break
        first = report.undecided()[0]
        batches *= UNDECIDED_GROWTH
        run.progress("-", f"{first.signature}/{first.output}: agreement interval straddles "
                     f"{run.plan.gate.min_top1_agreement} on {first.rows} rows; drawing "
                     f"{UNDECIDED_GROWTH}x the rows (within {budget:.0f} s, a quarter of "
                     "--measure_seconds)")
        round_started = time.monotonic()
        report = gate_on(batches)
        last_round = time.monotonic() - round_started
    refused = decided_refusals(report)
    if refused and report.undecided():
        o = refused[0]
        left = ", ".join(f"{u.signature}/{u.output}" for u in report.undecided())
        run.warn(f"lossy gate: refused for certain by {o.signature}/{o.output} "
                 f"({o.detail or 'failed'}); the agreement of {left} straddles "
                 f"{run.plan.gate.min_top1_agreement} and is left undecided: more rows "
                 "cannot change the refusal, so no more were drawn")
        return report
    for o in report.undecided():
        lo, hi = o.interval or (0.0, 1.0)
        run.warn(f"lossy gate: {o.signature}/{o.output} agreement {o.agreement or 0:.4f} "
                 f"on {o.rows} rows, 95% interval [{lo:.4f}, {hi:.4f}], straddles "
                 f"{run.plan.gate.min_top1_agreement}: decided on the point estimate "
                 + ("(every --examples row used)" if not drawn else
                    "(its share of --measure_seconds ran out)")
                 + "; more --examples would decide it")
    return report


def _warn_synthesized(run: Run, report) -> None:
    """Under the lossy gate, synthesized inputs are a stand-in for traffic: say so, with
    the share of near-tie rows they gave (random vocabulary tokens make many)."""
    if not any(inputs_lib.is_synthesized(s) for s in report.input_sources.values()):
        return
    counted = [o for o in report.outputs if o.rows is not None and o.near_ties is not None]
    rows = sum(o.rows + o.near_ties for o in counted)
    ties = sum(o.near_ties for o in counted)
    share = f" ({ties / rows:.0%} of their rows were near-ties, not counted)" if rows else ""
    run.warn(f"lossy gate: agreement measured on synthesized inputs{share}; pass --examples "
             "drawn from real traffic to measure what users will see")


def compare_gate(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 7b (``--compare_examples``): both models on every example of the shards, on
    Beam's DirectRunner, judged like the parity gate (exact, or the lossy gate)."""
    from serving_opt import compare as compare_lib

    plan = run.plan
    shards = plan.gate.compare_examples
    with run.stage("compare", f"comparing on {shards}", step="-") as stage:
        report = compare_lib.compare(run.model_dir, staging, shards, compare_lib.CompareOptions(
            signatures=tuple(plan.build.signatures), saved_model_tags=plan.inputs.saved_model_tags,
            atol=plan.tolerance.atol, rtol=plan.tolerance.rtol,
            allow_file_ops=plan.trust.allow_file_ops))
        failures = report.failures(_lossy_gate(run))
        stage.done(graph, f"{report.examples} examples: "
                   + ("ok" if not failures else failures[0]))
    if failures:
        raise ParityError(f"compare on {shards}: {failures[0]}; nothing was published",
                          "see serving-opt compare for the full report of the examples")


def measure(run: Run, staging: str) -> list[str]:
    """Stages 8-9: cold start in fresh processes, then steady-state latency side by side;
    returns the measures on which the candidate is worse than the original.

    All of it within ``--measure_seconds`` (:func:`benchmark_share`): the cold start
    counts against the budget, the benchmark is sized to half of what it leaves beyond a
    second cold start, and the other half is kept for a confirmation.
    """
    settings, keys = run.plan.measure, run.source.keys
    key = "serving_default" if "serving_default" in keys else keys[0]
    run.cold_start = None
    run.benchmark = None
    if unbound_variables.find(run.source.meta_graph, run.model_dir):
        run.progress("cold_start", "cold start and benchmark skipped: the original cannot "
                     "answer as TF Serving loads it")
        run.warn("cold start and benchmark skipped: the original cannot answer a request "
                 "as TF Serving loads it, so there is nothing to compare with")
        return []
    budget = measuring.Budget(settings.measure_seconds)
    if settings.cold_start:
        message = f"cold start: load + first request in fresh processes " \
                  f"(x{settings.cold_start_rounds})"
        with run.stage("cold_start", message) as stage:
            run.cold_start = _cold_start(run, staging, key)
            stage.done(run.graph, _cold_note(run.cold_start))
    else:
        run.progress("cold_start", "cold start skipped (--nocold_start)")
        run.warn("cold-start gate off (--nocold_start): load time, first request and "
                 "memory were not compared")
    cold_seconds = budget.elapsed()
    sized = settings.benchmark_runs is None  # from the budget, not --benchmark_runs
    share = benchmark_share(budget, cold_seconds, run.cold_start) if sized else None
    if settings.benchmark_runs == 0:
        run.progress("benchmark", "benchmark skipped")
    elif sized and share is None:
        run.progress("benchmark", "benchmark skipped: no time left in the budget")
        run.warn(f"benchmark skipped: the cold start took {cold_seconds:.0f} s of the "
                 f"{settings.measure_seconds:g} s budget, leaving too little to measure "
                 "latency (raise --measure_seconds, or set --benchmark_runs)")
    else:
        message = (f"benchmark: load time and latency, {settings.benchmark_runs} interleaved "
                   "runs" if share is None else
                   f"benchmark: load time and latency, interleaved runs sized to {share:.0f} s "
                   f"of the {settings.measure_seconds:g} s budget (--measure_seconds)")
        with run.stage("benchmark", message) as stage:
            try:
                run.benchmark = _steady_state(run, staging, key, share=share)
            except Exception as e:  # noqa: BLE001 - a failed measurement gates nothing
                run.warn(f"benchmark skipped: {first_line(e)}")
            stage.done(run.graph, _bench_note(run.benchmark) if run.benchmark
                       else "failed, see warnings")
        for skipped in run.benchmark.skipped if run.benchmark else ():
            run.warn(f"benchmark: {skipped.reason} (raise --measure_seconds, or set "
                     "--benchmark_runs, to measure it)")
    worse = regression_lib.regressions(run.cold_start, run.benchmark,
                                       run.plan.gate.regression_tolerance)
    if worse:
        worse = _confirm(run, staging, key, worse, budget)
    return worse


# The benchmark's part of what the cold start leaves: the rest is kept for confirming a
# regression, which repeats the cold start and the benchmark of what looked worse.
BENCHMARK_FRACTION = 0.5
MIN_BENCHMARK_SECONDS = 5.0  # below this, starting a measuring process is all it would do


def benchmark_share(budget: measuring.Budget, cold_seconds: float, cold) -> float | None:
    """Seconds the benchmark gets: half of what is left once a second cold start (a
    confirmation may need one) is set aside; None when that is too little to load both
    models and time a few runs.
    """
    share = (budget.left() - cold_seconds) * BENCHMARK_FRACTION
    loads = cold.before.load_seconds + cold.after.load_seconds if cold is not None else 0.0
    return share if share >= max(MIN_BENCHMARK_SECONDS, 2 * loads) else None


def _confirm(run: Run, staging: str, key: str, worse: list[str],
             budget: measuring.Budget) -> list[str]:
    """A regression counts only if a second measurement shows it too.

    A busy build machine (two test shards, a compile) can slow one fresh process by
    more than the tolerance; a real regression (a 1 GB constant graph) reproduces. Only
    what looked worse is measured again (``regression.to_remeasure``): the cold start if
    one of its figures did, the batch sizes whose latency did, with the runs they had
    the first time (fewer could not show the figure the gate judged).
    """
    again_plan = regression_lib.to_remeasure(worse)
    cold, bench = run.cold_start, run.benchmark
    redo_cold = cold is not None and again_plan.cold_start
    redo = [b for b in again_plan.batch_sizes
            if bench is not None and any(lat.batch_size == b for lat in bench.after)]
    what = ", ".join(regression_lib.measure_of(line) for line in worse)
    run.progress("-", f"worse on {worse[0]}; measuring again to confirm ({what}; "
                      f"{budget.left():.0f} s of the budget left)")
    with run.stage("confirm", "confirming the regression", step="-") as stage:
        if redo_cold:
            cold = _cold_start(run, staging, key)
        if redo:
            runs = {lat.batch_size: lat.runs for lat in bench.after if lat.batch_size in redo}
            seconds = sum(c.pair_seconds * runs[c.batch_size] for c in bench.calibration
                          if c.batch_size in runs)
            run.progress("-", "confirming " + ", ".join(f"batch {b} x {n} runs"
                                                        for b, n in runs.items())
                         + f", about {seconds:.0f} s (and loading both models)")
            again = _steady_state(run, staging, key, batch_sizes=tuple(redo),
                                  runs_per_batch=runs)
            bench = benchmark_lib.with_remeasured(bench, again)
        again_worse = regression_lib.regressions(cold, bench, run.plan.gate.regression_tolerance)
        stage.done(run.graph, "; ".join(again_worse) or "not reproduced")
    confirmed = regression_lib.confirmed(worse, again_worse)
    if confirmed:
        run.cold_start, run.benchmark = cold, bench  # the measurement that confirmed it
    else:
        run.warn(f"a first measurement was worse ({worse[0]}); a second one was not")
    return confirmed


def _cold_start(run: Run, staging: str, key: str):
    """Both models loaded in fresh processes, answering one synthesized request."""
    # The user's examples when given: a model that checks its inputs (an Assert that
    # x >= 0) must meet the requests it will really get, not synthesized ones. Synthesized,
    # they are made the way the parity gate found the original runs (scalars, say).
    mode = inputs_lib.mode_of(run.parity.input_sources.get(key)) if run.parity else None
    feeds = inputs_lib.signature_feeds(run.source.meta_graph, run.model_dir,
                                       user=run.plan.user_inputs, seed=run.plan.inputs.seed,
                                       shapes=run.source.pinned)(
        key, shapes_lib.batch_size(run.source.pinned) or 1, mode=mode).batches[0]
    return coldstart.measure(run.model_dir, staging, run.plan.tags, key, feeds,
                             rounds=run.plan.measure.cold_start_rounds)


def _steady_state(run: Run, staging: str, key: str, *, share: float | None = None,
                  batch_sizes: tuple[int, ...] | None = None,
                  runs_per_batch: dict[int, int] | None = None):
    """The interleaved latency benchmark of both models, in a measuring process: sized to
    ``share`` seconds, or ``--benchmark_runs`` runs (``runs_per_batch``'s for those)."""
    plan = run.plan
    settings = plan.measure
    deadline = None if share is None else time.monotonic() + share
    runs = benchmark_lib.MAX_RUNS if settings.benchmark_runs is None \
        else settings.benchmark_runs
    loads = 3
    cold = run.cold_start
    if runs_per_batch:
        loads = 1  # a confirmation: the load time is not gated, the cold start has it
    elif share is not None and cold is not None and 3 * (
            cold.before.load_seconds + cold.after.load_seconds) > \
            benchmark_lib.LOAD_SHARE * share:
        loads = 1  # loading is what a slow model is slowest at; the cold start timed it
    mode = inputs_lib.mode_of(run.parity.input_sources.get(key)) if run.parity else None
    sizes = batch_sizes or measured_batch_sizes(run)
    if mode in inputs_lib.SINGLE_ROW_MODES and sizes != (1,):
        run.warn(f"benchmark at batch 1 only: signature {key} runs on {mode} inputs "
                 f"(the parity gate's synthesized {mode}), one row per request")
        sizes = (1,)
    report = benchmark_lib.benchmark_in_fresh_process(
        run.model_dir, staging, plan.tags, key,
        schedule=benchmark_lib.BenchmarkSchedule(
            batch_sizes=sizes, runs=runs, loads=loads, deadline=deadline,
            runs_per_batch=runs_per_batch),
        inputs=benchmark_lib.BenchmarkInputs(
            examples=plan.inputs.examples, seed=plan.inputs.seed, shapes=run.source.pinned,
            input_mode=mode),
        progress=lambda line: run.progress("-", line))
    return dataclasses.replace(report, budget_seconds=share,
                               measure_seconds=None if share is None else settings.measure_seconds)


def measured_batch_sizes(run: Run) -> tuple[int, ...]:
    """``--benchmark_batch_sizes``, or the batch ``--input_shapes`` pins (the only one the
    user serves, and the only one a pinned candidate takes)."""
    pinned = shapes_lib.batch_size(run.source.pinned)
    return (pinned,) if pinned is not None else tuple(run.plan.measure.benchmark_batch_sizes)


def _bench_note(bench) -> str:
    """``batch 1 x 23 runs 0.98x (0.95-1.01, 95%); batch 32 skipped``"""
    parts = [f"batch {lat.batch_size} x {lat.runs} runs"
             + (f" {r.describe()}" if (r := bench.ratio(lat.batch_size)) else "")
             for lat in bench.after]
    parts += [f"batch {s.batch_size} skipped" for s in bench.skipped]
    return "; ".join(parts)


def _cold_note(cold) -> str:
    return (f"load {cold.ratio('load_seconds'):.2f}x, first request "
            f"{cold.ratio('first_request_seconds'):.2f}x, peak RSS "
            f"{cold.ratio('peak_rss_bytes'):.2f}x")
