"""``serve --enable_batching`` merges concurrent session runs like TF Serving's BatchingSession.

A real server in-process over loopback gRPC (and REST) with a tiny TF1 model; every
batched answer must equal the same request's answer on a server without batching, and
the batcher's ``runs`` counter shows that requests shared session runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import threading  # noqa: E402
import urllib.request  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from serving_opt.serving.model_server import ServerOptions, serve  # noqa: E402
from serving_opt.serving.model_server.batching import (  # noqa: E402
    BatchingOptions,
    BatchingSession,
    BatchScheduler,
)
from serving_opt.serving.model_server.servable import Fetched  # noqa: E402
from serving_opt.serving.model_server.status import ServingStatusError  # noqa: E402

WEIGHTS = np.array([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]], np.float32)


def build_linear(export_dir: str) -> str:
    """y = x @ W + 1 and a per-row sum, over x [None, 3]; a scalar-input signature too."""
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.add(tf.matmul(x, tf.constant(WEIGHTS)), 1.0, name="y")
        total = tf.reduce_sum(x, axis=1, name="total")
        s = v1.placeholder(tf.float32, [], name="s")
        doubled = tf.multiply(s, 2.0, name="doubled")
        with v1.Session(graph=graph) as sess:
            builder = v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess,
                ["serve"],
                signature_def_map={
                    "serving_default": sigs.predict_signature_def(
                        {"x": x}, {"y": y, "total": total}
                    ),
                    "scalar": sigs.predict_signature_def({"s": s}, {"doubled": doubled}),
                },
            )
            builder.save()
    return export_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("batching") / "linear"
    build_linear(str(root / "1"))
    return str(root)


def start(base: str, tmp_path_factory, parameters: str | None):
    options = dict(model_name="m", model_base_path=base, port=0, rest_api_port=-1,
                   max_num_load_retries=0, file_system_poll_wait_seconds=0,
                   startup_timeout_seconds=60)
    if parameters is not None:
        path = tmp_path_factory.mktemp("params") / "batching.config"
        path.write_text(parameters)
        options.update(enable_batching=True, batching_parameters_file=str(path))
    return serve(ServerOptions(**options))


@pytest.fixture(scope="module")
def plain(base, tmp_path_factory):
    running = start(base, tmp_path_factory, None)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def batched(base, tmp_path_factory):
    # A long timeout so concurrent requests surely meet in one batch; 16 rows max.
    running = start(base, tmp_path_factory,
                    "max_batch_size { value: 16 } batch_timeout_micros { value: 300000 } "
                    "num_batch_threads { value: 2 } max_enqueued_batches { value: 100 }")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def padded(base, tmp_path_factory):
    running = start(base, tmp_path_factory,
                    "max_batch_size { value: 8 } batch_timeout_micros { value: 300000 } "
                    "allowed_batch_sizes: 4 allowed_batch_sizes: 8 "
                    "num_batch_threads { value: 1 }")
    yield running
    running.stop()


def batching_session(running) -> BatchingSession:
    with running.core.servable_handle(model_pb2.ModelSpec(name="m")) as handle:
        return handle.servable.batching


def request(rows: int, seed: int, output_filter=(), signature: str = "") -> (
        predict_pb2.PredictRequest):
    x = np.random.default_rng(seed).normal(size=(rows, 3)).astype(np.float32)
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    req.model_spec.signature_name = signature
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    req.output_filter.extend(output_filter)
    return req


def predict(running, req, timeout: float = 60):
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


def assert_same(answer, expected):
    assert sorted(answer.outputs) == sorted(expected.outputs)
    for alias in expected.outputs:
        got, want = tf.make_ndarray(answer.outputs[alias]), tf.make_ndarray(
            expected.outputs[alias])
        assert got.shape == want.shape, alias
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert answer.model_spec == expected.model_spec


def test_concurrent_requests_share_session_runs_and_get_their_own_rows(plain, batched):
    session = batching_session(batched)
    runs_before, tasks_before = session.runs, session.tasks
    requests = [request(rows, seed) for seed, rows in enumerate([1, 3, 2, 5, 1, 4, 2, 1])]
    answers = concurrently(batched, requests)
    for req, answer in zip(requests, answers):
        assert not isinstance(answer, grpc.RpcError), answer
        assert_same(answer, predict(plain, req))
    assert session.tasks - tasks_before == len(requests)
    # 19 rows, at most 16 per run: two runs at the very least, far fewer than 8.
    assert 2 <= session.runs - runs_before < len(requests)


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
    seen = []
    direct = session._run_direct

    def spy(feeds, fetches, timeout_ms):
        seen.append(feeds["x:0"].shape[0])
        return direct(feeds, fetches, timeout_ms)

    session._run_direct = spy
    try:
        requests = [request(rows, 20 + seed) for seed, rows in enumerate([2, 3])]
        answers = concurrently(padded, requests)
        for req, answer in zip(requests, answers):
            assert not isinstance(answer, grpc.RpcError), answer
            assert_same(answer, predict(plain, req))
        assert_same(predict(padded, request(1, 30)), predict(plain, request(1, 30)))
    finally:
        session._run_direct = direct
    # 2 + 3 rows run as 8 (next allowed size), 1 row as 4.
    assert seen == [8, 4]


def test_rest_predict_goes_through_the_batcher(plain, batched):
    session = batching_session(batched)
    runs_before, tasks_before = session.runs, session.tasks
    rows = [np.random.default_rng(40 + i).normal(size=(i + 1, 3)).round(3).tolist()
            for i in range(4)]
    barrier = threading.Barrier(len(rows))

    def call(instances):
        body = json.dumps({"instances": instances}).encode()
        url = f"http://127.0.0.1:{batched.rest_port}/v1/models/m:predict"
        barrier.wait()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
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
    assert session.runs - runs_before < len(rows)


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
            while session.tasks < 4:
                threading.Event().wait(0.01)
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
