"""``serve --enable_batching`` merges concurrent session runs like TF Serving's BatchingSession.

A real server in-process over loopback gRPC (and REST) with a tiny TF1 model; every
batched answer must equal the same request's answer on a server without batching, or
numpy's on the same inputs. Nothing here waits for the batch timeout: the servers'
timeouts are a minute, so a batch runs only when it is full, when the next run does not
fit in it, or when its queue is closed, which the tests drive; a gate on the wrapped
session's run holds batch threads where a test needs them held. The counters
(``runs``: merged session runs, ``tasks``: queued runs) then have exact expected values.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import running  # noqa: E402
from polling import wait_until
from saved_model_io import save_tf1  # noqa: E402
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from serving_opt.model_server.batching import (  # noqa: E402
    BatchingOptions,
    BatchingSession,
    BatchScheduler,
)
from serving_opt.model_server.servable import Fetched  # noqa: E402
from serving_opt.model_server.status import ServingStatusError  # noqa: E402

WEIGHTS = np.array([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]], np.float32)
# Longer than any test: a batch never runs because its timeout passed.
NEVER = 60_000_000  # microseconds
DEADLINE = 60.0  # seconds a test waits for something that must happen


def build_linear(export_dir: str) -> str:
    """y = x @ W + 1 and a per-row sum, over x [None, 3]; a scalar-input signature; and
    ``ragged``: v [None, None] -> its row sums and 2 * v (variable-length rows)."""
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.add(tf.matmul(x, tf.constant(WEIGHTS)), 1.0, name="y")
        total = tf.reduce_sum(x, axis=1, name="total")
        s = v1.placeholder(tf.float32, [], name="s")
        doubled = tf.multiply(s, 2.0, name="doubled")
        v = v1.placeholder(tf.float32, [None, None], name="v")
        row_sum = tf.reduce_sum(v, axis=1, name="row_sum")
        scaled = tf.multiply(v, 2.0, name="scaled")
        return save_tf1(graph, export_dir, {
            "serving_default": sigs.predict_signature_def({"x": x}, {"y": y, "total": total}),
            "scalar": sigs.predict_signature_def({"s": s}, {"doubled": doubled}),
            "ragged": sigs.predict_signature_def(
                {"v": v}, {"row_sum": row_sum, "scaled": scaled}
            ),
        })


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("batching") / "linear"
    build_linear(str(root / "1"))
    return str(root)


def server_fixture(parameters: str | None):
    """A module fixture: a server of ``base`` with these batching parameters (None: no
    batching), stopped after the module."""

    @pytest.fixture(scope="module")
    def fixture(base, tmp_path_factory):
        options = dict(model_name="m", model_base_path=base, port=0, rest_api_port=-1,
                       max_num_load_retries=0, file_system_poll_wait_seconds=0,
                       startup_timeout_seconds=60)
        if parameters is not None:
            path = tmp_path_factory.mktemp("params") / "batching.config"
            path.write_text(parameters)
            options.update(enable_batching=True, batching_parameters_file=str(path))
        with running(**options) as server:
            yield server

    return fixture


plain = server_fixture(None)
# 16 rows a batch; a batch runs when full (the tests send exactly 16 rows at once).
batched = server_fixture(
    f"max_batch_size {{ value: 16 }} batch_timeout_micros {{ value: {NEVER} }} "
    "num_batch_threads { value: 2 } max_enqueued_batches { value: 100 }")
padded = server_fixture(
    f"max_batch_size {{ value: 8 }} batch_timeout_micros {{ value: {NEVER} }} "
    "allowed_batch_sizes: 4 allowed_batch_sizes: 8 num_batch_threads { value: 1 }")
# Three rows a batch: the two ragged requests of the test fill it.
variable = server_fixture(
    f"max_batch_size {{ value: 3 }} batch_timeout_micros {{ value: {NEVER} }} "
    "num_batch_threads { value: 1 } pad_variable_length_inputs: true")
# Two rows fill a batch, so each 2-row request is a batch of its own; two threads.
threaded = server_fixture(
    f"max_batch_size {{ value: 2 }} batch_timeout_micros {{ value: {NEVER} }} "
    "num_batch_threads { value: 2 } max_enqueued_batches { value: 10 }")
single = server_fixture(
    f"max_batch_size {{ value: 2 }} batch_timeout_micros {{ value: {NEVER} }} "
    "num_batch_threads { value: 1 } max_enqueued_batches { value: 10 }")


def batching_session(running) -> BatchingSession:
    with running.core.servable_handle(model_pb2.ModelSpec(name="m")) as handle:
        return handle.servable.batching


def wait_for(condition: Callable[[], bool], what: str) -> None:
    wait_until(condition, what, timeout=DEADLINE, interval=0.005)


class Gate:
    """Wraps a BatchingSession's session run (the real one, still called): records each
    merged run's feeds, counts the threads inside, and holds them while closed."""

    def __init__(self, session: BatchingSession, closed: bool = False) -> None:
        self.session = session
        self.direct = session._run_direct
        self.open = threading.Event()
        if not closed:
            self.open.set()
        self.feeds: list[dict] = []
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def _run(self, feeds, fetches, timeout_ms):
        with self._lock:
            self.feeds.append(feeds)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if not self.open.wait(DEADLINE):
                raise AssertionError("the gate was never opened")
            return self.direct(feeds, fetches, timeout_ms)
        finally:
            with self._lock:
                self.inside -= 1

    def rows(self, name: str) -> list[int]:
        return [f[name].shape[0] for f in self.feeds]


@contextlib.contextmanager
def gated(running, closed: bool = False) -> Iterator[Gate]:
    session = batching_session(running)
    gate = Gate(session, closed)
    session._run_direct = gate._run
    try:
        yield gate
    finally:
        gate.open.set()
        session._run_direct = gate.direct


def request(rows: int, seed: int, output_filter=(), signature: str = "") -> (
        predict_pb2.PredictRequest):
    x = np.random.default_rng(seed).normal(size=(rows, 3)).astype(np.float32)
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    req.model_spec.signature_name = signature
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    req.output_filter.extend(output_filter)
    return req


def ragged_request(v: np.ndarray) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    req.model_spec.signature_name = "ragged"
    req.inputs["v"].CopyFrom(tf.make_tensor_proto(v))
    return req


def predict(running, req, timeout: float = DEADLINE):
    with grpc.insecure_channel(running.address) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            req, timeout=timeout
        )


def concurrently(running, requests):
    barrier = threading.Barrier(len(requests))

    def call(req):
        barrier.wait()
        try:
            return predict(running, req)
        except grpc.RpcError as e:
            return e

    with futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(call, requests))


def in_background(running, req) -> futures.Future:
    """Sends ``req`` from another thread; the future holds the answer or the RpcError."""
    pool = futures.ThreadPoolExecutor(1)

    def call():
        try:
            return predict(running, req)
        except grpc.RpcError as e:
            return e

    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def assert_same(answer, expected):
    assert sorted(answer.outputs) == sorted(expected.outputs)
    for alias in expected.outputs:
        got, want = tf.make_ndarray(answer.outputs[alias]), tf.make_ndarray(
            expected.outputs[alias])
        assert got.shape == want.shape, alias
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert answer.model_spec == expected.model_spec


def test_concurrent_requests_share_one_session_run_and_get_their_own_rows(plain, batched):
    session = batching_session(batched)
    runs_before, tasks_before = session.runs, session.tasks
    sizes = [1, 3, 2, 5, 1, 2, 1, 1]  # 16 rows: the batch is full with the last one
    requests = [request(rows, seed) for seed, rows in enumerate(sizes)]
    with gated(batched) as gate:
        answers = concurrently(batched, requests)
    for req, answer in zip(requests, answers):
        assert not isinstance(answer, grpc.RpcError), answer
        assert_same(answer, predict(plain, req))
    assert session.tasks - tasks_before == len(requests)
    assert session.runs - runs_before == 1
    assert gate.rows("x:0") == [16]


def test_output_filter_subset_bypasses_the_batcher(plain, batched):
    session = batching_session(batched)
    runs_before, tasks_before = session.runs, session.tasks
    req = request(2, 7, output_filter=["y"])
    assert_same(predict(batched, req), predict(plain, req))
    assert (session.runs, session.tasks) == (runs_before, tasks_before)


def test_oversize_and_unbatchable_requests_get_upstreams_errors(batched):
    with pytest.raises(grpc.RpcError) as info:
        predict(batched, request(17, 0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "Task size 17 is larger than maximum input batch size 16"

    scalar = predict_pb2.PredictRequest()
    scalar.model_spec.name = "m"
    scalar.model_spec.signature_name = "scalar"
    scalar.inputs["s"].CopyFrom(tf.make_tensor_proto(np.float32(2.0)))
    with pytest.raises(grpc.RpcError) as info:
        predict(batched, scalar)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "Batching Run() input tensors must have at least one dimension"
    )


def test_allowed_batch_sizes_pad_the_merged_run_and_drop_the_padding(plain, padded):
    session = batching_session(padded)
    tasks = session.tasks
    with gated(padded) as gate:
        # One row alone; the 8-row request does not fit beside it, so the one row runs
        # now, padded to 4 (the smallest allowed size), and the 8 rows after it.
        one = in_background(padded, request(1, 30))
        wait_for(lambda: session.tasks == tasks + 1, "the 1-row request queued")
        full = predict(padded, request(8, 31))
        # 2 + 3 rows wait together (queued in that order); 8 more do not fit: the 5 run
        # padded to 8.
        pair = []
        for queued, (rows, seed) in enumerate([(2, 20), (3, 21)], start=3):
            pair.append(in_background(padded, request(rows, seed)))
            wait_for(lambda n=queued: session.tasks == tasks + n,
                     f"the {rows}-row request queued")
        last = predict(padded, request(8, 32))
        answers = [one.result(DEADLINE), full, *(f.result(DEADLINE) for f in pair), last]
    sent = [request(1, 30), request(8, 31), request(2, 20), request(3, 21), request(8, 32)]
    for req, answer in zip(sent, answers):
        assert not isinstance(answer, grpc.RpcError), answer
        assert_same(answer, predict(plain, req))  # the padding rows were dropped
    assert gate.rows("x:0") == [4, 8, 8, 8]
    # Upstream pads with copies of the first row of the last run in the batch.
    padding = gate.feeds[2]["x:0"][5:]
    x3 = tf.make_ndarray(request(3, 21).inputs["x"])
    np.testing.assert_array_equal(padding, np.repeat(x3[:1], 3, axis=0))


def test_pad_variable_length_inputs_pads_each_run_with_its_first_element(variable):
    session = batching_session(variable)
    runs = session.runs
    short = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)  # 2 rows of width 2
    wide = np.array([[5.0, 6.0, 7.0, 8.0]], np.float32)  # 1 row of width 4
    answers = concurrently(variable, [ragged_request(short), ragged_request(wide)])
    for answer in answers:
        assert not isinstance(answer, grpc.RpcError), answer
    assert session.runs - runs == 1  # one merged run of 3 rows
    # Upstream's AddPadding: each run's tensor grows to the widest, filled with its own
    # first element (1.0 here); the outputs keep the padded width.
    grown = np.array([[1.0, 2.0, 1.0, 1.0], [3.0, 4.0, 1.0, 1.0]], np.float32)
    got = {k: tf.make_ndarray(v) for k, v in answers[0].outputs.items()}
    np.testing.assert_array_equal(got["row_sum"], grown.sum(axis=1))
    np.testing.assert_array_equal(got["scaled"], grown * 2)
    got = {k: tf.make_ndarray(v) for k, v in answers[1].outputs.items()}
    np.testing.assert_array_equal(got["row_sum"], wide.sum(axis=1))
    np.testing.assert_array_equal(got["scaled"], wide * 2)


def test_variable_length_runs_without_padding_fail_every_run_of_the_batch(batched):
    session = batching_session(batched)
    runs = session.runs
    rng = np.random.default_rng(5)
    narrow = rng.normal(size=(10, 2)).astype(np.float32)
    wide = rng.normal(size=(6, 4)).astype(np.float32)  # 10 + 6 rows fill the batch
    answers = concurrently(batched, [ragged_request(narrow), ragged_request(wide)])
    for answer in answers:
        assert isinstance(answer, grpc.RpcError), answer
        assert answer.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert answer.details().startswith(
            "Tensors with name 'v:0' from different tasks have different shapes and padding "
            "is turned off.")
    assert session.runs == runs  # refused before any session run


def test_num_batch_threads_run_that_many_batches_at_once(plain, threaded):
    session = batching_session(threaded)
    runs, tasks = session.runs, session.tasks
    requests = [request(2, 50 + seed) for seed in range(3)]  # each fills a batch
    with gated(threaded, closed=True) as gate:
        pending = [in_background(threaded, req) for req in requests]
        # Both threads take a batch and are held; the third batch has no thread left.
        wait_for(lambda: gate.inside == 2, "two batches running at once")
        wait_for(lambda: session.tasks == tasks + 3, "the third request queued")
        assert gate.inside == 2 and len(gate.feeds) == 2
        gate.open.set()
        answers = [f.result(DEADLINE) for f in pending]
    for req, answer in zip(requests, answers):
        assert not isinstance(answer, grpc.RpcError), answer
        assert_same(answer, predict(plain, req))
    assert gate.most_inside == 2 and session.runs - runs == 3


def test_runs_that_timed_out_in_the_queue_fail_resource_exhausted(plain, single):
    session = batching_session(single)
    x = np.random.default_rng(60).normal(size=(2, 3)).astype(np.float32)
    with gated(single, closed=True) as gate:
        # The only batch thread is held by a first batch; a run with a 1 ms RunOptions
        # timeout fills the next batch and waits behind it.
        first = in_background(single, request(2, 61))
        wait_for(lambda: gate.inside == 1, "the first batch running")
        tasks = session.tasks
        with futures.ThreadPoolExecutor(1) as pool:
            late = pool.submit(session.run, {"x:0": x}, ["total:0", "y:0"], 1)
            wait_for(lambda: session.tasks == tasks + 1, "the timed run queued")
            time.sleep(0.05)  # its deadline (enqueued + 1 ms) is now behind us
            gate.open.set()
            with pytest.raises(ServingStatusError) as info:
                late.result(DEADLINE)
        answer = first.result(DEADLINE)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.message == "Run() timeout exceeded while waiting in batching queue"
    assert len(gate.feeds) == 1  # the timed-out batch never reached the session
    assert_same(answer, predict(plain, request(2, 61)))


def test_rest_predict_goes_through_the_batcher(plain, batched):
    session = batching_session(batched)
    runs_before, tasks_before = session.runs, session.tasks
    sizes = [2, 3, 5, 6]  # 16 rows: one full batch
    rows = [np.random.default_rng(40 + i).normal(size=(n, 3)).round(3).tolist()
            for i, n in enumerate(sizes)]
    barrier = threading.Barrier(len(rows))

    def call(instances):
        body = json.dumps({"instances": instances}).encode()
        url = f"http://127.0.0.1:{batched.rest_port}/v1/models/m:predict"
        barrier.wait()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=DEADLINE) as response:
            return json.loads(response.read())

    with futures.ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(call, rows))
    for instances, answer in zip(rows, answers):
        x = np.array(instances, np.float32)
        got = answer["predictions"]
        assert len(got) == len(instances)
        np.testing.assert_allclose([p["y"] for p in got], x @ WEIGHTS + 1, rtol=1e-5)
        np.testing.assert_allclose([p["total"] for p in got], x.sum(axis=1), rtol=1e-5)
    assert session.tasks - tasks_before == len(rows)
    assert session.runs - runs_before == 1


# ------------------------------------------------- the batcher alone (no TensorFlow runs)


class _Signature:
    def __init__(self, inputs, outputs):
        self.inputs = {n: type("Info", (), {"name": n})() for n in inputs}
        self.outputs = {n: type("Info", (), {"name": n})() for n in outputs}


def test_a_failed_merged_run_fails_every_request_and_a_full_queue_is_unavailable():
    scheduler = BatchScheduler(BatchingOptions(max_batch_size=4, batch_timeout_micros=200_000,
                                               max_enqueued_batches=1, num_batch_threads=1))
    release, entered = threading.Event(), threading.Event()

    def run_direct(feeds, fetches, timeout_ms):
        entered.set()
        release.wait(10)
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "boom")

    session = BatchingSession(scheduler, {"s": _Signature(["a"], ["b"])}, run_direct)
    try:
        feeds = {"a": np.zeros([2, 1], np.float32)}
        with futures.ThreadPoolExecutor(4) as pool:
            # Two runs fill a batch (4 rows) that blocks the only thread; two more fill
            # the next batch, which waits.
            first = [pool.submit(session.run, feeds, ["b"]) for _ in range(2)]
            assert entered.wait(10)
            second = [pool.submit(session.run, feeds, ["b"]) for _ in range(2)]
            wait_for(lambda: session.tasks == 4, "the second batch's two runs queued")
            # The waiting batch is full and is the only one allowed: the queue is full.
            with pytest.raises(ServingStatusError) as info:
                session.run(feeds, ["b"])
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
            assert info.value.message == (
                "The batch scheduling queue to which this task was submitted is full; "
                "currently 1 batches enqueued and max_enqueued_batches is 1"
            )
            release.set()
            for future in first + second:
                with pytest.raises(ServingStatusError, match="boom"):
                    future.result(10)
        assert session.runs == 2
        ok = BatchingSession(scheduler, {"s": _Signature(["a"], ["b"])},
                             lambda f, o, t: [Fetched(f["a"] * 2, 1)])
        assert ok.run(feeds, ["b"])[0].value.shape == (2, 1)
        ok.close()
    finally:
        session.close()
        scheduler.stop()
