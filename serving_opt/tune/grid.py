"""The few settings worth a server: a small grid read off the measured session curve.

Per profiled thread setting, with r rows per request and L the measured latency of one
request's batch (r rows):

* ``max_batch_size``: the knee of the curve, the largest measured size whose cost per
  row still improves by more than ``KNEE_GAIN`` over the size below it, whose run takes
  at most half the SLO (a request may wait out one batch before its own), and that the
  load can fill (N clients' rows in a closed loop);
* ``batch_timeout_micros``: 0, 1 ms (upstream's suggestion) and L/2, each under half
  the SLO (a batch of one request is full at once: 0 only);
* ``num_batch_threads``: 1 and the cores;
* ``max_enqueued_batches``: enough for every client's request; in an open loop also what
  the SLO can drain (SLO x threads / L(knee), at least the threads);
* ``allowed_batch_sizes``: none unless asked for (``--allowed_batch_sizes``);

and no batching at each thread setting but TensorFlow's default (that is TF Serving's
default, proven anyway). Nothing here predicts a figure: every candidate is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving_opt.tune.profile import LatencyCurve, ModelProfile
from serving_opt.tune.settings import BatchingSettings, ServingSettings, ThreadSettings

KNEE_GAIN = 0.10  # a larger batch must cut the cost per row by more than this
UPSTREAM_TIMEOUT_MICROS = 1000
DEFAULT_THREADS = ThreadSettings()


@dataclass(frozen=True)
class Objective:
    """What the settings are for: the load, the SLO, the rejections allowed."""

    slo_p99_ms: float
    clients: int = 0  # closed loop; 0: none
    rate: float = 0.0  # open loop, requests/s; 0: none
    rows_per_request: int = 1
    max_reject_fraction: float = 0.001
    padding: str = "none"  # "none", "pow2", or "4,8,16" (rows)
    seed: int = 0

    def workloads(self) -> tuple[str, ...]:
        """The workloads measured: "closed" and/or "open"; the first is the primary."""
        return (*(("closed",) if self.clients else ()), *(("open",) if self.rate else ()))


def knee(curve: LatencyCurve, objective: Objective) -> int:
    """The largest batch worth making (see the module doc): at least one request."""
    r = objective.rows_per_request
    limit = objective.slo_p99_ms / 2000.0
    fill = objective.clients * r if objective.clients and not objective.rate else math.inf
    sizes = [n for n in curve.batch_sizes if n % r == 0 and n >= r]
    best = r
    for smaller, size in zip(sizes, sizes[1:]):
        if size > fill or curve.seconds(size) > limit:
            break
        per_row, before = curve.seconds(size) / size, curve.seconds(smaller) / smaller
        if per_row > before * (1 - KNEE_GAIN):
            break
        best = size
    return best


def timeouts(curve: LatencyCurve, objective: Objective, size: int) -> tuple[int, ...]:
    """0, 1 ms and L/2 (microseconds), each under half the SLO."""
    r = objective.rows_per_request
    if size <= r:
        return (0,)
    half = int(round(curve.seconds(r) / 2 * 1e6, -2))
    bound = objective.slo_p99_ms * 1000 / 2
    return tuple(sorted({t for t in (0, UPSTREAM_TIMEOUT_MICROS, half) if t == 0 or t < bound}))


def queue(objective: Objective, size: int, run_s: float, batch_threads: int) -> int:
    """max_enqueued_batches: the fewest that hold every client's request (more changes
    nothing, fewer only rejects); open loop: what the SLO can drain, at least the threads."""
    need = math.ceil(objective.clients * objective.rows_per_request / size)
    if not objective.rate:
        return max(1, need)
    drain = int(objective.slo_p99_ms / 1000.0 * batch_threads / max(run_s, 1e-6))
    return max(need, batch_threads, drain)


def padding(objective: Objective, size: int) -> tuple[int, ...]:
    """allowed_batch_sizes for ``size`` as ``--allowed_batch_sizes`` asks."""
    if objective.padding == "none":
        return ()
    r = objective.rows_per_request
    if objective.padding == "pow2":
        ladder, m = [], 1
        while r * m < size:
            ladder.append(r * m)
            m *= 2
        return (*ladder, size)
    wanted = sorted({int(x) for x in objective.padding.split(",") if x.strip()})
    return (*[x for x in wanted if x < size], size)


def candidates(profile: ModelProfile, objective: Objective,
               cpus: int) -> tuple[list[ServingSettings], list[str]]:
    """The grid's settings, and one line per thread setting saying how they were read."""
    out: list[ServingSettings] = []
    notes = []
    for curve in profile.curves:
        if curve.threads != DEFAULT_THREADS:
            out.append(ServingSettings(None, curve.threads))
        size = knee(curve, objective)
        run_s = curve.seconds(size)
        for batch_threads in sorted({1, max(1, cpus)}):
            for timeout in timeouts(curve, objective, size):
                out.append(ServingSettings(BatchingSettings(
                    size, timeout, queue(objective, size, run_s, batch_threads),
                    batch_threads, padding(objective, size)), curve.threads))
        notes.append(f"threads {curve.threads.describe()}: knee at batch {size} "
                     f"({run_s * 1000:.1f} ms, {size / run_s:,.0f} rows/s alone); "
                     f"one request's batch {curve.seconds(objective.rows_per_request) * 1000:.1f}"
                     " ms")
    return list(dict.fromkeys(out)), notes
