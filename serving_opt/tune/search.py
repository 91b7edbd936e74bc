"""Search the batching and thread settings with the scheduler model.

Every candidate is one ``ServingSettings`` (a thread setting that was profiled, and
either no batching or one BatchingParameters) predicted under the user's workloads
(closed loop with N clients, open loop at a rate, or both). A candidate **meets the
objective** when, under every workload, its predicted p99 is under the SLO, it rejects
no more than ``max_reject_fraction`` of the requests, and an open-loop queue does not
grow without bound. Among those the best is the one with the most rows/s under the
closed-loop workload (open loop only: the lowest p99 at the rate; ties go to fewer
batch threads, then the smaller batch, then the shorter timeout).

The grid (rows per request r, N clients, cores C, L(n) the measured latency):

* ``max_batch_size``: r times 1, 2, 4, ... and N/2 and N requests, up to the largest
  batch measured (a batch holds whole requests, so multiples of r);
* ``batch_timeout_micros``: 0, 1 ms (upstream's suggestion), and 25%, 50%, 100% of
  L(max_batch_size), all under half the SLO;
* ``num_batch_threads``: 1 up to C (1, 2, C/2, C on bigger machines);
* ``max_enqueued_batches``: closed loop: the fewest batches that hold every client's
  request (more never changes anything, fewer only rejects); open loop: what the SLO
  can drain (SLO x threads / L(max_batch_size), at least the threads: upstream's advice
  for online serving);
* ``allowed_batch_sizes``: none, unless asked for (``padding``: then powers of two
  times r up to max_batch_size); the cost of padding is reported either way.

Candidates are screened with short simulations; the best few are simulated again at
full length, and those figures are the predictions reported.

Example:
    >>> result = search(profile, Objective(slo_p99_ms=250, clients=16), service)
    >>> result.best.settings.batching.max_batch_size
    16
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Union

from serving_opt.tune.curve import LatencyCurve
from serving_opt.tune.profile import ModelProfile
from serving_opt.tune.scheduler import Prediction, ServiceModel, Workload, simulate
from serving_opt.tune.settings import (
    BatchingSettings,
    ServingSettings,
    ThreadSettings,
    cores,
    tf_serving_default,
    upstream_batching,
)

SCREEN_REQUESTS = 800
FINAL_REQUESTS = 5000
REFINE = 8  # candidates simulated again at full length
NEAR = 0.03  # predictions closer than this are ties
DEFAULT_THREADS = ThreadSettings()
# The server's cost per request: one model for every thread setting, or one per
# thread setting (calibrated each on its own; see calibrate.Calibration).
Services = Union[ServiceModel, Mapping[ThreadSettings, ServiceModel]]  # noqa: UP007 (3.9)


def service_for(service: Services, threads: ThreadSettings) -> ServiceModel:
    """The ServiceModel of ``threads`` (the default threads' when it was not fitted).

    Example:
        >>> service_for({ThreadSettings(): ServiceModel(0.002)}, ThreadSettings(1, 0))
        ServiceModel(parallel_s=0.002, ...)
    """
    if isinstance(service, ServiceModel):
        return service
    if threads in service:
        return service[threads]
    return service.get(DEFAULT_THREADS) or next(iter(service.values()))


@dataclass(frozen=True)
class Objective:
    """What the settings are for.

    Example:
        >>> Objective(slo_p99_ms=250, clients=16, rows_per_request=1)
    """

    slo_p99_ms: float
    clients: int = 0  # closed loop; 0: none
    rate: float = 0.0  # open loop, requests/s; 0: none
    rows_per_request: int = 1
    max_reject_fraction: float = 0.001
    padding: str = "none"  # "none", "pow2", or "4,8,16" (rows)
    seed: int = 0

    def workloads(self, max_requests: int = FINAL_REQUESTS) -> dict[str, Workload]:
        """The simulated workloads: measured once the queue is steady (a few answers
        per client), an open loop given up once its latency passes 5x the SLO."""
        out = {}
        if self.clients:
            out["closed"] = Workload("closed", clients=self.clients,
                                     rows_per_request=self.rows_per_request,
                                     max_requests=max_requests, seed=self.seed, warmup=0.0,
                                     warmup_answers=2 * self.clients + 20)
        if self.rate:
            out["open"] = self.open_workload(self.rate, max_requests)
        return out

    def open_workload(self, rate: float, max_requests: int) -> Workload:
        return Workload("open", rate=rate, rows_per_request=self.rows_per_request,
                        max_requests=max_requests, seed=self.seed, warmup=0.0,
                        warmup_answers=100, give_up_s=5 * self.slo_p99_ms / 1000.0)


@dataclass(frozen=True)
class Candidate:
    """One setting and what the model predicts for it under each workload.

    ``verdict`` is empty when the objective is met, else why not (one line).

    Example:
        >>> candidate.predictions["closed"].rows_per_second
        612.0
    """

    settings: ServingSettings
    predictions: dict = field(default_factory=dict)
    verdict: str = ""

    @property
    def ok(self) -> bool:
        return not self.verdict

    def primary(self) -> Prediction:
        return self.predictions.get("closed") or self.predictions["open"]

    def to_dict(self) -> dict:
        return {"settings": asdict(self.settings), "describe": self.settings.describe(),
                "predictions": {k: v.to_dict() for k, v in self.predictions.items()},
                "verdict": self.verdict}


@dataclass(frozen=True)
class SearchResult:
    """The search's outcome: the best, the front, the references, and what padding costs.

    ``front`` is every candidate no other beats on both rows/s and p99 (primary
    workload), by rows/s. ``best`` is None when nothing meets the objective.
    ``open_capacity`` is the highest open-loop rate (requests/s) the best sustains
    with p99 under the SLO.

    Example:
        >>> [c.settings.describe() for c in result.front][:1]
        ['max 16, timeout 0 us, 1 thread, queue 1; threads intra default, inter default']
    """

    best: Candidate | None
    front: tuple[Candidate, ...]
    default: Candidate
    upstream: Candidate
    runners_up: tuple[Candidate, ...]
    evaluated: int
    padding_cost: str = ""
    open_capacity: float = 0.0
    points: tuple[tuple[str, float, float, bool], ...] = ()  # (describe, rows/s, p99, ok)


def grid(curve: LatencyCurve, objective: Objective, largest: int,
         cpus: int | None = None) -> list[BatchingSettings]:
    """The BatchingSettings tried with one thread setting's curve (see module doc).

    Example:
        >>> [b.max_batch_size for b in grid(curve, Objective(250, clients=4), 64)][:3]
        [1, 1, 1]
    """
    r = objective.rows_per_request
    cpus = cpus or cores()
    slo_s = objective.slo_p99_ms / 1000.0
    multiples = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
    if objective.clients:
        multiples |= {objective.clients, max(1, objective.clients // 2)}
    sizes = sorted({r * m for m in multiples if r * m <= max(largest, r)})
    threads = sorted({1, 2, max(1, cpus // 2), cpus} if cpus > 4 else set(range(1, cpus + 1)))
    out = []
    for size in sizes:
        run_s = curve.seconds(size)
        if run_s > slo_s and size > r:
            continue  # one run of it alone misses the objective
        timeouts = {0, 1000}
        for fraction in (0.25, 0.5, 1.0):
            timeouts.add(int(round(fraction * run_s * 1e6, -2)))
        timeouts = sorted(t for t in timeouts if t == 0 or t < slo_s * 1e6 / 2)
        if size == r:
            timeouts = [0]  # a batch of one request is full at once
        for n_threads in threads:
            for queue in _queues(objective, size, run_s, n_threads):
                for timeout in timeouts:
                    out.append(BatchingSettings(size, timeout, queue, n_threads,
                                                _padding(objective, size)))
    return out


def _queues(objective: Objective, size: int, run_s: float, n_threads: int) -> list[int]:
    r = objective.rows_per_request
    need = math.ceil(objective.clients * r / size) if objective.clients else 0
    if not objective.rate:
        return [max(1, need)]
    drain = max(n_threads, int(objective.slo_p99_ms / 1000.0 * n_threads / max(run_s, 1e-6)))
    return sorted({max(need, n_threads), max(need, drain)})


def _padding(objective: Objective, size: int) -> tuple[int, ...]:
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


def predict(profile: ModelProfile, settings: ServingSettings, workload: Workload,
            service: Services) -> Prediction:
    """The model's prediction for ``settings`` under ``workload``.

    Example:
        >>> predict(profile, tf_serving_default(), Workload("closed", clients=16),
        ...         service).rows_per_second
        341.2
    """
    curve = profile.curve(settings.threads)
    return simulate(curve, settings.batching, workload,
                    service_for(service, settings.threads))


def evaluate(profile: ModelProfile, settings: ServingSettings, objective: Objective,
             service: Services, max_requests: int = FINAL_REQUESTS) -> Candidate:
    """One candidate predicted under every workload of ``objective``, with its verdict."""
    predictions = {name: predict(profile, settings, workload, service)
                   for name, workload in objective.workloads(max_requests).items()}
    return Candidate(settings, predictions, _verdict(predictions, objective))


def _verdict(predictions: dict, objective: Objective) -> str:
    for name, p in predictions.items():
        where = "closed loop" if name == "closed" else "open loop"
        if p.overloaded:
            return f"{where}: cannot keep up with {objective.rate:g} requests/s"
        if p.reject_fraction > objective.max_reject_fraction:
            return (f"{where}: rejects {p.reject_fraction:.1%} of requests (UNAVAILABLE, "
                    "max_enqueued_batches)")
        if not p.p99_ms <= objective.slo_p99_ms:
            return f"{where}: p99 {p.p99_ms:.0f} ms over the {objective.slo_p99_ms:g} ms SLO"
    return ""


def _simpler(candidate: Candidate) -> tuple:
    """Smaller is simpler: no batching, then smaller batches, fewer threads, shorter
    timeouts, TensorFlow's default threads."""
    b = candidate.settings.batching
    threads = candidate.settings.threads
    return (b.max_batch_size if b else 0, b.num_batch_threads if b else 0,
            b.batch_timeout_micros if b else 0, threads.intra_op, threads.inter_op)


def _score(candidate: Candidate) -> tuple:
    p = candidate.primary()
    if "closed" in candidate.predictions:
        return (-p.rows_per_second, p.p99_ms, *_simpler(candidate))
    return (p.p99_ms, *_simpler(candidate))


def pick(candidates: Sequence[Candidate]) -> Candidate | None:
    """The best candidate meeting the objective. A prediction is not exact, so a gain
    under NEAR is no reason for a bigger setting: among those within NEAR of the best
    throughput (open loop: of the best p99), the lowest p99 wins if it is more than NEAR
    lower, else the simplest."""
    ok = [c for c in candidates if c.ok]
    if not ok:
        return None
    top = min(ok, key=_score)
    if "closed" in top.predictions:
        best_rows = top.primary().rows_per_second
        near = [c for c in ok if c.primary().rows_per_second >= best_rows * (1 - NEAR)]
    else:
        near = [c for c in ok if c.primary().p99_ms <= top.primary().p99_ms * (1 + NEAR)]
    lowest = min(c.primary().p99_ms for c in near)
    calm = [c for c in near if c.primary().p99_ms <= lowest * (1 + NEAR)]
    return min(calm, key=_simpler)


def front(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The candidates no other beats on both throughput and p99 (primary workload).

    Example:
        >>> len(front(candidates)) <= len(candidates)
        True
    """
    finite = [c for c in candidates if math.isfinite(c.primary().p99_ms)]
    ordered = sorted(finite, key=lambda c: (-c.primary().rows_per_second, c.primary().p99_ms))
    out, best_p99 = [], math.inf
    for candidate in ordered:
        if candidate.primary().p99_ms < best_p99:
            out.append(candidate)
            best_p99 = candidate.primary().p99_ms
    return tuple(out)


def search(profile: ModelProfile, objective: Objective, service: Services,
           thread_settings: Sequence[ThreadSettings] | None = None,
           progress: Callable[[str], None] | None = None, cpus: int | None = None,
           default_threads: ThreadSettings = DEFAULT_THREADS,
           screen_requests: int = SCREEN_REQUESTS,
           final_requests: int = FINAL_REQUESTS) -> SearchResult:
    """Every candidate through the model; the best meeting ``objective`` and the front.

    Example:
        >>> search(profile, Objective(250, clients=16), service).best.ok
        True
    """
    say = progress or (lambda m: None)
    if not objective.workloads():
        raise ValueError("an objective needs clients or a rate")
    settings_list: list[ServingSettings] = []
    for curve in profile.curves:
        if thread_settings is not None and curve.threads not in thread_settings:
            continue
        settings_list.append(ServingSettings(None, curve.threads))
        largest = curve.batch_sizes[-1]
        settings_list += [ServingSettings(b, curve.threads)
                          for b in grid(curve, objective, largest, cpus)]
    say(f"searching {len(settings_list)} settings with the scheduler model")
    screened = [evaluate(profile, s, objective, service, screen_requests)
                for s in settings_list]
    ranked = sorted(screened, key=lambda c: (not c.ok, _score(c)))
    refined = [evaluate(profile, c.settings, objective, service, final_requests)
               for c in ranked[:REFINE]]
    best = pick(refined)
    refined = sorted(refined, key=lambda c: (c is not best, not c.ok, _score(c)))
    default = evaluate(profile, tf_serving_default(default_threads), objective, service,
                       final_requests)
    upstream = evaluate(profile, upstream_batching(default_threads), objective, service,
                        final_requests)
    by_settings = {c.settings: c for c in screened}
    by_settings.update({c.settings: c for c in refined})
    everything = list(by_settings.values())
    points = tuple((c.settings.describe(), c.primary().rows_per_second, c.primary().p99_ms,
                    c.ok) for c in everything)
    result = SearchResult(
        best=best, front=front(everything), default=default, upstream=upstream,
        runners_up=tuple(c for c in refined[1:] if c.ok), evaluated=len(screened),
        points=points)
    if best is not None:
        result = replace(result, padding_cost=padding_cost(profile, best, objective, service,
                                                           final_requests),
                         open_capacity=open_capacity(profile, best.settings, objective, service,
                                                     max_requests=screen_requests))
    return result


def padding_cost(profile: ModelProfile, best: Candidate, objective: Objective,
                 service: Services, max_requests: int = FINAL_REQUESTS) -> str:
    """One sentence: what ``allowed_batch_sizes`` (powers of two) does to the best."""
    b = best.settings.batching
    if b is None or b.max_batch_size <= objective.rows_per_request:
        return "no batching chosen: padding does not apply"
    other = replace(objective, padding="none" if b.allowed_batch_sizes else "pow2")
    changed = replace(b, allowed_batch_sizes=_padding(other, b.max_batch_size))
    twin = evaluate(profile, replace(best.settings, batching=changed), objective, service,
                    max_requests)
    mine, theirs = best.primary(), twin.primary()
    if b.allowed_batch_sizes:
        return (f"padding to {'/'.join(map(str, b.allowed_batch_sizes))} costs "
                f"{1 - mine.rows_per_second / max(theirs.rows_per_second, 1e-9):+.0%} "
                f"rows/s against no padding (mean batch {mine.mean_batch_rows:.1f} rows run "
                f"as {mine.mean_padded_rows:.1f})")
    return (f"allowed_batch_sizes {'/'.join(map(str, changed.allowed_batch_sizes))} would "
            f"change rows/s by {theirs.rows_per_second / max(mine.rows_per_second, 1e-9) - 1:+.0%}"
            f" and p99 by {theirs.p99_ms / max(mine.p99_ms, 1e-9) - 1:+.0%} (batches of "
            f"{theirs.mean_batch_rows:.1f} rows padded to {theirs.mean_padded_rows:.1f})")


def open_capacity(profile: ModelProfile, settings: ServingSettings, objective: Objective,
                  service: Services, steps: int = 10,
                  max_requests: int = SCREEN_REQUESTS) -> float:
    """The highest Poisson rate (requests/s) ``settings`` serves with p99 under the SLO
    and no more rejections than allowed (bisection on the model)."""
    curve = profile.curve(settings.threads)
    r = objective.rows_per_request
    b = settings.batching
    ceiling_rows = max(curve.rows_per_second(n) for n in curve.batch_sizes)
    if b is not None:
        ceiling_rows = max(curve.rows_per_second(min(b.max_batch_size, n))
                           for n in curve.batch_sizes) * max(1, b.resolved().num_batch_threads)
    lo, hi = 0.0, 2.0 * ceiling_rows / r
    for _ in range(steps):
        mid = (lo + hi) / 2
        workload = objective.open_workload(mid, max_requests)
        p = simulate(curve, b, workload, service_for(service, settings.threads))
        if (not p.overloaded and p.p99_ms <= objective.slo_p99_ms
                and p.reject_fraction <= objective.max_reject_fraction):
            lo = mid
        else:
            hi = mid
    return lo
