"""The local model server as the tests start it: in this process (``serve``), or as the
``serving-opt serve`` subprocess users run.

Example:
    >>> with running(model_name="m", model_base_path=base, port=0) as server:
    ...     channel = grpc.insecure_channel(server.address)
    >>> process = start_serve("--port=0", f"--model_base_path={base}")
    >>> read_line(process, timeout=120)
    "serving-opt serve: model 'default' version 1 AVAILABLE on 127.0.0.1:..."
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator

from serving_opt.model_server import RunningServer, ServerOptions, serve


def write_model_config(path: str, bases: dict[str, str]) -> str:
    """Writes a ``model_config_list`` serving each base under its name, atomically (a
    polling server never reads half a file); returns ``path``.

    Example:
        >>> write_model_config(str(tmp_path / "models.config"), {"clf": classifier_base})
        '/tmp/.../models.config'
    """
    entries = "".join(
        f" config {{ name: '{name}' base_path: '{base}' model_platform: 'tensorflow' }}"
        for name, base in bases.items()
    )
    with open(path + ".tmp", "w") as f:
        f.write(f"model_config_list {{{entries} }}")
    os.replace(path + ".tmp", path)
    return path


@contextlib.contextmanager
def running(**options) -> Iterator[RunningServer]:
    """A server started in this process with ``ServerOptions(**options)``, stopped on exit.

    Example:
        >>> with running(model_name="m", model_base_path=base, port=0) as server:
        ...     server.available_versions()
        {'m': [1]}
    """
    server = serve(ServerOptions(**options))
    try:
        yield server
    finally:
        server.stop()


def serve_command(*flags: str) -> list[str]:
    """``serving-opt serve`` with ``flags``, as this interpreter runs it.

    Example:
        >>> serve_command("--port=0")[-2:]
        ['serve', '--port=0']
    """
    return [sys.executable, "-m", "serving_opt.cli", "serve", *flags]


def serve_env() -> dict[str, str]:
    """This process's environment with TensorFlow's C++ logging quiet.

    Example:
        >>> serve_env()["TF_CPP_MIN_LOG_LEVEL"]
        '2'
    """
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def start_serve(*flags: str, stderr=subprocess.PIPE,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """``serving-opt serve`` started with ``flags``: stdout a text pipe, ``stderr`` a pipe
    unless given (a file, say); ``env`` adds to the environment.

    Example:
        >>> process = start_serve("--port=0", f"--model_base_path={base}")
    """
    return subprocess.Popen(serve_command(*flags), stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env={**serve_env(), **(env or {})})


def read_line(process: subprocess.Popen, timeout: float) -> str:
    """The next stdout line, or '' if the process exits or the time runs out.

    Example:
        >>> read_line(process, timeout=120).startswith("serving-opt serve: model")
        True
    """
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    try:
        if not selector.select(timeout):
            return ""
        return process.stdout.readline()
    finally:
        selector.close()


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited within a minute; stdout closed.

    Example:
        >>> stop_process(process)
    """
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    process.stdout.close()
