"""A model's measured cost: session-run latency against batch size and concurrency.

``profile`` measures it (one fresh process per thread setting); the scheduler model
reads it. Between measured batch sizes the latency is interpolated linearly (a batch
costs a fixed part plus a part per row, piecewise), beyond the largest it is
extrapolated from the last two points' cost per row. When k session runs overlap
(several batch threads, or no batching and several clients), each takes
``slowdown(n, k)`` times as long as alone, measured at a few batch sizes by running k
threads at once, interpolated in k and in log n; beyond the largest measured k the
cores are taken to be saturated (each further run adds its share).

Example:
    >>> curve = LatencyCurve(ThreadSettings(), (1, 8), (0.005, 0.012))
    >>> round(curve.seconds(4), 4)
    0.008
    >>> curve.rows_per_second(8)
    666.6666666666666
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field

from serving_opt.tune.settings import ThreadSettings, cores

SPREAD_QUANTILES = tuple(range(0, 101, 5))  # percentiles of run time / mean, pooled


@dataclass(frozen=True)
class ConcurrencyPoint:
    """k session runs of ``batch_size`` rows at once: each took ``median_s`` (median);
    ``spread`` is their run-time-to-median ratio at SPREAD_QUANTILES (overlapping runs
    are shared unevenly: the tail is wider than alone)."""

    batch_size: int
    concurrent: int
    median_s: float
    spread: tuple[float, ...] = ()


@dataclass(frozen=True)
class LatencyCurve:
    """One thread setting's measured session-run costs (seconds).

    ``spread`` holds the run-time-to-mean ratio at SPREAD_QUANTILES, pooled over batch
    sizes: the jitter the scheduler model samples from. ``cpu_s`` is the process CPU
    time per run (``cpu_s / median_s`` is about the cores a run keeps busy). The model
    runs at ``median_s`` times a draw from ``spread``; ``mean_s`` is what was measured.

    Example:
        >>> LatencyCurve(ThreadSettings(1, 0), (1, 2), (0.004, 0.006)).seconds(2)
        0.006
    """

    threads: ThreadSettings
    batch_sizes: tuple[int, ...]
    median_s: tuple[float, ...]
    mean_s: tuple[float, ...] = ()
    p99_s: tuple[float, ...] = ()
    cpu_s: tuple[float, ...] = ()
    runs: tuple[int, ...] = ()
    spread: tuple[float, ...] = ()
    concurrency: tuple[ConcurrencyPoint, ...] = field(default_factory=tuple)
    load_seconds: float = 0.0
    # The machine-speed probe in this setting's window, and the factor that put its
    # times on the first setting's scale (profile.probe).
    probe_s: float = 0.0
    speed_scale: float = 1.0

    def seconds(self, rows: int) -> float:
        """Median latency of one session run of ``rows`` rows, alone.

        Example:
            >>> LatencyCurve(ThreadSettings(), (1, 3), (1.0, 2.0)).seconds(5)
            3.0
        """
        sizes, values = self.batch_sizes, self.median_s
        if len(sizes) == 1:
            return values[0] * max(rows, 1) / sizes[0] if rows > sizes[0] else values[0]
        if rows <= sizes[0]:
            return values[0]
        i = bisect.bisect_left(sizes, rows)
        if i < len(sizes) and sizes[i] == rows:
            return values[i]
        if i >= len(sizes):
            i = len(sizes) - 1  # extrapolate with the last segment's cost per row
        lo, hi = sizes[i - 1], sizes[i]
        slope = max(0.0, (values[i] - values[i - 1]) / (hi - lo))
        return max(values[i - 1] + slope * (rows - lo), 1e-9)

    def rows_per_second(self, rows: int) -> float:
        """Throughput of back-to-back runs of ``rows`` rows."""
        return rows / self.seconds(rows)

    def slowdown(self, rows: int, concurrent: int) -> float:
        """How many times longer a run takes when ``concurrent`` runs overlap.

        Example:
            >>> curve.slowdown(8, 1)
            1.0
        """
        if concurrent <= 1:
            return 1.0
        by_size: dict[int, list[tuple[int, float]]] = {}
        for point in self.concurrency:
            alone = self.seconds(point.batch_size)
            by_size.setdefault(point.batch_size, [(1, 1.0)]).append(
                (point.concurrent, max(1.0, point.median_s / alone)))
        if not by_size:
            # Nothing measured: runs share the cores a run leaves idle, then queue.
            share = self.cores_busy(rows)
            return max(1.0, concurrent * share / cores())
        sizes = sorted(by_size)
        factors = [_in_k(sorted(by_size[n]), concurrent) for n in sizes]
        if rows <= sizes[0]:
            return factors[0]
        if rows >= sizes[-1]:
            return factors[-1]
        i = bisect.bisect_left(sizes, rows)
        lo, hi = math.log(sizes[i - 1]), math.log(sizes[i])
        w = (math.log(rows) - lo) / (hi - lo)
        return factors[i - 1] * (1 - w) + factors[i] * w

    def cores_busy(self, rows: int) -> float:
        """CPU time over wall time of a run near ``rows`` rows (1.0 if not measured)."""
        if not self.cpu_s:
            return 1.0
        i = min(range(len(self.batch_sizes)), key=lambda j: abs(self.batch_sizes[j] - rows))
        return max(0.05, self.cpu_s[i] / self.median_s[i])

    def spread_for(self, concurrent: int = 1, rows: int = 1) -> tuple[float, ...]:
        """The run-time-to-median ratios at SPREAD_QUANTILES of a run of ``rows`` rows:
        alone, or among ``concurrent`` runs at once (the measured point nearest in runs
        at once, then in batch size, at most as many at once as measured)."""
        if concurrent > 1:
            measured = [p for p in self.concurrency if p.spread and p.concurrent <= concurrent]
            if measured:
                return min(measured, key=lambda p: (concurrent - p.concurrent,
                                                    abs(math.log(p.batch_size / rows)))).spread
        return self.spread

    def to_dict(self) -> dict:
        return asdict(self)


def _in_k(points: list[tuple[int, float]], k: int) -> float:
    """Slowdown at k concurrent runs from measured (k, slowdown) points, (1, 1) first."""
    for (k0, s0), (k1, s1) in zip(points, points[1:]):
        if k0 <= k <= k1:
            return s0 + (s1 - s0) * (k - k0) / (k1 - k0)
    k_max, s_max = points[-1]
    # Past the largest measured concurrency the cores are saturated: each further run
    # adds its share (never less than what was measured).
    return max(s_max, s_max * k / k_max)


def spread_quantile(spread: tuple[float, ...], u: float) -> float:
    """The ratio at quantile ``u`` in [0, 1] of ratios given at SPREAD_QUANTILES (1.0
    when none were measured)."""
    if not spread:
        return 1.0
    position = u * (len(spread) - 1)
    i = min(int(position), len(spread) - 2)
    w = position - i
    return spread[i] * (1 - w) + spread[i + 1] * w
