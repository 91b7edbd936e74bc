"""The grid tune proves is read off the measured session curve: the knee for
``max_batch_size``, timeouts {0, 1 ms, L/2}, batch threads {1, cores}; every setting is one
TF Serving accepts. In-process, on synthetic curves: no model runs.
"""

from __future__ import annotations

import pytest

from serving_opt.model_server.batching import parse_batching_parameters
from serving_opt.tune import grid, tuner
from serving_opt.tune.options import SearchOptions, TuneOptions, WorkloadOptions
from serving_opt.tune.profile import LatencyCurve, ModelProfile
from serving_opt.tune.settings import ThreadSettings

SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT = ThreadSettings()


def curve(ms_per_size, threads=DEFAULT, sizes=SIZES) -> LatencyCurve:
    return LatencyCurve(threads, sizes, tuple(ms_per_size(n) / 1000 for n in sizes))


def test_the_knee_is_where_a_larger_batch_stops_paying_per_row():
    # A fixed 10 ms per run plus 0.1 ms per row: per row, batching pays until ~64.
    amortized = curve(lambda n: 10 + 0.1 * n)
    # Linear: each row costs the same at any batch size; batching buys nothing.
    linear = curve(lambda n: 2.0 * n)
    # Pays up to 8, then flat per row (a saturated machine).
    saturating = curve(lambda n: 10 + 0.1 * n if n <= 8 else (10.8 / 8) * n)
    objective = grid.Objective(slo_p99_ms=1000, clients=64)
    assert grid.knee(amortized, objective) == 64
    assert grid.knee(linear, objective) == 1
    assert grid.knee(saturating, objective) == 8


def test_the_knee_is_bounded_by_the_slo_and_by_what_the_load_can_fill():
    amortized = curve(lambda n: 10 + 0.1 * n)
    # A run of 32 takes 13.2 ms, of 64 16.4 ms: with a 30 ms SLO a batch may take 15 ms.
    assert grid.knee(amortized, grid.Objective(slo_p99_ms=30, clients=64)) == 32
    # 4 closed-loop clients never have more than 4 requests in the server.
    assert grid.knee(amortized, grid.Objective(slo_p99_ms=1000, clients=4)) == 4
    # An open loop can fill any batch: the curve and the SLO bound it.
    assert grid.knee(amortized, grid.Objective(slo_p99_ms=1000, clients=4, rate=500)) == 64
    # Rows per request: a batch holds whole requests, so only multiples of them count.
    three = curve(lambda n: 10 + 0.1 * n, sizes=(3, 4, 6, 12, 24))
    assert grid.knee(three, grid.Objective(slo_p99_ms=1000, clients=8,
                                           rows_per_request=3)) == 24


def test_timeouts_are_zero_one_millisecond_and_half_a_requests_run_under_half_the_slo():
    c = curve(lambda n: 6 + 0.5 * n)  # one request's batch: 6.5 ms, half: 3.3 ms
    objective = grid.Objective(slo_p99_ms=250, clients=16)
    assert grid.timeouts(c, objective, 16) == (0, 1000, 3200)
    # A batch of one request is full at once.
    assert grid.timeouts(c, objective, 1) == (0,)
    # Half the SLO is 2.5 ms: L/2 waits longer, so it is not tried.
    assert grid.timeouts(c, grid.Objective(slo_p99_ms=5, clients=16), 16) == (0, 1000)


def test_the_grid_is_small_and_every_setting_is_one_tf_serving_accepts():
    model = ModelProfile("serving_default", (
        curve(lambda n: 10 + 0.1 * n),
        curve(lambda n: 20 + 0.2 * n, ThreadSettings(1, 0))))
    for objective in (grid.Objective(250, clients=16),
                      grid.Objective(250, clients=16, padding="pow2"),
                      grid.Objective(250, rate=300, padding="2,8"),
                      grid.Objective(250, clients=5, rows_per_request=2)):
        settings, notes = grid.candidates(
            ModelProfile("s", tuple(LatencyCurve(c.threads, (2, 4, 8, 10, 16, 32),
                                                 (0.01, 0.011, 0.012, 0.013, 0.014, 0.02))
                                    for c in model.curves))
            if objective.rows_per_request == 2 else model, objective, cpus=4)
        assert len(notes) == 2 and all("knee at batch" in n for n in notes)
        batching = [s.batching for s in settings if s.batching is not None]
        # 2 thread settings x 3 timeouts x batch threads {1, cores}, and no batching at
        # the non-default threads (the default's is TF Serving's default, proven anyway).
        assert len(batching) == 12 and len(settings) == 13
        assert {b.num_batch_threads for b in batching} == {1, 4}
        assert [s.threads for s in settings if s.batching is None] == [ThreadSettings(1, 0)]
        for b in batching:
            assert b.problems() == []
            values = parse_batching_parameters(b.text_proto())  # TF Serving's checks
            assert values["max_batch_size"] == b.max_batch_size
            assert b.max_batch_size % objective.rows_per_request == 0
            if objective.clients and not objective.rate:
                # Every client's request fits in the queue: nothing is rejected.
                assert b.max_enqueued_batches * b.max_batch_size >= (
                    objective.clients * objective.rows_per_request)
            if objective.padding != "none":
                assert b.allowed_batch_sizes[-1] == b.max_batch_size
            else:
                assert b.allowed_batch_sizes == ()


@pytest.mark.parametrize("options, sizes", [
    (TuneOptions(workload=WorkloadOptions(clients=16)), (1, 2, 4, 8, 16, 32)),
    (TuneOptions(workload=WorkloadOptions(clients=6, rows_per_request=3)),
     (3, 6, 9, 12, 18, 24, 36)),
    (TuneOptions(workload=WorkloadOptions(clients=4),
                 search=SearchOptions(max_batch_size_bound=4)), (1, 2, 4)),
])
def test_the_profile_measures_one_requests_batch_and_the_clients_rows(options, sizes):
    plan = tuner.plan(options, 2)
    assert plan.batch_sizes == sizes
    r = options.workload.rows_per_request
    # The grid needs L (one request's batch) and the closed loop's fill.
    assert r in plan.batch_sizes
    clients = options.workload.clients
    assert clients * r in plan.batch_sizes or clients * r > max(sizes)
