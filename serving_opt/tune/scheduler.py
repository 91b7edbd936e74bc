"""A discrete-event model of TF Serving's batching, driven by a measured latency curve.

What it models is what upstream does (``shared_batch_scheduler.h``,
``batching_session.cc``), for one model and one signature (one queue):

* a request's rows join the queue's **open batch**; the open batch is closed (and may
  run) when it is full (``max_batch_size`` rows), when ``batch_timeout_micros`` have
  passed since its first request arrived, or at once when that timeout is 0 and a
  batch thread is free;
* a request that does not fit in the open batch starts a new one; when
  ``max_enqueued_batches`` batches are already waiting it is **rejected with
  UNAVAILABLE** ("The batch scheduling queue ... is full");
* ``num_batch_threads`` batches run at once, the oldest waiting batch first; a batch
  runs as one session run of its rows **padded** to the next ``allowed_batch_sizes``
  entry;
* without batching every request is its own session run, as many at once as there
  are requests in the server.

Runs that overlap slow each other as the profile measured (``LatencyCurve.slowdown``:
processor sharing, rates recomputed whenever a run starts or ends), and each run's
time is drawn from the measured jitter. Around the batcher, a server spends time per
request outside the session (``ServiceModel``): a delay that requests spend in
parallel (network, gRPC, tensor decoding in C++ threads), a part that requests
spend one at a time, mostly in arrival order (a Python server's interpreter lock: its
gRPC layer takes events from one completion queue, oldest first, but the lock goes to
whichever thread the system wakes; 0 for the C++ server), and the processor time each
request takes from the cores the runs use (the server's own work and a load
generator's on the same machine, shared with the runs in time slices: see
``_sharing_cores``), all calibrated against the real server by ``calibrate``, with the
jitter of the server's own one-client latencies.

The load is the load generator's: N **closed-loop** clients each sending its next
request when the last answer arrives, or **open-loop** Poisson arrivals at a rate.
The figures are the generator's too: requests sent in the measured window, answered,
over the window; percentiles of their latency.

Example:
    >>> curve = LatencyCurve(ThreadSettings(), (1, 32), (0.006, 0.043))
    >>> result = simulate(curve, BatchingSettings(max_batch_size=16, num_batch_threads=1),
    ...                   Workload("closed", clients=16), ServiceModel())
    >>> round(result.rows_per_second)
    ...
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass, replace

import numpy as np

from serving_opt.tune.curve import LatencyCurve, spread_quantile
from serving_opt.tune.settings import BatchingSettings, cores

# Requests in flight beyond which an open-loop run is called overloaded and stopped.
MAX_IN_FLIGHT = 20_000
_MIN_HOP_S = 20e-6  # no request crosses the server in zero time (an error reply neither)
_EPS = 1e-12
# Sharing the cores with the requests' own processor time (see _sharing_cores).
_SHARE_STEPS = 8
_SHARE_TOLERANCE = 0.01
_MAX_SHARE_SLOWDOWN = 20.0
_MAX_SHARED_FRACTION = 0.9  # past this the cores are full: the bisection decides


@dataclass(frozen=True)
class Workload:
    """The load a prediction is for (the load generator's ``Load``, simulated).

    The measured window opens once ``warmup`` seconds have passed and
    ``warmup_answers`` requests were answered (the queue has reached its steady state),
    and lasts ``duration`` seconds, or less once ``max_requests`` of its requests were
    answered. An open-loop run whose requests in flight imply a mean latency over
    ``give_up_s`` (Little's law) is stopped and called overloaded.

    Example:
        >>> Workload("open", rate=300.0, rows_per_request=1)
    """

    mode: str = "closed"
    clients: int = 1
    rate: float = 0.0
    rows_per_request: int = 1
    duration: float = 30.0
    warmup: float = 1.0
    max_requests: int = 4000
    seed: int = 0
    warmup_answers: int = 0
    give_up_s: float = math.inf


@dataclass(frozen=True)
class ServiceModel:
    """The server's time per request outside the session run, in seconds.

    ``parallel_s`` is spent concurrently by all requests (half before the batcher,
    half after); ``serial_s`` one request at a time (the same split), e.g. the
    interpreter lock of a Python server; ``merge_s_per_row`` is added to the run of a
    batch of several requests (merging their inputs, splitting the outputs);
    ``cpu_s`` is the processor time each request costs beside its run, shared with the
    runs (see :func:`simulate`).

    Example:
        >>> ServiceModel(parallel_s=0.002, serial_s=0.0004)
    """

    parallel_s: float = 0.0
    serial_s: float = 0.0
    merge_s_per_row: float = 0.0  # the batching session's concat and split, per row
    run_scale: float = 1.0  # every session run's time times this (see calibrate)
    # Processor time per request spent outside the session on the cores the sessions
    # run on (the server's request handling, a load generator on the same machine),
    # shared with the runs on ``cores`` cores (0: this machine's; see _sharing_cores).
    cpu_s: float = 0.0
    cores: int = 0
    # The one-at-a-time part's jitter: (quantile, time over median) points, from the
    # server's one-client latencies; empty: none.
    serial_jitter: tuple[tuple[float, float], ...] = ()
    # How often the one-at-a-time part takes a waiting request at random instead of the
    # oldest (0: strictly in arrival order; fitted to the N-client p99, see calibrate).
    serial_out_of_order: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one setting under one workload.

    ``overloaded``: an open-loop queue grew without bound (latencies are then the
    window's, and meaningless). ``queue_ms`` is the mean time from the batcher's queue
    to the start of the session run, ``run_ms`` from there to the answer.

    Example:
        >>> prediction.rows_per_second, prediction.p99_ms
        (612.0, 88.1)
    """

    requests: int
    ok: int
    rejected: int
    seconds: float
    requests_per_second: float
    rows_per_second: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    mean_batch_rows: float
    mean_padded_rows: float
    batches_per_second: float
    queue_ms: float
    run_ms: float
    overloaded: bool = False

    @property
    def reject_fraction(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class _Request:
    __slots__ = ("sent", "client", "enqueued", "started", "outcome", "done")

    def __init__(self, sent: float, client: int) -> None:
        self.sent = sent
        self.client = client
        self.enqueued = 0.0
        self.started = 0.0
        self.outcome = ""
        self.done = -1.0


class _Run:
    __slots__ = ("requests", "rows", "padded", "finish")

    def __init__(self, requests: list, rows: int, padded: int, finish: float) -> None:
        self.requests = requests
        self.rows = rows
        self.padded = padded
        self.finish = finish  # on its group's virtual clock


class _Group:
    """The runs of one padded size. They all progress at the same rate (1 / slowdown),
    so one virtual clock serves them: a run ends when the clock reaches start + base."""

    __slots__ = ("clock", "heap")

    def __init__(self) -> None:
        self.clock = 0.0
        self.heap: list = []


class _Simulation:
    def __init__(self, curve: LatencyCurve, batching: BatchingSettings | None,
                 workload: Workload, service: ServiceModel) -> None:
        self.curve = curve
        self.batching = batching.resolved() if batching is not None else None
        self.workload = workload
        self.rows = workload.rows_per_request
        # Arrivals from the seed alone, as the load generator draws them: both see the same
        # Poisson sequence. Run-time jitter from a stream of its own.
        self.arrivals = np.random.default_rng(workload.seed)
        self.rng = np.random.default_rng([workload.seed, 1])
        self.hop_in = max(_MIN_HOP_S, service.parallel_s / 2)
        self.hop_out = max(_MIN_HOP_S, service.parallel_s / 2)
        self.serial_half = service.serial_s / 2
        self.serial_jitter = service.serial_jitter
        self.serial_rng = np.random.default_rng([workload.seed, 2])
        self.serial_busy = False
        self.serial_waiting: deque = deque()
        self.out_of_order = service.serial_out_of_order
        self.merge = service.merge_s_per_row
        self.run_scale = service.run_scale
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.window_start = math.inf  # opens after the warmup (see Workload)
        self.window_end = math.inf
        self.stop_sending = math.inf
        self.answers = 0
        if workload.warmup_answers <= 0:
            self.open_window(workload.warmup)
        if workload.mode == "open" and math.isfinite(workload.give_up_s):
            self.max_in_flight = min(MAX_IN_FLIGHT,
                                     max(50, int(workload.rate * workload.give_up_s)))
        else:
            self.max_in_flight = MAX_IN_FLIGHT
        self.measured_sent = 0
        self.measured_ok = 0
        self.in_flight = 0
        self.overloaded = False
        self.finished: list[_Request] = []
        # Batcher state: closed batches then the open one (upstream Queue::batches_).
        self.batches: deque[list[_Request]] = deque([[]])
        self.sizes: deque[int] = deque([0])
        self.starts: deque[float] = deque([0.0])
        self.groups: dict[int, _Group] = {}
        self.running = 0
        self.batch_runs = 0
        self.last_update = 0.0
        self.run_generation = 0
        self.batch_log: list[tuple[float, int, int]] = []  # (start, rows, padded)
        self.work_scale = service.run_scale  # the machine's speed, not the CPU share
        self.session_cores = 0.0  # cores the runs kept busy in the window (summarize)
        self._slowdowns: dict[tuple[int, int], float] = {}
        self._spreads: dict[tuple[int, int], tuple[float, ...]] = {}
        self._seconds: dict[int, float] = {}

    def slowdown(self, padded: int, k: int) -> float:
        key = (padded, k)
        value = self._slowdowns.get(key)
        if value is None:
            value = self._slowdowns[key] = self.curve.slowdown(padded, k)
        return value

    def spread(self, padded: int, k: int) -> tuple[float, ...]:
        key = (padded, k)
        value = self._spreads.get(key)
        if value is None:
            value = self._spreads[key] = self.curve.spread_for(k, padded)
        return value

    def seconds(self, padded: int) -> float:
        value = self._seconds.get(padded)
        if value is None:
            value = self._seconds[padded] = self.curve.seconds(padded)
        return value

    def open_window(self, at: float) -> None:
        self.window_start = at
        self.window_end = self.stop_sending = at + self.workload.duration

    # ------------------------------------------------------------------ event loop

    def push(self, at: float, kind: str, payload=None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self) -> Prediction:
        w = self.workload
        if w.mode == "closed":
            for client in range(w.clients):
                self.send(0.0, client)
        else:
            self.push(float(self.arrivals.exponential(1.0 / w.rate)), "arrival")
        handlers = {"arrival": self.on_arrival, "in": self.on_in, "enqueue": self.on_enqueue,
                    "timer": self.on_timer, "run_done": self.on_run_done,
                    "reply": self.on_reply, "answer": self.on_answer,
                    "serial_done": self.on_serial_done}
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.now = at
            handlers[kind](payload)
            if self.in_flight > self.max_in_flight:
                self.overloaded = True
                break
        return self.summarize()

    # ------------------------------------------------------------------- requests

    def send(self, at: float, client: int) -> None:
        if at >= self.stop_sending:
            return
        request = _Request(at, client)
        if self.window_start <= at < self.window_end:
            self.measured_sent += 1
            if self.measured_sent >= 50 * self.workload.max_requests:
                # Requests rejected as fast as they are sent: enough of those too.
                self.window_end = self.stop_sending = at + _EPS
        self.in_flight += 1
        self.push(at + self.hop_in, "in", request)

    def on_arrival(self, _payload) -> None:
        self.send(self.now, -1)
        nxt = self.now + float(self.arrivals.exponential(1.0 / self.workload.rate))
        if nxt < self.stop_sending:
            self.push(nxt, "arrival")

    def serial(self, request: _Request, then: str) -> None:
        """Through the one-at-a-time part, then on to ``then``. Waiting requests are
        taken oldest first: a Python gRPC server hands each request's events to its
        handlers from one completion queue, in order (measured on the 1 GB text
        classifier, random order predicted p99 2-3x what the server showed); but the
        interpreter lock goes to whichever thread the system wakes, so a fitted share of
        picks is random (``ServiceModel.serial_out_of_order``)."""
        if self.serial_half <= 0:
            self.push(self.now, then, request)
            return
        if self.serial_busy:
            self.serial_waiting.append((request, then))
            return
        self.serial_start(request, then)

    def serial_start(self, request: _Request, then: str) -> None:
        step = self.serial_half
        if self.serial_jitter:
            step *= _quantile(self.serial_jitter, float(self.serial_rng.random()))
        self.serial_busy = True
        self.push(self.now + step, "serial_done", (request, then))

    def on_serial_done(self, payload) -> None:
        request, then = payload
        self.push(self.now, then, request)
        self.serial_busy = False
        if self.serial_waiting:
            waiting = self.serial_waiting
            if self.out_of_order > 0 and len(waiting) > 1 \
                    and self.serial_rng.random() < self.out_of_order:
                index = int(self.serial_rng.integers(len(waiting)))
                picked = waiting[index]
                del waiting[index]
                self.serial_start(*picked)
            else:
                self.serial_start(*waiting.popleft())

    def on_in(self, request: _Request) -> None:
        self.serial(request, "enqueue")

    def on_enqueue(self, request: _Request) -> None:
        request.enqueued = self.now
        if self.batching is None:
            self.start_run([request], self.rows, self.rows)
            return
        self.schedule(request)

    def reply(self, request: _Request, outcome: str) -> None:
        request.outcome = outcome
        if outcome == "ok":
            self.serial(request, "reply")
        else:
            self.push(self.now + self.hop_out, "answer", request)

    def on_reply(self, request: _Request) -> None:
        self.push(self.now + self.hop_out, "answer", request)

    def on_answer(self, request: _Request) -> None:
        request.done = self.now
        self.in_flight -= 1
        self.finished.append(request)
        self.answers += 1
        if (math.isinf(self.window_start) and self.answers >= self.workload.warmup_answers
                and self.now >= self.workload.warmup):
            self.open_window(self.now)
        if request.outcome == "ok" and self.window_start <= request.sent < self.window_end:
            self.measured_ok += 1
            if self.measured_ok >= self.workload.max_requests:
                # Enough answers: the window ends where this one was sent; what was sent
                # after it is not measured, what was sent before drains.
                self.window_end = request.sent + _EPS
                self.stop_sending = min(self.stop_sending, self.now)
        if request.client >= 0:
            self.send(self.now, request.client)

    # -------------------------------------------------------------------- batcher

    def schedule(self, request: _Request) -> None:
        options = self.batching
        if self.rows > options.max_batch_size:
            self.reply(request, "INVALID_ARGUMENT")
            return
        if self.sizes[-1] and self.sizes[-1] + self.rows > options.max_batch_size:
            if len(self.batches) >= options.max_enqueued_batches:
                self.reply(request, "UNAVAILABLE")
                return
            self.batches.append([])
            self.sizes.append(0)
            self.starts.append(0.0)
        if not self.sizes[-1]:
            self.starts[-1] = self.now
            if options.batch_timeout_micros > 0:
                self.push(self.now + options.batch_timeout_micros / 1e6, "timer")
        self.batches[-1].append(request)
        self.sizes[-1] += self.rows
        self.dispatch()

    def dispatch(self) -> None:
        options = self.batching
        timeout = options.batch_timeout_micros / 1e6
        while self.batch_runs < options.num_batch_threads:
            if len(self.batches) >= 2:
                pass
            elif self.sizes[0] and (self.sizes[0] >= options.max_batch_size
                                    or self.now + _EPS >= self.starts[0] + timeout):
                pass
            else:
                return
            batch = self.batches.popleft()
            rows = self.sizes.popleft()
            self.starts.popleft()
            if not self.batches:
                self.batches.append([])
                self.sizes.append(0)
                self.starts.append(0.0)
            self.batch_runs += 1
            self.start_run(batch, rows, options.padded(rows))

    def on_timer(self, _payload) -> None:
        self.dispatch()

    # ------------------------------------------------------- session runs, shared

    def advance(self) -> None:
        elapsed = self.now - self.last_update
        if elapsed > 0 and self.running:
            k = self.running
            for padded, group in self.groups.items():
                if group.heap:
                    group.clock += elapsed / self.slowdown(padded, k)
        self.last_update = self.now

    def reschedule(self) -> None:
        self.run_generation += 1
        if not self.running:
            return
        k = self.running
        soonest = min((g.heap[0][0] - g.clock) * self.slowdown(p, k)
                      for p, g in self.groups.items() if g.heap)
        self.push(self.now + max(0.0, soonest), "run_done", self.run_generation)

    def start_run(self, requests: list, rows: int, padded: int) -> None:
        self.advance()
        base = (self.seconds(padded) * self.run_scale
                * spread_quantile(self.spread(padded, self.running + 1),
                                  float(self.rng.random())))
        if len(requests) > 1:
            base += self.merge * padded
        for request in requests:
            request.started = self.now
        group = self.groups.get(padded)
        if group is None:
            group = self.groups[padded] = _Group()
        run = _Run(requests, rows, padded, group.clock + max(base, 1e-7))
        self.seq += 1
        heapq.heappush(group.heap, (run.finish, self.seq, run))
        self.running += 1
        self.batch_log.append((self.now, rows, padded))
        self.reschedule()

    def on_run_done(self, generation: int) -> None:
        if generation != self.run_generation:
            return  # a run started or ended since: rates changed
        self.advance()
        done = []
        for group in self.groups.values():
            while group.heap and group.heap[0][0] <= group.clock + 1e-12:
                done.append(heapq.heappop(group.heap)[2])
        self.running -= len(done)
        for run in done:
            for request in run.requests:
                self.reply(request, "ok")
            if self.batching is not None:
                self.batch_runs -= 1
        if self.batching is not None:
            self.dispatch()
        self.reschedule()

    # --------------------------------------------------------------------- result

    def summarize(self) -> Prediction:
        if math.isinf(self.window_start):  # never warmed up: everything is the window
            self.window_start, self.window_end = 0.0, self.now
        start, end = self.window_start, min(self.window_end, self.stop_sending)
        if self.overloaded:
            end = min(end, self.now)
        seconds = max(end - start, 1e-9)
        measured = [r for r in self.finished if start <= r.sent < end]
        if self.overloaded:
            # What never finished counts as sent, unanswered.
            sent = max(self.measured_sent, len(measured))
        else:
            sent = len(measured)
        ok = [r for r in measured if r.outcome == "ok"]
        if self.workload.mode == "open" and ok:
            # A queue still draining long after arrivals stopped was growing all along.
            drain = max(r.done for r in ok) - end
            self.overloaded = self.overloaded or drain > max(1.0, seconds / 2)
        latencies = np.array([(r.done - r.sent) * 1000.0 for r in ok]) if ok else None
        rejected = sum(1 for r in measured if r.outcome == "UNAVAILABLE")
        batches = [(rows, padded) for at, rows, padded in self.batch_log if start <= at < end]
        work = sum(self.curve.cores_busy(padded) * self.seconds(padded) for _, padded in batches)
        self.session_cores = work * self.work_scale / seconds
        queue = [r.started - r.enqueued for r in ok]
        runs = [r.done - r.started for r in ok]

        def pct(q: float) -> float:
            return float(np.percentile(latencies, q)) if latencies is not None else math.inf

        return Prediction(
            requests=sent, ok=len(ok), rejected=rejected, seconds=seconds,
            requests_per_second=len(ok) / seconds,
            rows_per_second=len(ok) * self.rows / seconds,
            mean_ms=float(latencies.mean()) if latencies is not None else math.inf,
            p50_ms=pct(50), p99_ms=math.inf if self.overloaded else pct(99),
            mean_batch_rows=float(np.mean([b[0] for b in batches])) if batches else 0.0,
            mean_padded_rows=float(np.mean([b[1] for b in batches])) if batches else 0.0,
            batches_per_second=len(batches) / seconds,
            queue_ms=float(np.mean(queue)) * 1000.0 if queue else 0.0,
            run_ms=float(np.mean(runs)) * 1000.0 if runs else 0.0,
            overloaded=self.overloaded)


def _quantile(points: tuple[tuple[float, float], ...], u: float) -> float:
    """The value at quantile ``u`` of a distribution given as (quantile, value) points."""
    for (u0, v0), (u1, v1) in zip(points, points[1:]):
        if u <= u1:
            return v0 + (v1 - v0) * (u - u0) / (u1 - u0) if u1 > u0 else v1
    return points[-1][1]


def check_workload(workload: Workload) -> None:
    """Raises ValueError for a workload the model cannot run."""
    if workload.mode not in ("closed", "open"):
        raise ValueError(f"workload mode {workload.mode!r} is not closed or open")
    if workload.mode == "closed" and workload.clients < 1:
        raise ValueError("a closed-loop workload needs at least one client")
    if workload.mode == "open" and not 0 < workload.rate < math.inf:
        raise ValueError("an open-loop workload needs a rate > 0")
    if workload.rows_per_request < 1 or workload.duration <= 0 or workload.warmup < 0:
        raise ValueError("rows_per_request >= 1, duration > 0 and warmup >= 0, please")


def simulate(curve: LatencyCurve, batching: BatchingSettings | None, workload: Workload,
             service: ServiceModel = ServiceModel()) -> Prediction:
    """Predicts throughput and latency of ``batching`` (None: off) under ``workload``.

    Example:
        >>> simulate(curve, None, Workload("closed", clients=1), ServiceModel()).ok > 0
        True
    """
    check_workload(workload)
    if batching is not None and batching.problems():
        raise ValueError("; ".join(batching.problems()))
    if service.cpu_s <= 0:
        return _Simulation(curve, batching, workload, service).run()
    return _sharing_cores(curve, batching, workload, service)


def _sharing_cores(curve: LatencyCurve, batching: BatchingSettings | None,
                   workload: Workload, service: ServiceModel) -> Prediction:
    """The prediction when each request also costs ``service.cpu_s`` of processor time
    on the cores the runs use.

    The operating system shares the cores among runnable threads in time slices, so
    work beside a run slows it even while a core is free on average: a run sharing n
    cores with requests that take T cores' worth of processor time runs 1 / (1 - T/n)
    times as long (processor sharing; measured: MobileNetV2's batch of 8 at one intra-op
    thread took 1.4x its profiled time in a server whose requests took 0.55 of 2 cores,
    and 1 / (1 - 0.55/2) = 1.38). Only other requests' work is beside a run (a request
    is decoded before its run and answered after it): N closed-loop clients share
    (N - 1) / N of T, a lone client none. T falls as runs slow (fewer answers per
    second), so the slowdown s is the fixed point s = 1 / (1 - T(s)/n), damped. Past the
    cores, everything shares them: the runs (their measured processor time, counted as
    at most every core: overlapping runs already share them in their measured
    slowdowns) and the requests' own time in the server (its delay, its one-at-a-time
    part) take s times as long, s where the work done per second fits the cores
    (bisection; at saturation both rules give about the same s).
    """
    n = float(service.cores or cores())

    def attempt(slowdown: float) -> tuple[Prediction, float, float]:
        sim = _Simulation(curve, batching, workload, replace(
            service, run_scale=service.run_scale * slowdown,
            parallel_s=service.parallel_s * slowdown, serial_s=service.serial_s * slowdown))
        sim.work_scale = service.run_scale  # the work of a run does not grow when shared
        prediction = sim.run()
        taken = service.cpu_s * prediction.requests / max(prediction.seconds, 1e-9)
        return prediction, sim.session_cores, taken

    prediction, busy, taken = attempt(1.0)
    beside = 1.0 - 1.0 / workload.clients if workload.mode == "closed" else 1.0
    shared = 1.0
    for _ in range(_SHARE_STEPS):
        target = 1.0 / (1.0 - min(_MAX_SHARED_FRACTION, beside * taken / n))
        if abs(target / shared - 1.0) < _SHARE_TOLERANCE:
            break
        shared = math.sqrt(shared * target)  # damped: T(s) falls as s grows
        prediction, busy, taken = attempt(shared)
    if min(busy, n) + taken <= n * (1 + _SHARE_TOLERANCE):
        return prediction
    share = min(1.0, n / busy) if busy > 0 else 1.0

    def used(slowdown: float) -> tuple[Prediction, float]:
        p, b, t = attempt(slowdown)
        return p, share * b + t

    lo, hi = shared, min(_MAX_SHARE_SLOWDOWN, shared * (1.0 + taken / n))
    best, used_hi = used(hi)
    while used_hi > n and hi < _MAX_SHARE_SLOWDOWN:
        lo, hi = hi, min(_MAX_SHARE_SLOWDOWN, 2 * hi)
        best, used_hi = used(hi)
    for _ in range(_SHARE_STEPS):
        if hi / lo < 1 + _SHARE_TOLERANCE:
            break
        mid = math.sqrt(lo * hi)
        candidate, used_mid = used(mid)
        if used_mid > n:
            lo = mid
        else:
            hi, best = mid, candidate
    return best
