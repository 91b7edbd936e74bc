"""Model server runners: the real TF Serving (Docker or binary) or the local stand-in.

TFX's ``infra_validator/model_server_runners``: a runner starts a server for a model
and stops it; it does not talk to the model (the clients do). All three are a child
process serving gRPC and REST on loopback ports (``process.ServerProcess``: start, log,
exit code, stop, also on Ctrl-C); a runner class adds its command line and what it
knows about what answers:

  * ``DockerRunner``: ``docker run tensorflow/serving:<tag>`` with the model base mounted
    read-only at ``/models/<name>`` and free host ports mapped to 8500 (gRPC) and 8501
    (REST, which the image always serves), or, with ``--docker_network=host`` (engines
    without a bridge), the host's network and free ports passed as the server's flags;
  * ``BinaryRunner``: ``tensorflow_model_server`` from PATH (``--rest_api_port``);
  * ``LocalRunner``: ``serving-opt serve``, this project's TF-Serving-compatible server
    (same flags, same gRPC and REST APIs) for machines where neither of the above runs,
    run by the interpreter of the target TensorFlow (``runtime.Runtime``).

:func:`make_server` turns a concrete backend name into its runner, the one switch;
:func:`resolve_backend` turns ``auto`` into one: docker if a Docker engine answers,
already has the image and can publish its ports (and we are not in a sandbox), else the
binary if on PATH, else local; an explicit docker is checked there, before any work
(:func:`check_docker`).

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
    stops; ``--rm`` removes it. The client itself killed with SIGKILL (the OOM killer)
    cannot proxy anything: the container keeps running, labelled with its owner
    (``serving-opt.owner``: host, pid namespace, pid and start time), and the next
    ``--server=docker`` run on this host removes every labelled container whose owner is
    gone (:func:`remove_stale_containers`, from :func:`check_docker`).
    tests/serving/test_docker_engine.py runs all of this against a Docker engine (docs/docker.md).

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
from serving_opt.options import BACKENDS, DEFAULT_IMAGE, DOCKER_NETWORKS  # noqa: E402
from serving_opt.savedmodel import tf_process
from serving_opt.serving import runtime as runtime_lib
from serving_opt.serving.process import ChildSetup, ServerProcess, die_with_parent

BINARY_NAME = "tensorflow_model_server"
CONTAINER_GRPC_PORT = 8500
CONTAINER_REST_PORT = 8501
CONTAINER_CONFIG_DIR = "/serving-opt-config"
# Who started a container: "<host>:<pid namespace>:<pid>:<start time>".
OWNER_LABEL = "serving-opt.owner"

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
    """
    if backend != "local":
        return {}
    return dict(tf_process.RUNTIME_DEFAULTS)


# What each concrete backend is, for reports: a "local" pass is not a TF Serving pass.
BACKEND_NOTES = {
    "docker": "TF Serving (Docker image)",
    "binary": "TF Serving (tensorflow_model_server binary)",
    "local": "serving-opt's local TF-Serving-compatible server (a stand-in, not TF Serving)",
}
STAND_IN_IMAGE_NOTE = ("serving-opt's local server in a Docker image with TF Serving's "
                       "contract (a stand-in, not TF Serving)")


@dataclass(frozen=True)
class ServerSpec:
    """What to serve and how; the same for every backend."""

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
    # docker only: "bridge" publishes the ports on 127.0.0.1, "host" shares the host's
    # network and passes the ports as flags (engines without a bridge).
    docker_network: str = "bridge"


CONFIG_FILENAME = "models.config"


def model_config_text(spec: ServerSpec, base_path: str) -> str:
    """The text ModelServerConfig TF Serving reads with ``--model_config_file``."""
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
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
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
    """``docker run`` for tensorflow/serving: read-only model mount, loopback-only ports
    (or the host's network, ``spec.docker_network``), labelled with its owner.
    """
    if spec.docker_network not in DOCKER_NETWORKS:
        raise UsageError(f"docker_network={spec.docker_network} is not one of "
                         f"{', '.join(DOCKER_NETWORKS)}", "e.g. docker_network='host'")
    container_base = f"/models/{spec.model_name}"
    host = spec.docker_network == "host"
    network = (["--network", "host"] if host else [
        "-p", f"127.0.0.1:{host_port}:{CONTAINER_GRPC_PORT}",
        *(["-p", f"127.0.0.1:{rest_host_port}:{CONTAINER_REST_PORT}"] if rest_host_port
          else [])])
    # The image's entrypoint passes MODEL_NAME/MODEL_BASE_PATH and then any extra args.
    args = [
        "docker", "run", "--rm", "--name", container_name,
        "--label", f"{OWNER_LABEL}={owner()}", *network,
        # An init as PID 1: the kernel drops a SIGTERM to a namespace's PID 1 that has no
        # handler (the server still starting, or tensorflow_model_server itself).
        "--init",
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
        # Host network: the ports are ours to pick; later flags win over the entrypoint's
        # 8500/8501 (0 turns REST off, as upstream).
        *([f"--port={host_port}", f"--rest_api_port={rest_host_port}"] if host else []),
        *spec.extra_flags,
    ]
    return args


def owner(pid: int | None = None) -> str:
    """This process as a container's owner label: host, pid namespace, pid, start time (a
    pid reused later is another process; another namespace's pid cannot be judged)."""
    pid = os.getpid() if pid is None else pid
    try:
        namespace = os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}:{namespace}:{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime
    except (OSError, IndexError):
        return ""


def _owner_gone(label: str) -> bool:
    """True when ``label`` names a process of this host and pid namespace that has exited."""
    parts = label.rsplit(":", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    host, namespace, pid, started = parts
    mine = owner().rsplit(":", 3)
    if (host, namespace) != (mine[0], mine[1]) or not started:
        return False
    return _start_time(int(pid)) != started


def _docker(args: list[str], timeout: float | None = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(args, 1, "", str(e))


def remove_stale_containers() -> list[str]:
    """Removes the containers a serving-opt of this host started and that outlived it
    (both it and its ``docker run`` client were SIGKILLed); returns their names."""
    listed = _docker(["ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format",
                      f'{{{{.Names}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}'])
    stale = [line.split("\t")[0] for line in listed.stdout.splitlines()
             if "\t" in line and _owner_gone(line.split("\t", 1)[1])]
    if stale:
        _docker(["rm", "-f", *stale])
    return stale


def _engine() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def check_docker(image: str, network: str = "bridge") -> None:
    """Raises one clear line when no Docker engine answers, when it cannot publish ports
    (``network`` bridge on an engine without one), or when ``image`` is neither on it nor
    pullable: before any work, not as a container that never starts or cannot be
    reached."""
    fix_engine = ("start the Docker engine (systemctl start docker, or dockerd as root; in "
                  "this checkout: make docker-engine), or use --server=local")
    if shutil.which("docker") is None:
        raise ServingOptError("--server=docker: no docker client on PATH",
                              "install Docker (Debian: apt-get install docker.io), or use "
                              "--server=local")
    if not docker_available():
        raise ServingOptError(f"--server=docker: no Docker engine answers at {_engine()}",
                              fix_engine)
    remove_stale_containers()
    if not _network_usable(network):
        raise ServingOptError(
            f"--server=docker: the Docker engine at {_engine()} has no bridge network "
            "(dockerd --bridge=none), so the container's ports cannot be published",
            "pass --docker_network=host (the container shares this host's network)")
    if _docker(["image", "inspect", image]).returncode == 0:
        return
    pulled = _docker(["pull", "--quiet", image], timeout=None)  # a real image takes minutes
    if pulled.returncode != 0:
        why = (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise ServingOptError(
            f"--server=docker: image {image} is not on the Docker engine and cannot be "
            f"pulled ({why})",
            f"pull it where a registry answers (docker pull {image}) or pass --image= a "
            "local image (make docker-image builds the stand-in serving-opt/tfs-contract)")


def _network_usable(network: str) -> bool:
    """Host networking always is; ``-p`` needs the engine's default bridge network (without
    one, Docker starts the container unreachable and ignores ``-p``)."""
    return network == "host" or _docker(["network", "inspect", "bridge"]).returncode == 0


def docker_image_present(image: str) -> bool:
    """True when ``image`` is already on the Docker engine (nothing is pulled)."""
    return _docker(["image", "inspect", image]).returncode == 0


def binary_command(spec: ServerSpec, port: int, binary: str = BINARY_NAME,
                   rest_port: int = 0, config_file: str | None = None) -> list[str]:
    """``tensorflow_model_server`` with the usual flags."""
    return [binary, *_server_flags(spec, port, os.path.abspath(spec.model_base), rest_port,
                                   config_file)]


def local_command(spec: ServerSpec, port: int, rest_port: int = 0,
                  python: str | None = None, config_file: str | None = None) -> list[str]:
    """``serving-opt serve`` (this project's TF-Serving-compatible server), same flags, run
    by ``python`` (the target TensorFlow's interpreter; default: this one).
    """
    return [python or sys.executable, "-m", "serving_opt.cli", "serve",
            *_server_flags(spec, port, os.path.abspath(spec.model_base), rest_port,
                          config_file),
            *(["--allow_file_ops"] if spec.allow_file_ops else [])]



def docker_available(timeout: float = 5.0) -> bool:
    """True when a Docker engine answers (not just the client being installed)."""
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                                capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and bool(result.stdout.strip())


def resolve_backend(name: str, sandboxed: bool = False, image: str = DEFAULT_IMAGE,
                    docker_network: str = "bridge") -> str:
    """``auto`` -> the first of docker, binary, local that can run here; from a sandbox
    (``serving_opt.sandbox``) docker is not one of them: its client needs the Docker
    socket, which is root on the host. Docker is auto's choice only when the engine has
    ``image`` already (an engine that merely answers would otherwise turn every auto run
    into a pull) and can run it on ``docker_network``. An explicit docker is checked
    here (:func:`check_docker`).
    """
    if name not in BACKENDS:
        raise UsageError(f"--server={name} is not one of {', '.join(BACKENDS)}",
                         "use --server=auto, docker, binary or local")
    if name == "docker" and sandboxed:
        raise ServingOptError(
            "--server=docker cannot be driven from the sandbox (the Docker client needs the "
            "Docker socket, which is root on this host); nothing was run",
            "use --server=binary or local, or --allow_unsandboxed for a model you trust")
    if name == "docker":
        check_docker(image, docker_network)
    if name != "auto":
        return name
    if not sandboxed and docker_available() and docker_image_present(image) \
            and _network_usable(docker_network):
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
    """

    note = BACKEND_NOTES["docker"]

    def __init__(self, spec: ServerSpec, runtime: runtime_lib.Runtime | None = None) -> None:
        port, rest_port = _ports(spec)
        config_dir = _model_config(spec, f"/models/{spec.model_name}")
        name = f"serving-opt-{uuid.uuid4().hex[:10]}"
        release = runtime_lib.image_version(spec.image)
        self.image = spec.image
        super().__init__(
            "docker", docker_command(spec, port, name, rest_port, config_dir), port,
            ChildSetup(cleanup=("docker", "rm", "-f", name),
                       temp_dirs=(config_dir,) if config_dir else ()),
            rest_port=rest_port, description=f"docker:{spec.image}",
            tf_version=f"{release} (image tag)" if release
            else "unknown (image tag names no release)")

    def identify(self) -> None:
        """Names the contract image (tools/docker/image.sh) as the stand-in it is."""
        label = _docker(["image", "inspect", "--format",
                         '{{index .Config.Labels "serving-opt.stand-in"}}', self.image])
        if label.stdout.strip() == "true":
            self.note = STAND_IN_IMAGE_NOTE


class BinaryRunner(ServerProcess):
    """``tensorflow_model_server`` from PATH, stopped by the kernel's parent-death signal
    if we die; its versions are asked once it has served (:meth:`identify`).
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
            ChildSetup(env=tf_process.with_runtime_defaults(runtime.env()),
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
    """
    runner = RUNNERS.get(backend)
    if runner is None:
        raise UsageError(f"unknown backend {backend}", f"use one of {', '.join(BACKENDS)}")
    return runner(spec, runtime)


def binary_dirs() -> list[str]:
    """Where tensorflow_model_server is (its name's directory, then the file's own): what
    a sandbox running the binary runner binds read-only, the first on its PATH.
    """
    binary = shutil.which(BINARY_NAME)
    if binary is None:
        return []
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(binary)),
                               os.path.dirname(os.path.realpath(binary))]))


def binary_versions(binary: str, timeout: float = 10.0) -> tuple[str, str]:
    """(model server version, TensorFlow version) from ``tensorflow_model_server --version``
    ("TensorFlow ModelServer: 2.20.0-rc0+dev.sha.x" / "TensorFlow Library: 2.20.0").
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
