"""Prove settings on a real server under real load, next to the model's prediction.

Each ``ServingSettings`` gets a server of its own, started the way a deployment starts
it: ``--enable_batching --batching_parameters_file=<the text proto>`` and the thread
flags, on the backend ``serving/backends`` resolves (a Docker image or the
``tensorflow_model_server`` binary where present, else this project's local server,
whose ``--enable_batching`` batches like upstream's BatchingSession). Once the version
is AVAILABLE, the load generator (``load``) runs each load point against it; the
server is always stopped, on failure and Ctrl-C too.

Each measured point is paired with the prediction made before it was measured, and
the relative differences are kept: ``measured / predicted - 1`` for rows/s and p99;
more than 25% either way is flagged.

Example:
    >>> with running(backend, spec, settings) as server:
    ...     result = load.run(targets(server)["grpc"], Load("closed", clients=16))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from serving_opt.errors import ServingOptError
from serving_opt.serving import backends, client
from serving_opt.tune.load import LoadResult
from serving_opt.tune.scheduler import Prediction
from serving_opt.tune.settings import PARAMETERS_FILENAME, ServingSettings

FLAG_DIFFERENCE = 0.25


@dataclass(frozen=True)
class ProvenPoint:
    """One measured load point with the model's prediction for it.

    ``label`` says which settings ("TF Serving default (no batching)", "tuned", ...);
    ``calibration`` marks a point the model was fitted to (not a prediction).

    Example:
        >>> point.throughput_error, point.flagged
        (-0.08, False)
    """

    label: str
    settings: ServingSettings
    workload: str  # "closed" or "open"
    protocol: str
    measured: LoadResult
    predicted: Prediction | None
    calibration: bool = False

    @property
    def throughput_error(self) -> float | None:
        """measured rows/s over predicted, minus one."""
        if self.predicted is None or self.predicted.rows_per_second <= 0:
            return None
        return self.measured.rows_per_second / self.predicted.rows_per_second - 1

    @property
    def p99_error(self) -> float | None:
        """measured p99 over predicted, minus one."""
        p = self.predicted
        if p is None or not (0 < p.p99_ms < float("inf")) or not self.measured.ok:
            return None
        return self.measured.p99_ms / p.p99_ms - 1

    @property
    def flagged(self) -> bool:
        """The model and the measurement differ by more than 25% on rows/s or p99."""
        errors = [e for e in (self.throughput_error, self.p99_error) if e is not None]
        return any(abs(e) > FLAG_DIFFERENCE for e in errors)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["describe"] = self.settings.describe()
        out["throughput_error"] = self.throughput_error
        out["p99_error"] = self.p99_error
        out["flagged"] = self.flagged
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

    Example:
        >>> Deployed(rec.parameters_text, rec.flags)
    """

    parameters_text: str
    flags: tuple[str, ...]

    def server_flags(self, parameters_path: str | None) -> list[str]:
        """The deployment's flags as a proof server takes them: every flag as written but
        the ports and the model's name and path (the proof's own), and the parameters
        file at ``parameters_path``, where its text was written byte for byte.

        Example:
            >>> Deployed("max_batch_size { value: 8 }\n", ("--port=8500",
            ...     "--tensorflow_intra_op_parallelism=1", "--enable_batching=true",
            ...     "--batching_parameters_file=/config/b.txt")).server_flags("/tmp/b.txt")
            ['--tensorflow_intra_op_parallelism=1', '--enable_batching=true',
             '--batching_parameters_file=/tmp/b.txt']
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

    Example:
        >>> server = launch("local", spec, settings)
        >>> ready(server, spec)
        >>> server.stop()
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
    waiting = client.GrpcClient(server.address, spec.model_name, spec.version, timeout=30.0)
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

    Example:
        >>> with running("local", spec, settings) as server:
        ...     server.address
        '127.0.0.1:41234'
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
