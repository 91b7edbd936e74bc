"""HTTP/1.1 connections and request bodies, for the REST port (rest.py) and the host's
front end that relays to it (serving/front/rest_front.py): both bound their connections
with :class:`Connections` and frame bodies with :func:`body_framing` and
:func:`chunked_parts`, so the front stops passing a body exactly where rest.py refuses
it. Imports neither TensorFlow nor the protos (the front's process never loads them).

Bodies are framed by ``Transfer-Encoding: chunked`` or ``Content-Length`` and bounded:
over ``max_bytes`` is 413 before the rest is read, a ``Content-Length`` that is not a
byte count or malformed chunking is 400, another transfer coding 501.

The REST port's connections: bounded in number and in time, and an accept loop that
nothing a client does can stop.

Upstream's libevent front end holds a connection without a thread and drops it after
50 s without progress (evhttp's default timeout). Here each connection has a thread, so
their number is bounded (:class:`~request_options.RestLimits`); past the bound a new
connection takes the place of the one that has waited longest for a request head (an
idle keep-alive connection, or a head still arriving): HTTP lets a server close those at
any time. When every connection is busy with a request, the new one is answered 503 and
closed by the accepting thread, which never starts a thread for it. Time bounds: the
wait for a request's first byte (idle), the whole head once it started (so a head sent a
byte at a time cannot hold a thread; at most MAX_HEAD_BYTES of it), and each read of
the body (no progress). Running
out of descriptors (EMFILE) lowers the bound for good, to leave some to the model and
gRPC, and the accept loop goes on after a short back-off.
"""

from __future__ import annotations

import errno
import io
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from http.server import ThreadingHTTPServer

from serving_opt.model_server.request_options import DEFAULT_REST_LIMITS

log = logging.getLogger("serving_opt.model_server")

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Connection: close\r\nContent-Length: 65\r\n\r\n"
         b'{"error": "too many open REST connections, all of them in use"}\r\n')
assert len(_BUSY.split(b"\r\n\r\n", 1)[1]) == 65
# accept() errors that say the process is out of something for a while: wait, then go on.
_SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_BACKOFF_SECONDS = 0.05
_DESCRIPTOR_HEADROOM = 16  # left to the rest of the process after running out
# What a connection may hold of a request head (with what the read buffer takes of the
# body behind it): http.server alone allows 100 lines of 64 KiB, 6.5 MB a connection.
MAX_HEAD_BYTES = 128 << 10
READ_BUFFER_BYTES = 16 << 10


CHUNKED = "chunked"
# What a connection is doing, for eviction: waiting for a request to start (IDLE), reading
# one from the client (CLIENT), or being served (BUSY).
IDLE, CLIENT, BUSY = "idle", "client", "busy"
PIECE_BYTES = 1 << 20  # a body is read in pieces of at most this: never a declared size
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")  # more digits overflow int64 (upstream's type)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
MAX_CHUNK_LINE = 4096  # a chunk-size line with its extensions
MAX_TRAILERS = 100


class HttpError(Exception):
    """A request the HTTP layer refuses before the API sees it: (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The connection ended in the middle of a body: nobody to answer."""


def body_framing(transfer_encodings: list[str], content_lengths: list[str],
                 max_bytes: int) -> int | str:
    """The body's size in bytes, or CHUNKED, from the values of every
    ``Transfer-Encoding`` and ``Content-Length`` line of a head. Raises HttpError (501,
    400 or 413) for a body that is refused from the head alone."""
    if transfer_encodings:
        coding = ", ".join(transfer_encodings)
        codings = [c.strip().lower() for c in coding.split(",") if c.strip()]
        if codings != ["chunked"]:
            raise HttpError(
                501, f"Transfer-Encoding: {coding!r} is not supported; send the body as is "
                "or chunked"
            )
        return CHUNKED  # RFC 9112: chunked framing wins over any Content-Length
    lengths = {v.strip() for v in content_lengths}
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise HttpError(400, f"conflicting Content-Length headers: {', '.join(sorted(lengths))}")
    text = lengths.pop()
    if not _CONTENT_LENGTH.fullmatch(text):
        if text.isascii() and text.isdigit():
            raise HttpError(413, f"request body of {text} bytes is over the {max_bytes}-byte "
                                 "limit (--max_request_bytes)")
        raise HttpError(400, f"Content-Length: {text!r} is not a number of bytes")
    length = int(text)
    if length > max_bytes:
        raise HttpError(413, f"request body of {length} bytes is over the {max_bytes}-byte "
                             "limit (--max_request_bytes)")
    return length


def fixed_parts(read: Callable[[int], bytes], length: int) -> Iterator[bytes]:
    """A ``length``-byte body in the pieces ``read(n)`` gives (at most n bytes; empty at
    the end of the connection: ClientGone)."""
    while length > 0:
        piece = read(min(length, PIECE_BYTES))
        if not piece:
            raise ClientGone()
        length -= len(piece)
        yield piece


def chunked_parts(readline: Callable[[int], bytes], read: Callable[[int], bytes],
                  max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """A chunked body as (bytes as they came, whether they are body data), each yielded
    before it is checked: a relay passes what a server refusing it would have read.
    Raises HttpError for malformed chunking (400) or a body over ``max_bytes`` (413),
    ClientGone when the connection ends first."""
    total = 0
    while True:
        line = readline(MAX_CHUNK_LINE + 1)
        if not line:
            raise ClientGone()
        yield line, False
        if not line.endswith(b"\n"):
            raise HttpError(400, "malformed chunked body: chunk size line too long")
        size_text = line.split(b";", 1)[0].strip()  # chunk extensions are ignored
        if not _CHUNK_SIZE.fullmatch(size_text):
            shown = size_text[:32].decode("latin-1")
            raise HttpError(400, f"malformed chunked body: bad chunk size line {shown!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        total += size
        if total > max_bytes:
            raise HttpError(413, f"chunked request body is over the {max_bytes}-byte limit "
                                 "(--max_request_bytes)")
        for piece in fixed_parts(read, size):
            yield piece, True
        end = readline(3)
        yield end, False
        if end not in (b"\r\n", b"\n"):
            raise HttpError(400, "malformed chunked body: chunk data not followed by CRLF")
    for _ in range(MAX_TRAILERS):  # trailer fields, dropped, up to the empty line
        line = readline(MAX_CHUNK_LINE + 1)
        if not line:
            raise ClientGone()
        yield line, False
        if line in (b"\r\n", b"\n"):
            return
    raise HttpError(400, f"malformed chunked body: more than {MAX_TRAILERS} trailer lines")


class SocketWriter(io.BufferedIOBase):
    """Writes to a socket whole (sendall): a raw socket file may write part of what it
    is given when the socket has a timeout."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.sendall(data)
        return len(data)


class HeadTooLarge(OSError):
    """More than MAX_HEAD_BYTES arrived without a complete request head."""


class DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by a deadline for the whole phase (a request
    head, also bounded to MAX_HEAD_BYTES) or, with ``deadline`` None, by ``idle`` seconds
    without data (a body)."""

    def __init__(self, sock: socket.socket, idle: float) -> None:
        super().__init__()
        self._sock = sock
        self.idle = idle
        self.deadline: float | None = None
        self.head_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is None:
            self._sock.settimeout(self.idle)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request head did not arrive in time")
            self._sock.settimeout(left)
        count = self._sock.recv_into(buffer)
        if self.deadline is not None:
            self.head_bytes += count
            if self.head_bytes > MAX_HEAD_BYTES:
                raise HeadTooLarge(f"no complete request head in {MAX_HEAD_BYTES} bytes")
        return count


class Connections:
    """The open connections, each IDLE, CLIENT or BUSY, oldest state change first. Past
    ``limit`` a new one takes the place of the oldest connection of the first tier (a
    tuple of states) that has one; each key is closed by ``close`` (which must wake its
    thread). Thread-safe."""

    def __init__(self, limit: int, close: Callable[[Hashable], None] | None = None) -> None:
        self.limit = limit
        self._close = close or _shut
        self._lock = threading.Lock()
        self._states: dict[Hashable, str] = {}  # oldest state change first
        self.most_open = 0  # the high-water mark, for tests and logs

    def __len__(self) -> int:
        return len(self._states)

    def waiting_count(self) -> int:
        """How many are IDLE."""
        with self._lock:
            return sum(state == IDLE for state in self._states.values())

    def admit(self, key: Hashable, tiers: tuple[tuple[str, ...], ...] = ((IDLE,),)) -> bool:
        """Takes ``key`` in (IDLE), first closing a connection of ``tiers`` if at the
        limit; False when at the limit with none to close."""
        with self._lock:
            if len(self._states) >= self.limit and not self._evict(tiers):
                return False
            self._states[key] = IDLE
            self.most_open = max(self.most_open, len(self._states))
            return True

    def enter(self, key: Hashable, state: str) -> bool:
        """``key`` is now in ``state``; False if it was closed meanwhile."""
        with self._lock:
            old = self._states.get(key)
            if old is None:
                return False
            if old != state:
                del self._states[key]
                self._states[key] = state
            return True

    def waiting(self, key: Hashable) -> bool:
        """``key`` now waits for a request head; False if it was closed meanwhile."""
        return self.enter(key, IDLE)

    def busy(self, key: Hashable) -> bool:
        """``key`` has a whole request head; False if it was closed meanwhile."""
        return self.enter(key, BUSY)

    def evict(self, tiers: tuple[tuple[str, ...], ...]) -> bool:
        """Closes the oldest connection of the first tier that has one; whether one was."""
        with self._lock:
            return self._evict(tiers)

    def shrink(self, headroom: int) -> None:
        """The process ran out of descriptors: from now on keep ``headroom`` fewer
        connections than are open, closing IDLE ones to get there, so that the model
        and gRPC get descriptors again."""
        with self._lock:
            self.limit = max(1, min(self.limit, len(self._states) - headroom))
            while len(self._states) > self.limit and self._evict(((IDLE,),)):
                pass

    def _evict(self, tiers) -> bool:
        for states in tiers:
            oldest = next((k for k, s in self._states.items() if s in states), None)
            if oldest is not None:
                del self._states[oldest]
                self._close(oldest)  # its thread's read returns: the thread ends
                return True
        return False

    def release(self, key: Hashable) -> None:
        with self._lock:
            self._states.pop(key, None)

    def close_all(self) -> None:
        with self._lock:
            keys = list(self._states)
            self._states.clear()
        for key in keys:
            self._close(key)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _refuse(sock: socket.socket) -> None:
    """503 and close, from the accepting thread: never blocks, never starts a thread."""
    try:
        sock.setblocking(False)
        sock.send(_BUSY)
    except OSError:
        pass
    _shut(sock)
    sock.close()


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with bounded connections (:class:`Connections`) and an accept
    loop that backs off and goes on after any per-connection error."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    limits = DEFAULT_REST_LIMITS

    def server_activate(self) -> None:
        super().server_activate()
        self.connections = Connections(self.limits.connection_limit())

    def get_request(self):
        try:
            return super().get_request()
        except OSError as e:
            if e.errno in _SCARCE:
                # Out of descriptors: leave some to the rest of the process for good,
                # and do not spin on the listening socket, still readable.
                self.connections.shrink(_DESCRIPTOR_HEADROOM)
                log.warning("REST accept failed (%s); at most %d connections from now on",
                            e, self.connections.limit)
                time.sleep(_ACCEPT_BACKOFF_SECONDS)
            raise  # socketserver drops this one accept and goes on

    def process_request(self, request, client_address) -> None:
        if not self.connections.admit(request):
            _refuse(request)
            return
        super().process_request(request, client_address)  # on error: shutdown_request

    def shutdown_request(self, request) -> None:
        self.connections.release(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        log.warning("REST connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        if hasattr(self, "connections"):
            self.connections.close_all()
