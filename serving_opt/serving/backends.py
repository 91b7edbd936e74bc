"""Model server backends: the real TF Serving (Docker or binary) or the local stand-in.

All three are a child process serving gRPC (and REST) on loopback ports, so one small class
handles starting, log capture and stopping (always, also on Ctrl-C): only the
command line differs. TFX's InfraValidator splits it the same way (a serving
binary + a runner); here the runner is always a local process.

A server never outlives the process that started it, even one killed with SIGKILL
(which runs no cleanup):

  * ``local``: the server inherits the read end of a pipe whose write end only we hold
    (``--parent_pipe_fd``); the kernel closes it when we die, the server reads EOF and
    stops. Works whichever thread started it, on any POSIX system.
  * ``binary``: ``tensorflow_model_server`` has no such flag, so the kernel's parent-death
    signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, set in the child before exec)
    stops it. The kernel sends it when the *thread* that started the server exits:
    start and stop a server from the same thread (validate does).
  * ``docker``: the ``docker run`` client gets the same parent-death SIGTERM and, not
    running in a TTY, proxies it to the container (``--sig-proxy``, on by default), which
    stops; ``--rm`` removes it. The client itself killed with SIGKILL (the OOM killer,
    ``kill -9`` of its whole process group) cannot proxy anything: the container keeps
    running until ``docker rm -f serving-opt-<id>`` (``docker ps --filter
    name=serving-opt-`` lists them). No Docker engine runs on the CI machines; the tests
    check this with a stand-in ``docker`` client.

The server's log is a temporary file unlinked as soon as it is opened (the server
writes to its descriptor, we read through our own), so nothing is left in /tmp even
when we are killed; :meth:`ServerProcess.log_tail` gives its last lines for error
messages, also after the server stopped.

  * ``docker``: ``docker run tensorflow/serving:<tag>`` with the model base mounted
    read-only at ``/models/<name>`` and free host ports mapped to 8500 (gRPC) and 8501
    (REST, which the image always serves).
  * ``binary``: ``tensorflow_model_server`` from PATH (``--rest_api_port``).
  * ``local``: ``serving-opt serve``, this project's TF-Serving-compatible server
    (same flags, same gRPC and REST APIs) for machines where neither of the above runs,
    run by the interpreter of the target TensorFlow (``runtime.Runtime``).

Each server says what it is (``ServerProcess.description``) and which TensorFlow answers
(``ServerProcess.tf_version``): the image tag's release for docker, ``tensorflow_model_server
--version``'s "TensorFlow Library" for the binary, and the stand-in's own interpreter for
local (confirmed by the ``TensorFlow X`` line ``serve`` logs when it prints one).
  * ``auto``: docker if a Docker engine answers, else the binary if on PATH, else local.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from serving_opt.errors import ServingOptError, UsageError

BACKENDS = ("auto", "docker", "binary", "local")
DEFAULT_IMAGE = "tensorflow/serving:2.20.0"  # the current TF Serving release
BINARY_NAME = "tensorflow_model_server"
CONTAINER_GRPC_PORT = 8500
CONTAINER_REST_PORT = 8501
CONTAINER_CONFIG_DIR = "/serving-opt-config"

# What each concrete backend is, for reports: a "local" pass is not a TF Serving pass.
BACKEND_NOTES = {
    "docker": "TF Serving (Docker image)",
    "binary": "TF Serving (tensorflow_model_server binary)",
    "local": "serving-opt's local TF-Serving-compatible server (a stand-in, not TF Serving)",
}


@dataclass(frozen=True)
class ServerSpec:
    """What to serve and how; the same for every backend.

    Example:
        >>> ServerSpec(model_name="clf", model_base="/models/clf")
    """

    model_name: str
    model_base: str
    port: int = 0  # 0 = pick a free loopback port
    image: str = DEFAULT_IMAGE
    saved_model_tags: str = "serve"
    enable_model_warmup: bool = True
    file_system_poll_wait_seconds: int = 1
    # TF Serving retries a failed initial load 5 times, 60 s apart, before exiting; a
    # validation run wants the failure now. Real tensorflow_model_server flag.
    max_num_load_retries: int = 0
    rest_api: bool = True  # also serve TF Serving's REST API (on its own free port)
    extra_flags: tuple[str, ...] = field(default_factory=tuple)
    # Serve this version only (a model config with a ``specific`` version policy): the
    # server must never load, and run the init op of, a version nobody checked.
    version: int | None = None


CONFIG_FILENAME = "models.config"


def model_config_text(spec: ServerSpec, base_path: str) -> str:
    """The text ModelServerConfig TF Serving reads with ``--model_config_file``.

    Example:
        >>> print(model_config_text(ServerSpec("clf", "/m/clf", version=3), "/m/clf"))
        model_config_list { config { name: "clf" base_path: "/m/clf" model_platform: ...
    """
    policy = (f" model_version_policy {{ specific {{ versions: {spec.version} }} }}"
              if spec.version is not None else "")
    return (f"model_config_list {{ config {{ name: {_quote(spec.model_name)} "
            f"base_path: {_quote(base_path)} model_platform: \"tensorflow\"{policy} }} }}\n")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_model_config(spec: ServerSpec, base_path: str) -> str:
    """Writes the config into a new private directory; returns the directory."""
    directory = tempfile.mkdtemp(prefix="serving-opt-config-")
    with open(os.path.join(directory, CONFIG_FILENAME), "w") as f:
        f.write(model_config_text(spec, base_path))
    return directory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Example:
        >>> 1024 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_flags(spec: ServerSpec, port: int, base: str, rest_port: int = 0,
                  config_file: str | None = None) -> list[str]:
    model = ([f"--model_config_file={config_file}"] if config_file else
             [f"--model_name={spec.model_name}", f"--model_base_path={base}"])
    return [
        f"--port={port}",
        f"--rest_api_port={rest_port}",
        *model,
        f"--file_system_poll_wait_seconds={spec.file_system_poll_wait_seconds}",
        f"--saved_model_tags={spec.saved_model_tags}",
        f"--enable_model_warmup={'true' if spec.enable_model_warmup else 'false'}",
        f"--max_num_load_retries={spec.max_num_load_retries}",
        *spec.extra_flags,
    ]


def docker_command(spec: ServerSpec, host_port: int, container_name: str,
                   rest_host_port: int = 0, config_dir: str | None = None) -> list[str]:
    """``docker run`` for tensorflow/serving: read-only model mount, loopback-only ports.

    Example:
        >>> docker_command(ServerSpec("clf", "/m/clf"), 9000, "so-1")[:4]
        ['docker', 'run', '--rm', '--name']
    """
    container_base = f"/models/{spec.model_name}"
    # The image's entrypoint passes MODEL_NAME/MODEL_BASE_PATH and then any extra args.
    args = [
        "docker", "run", "--rm", "--name", container_name,
        "-p", f"127.0.0.1:{host_port}:{CONTAINER_GRPC_PORT}",
        *(["-p", f"127.0.0.1:{rest_host_port}:{CONTAINER_REST_PORT}"] if rest_host_port else []),
        "-v", f"{os.path.abspath(spec.model_base)}:{container_base}:ro",
        *(["-v", f"{config_dir}:{CONTAINER_CONFIG_DIR}:ro"] if config_dir else []),
        "-e", f"MODEL_NAME={spec.model_name}",
        "-e", "MODEL_BASE_PATH=/models",
        spec.image,
        # The config file wins over the entrypoint's --model_name/--model_base_path.
        *([f"--model_config_file={CONTAINER_CONFIG_DIR}/{CONFIG_FILENAME}"] if config_dir
          else []),
        f"--file_system_poll_wait_seconds={spec.file_system_poll_wait_seconds}",
        f"--saved_model_tags={spec.saved_model_tags}",
        f"--enable_model_warmup={'true' if spec.enable_model_warmup else 'false'}",
        f"--max_num_load_retries={spec.max_num_load_retries}",
        *spec.extra_flags,
    ]
    return args


def binary_command(spec: ServerSpec, port: int, binary: str = BINARY_NAME,
                   rest_port: int = 0, config_file: str | None = None) -> list[str]:
    """``tensorflow_model_server`` with the usual flags.

    Example:
        >>> binary_command(ServerSpec("clf", "/m/clf"), 9000)[1]
        '--port=9000'
    """
    return [binary, *_server_flags(spec, port, os.path.abspath(spec.model_base), rest_port,
                                   config_file)]


def local_command(spec: ServerSpec, port: int, rest_port: int = 0,
                  python: str | None = None, config_file: str | None = None) -> list[str]:
    """``serving-opt serve`` (this project's TF-Serving-compatible server), same flags, run
    by ``python`` (the target TensorFlow's interpreter; default: this one).

    Example:
        >>> local_command(ServerSpec("clf", "/m/clf"), 9000)[4]
        '--port=9000'
    """
    return [python or sys.executable, "-m", "serving_opt.cli", "serve",
            *_server_flags(spec, port, os.path.abspath(spec.model_base), rest_port,
                          config_file)]


class ServerProcess:
    """A model server child process: started, logged to a file, always stopped.

    Example:
        >>> with ServerProcess("local", local_command(spec, 9000), 9000) as server:
        ...     server.address
        '127.0.0.1:9000'
    """

    def __init__(self, backend: str, command: Sequence[str], port: int,
                 cleanup: Sequence[str] | None = None, env: dict | None = None,
                 parent_pipe_flag: str | None = None, rest_port: int = 0,
                 description: str = "", tf_version: str = "",
                 temp_dirs: Sequence[str] = ()) -> None:
        self.backend = backend
        self.temp_dirs = list(temp_dirs)  # removed when the server stops (its config)
        self.command = list(command)
        self.port = port
        self.rest_port = rest_port  # 0: no REST API
        # What answers, for reports and markers: "docker:<image>", "binary:<path> <ver>",
        # "local:serving-opt serve (stand-in) on TensorFlow X".
        self.description = description or backend
        self.tf_version = tf_version
        self.cleanup = list(cleanup) if cleanup else None
        self.env = env
        # A flag taking a file descriptor: the server exits when that pipe reaches EOF.
        self.parent_pipe_flag = parent_pipe_flag
        self._process: subprocess.Popen | None = None
        self._pipe_write: int | None = None
        self._log, self._log_reader = _unlinked_log(f"serving-opt-{backend}-")
        self._tail = ""  # the log's last lines, kept once the log is closed

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def rest_address(self) -> str | None:
        return f"127.0.0.1:{self.rest_port}" if self.rest_port else None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> ServerProcess:
        command, pass_fds, preexec = self.command, (), None
        if self.parent_pipe_flag:
            read_end, self._pipe_write = os.pipe()  # neither end is inherited by default
            command = [*command, f"{self.parent_pipe_flag}={read_end}"]
            pass_fds = (read_end,)
        else:
            preexec = _die_with_parent()
        try:
            self._process = subprocess.Popen(
                command, stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env=self.env,
                pass_fds=pass_fds, preexec_fn=preexec,
            )
        except FileNotFoundError as e:
            self._close_pipe()
            self._remove_log()
            raise ServingOptError(
                f"cannot start the {self.backend} server: {self.command[0]} not found",
                "install it, or pick another --server (local always works)",
            ) from e
        finally:
            for fd in pass_fds:
                os.close(fd)  # the server's end; ours is the write end
        return self

    def _close_pipe(self) -> None:
        if self._pipe_write is not None:
            os.close(self._pipe_write)
            self._pipe_write = None

    def exit_code(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def log_tail(self, lines: int = 30) -> str:
        text = self._tail
        if not self._log_reader.closed:
            size = os.fstat(self._log_reader.fileno()).st_size
            self._log_reader.seek(max(0, size - _TAIL_BYTES))
            text = self._log_reader.read().decode(errors="replace")
        return "".join(text.splitlines(keepends=True)[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; runs the backend's cleanup command."""
        if self.cleanup:
            # docker: the client process dying does not stop the container; remove it.
            subprocess.run(self.cleanup, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False, timeout=30)
        try:
            self._terminate(timeout)
        finally:
            self._close_pipe()
            self._remove_log()
            for directory in self.temp_dirs:
                shutil.rmtree(directory, ignore_errors=True)

    def _terminate(self, timeout: float) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _remove_log(self) -> None:
        if self._log_reader.closed:
            return
        self._tail = self.log_tail(200)
        self._log.close()
        self._log_reader.close()

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 256 * 1024


def _unlinked_log(prefix: str):
    """(write file for the server, read file for us) of a log already unlinked."""
    directory = tempfile.mkdtemp(prefix=prefix)
    path = os.path.join(directory, "server.log")
    try:
        writer = open(path, "wb")  # noqa: SIM115 - lives as long as the server
        reader = open(path, "rb")  # noqa: SIM115 - its own offset, not the server's
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return writer, reader


def _die_with_parent():
    """A ``preexec_fn`` making the kernel SIGTERM the child when its parent dies (Linux).

    prctl is looked up here, in the parent: the child between fork and exec may only do
    async-signal-safe work (no dlopen). The parent-death signal fires when the thread
    that forked exits, so start and stop a server from the same thread. None elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    parent = os.getpid()
    term = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, term, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def docker_available(timeout: float = 5.0) -> bool:
    """True when a Docker engine answers (not just the client being installed).

    Example:
        >>> docker_available()
        False
    """
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                                capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and bool(result.stdout.strip())


def resolve_backend(name: str, sandboxed: bool = False) -> str:
    """``auto`` -> the first of docker, binary, local that can run here; from a sandbox
    (``serving_opt.sandbox``) docker is not one of them: its client needs the Docker
    socket, which is root on the host.

    Example:
        >>> resolve_backend("auto")
        'local'
    """
    if name not in BACKENDS:
        raise UsageError(f"--server={name} is not one of {', '.join(BACKENDS)}",
                         "use --server=auto, docker, binary or local")
    if name == "docker" and sandboxed:
        raise ServingOptError(
            "--server=docker cannot be driven from the sandbox (the Docker client needs the "
            "Docker socket, which is root on this host); nothing was run",
            "use --server=binary or local, or --allow_unsandboxed for a model you trust")
    if name != "auto":
        return name
    if not sandboxed and docker_available():
        return "docker"
    if shutil.which(BINARY_NAME):
        return "binary"
    return "local"


def make_server(backend: str, spec: ServerSpec, runtime=None) -> ServerProcess:
    """Builds (does not start) the server process for a concrete backend.

    ``runtime`` (a ``runtime.Runtime``; default: this interpreter) is the TensorFlow the
    local stand-in runs under; the real servers bring their own.

    Example:
        >>> make_server("local", ServerSpec("clf", "/m/clf")).backend
        'local'
    """
    from serving_opt.serving import runtime as runtime_lib

    port = spec.port or free_port()
    rest_port = free_port() if spec.rest_api else 0
    while rest_port and rest_port == port:
        rest_port = free_port()
    if backend not in BACKENDS[1:]:
        raise UsageError(f"unknown backend {backend}", f"use one of {', '.join(BACKENDS)}")
    base = os.path.abspath(spec.model_base)
    config_dir = None
    if spec.version is not None:
        container_base = f"/models/{spec.model_name}"
        config_dir = write_model_config(spec, container_base if backend == "docker" else base)
    config_file = os.path.join(config_dir, CONFIG_FILENAME) if config_dir else None
    temp_dirs = [config_dir] if config_dir else []
    if backend == "docker":
        name = f"serving-opt-{uuid.uuid4().hex[:10]}"
        release = runtime_lib.image_version(spec.image)
        return ServerProcess("docker", docker_command(spec, port, name, rest_port, config_dir),
                             port, temp_dirs=temp_dirs,
                             cleanup=["docker", "rm", "-f", name], rest_port=rest_port,
                             description=f"docker:{spec.image}",
                             tf_version=f"{release} (image tag)" if release
                             else "unknown (image tag names no release)")
    if backend == "binary":
        binary = shutil.which(BINARY_NAME)
        if binary is None:
            for directory in temp_dirs:
                shutil.rmtree(directory, ignore_errors=True)
            raise ServingOptError(f"{BINARY_NAME} is not on PATH",
                                  "install TF Serving, or use --server=docker or local")
        # Its version is asked once it has served (identify()): not every executable
        # named tensorflow_model_server answers --version and exits.
        return ServerProcess("binary", binary_command(spec, port, binary, rest_port,
                                                      config_file),
                             port, temp_dirs=temp_dirs, rest_port=rest_port,
                             description=f"binary:{binary}")
    if backend == "local":
        if runtime is None:
            runtime = runtime_lib.Runtime(sys.executable, runtime_lib.current_tf_version(),
                                          "current interpreter", "")
        return ServerProcess("local", local_command(spec, port, rest_port, runtime.python,
                                                    config_file),
                             port, env=runtime.env(), temp_dirs=temp_dirs,
                             parent_pipe_flag="--parent_pipe_fd",
                             rest_port=rest_port,
                             description="local:serving-opt serve (stand-in) on TensorFlow "
                             f"{runtime.tf_version}", tf_version=runtime.tf_version)
    raise UsageError(f"unknown backend {backend}", f"use one of {', '.join(BACKENDS)}")


def identify(server: ServerProcess) -> None:
    """Completes a binary server's description and TensorFlow version from ``--version``."""
    if server.backend == "binary" and not server.tf_version:
        server_version, server.tf_version = binary_versions(server.command[0])
        server.description = f"binary:{server.command[0]} {server_version}"


def binary_versions(binary: str, timeout: float = 10.0) -> tuple[str, str]:
    """(model server version, TensorFlow version) from ``tensorflow_model_server --version``
    ("TensorFlow ModelServer: 2.20.0-rc0+dev.sha.x" / "TensorFlow Library: 2.20.0").

    Example:
        >>> binary_versions("/usr/bin/tensorflow_model_server")
        ('2.20.0', '2.20.0')
    """
    try:
        result = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent())
        text = result.stdout + result.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    server = library = "unknown"
    for line in text.splitlines():
        if line.startswith("TensorFlow ModelServer:"):
            server = line.split(":", 1)[1].strip() or server
        elif line.startswith("TensorFlow Library:"):
            library = line.split(":", 1)[1].strip() or library
    return server, library if library != "unknown" else "unknown (--version did not say)"


def wait_for_port(server: ServerProcess, timeout: float) -> None:
    """Blocks until the server accepts TCP connections, exits, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.exit_code() is not None:
            return
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", server.port)) == 0:
                return
        time.sleep(0.2)
