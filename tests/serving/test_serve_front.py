"""The host side of the sandboxed ``serve``, in process: the model name read from a
request's wire bytes (against protobuf's own parse), and the REST front end's accept loop
and connection limit (against a stand-in sandbox on a unix socket)."""

from __future__ import annotations

import errno
import socket
import threading
from concurrent import futures

import pytest

from serving_opt.serving.front import rest_front, wire


def _spec(message, name: str, version: int | None = None):
    message.model_spec.name = name
    if version is not None:
        message.model_spec.version.value = version
    return message


def test_the_model_name_is_read_from_every_routed_request():
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        predict_pb2,
        regression_pb2,
    )

    predict = _spec(predict_pb2.PredictRequest(), "a", 3)
    predict.inputs["x"].string_val.append(b"\x0a\x03\x0a\x01b" * 50)  # looks like a spec
    predict.output_filter.append("y")
    for message in (predict, _spec(classification_pb2.ClassificationRequest(), "a"),
                    _spec(regression_pb2.RegressionRequest(), "a"),
                    _spec(get_model_metadata_pb2.GetModelMetadataRequest(), "a"),
                    _spec(get_model_status_pb2.GetModelStatusRequest(), "a")):
        assert wire.model_name(message.SerializeToString()) == "a"
    # Fields merge as a parse merges them: the last name wins.
    later = _spec(predict_pb2.PredictRequest(), "b")
    twice = predict.SerializeToString() + later.SerializeToString()
    assert predict_pb2.PredictRequest.FromString(twice).model_spec.name == "b"
    assert wire.model_name(twice) == "b"
    assert wire.model_name(predict_pb2.PredictRequest().SerializeToString()) is None
    assert wire.model_name(b"\x0a\xff\xff\xff\xff\x0f") is None  # a length past the end

    multi = inference_pb2.MultiInferenceRequest()
    for name in ("a", "a"):
        _spec(multi.tasks.add(), name)
    assert wire.model_name(multi.SerializeToString(), multi_inference=True) == "a"
    _spec(multi.tasks.add(), "b")
    assert wire.model_name(multi.SerializeToString(), multi_inference=True) is None


class _Sandbox:
    """A stand-in for a sandbox's REST listener: answers every request with its path."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(4096)
                if not piece:
                    return
                data += piece
            body = data.split(b" ")[1]
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def _exchange(sock: socket.socket, path: bytes) -> bytes:
    sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(path):
        piece = sock.recv(4096)
        if not piece:
            break
        answer += piece
    return answer


def _ask(address, path: bytes = b"/v1/models/m") -> bytes:
    with socket.create_connection(address, timeout=30) as sock:
        return _exchange(sock, path)


@pytest.fixture
def sandbox_socket(tmp_path):
    path = str(tmp_path / "rest.sock")
    sandbox = _Sandbox(path)
    yield path
    sandbox.listener.close()


class _FailingListener:
    """A listener whose accept fails with ``errors`` first (each a per-connection error
    the kernel reports), then accepts from a real one."""

    def __init__(self, real: socket.socket, errors: list[int]) -> None:
        self.real = real
        self.errors = list(errors)
        self.raised = 0

    def listen(self, backlog: int) -> None:
        self.real.listen(backlog)

    def accept(self):
        if self.errors:
            self.raised += 1
            raise OSError(self.errors.pop(0), "injected")
        return self.real.accept()

    def shutdown(self, how: int) -> None:
        self.real.shutdown(how)

    def close(self) -> None:
        self.real.close()


def test_the_accept_loop_outlives_every_per_connection_error(sandbox_socket):
    real = socket.socket()
    real.bind(("127.0.0.1", 0))
    errors = [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
              errno.EPROTO, errno.EPERM]
    listener = _FailingListener(real, errors)
    front = rest_front.RestFront(listener, lambda name: sandbox_socket, 1 << 20)
    front.start()
    try:
        assert _ask(real.getsockname()).endswith(b"\r\n\r\n/v1/models/m")
        assert listener.raised == len(errors)  # control: every error was raised first
    finally:
        front.close()


def test_past_the_connection_limit_the_oldest_idle_connection_is_closed(sandbox_socket):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    address = listener.getsockname()
    front = rest_front.RestFront(listener, lambda name: sandbox_socket, 1 << 20,
                                 max_connections=4)
    front.start()
    idle = [socket.create_connection(address, timeout=30) for _ in range(12)]
    try:
        assert _ask(address).endswith(b"/v1/models/m")
        # Control: the limit was reached: the oldest idle connections were closed.
        assert idle[0].recv(1) == b""
        assert _exchange(idle[-1], b"/v1/models/last").endswith(b"/v1/models/last")
    finally:
        for sock in idle:
            sock.close()
        front.close()


class _Child:
    """A stand-in sandbox's gRPC server on a unix socket: Predict answers its tag and
    the request's bytes, the remaining deadline in trailing metadata; a request carrying
    b"fail" is aborted with DATA_LOSS and trailing metadata of its own."""

    def __init__(self, path: str, tag: bytes) -> None:
        import grpc

        def predict(request: bytes, context) -> bytes:
            if b"fail" in request:
                context.set_trailing_metadata((("why", "asked to"),))
                context.abort(grpc.StatusCode.DATA_LOSS, f"{tag.decode()} failed")
            context.set_trailing_metadata((("left", f"{context.time_remaining():.3f}"),))
            return tag + b":" + request

        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[
            grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {
                "Predict": grpc.unary_unary_rpc_method_handler(predict)})])
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()


def test_the_router_sends_each_call_to_its_models_sandbox_and_relays_the_outcome(tmp_path):
    import grpc
    from tensorflow_serving.apis import predict_pb2

    from serving_opt.serving.front import grpc_router

    paths = {name: str(tmp_path / f"{name}.sock") for name in ("a", "b")}
    children = [_Child(path, name.encode()) for name, path in paths.items()]
    router = grpc_router.Router(paths, ["a", "b"], 1000, 8,
                                channel_arguments="grpc.max_receive_message_length=500")
    port = router.add_insecure_port("127.0.0.1:0")
    router.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")

            def ask(name: str, extra: bytes = b"", timeout: float = 60):
                request = predict_pb2.PredictRequest()
                request.model_spec.name = name
                return predict.with_call(request.SerializeToString() + extra, timeout=timeout)

            reply, call = ask("b")
            assert reply.startswith(b"b:")
            # The client's 60 s deadline went along to the sandbox.
            assert 0 < float(dict(call.trailing_metadata())["left"]) < 120
            assert ask("nope")[0].startswith(b"a:")  # no such model: the first sandbox
            with pytest.raises(grpc.RpcError) as failed:
                ask("b", b"\x1a\x04fail")  # an output_filter "fail"
            assert failed.value.code() == grpc.StatusCode.DATA_LOSS
            assert failed.value.details() == "b failed"
            assert ("why", "asked to") in tuple(failed.value.trailing_metadata())
            # The user's --grpc_channel_arguments apply to the port clients reach.
            with pytest.raises(grpc.RpcError) as large:
                ask("b", b"\x1a\x82\x05" + b"x" * 642)
            assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        router.stop(1)
        for child in children:
            child.server.stop(None)


def test_a_sandbox_that_answers_before_reading_the_body_is_relayed(sandbox_socket):
    # The stand-in answers from the head and closes, as rest.py's HTTP layer does for a
    # head it refuses: passing the 8 MiB body on fails, and the answer still comes back.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    front = rest_front.RestFront(listener, lambda name: sandbox_socket, 16 << 20)
    front.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=30) as sock:
            body = b"x" * (8 << 20)
            head = b"POST /v1/models/m:predict HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
            sender = threading.Thread(target=lambda: _send_ignoring_errors(sock, head + body))
            sender.start()
            answer = b""
            while not answer.endswith(b"/v1/models/m:predict"):
                piece = sock.recv(4096)
                if not piece:
                    break
                answer += piece
            sender.join(timeout=30)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b":predict")
    finally:
        front.close()


def _send_ignoring_errors(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


_BODIES = {
    "length": (b"Content-Length: 5\r\n", b"hello" + b"GET / HTTP/1.1\r\n\r\n"),
    "chunked": (b"Transfer-Encoding: chunked\r\n",
                b"5;ext=1\r\nhello\r\n3\r\n!!!\r\n0\r\nTrailer: x\r\n\r\nGET / HTTP/1.1\r\n"),
    "bad size line": (b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\nzz\r\n0\r\n\r\n"),
    "chunks over the limit": (b"Transfer-Encoding: chunked\r\n", b"40\r\n" + b"x" * 64),
    "no CRLF after data": (b"Transfer-Encoding: chunked\r\n", b"5\r\nhelloXY\r\n0\r\n\r\n"),
    "chunk line too long": (b"Transfer-Encoding: chunked\r\n", b"1" * 5000 + b"\r\n"),
    "too many trailers": (b"Transfer-Encoding: chunked\r\n", b"0\r\n" + b"t: 1\r\n" * 101),
    "other coding": (b"Transfer-Encoding: gzip\r\n", b"hello"),
    "codings on two lines": (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
                             b"0\r\n\r\n"),
    "conflicting lengths": (b"Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"),
    "length over the limit": (b"Content-Length: 100\r\n", b"x" * 100),
}


@pytest.mark.parametrize("case", sorted(_BODIES))
def test_the_front_passes_a_body_exactly_as_far_as_rest_reads_it(case):
    # The sandbox's rest.py and the front share the framing (http_connections): the
    # front must pass what rest.py reads of a body, no byte more or less, and refuse
    # from the head alone what rest.py refuses from it.
    import http.client
    import io

    from serving_opt.model_server import http_connections, rest

    fields, stream = _BODIES[case]
    limit = 50
    rfile = io.BytesIO(stream)
    try:
        rest.read_body(http.client.parse_headers(io.BytesIO(fields + b"\r\n")), rfile, limit)
        refused = None
    except http_connections.HttpError as e:
        refused = e.status
    read = stream[:rfile.tell()]

    client, client_end = socket.socketpair()
    upstream, upstream_end = socket.socketpair()
    with client, client_end, upstream, upstream_end, socket.socket() as listener:
        client_end.sendall(stream)
        client_end.shutdown(socket.SHUT_WR)
        lines = fields.rstrip(b"\r\n").split(b"\r\n")
        try:
            framing = http_connections.body_framing(
                rest_front._values(lines, b"transfer-encoding"),
                rest_front._values(lines, b"content-length"), limit)
        except http_connections.HttpError:
            framing = "refused"
        front = rest_front.RestFront(listener, lambda name: "", limit)
        complete = front._pass_body(rest_front._Reader(client), upstream, framing, b"")
        upstream.shutdown(socket.SHUT_WR)
        passed = b""
        while piece := upstream_end.recv(65536):
            passed += piece
    assert passed == read
    assert complete == (refused is None)
    if case in ("length", "chunked"):
        assert refused is None and read and not read.endswith(b"HTTP/1.1\r\n")  # control
    else:
        assert refused in (400, 413, 501)


def test_the_front_imports_neither_tensorflow_nor_the_protos():
    import subprocess
    import sys

    code = ("import sys; import serving_opt.serving.front.rest_front; "
            "import serving_opt.serving.sandboxed_server; "
            "print(sorted(m for m in ('tensorflow', 'google.protobuf', "
            "'serving_opt.model_server.server') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_connections_past_the_limit_close_the_oldest_of_the_first_tier_that_has_one():
    # The registry rest.py and the front share: the oldest is the longest in its state;
    # with no connection in any tier, admitting refuses (rest.py then answers 503).
    from serving_opt.model_server.http_connections import BUSY, CLIENT, IDLE, Connections

    closed = []
    connections = Connections(3, close=closed.append)
    for key in "abc":
        assert connections.admit(key)
    connections.enter("a", BUSY)
    connections.enter("b", CLIENT)
    connections.enter("c", CLIENT)
    connections.enter("b", IDLE)
    assert connections.admit("d")  # the one IDLE: b
    assert closed == ["b"]
    assert not connections.enter("b", BUSY)  # closed meanwhile: its thread stops
    tiers = ((IDLE,), (CLIENT,), (IDLE, CLIENT, BUSY))
    connections.enter("d", BUSY)
    assert connections.admit("e", tiers)  # no IDLE: the longest reading, c
    assert closed == ["b", "c"]
    connections.enter("e", BUSY)
    assert not connections.admit("f")  # IDLE only, and none is
    assert connections.admit("f", tiers)  # any: the longest busy, a
    assert closed == ["b", "c", "a"]
    assert len(connections) == 3 and connections.most_open == 3
