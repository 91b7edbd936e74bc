"""``serving-opt serve`` with the models in sandboxes: a SavedModel is code.

Each model of the server gets a sandbox of its own: a ``serving-opt serve`` process inside
bubblewrap (:mod:`serving_opt.sandbox`: its model directory read-only and no other, no
network of its own, uid 65534 without capabilities, no procfs, memory and thread limits),
so no model sees another model's files, whatever its ops read. What TF Serving's clients
reach stays on the host, held by this process, which never imports TensorFlow:

* gRPC: a router (:mod:`serving_opt.serving.front.grpc_router`) passes each call, as bytes,
  to the sandbox of the model it names, over that sandbox's unix socket;
* REST: a front end (:mod:`serving_opt.serving.front.rest_front`) with bounded
  connections and timeouts does the same by the model in the path.

Ports are bound before anything loads (a busy port is an error at once) and open once
every model is AVAILABLE, as upstream's. SIGTERM or Ctrl-C stops the sandboxed servers
cleanly (they see their parent pipe close); if this process dies, bubblewrap's
``--die-with-parent`` takes the sandboxes with it; if one sandboxed server stops, serve
stops with its exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import resource
import shutil
import signal
import socket
import stat
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
_STOP_GRACE_SECONDS = 30.0
_ROUTER_GRACE_SECONDS = 5.0
# Descriptors this process may hold: each REST connection costs two (client, sandbox).
_WANTED_DESCRIPTORS = 1 << 16


@dataclass(frozen=True)
class Endpoints:
    """Where clients reach the sandboxed servers: host, gRPC port, REST port (None: no
    REST; 0 here and for gRPC: a free port), and the user's gRPC unix socket path ("" for
    none)."""

    host: str
    port: int
    rest_port: int | None
    grpc_socket_path: str = ""


@dataclass(frozen=True)
class Tenant:
    """One sandbox: the model it serves (None: a config with no model), the flags that
    name it (``--model_name/--model_base_path``), or the text of a config file listing it
    alone, and the host paths it reads."""

    name: str | None
    read_only: tuple[str, ...]
    model_flags: tuple[str, ...] = ()
    config_text: str = ""


def _checked_base(base: str) -> str:
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
    return os.path.abspath(base)


def tenants(model_name: str, model_base_path: str | None,
            model_config_file: str | None) -> list[Tenant]:
    """One :class:`Tenant` per model of the server. Raises UsageError for a remote or
    missing base path (the sandbox has no network, and binds what exists at start), and
    ServingStatusError for a config file upstream refuses."""
    if not model_config_file:
        base = _checked_base(model_base_path or "")
        return [Tenant(model_name, (base,),
                       model_flags=(f"--model_name={model_name}", f"--model_base_path={base}"))]
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from serving_opt.model_server import model_config

    config = model_config.read_config_file(model_config_file)
    models = model_config.model_configs(config)
    bases = [_checked_base(m.base_path) for m in models]
    model_config.validate(config)
    if not models:
        return [Tenant(None, (), config_text=text_format.MessageToString(config))]
    found = []
    for model, base in zip(models, bases):
        alone = model_server_config_pb2.ModelServerConfig()
        alone.model_config_list.config.add().CopyFrom(model)
        found.append(Tenant(model.name, (base,), config_text=text_format.MessageToString(alone)))
    return found


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


def _bind_unix(path: str) -> socket.socket:
    """Binds ``path``; a socket file already there is removed first, as gRPC (and so TF
    Serving) does at bind: a crashed or killed server leaves one behind."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
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


def _unlink_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def _more_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_DESCRIPTORS if hard == resource.RLIM_INFINITY else \
        min(hard, _WANTED_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _connection_limits(grpc_limit: int, rest_limit: int) -> tuple[int, int]:
    """Connection limits for the gRPC and REST ports within this process's descriptors:
    each port may take a quarter of them (a REST connection costs two), so neither runs
    the other out of descriptors, whatever clients hold."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    share = (1 << 20) if soft == resource.RLIM_INFINITY else max(32, soft) // 4
    return min(grpc_limit, share), min(rest_limit, share // 2)


class _Child:
    """One sandboxed ``serving-opt serve`` and its private directory."""

    def __init__(self, tenant: Tenant, run_dir: str, rest: bool) -> None:
        self.tenant = tenant
        self.run_dir = run_dir
        os.mkdir(run_dir, 0o700)
        self.grpc_path = os.path.join(run_dir, "grpc.sock")
        self.rest_path = os.path.join(run_dir, "rest.sock")
        # Bound here, listened on by the sandboxed server once its model is loaded.
        self.rest = _bind_unix(self.rest_path) if rest else None
        self.process: subprocess.Popen | None = None
        self.models = ""

    def start(self, common_flags: Sequence[str], policy: sandbox.Policy, watch_fd: int) -> None:
        flags = list(self.tenant.model_flags)
        if not flags:
            config = os.path.join(self.run_dir, "models.config")
            with open(config, "w") as f:
                f.write(self.tenant.config_text)
            flags = [f"--model_config_file={config}"]
        argv = [sys.executable, "-m", "serving_opt.cli", "serve", *common_flags, *flags,
                "--host=127.0.0.1", "--port=0", f"--grpc_socket_path={self.grpc_path}",
                f"--parent_pipe_fd={watch_fd}"]
        fds = [watch_fd]
        if self.rest is not None:
            argv += ["--rest_api_port=-1", f"--rest_api_fd={self.rest.fileno()}"]
            fds.append(self.rest.fileno())
        policy = dataclasses.replace(policy, read_only=(*policy.read_only,
                                                        *self.tenant.read_only),
                                     writable=(self.run_dir,))
        self.process = sandbox.popen(argv, policy, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, pass_fds=fds)
        self._stderr = threading.Thread(target=_forward, args=(self.process.stderr, sys.stderr),
                                        daemon=True, name="serving-opt-sandbox-stderr")
        self._stderr.start()

    def watch(self, index: int, events: queue.Queue) -> None:
        """Reports ("ready", index) once the model is AVAILABLE, then ("exit", index,
        code) when the process ends."""
        assert self.process is not None
        for line in sandbox.bounded_lines(self.process.stdout, sandbox.MAX_LINE_BYTES):
            if line.startswith(READY_PREFIX) and _READY_MARK in line:
                self.models = line[len(READY_PREFIX):line.index(_READY_MARK)].strip()
                events.put(("ready", index))
                _drain(self.process.stdout)
                break
        events.put(("exit", index, self.process.wait()))

    def stop(self) -> int | None:
        if self.rest is not None:
            self.rest.close()
        if self.process is None:
            return None
        try:
            code = self.process.wait(timeout=_STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        sandbox.release(self.process)
        self._stderr.join(timeout=5)  # its last lines say why it stopped
        return code


class SandboxedServer:
    """The sandboxed ``serving-opt serve`` of each tenant and the host-side ports that
    reach them."""

    def __init__(self, endpoints: Endpoints, tenant_list: Sequence[Tenant],
                 child_flags: Sequence[str], policy: sandbox.Policy,
                 max_request_bytes: int = 2**31 - 1, grpc_threads: int = 128,
                 grpc_channel_arguments: str = "") -> None:
        # Held (bound, not listening) until every model is AVAILABLE; then the router
        # takes the port, and the REST front end listens on this very socket.
        self._grpc_hold: socket.socket | None = _bind(endpoints.host, endpoints.port)
        self._rest = (_bind(endpoints.host, endpoints.rest_port)
                      if endpoints.rest_port is not None else None)
        self._unix_hold: socket.socket | None = None
        if endpoints.grpc_socket_path:
            self._unix_hold = _bind_unix(endpoints.grpc_socket_path)
        self.endpoints = endpoints
        self.port = self._grpc_hold.getsockname()[1]
        self.rest_port = self._rest.getsockname()[1] if self._rest else 0
        self._run_dir = tempfile.mkdtemp(prefix="serving-opt-serve-")
        self._children = [_Child(t, os.path.join(self._run_dir, str(i)), self._rest is not None)
                          for i, t in enumerate(tenant_list)]
        self._child_flags = list(child_flags)
        self._policy = policy
        self._max_request_bytes = max_request_bytes
        self._grpc_threads = grpc_threads
        self._grpc_channel_arguments = grpc_channel_arguments
        self._events: queue.Queue = queue.Queue()
        self._router = None
        self._front = None
        self._watch_read, self._watch_write = os.pipe()
        self._stop_lock = threading.Lock()
        self._exit_code: int | None = None

    def start(self, on_ready: Callable[[str], None]) -> int | None:
        """Starts the sandboxed servers; returns None once all are ready (``on_ready``
        got the ready line), or the exit code of the first that stopped before that."""
        for index, child in enumerate(self._children):
            child.start(self._child_flags, self._policy, self._watch_read)
            threading.Thread(target=child.watch, args=(index, self._events), daemon=True,
                             name="serving-opt-sandbox-watch").start()
        os.close(self._watch_read)
        waiting = len(self._children)
        while waiting:
            event = self._events.get()
            if event[0] == "exit":
                self._exit_code = event[2]
                return event[2]
            waiting -= 1
        self._open()
        on_ready(self._ready_line())
        return None

    def _open(self) -> None:
        from serving_opt.serving.front import grpc_router, rest_front

        grpc_limit, rest_limit = _connection_limits(grpc_router.MAX_CONNECTIONS,
                                                    rest_front.MAX_CONNECTIONS)
        router = grpc_router.Router(
            {child.tenant.name: child.grpc_path for child in self._children},
            [child.tenant.name for child in self._children], self._max_request_bytes,
            # --grpc_max_threads bounds the calls the sandboxed servers run at once;
            # past 4x that, a call is RESOURCE_EXHAUSTED instead of queueing without end.
            4 * self._grpc_threads, grpc_limit, self._grpc_channel_arguments)
        self._router = router
        host, port = self.endpoints.host, self.port
        assert self._grpc_hold is not None
        self._grpc_hold.close()  # the router binds the port it held
        self._grpc_hold = None
        addresses = [_address(host, port)]
        if self._unix_hold is not None:
            self._unix_hold.close()
            _unlink_socket(self.endpoints.grpc_socket_path)
            self._unix_hold = None
            addresses.append(f"unix:{self.endpoints.grpc_socket_path}")
        for address in addresses:
            try:
                bound = router.add_insecure_port(address)
            except RuntimeError:
                bound = 0
            if not bound:
                raise ServingOptError(f"could not listen on {address} once the models were "
                                      "loaded: another process took it",
                                      "pick another port (0 chooses a free one)")
        router.start()
        if self._rest is not None:
            paths = {child.tenant.name: child.rest_path for child in self._children}
            first = self._children[0].rest_path
            self._front = rest_front.RestFront(
                self._rest, lambda name: paths.get(name, first), self._max_request_bytes,
                rest_limit, everyone=tuple(child.rest_path for child in self._children))
            self._front.start()

    def _ready_line(self) -> str:
        models = "; ".join(child.models for child in self._children)
        host = self.endpoints.host
        rest = f", REST on {_address(host, self.rest_port)}" if self.rest_port else ""
        unix = (f", gRPC also on unix:{self.endpoints.grpc_socket_path}"
                if self.endpoints.grpc_socket_path else "")
        return (f"{READY_PREFIX} {models}{_READY_MARK}{_address(host, self.port)}{rest}{unix} "
                "(local TF-Serving-compatible server, models sandboxed)")

    def wait(self) -> int:
        """Blocks until a sandboxed server exits; its exit code."""
        while self._exit_code is None:
            event = self._events.get()
            if event[0] == "exit":
                self._exit_code = event[2]
        return self._exit_code

    def stop(self) -> int | None:
        """Closes the ports, lets the sandboxed servers stop cleanly (each killed after
        :data:`_STOP_GRACE_SECONDS`); the first exit code. Idempotent, from any thread."""
        with self._stop_lock:
            return self._stop()

    def _stop(self) -> int | None:
        if self._front is not None:
            self._front.close()
            self._front = None
        if self._router is not None:
            self._router.stop(_ROUTER_GRACE_SECONDS)
            self._router = None
        for sock in (self._grpc_hold, self._rest, self._unix_hold):
            if sock is not None:
                sock.close()
        if self.endpoints.grpc_socket_path:
            _unlink_socket(self.endpoints.grpc_socket_path)
        if self._watch_write >= 0:
            os.close(self._watch_write)  # the sandboxed servers' parent pipe: EOF, they stop
            self._watch_write = -1
        codes = [child.stop() for child in self._children]
        shutil.rmtree(self._run_dir, ignore_errors=True)
        if self._exit_code is None:
            self._exit_code = next((c for c in codes if c), codes[0] if codes else None)
        return self._exit_code


def _forward(stream, out) -> None:
    """A sandboxed server's log lines, each bounded and printable only."""
    for line in sandbox.bounded_lines(stream, sandbox.MAX_LINE_BYTES):
        print("".join(c if c.isprintable() or c == "\t" else "?" for c in line),
              file=out, flush=True)


def _drain(stream) -> None:
    for _ in sandbox.bounded_lines(stream, sandbox.MAX_LINE_BYTES):
        pass


def serve_sandboxed(endpoints: Endpoints, tenant_list: Sequence[Tenant],
                    child_flags: Sequence[str], policy: sandbox.Policy,
                    max_request_bytes: int = 2**31 - 1, grpc_threads: int = 128,
                    grpc_channel_arguments: str = "") -> int:
    """Runs a :class:`SandboxedServer` until SIGTERM/SIGINT or until a sandboxed server
    exits; the exit code ``serving-opt serve`` returns (128 + the signal on a stop before
    the models were loaded, as the in-process server)."""
    _more_descriptors()
    server = SandboxedServer(endpoints, tenant_list, child_flags, policy,
                             max_request_bytes, grpc_threads, grpc_channel_arguments)
    received: list[int] = []
    ready = threading.Event()

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        threading.Thread(target=server.stop, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print("serving-opt serve: models run in bubblewrap, one sandbox per model "
              "(read-only model directory, no network of their own, uid 65534 without "
              "capabilities)", file=sys.stderr, flush=True)

        def on_ready(line: str) -> None:
            ready.set()
            print(line, flush=True)

        try:
            early = server.start(on_ready)
        except BaseException:
            server.stop()
            raise
        code = server.wait() if early is None else early
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
            print(f"serving-opt serve: a sandboxed server was killed ({name}"
                  f"{': out of memory?' if -code == signal.SIGKILL else ''})",
                  file=sys.stderr, flush=True)
            return 128 - code
        return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
