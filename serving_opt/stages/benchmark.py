"""Side-by-side load time and latency of the original and the optimized model.

Machines are noisy, so the two are never timed in separate runs: both load in
one process, loads alternate (A B B A ...), and requests interleave with the order
flipped every iteration, so drift hits both equally. Sessions use the default
config, which runs Grappler at load just as TF Serving does: a gain reported here
is on top of what the server would do anyway.

How many runs: a fixed count (``runs``), or as many as fit a time budget (a
``deadline``; optimize's ``--measure_seconds``). With a budget, each batch size is
calibrated first, smallest first: one warm run of each model, timed. The runs per batch
size are then chosen so that all of them fit what is left, between :data:`MIN_RUNS` and
``runs``; a batch size that cannot fit :data:`MIN_RUNS` runs is skipped and named in the
report with the figures that ruled it out, never dropped silently. A batch size whose
run, extrapolated from a smaller one's, would already overrun its share is skipped
without being run (an hour-long detection benchmark starts with exactly that run).

Each after/before ratio comes with a distribution-free confidence interval: the median
of the interleaved pairs' ratios and the order statistics that cover it
(:func:`median_interval`), computed from the measured pairs alone.

The optimizer runs it in a measuring process (:func:`benchmark_in_fresh_process`,
``serving_opt.core.measuring``), configured like the server, not in its own.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from serving_opt.core import measuring
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader

MIN_RUNS = 5  # fewer interleaved runs than this measure the machine, not the model
MAX_RUNS = 100  # the most a budget gives one batch size (the old fixed count)
CONFIDENCE = 0.95  # of the ratios' intervals (less when there are too few pairs for it)
# Untimed warm-up runs per model and batch size; with a budget, only while they cost
# less than this fraction of the batch size's share.
WARMUP_SHARE = 0.05
# Extra timed load rounds (beyond the one whose sessions are kept) only while they cost
# less than this fraction of the budget: a load is what a slow model is slowest at.
LOAD_SHARE = 0.1


@dataclass(frozen=True)
class Latency:
    """Request latency percentiles for one model at one batch size, in milliseconds."""

    batch_size: int
    p50_ms: float
    p99_ms: float
    runs: int


@dataclass(frozen=True)
class Ratio:
    """after / before at one batch size, from the interleaved pairs (one run of each
    model): the median of the pairs' ratios and an interval that covers the true median
    with probability ``confidence`` (below 0.95 only when there are too few pairs).
    """

    batch_size: int
    median: float
    low: float
    high: float
    confidence: float
    pairs: int

    def describe(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f}, " \
               f"{self.confidence * 100:.0f}%)"


@dataclass(frozen=True)
class Calibration:
    """One warm run of each model at a batch size, and the runs chosen from it.

    ``share_seconds`` is the part of the budget the batch size was given when its runs
    were chosen (None: no budget, ``runs`` was fixed); ``runs`` the runs planned,
    calibration included (0: skipped).
    """

    batch_size: int
    seconds_before: float
    seconds_after: float
    share_seconds: float | None
    runs: int

    @property
    def pair_seconds(self) -> float:
        """One run of each model: the cost of one more interleaved run."""
        return self.seconds_before + self.seconds_after


@dataclass(frozen=True)
class Skipped:
    """A batch size the budget could not measure, and why.

    ``seconds_per_run`` is one run of the slower model (``estimated``: extrapolated
    from a smaller batch size, not run); ``share_seconds`` what the batch size had.
    """

    batch_size: int
    reason: str
    seconds_per_run: float
    share_seconds: float
    estimated: bool = False


@dataclass(frozen=True)
class BenchmarkReport:
    """Before/after numbers measured in one run.

    ``before``/``after`` hold the batch sizes measured, ``skipped`` those a budget could
    not fit; ``budget_seconds`` is what the benchmark was given (None: a fixed count of
    runs), ``measure_seconds`` the whole measuring budget it was a share of.
    """

    signature: str
    load_seconds_before: float
    load_seconds_after: float
    before: tuple[Latency, ...]
    after: tuple[Latency, ...]
    ratios: tuple[Ratio, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    calibration: tuple[Calibration, ...] = ()
    budget_seconds: float | None = None
    measure_seconds: float | None = None

    def speedup(self, batch_size: int) -> float | None:
        """p50 before / p50 after at ``batch_size`` (above 1 means faster)."""
        b = next((x for x in self.before if x.batch_size == batch_size), None)
        a = next((x for x in self.after if x.batch_size == batch_size), None)
        if not a or not b or a.p50_ms <= 0:
            return None
        return b.p50_ms / a.p50_ms

    def ratio(self, batch_size: int) -> Ratio | None:
        """The after/before ratio and its interval at ``batch_size`` (None: not measured)."""
        return next((r for r in self.ratios if r.batch_size == batch_size), None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BenchmarkReport:
        """The report :meth:`to_dict` gave (as a measuring process returns it)."""
        return cls(
            signature=data["signature"],
            load_seconds_before=data["load_seconds_before"],
            load_seconds_after=data["load_seconds_after"],
            before=tuple(Latency(**x) for x in data["before"]),
            after=tuple(Latency(**x) for x in data["after"]),
            ratios=tuple(Ratio(**x) for x in data.get("ratios", ())),
            skipped=tuple(Skipped(**x) for x in data.get("skipped", ())),
            calibration=tuple(Calibration(**x) for x in data.get("calibration", ())),
            budget_seconds=data.get("budget_seconds"),
            measure_seconds=data.get("measure_seconds"),
        )


def with_remeasured(first: BenchmarkReport, again: BenchmarkReport) -> BenchmarkReport:
    """``first`` with the figures of every batch size ``again`` measured taken from
    ``again`` (a confirmation re-measures only the batch sizes that looked worse).
    """
    redone = {lat.batch_size for lat in again.after}

    def pick(mine: tuple, theirs: tuple) -> tuple:
        new = {x.batch_size: x for x in theirs}
        return tuple(new.get(x.batch_size, x) if x.batch_size in redone else x for x in mine)

    return BenchmarkReport(
        signature=first.signature,
        load_seconds_before=first.load_seconds_before,
        load_seconds_after=first.load_seconds_after,
        before=pick(first.before, again.before),
        after=pick(first.after, again.after),
        ratios=pick(first.ratios, again.ratios),
        skipped=first.skipped,
        calibration=pick(first.calibration, again.calibration),
        budget_seconds=first.budget_seconds,
        measure_seconds=first.measure_seconds,
    )


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def median_interval(values: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """``(median, low, high, coverage)``: the sample median and the narrowest pair of
    order statistics ``[x(k), x(n+1-k)]`` that covers the population median with
    probability at least ``confidence``. Distribution-free: the number of samples below
    the median is Binomial(n, 1/2). With too few samples for ``confidence`` the interval
    is ``[min, max]`` and ``coverage`` says what it really is (5 samples: 94%).
    """
    x = sorted(values)
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan, 0.0)
    below = 0  # P(Binomial(n, 1/2) <= k - 1), accumulated
    best = (x[0], x[-1], 1.0 - 2.0 * 0.5 ** n)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2.0 ** n
        coverage = 1.0 - 2.0 * below
        if coverage < confidence:
            break
        best = (x[k - 1], x[n - k], coverage)
    return (float(statistics.median(x)), float(best[0]), float(best[1]), float(best[2]))


def _ratio(batch_size: int, before: Sequence[float], after: Sequence[float]) -> Ratio:
    pairs = [b / a for a, b in zip(before, after) if a > 0]
    median, low, high, coverage = median_interval(pairs)
    return Ratio(batch_size, median, low, high, coverage, len(pairs))


def _timed_load(path: str, tags: frozenset[str]):
    start = time.perf_counter()
    sess, mg = loader.load_session(path, tags)
    return time.perf_counter() - start, sess, mg


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _load_both(before_dir: str, after_dir: str, tags: frozenset[str], loads: int,
               budget: float):
    """Times ``loads`` alternating rounds of loading both models (fewer when a round
    costs more than :data:`LOAD_SHARE` of ``budget``); the last round's sessions are
    the ones measured."""
    load_before: list[float] = []
    load_after: list[float] = []
    rounds, i = max(1, loads), 0
    while True:
        last = i + 1 >= rounds or (
            i > 0 and (sum(load_before) + sum(load_after)) / i * (i + 1) > LOAD_SHARE * budget)
        order = [(0, before_dir, load_before), (1, after_dir, load_after)]
        opened = [None, None]
        for side, path, sink in (order if i % 2 == 0 else order[::-1]):
            seconds, sess, mg = _timed_load(path, tags)
            sink.append(seconds)
            opened[side] = (sess, mg)
        if last:
            return load_before, load_after, opened[0], opened[1]
        for sess, _ in opened:
            sess.close()
        i += 1


@dataclass(frozen=True)
class BenchmarkSchedule:
    """How much is measured: the ``batch_sizes``, ``runs`` interleaved runs per batch
    size (with a ``deadline``, a ``time.monotonic`` time, as many as fit before it, at
    most ``runs``), ``runs_per_batch`` fixing the runs of some batch sizes (a
    confirmation repeats the first measurement's), ``loads`` timed load rounds and
    ``warmup`` untimed runs per model and batch size.
    """

    batch_sizes: Sequence[int] = (1, 32)
    runs: int = 100
    loads: int = 3
    warmup: int = 5
    deadline: float | None = None
    runs_per_batch: Mapping[int, int] | None = None


@dataclass(frozen=True)
class BenchmarkInputs:
    """What both models are fed: the user's ``examples`` file (None: synthesized, from
    ``seed``), ``shapes`` ({key: {alias: shape}}, ``--input_shapes``) that synthesized
    inputs take, and ``input_mode``, the synthesis fallback the parity gate found the
    original runs on (``inputs.FALLBACKS``).
    """

    examples: str | None = None
    seed: int = 0
    shapes: Mapping | None = None
    input_mode: str | None = None


@dataclass
class _Batch:
    """One batch size being measured: both models' callables and their timed runs."""

    size: int
    call_a: Callable[[], object]
    call_b: Callable[[], object]
    times_a: list[float] = field(default_factory=list)  # ms
    times_b: list[float] = field(default_factory=list)


def benchmark(
    before_dir: str,
    after_dir: str,
    tags: frozenset[str],
    signature_key: str,
    *,
    schedule: BenchmarkSchedule = BenchmarkSchedule(),
    inputs: BenchmarkInputs = BenchmarkInputs(),
    progress: Callable[[str], None] | None = None,
) -> BenchmarkReport:
    """Measures load time and p50/p99 latency of one signature, before vs. after.

    ``schedule.runs`` interleaved runs per batch size; with a ``schedule.deadline``
    (``time.monotonic``) as many as fit before it, at most ``runs``, batch sizes that
    cannot fit :data:`MIN_RUNS` skipped. ``progress`` hears the plan once it is
    calibrated. With ``inputs.input_mode`` ``scalars`` or ``batch 1`` every request is
    one row whatever the batch size says, so the caller asks for batch 1 only.
    """
    say = progress or (lambda _: None)
    deadline, input_mode = schedule.deadline, inputs.input_mode
    budget = measuring.seconds_until(deadline)
    runs = max(1, schedule.runs)
    load_before, load_after, (sess_a, mg_a), (sess_b, mg_b) = _load_both(
        before_dir, after_dir, tags, schedule.loads, budget)
    try:
        sig_a = mg_a.signature_def[signature_key]
        sig_b = mg_b.signature_def[signature_key]
        # The user's examples when given (a model may refuse synthesized inputs), grown
        # or cut to each batch size so the figure is for the batch it names.
        user = examples_lib.read_examples_file(inputs.examples) if inputs.examples else None
        feeds = inputs_lib.signature_feeds(mg_a, before_dir, user=user, seed=inputs.seed,
                                           shapes=inputs.shapes)

        def prepare(batch: int) -> _Batch:
            made = feeds(signature_key, batch, mode=input_mode).batches
            # A single row (or a scalar) is the request itself: nothing to resize.
            feed = made[0] if input_mode in inputs_lib.SINGLE_ROW_MODES else \
                inputs_lib.resize_batch(made, batch)
            return _Batch(batch, _callable(sess_a, sig_a, feed), _callable(sess_b, sig_b, feed))

        sizes = list(dict.fromkeys(schedule.batch_sizes))
        measured, skipped = _calibrate(sizes, prepare, schedule.warmup, deadline)
        calibration, too_dear = plan_runs(
            {b.size: (b.times_a[0] / 1000.0, b.times_b[0] / 1000.0) for b in measured.values()},
            runs, None if deadline is None else measuring.seconds_until(deadline),
            schedule.runs_per_batch)
        skipped += too_dear
        planned = {c.batch_size: c.runs for c in calibration if c.runs}
        left = sum((planned[b.size] - 1) * (b.times_a[0] + b.times_b[0]) / 1000.0
                   for b in measured.values() if b.size in planned)
        say(_plan_line(sizes, planned, skipped, left))
        before: list[Latency] = []
        after: list[Latency] = []
        ratios: list[Ratio] = []
        for size in sizes:
            if size not in planned:
                continue
            batch = measured[size]
            _run(batch, planned[size], deadline)
            before.append(_latency(size, batch.times_a))
            after.append(_latency(size, batch.times_b))
            ratios.append(_ratio(size, batch.times_a, batch.times_b))
    finally:
        sess_a.close()
        sess_b.close()
    return BenchmarkReport(
        signature=signature_key,
        load_seconds_before=statistics.median(load_before),
        load_seconds_after=statistics.median(load_after),
        before=tuple(before),
        after=tuple(after),
        ratios=tuple(ratios),
        skipped=tuple(sorted(skipped, key=lambda s: sizes.index(s.batch_size))),
        calibration=tuple(sorted(calibration, key=lambda c: sizes.index(c.batch_size))),
        budget_seconds=None if deadline is None else budget,
    )


def _calibrate(sizes: list[int], prepare: Callable[[int], _Batch], warmup: int,
               deadline: float | None) -> tuple[dict[int, _Batch], list[Skipped]]:
    """Warms each batch size up and times one run of each model (run 0 of its pairs),
    smallest first; with a deadline, skips those that cannot fit their even share of
    what is left."""
    measured: dict[int, _Batch] = {}
    skipped: list[Skipped] = []
    ascending = sorted(sizes)
    for n, size in enumerate(ascending):
        share = measuring.seconds_until(deadline) / (len(ascending) - n)
        smaller = [b for b in measured.values() if b.size < size]
        if deadline is not None and smaller:
            # Extrapolated linearly from the largest smaller batch: per-row cost rarely
            # grows with the batch, so this errs towards measuring less, never more.
            base = max(smaller, key=lambda b: b.size)
            # The faster of its two runs: noise only ever adds.
            per_run = min(base.times_a[0], base.times_b[0]) / 1000.0 * size / base.size
            need = per_run * 2 * (MIN_RUNS + 1)  # a warm-up and MIN_RUNS runs of each
            if need > share:
                skipped.append(Skipped(
                    size, f"batch {size} skipped: one run would take about "
                    f"{_secs(per_run)} (estimated from batch {base.size}), {MIN_RUNS} runs "
                    f"of both models about {_secs(need)}, more than its share of the budget, "
                    f"{_secs(share)}", per_run, share, estimated=True))
                continue
        batch = prepare(size)
        first = _timed(batch.call_a)  # a first run: the slowest there is, and telling
        if deadline is not None and first * (2 * MIN_RUNS + 1) > share:
            skipped.append(Skipped(
                size, f"batch {size} skipped: one run takes {_secs(first)}, {MIN_RUNS} runs "
                f"of both models about {_secs(first * 2 * MIN_RUNS)}, more than its share "
                f"of the budget, {_secs(share)}", first, share))
            continue
        batch.call_b()
        for _ in range(warmup - 1):
            if deadline is not None and first * 2 * warmup > WARMUP_SHARE * share:
                break
            batch.call_a()
            batch.call_b()
        batch.times_a.append(_timed(batch.call_a) * 1000.0)
        batch.times_b.append(_timed(batch.call_b) * 1000.0)
        measured[size] = batch
    return measured, skipped


def plan_runs(calibrated: Mapping[int, tuple[float, float]], runs: int,
              left_seconds: float | None,
              fixed: Mapping[int, int] | None = None) -> tuple[list[Calibration], list[Skipped]]:
    """The runs of each calibrated batch size (``batch -> (seconds of one run of the
    original, of the optimized)``), the calibration run included: ``fixed``'s, else
    ``runs``, or with ``left_seconds`` as many as fit it, at most ``runs``. The cheapest
    batch size is served first and what it leaves rolls over to the dearer ones; one
    that cannot fit :data:`MIN_RUNS` is skipped (planned 0 runs, and named).
    """
    fixed = fixed or {}
    if left_seconds is None:
        return [Calibration(size, a, b, None, max(1, fixed.get(size, runs)))
                for size, (a, b) in calibrated.items()], []
    plan = [Calibration(size, a, b, None, max(1, fixed[size]))
            for size, (a, b) in calibrated.items() if size in fixed]
    sized = {size: seconds for size, seconds in calibrated.items() if size not in fixed}
    skipped: list[Skipped] = []
    while True:
        shares = _shares(sized, runs, left_seconds)
        short = [size for size, (share, made) in shares.items() if made < MIN_RUNS]
        if not short:
            break
        # The dearest that does not fit goes, and what it would have had is shared again.
        size = max(short, key=lambda s: sum(sized[s]))
        seconds_a, seconds_b = sized.pop(size)
        share = shares[size][0]
        skipped.append(Skipped(
            size, f"batch {size} skipped: one run takes {_secs(seconds_a)} (original) "
            f"and {_secs(seconds_b)} (optimized), {MIN_RUNS} runs about "
            f"{_secs((seconds_a + seconds_b) * MIN_RUNS)}, more than its share of the "
            f"budget, {_secs(share)}", max(seconds_a, seconds_b), share))
        plan.append(Calibration(size, seconds_a, seconds_b, share, 0))
    plan += [Calibration(size, *sized[size], share, made)
             for size, (share, made) in shares.items()]
    return plan, skipped


def _shares(sized: Mapping[int, tuple[float, float]], runs: int,
            left: float) -> dict[int, tuple[float, int]]:
    """``batch -> (its share, the runs it fits)``: the cheapest first, each an even share
    of what the ones before it left."""
    ordered = sorted(sized.items(), key=lambda item: sum(item[1]))
    shares: dict[int, tuple[float, int]] = {}
    for n, (size, (seconds_a, seconds_b)) in enumerate(ordered):
        pair = seconds_a + seconds_b
        share = left / (len(ordered) - n)
        more = runs - 1 if pair <= 0 else min(runs - 1, int(share // pair))
        shares[size] = (share, 1 + more)
        left -= more * pair
    return shares


def _run(batch: _Batch, runs: int, deadline: float | None) -> None:
    """Runs 1.. of the interleaved pairs (run 0 was the calibration), the order flipped
    every run; with a deadline, stops once it is past and MIN_RUNS are made (a machine
    that slowed down after calibrating must not stretch the budget)."""
    for i in range(len(batch.times_a), runs):
        if deadline is not None and i >= MIN_RUNS and time.monotonic() > deadline:
            break
        pair = [(batch.call_a, batch.times_a), (batch.call_b, batch.times_b)]
        for call, sink in (pair if i % 2 == 0 else pair[::-1]):
            sink.append(_timed(call) * 1000.0)


def _latency(size: int, times: list[float]) -> Latency:
    return Latency(size, _percentile(times, 50), _percentile(times, 99), len(times))


def _secs(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s" \
        if seconds < 10 else f"{seconds:.0f} s"


def _plan_line(sizes: list[int], planned: dict[int, int], skipped: list[Skipped],
               left: float) -> str:
    """``benchmark: 2 batch sizes x 14 runs, about 95 s left`` (and what was skipped)."""
    counts = [planned[s] for s in sizes if s in planned]
    if not counts:
        what = "no batch size fits"
    elif len(set(counts)) == 1:
        what = f"{len(counts)} batch size{'s' if len(counts) > 1 else ''} x {counts[0]} runs"
    else:
        what = ", ".join(f"batch {s} x {planned[s]} runs" for s in sizes if s in planned)
    line = f"benchmark: {what}, about {_secs(left)} left"
    if skipped:
        line += "; " + ", ".join(f"batch {s.batch_size}" for s in skipped) + " skipped"
    return line


def _callable(session, signature_def, feed_by_alias: dict):
    """A prebuilt session callable, so the timing measures the graph, not Python feeding."""
    aliases = sorted(feed_by_alias)
    feed_tensors = [session.graph.get_tensor_by_name(signature_def.inputs[a].name)
                    for a in aliases]
    fetches = [signature_def.outputs[a].name for a in sorted(signature_def.outputs)]
    fn = session.make_callable(fetches, feed_list=feed_tensors)
    values = [feed_by_alias[a] for a in aliases]
    return lambda: fn(*values)


def benchmark_in_fresh_process(before_dir: str, after_dir: str, tags: frozenset[str],
                               signature_key: str, *,
                               schedule: BenchmarkSchedule = BenchmarkSchedule(),
                               inputs: BenchmarkInputs = BenchmarkInputs(),
                               timeout: float = 3600.0,
                               progress: Callable[[str], None] | None = None,
                               ) -> BenchmarkReport:
    """:func:`benchmark` run in a measuring process (``serving_opt.core.measuring``).

    The optimizer's own process has loaded, frozen and compared models for minutes,
    and runs TensorFlow configured for that (oneDNN's caching allocator off, so each
    model's memory is returned when its session closes); the numbers users compare
    with TF Serving come from a process configured like the server. ``schedule``,
    ``inputs`` and ``progress`` as :func:`benchmark`'s (the deadline counts the
    process's start).
    """
    examples, shapes = inputs.examples, inputs.shapes
    (result,) = measuring.run_jobs([{
        "run": "serving_opt.stages.benchmark:benchmark_job",
        "before": os.path.abspath(before_dir), "after": os.path.abspath(after_dir),
        "tags": sorted(tags), "signature": signature_key,
        "batch_sizes": list(schedule.batch_sizes), "runs": schedule.runs,
        "seed": inputs.seed, "loads": schedule.loads, "warmup": schedule.warmup,
        "deadline": schedule.deadline,
        "runs_per_batch": sorted((schedule.runs_per_batch or {}).items()),
        "examples": os.path.abspath(examples) if examples else None,
        "shapes": {k: {a: list(d) for a, d in v.items()} for k, v in (shapes or {}).items()},
        "input_mode": inputs.input_mode,
    }], timeout,
        what="the benchmark", skip="--benchmark_runs=0", progress=progress)
    if "error" in result:
        raise ServingOptError(f"the benchmark failed: {result['error']}",
                              "rerun with --benchmark_runs=0 to skip it")
    return BenchmarkReport.from_dict(result["report"])


def benchmark_job(job: dict) -> dict:
    """In a measuring process's child: :func:`benchmark` on the job's arguments."""
    schedule = BenchmarkSchedule(
        batch_sizes=tuple(job["batch_sizes"]), runs=job["runs"],
        loads=job.get("loads", BenchmarkSchedule.loads),
        warmup=job.get("warmup", BenchmarkSchedule.warmup), deadline=job.get("deadline"),
        runs_per_batch=dict(job.get("runs_per_batch", ())))
    inputs = BenchmarkInputs(
        examples=job.get("examples"), seed=job["seed"],
        shapes={k: {a: tuple(d) for a, d in v.items()} for k, v in job.get("shapes", {}).items()},
        input_mode=job.get("input_mode"))
    report = benchmark(job["before"], job["after"], frozenset(job["tags"]), job["signature"],
                       schedule=schedule, inputs=inputs, progress=measuring.say)
    return {"report": asdict(report)}
