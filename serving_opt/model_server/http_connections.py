"""The REST port's connections: bounded in number and in time, and an accept loop that
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
import socket
import threading
import time
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
    """The open connections: which wait for a request head (and since when), which serve
    one. Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._waiting: dict[socket.socket, None] = {}  # oldest first
        self.most_open = 0  # the high-water mark, for tests and logs

    def __len__(self) -> int:
        return len(self._open)

    def waiting_count(self) -> int:
        """How many wait for a request head."""
        return len(self._waiting)

    def admit(self, sock: socket.socket) -> bool:
        """Takes ``sock`` in, closing the longest-waiting connection if at the limit;
        False when every connection is busy."""
        with self._lock:
            if len(self._open) >= self.limit and not self._evict_oldest():
                return False
            self._open.add(sock)
            self._waiting[sock] = None
            self.most_open = max(self.most_open, len(self._open))
            return True

    def shrink(self, headroom: int) -> None:
        """The process ran out of descriptors: from now on keep ``headroom`` fewer
        connections than are open, closing waiting ones to get there, so that the model
        and gRPC get descriptors again."""
        with self._lock:
            self.limit = max(1, min(self.limit, len(self._open) - headroom))
            while len(self._open) > self.limit and self._evict_oldest():
                pass

    def _evict_oldest(self) -> bool:
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        self._forget(oldest)
        _shut(oldest)  # its thread's read returns: the thread ends
        return True

    def waiting(self, sock: socket.socket) -> bool:
        """``sock`` now waits for a request head; False if it was closed meanwhile."""
        with self._lock:
            if sock not in self._open:
                return False
            self._waiting.pop(sock, None)
            self._waiting[sock] = None
            return True

    def busy(self, sock: socket.socket) -> bool:
        """``sock`` has a whole request head; False if it was closed meanwhile."""
        with self._lock:
            if sock not in self._open:
                return False
            self._waiting.pop(sock, None)
            return True

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._forget(sock)

    def close_all(self) -> None:
        with self._lock:
            for sock in list(self._open):
                self._forget(sock)
                _shut(sock)

    def _forget(self, sock: socket.socket) -> None:
        self._open.discard(sock)
        self._waiting.pop(sock, None)


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
