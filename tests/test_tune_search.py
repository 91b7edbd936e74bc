"""The search's logic on synthetic latency curves: what it picks follows from the model.

No TensorFlow and no timing: the curves are made up, the scheduler model runs in
simulated time, and the assertions are about which settings win and why.
"""

from __future__ import annotations

import math

import pytest

from serving_opt.tune.curve import ConcurrencyPoint, LatencyCurve
from serving_opt.tune.profile import ModelProfile
from serving_opt.tune.scheduler import ServiceModel, Workload, simulate
from serving_opt.tune.search import Objective, evaluate, front, grid, search
from serving_opt.tune.settings import BatchingSettings, ServingSettings, ThreadSettings

SIZES = (1, 2, 4, 8, 16, 32, 64)
# Shorter simulations than a real run's: these tests compare settings, not decimals.
FAST = {"screen_requests": 300, "final_requests": 1500}


def curve(ms_by_size: dict[int, float], concurrency=()) -> LatencyCurve:
    sizes = tuple(sorted(ms_by_size))
    return LatencyCurve(ThreadSettings(), sizes, tuple(ms_by_size[n] / 1000 for n in sizes),
                        concurrency=tuple(concurrency))


def profile_of(*curves: LatencyCurve) -> ModelProfile:
    return ModelProfile("serving_default", tuple(curves))


def serialized(ms_by_size: dict[int, float]) -> LatencyCurve:
    """Overlapping runs share one core's worth of work: k runs take k times as long."""
    points = [ConcurrencyPoint(n, k, ms_by_size[n] * k / 1000)
              for n in (1, 16) for k in (2, 4, 16)]
    return curve(ms_by_size, points)


def batch_size(result) -> int:
    b = result.best.settings.batching
    return 0 if b is None else b.max_batch_size


def test_flat_latency_gets_a_larger_max_batch_size_than_linear_latency():
    # A batch of 64 costs what a batch of 1 costs: batch as much as the clients give.
    # Latency linear in rows: batching buys nothing, so the search keeps it small.
    objective = Objective(slo_p99_ms=2000, clients=24)
    flat = search(profile_of(serialized({n: 10.0 for n in SIZES})), objective, ServiceModel(),
                  cpus=1, **FAST)
    lin = search(profile_of(serialized({n: 1.0 * n for n in SIZES})), objective,
                 ServiceModel(), cpus=1, **FAST)
    assert batch_size(flat) >= 16
    assert batch_size(flat) > batch_size(lin)
    assert flat.best.primary().rows_per_second > 2 * lin.best.primary().rows_per_second


def mobilenet_like() -> LatencyCurve:
    # Batch 1 at 6 ms, 16 at 30 ms, 32 at 45 ms; sixteen single-row runs at once take
    # 36 ms each (2 cores shared by 16 sessions).
    ms = {1: 6.0, 2: 8.0, 4: 12.0, 8: 19.0, 16: 30.0, 32: 45.0, 64: 85.0}
    return curve(ms, [ConcurrencyPoint(1, 2, 0.008), ConcurrencyPoint(1, 4, 0.013),
                      ConcurrencyPoint(1, 16, 0.036), ConcurrencyPoint(16, 2, 0.055),
                      ConcurrencyPoint(64, 2, 0.16)])


def test_a_long_timeout_with_fewer_clients_than_the_batch_is_worse_than_no_batching():
    # The measurement: max_batch_size 32 and a 20 ms timeout with 16 clients:
    # every batch waits out its timeout for clients that do not exist.
    model = profile_of(mobilenet_like())
    objective = Objective(slo_p99_ms=250, clients=16)
    hand_picked = evaluate(model, ServingSettings(BatchingSettings(32, 20_000, 10, 1)),
                           objective, ServiceModel())
    no_batching = evaluate(model, ServingSettings(None), objective, ServiceModel())
    assert (hand_picked.primary().rows_per_second
            < no_batching.primary().rows_per_second)
    assert hand_picked.primary().mean_batch_rows == pytest.approx(16, abs=0.5)
    result = search(model, objective, ServiceModel(), cpus=2, **FAST)
    best = result.best.primary().rows_per_second
    assert best > no_batching.primary().rows_per_second
    assert best > hand_picked.primary().rows_per_second
    assert best >= result.upstream.primary().rows_per_second
    # The winner never waits longer than a batch's own run for clients it cannot have.
    chosen = result.best.settings.batching
    assert chosen is not None and chosen.max_batch_size <= 16


def test_the_slo_excludes_settings_whose_p99_is_over_it():
    model = profile_of(mobilenet_like())
    loose = search(model, Objective(slo_p99_ms=1000, clients=64), ServiceModel(), cpus=1,
                   **FAST)
    tight = search(model, Objective(slo_p99_ms=150, clients=64), ServiceModel(), cpus=1,
                   **FAST)
    assert loose.best is not None
    assert loose.best.primary().p99_ms <= 1000
    if tight.best is not None:
        assert tight.best.primary().p99_ms <= 150
        assert tight.best.primary().rows_per_second <= loose.best.primary().rows_per_second
    else:
        assert all(c.primary().p99_ms > 150 for c in tight.front)


def test_the_front_is_not_dominated():
    model = profile_of(mobilenet_like())
    result = search(model, Objective(slo_p99_ms=500, clients=16), ServiceModel(), cpus=2,
                    **FAST)
    points = [(c.primary().rows_per_second, c.primary().p99_ms) for c in result.front]
    assert points == sorted(points, key=lambda p: -p[0])
    for i, (rows, p99) in enumerate(points):
        for other_rows, other_p99 in points[:i] + points[i + 1:]:
            assert not (other_rows >= rows and other_p99 < p99)
    assert len(front(list(result.front))) == len(result.front)


def test_every_setting_tried_is_one_tf_serving_accepts():
    objective = Objective(slo_p99_ms=250, clients=12, rate=300, rows_per_request=2,
                          padding="pow2")
    settings = grid(mobilenet_like(), objective, largest=64, cpus=8)
    assert settings
    for batching in settings:
        assert batching.problems() == []
        assert batching.max_batch_size % 2 == 0  # whole requests of two rows
        assert batching.allowed_batch_sizes[-1] == batching.max_batch_size
    assert {b.num_batch_threads for b in settings} == {1, 2, 4, 8}


def test_open_loop_picks_a_setting_that_keeps_up_and_reports_its_capacity():
    model = profile_of(mobilenet_like())
    objective = Objective(slo_p99_ms=250, rate=400.0)
    result = search(model, objective, ServiceModel(), cpus=2, **FAST)
    # 400 requests/s is beyond one-at-a-time runs (<= 16 / 36 ms = 444/s barely) but easy
    # in batches.
    assert result.best is not None and result.best.settings.batching is not None
    p = result.best.predictions["open"]
    assert not p.overloaded and p.p99_ms <= 250 and p.reject_fraction <= 0.001
    assert result.open_capacity >= 400
    overload = simulate(mobilenet_like(), None, Workload("open", rate=900.0, max_requests=2000))
    assert overload.overloaded or not math.isfinite(overload.p99_ms) or overload.p99_ms > 250


def test_padding_is_costed_and_only_used_when_asked():
    model = profile_of(serialized({n: 2.0 + 1.0 * n for n in SIZES}))
    plain = search(model, Objective(slo_p99_ms=500, clients=12), ServiceModel(), cpus=1,
                   **FAST)
    padded = search(model, Objective(slo_p99_ms=500, clients=12, padding="pow2"),
                    ServiceModel(), cpus=1, **FAST)
    assert plain.best.settings.batching.allowed_batch_sizes == ()
    assert "allowed_batch_sizes" in plain.padding_cost
    sizes = padded.best.settings.batching.allowed_batch_sizes
    assert sizes and sizes[-1] == padded.best.settings.batching.max_batch_size
    assert padded.padding_cost.startswith("padding to")


def test_each_thread_setting_is_predicted_with_its_own_server_cost():
    # Two thread settings whose session runs measured alike. In the server one of them
    # was fitted a large cost spent one request at a time (TensorFlow's default intra-op
    # pool fighting the request threads), the other none: the search must judge each by
    # its own fit, not cap both with the first one's.
    alike = serialized({n: 2.0 + 0.5 * n for n in SIZES})
    one_thread = ThreadSettings(intra_op=1)
    profile = profile_of(alike, LatencyCurve(one_thread, alike.batch_sizes, alike.median_s,
                                             concurrency=alike.concurrency))
    objective = Objective(slo_p99_ms=2000, clients=16)
    services = {ThreadSettings(): ServiceModel(serial_s=0.004),
                one_thread: ServiceModel()}
    result = search(profile, objective, services, cpus=2, **FAST)
    assert result.best.settings.threads == one_thread
    capped = evaluate(profile, ServingSettings(None, ThreadSettings()), objective, services)
    free = evaluate(profile, ServingSettings(None, one_thread), objective, services)
    assert capped.primary().rows_per_second < 1 / 0.004 * 1.05  # the serial part caps it
    assert free.primary().rows_per_second > 1.5 * capped.primary().rows_per_second
    # One model for every setting, as before, predicts the two alike.
    same = [evaluate(profile, ServingSettings(None, t), objective, ServiceModel(serial_s=0.004))
            for t in (ThreadSettings(), one_thread)]
    assert same[0].primary().rows_per_second == pytest.approx(
        same[1].primary().rows_per_second, rel=0.05)
