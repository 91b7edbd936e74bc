"""A model server as a child process: started, logged, always stopped (the runners' base).

Every runner (``backends``: docker, binary, local) is a child process serving gRPC and
REST on loopback ports; this class is what they share: starting it, its log, its exit
code, stopping it (also on Ctrl-C), and making sure it never outlives us.

A server never outlives the process that started it, even one killed with SIGKILL
(which runs no cleanup): a runner that can take a pipe (``parent_pipe_flag``) gets the
read end of one whose write end only we hold, and stops at EOF; any other gets the
kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, set in the
child before exec), sent when the *thread* that started it exits: start and stop a
server from the same thread (validate does).

The server's log is a temporary file unlinked as soon as it is opened (the server
writes to its descriptor, we read through our own), so nothing is left in /tmp even
when we are killed; :meth:`ServerProcess.log_tail` gives its last lines for error
messages, also after the server stopped.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError


@dataclass(frozen=True)
class ChildSetup:
    """How a runner's child process is started and what is removed after it: what every
    runner sets differently, beyond its command and ports.

    ``env``: the child's environment (None: ours); ``parent_pipe_flag``: a flag taking a
    file descriptor, the server exits when that pipe reaches EOF (None: the parent-death
    signal stops it instead); ``cleanup``: a command run on stop (docker's ``rm -f``);
    ``temp_dirs``: removed when the server stops (its model config).
    """

    env: dict | None = None
    parent_pipe_flag: str | None = None
    cleanup: Sequence[str] = ()
    temp_dirs: Sequence[str] = ()


class ServerProcess:
    """A model server child process: started, logged to a file, always stopped; the
    interface of every runner (TFX's ``BaseModelServerRunner``): ``start``/``stop`` (or
    ``with``), its ``endpoints``, ``exit_code`` and ``log_tail`` while it runs, and what
    answered (``description``, ``note``, ``answering_tf_version``).
    """

    # What this kind of server is, for reports: a stand-in pass is not a TF Serving pass.
    note = ""

    def __init__(self, backend: str, command: Sequence[str], port: int,
                 setup: ChildSetup = ChildSetup(), rest_port: int = 0,
                 description: str = "", tf_version: str = "") -> None:
        self.backend = backend
        self.temp_dirs = list(setup.temp_dirs)  # removed when the server stops (its config)
        self.command = list(command)
        self.port = port
        self.rest_port = rest_port  # 0: no REST API
        # What answers, for reports and markers: "docker:<image>", "binary:<path> <ver>",
        # "local:serving-opt serve (stand-in) on TensorFlow X".
        self.description = description or backend
        self.tf_version = tf_version
        self.cleanup = list(setup.cleanup) if setup.cleanup else None
        self.env = setup.env
        # A flag taking a file descriptor: the server exits when that pipe reaches EOF.
        self.parent_pipe_flag = setup.parent_pipe_flag
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
    def endpoints(self) -> dict[str, str]:
        """Protocol -> the address a client of that protocol talks to."""
        rest = self.rest_address
        return {"grpc": self.address, **({"rest": rest} if rest else {})}

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
            preexec = die_with_parent()
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

    def identify(self) -> None:
        """Completes ``description`` and ``tf_version`` once the server has served (a
        runner that cannot know them before it ran asks here)."""

    def answering_tf_version(self) -> str:
        """The TensorFlow that answered, as far as this runner knows."""
        return self.tf_version

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


def die_with_parent():
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

