"""Model server runners: the real TF Serving (Docker or binary) or the local stand-in.

TFX's ``infra_validator/model_server_runners``: a runner starts a server for a model
and stops it; it does not talk to the model (the clients do). All three are a child
process serving gRPC and REST on loopback ports (``process.ServerProcess``: start, log,
exit code, stop, also on Ctrl-C); a runner class adds its command line and what it
knows about what answers:

  * ``DockerRunner``: ``docker run tensorflow/serving:<tag>`` with the model base mounted
    read-only at ``/models/<name>`` and free host ports mapped to 8500 (gRPC) and 8501
    (REST, which the image always serves);
  * ``BinaryRunner``: ``tensorflow_model_server`` from PATH (``--rest_api_port``);
  * ``LocalRunner``: ``serving-opt serve``, this project's TF-Serving-compatible server
    (same flags, same gRPC and REST APIs) for machines where neither of the above runs,
    run by the interpreter of the target TensorFlow (``runtime.Runtime``).

:func:`make_server` turns a concrete backend name into its runner, the one switch;
:func:`resolve_backend` turns ``auto`` into one: docker if a Docker engine answers (and
we are not in a sandbox), else the binary if on PATH, else local.

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

Each server says what it is (``description``, ``note``) and which TensorFlow answers
(``tf_version``, ``answering_tf_version()``): the image tag's release for docker,
``tensorflow_model_server --version``'s "TensorFlow Library" for the binary, and the
stand-in's own interpreter for local (confirmed by the ``TensorFlow X`` line ``serve``
logs when it prints one).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field

from serving_opt.errors import ServingOptError, UsageError

# What the user may ask for is an option (serving_opt.options): this package imports it.
from serving_opt.options import BACKENDS, DEFAULT_IMAGE  # noqa: E402
from serving_opt.savedmodel import loader
from serving_opt.serving import runtime as runtime_lib
from serving_opt.serving.process import ChildSetup, ServerProcess, die_with_parent

BINARY_NAME = "tensorflow_model_server"
CONTAINER_GRPC_PORT = 8500
CONTAINER_REST_PORT = 8501
CONTAINER_CONFIG_DIR = "/serving-opt-config"

def runtime_env(backend: str) -> dict[str, str | None]:
    """The environment the server of ``backend`` runs TensorFlow with (None: unset, so
    TensorFlow's default): what a process must have to measure the session runs that
    server makes (oneDNN's kernels and Eigen's batch differently: a profile taken with
    the other predicts another server).

    The local stand-in runs TensorFlow as TF Serving does on this machine: every x86
    Linux build of TensorFlow, tensorflow_model_server's included, carries oneDNN, and
    turns it on by default on CPUs with AVX512_VNNI and newer; or as the user chose with
    ``TF_ENABLE_ONEDNN_OPTS`` when serving-opt started (not as the optimizer process set
    it for itself). A docker or binary server runs as it was started.

    Example:
        >>> runtime_env("local")
        {'TF_ENABLE_ONEDNN_OPTS': None}
        >>> runtime_env("binary")
        {}
    """
    if backend != "local":
        return {}
    return dict(loader.RUNTIME_DEFAULTS)


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
    # The local server only (serving-opt serve --allow_file_ops): load a model with host
    # ops, which it refuses otherwise. TF Serving has no such check.
    allow_file_ops: bool = False


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
                          config_file),
            *(["--allow_file_ops"] if spec.allow_file_ops else [])]



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


def _ports(spec: ServerSpec) -> tuple[int, int]:
    """(gRPC port, REST port or 0): two different free loopback ports."""
    port = spec.port or free_port()
    rest_port = free_port() if spec.rest_api else 0
    while rest_port and rest_port == port:
        rest_port = free_port()
    return port, rest_port


def _model_config(spec: ServerSpec, base_path: str) -> str | None:
    """The directory of the model config serving ``spec.version`` only, or None (no version:
    the server's default policy, from its --model_name/--model_base_path flags)."""
    return write_model_config(spec, base_path) if spec.version is not None else None


class DockerRunner(ServerProcess):
    """``docker run tensorflow/serving:<tag>``: the model base mounted read-only at
    ``/models/<name>``, free loopback ports mapped to 8500 (gRPC) and 8501 (REST, which the
    image always serves); the container is removed on stop (``docker rm -f``), since the
    client dying does not stop it.

    Example:
        >>> DockerRunner(ServerSpec("clf", "/m/clf")).description
        'docker:tensorflow/serving:2.20.0'
    """

    note = BACKEND_NOTES["docker"]

    def __init__(self, spec: ServerSpec, runtime: runtime_lib.Runtime | None = None) -> None:
        port, rest_port = _ports(spec)
        config_dir = _model_config(spec, f"/models/{spec.model_name}")
        name = f"serving-opt-{uuid.uuid4().hex[:10]}"
        release = runtime_lib.image_version(spec.image)
        super().__init__(
            "docker", docker_command(spec, port, name, rest_port, config_dir), port,
            ChildSetup(cleanup=("docker", "rm", "-f", name),
                       temp_dirs=(config_dir,) if config_dir else ()),
            rest_port=rest_port, description=f"docker:{spec.image}",
            tf_version=f"{release} (image tag)" if release
            else "unknown (image tag names no release)")


class BinaryRunner(ServerProcess):
    """``tensorflow_model_server`` from PATH, stopped by the kernel's parent-death signal
    if we die; its versions are asked once it has served (:meth:`identify`).

    Example:
        >>> BinaryRunner(ServerSpec("clf", "/m/clf")).description
        'binary:/usr/bin/tensorflow_model_server'
    """

    note = BACKEND_NOTES["binary"]

    def __init__(self, spec: ServerSpec, runtime: runtime_lib.Runtime | None = None) -> None:
        binary = shutil.which(BINARY_NAME)
        if binary is None:
            raise ServingOptError(f"{BINARY_NAME} is not on PATH",
                                  "install TF Serving, or use --server=docker or local")
        port, rest_port = _ports(spec)
        config_dir = _model_config(spec, os.path.abspath(spec.model_base))
        config_file = os.path.join(config_dir, CONFIG_FILENAME) if config_dir else None
        super().__init__(
            "binary", binary_command(spec, port, binary, rest_port, config_file), port,
            ChildSetup(temp_dirs=(config_dir,) if config_dir else ()), rest_port=rest_port,
            description=f"binary:{binary}")

    def identify(self) -> None:
        """The model server's and its TensorFlow's versions from ``--version``, asked only
        now: not every executable named tensorflow_model_server answers it and exits."""
        if not self.tf_version:
            server_version, self.tf_version = binary_versions(self.command[0])
            self.description = f"binary:{self.command[0]} {server_version}"


class LocalRunner(ServerProcess):
    """``serving-opt serve``, this project's TF-Serving-compatible server, run by the target
    TensorFlow's interpreter (``runtime``; default: this one); it stops when the pipe we
    hold the write end of reaches EOF (``--parent_pipe_fd``).

    Example:
        >>> LocalRunner(ServerSpec("clf", "/m/clf")).description
        'local:serving-opt serve (stand-in) on TensorFlow 2.21.0'
    """

    note = BACKEND_NOTES["local"]

    def __init__(self, spec: ServerSpec, runtime: runtime_lib.Runtime | None = None) -> None:
        if runtime is None:
            runtime = runtime_lib.Runtime(sys.executable, runtime_lib.current_tf_version(),
                                          "current interpreter", "")
        port, rest_port = _ports(spec)
        config_dir = _model_config(spec, os.path.abspath(spec.model_base))
        config_file = os.path.join(config_dir, CONFIG_FILENAME) if config_dir else None
        super().__init__(
            "local", local_command(spec, port, rest_port, runtime.python, config_file), port,
            ChildSetup(env=loader.with_runtime_defaults(runtime.env()),
                       parent_pipe_flag="--parent_pipe_fd",
                       temp_dirs=(config_dir,) if config_dir else ()),
            rest_port=rest_port,
            description=f"local:serving-opt serve (stand-in) on TensorFlow {runtime.tf_version}",
            tf_version=runtime.tf_version)

    def answering_tf_version(self) -> str:
        """The "TensorFlow X" line ``serve`` logs, else the interpreter's release."""
        match = re.search(r"serving-opt serve: TensorFlow (\S+)", self.log_tail(400))
        return match.group(1) if match else self.tf_version


RUNNERS: dict[str, type[ServerProcess]] = {
    "docker": DockerRunner, "binary": BinaryRunner, "local": LocalRunner}


def make_server(backend: str, spec: ServerSpec,
                runtime: runtime_lib.Runtime | None = None) -> ServerProcess:
    """The runner of a concrete backend (built, not started): the one place a backend name
    becomes a server.

    ``runtime`` (default: this interpreter) is the TensorFlow the local stand-in runs
    under; the real servers bring their own.

    Example:
        >>> make_server("local", ServerSpec("clf", "/m/clf")).backend
        'local'
    """
    runner = RUNNERS.get(backend)
    if runner is None:
        raise UsageError(f"unknown backend {backend}", f"use one of {', '.join(BACKENDS)}")
    return runner(spec, runtime)


def binary_dirs() -> list[str]:
    """Where tensorflow_model_server is (its name's directory, then the file's own): what
    a sandbox running the binary runner binds read-only, the first on its PATH.

    Example:
        >>> binary_dirs()
        ['/usr/local/bin', '/opt/tf-serving/bin']
    """
    binary = shutil.which(BINARY_NAME)
    if binary is None:
        return []
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(binary)),
                               os.path.dirname(os.path.realpath(binary))]))


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
                                preexec_fn=die_with_parent())
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
