"""Whether tuning beat upstream's batching defaults by more than the noise.

One measurement of each is one number; on a shared machine two numbers differ by
drift alone. So the decision measures upstream's defaults and the tuned setting in
interleaved rounds (U T, T U, U T, ...: a drift over the rounds costs both alike),
takes each round's ratio tuned / upstream, and an interval over the rounds (Student's
t, 95%). Tuning wins only when the whole interval is above 1; otherwise the
recommendation is upstream's defaults, and the report says tuning found nothing better
on this hardware.

When the tuned setting needs thread flags, its batching file alone (TensorFlow's
default threads) is measured in the same rounds: a batching file is often applied
without the flags next to it, and it must not be worse than upstream's defaults then.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import NamedTuple

# Student's t at 97.5% (two-sided 95%) by degrees of freedom; 1.96 beyond the table.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    """Student's t quantile at 0.975 for ``df`` degrees of freedom (table, conservative)."""
    if df < 1:
        return math.inf
    for k in sorted(_T975):
        if df <= k:
            return _T975[k]
    return 1.96


class Interval(NamedTuple):
    """The mean of the per-round ratios and its 95% interval."""

    mean: float
    low: float
    high: float
    rounds: int

    def describe(self) -> str:
        """``x1.12 (x1.03-x1.21 over 3 interleaved rounds)``."""
        if self.rounds < 2:
            return f"x{self.mean:.2f} (one round: no interval)"
        return (f"x{self.mean:.2f} (x{max(self.low, 0):.2f}-x{self.high:.2f} over "
                f"{self.rounds} interleaved rounds)")


def ratio_interval(tuned: list[float], upstream: list[float]) -> Interval:
    """The per-round ratios ``tuned[i] / upstream[i]``: their mean and 95% interval.
    Fewer than two rounds give no interval (-inf to inf): one number is no evidence.
    """
    ratios = [t / u if u > 0 else (math.inf if t > 0 else 1.0)
              for t, u in zip(tuned, upstream)]
    if not ratios:
        return Interval(math.nan, -math.inf, math.inf, 0)
    mean = statistics.fmean(ratios)
    if len(ratios) < 2 or not all(math.isfinite(r) for r in ratios):
        return Interval(mean, -math.inf, math.inf, len(ratios))
    half = t975(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return Interval(mean, mean - half, mean + half, len(ratios))


@dataclass(frozen=True)
class Decision:
    """Upstream's defaults against the tuned setting (and its batching file alone),
    measured in interleaved rounds on the primary workload and protocol.

    ``rows`` maps each contender's label to its rows/s per round; ``p99_ms`` likewise.
    ``tuned_wins``: the interval of tuned / upstream lies above 1. ``alone_worse``: the
    batching file without the thread flags measured below upstream's defaults (mean).
    """

    workload: str
    protocol: str
    upstream_label: str
    tuned_label: str
    alone_label: str | None
    rows: dict[str, tuple[float, ...]]
    p99_ms: dict[str, tuple[float, ...]]
    generator_cpu_share: float = 0.0  # the load generator's share of the cores, the most

    @property
    def vs_upstream(self) -> Interval:
        return ratio_interval(list(self.rows[self.tuned_label]),
                              list(self.rows[self.upstream_label]))

    @property
    def alone_vs_upstream(self) -> Interval | None:
        if self.alone_label is None:
            return None
        return ratio_interval(list(self.rows[self.alone_label]),
                              list(self.rows[self.upstream_label]))

    @property
    def tuned_wins(self) -> bool:
        return self.vs_upstream.low > 1.0

    @property
    def alone_worse(self) -> bool:
        alone = self.alone_vs_upstream
        return alone is not None and alone.mean < 1.0

    def to_dict(self) -> dict:
        """JSON-ready, the intervals included."""
        out = {"workload": self.workload, "protocol": self.protocol,
               "rows_per_second": {k: list(v) for k, v in self.rows.items()},
               "p99_ms": {k: list(v) for k, v in self.p99_ms.items()},
               "tuned_vs_upstream": self.vs_upstream._asdict(),
               "tuned_wins": self.tuned_wins, "alone_worse": self.alone_worse,
               "generator_cpu_share": self.generator_cpu_share}
        alone = self.alone_vs_upstream
        if alone is not None:
            out["alone_vs_upstream"] = alone._asdict()
        return out


def order(round_index: int, labels: list[str]) -> list[str]:
    """The contenders' order in round ``round_index``: forwards, then backwards, so
    that a steady drift costs each the same over two rounds.
    """
    return list(labels) if round_index % 2 == 0 else list(reversed(labels))
