"""The host's REST port: reads each request's head (bounded, within a timeout), picks the
sandbox serving the model the path names (``/v1/models/<name>...``; another API path goes
to the first sandbox, which answers it as upstream does), and passes the request and its
answer through that sandbox's REST listener, a unix socket in the private run directory.
A GET outside ``/v1/`` (the Prometheus page) is asked of every sandbox and the text pages
merged, each model's series being in its own sandbox's page.

Bounds, as upstream's libevent front end has them: at most ``max_connections`` client
connections, a head must arrive within :data:`HEADER_TIMEOUT` of its first byte, a kept-
alive connection may idle :data:`IDLE_TIMEOUT`. A connection past the limit closes the
longest idle connection (else the one longest reading from its client, else the one
longest waiting on its sandbox); running out of descriptors closes the longest idle one:
idle clients can delay a request, never lock the port. Connections and body framing are
the sandbox's own (``model_server.http_connections``, TF-free), so where ``rest.py``
refuses a body (413 over ``--max_request_bytes``, 400, 501) the front stops passing bytes
at the same point and relays the sandbox's own answer.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable

from serving_opt.model_server.http_connections import (
    BUSY,
    CHUNKED,
    CLIENT,
    IDLE,
    ClientGone,
    Connections,
    HttpError,
    body_framing,
    chunked_parts,
    fixed_parts,
)

MAX_CONNECTIONS = 512
HEADER_TIMEOUT = 20.0
IDLE_TIMEOUT = 60.0
WRITE_TIMEOUT = 60.0
# How long a request waits for a descriptor to reach its sandbox before a 503: the gRPC
# port's half-open connections give theirs back within its handshake timeout.
UPSTREAM_WAIT = 30.0
MAX_HEAD_BYTES = 64 << 10
MAX_PAGE_BYTES = 64 << 20  # a sandbox's metrics page, read whole to be merged
_PIECE = 1 << 18
_BACKOFF_SECONDS = 0.05
# Accept errors that say nothing about the listener: each ends one connection attempt.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_MODEL = re.compile(r"/v1/models/([^/:]+)", re.IGNORECASE)
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,19}")  # of an answer
# Past the limit: the longest idle connection, else the one longest reading from its
# client, else any.
_MAKE_ROOM = ((IDLE,), (CLIENT,), (IDLE, CLIENT, BUSY))
_IDLE_ONLY = ((IDLE,),)


class _Gone(Exception):
    """The client or the sandbox closed, timed out, or the connection was evicted."""


class _Reader:
    """Buffered reads from one socket, each within a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def fill(self, timeout: float | None) -> bool:
        self.sock.settimeout(timeout)
        data = self.sock.recv(_PIECE)
        self.buffer += data
        return bool(data)

    def head(self, timeout: float | None) -> bytes | None:
        """The next head (up to its empty line); None at a clean end before one."""
        if not self.buffer and not self.fill(timeout):
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ends = [i + n for i, n in ((self.buffer.find(b"\r\n\r\n"), 4),
                                       (self.buffer.find(b"\n\n"), 2)) if i >= 0]
            if ends:
                end = min(ends)
                if end > MAX_HEAD_BYTES:
                    raise _HeadTooLarge()
                head = bytes(self.buffer[:end])
                del self.buffer[:end]
                return head
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise _HeadTooLarge()
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or not self.fill(left):
                raise _Gone()

    def take(self, limit: int, timeout: float | None) -> bytes:
        if not self.buffer:  # straight from the socket: no copy through the buffer
            self.sock.settimeout(timeout)
            piece = self.sock.recv(min(limit, _PIECE))
            if not piece:
                raise _Gone()
            return piece
        if len(self.buffer) <= limit:
            piece = bytes(self.buffer)
            self.buffer.clear()
            return piece
        piece = bytes(self.buffer[:limit])
        del self.buffer[:limit]
        return piece

    def line(self, limit: int, timeout: float) -> bytes:
        """Up to and including a newline, at most ``limit`` bytes (a file's readline)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer[:limit] and len(self.buffer) < limit:
            left = deadline - time.monotonic()
            if left <= 0 or not self.fill(left):
                raise _Gone()
        end = self.buffer.find(b"\n", 0, limit)
        end = limit if end < 0 else end + 1
        piece = bytes(self.buffer[:end])
        del self.buffer[:end]
        return piece


class _HeadTooLarge(Exception):
    pass


class _SandboxStopped(Exception):
    """The sandbox stopped reading the request (it answers from what it read)."""


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        raise _SandboxStopped() from None


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.evicted = False
        self.upstreams: dict[str, _Reader] = {}

    def evict(self) -> None:
        self.evicted = True
        for sock in [self.sock, *(r.sock for r in list(self.upstreams.values()))]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes its thread, which closes them
            except OSError:
                pass


class RestFront:
    """Serves ``listener`` (bound, not yet listening) until :meth:`close`; ``route`` maps
    a model name (None: no name in the path) to the unix socket of a sandbox's REST
    listener; ``everyone`` lists them all, first the one ``route`` gives for None."""

    def __init__(self, listener: socket.socket, route: Callable[[str | None], str],
                 max_body_bytes: int, max_connections: int = MAX_CONNECTIONS,
                 everyone: tuple[str, ...] = ()) -> None:
        self._listener = listener
        self._route = route
        self._everyone = everyone
        self._max_body = max_body_bytes
        self._connections = Connections(max_connections, close=_Connection.evict)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="serving-opt-rest-front",
                                        daemon=True)

    def start(self) -> None:
        self._listener.listen(128)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._connections.close_all()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError as e:
                if self._closed or e.errno in (errno.EBADF, errno.EINVAL):
                    return  # the listener was closed
                if e.errno in _OUT_OF_RESOURCES:
                    self._connections.evict(_IDLE_ONLY)  # a descriptor for the one waiting
                time.sleep(_BACKOFF_SECONDS)  # ECONNABORTED, EPERM, ...: the next one
                continue
            connection = _Connection(sock)
            self._connections.admit(connection, _MAKE_ROOM)
            try:
                threading.Thread(target=self._serve, args=(connection,), daemon=True,
                                 name="serving-opt-rest-conn").start()
            except RuntimeError:  # no thread left: this client retries
                self._forget(connection)
                time.sleep(_BACKOFF_SECONDS)

    def _forget(self, connection: _Connection) -> None:
        self._connections.release(connection)
        for reader in connection.upstreams.values():
            reader.sock.close()
        connection.sock.close()

    def _serve(self, connection: _Connection) -> None:
        try:
            if connection.sock.family in (socket.AF_INET, socket.AF_INET6):
                connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _Reader(connection.sock)
            while not connection.evicted and self._exchange(connection, client):
                pass
        except (_Gone, ClientGone, OSError):
            pass
        except _HeadTooLarge:
            _answer(connection.sock, 431, f"request head over {MAX_HEAD_BYTES} bytes")
        finally:
            self._forget(connection)

    def _exchange(self, connection: _Connection, client: _Reader) -> bool:
        """One request and its answer; whether the connection stays open."""
        if not self._connections.enter(connection, IDLE):
            return False
        if not client.buffer and not client.fill(IDLE_TIMEOUT):
            return False
        if not self._connections.enter(connection, CLIENT):
            return False
        head = client.head(HEADER_TIMEOUT)
        if head is None:
            return False
        lines = [line.rstrip(b"\r") for line in head.split(b"\n")][:-2]  # its empty line
        request_line = lines[0].split() if lines else []
        if len(request_line) != 3:
            _answer(connection.sock, 400, "malformed request line")
            return False
        method, target, version = request_line
        fields = _fields(lines[1:])
        try:
            framing = body_framing(_values(lines[1:], b"transfer-encoding"),
                                   _values(lines[1:], b"content-length"), self._max_body)
        except HttpError:
            framing = "refused"  # the sandbox answers it from the head
        if framing != "refused" and b"100-continue" in fields.get(b"expect", b"").lower():
            connection.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        forwarded = b"".join(line + b"\r\n" for line in lines
                             if not line.lower().startswith(b"expect:")) + b"\r\n"
        name = _model(target)
        if (name is None and len(self._everyone) > 1 and method == b"GET" and framing == 0
                and not target.lower().startswith(b"/v1/")):
            self._connections.enter(connection, BUSY)
            self._gather(connection, forwarded)
            return b"close" not in fields.get(b"connection", b"").lower() and \
                version != b"HTTP/1.0"
        upstream = self._upstream(connection, self._route(name))
        try:
            complete = self._pass_body(client, upstream.sock, framing, forwarded)
        except _SandboxStopped:
            complete = False
        self._connections.enter(connection, BUSY)
        keep = self._pass_answer(connection, upstream, method == b"HEAD")
        self._connections.enter(connection, CLIENT)
        connection_field = fields.get(b"connection", b"").lower()
        if version == b"HTTP/1.0":
            keep = keep and b"keep-alive" in connection_field
        return keep and complete and b"close" not in connection_field

    def _gather(self, connection: _Connection, forwarded: bytes) -> None:
        """A page outside the API (the Prometheus metrics): every sandbox's, merged when
        all are text pages (each model's series are in its own sandbox's page); else the
        first sandbox's answer."""
        answers = []
        for path in self._everyone:
            upstream = self._upstream(connection, path)
            _send(upstream.sock, forwarded)
            answers.append(_whole_answer(upstream))
            connection.upstreams.pop(path).sock.close()
        pages = [body for status, fields, body, _ in answers
                 if status == 200 and fields.get(b"content-type", b"").startswith(b"text/plain")]
        connection.sock.settimeout(WRITE_TIMEOUT)
        if len(pages) < len(answers):
            connection.sock.sendall(answers[0][3] + answers[0][2])
            return
        body = merge_prometheus(pages)
        connection.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                                b"\r\n%s" % (answers[0][1][b"content-type"], len(body), body))

    def _upstream(self, connection: _Connection, path: str) -> _Reader:
        reader = connection.upstreams.get(path)
        if reader is not None:
            return reader
        deadline = time.monotonic() + UPSTREAM_WAIT
        while True:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            except OSError as e:
                error = e
            else:
                try:
                    # rest.py logs client_address[0]: an unnamed peer's address is "".
                    sock.bind("")
                    sock.connect(path)
                    connection.upstreams[path] = reader = _Reader(sock)
                    return reader
                except OSError as e:
                    sock.close()
                    error = e
            if error.errno not in _OUT_OF_RESOURCES or time.monotonic() > deadline:
                _answer(connection.sock, 503, "the model's server is not reachable")
                raise _Gone() from None
            self._connections.evict(_IDLE_ONLY)
            time.sleep(_BACKOFF_SECONDS)

    def _pass_body(self, client: _Reader, upstream: socket.socket, framing,
                   head: bytes) -> bool:
        """Passes the head, then the body as far as the sandbox will read it; whether it
        read it all. What of the body has arrived goes with the head, in one write."""
        if framing == "refused" or framing == CHUNKED or not client.buffer:
            _send(upstream, head)
            if framing == "refused":
                return False
            if framing == CHUNKED:
                return _pass_chunked(client, upstream, self._max_body)
            head = b""
        for piece in fixed_parts(lambda n: client.take(n, HEADER_TIMEOUT), framing):
            _send(upstream, head + piece if head else piece)
            head = b""
        return True

    def _pass_answer(self, connection: _Connection, upstream: _Reader, head_only: bool) -> bool:
        head = upstream.head(None)
        if head is None:
            raise _Gone()
        lines = [line.rstrip(b"\r") for line in head.split(b"\n")]
        status = int(lines[0].split()[1])
        fields = _fields(lines[1:])
        length = fields.get(b"content-length")
        if head_only or status in (204, 304) or 100 <= status < 200:
            left = 0
        elif length is not None and _CONTENT_LENGTH.fullmatch(length.strip()):
            left = int(length)
        else:
            left = -1  # to the end of the connection
        connection.sock.settimeout(WRITE_TIMEOUT)
        if not left or not upstream.buffer:
            connection.sock.sendall(head)
            head = b""
        # else the head goes with what of the body has arrived: one write, one segment
        # for a small answer
        while left:
            try:
                piece = upstream.take(_PIECE if left < 0 else min(left, _PIECE), None)
            except _Gone:
                if left < 0:
                    if head:
                        connection.sock.sendall(head)
                    return False
                raise
            connection.sock.sendall(head + piece if head else piece)
            head = b""
            left -= len(piece) if left > 0 else 0
        if b"close" in fields.get(b"connection", b"").lower():
            path = next(p for p, r in connection.upstreams.items() if r is upstream)
            del connection.upstreams[path]
            upstream.sock.close()
        return True


def _whole_answer(upstream: _Reader) -> tuple[int, dict[bytes, bytes], bytes, bytes]:
    """(status, fields, body, head) of an answer with a Content-Length, read whole."""
    head = upstream.head(HEADER_TIMEOUT)
    if head is None:
        raise _Gone()
    lines = [line.rstrip(b"\r") for line in head.split(b"\n")]
    fields = _fields(lines[1:])
    length = fields.get(b"content-length", b"")
    if not _CONTENT_LENGTH.fullmatch(length) or int(length) > MAX_PAGE_BYTES:
        raise _Gone()
    left, pieces = int(length), []
    while left:
        pieces.append(upstream.take(min(left, _PIECE), HEADER_TIMEOUT))
        left -= len(pieces[-1])
    return int(lines[0].split()[1]), fields, b"".join(pieces), head


def merge_prometheus(pages: list[bytes]) -> bytes:
    """Prometheus text pages as one: each family's HELP/TYPE lines once (from the first
    page that has it), then its samples from every page."""
    order: list[bytes] = []
    headers: dict[bytes, list[bytes]] = {}
    samples: dict[bytes, list[bytes]] = {}
    for page in pages:
        family = b""
        for line in page.splitlines():
            if not line.strip():
                continue
            parts = line.split()
            if line.startswith((b"# HELP ", b"# TYPE ")) and len(parts) > 2:
                family = parts[2]
                if family not in headers:
                    order.append(family)
                    headers[family], samples[family] = [], []
                if not any(h.split()[:3] == parts[:3] for h in headers[family]):
                    headers[family].append(line)
                continue
            if family not in samples:
                order.append(family)
                headers[family], samples[family] = [], []
            samples[family].append(line)
    return b"".join(line + b"\n" for family in order
                    for line in headers[family] + samples[family])


def _fields(lines: list[bytes]) -> dict[bytes, bytes]:
    """Header fields by lower-case name; repeated ones joined with commas."""
    fields: dict[bytes, bytes] = {}
    for line in lines:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key:
            fields[key] = fields[key] + b"," + value.strip() if key in fields else value.strip()
    return fields


def _values(lines: list[bytes], name: bytes) -> list[str]:
    """The value of each header line named ``name`` (lower case), as rest.py's
    ``headers.get_all`` gives them."""
    found = []
    for line in lines:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            found.append(value.strip().decode("latin-1"))
    return found


def _pass_chunked(client: _Reader, upstream: socket.socket, max_body: int) -> bool:
    """Passes a chunked body as far as rest.py reads it; whether it read it all."""
    try:
        for wire, _ in chunked_parts(lambda n: client.line(n, HEADER_TIMEOUT),
                                     lambda n: client.take(n, HEADER_TIMEOUT), max_body):
            _send(upstream, wire)
    except HttpError:
        return False
    return True


def _model(target: bytes) -> str | None:
    path = urllib.parse.urlsplit(target.decode("latin-1")).path
    match = _MODEL.match(path)
    return urllib.parse.unquote(match.group(1)) if match else None


def _answer(sock: socket.socket, status: int, message: str) -> None:
    """An answer of the front's own (the request never reached a sandbox); closes."""
    body = json.dumps({"error": message}).encode()
    reason = {400: "Bad Request", 431: "Request Header Fields Too Large",
              503: "Service Unavailable"}[status]
    try:
        sock.settimeout(WRITE_TIMEOUT)
        sock.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
    except OSError:
        pass
