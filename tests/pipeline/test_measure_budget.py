"""--measure_seconds: optimize's measurements bounded by a time budget the user can see.

The benchmark calibrates each batch size (one warm run of each model), then sizes its
runs to the budget; a batch size that cannot fit a few runs is skipped and named. The
models are real SavedModels whose cost is a sleep that grows with the batch, so which
batch size fits a budget does not depend on how fast (or how loaded) this machine is.
Nothing here asserts a duration: the checks are on structure (which batch sizes ran or
were skipped) and on run counts bounded by the calibration the report records.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from serving_opt import optimize
from serving_opt.cli import main as cli
from serving_opt.errors import UsageError
from serving_opt.options import BuildOptions, GateOptions, MeasureOptions, OptimizeOptions
from serving_opt.pipeline.report import format_optimize_report
from serving_opt.stages import benchmark as benchmark_lib
from serving_opt.stages import coldstart
from serving_opt.stages import regression as regression_lib

pytestmark = pytest.mark.in_process  # our own models, stages in this process

SIGNATURE = "serving_default"
SLOW_BATCH = 32


def build_sleepy_model(export_dir: str, micros: int, power: int) -> str:
    """A SavedModel answering ``y = sum(x)`` after sleeping ``rows**power * micros`` µs: a
    cost set by the batch size alone, whatever the machine."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as data_testing

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        rows = tf.cast(tf.shape(x)[0], tf.int64)
        slept = tf.data.Dataset.range(1).apply(data_testing.sleep(rows ** power * micros)) \
            .reduce(tf.constant(0, tf.int64), lambda total, value: total + value)
        y = tf.identity(tf.reduce_sum(x, axis=1) + tf.cast(slept, tf.float32), name="y")
        with tf1.Session(graph=graph) as sess:
            builder = tf1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    SIGNATURE: tf1.saved_model.predict_signature_def({"x": x}, {"y": y})})
            builder.save()
    return export_dir


@pytest.fixture(scope="module")
def sleepy_dir(tmp_path_factory) -> str:
    """Batch 1: ~5 ms a run; batch 32: ~5 s (32**2 x 5 ms), so 5 runs of both models and
    a warm-up take over 50 s: more than any share of a budget used here."""
    return build_sleepy_model(str(tmp_path_factory.mktemp("sleepy") / "1"), 5_000, 2)


def check_sized_from_the_budget(report: benchmark_lib.BenchmarkReport) -> None:
    """Every measured batch size made between MIN_RUNS and MAX_RUNS runs, no more than
    its calibration said would fit its share; every skipped one is named with figures
    that rule it out."""
    calibration = {c.batch_size: c for c in report.calibration}
    for before, after in zip(report.before, report.after):
        c = calibration[after.batch_size]
        assert c.share_seconds is not None and c.runs >= benchmark_lib.MIN_RUNS
        fit = 1 + math.floor(c.share_seconds / c.pair_seconds)
        assert c.runs <= min(benchmark_lib.MAX_RUNS, fit)
        # Made as planned, or stopped at the deadline once a few were made.
        assert benchmark_lib.MIN_RUNS <= after.runs == before.runs <= c.runs
        ratio = report.ratio(after.batch_size)
        assert ratio.pairs == after.runs and ratio.low <= ratio.median <= ratio.high
        assert 0 < ratio.confidence < 1
    for s in report.skipped:
        assert s.reason.startswith(f"batch {s.batch_size} skipped: one run")
        if s.estimated:
            need = s.seconds_per_run * 2 * (benchmark_lib.MIN_RUNS + 1)
        elif s.batch_size in calibration:
            need = calibration[s.batch_size].pair_seconds * benchmark_lib.MIN_RUNS
        else:  # ruled out by its first run
            need = s.seconds_per_run * (2 * benchmark_lib.MIN_RUNS + 1)
        assert need > s.share_seconds


# --- the benchmark, sized from a budget --------------------------------------------

@pytest.fixture(scope="module")
def overrun(sleepy_dir):
    """Batch sizes 1 and 32 of the sleepy model in a 30 s budget, measured as optimize
    measures (in a fresh measuring process): (report, the progress lines it showed)."""
    said: list[str] = []
    report = benchmark_lib.benchmark_in_fresh_process(
        sleepy_dir, sleepy_dir, frozenset({"serve"}), SIGNATURE,
        schedule=benchmark_lib.BenchmarkSchedule(batch_sizes=(1, SLOW_BATCH),
                                                 deadline=time.monotonic() + 30),
        progress=said.append)
    return report, said


def test_a_batch_size_whose_run_overruns_its_share_is_skipped_and_named(overrun):
    # 30 s: batch 1 fits a hundred runs many times over; one run of batch 32 (5 s per
    # model) makes 5 runs of both models over 50 s, more than the budget as a whole.
    # Normally its first run rules it out; on a machine so loaded that batch 1 ran 15x
    # slower than its sleep, the extrapolation from batch 1 already does.
    report, said = overrun
    assert [lat.batch_size for lat in report.after] == [1]
    (skipped,) = report.skipped
    assert skipped.batch_size == SLOW_BATCH and "share of the budget" in skipped.reason
    assert ("estimated from batch 1" in skipped.reason) == skipped.estimated
    check_sized_from_the_budget(report)
    assert report.budget_seconds is not None and report.budget_seconds <= 30
    (line,) = said
    assert line.startswith("benchmark: 1 batch size x ") and " left" in line
    assert line.endswith(f"batch {SLOW_BATCH} skipped")


def test_a_batch_size_extrapolated_past_its_share_is_skipped_without_running(tmp_path):
    # Linear cost, 40 ms a row: batch 32 would take 1.3 s a run, 5 runs of both models
    # and a warm-up about 15 s, more than the whole 8 s budget. It is never run.
    linear = build_sleepy_model(str(tmp_path / "1"), 40_000, 1)
    report = benchmark_lib.benchmark(
        linear, linear, frozenset({"serve"}), SIGNATURE,
        schedule=benchmark_lib.BenchmarkSchedule(batch_sizes=(SLOW_BATCH, 1),
                                                 deadline=time.monotonic() + 8))
    assert [lat.batch_size for lat in report.after] == [1]
    (skipped,) = report.skipped
    assert skipped.batch_size == SLOW_BATCH and skipped.estimated
    assert "estimated from batch 1" in skipped.reason
    assert [c.batch_size for c in report.calibration] == [1]  # batch 32 never ran
    check_sized_from_the_budget(report)


def test_runs_are_planned_from_the_calibration_cheapest_first():
    # The detection model: 0.85 s an image. Batch 32 cannot fit 5 runs in 40 s,
    # so it is skipped and batch 1 gets the whole budget, not half of it.
    plan, skipped = benchmark_lib.plan_runs({1: (0.9, 0.8), 32: (27.0, 26.0)}, 100, 40.0)
    runs = {c.batch_size: c.runs for c in plan}
    assert runs == {1: 1 + math.floor(40.0 / 1.7), 32: 0}
    assert [s.batch_size for s in skipped] == [32]
    assert skipped[0].reason.startswith("batch 32 skipped: one run takes 27 s (original) "
                                        "and 26 s (optimized), 5 runs about 265 s")
    # What the cheap one leaves rolls over to the dear one; neither passes the cap.
    plan, skipped = benchmark_lib.plan_runs({1: (0.001, 0.001), 8: (0.5, 0.5)}, 100, 40.0)
    assert {c.batch_size: c.runs for c in plan} == {1: 100, 8: 40} and skipped == []
    # A fixed count, with or without a budget, is taken as given.
    plan, skipped = benchmark_lib.plan_runs({1: (0.5, 0.5), 32: (8.0, 8.0)}, 100, None, {32: 7})
    assert {c.batch_size: c.runs for c in plan} == {1: 100, 32: 7} and skipped == []


def test_a_fixed_count_of_runs_is_made_whatever_the_cost(sleepy_dir):
    report = benchmark_lib.benchmark(
        sleepy_dir, sleepy_dir, frozenset({"serve"}), SIGNATURE,
        schedule=benchmark_lib.BenchmarkSchedule(batch_sizes=(1, 4), runs=3, loads=1))
    assert [(lat.batch_size, lat.runs) for lat in report.after] == [(1, 3), (4, 3)]
    assert report.skipped == () and report.budget_seconds is None
    assert all(c.share_seconds is None and c.runs == 3 for c in report.calibration)
    assert [r.pairs for r in report.ratios] == [3, 3]


def test_the_interval_of_a_median_is_made_of_order_statistics():
    # 20 samples: the textbook 95% interval is the 6th to the 15th smallest.
    values = list(range(20))
    median, low, high, coverage = benchmark_lib.median_interval(values)
    assert (median, low, high) == (9.5, 5, 14) and 0.95 <= coverage < 0.96
    # Too few for 95%: min to max, with the coverage it really has.
    assert benchmark_lib.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0, 0.9375)
    # Wider than the data never; narrower as samples grow.
    rng = np.random.default_rng(0)
    big = rng.lognormal(size=400).tolist()
    _, low, high, coverage = benchmark_lib.median_interval(big)
    assert min(big) < low < high < max(big) and coverage >= 0.95


# --- optimize: the budget, the override, the report ---------------------------------

def test_optimize_sizes_the_benchmark_from_the_budget_and_reports_it(sleepy_dir, tmp_path):
    said: list[str] = []
    report = optimize(sleepy_dir, str(tmp_path / "out"),
                      # Parity at batch 1: at its default 16 rows a run sleeps 1.3 s, and
                      # the budget is this test's subject, not the answers.
                      OptimizeOptions(
                          measure=MeasureOptions(measure_seconds=90),
                          gate=GateOptions(allow_regression=True, parity_batch_size=1)),
                      progress=said.append)
    bench = report.benchmark
    assert bench is not None and bench.measure_seconds == 90
    assert 0 < bench.budget_seconds <= 45  # at most half of what the cold start left
    assert [lat.batch_size for lat in bench.after] == [1]
    assert [s.batch_size for s in bench.skipped] == [SLOW_BATCH]
    check_sized_from_the_budget(bench)
    # Never silently: a warning, the progress line and the table name it.
    assert any(w.startswith(f"benchmark: batch {SLOW_BATCH} skipped: ") for w in report.warnings)
    assert any("benchmark: 1 batch size x " in line and " left" in line for line in said), said
    text = format_optimize_report(report)
    assert "of the 90 s budget, --measure_seconds" in text
    assert f"  batch {SLOW_BATCH} skipped: one run" in text
    ratio = bench.ratio(1)
    assert ratio.describe() in text
    assert report.to_dict()["benchmark"]["skipped"][0]["batch_size"] == SLOW_BATCH


def test_benchmark_runs_overrides_the_budget(classifier_dir, tmp_path):
    # A budget nothing fits in, and an explicit count: the count is made, all of it.
    report = optimize(classifier_dir, str(tmp_path / "out"),
                      OptimizeOptions(
                          measure=MeasureOptions(benchmark_runs=6,
                                                 measure_seconds=0.001,
                                                 cold_start=False),
                          build=BuildOptions(freeze="always"),
                          gate=GateOptions(allow_regression=True)))
    bench = report.benchmark
    assert [(lat.batch_size, lat.runs) for lat in bench.after] == [(1, 6), (32, 6)]
    assert bench.skipped == () and bench.budget_seconds is None
    assert "budget" not in format_optimize_report(report).split("benchmark of")[1]


# --- a bad budget is a usage error before any work ----------------------------------

@pytest.mark.parametrize("seconds", [0, -5, math.inf, math.nan])
def test_a_bad_budget_is_a_usage_error_before_any_work(seconds, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"--measure_seconds=.* must be a positive, finite"):
        optimize(str(tmp_path / "missing"), str(out), OptimizeOptions(
            measure=MeasureOptions(measure_seconds=seconds)))
    with pytest.raises(UsageError, match="--measure_seconds"):
        MeasureOptions(measure_seconds=seconds).check()
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--measure_seconds=0", "--measure_seconds=-1",
                                  "--measure_seconds=inf", "--measure_seconds=nan"])
def test_a_bad_budget_flag_exits_2_before_any_work(flag, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["serving-opt", "optimize", f"--saved_model_dir={tmp_path / 'missing'}",
                     f"--model_base_path={out}", "--noprogress", flag])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--measure_seconds" in err, err
    assert "missing" not in err  # it never got as far as the input directory
    assert not out.exists()


def test_benchmark_runs_is_from_the_budget_unless_given():
    assert MeasureOptions().benchmark_runs is None
    assert OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0)).measure.benchmark_runs == 0
    MeasureOptions(benchmark_runs=7, measure_seconds=1e-3).check()
    with pytest.raises(UsageError, match="--benchmark_runs must be >= 0"):
        MeasureOptions(benchmark_runs=-1).check()


# --- the confirmation re-measures only what regressed --------------------------------

def _bench(p50_before: dict[int, float], p50_after: dict[int, float],
           runs: int = 100) -> benchmark_lib.BenchmarkReport:
    def latencies(p50: dict[int, float]):
        return tuple(benchmark_lib.Latency(b, ms, ms * 2, runs) for b, ms in p50.items())

    return benchmark_lib.BenchmarkReport(
        SIGNATURE, 1.0, 1.0, latencies(p50_before), latencies(p50_after),
        ratios=tuple(benchmark_lib.Ratio(b, p50_after[b] / ms, 0.9, 1.1, 0.95, runs)
                     for b, ms in p50_before.items()),
        calibration=tuple(benchmark_lib.Calibration(b, 0.01, 0.01, 5.0, runs)
                          for b in p50_before))


def test_only_the_figures_that_looked_worse_are_measured_again():
    cold = coldstart.ColdStartReport(coldstart.ColdStart(1.0, 0.05, 500 << 20, 400 << 20),
                                     coldstart.ColdStart(1.0, 0.05, 500 << 20, 400 << 20), 1)
    first = _bench({1: 1.0, 32: 10.0}, {1: 1.0, 32: 20.0})
    worse = regression_lib.regressions(cold, first)
    assert [regression_lib.measure_of(line) for line in worse] == ["p50 at batch 32",
                                                                   "p99 at batch 32"]
    # Batch 32 again, and nothing else: not the cold start, not batch 1.
    assert regression_lib.to_remeasure(worse) == regression_lib.Remeasure(False, (32,))
    slow_load = coldstart.ColdStartReport(cold.before, coldstart.ColdStart(
        3.0, 0.05, 500 << 20, 400 << 20), 1)
    assert regression_lib.to_remeasure(regression_lib.regressions(slow_load, first)) == \
        regression_lib.Remeasure(True, (32,))
    assert regression_lib.to_remeasure(regression_lib.regressions(slow_load, None)) == \
        regression_lib.Remeasure(True, ())

    # The second measurement of batch 32 replaces the first's; batch 1 is kept as it was.
    again = _bench({32: 10.0}, {32: 10.5})
    merged = benchmark_lib.with_remeasured(first, again)
    assert [lat.p50_ms for lat in merged.after] == [1.0, 10.5]
    assert merged.before[0] is first.before[0] and merged.after[1] is again.after[0]
    assert merged.ratio(32) == again.ratio(32) and merged.ratio(1) == first.ratio(1)
    assert regression_lib.confirmed(worse, regression_lib.regressions(cold, merged)) == []
    # Reproduced: confirmed; a measure worse only the second time is not counted.
    still = benchmark_lib.with_remeasured(first, _bench({32: 10.0}, {32: 19.0}))
    again_worse = regression_lib.regressions(slow_load, still)
    assert [regression_lib.measure_of(line)
            for line in regression_lib.confirmed(worse, again_worse)] == [
        "p50 at batch 32", "p99 at batch 32"]


def test_a_benchmark_report_survives_its_json(overrun):
    # The measuring process hands its report back as JSON: the same report both ways.
    report, _ = overrun
    assert benchmark_lib.BenchmarkReport.from_dict(report.to_dict()) == report
    assert [s.batch_size for s in report.skipped] == [SLOW_BATCH]
    check_sized_from_the_budget(report)
