"""Do no harm: the candidate is not published if it is worse than the original on any measure.

Measures (after / before): the cold start (load time, first request, serving peak RSS,
each from a fresh process) and the steady-state p50 and p99 at every benchmarked batch
size. A measure regresses when ``after > before * tolerance + slack``: the tolerance
(default 1.10) absorbs machine noise in relative terms, the absolute slack keeps
tiny models (a 3 ms load, a 0.1 ms request) from failing on scheduler jitter.

Steady-state p50 is gated from 20 interleaved runs up and p99 from 100 up: with fewer,
a percentile is one of a handful of samples, which measures the machine, not the model.

A measure that looks worse is measured again before it counts (a busy machine can slow
one fresh process by more than the tolerance); only what looked worse is measured again
(:func:`to_remeasure`): the cold start if one of its figures did, and only the batch
sizes whose latency did.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOLERANCE = 1.10
MIN_RUNS_FOR_P50 = 20
MIN_RUNS_FOR_P99 = 100


@dataclass(frozen=True)
class Slack:
    """Absolute differences that never count as a regression (noise on tiny models)."""

    load_seconds: float = 0.25
    first_request_seconds: float = 0.05
    peak_rss_bytes: int = 64 * 2**20
    p50_ms: float = 0.25
    p99_ms: float = 2.0


def _worse(before: float, after: float, tolerance: float, slack: float) -> bool:
    return after > before * tolerance + slack


def _seconds(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _mib(v: float) -> str:
    return f"{v / 2**20:.0f} MiB"


def regressions(cold=None, bench=None, tolerance: float = DEFAULT_TOLERANCE,
                slack: Slack = Slack()) -> list[str]:
    """One line per measure on which the candidate is worse than the original.

    ``cold`` is a :class:`~serving_opt.stages.coldstart.ColdStartReport`, ``bench`` a
    :class:`~serving_opt.stages.benchmark.BenchmarkReport`; either may be None.
    """
    found: list[str] = []

    def check(label: str, before: float, after: float, allowed: float, fmt) -> None:
        if _worse(before, after, tolerance, allowed):
            ratio = after / before if before else float("inf")
            found.append(f"{label} {ratio:.2f}x the original ({fmt(before)} -> {fmt(after)})")

    if cold is not None:
        b, a = cold.before, cold.after
        check("load time", b.load_seconds, a.load_seconds, slack.load_seconds, _seconds)
        check("first request", b.first_request_seconds, a.first_request_seconds,
              slack.first_request_seconds, _seconds)
        check("serving peak RSS", b.peak_rss_bytes, a.peak_rss_bytes, slack.peak_rss_bytes,
              _mib)
    if bench is not None:
        after = {lat.batch_size: lat for lat in bench.after}
        for lat in bench.before:
            other = after.get(lat.batch_size)
            if other is None:
                continue
            if min(lat.runs, other.runs) >= MIN_RUNS_FOR_P50:
                check(f"p50 at batch {lat.batch_size}", lat.p50_ms, other.p50_ms,
                      slack.p50_ms, lambda v: f"{v:.2f} ms")
            if min(lat.runs, other.runs) >= MIN_RUNS_FOR_P99:
                check(f"p99 at batch {lat.batch_size}", lat.p99_ms, other.p99_ms,
                      slack.p99_ms, lambda v: f"{v:.2f} ms")
    return found


def measure_of(line: str) -> str:
    """The measure a regression line names: ``'load time 12.84x the ...'`` -> ``'load time'``."""
    return line.split(" the original")[0].rsplit(" ", 1)[0]


@dataclass(frozen=True)
class Remeasure:
    """What a confirmation measures again: the cold start (one fresh process gives all
    three of its figures) if any of its figures looked worse, and the batch sizes whose
    p50 or p99 did."""

    cold_start: bool
    batch_sizes: tuple[int, ...]


def to_remeasure(worse: list[str]) -> Remeasure:
    """The measurements that can confirm the regression lines ``worse``, and no others."""
    batches = [batch_of(line) for line in worse if is_steady_state(line)]
    return Remeasure(cold_start=any(not is_steady_state(line) for line in worse),
                     batch_sizes=tuple(dict.fromkeys(b for b in batches if b is not None)))


def confirmed(worse: list[str], again: list[str]) -> list[str]:
    """The lines of the second measurement (``again``) about a measure the first one
    found worse: a measure worse only the second time was not confirmed.
    """
    first = {measure_of(line) for line in worse}
    return [line for line in again if measure_of(line) in first]


def batch_of(line: str) -> int | None:
    """The batch size a steady-state regression line is about (None: not one)."""
    measure = measure_of(line)
    if not is_steady_state(line) or " at batch " not in measure:
        return None
    size = measure.rsplit(" ", 1)[-1]
    return int(size) if size.isdigit() else None


def is_steady_state(line: str) -> bool:
    """Whether a regression line is about steady-state latency (p50/p99), not cold start."""
    return measure_of(line).startswith(("p50 ", "p99 "))
