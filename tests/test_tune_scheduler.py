"""The scheduler model against hand-computed cases: one batching behaviour per test.

Latency curves are exact (no jitter) and the server adds only its minimum hop (20 us
in, 20 us out), so every figure below can be worked out by hand from upstream's rules
(shared_batch_scheduler.h): a batch runs when full, when its timeout passes, or at once
with timeout 0 and a free thread; ``num_batch_threads`` run at once; a batch is padded
to the next allowed size; a request finding ``max_enqueued_batches`` batches waiting is
rejected with UNAVAILABLE. No TensorFlow, no timing: simulated time only.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from serving_opt.tune.curve import ConcurrencyPoint, LatencyCurve
from serving_opt.tune.scheduler import ServiceModel, Workload, simulate
from serving_opt.tune.settings import BatchingSettings, ThreadSettings

HOPS_MS = 0.04  # 20 us to the batcher and 20 us back (scheduler._MIN_HOP_S)


def flat(ms: float, largest: int = 64, concurrency=()) -> LatencyCurve:
    """Every batch size takes ``ms``; overlapping runs as ``concurrency`` says."""
    return LatencyCurve(ThreadSettings(), (1, largest), (ms / 1000, ms / 1000),
                        concurrency=tuple(concurrency))


def linear(ms_per_row: float, fixed_ms: float = 0.0, largest: int = 64) -> LatencyCurve:
    return LatencyCurve(ThreadSettings(), (1, largest),
                        ((fixed_ms + ms_per_row) / 1000, (fixed_ms + ms_per_row * largest) / 1000))


def closed(clients: int, requests: int = 400) -> Workload:
    return Workload("closed", clients=clients, duration=60.0, warmup=0.5, max_requests=requests)


def test_a_timeout_closes_a_partial_batch():
    # One client: its request starts a batch of 8 that never fills; the 10 ms timeout
    # closes it, then it runs for 5 ms.
    batching = BatchingSettings(max_batch_size=8, batch_timeout_micros=10_000,
                                max_enqueued_batches=8, num_batch_threads=1)
    p = simulate(flat(5.0), batching, closed(1, 100))
    assert p.mean_batch_rows == 1
    assert p.queue_ms == pytest.approx(10.0, abs=1e-6)
    assert p.p50_ms == pytest.approx(10.0 + 5.0 + HOPS_MS, abs=1e-6)
    assert p.p99_ms == pytest.approx(p.p50_ms, abs=1e-6)


def test_a_full_batch_closes_at_once_without_waiting_for_its_timeout():
    # Four clients arrive together; the fourth fills the batch of 4, which runs at once
    # although its timeout is a second.
    batching = BatchingSettings(max_batch_size=4, batch_timeout_micros=1_000_000,
                                max_enqueued_batches=4, num_batch_threads=1)
    p = simulate(flat(8.0), batching, closed(4, 200))
    assert p.mean_batch_rows == 4
    assert p.queue_ms == pytest.approx(0.0, abs=1e-6)
    assert p.p50_ms == pytest.approx(8.0 + HOPS_MS, abs=1e-6)


def test_num_batch_threads_run_batches_in_parallel():
    # Batches of one request, 10 ms each, overlapping runs not slowing each other: one
    # thread runs 100 batches a second, two run 200 (four clients keep both busy).
    curve = flat(10.0, concurrency=[ConcurrencyPoint(1, 2, 0.010),
                                    ConcurrencyPoint(1, 4, 0.010)])

    def rows_per_second(threads: int) -> float:
        batching = BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                    max_enqueued_batches=4, num_batch_threads=threads)
        return simulate(curve, batching, closed(4, 400)).rows_per_second

    assert rows_per_second(1) == pytest.approx(100.0, rel=0.01)
    assert rows_per_second(2) == pytest.approx(200.0, rel=0.01)


def test_overlapping_runs_slow_each_other_as_measured():
    # Two threads, but two overlapping runs take twice as long each: no gain over one.
    curve = flat(10.0, concurrency=[ConcurrencyPoint(1, 2, 0.020)])
    batching = BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                max_enqueued_batches=4, num_batch_threads=2)
    assert simulate(curve, batching, closed(4)).rows_per_second == pytest.approx(100.0, rel=0.01)


def test_a_batch_is_padded_to_the_next_allowed_size():
    # Five requests of one row close by the 2 ms timeout; with allowed sizes 4 and 8 the
    # batch runs as 8 rows (8 ms at 1 ms a row), without them as 5 (5 ms).
    curve = linear(1.0)
    base = BatchingSettings(max_batch_size=8, batch_timeout_micros=2_000,
                            max_enqueued_batches=4, num_batch_threads=1)
    padded = simulate(curve, BatchingSettings(**{**base.__dict__, "allowed_batch_sizes": (4, 8)}),
                      closed(5, 200))
    plain = simulate(curve, base, closed(5, 200))
    assert (padded.mean_batch_rows, padded.mean_padded_rows) == (5, 8)
    assert (plain.mean_batch_rows, plain.mean_padded_rows) == (5, 5)
    assert padded.p50_ms == pytest.approx(2.0 + 8.0 + HOPS_MS, abs=1e-6)
    assert plain.p50_ms == pytest.approx(2.0 + 5.0 + HOPS_MS, abs=1e-6)


def test_max_enqueued_batches_rejects_with_unavailable():
    # Eight clients, batches of one request, one thread: with two batches allowed to wait
    # only three requests are ever in the server (one running, two waiting); the rest are
    # rejected, and an accepted one waits at most two runs. With ten, nothing is refused
    # and every request waits for the seven ahead of it. (The server spends 2 ms per
    # request around the batcher, so a rejected client retries every 2 ms.)
    curve = flat(10.0)
    around = ServiceModel(parallel_s=0.002)
    small = simulate(curve, BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                             max_enqueued_batches=2, num_batch_threads=1),
                     closed(8, 300), around)
    large = simulate(curve, BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                             max_enqueued_batches=10, num_batch_threads=1),
                     closed(8, 300), around)
    assert small.rejected > 0 and small.ok > 0
    assert small.p99_ms <= 3 * 10.0 + 2.0 + 1e-6
    assert small.rows_per_second == pytest.approx(100.0, rel=0.02)
    assert large.rejected == 0
    assert large.p50_ms == pytest.approx(8 * 10.0, rel=0.01)


def test_closed_loop_throughput_obeys_littles_law_and_the_batch_bound():
    # N clients with no think time: rows/s x mean latency = N; and one thread cannot do
    # more than a full batch per run: 8 rows per L(8) = 10 ms.
    curve = linear(1.0, fixed_ms=2.0)
    batching = BatchingSettings(max_batch_size=8, batch_timeout_micros=0,
                                max_enqueued_batches=2, num_batch_threads=1)
    p = simulate(curve, batching, closed(8, 2000))
    assert p.rows_per_second * p.mean_ms / 1000 == pytest.approx(8, rel=0.01)
    assert p.rows_per_second <= 8 / 0.010 * 1.0001
    # Without batching each request is its own run; fully serialized runs give 1 / L(1).
    serial = flat(5.0, concurrency=[ConcurrencyPoint(1, 8, 0.040)])
    q = simulate(serial, None, closed(8, 2000))
    assert q.rows_per_second == pytest.approx(200.0, rel=0.02)
    assert q.rows_per_second * q.mean_ms / 1000 == pytest.approx(8, rel=0.01)


def test_serial_server_time_caps_throughput():
    # 1 ms spent one request at a time caps any setting at 1000 requests/s (the measured
    # window's edges, a client's worth of requests, aside).
    p = simulate(flat(0.1), BatchingSettings(max_batch_size=64, num_batch_threads=2),
                 closed(32, 3000), ServiceModel(serial_s=0.001))
    assert p.requests_per_second <= 1000 * (1 + 32 / 3000)
    assert p.requests_per_second == pytest.approx(1000, rel=0.03)


def test_open_loop_sends_poisson_arrivals_at_the_rate():
    workload = Workload("open", rate=200.0, duration=20.0, warmup=1.0, max_requests=10**6,
                        seed=3)
    p = simulate(flat(1.0), None, workload)
    rng = np.random.default_rng(3)
    times, at = [], 0.0
    while at < 21.0:
        at += rng.exponential(1 / 200.0)
        times.append(at)
    expected = sum(1 for t in times if 1.0 <= t < 21.0)
    assert p.requests == expected
    assert not p.overloaded


def test_open_loop_overload_is_flagged_or_rejected():
    # 300 requests/s against 100/s of capacity: without batching the queue grows without
    # bound; with a bounded batch queue the excess is rejected instead.
    heavy = Workload("open", rate=300.0, duration=5.0, warmup=0.5, max_requests=10**6)
    unbounded = simulate(flat(10.0, concurrency=[ConcurrencyPoint(1, 2, 0.020)]), None, heavy)
    assert unbounded.overloaded
    bounded = simulate(flat(10.0), BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                                    max_enqueued_batches=2,
                                                    num_batch_threads=1), heavy)
    assert not bounded.overloaded
    assert bounded.reject_fraction > 0.5


def test_processor_time_per_request_slows_runs_by_the_share_of_the_cores_it_takes():
    # One batch thread running 10 ms runs back to back keeps one of two cores busy; the
    # 2 ms of processor time of each of the other 15 clients' requests shares the cores
    # in time slices with it. At s times the run time they take T = 15/16 x 0.002 x 100/s
    # cores, and a run beside them takes s = 1 / (1 - T/2) = 1 / (1 - 0.09375/s):
    # s = 1.094, 100 / 1.094 = 91.4 rows/s. Sixteen requests at once without batching
    # fill both cores: each request costs 10 / 2 ms of run per core plus 2 / 2 ms of its
    # own, so 2 / 12 ms = 167 rows/s instead of 200.
    curve = LatencyCurve(ThreadSettings(), (1, 64), (0.010, 0.010), cpu_s=(0.010, 0.010),
                         concurrency=(ConcurrencyPoint(1, 2, 0.010),
                                      ConcurrencyPoint(1, 16, 0.080)))
    one_thread = BatchingSettings(max_batch_size=1, max_enqueued_batches=16,
                                  num_batch_threads=1)
    taxed = ServiceModel(cpu_s=0.002, cores=2)
    alone = simulate(curve, one_thread, closed(16, 2000))
    shared = simulate(curve, one_thread, closed(16, 2000), taxed)
    assert alone.rows_per_second == pytest.approx(100, rel=0.03)
    assert shared.rows_per_second == pytest.approx(alone.rows_per_second / 1.094, rel=0.02)
    full = simulate(curve, None, closed(16, 2000))
    slowed = simulate(curve, None, closed(16, 2000), taxed)
    assert full.rows_per_second == pytest.approx(200, rel=0.03)
    assert slowed.rows_per_second == pytest.approx(2 / 0.012, rel=0.05)


def test_a_lone_clients_own_processor_time_slows_no_run():
    # One client's request is decoded before its run and answered after it: its
    # processor time adds to its latency but never shares a core with a run.
    curve = LatencyCurve(ThreadSettings(), (1, 64), (0.010, 0.010), cpu_s=(0.010, 0.010))
    one_thread = BatchingSettings(max_batch_size=1, num_batch_threads=1)
    alone = simulate(curve, one_thread, closed(1, 300))
    taxed = simulate(curve, one_thread, closed(1, 300), ServiceModel(cpu_s=0.005, cores=2))
    assert taxed.rows_per_second == pytest.approx(alone.rows_per_second, rel=0.01)
    assert alone.rows_per_second == pytest.approx(100, rel=0.03)


def _measured(prediction, clients: int):
    from serving_opt.tune.load import LoadResult

    return LoadResult("grpc", "closed", clients, 0.0, 1, prediction.seconds,
                      prediction.requests, prediction.ok,
                      requests_per_second=prediction.requests_per_second,
                      rows_per_second=prediction.rows_per_second, mean_ms=prediction.mean_ms,
                      p50_ms=prediction.p50_ms, p99_ms=prediction.p99_ms)


def test_the_calibration_finds_the_processor_time_a_server_takes_per_request():
    # A "server" made of the model itself with 3 ms of processor time per request: fitted
    # to its one-client and sixteen-client figures, the calibration recovers that time,
    # and then predicts a setting it was not fitted to (no batching) as the server does.
    from serving_opt.tune.calibrate import FitSetting, fit

    curve = LatencyCurve(ThreadSettings(), (1, 16, 64), (0.008, 0.060, 0.230),
                         cpu_s=(0.008, 0.060, 0.230),
                         concurrency=(ConcurrencyPoint(1, 2, 0.008),
                                      ConcurrencyPoint(1, 16, 0.064),
                                      ConcurrencyPoint(16, 2, 0.060)))
    # A Python server: the processor time it spends (none is the generator's here) is
    # spent holding its interpreter lock, one request at a time.
    truth = ServiceModel(parallel_s=0.002, serial_s=0.003, cpu_s=0.003, cores=2)
    upstream = BatchingSettings(max_batch_size=1000, num_batch_threads=2)
    workload = Workload("closed", clients=16, max_requests=2000, warmup=0.0,
                        warmup_answers=52)
    one = simulate(curve, upstream, Workload("closed", clients=1, max_requests=300), truth)
    many = simulate(curve, upstream, workload, truth)
    fitted = fit(curve, 1, _measured(one, 1), _measured(many, 16),
                 FitSetting(batching=upstream, cores=2))
    assert fitted.service.cpu_s == pytest.approx(0.003, rel=0.15)
    assert fitted.service.serial_s == fitted.service.cpu_s
    assert fitted.service.parallel_s == pytest.approx(0.002, abs=0.0005)
    expected = simulate(curve, None, workload, truth).rows_per_second
    predicted = simulate(curve, None, workload, fitted.service).rows_per_second
    assert predicted == pytest.approx(expected, rel=0.05)


def test_the_calibration_fits_how_often_the_one_at_a_time_part_is_out_of_order():
    # Order moves the tail, not the throughput: a "server" whose one-at-a-time part takes
    # a random waiting request 60% of the time has a longer p99 than one in arrival
    # order; fitted to its figures, the model's p99 at that point matches it, where the
    # in-order fit falls short; an in-order server is fitted in order.
    from serving_opt.tune.calibrate import FitSetting, fit

    curve = LatencyCurve(ThreadSettings(), (1, 16, 64), (0.002, 0.010, 0.035),
                         cpu_s=(0.002, 0.010, 0.035),
                         concurrency=(ConcurrencyPoint(1, 2, 0.002),
                                      ConcurrencyPoint(16, 2, 0.010)))
    upstream = BatchingSettings(max_batch_size=1000, num_batch_threads=2)
    workload = Workload("closed", clients=16, max_requests=2000, warmup=0.0,
                        warmup_answers=52)
    in_order = ServiceModel(serial_s=0.002, cpu_s=0.002, cores=2)
    shuffled = replace(in_order, serial_out_of_order=0.6)
    figures = {}
    for name, truth in (("in order", in_order), ("shuffled", shuffled)):
        one = simulate(curve, upstream, Workload("closed", clients=1, max_requests=300), truth)
        many = simulate(curve, upstream, workload, truth)
        figures[name] = (many, fit(curve, 1, _measured(one, 1), _measured(many, 16),
                                   FitSetting(batching=upstream, cores=2)).service)

    many, fitted = figures["shuffled"]
    assert many.p99_ms > figures["in order"][0].p99_ms * 1.1
    assert fitted.serial_out_of_order > 0.2
    assert simulate(curve, upstream, workload, fitted).p99_ms == pytest.approx(many.p99_ms,
                                                                               rel=0.05)
    assert figures["in order"][1].serial_out_of_order == 0.0
