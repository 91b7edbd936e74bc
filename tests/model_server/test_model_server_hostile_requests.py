"""The local model server under hostile requests: it answers an error, allocates nothing the
request did not carry, and keeps serving.

Each server is a real ``serving-opt serve`` subprocess (run in that process, as inside its
sandbox, so that its memory is the one measured) under an RLIMIT_DATA of a few GB
(so a bug that allocates a declared 12 GB tensor fails in the child instead of taking the
machine's memory), spoken to over real loopback gRPC and raw HTTP sockets. "Nothing was
allocated" is measured, not assumed: the child's VmHWM (peak resident memory) must not
grow by the declared size of a refused tensor.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import grpc  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import read_line, start_serve, stop_process  # noqa: E402
from saved_model_io import save_tf1  # noqa: E402
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from serving_opt import sandbox  # noqa: E402
from serving_opt.model_server import request_cost, tensors  # noqa: E402

# Far below the 12 GB the request declared, far above what the server needs
# (~0.4 GB of data segment for this model, plus up to 128 gRPC thread stacks).
DATA_LIMIT_BYTES = 4 * 2**30
SMALL_LIMIT = 16 * 2**20  # --max_request_bytes of the "small" server
QUARTER_GB = 256 * 2**20
MIB = 2**20
READY = re.compile(r"AVAILABLE on 127\.0\.0\.1:(\d+), REST on 127\.0\.0\.1:(\d+) ")


def build_model(export_dir: str) -> str:
    """``serving_default``: x float [None, 3] -> total (scalar sum); ``text``: s string
    [None] -> length (scalar sum of string lengths). Scalar outputs keep a wrongly
    accepted huge input from also producing a huge reply."""
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        total = tf.reduce_sum(x, name="total")
        s = v1.placeholder(tf.string, [None], name="s")
        length = tf.reduce_sum(tf.strings.length(s), name="length")
        return save_tf1(graph, export_dir, {
            "serving_default": sigs.predict_signature_def({"x": x}, {"total": total}),
            "text": sigs.predict_signature_def({"s": s}, {"length": length}),
        })


@dataclass
class Server:
    process: subprocess.Popen
    grpc_port: int
    rest_port: int
    stub: prediction_service_pb2_grpc.PredictionServiceStub

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most memory the server process has ever had resident."""
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/<pid>/status")

    def assert_still_serving(self) -> None:
        assert self.process.poll() is None, "the server process died"
        reply = self.stub.Predict(request([1, 3], [1.0, 2.0, 3.0]), timeout=60)
        assert reply.outputs["total"].float_val == [6.0]


@contextlib.contextmanager
def _serving(base: str, logs, name: str, *flags: str) -> Iterator[Server]:
    """A stand-in serving ``base`` with ``flags``, its stderr in ``<logs>/<name>.log``."""
    log_path = str(logs.mktemp("hostile_logs") / f"{name}.log")
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    process = start_serve("--port=0", "--rest_api_port=-1", "--model_name=m",
                          f"--model_base_path={base}", "--grpc_max_threads=8", *flags,
                          stderr=log, env={sandbox.INSIDE_ENV: "1"})
    # Set on the child right away (no preexec_fn in a threaded pytest); the server
    # allocates its first tensor long after this.
    resource.prlimit(process.pid, resource.RLIMIT_DATA, (DATA_LIMIT_BYTES, DATA_LIMIT_BYTES))
    line = read_line(process, 180)
    match = READY.search(line)
    if not match:
        process.kill()
        process.wait(timeout=30)
        log.close()
        with open(log_path) as f:
            pytest.fail(f"server did not start: {line!r}\n{f.read()[-3000:]}")
    channel = grpc.insecure_channel(f"127.0.0.1:{match.group(1)}")
    try:
        yield Server(process, int(match.group(1)), int(match.group(2)),
                     prediction_service_pb2_grpc.PredictionServiceStub(channel))
    finally:
        channel.close()
        stop_process(process)
        log.close()


@pytest.fixture(scope="module")
def model_base(tmp_path_factory) -> str:
    base = str(tmp_path_factory.mktemp("hostile_model"))
    build_model(os.path.join(base, "1"))
    return base


@pytest.fixture(scope="module")
def server(model_base, tmp_path_factory):
    """A server with default flags (request bound: the 2 GB gRPC message limit)."""
    with _serving(model_base, tmp_path_factory, "default") as running:
        yield running


@pytest.fixture(scope="module")
def small_server(model_base, tmp_path_factory):
    """A server with --max_request_bytes=16 MiB."""
    with _serving(model_base, tmp_path_factory, "small",
                  f"--max_request_bytes={SMALL_LIMIT}") as running:
        yield running


@pytest.fixture(scope="module")
def quarter_gb_server(model_base, tmp_path_factory):
    """A server with --max_request_bytes=256 MiB, the bound of the issue's 10M strings."""
    with _serving(model_base, tmp_path_factory, "quarter",
                  f"--max_request_bytes={QUARTER_GB}") as running:
        yield running


def request(dims, floats=(), content: bytes = b"") -> predict_pb2.PredictRequest:
    message = predict_pb2.PredictRequest()
    message.model_spec.name = "m"
    tensor = message.inputs["x"]
    tensor.dtype = types_pb2.DT_FLOAT
    for size in dims:
        tensor.tensor_shape.dim.add(size=size)
    tensor.float_val.extend(floats)
    tensor.tensor_content = content
    return message


def predict_error(server: Server, message) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        server.stub.Predict(message, timeout=60)
    return info.value


# ----------------------------------------------------------------------------- gRPC


def test_a_30_byte_request_declaring_12_gb_is_refused_before_any_allocation(server):
    hostile = request([1_000_000_000, 3])
    assert len(hostile.SerializeToString()) < 40
    peak_before = server.peak_rss_bytes()
    error = predict_error(server, hostile)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "tensor parsing error: x: shape [1000000000,3] of DT_FLOAT holds 12000000000 bytes "
        "once decoded; a request's inputs may hold at most 2147483647 bytes "
        "(--max_request_bytes)"
    )
    assert server.peak_rss_bytes() - peak_before < 64 * MIB
    server.assert_still_serving()


def test_a_declared_shape_over_max_request_bytes_allocates_nothing(small_server):
    # 96 MB once decoded: fits the child's memory limit, so a server that decoded it
    # would show it in its peak RSS; 6x the 16 MiB bound, so it must be refused first.
    peak_before = small_server.peak_rss_bytes()
    error = predict_error(small_server, request([8_000_000, 3]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "holds 96000000 bytes once decoded; a request's inputs may hold at most " \
        f"{SMALL_LIMIT} bytes (--max_request_bytes)" in error.details()
    assert small_server.peak_rss_bytes() - peak_before < 48 * MIB
    small_server.assert_still_serving()


def test_a_short_typed_field_under_the_bound_still_repeats_its_last_value(small_server):
    # Upstream's Tensor::FromProto semantics stay: the bound refuses sizes, not padding.
    reply = small_server.stub.Predict(request([4, 3], [1.0, 2.0]), timeout=60)
    assert reply.outputs["total"].float_val == [23.0]  # 1 + 2 + 10 * 2
    reply = small_server.stub.Predict(request([4, 3]), timeout=60)
    assert reply.outputs["total"].float_val == [0.0]  # no values: zeros


def test_a_repeated_string_counts_every_copy_against_the_bound(small_server):
    message = predict_pb2.PredictRequest()
    message.model_spec.name = "m"
    message.model_spec.signature_name = "text"
    tensor = message.inputs["s"]
    tensor.dtype = types_pb2.DT_STRING
    tensor.tensor_shape.dim.add(size=64)
    tensor.string_val.append(b"x" * MIB)  # 1 MiB sent, 64 MiB once padded
    peak_before = small_server.peak_rss_bytes()
    error = predict_error(small_server, message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(
        "tensor parsing error: s: shape [64] of DT_STRING holds "), error.details()
    held = int(error.details().split(" holds ")[1].split()[0])
    assert held >= 64 * (MIB + tensors.STRING_ELEMENT_BYTES)
    assert small_server.peak_rss_bytes() - peak_before < 32 * MIB
    small_server.assert_still_serving()


def strings_request(values: list[bytes]) -> predict_pb2.PredictRequest:
    message = predict_pb2.PredictRequest()
    message.model_spec.name = "m"
    message.model_spec.signature_name = "text"
    tensor = message.inputs["s"]
    tensor.dtype = types_pb2.DT_STRING
    tensor.tensor_shape.dim.add(size=len(values))
    tensor.string_val.extend(values)
    return message


def test_ten_million_empty_strings_are_refused_before_they_are_parsed(quarter_gb_server):
    hostile = strings_request([b""] * 10_000_000)
    wire = hostile.ByteSize()
    assert wire < 20 * MIB
    # Control: counted as tstrings alone (24 bytes each) they fit the bound, as the old
    # check counted them; parsed and decoded they took 1.2 GB.
    assert 10_000_000 * 24 < QUARTER_GB
    peak_before = quarter_gb_server.peak_rss_bytes()
    error = predict_error(quarter_gb_server, hostile)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"would hold more than {QUARTER_GB} bytes once parsed" in error.details()
    assert "--max_request_bytes" in error.details()
    # The message as received, in gRPC's buffers and copies: nothing parsed or decoded
    # (1.2 GB before).
    assert quarter_gb_server.peak_rss_bytes() - peak_before < 4 * wire + 16 * MIB
    quarter_gb_server.assert_still_serving()


def test_many_strings_under_the_bound_are_served_within_it_and_released(quarter_gb_server):
    count = 1_500_000
    message = strings_request([b"ab"] * count)
    assert request_cost.parse_cost(message.SerializeToString(), message.DESCRIPTOR,
                                   QUARTER_GB) <= QUARTER_GB
    rss_before = quarter_gb_server.rss_bytes()
    peak_before = quarter_gb_server.peak_rss_bytes()
    reply = quarter_gb_server.stub.Predict(message, timeout=300)
    assert reply.outputs["length"].int_val == [2 * count]
    growth = quarter_gb_server.peak_rss_bytes() - peak_before
    # Control: served, such a request really costs several times its tstrings' 24 bytes
    # an element (parsed form, object array, the session's copy) ...
    assert growth > count * 2 * 24
    # ... and stays within what the bound documents: parsed and decoded, each at most
    # --max_request_bytes, beside the message itself.
    assert growth < 3 * QUARTER_GB
    # Freed memory goes back to the system (glibc kept it pooled before).
    deadline = time.monotonic() + 60
    while quarter_gb_server.rss_bytes() - rss_before > growth // 2:
        assert time.monotonic() < deadline, (
            f"{(quarter_gb_server.rss_bytes() - rss_before) // MIB} MiB still held after "
            f"a request that grew the peak by {growth // MIB} MiB")
        time.sleep(0.2)
    quarter_gb_server.assert_still_serving()


@pytest.mark.parametrize(
    ("dims", "content", "message"),
    [
        ([1_000_000_000, 3], b"\0" * 12,
         "tensor parsing error: x: tensor_content is 12 bytes but shape [1000000000,3] of "
         "DT_FLOAT needs 12000000000"),
        ([2, 3], b"\0" * 25,
         "tensor parsing error: x: tensor_content is 25 bytes but shape [2,3] of DT_FLOAT "
         "needs 24"),
        ([-1, 3], b"",
         "tensor parsing error: x: shape [-1,3] has a negative dimension"),
        ([2**40, 2**40, 3], b"",
         "tensor parsing error: x: shape [1099511627776,1099511627776,3] has more than "
         "2**63 - 1 elements"),
        ([1] * 255, b"",
         "tensor parsing error: x: the shape has 255 dimensions; TensorFlow allows at most "
         "254"),
    ],
    ids=["content-too-short-for-12-gb", "content-too-long", "negative-dim", "overflow",
         "255-dims"],
)
def test_a_shape_that_does_not_match_its_content_is_invalid_argument(
    server, dims, content, message
):
    error = predict_error(server, request(dims, content=content))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == message
    server.assert_still_serving()


def test_a_request_over_max_request_bytes_is_refused_by_grpc(small_server):
    error = predict_error(small_server, request([5 * MIB, 1], content=b"\0" * (20 * MIB)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    small_server.assert_still_serving()


# ----------------------------------------------------------------------------- REST


def raw_http(port: int, data: bytes, timeout: float = 30) -> tuple[int, dict, bytes]:
    """Sends ``data`` as-is (headers we write ourselves) and reads one HTTP answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    headers = {"Content-Length": str(len(body))} if headers is None else headers
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in
                                                          headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


PREDICT = "/v1/models/m:predict"


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_rest_a_5000_digit_integer_is_a_400_not_a_500(server):
    body = b'{"inputs": {"x": [[1, 2, ' + b"9" * 5000 + b"]]}}"
    status, _, answer = raw_http(server.rest_port, post(PREDICT, body))
    assert status == 400, answer
    assert json.loads(answer) == {
        "error": "JSON Parse error: Number too big to be stored in double. at offset: 25"
    }
    status, _, answer = raw_http(server.rest_port, post(PREDICT, b'{"inputs": [[1e999, 0, 0]]}'))
    assert (status, json.loads(answer)["error"]) == (
        400, "JSON Parse error: Number too big to be stored in double. at offset: 13")


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"Content-Length": "abc"}, 400, "Content-Length: 'abc' is not a number of bytes"),
        ({"Content-Length": "-5"}, 400, "Content-Length: '-5' is not a number of bytes"),
        ({"Content-Length": "2", "content-length": "3"}, 400,
         "conflicting Content-Length headers: 2, 3"),
        ({"Content-Length": "9" * 5000}, 413,
         f"request body of {'9' * 5000} bytes is over the 2147483647-byte limit "
         "(--max_request_bytes)"),
        ({"Transfer-Encoding": "gzip"}, 501,
         "Transfer-Encoding: 'gzip' is not supported; send the body as is or chunked"),
    ],
    ids=["not-a-number", "negative", "conflicting", "5000-digits", "gzip"],
)
def test_rest_a_body_that_cannot_be_framed_is_answered_and_the_connection_closed(
    server, headers, status, message
):
    answered, reply_headers, answer = raw_http(server.rest_port, post(PREDICT, b"{}", headers))
    assert (answered, json.loads(answer)) == (status, {"error": message})
    assert reply_headers["connection"] == "close"
    server.assert_still_serving()


def test_rest_lists_nested_900_deep_are_a_400_not_a_500(server):
    body = b'{"inputs": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}"
    status, _, answer = raw_http(server.rest_port, post(PREDICT, body))
    assert (status, json.loads(answer)) == (400, {
        "error": "JSON lists nested more than 254 deep; a tensor has at most 254 dimensions"})


def test_rest_a_chunked_body_is_decoded(server):
    body = json.dumps({"inputs": {"x": [[1.5, 2.5, 3.0], [1.0, 1.0, 1.0]]}}).encode()
    status, _, answer = raw_http(server.rest_port, post(
        PREDICT, chunked(body, 7), {"Transfer-Encoding": "chunked"}))
    assert status == 200, answer
    assert json.loads(answer) == {"outputs": 10.0}


def test_rest_a_malformed_chunked_body_is_answered_400(server):
    status, headers, answer = raw_http(server.rest_port, post(
        PREDICT, b"zz\r\n{}\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"}))
    assert status == 400
    assert json.loads(answer) == {"error": "malformed chunked body: bad chunk size line 'zz'"}
    assert headers["connection"] == "close"


def test_rest_a_content_length_over_the_bound_is_413_before_reading(small_server):
    # No body follows: a server that waited for it (or allocated it) would time out.
    status, headers, answer = raw_http(small_server.rest_port, post(
        PREDICT, b"", {"Content-Length": str(SMALL_LIMIT + 1)}), timeout=20)
    assert status == 413
    assert json.loads(answer) == {
        "error": f"request body of {SMALL_LIMIT + 1} bytes is over the {SMALL_LIMIT}-byte "
                 "limit (--max_request_bytes)"
    }
    assert headers["connection"] == "close"
    small_server.assert_still_serving()


def test_rest_a_3_gb_content_length_allocates_nothing(server):
    peak_before = server.peak_rss_bytes()
    status, _, answer = raw_http(server.rest_port, post(
        PREDICT, b"", {"Content-Length": str(3 * 10**9)}), timeout=20)
    assert status == 413, answer
    assert server.peak_rss_bytes() - peak_before < 64 * MIB
    server.assert_still_serving()


def test_rest_a_chunked_body_over_the_bound_is_413(small_server):
    piece = b"%x\r\n" % MIB + b" " * MIB + b"\r\n"
    status, _, answer = raw_http(small_server.rest_port, post(
        PREDICT, piece * 17 + b"0\r\n\r\n", {"Transfer-Encoding": "chunked"}))
    assert status == 413
    assert "over the 16777216-byte limit (--max_request_bytes)" in json.loads(answer)["error"]
    small_server.assert_still_serving()


def test_rest_strings_are_charged_their_decoded_cost(small_server):
    text = "/v1/models/m:predict"

    def strings(count: int) -> bytes:
        return ('{"signature_name": "text", "inputs": [' + ",".join(['"a"'] * count)
                + "]}").encode()

    # 300k strings, 1.2 MB of body (13 times under the bound), 48 MB once decoded.
    hostile = strings(300_000)
    assert len(hostile) < SMALL_LIMIT // 13
    peak_before = small_server.peak_rss_bytes()
    status, _, answer = raw_http(small_server.rest_port, post(text, hostile))
    assert status == 400, answer
    assert f"over the {SMALL_LIMIT}-byte limit (--max_request_bytes)" in \
        json.loads(answer)["error"]
    assert small_server.peak_rss_bytes() - peak_before < 16 * MIB
    # Control: a tenth of them is served, and counted.
    status, _, answer = raw_http(small_server.rest_port, post(text, strings(30_000)))
    assert status == 200, answer
    assert json.loads(answer) == {"outputs": 30_000}
    small_server.assert_still_serving()


def test_examples_are_charged_their_serialized_batch_before_it_is_built():
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import input_pb2

    from serving_opt.model_server.example_input import serialized_examples
    from serving_opt.model_server.status import ServingStatusError

    context = example_pb2.Example()
    context.features.feature["shared"].bytes_list.value.append(b"c" * 1000)
    batch = input_pb2.Input()
    batch.example_list_with_context.context.CopyFrom(context)
    batch.example_list_with_context.examples.extend([example_pb2.Example()] * 10_000)
    # 10k empty examples, 20 KB sent: each one a copy of the 1 KB context once batched.
    assert batch.ByteSize() < 32 * 1024
    with pytest.raises(ServingStatusError) as refused:
        serialized_examples(batch, max_bytes=MIB)
    assert "10000 examples would hold about" in refused.value.message
    assert "(--max_request_bytes)" in refused.value.message
    # Control: unbounded, the batch really is that large.
    built = serialized_examples(batch, max_bytes=2**31 - 1)
    assert sum(len(e) for e in built) > 10_000_000
