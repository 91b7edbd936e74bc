"""The load generator against a real server: answers counted, rejections counted as the
batcher's, open-loop arrivals exactly the seeded Poisson sequence.

A local server with ``--enable_batching`` (one batch thread, batches of one request,
one batch allowed to wait) runs in-process on loopback; the generator is its own
process, as in a tuning run. Nothing here depends on how fast this machine is: counts
of what was sent and how it was answered, not times (where a load point needs an event
to happen, it is retried; where rates are compared, the bound is generous).
"""

from __future__ import annotations

import numpy as np
import pytest
import repo_paths

from serving_opt.model_server import ServerOptions, serve
from serving_opt.tune import load, payloads
from serving_opt.tune.settings import BatchingSettings


def _batching_server(convnet_base: str, directory, settings: BatchingSettings):
    """The local server in-process on loopback, batching by ``settings``."""
    parameters = directory / "batching_parameters.txt"
    parameters.write_text(settings.text_proto())
    return serve(ServerOptions(model_name="convnet", model_base_path=convnet_base, port=0,
                               rest_api_port=-1, enable_batching=True,
                               batching_parameters_file=str(parameters),
                               startup_timeout_seconds=120))


@pytest.fixture(scope="module")
def server(convnet_base, tmp_path_factory):
    running = _batching_server(convnet_base, tmp_path_factory.mktemp("batching"),
                               BatchingSettings(max_batch_size=1, batch_timeout_micros=0,
                                                max_enqueued_batches=1, num_batch_threads=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def targets(server, convnet_dir):
    built = payloads.build(convnet_dir, "convnet", 1, "serving_default", 1)
    return payloads.targets(server.address, server.rest_address, "convnet", 1, built, 1)


def test_a_full_batch_queue_is_counted_as_rejected(targets):
    # Sixteen clients against one running batch and one waiting: the rest get UNAVAILABLE
    # from the batcher, and the client keeps them apart from answers. A rejection needs
    # three requests at the server at once, which a starved machine may not give in one
    # short point: up to three points, each checked, one must see it.
    with load.Generator() as generator:
        for attempt in range(3):
            result = generator.run(targets["grpc"], load.Load(
                "closed", clients=16, duration=1.0 + attempt, warmup=0.2))
            assert result.ok > 0
            assert result.errors.get("UNAVAILABLE", 0) == result.rejected
            assert set(result.errors) <= {"UNAVAILABLE"}, result.first_error
            assert result.requests == result.ok + sum(result.errors.values())
            if result.rejected:
                break
    assert result.rejected > 0
    assert "queue" in result.first_error


def test_rest_answers_and_rejections_are_counted(targets):
    result = load.run(targets["rest"], load.Load("closed", clients=8, duration=1.0,
                                                 warmup=0.2))
    assert result.ok > 0
    assert result.requests == result.ok + sum(result.errors.values())
    assert set(result.errors) <= {"HTTP 503"}
    assert result.rejected == result.errors.get("HTTP 503", 0)


def test_open_loop_sends_the_seeded_poisson_arrivals(targets):
    rate, warmup, duration, seed = 30.0, 0.5, 1.5, 7
    result = load.run(targets["grpc"], load.Load("open", rate=rate, duration=duration,
                                                 warmup=warmup, seed=seed))
    rng = np.random.default_rng(seed)
    at, expected = 0.0, 0
    while True:
        at += rng.exponential(1 / rate)
        if at >= warmup + duration:
            break
        expected += at >= warmup
    assert result.requests + result.shed == expected
    assert result.ok + sum(result.errors.values()) == result.requests


def test_the_generator_reports_its_own_processor_time_per_request(targets):
    # The report's load-generator warning (over 10% of the cores) is made from this: its
    # CPU time over every request it got an answer to, warmup included (more answers
    # than the measured window's).
    result = load.run(targets["grpc"], load.Load("closed", clients=2, duration=1.0,
                                                 warmup=0.3))
    answered = result.client_cpu_seconds / result.client_cpu_per_request
    assert result.client_cpu_per_request > 0
    assert answered >= result.ok + sum(result.errors.values())


@pytest.fixture(scope="module")
def timer_bound_server(convnet_base, tmp_path_factory):
    # Batches that never fill (8 clients, room for 64) run when their 50 ms timeout
    # expires: the server's rate is set by that timer, not by how fast this machine is,
    # so two generators measured one after the other agree however loaded it is.
    running = _batching_server(convnet_base, tmp_path_factory.mktemp("timer"),
                               BatchingSettings(max_batch_size=64, batch_timeout_micros=50_000,
                                                max_enqueued_batches=100, num_batch_threads=1))
    yield running
    running.stop()


@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_the_generator_measures_what_an_independent_one_measures(timer_bound_server,
                                                                convnet_dir, protocol):
    # benchmarks/independent_load.py: plain threads sending pre-built bytes (gRPC) or
    # http.client bodies (REST), written apart from serving_opt.tune.load. Rounds
    # alternate so that drift costs both alike. The bound is generous: the timer sets
    # both rates, and a load point that stalls on the client's own doing (Nagle's
    # algorithm against a delayed ACK costs 40 ms a request, almost the timer's 50)
    # still falls far outside it.
    import os
    import statistics
    import sys

    sys.path.insert(0, os.path.join(repo_paths.REPO, "benchmarks"))
    import independent_load

    built = payloads.build(convnet_dir, "convnet", 1, "serving_default", 1)
    target = payloads.targets(timer_bound_server.address, timer_bound_server.rest_address,
                              "convnet", 1, built, 1)[protocol]
    address = timer_bound_server.address if protocol == "grpc" else \
        timer_bound_server.rest_address
    port = int(address.rsplit(":", 1)[1])
    ours, theirs = [], []
    with load.Generator() as generator:
        for _ in range(3):
            result = generator.run(target, load.Load("closed", clients=8, duration=3.0,
                                                     warmup=0.5))
            assert result.ok == result.requests > 0
            ours.append(result.rows_per_second)
            if protocol == "grpc":
                figures = independent_load.closed_loop(port, list(target.payloads),
                                                       clients=8, seconds=3.0, warmup=0.5)
            else:
                figures = independent_load.rest_closed_loop(
                    port, target.path, list(target.payloads), clients=8, seconds=3.0,
                    warmup=0.5)
            assert figures["errors"] == 0
            theirs.append(figures["requests_per_second"])
    ratio = statistics.median(ours) / statistics.median(theirs)
    assert 0.75 <= ratio <= 1.33, (ours, theirs)
