"""``serving-opt serve`` with the models in a sandbox: a SavedModel is code.

The server that loads and runs the models is a ``serving-opt serve`` process inside
bubblewrap (:mod:`serving_opt.sandbox`: the model directories read-only, no network of
its own, uid 65534 without capabilities, no procfs, memory and thread limits). What
TF Serving's clients reach stays on the host, held by this process:

* REST: the port is bound here, in the host's network, and the bound socket is handed
  to the sandboxed server, which accepts on it directly (no copy, no extra hop);
* gRPC: gRPC cannot serve an inherited socket, so the sandboxed server listens on a unix
  socket in a private directory and this process relays each connection's bytes
  between the host's port (and ``--grpc_socket_path``) and that socket.

Ports are bound before anything loads (a busy port is an error at once) and open once
the models are AVAILABLE, as upstream's. SIGTERM or Ctrl-C stops the sandboxed server
cleanly (it sees its parent pipe close); if this process dies, bubblewrap's
``--die-with-parent`` takes the sandbox with it.

    code = serve_sandboxed(options, child_flags=["--model_name=m", ...], policy=...)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving_opt import sandbox
from serving_opt.errors import ServingOptError, UsageError

# model_server.server's READY_PREFIX and address format, not imported: that module
# imports TensorFlow, which this host-side process never does.
READY_PREFIX = "serving-opt serve:"
_READY_MARK = " AVAILABLE on "
MAX_CONNECTIONS = 1024  # relayed gRPC connections at once (two threads each)
_CHUNK = 1 << 18
_STOP_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Endpoints:
    """Where clients reach the sandboxed server: host, gRPC port, REST port (None: no
    REST; 0 here and for gRPC: a free port), and the user's gRPC unix socket path ("" for
    none)."""

    host: str
    port: int
    rest_port: int | None
    grpc_socket_path: str = ""


def model_paths(model_base_path: str | None, model_config_file: str | None,
                batching_parameters_file: str | None) -> list[str]:
    """The host paths the sandboxed server reads: the model base paths (of the config
    file, when given), the config file and the batching parameters file. Raises
    UsageError for a remote base path (the sandbox has no network).

    Example:
        >>> model_paths("/models/m", None, None)
        ['/models/m']
    """
    paths: list[str] = []
    bases = [model_base_path] if model_base_path and not model_config_file else []
    if model_config_file:
        from serving_opt.serving.model_server import model_config

        config = model_config.read_config_file(model_config_file)
        bases = [c.base_path for c in config.model_config_list.config]
        paths.append(os.path.abspath(model_config_file))
    for base in bases:
        if "://" in base:
            raise UsageError(
                f"base path {base} is remote; the sandboxed server has no network",
                "copy the model to a local directory, or pass --allow_unsandboxed for a "
                "model you trust")
        if not os.path.isdir(base):
            raise UsageError(
                f"base path {base} is not a directory; the sandboxed server sees the model "
                "directories that exist when it starts",
                "create it (with version directories 1/, 2/, ...) before starting the server")
        paths.append(os.path.abspath(base))
    if batching_parameters_file:
        paths.append(os.path.abspath(batching_parameters_file))
    return paths


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServingOptError(
            f"could not listen on {_address(host, port)}: {e.strerror or e}",
            "the port is in use or the host is not a local address; pick another port "
            "(0 chooses a free one) or --host") from None
    return sock


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class _Relay:
    """Accepts on ``listener`` and relays each connection, byte for byte, to a new
    connection from ``connect`` (the sandboxed server's unix socket)."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self._listener = listener
        self._connect = connect
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name="serving-opt-relay",
                                        daemon=True)

    def start(self) -> None:
        self._listener.listen(128)
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                client.close()  # over MAX_CONNECTIONS: the client retries
                continue
            threading.Thread(target=self._relay, args=(client,), daemon=True,
                             name="serving-opt-relay-conn").start()

    def _relay(self, client: socket.socket) -> None:
        try:
            if client.family in (socket.AF_INET, socket.AF_INET6):
                # gRPC's own sockets do this: without it small frames wait for Nagle.
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                upstream = self._connect()
            except OSError:
                return
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
            upstream.close()
        finally:
            client.close()
            self._slots.release()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copies until ``source`` ends, then ends ``target``'s side (a half-close, as TCP)."""
    try:
        if hasattr(os, "splice"):
            _splice(source, target)
        else:
            _copy(source, target)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def _splice(source: socket.socket, target: socket.socket) -> None:
    # Through a pipe inside the kernel: the bytes of a 300 KB tensor never reach Python.
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):
            import fcntl

            fcntl.fcntl(write_end, 1031, _CHUNK)  # F_SETPIPE_SZ: fewer round trips
        while True:
            count = os.splice(source.fileno(), write_end, _CHUNK)
            if not count:
                return
            while count:
                count -= os.splice(read_end, target.fileno(), count)
    finally:
        os.close(read_end)
        os.close(write_end)


def _copy(source: socket.socket, target: socket.socket) -> None:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    while True:
        count = source.recv_into(buffer)
        if not count:
            return
        target.sendall(view[:count])


class SandboxedServer:
    """A sandboxed ``serving-opt serve`` and the host-side ports that reach it.

    Example:
        >>> server = SandboxedServer(Endpoints("127.0.0.1", 8500, 8501), flags, policy)
        >>> server.start(print)     # returns once the models are AVAILABLE
        >>> server.stop()
    """

    def __init__(self, endpoints: Endpoints, child_flags: Sequence[str],
                 policy: sandbox.Policy) -> None:
        self._grpc = _bind(endpoints.host, endpoints.port)
        self._rest = (_bind(endpoints.host, endpoints.rest_port)
                      if endpoints.rest_port is not None else None)
        self._unix: socket.socket | None = None
        if endpoints.grpc_socket_path:
            self._unix = _bind_unix(endpoints.grpc_socket_path)
        self.endpoints = endpoints
        self.port = self._grpc.getsockname()[1]
        self.rest_port = self._rest.getsockname()[1] if self._rest else 0
        self._run_dir = tempfile.mkdtemp(prefix="serving-opt-serve-")
        self._socket_path = os.path.join(self._run_dir, "grpc.sock")
        self._child_flags = list(child_flags)
        self._policy = policy
        self._relays: list[_Relay] = []
        self._watch_read, self._watch_write = os.pipe()
        self._stop_lock = threading.Lock()
        self.process: subprocess.Popen | None = None

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "serving_opt.cli", "serve", *self._child_flags,
                "--host=127.0.0.1", "--port=0", f"--grpc_socket_path={self._socket_path}",
                f"--parent_pipe_fd={self._watch_read}"]
        if self._rest is not None:
            argv += ["--rest_api_port=-1", f"--rest_api_fd={self._rest.fileno()}"]
        return argv

    def start(self, on_ready: Callable[[str], None]) -> int | None:
        """Starts the sandboxed server; returns None once it is ready (``on_ready`` got
        the ready line), or its exit code when it stopped before that."""
        policy = dataclasses.replace(self._policy, writable=(self._run_dir,))
        fds = [self._watch_read] + ([self._rest.fileno()] if self._rest is not None else [])
        self.process = sandbox.popen(self._argv(), policy, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, pass_fds=fds)
        os.close(self._watch_read)
        self._stderr = threading.Thread(target=_forward, args=(self.process.stderr, sys.stderr),
                                        daemon=True, name="serving-opt-sandbox-stderr")
        self._stderr.start()
        for line in sandbox.bounded_lines(self.process.stdout, sandbox.MAX_LINE_BYTES):
            if line.startswith(READY_PREFIX) and _READY_MARK in line:
                self._open()
                on_ready(self._ready_line(line))
                threading.Thread(target=_drain, args=(self.process.stdout,), daemon=True).start()
                return None
        return self.process.wait()

    def _open(self) -> None:
        def connect() -> socket.socket:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._socket_path)
            return upstream

        for listener in (self._grpc, self._unix):
            if listener is not None:
                relay = _Relay(listener, connect)
                relay.start()
                self._relays.append(relay)

    def _ready_line(self, child_line: str) -> str:
        models = child_line[len(READY_PREFIX):child_line.index(_READY_MARK)].strip()
        host = self.endpoints.host
        rest = f", REST on {_address(host, self.rest_port)}" if self.rest_port else ""
        unix = (f", gRPC also on unix:{self.endpoints.grpc_socket_path}"
                if self.endpoints.grpc_socket_path else "")
        return (f"{READY_PREFIX} {models}{_READY_MARK}{_address(host, self.port)}{rest}{unix} "
                "(local TF-Serving-compatible server, models sandboxed)")

    def wait(self) -> int:
        """Blocks until the sandboxed server exits; its exit code."""
        assert self.process is not None
        return self.process.wait()

    def stop(self) -> int | None:
        """Closes the ports, lets the sandboxed server stop cleanly (killed after
        :data:`_STOP_GRACE_SECONDS`); its exit code. Idempotent, from any thread."""
        with self._stop_lock:
            return self._stop()

    def _stop(self) -> int | None:
        for relay in self._relays:
            relay.close()
        self._relays = []
        for sock in (self._grpc, self._rest, self._unix):
            if sock is not None:
                sock.close()
        if self._unix is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.endpoints.grpc_socket_path)
        if self._watch_write >= 0:
            os.close(self._watch_write)  # the sandboxed server's parent pipe: EOF, it stops
            self._watch_write = -1
        code = None
        if self.process is not None:
            try:
                code = self.process.wait(timeout=_STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
            sandbox.release(self.process)
            self._stderr.join(timeout=5)  # its last lines say why it stopped
        shutil.rmtree(self._run_dir, ignore_errors=True)
        return code


def _bind_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ServingOptError(
            f"could not listen on the unix socket {path}: {e.strerror or e}",
            "give --grpc_socket_path a path in an existing, writable directory where no "
            "file of that name exists") from None
    return sock


def _forward(stream, out) -> None:
    """The sandboxed server's log lines, each bounded and printable only."""
    for line in sandbox.bounded_lines(stream, sandbox.MAX_LINE_BYTES):
        print("".join(c if c.isprintable() or c == "\t" else "?" for c in line),
              file=out, flush=True)


def _drain(stream) -> None:
    for _ in sandbox.bounded_lines(stream, sandbox.MAX_LINE_BYTES):
        pass


def serve_sandboxed(endpoints: Endpoints, child_flags: Sequence[str],
                    policy: sandbox.Policy) -> int:
    """Runs a :class:`SandboxedServer` until SIGTERM/SIGINT or until it exits; the exit
    code ``serving-opt serve`` returns (128 + the signal on a stop before the models
    were loaded, as the in-process server).

    Example:
        >>> serve_sandboxed(Endpoints("127.0.0.1", 8500, None), ["--model_name=m",
        ...                 "--model_base_path=/models/m"], Policy(read_only=("/models/m",)))
    """
    server = SandboxedServer(endpoints, child_flags, policy)
    received: list[int] = []
    ready = threading.Event()

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        threading.Thread(target=server.stop, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print("serving-opt serve: models run in bubblewrap (read-only model directories, "
              "no network of their own, uid 65534 without capabilities)", file=sys.stderr,
              flush=True)

        def on_ready(line: str) -> None:
            ready.set()
            print(line, flush=True)

        early = server.start(on_ready)
        if early is None:
            code = server.wait()
        else:
            code = early
        server.stop()
        if received:
            name = signal.Signals(received[0]).name
            if not ready.is_set():
                print(f"serving-opt serve: stopped ({name}) before the models were loaded",
                      file=sys.stderr, flush=True)
                return 128 + received[0]
            return 0
        if code < 0:  # killed (its own errors are its last lines, forwarded above)
            name = signal.Signals(-code).name
            print(f"serving-opt serve: the sandboxed server was killed ({name}"
                  f"{': out of memory?' if -code == signal.SIGKILL else ''})",
                  file=sys.stderr, flush=True)
            return 128 - code
        return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
