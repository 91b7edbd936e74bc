"""The REST port under connection floods: idle connections past the bound cost no
thread and stop neither REST nor gRPC, a request head sent a byte at a time is closed
after the header timeout, and the accept loop outlives running out of descriptors."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import selectors  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import read_line, running, start_serve, stop_process  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from serving_opt.model_server import http_connections  # noqa: E402
from serving_opt.model_server.request_options import RestLimits  # noqa: E402

LIMIT = 24
# Generous: a loaded machine must not fail these, and none waits for them to pass.
PATIENCE_SECONDS = 60


@pytest.fixture(scope="module")
def model_base(tmp_path_factory) -> str:
    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 2}

    base = tmp_path_factory.mktemp("conn") / "m"
    model = Double()
    tf.saved_model.save(model, str(base / "1"), signatures={"serving_default": model.serve})
    return str(base)


def rest_predict(port: int) -> list:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models/m:predict",
        data=json.dumps({"instances": [1.5]}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=PATIENCE_SECONDS) as reply:
        return json.loads(reply.read())["predictions"]


def grpc_predict(address: str) -> list:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.5], np.float32)))
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        reply = stub.Predict(request, timeout=PATIENCE_SECONDS)
    return list(reply.outputs["y"].float_val)


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed ``sock`` (waits up to PATIENCE_SECONDS)."""
    sock.settimeout(PATIENCE_SECONDS)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_idle_connections_past_the_limit_stop_neither_rest_nor_grpc(model_base):
    limits = RestLimits(max_connections=LIMIT)
    with running(model_name="m", model_base_path=model_base, port=0, rest_api_port=-1,
                 rest_limits=limits) as server, contextlib.ExitStack() as stack:
        threads_before = threading.active_count()
        idle = []
        for _ in range(4 * LIMIT):
            sock = stack.enter_context(socket.create_connection(
                ("127.0.0.1", server.rest_port), timeout=PATIENCE_SECONDS))
            idle.append(sock)
        assert rest_predict(server.rest_port) == [3.0]
        assert grpc_predict(server.address) == [3.0]
        connections = server._rest_server.connections
        # Control: the flood reached the bound, and the oldest idle connections were
        # the ones closed to make room (a server without the bound keeps them all).
        assert connections.most_open == LIMIT
        assert closed_by_server(idle[0])
        assert len(connections) <= LIMIT
        assert threading.active_count() - threads_before <= LIMIT + 8
        for sock in idle:
            sock.close()
        assert rest_predict(server.rest_port) == [3.0]
        assert grpc_predict(server.address) == [3.0]


def test_when_every_connection_is_busy_a_new_one_is_answered_503(model_base):
    limits = RestLimits(max_connections=2, body_timeout_seconds=PATIENCE_SECONDS)
    with running(model_name="m", model_base_path=model_base, port=0, rest_api_port=-1,
                 rest_limits=limits) as server, contextlib.ExitStack() as stack:
        head = (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 100\r\n\r\n{")  # a body that never ends: busy
        busy = []
        for _ in range(2):
            sock = stack.enter_context(socket.create_connection(
                ("127.0.0.1", server.rest_port), timeout=PATIENCE_SECONDS))
            sock.sendall(head)
            busy.append(sock)
        connections = server._rest_server.connections
        deadline = time.monotonic() + PATIENCE_SECONDS
        while len(connections) < 2 or connections.waiting_count():
            assert time.monotonic() < deadline, "the two bodies were never being read"
            time.sleep(0.05)
        refused = stack.enter_context(socket.create_connection(
            ("127.0.0.1", server.rest_port), timeout=PATIENCE_SECONDS))
        answer = refused.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        for sock in busy:
            sock.close()
        refused.close()
        # Their threads see the closes when they next read: until then they still count,
        # and a request meanwhile would rightly be answered 503 too.
        deadline = time.monotonic() + PATIENCE_SECONDS
        while len(connections):
            assert time.monotonic() < deadline, "closed connections were never released"
            time.sleep(0.05)
        assert rest_predict(server.rest_port) == [3.0]


def test_a_head_sent_a_byte_at_a_time_is_closed_after_the_header_timeout(model_base):
    # The idle and body timeouts (each read) are long; only the head's total deadline
    # can close a connection whose bytes keep arriving.
    limits = RestLimits(header_timeout_seconds=1, idle_timeout_seconds=PATIENCE_SECONDS,
                        body_timeout_seconds=PATIENCE_SECONDS)
    with running(model_name="m", model_base_path=model_base, port=0, rest_api_port=-1,
                 rest_limits=limits) as server, socket.create_connection(
                     ("127.0.0.1", server.rest_port), timeout=PATIENCE_SECONDS) as sock:
        sock.sendall(b"GET /v1/models/m HTTP/1.1\r\n")
        sent = 0
        sock.settimeout(0.1)
        deadline = time.monotonic() + PATIENCE_SECONDS
        while True:
            assert time.monotonic() < deadline, f"still open after {sent} header bytes"
            try:
                sock.sendall(b"X")
                sent += 1
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue  # nothing from the server yet: one more byte
            except (BrokenPipeError, ConnectionResetError):
                break
        # Control: the head really kept arriving until the server gave up on it.
        assert sent >= 2
        assert rest_predict(server.rest_port) == [3.0]


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(model_base):
    limits = RestLimits(idle_timeout_seconds=1)
    with running(model_name="m", model_base_path=model_base, port=0, rest_api_port=-1,
                 rest_limits=limits) as server, socket.create_connection(
                     ("127.0.0.1", server.rest_port), timeout=PATIENCE_SECONDS) as sock:
        sock.sendall(b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b'"state": "AVAILABLE"' not in answer:  # the first request was answered
            piece = sock.recv(4096)
            assert piece, answer
            answer += piece
        assert b"HTTP/1.1 200 " in answer
        assert closed_by_server(sock)


def any_closed_by_server(socks: list[socket.socket]) -> bool:
    """True once the server closed one of ``socks`` (waits up to PATIENCE_SECONDS)."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        for key, _ in selector.select(PATIENCE_SECONDS):
            if key.fileobj.recv(1) == b"":
                return True
    return False


# A server whose REST bound (from the descriptor limit at start) is far above the 40
# descriptors it has left once started: the flood runs it out of descriptors first.
_SERVER = """
import os, resource, sys
from serving_opt.model_server import ServerOptions, serve
server = serve(ServerOptions(model_name="m", model_base_path=sys.argv[1], port=0,
                             rest_api_port=-1))
assert server._rest_server.connections.limit >= 100
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 40, resource.getrlimit(
    resource.RLIMIT_NOFILE)[1]))
print(server.address, server.rest_port, flush=True)
sys.stdin.read()
"""


def test_the_accept_loop_outlives_running_out_of_descriptors(model_base):
    process = subprocess.Popen([sys.executable, "-c", _SERVER, model_base],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        address, rest_port = process.stdout.readline().split()
        port = int(rest_port)
        with contextlib.ExitStack() as stack:
            # Past the 40 spare descriptors: accept() fails with EMFILE for some of these.
            socks = [stack.enter_context(socket.create_connection(("127.0.0.1", port),
                                                                  timeout=PATIENCE_SECONDS))
                     for _ in range(100)]
            # Control: the server really ran out (some of the first ones were closed to
            # free a descriptor, not kept as they are under the default bound).
            assert any_closed_by_server(socks)
            assert rest_predict(port) == [3.0]
        assert rest_predict(port) == [3.0]
        assert grpc_predict(address) == [3.0]
        assert process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=PATIENCE_SECONDS)


def test_sandboxed_serve_answers_both_protocols_through_2500_idle_connections(model_base):
    # The flood, on `serving-opt serve` as users run it (sandboxed, default flags).
    wanted = 2500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted + 200), hard))
    process = start_serve("--port=0", "--rest_api_port=-1", "--model_name=m",
                          f"--model_base_path={model_base}")
    try:
        line = read_line(process, 180)
        match = re.search(r"AVAILABLE on (127\.0\.0\.1:\d+), REST on 127\.0\.0\.1:(\d+) ",
                          line)
        assert match, line
        address, port = match.group(1), int(match.group(2))
        with contextlib.ExitStack() as stack:
            socks = [stack.enter_context(socket.create_connection(
                ("127.0.0.1", port), timeout=PATIENCE_SECONDS)) for _ in range(wanted)]
            assert rest_predict(port) == [3.0]
            assert grpc_predict(address) == [3.0]
            # Control: past its bound, the server closed connections of the flood.
            assert any_closed_by_server(socks[:100])
        assert rest_predict(port) == [3.0]
        assert grpc_predict(address) == [3.0]
    finally:
        stop_process(process)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_request_head_over_its_bound_is_closed_unread(model_base):
    def head(headers: int) -> bytes:
        lines = [b"GET /v1/models/m HTTP/1.1", b"Host: x"]
        lines += [b"X-%d: %s" % (i, b"v" * 2000) for i in range(headers)]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    with running(model_name="m", model_base_path=model_base, port=0,
                 rest_api_port=-1) as server:
        # Control: a head of 20 KB is read and answered.
        with socket.create_connection(("127.0.0.1", server.rest_port),
                                      timeout=PATIENCE_SECONDS) as sock:
            sock.sendall(head(10))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        # 98 lines of 2 KB: within http.server's own limits (100 lines of 64 KiB), over
        # what a connection may hold.
        big = head(98)
        assert len(big) > http_connections.MAX_HEAD_BYTES
        with socket.create_connection(("127.0.0.1", server.rest_port),
                                      timeout=PATIENCE_SECONDS) as sock:
            try:
                sock.sendall(big)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed while it was still sending: what is wanted
            try:
                answer = sock.recv(4096)
            except ConnectionResetError:
                answer = b""
            assert answer == b""
        assert rest_predict(server.rest_port) == [3.0]


def test_answers_leave_in_one_write_with_nagles_algorithm_off():
    # A kept-alive connection's answer written as head then body, with Nagle's algorithm
    # on, waits for the client's delayed ACK (40 ms on Linux): each answer must go out
    # whole in one write, and the socket must not hold back small writes.
    from serving_opt.model_server import rest
    from serving_opt.model_server.request_options import RequestOptions

    server = rest.start_rest_server(object(), RequestOptions(), "127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", server.port),
                                      timeout=PATIENCE_SECONDS) as sock:
            for _ in range(2):  # the second answer is the one Nagle's algorithm delayed
                sock.sendall(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
                first = sock.recv(65536)
                head, _, body = first.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 404")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                assert len(body) == length > 0  # all of it, in the first read
            # The connection the server holds (one: this client's).
            (held,) = list(server.connections._states)
            assert held.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server.stop()
