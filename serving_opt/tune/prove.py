"""Prove settings on a real server under real load.

Each ``ServingSettings`` gets a server of its own, started the way a deployment starts
it: ``--enable_batching --batching_parameters_file=<the text proto>`` and the thread
flags, on the backend ``serving/backends`` resolves (a Docker image or the
``tensorflow_model_server`` binary where present, else this project's local server).
Once the version is AVAILABLE, the load generator (``load``) runs each load point
against it; the server is always stopped, on failure and Ctrl-C too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from serving_opt.errors import ServingOptError
from serving_opt.serving import backends, grpc_client
from serving_opt.tune.load import LoadResult
from serving_opt.tune.settings import PARAMETERS_FILENAME, ServingSettings


@dataclass(frozen=True)
class ProvenPoint:
    """One measured load point: which settings (``label``), the workload ("closed" or
    "open"), the protocol and what the load generator measured."""

    label: str
    settings: ServingSettings
    workload: str
    protocol: str
    measured: LoadResult

    def to_dict(self) -> dict:
        out = asdict(self)
        out["describe"] = self.settings.describe()
        return out


def server_flags(settings: ServingSettings, parameters_path: str | None) -> list[str]:
    """The flags a server needs for ``settings`` beyond the model's own."""
    flags = list(settings.threads.flags())
    if settings.batching is not None:
        flags.append("--enable_batching=true")
        if parameters_path:
            flags.append(f"--batching_parameters_file={parameters_path}")
    return flags


# The flags a proof server sets itself: its own free ports and the model it serves.
_OWN_FLAGS = ("--port", "--rest_api_port", "--model_name", "--model_base_path")


@dataclass(frozen=True)
class Deployed:
    """A deployment set as tune writes it: the batching file's text ('' for none) and
    the ``tensorflow_model_server`` flags (those of tensorflow_model_server.flags).
    """

    parameters_text: str
    flags: tuple[str, ...]

    def server_flags(self, parameters_path: str | None) -> list[str]:
        """The deployment's flags as a proof server takes them: every flag as written but
        the ports and the model's name and path (the proof's own), and the parameters
        file at ``parameters_path``, where its text was written byte for byte.
        """
        out = []
        for flag in self.flags:
            name = flag.split("=", 1)[0]
            if name in _OWN_FLAGS:
                continue
            if name == "--batching_parameters_file":
                if not parameters_path:
                    raise ValueError("the deployment names a parameters file it has no text for")
                flag = f"{name}={parameters_path}"
            out.append(flag)
        return out


def launch(backend: str, spec: backends.ServerSpec, settings: ServingSettings,
           runtime=None, say: Callable[[str], None] = lambda m: None,
           deployed: Deployed | None = None) -> backends.ServerProcess:
    """Starts (does not wait for) a server of ``backend`` serving ``spec`` with
    ``settings``; the caller stops it (start and stop from one thread: see backends).

    ``spec.version`` must be set: the server gets a model config of its own (a specific
    version policy), and the batching parameters file goes beside it. With
    ``deployed``, the server runs that deployment set exactly: its parameters text and
    its flags, not ones made again from ``settings`` (which then only names it).
    """
    if spec.version is None:
        raise ValueError("launch() serves one version: set ServerSpec.version")
    server = backends.make_server(backend, spec, runtime)
    try:
        config_dir = server.temp_dirs[0]
        parameters = None
        text = (deployed.parameters_text if deployed is not None
                else settings.batching.text_proto() if settings.batching is not None else "")
        if text:
            with open(os.path.join(config_dir, PARAMETERS_FILENAME), "w") as f:
                f.write(text)
            parameters = (f"{backends.CONTAINER_CONFIG_DIR}/{PARAMETERS_FILENAME}"
                          if backend == "docker" else os.path.join(config_dir,
                                                                    PARAMETERS_FILENAME))
        # Server flags go last on every backend's command line (after the image for docker).
        flags = (deployed.server_flags(parameters) if deployed is not None
                 else server_flags(settings, parameters))
        server.command = [*server.command, *flags]
        say(f"  starting {server.description} with {settings.describe()}")
        server.start()
    except BaseException:
        server.stop()
        raise
    return server


def ready(server: backends.ServerProcess, spec: backends.ServerSpec,
          load_deadline: float = 300.0, say: Callable[[str], None] = lambda m: None) -> None:
    """Waits until the version is AVAILABLE (raises with the server's reason if not)."""
    waiting = grpc_client.GrpcClient(server.address, spec.model_name, spec.version, timeout=30.0)
    try:
        waiting.wait_until_available(server, load_deadline)
    finally:
        waiting.close()
    server.identify()


@contextmanager
def running(backend: str, spec: backends.ServerSpec, settings: ServingSettings,
            runtime=None, load_deadline: float = 300.0,
            say: Callable[[str], None] = lambda m: None,
            started: backends.ServerProcess | None = None,
            deployed: Deployed | None = None) -> Iterator[backends.ServerProcess]:
    """A server of ``backend`` serving ``spec`` with ``settings``, AVAILABLE; stopped after
    (``started``: one :func:`launch` already started for these settings; ``deployed``:
    run that deployment set exactly, see :func:`launch`).
    """
    server = started or launch(backend, spec, settings, runtime, say, deployed)
    try:
        ready(server, spec, load_deadline, say)
        yield server
    finally:
        server.stop()


def check_answers(result: LoadResult, what: str) -> None:
    """Refuses a load point where nothing was answered: a broken setup, not a figure."""
    if result.requests == 0:
        raise ServingOptError(
            f"no request was sent in the measured window under {what}: every client was "
            f"still waiting for an answer (over {result.seconds:g} s)",
            "raise --duration (and --request_timeout), or check the server's log")
    if result.ok == 0:
        raise ServingOptError(
            f"no request was answered under {what} ({result.first_error or 'no answer'})",
            "check that the model serves (serving-opt validate) and that --examples "
            "match its signature")
