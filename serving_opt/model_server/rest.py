"""TF Serving's HTTP/REST API (model_servers/http_server.cc + http_rest_api_handler.cc).

Served from the same process and the same ServerCore as gRPC: a REST request becomes the
proto request gRPC would receive (json_codec.py) and runs through the same
``run_predict`` / ``run_classify`` / ``run_regress`` and the same status and metadata code,
so both protocols answer alike.

Endpoints (paths are matched case-insensitively, like upstream's RE2 patterns):

* ``GET  /v1/models/NAME[/versions/N|/labels/L]``           model status
* ``GET  /v1/models/NAME[/versions/N|/labels/L]/metadata``  signature defs
* ``POST /v1/models/NAME[/versions/N|/labels/L]:predict``   ``instances`` or ``inputs``
* ``POST ...:classify`` / ``...:regress``                   ``examples`` (+ ``context``)

Errors are ``{"error": "<message>"}`` with upstream's status mapping (INVALID_ARGUMENT and
FAILED_PRECONDITION -> 400, NOT_FOUND -> 404, DEADLINE_EXCEEDED -> 504, ...); another
``/v1/...`` path is "Malformed request: GET /v1/..." (400); a path outside ``/v1/`` is a
bare 404. ``rest_api_timeout_in_ms`` becomes the session run timeout of every request;
``rest_api_num_threads`` bounds the requests running at once (connections each get a
thread, their number and waits bounded by http_connections.py; HTTP/1.1 keep-alive is
supported).

Bodies are framed by ``Content-Length`` or ``Transfer-Encoding: chunked`` (decoded), and
bounded by ``max_request_bytes``: over it the answer is 413 before the rest is read, a
``Content-Length`` that is not a byte count or malformed chunking is 400, another
transfer coding 501; these answers are ``{"error": ...}`` too and close the connection,
since the body's end is unknown.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

import grpc

from serving_opt.model_server import json_codec, request_cost
from serving_opt.model_server.core import ServerCore
from serving_opt.model_server.http_connections import (
    CHUNKED,
    READ_BUFFER_BYTES,
    BoundedHTTPServer,
    ClientGone,
    DeadlineReader,
    HttpError,
    SocketWriter,
    body_framing,
    chunked_parts,
    fixed_parts,
)
from serving_opt.model_server.monitoring import METRICS
from serving_opt.model_server.request_options import (
    DEFAULT_REST_LIMITS,
    RequestOptions,
    RestLimits,
)
from serving_opt.model_server.status import (
    ServingStatusError,
    failed_precondition,
    invalid_argument,
)

log = logging.getLogger("serving_opt.model_server")

_HANDLED = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)
_PREDICTION = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)",
    re.IGNORECASE,
)
_STATUS = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)

# http_server.cc ToHTTPStatusCode.
_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_REASONS = {499: "Client Closed Request"}
# What libevent's evhttp_send_error writes for a path no handler takes.
_NOT_FOUND_PAGE = (
    b"<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n<H1>Not Found</H1>\n"
    b"</BODY></HTML>\n"
)
_INT64_MAX = 2**63 - 1
# After an error answer that leaves a body unread, the rest is read and dropped (for at
# most this long / this much) so that closing does not reset the connection before the
# client has read the answer.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 64 << 20


def read_body(headers, rfile, max_bytes: int) -> bytes:
    """The request body, framed by ``Transfer-Encoding: chunked`` or ``Content-Length``
    (http_connections.body_framing: HttpError 413, 400 or 501 as it says). Memory grows
    with what arrives, never with what is declared."""
    framing = body_framing(headers.get_all("Transfer-Encoding", []),
                           headers.get_all("Content-Length", []), max_bytes)
    if framing == CHUNKED:
        return b"".join(data for data, is_data in
                        chunked_parts(rfile.readline, rfile.read, max_bytes) if is_data)
    return b"".join(fixed_parts(rfile.read, framing))


def http_status(code: grpc.StatusCode) -> int:
    """Upstream's gRPC-code -> HTTP-status mapping."""
    return _HTTP_STATUS.get(code, 500)


class RestApiHandler:
    """``HttpRestApiHandler::ProcessRequest``: (method, path, body) -> (HTTP status, body)."""

    def __init__(self, core: ServerCore, options: RequestOptions) -> None:
        from serving_opt.model_server.model_service import ModelService
        from serving_opt.model_server.prediction_service import PredictionService

        self._core = core
        self._options = options
        self._model_service = ModelService(core)
        self._prediction_service = PredictionService(core, options)

    def process(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        start = time.monotonic()
        status = "OK"
        try:
            output = self._dispatch(method, path, body)
        except ServingStatusError as e:
            status = e.code.name
            return http_status(e.code), json_codec.error_json(e.message)
        except RecursionError:
            # A JSON value nested deeper than a check caught: the client's doing, not ours.
            status = "INVALID_ARGUMENT"
            return 400, json_codec.error_json("JSON value nested too deeply")
        except Exception as e:  # noqa: BLE001 - a server must answer, not die
            status = "INTERNAL"
            log.exception("REST request failed unexpectedly")
            return 500, json_codec.error_json(f"{type(e).__name__}: {e}")
        finally:
            # http_server.cc: every API request counts; latency of successful ones.
            name, verb = _model_and_verb(method, path)
            METRICS.record(name, verb, "REST", status,
                           int((time.monotonic() - start) * 1_000_000))
        return 200, output

    def _dispatch(self, method: str, path: str, body: bytes) -> bytes:
        malformed = invalid_argument(f"Malformed request: {method} {path}")
        if method == "POST":
            match = _PREDICTION.fullmatch(path)
        elif method == "GET":
            match = _STATUS.fullmatch(path)
        else:
            raise malformed
        if match is None:
            raise malformed
        name, version_text, label, verb = match.groups()
        name = urllib.parse.unquote(name) if name else ""
        version = None
        if version_text:
            version = int(version_text)
            if version > _INT64_MAX:
                raise invalid_argument(
                    f"Failed to convert version: {version_text} to numeric."
                )
        if label:
            label = urllib.parse.unquote(label)
        label = label or None
        if method == "POST":
            if verb == "predict":
                return self._predict(name, version, label, body)
            if verb == "classify":
                return self._classify_or_regress(name, version, label, body, classify=True)
            if verb == "regress":
                return self._classify_or_regress(name, version, label, body, classify=False)
            raise malformed  # matched case-insensitively, compared case-sensitively
        if verb and verb == "metadata":
            return self._metadata(name, version, label)
        return self._status(name, version, label)

    def _spec(self, name: str, version: int | None, label: str | None):
        from tensorflow_serving.apis import model_pb2

        spec = model_pb2.ModelSpec()
        json_codec.fill_model_spec(spec, name, version, label)
        return spec

    def _input_infos(self, spec):
        def lookup(signature_name: str):
            with self._core.servable_handle(spec) as handle:
                key = signature_name or "serving_default"
                signature = handle.servable.signature_defs.get(key)
                if signature is None:
                    raise invalid_argument(
                        f'Serving signature name: "{key}" not found in signature def'
                    )
                return dict(signature.inputs)

        return lookup

    def _predict(self, name, version, label, body: bytes) -> bytes:
        from serving_opt.model_server.predict import run_predict

        request, fmt = json_codec.parse_predict_request(
            body, name, version, label, self._input_infos(self._spec(name, version, label)),
            self._options.max_request_bytes,
        )
        with self._core.servable_handle(request.model_spec) as handle:
            response = run_predict(handle.servable, request, self._options, handle.id.version)
        return json_codec.predict_response_json(response.outputs, fmt)

    def _classify_or_regress(self, name, version, label, body: bytes, classify: bool) -> bytes:
        from tensorflow_serving.apis import classification_pb2, regression_pb2

        from serving_opt.model_server.classifier import run_classify
        from serving_opt.model_server.regressor import run_regress

        if classify:
            request = classification_pb2.ClassificationRequest()
        else:
            request = regression_pb2.RegressionRequest()
        json_codec.fill_model_spec(request.model_spec, name, version, label)
        json_codec.parse_classify_regress_request(request, body,
                                                   self._options.max_request_bytes)
        runner = run_classify if classify else run_regress
        with self._core.servable_handle(request.model_spec) as handle:
            response = runner(handle.servable, request, self._options, handle.id.version)
        if classify:
            return json_codec.classify_response_json(response.result)
        return json_codec.regress_response_json(response.result)

    def _status(self, name, version, label) -> bytes:
        from tensorflow_serving.apis import get_model_status_pb2

        if not name:
            raise invalid_argument("Missing model name in request.")
        request = get_model_status_pb2.GetModelStatusRequest()
        json_codec.fill_model_spec(request.model_spec, name, version, label)
        return json_codec.status_response_json(self._model_service._status(request))

    def _metadata(self, name, version, label) -> bytes:
        from tensorflow_serving.apis import get_model_metadata_pb2

        if not name:
            raise invalid_argument("Missing model name in request.")
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        request.metadata_field.append("signature_def")
        json_codec.fill_model_spec(request.model_spec, name, version, label)
        return json_codec.metadata_response_json(self._prediction_service._metadata(request))


def _model_and_verb(method: str, path: str) -> tuple[str, str]:
    """The model name and API verb upstream's handler reports for a request's metrics."""
    match = (_PREDICTION if method == "POST" else _STATUS).fullmatch(path)
    if match is None:
        return "", ""
    name, _, _, verb = match.groups()
    name = urllib.parse.unquote(name) if name else ""
    return name, (verb or "") if method == "POST" else ""


def _make_handler_class(
    handler: RestApiHandler,
    slots: threading.BoundedSemaphore,
    enable_cors: bool,
    max_body_bytes: int,
    prometheus_path: str | None = None,
    limits: RestLimits = DEFAULT_REST_LIMITS,
):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as evhttp
        server_version = "serving-opt"
        sys_version = ""

        def setup(self) -> None:
            # Reads go through a deadline (http_connections); writes get the body timeout.
            self.connection = self.request
            if self.connection.family in (socket.AF_INET, socket.AF_INET6):
                # An answer is written while the client waits: with Nagle's algorithm a
                # kept-alive connection's next answer waits for the client's delayed ACK
                # (40 ms on Linux).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.reader = DeadlineReader(self.connection, limits.body_timeout_seconds)
            self.rfile = io.BufferedReader(self.reader, READ_BUFFER_BYTES)
            self.wfile = SocketWriter(self.connection)

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:  # reset, closed for a newer connection, timed out writing
                self.close_connection = True

        def handle_one_request(self) -> None:
            connections = self.server.connections
            if not connections.waiting(self.connection):
                self.close_connection = True
                return
            self.reader.deadline = time.monotonic() + limits.idle_timeout_seconds
            self.reader.head_bytes = 0
            try:
                started = self.rfile.peek(1)
            except OSError:  # the idle timeout, or closed for a newer connection
                started = b""
            if not started:
                self.close_connection = True
                return
            self.reader.deadline = time.monotonic() + limits.header_timeout_seconds
            super().handle_one_request()

        def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler API
            log.debug("REST %s - %s", self.address_string(), format % args)

        def _reply(
            self, status: int, body: bytes, content_type: str | None, close: bool = False
        ) -> None:
            reason = _REASONS.get(status)
            self.send_response(status, reason)
            if content_type:
                self.send_header("Content-Type", content_type)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            if enable_cors:
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Access-Control-Allow-Methods", "POST, GET")
                self.send_header("Access-Control-Allow-Headers", "Content-Type")
            self.send_header("Content-Length", str(len(body)))
            # Head and body in one write: one segment where they fit, one wakeup of the
            # reader (the front, or the client).
            self._headers_buffer.append(b"\r\n")
            if self.command != "HEAD":
                self._headers_buffer.append(body)
            self.flush_headers()

        def handle_expect_100(self) -> bool:
            # "Expect: 100-continue" with a body that will be refused: send the refusal
            # (from _handle) instead of inviting the client to send the body.
            try:
                framing = body_framing(self.headers.get_all("Transfer-Encoding", []),
                                       self.headers.get_all("Content-Length", []),
                                       max_body_bytes)
            except HttpError:
                return True
            if framing != CHUNKED and not self.headers.get_all("Content-Length"):
                return True  # no body to invite
            return super().handle_expect_100()

        def _linger(self) -> None:
            # Half-close, then drop what the client still sends: closing a socket with
            # unread data resets it, and the client may lose the answer it was sent.
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + _LINGER_SECONDS
                dropped = 0
                while dropped < _LINGER_BYTES:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.connection.settimeout(left)
                    data = self.connection.recv(65536)
                    if not data:
                        break
                    dropped += len(data)
            except OSError:
                pass

        def _handle(self) -> None:
            if not self.server.connections.busy(self.connection):
                self.close_connection = True
                return
            self.reader.deadline = None  # the body: each read within the body timeout
            self.connection.settimeout(limits.body_timeout_seconds)
            try:
                body = read_body(self.headers, self.rfile, max_body_bytes)
            except (ClientGone, TimeoutError):
                self.close_connection = True
                return
            except HttpError as e:
                self._reply(e.status, json_codec.error_json(e.message), "application/json",
                            close=True)
                self._linger()
                return
            path = urllib.parse.urlsplit(self.path).path
            if prometheus_path is not None and path == prometheus_path:
                # --monitoring_config_file's prometheus_config (monitoring.py).
                self._reply(200, METRICS.prometheus_page().encode("utf-8"), "text/plain")
                return
            if not _HANDLED.fullmatch(path):
                self._reply(404, _NOT_FOUND_PAGE, "text/html")
                return
            if self.command == "OPTIONS":
                origin = self.headers.get("Origin") or ""
                ok = re.search(r"https?://", origin) is not None
                error = None if ok else failed_precondition(
                    "Origin header is missing in CORS preflight"
                )
                self._reply(200 if ok else http_status(error.code), b"", "application/json")
                return
            with slots:
                status, output = handler.process(self.command, path, body)
            self.connection.settimeout(limits.body_timeout_seconds)
            self._reply(status, output, "application/json")
            request_cost.release_memory_soon(len(body))

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _handle  # noqa: N815

    return Handler


class RestServer:
    """A running REST server: ``port``, ``stop()``."""

    def __init__(self, server: BoundedHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = server.server_address[1]

    @property
    def connections(self):
        """The open connections (``len``, ``limit``, ``most_open``)."""
        return self._server.connections

    def stop(self) -> None:
        """Stops accepting connections; idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def _adopt(fd: int, handler_class, server_class) -> BoundedHTTPServer:
    """A server on the bound socket ``fd`` (inherited: the host's port, given to a
    sandboxed server that has no network of its own); it starts listening now, once the
    models are loaded, as a port of its own would open."""
    sock = socket.socket(fileno=fd)
    server_class = type("_Adopted", (server_class,), {"address_family": sock.family})
    server = server_class(sock.getsockname()[:2], handler_class, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()
    server.server_name, server.server_port = server.server_address[:2]
    server.server_activate()
    return server


def start_rest_server(
    core: ServerCore,
    options: RequestOptions,
    host: str,
    port: int,
    num_threads: int = 0,
    enable_cors: bool = False,
    listen_fd: int = -1,
    prometheus_path: str | None = None,
    limits: RestLimits = DEFAULT_REST_LIMITS,
) -> RestServer:
    """Opens the REST port (0 picks a free one) and serves it from a background thread.

    ``options.timeout_ms`` is ``--rest_api_timeout_in_ms`` and ``options.max_request_bytes``
    bounds request bodies; ``num_threads`` (0: 4 per CPU, like upstream's auto setting)
    bounds the requests running at once. Raises OSError if
    the port cannot be opened. ``prometheus_path``: serve the request metrics there
    (monitoring.py), as upstream with ``prometheus_config { enable: true }``. ``limits``
    bound the open connections and their timeouts (http_connections.py).
    """
    import os

    if num_threads <= 0:
        num_threads = 4 * (os.cpu_count() or 1)
    handler = RestApiHandler(core, options)
    cls = _make_handler_class(
        handler, threading.BoundedSemaphore(num_threads), enable_cors, options.max_request_bytes,
        prometheus_path, limits,
    )
    base = type("_Server", (BoundedHTTPServer,), {"limits": limits})
    if listen_fd >= 0:
        server = _adopt(listen_fd, cls, base)
    else:
        server_class = base
        if ":" in host:
            server_class = type("_Server6", (base,), {"address_family": socket.AF_INET6})
        server = server_class((host.strip("[]"), port), cls)
    thread = threading.Thread(
        target=server.serve_forever, name="serving-opt-rest", daemon=True
    )
    thread.start()
    return RestServer(server, thread)
