"""A measuring process: TensorFlow configured like TF Serving, one fresh child per job.

The optimizer's own process has loaded, frozen and compared models for minutes, and
runs TensorFlow configured for that (see ``tf_process.configure_for_optimizing``); numbers
users compare with TF Serving must come from a process configured like the server.
A fresh ``python`` per measurement would spend most of its time importing TensorFlow,
so one helper process imports it once and forks a child per job (nothing TensorFlow
runs in the helper before the fork, so the children start clean).

What a child's RSS counts: the private pages it inherits (the Python TensorFlow API's
heap, ~210 MiB, which the fork copies the page-table entries of) and everything it
touches itself. What it leaves out: the file-backed pages the helper had mapped, above
all the runtime's shared-library code (~320-375 MiB), whose page-table entries Linux
does not copy at fork; the child counts only those it touches again. So a child's peak
is not a server's: ``tensorflow_model_server`` holds the runtime's code pages and none
of the Python API's heap, and a model's memory is a larger share of a child's RSS than
of the server's, which makes optimized / original ratios look better than a server
would see them. Both sides of a comparison undercount alike, so the ratios still rank
candidates; for the memory a server would hold, see ``savedmodel.native_load`` (a fresh
process with the C++ runtime only).

A job is a JSON object naming the function that runs it, ``"run": "module:function"``;
the function takes the job and returns a JSON-able dict. The stages that measure
(``stages.coldstart``, ``stages.benchmark``) bring their own jobs. A job may say how it
is doing while it runs (:func:`say`); ``run_jobs`` hands those lines to its ``progress``.

All of optimize's measurements of one candidate share a time budget
(``--measure_seconds``, a :class:`Budget`): the cold start counts against it, the
benchmark is sized from what is left, and a confirmation gets the rest.

    results = run_jobs([{"run": "serving_opt.stages.coldstart:cold_start_job", ...}],
                       timeout=600, what="the cold-start measurement",
                       skip="--nocold_start")
"""

from __future__ import annotations

import importlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import tf_process

_PROGRESS = "progress"  # the key of a line a job prints while it runs


@dataclass(frozen=True)
class Budget:
    """Seconds allowed for measuring one candidate, counted from its creation.

    ``time.monotonic`` is one clock for every process of the machine, so a measuring
    process is handed the deadline itself (:attr:`deadline`), not a duration that its
    start-up (importing TensorFlow) would silently extend.
    """

    seconds: float
    started: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.started + self.seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds until the deadline, never below 0."""
        return max(0.0, self.deadline - time.monotonic())


def seconds_until(deadline: float | None) -> float:
    """Seconds from now until a ``time.monotonic`` deadline (0 once past; inf for None)."""
    return math.inf if deadline is None else max(0.0, deadline - time.monotonic())


def say(message: str) -> None:
    """In a job: one line of progress, handed to ``run_jobs``' ``progress`` as it is said.

    The job's child writes it on the pipe its result will follow on; the helper prints
    nothing while a child runs, so lines never interleave.
    """
    sys.stdout.write(json.dumps({_PROGRESS: str(message)}) + "\n")
    sys.stdout.flush()


def run_jobs(jobs: list[dict], timeout: float, *, what: str, skip: str,
             progress: Callable[[str], None] | None = None) -> list[dict]:
    """Runs the jobs in one measuring process, each in a forked child; their results in
    order. A job that raised has ``{"error": "<type>: <first line>"}`` for a result.

    ``what`` names the measurement and ``skip`` the flag that skips it, for the error
    when the process itself fails or overruns ``timeout`` seconds. Lines a job
    :func:`say` s go to ``progress`` as they come (called in this thread).
    """
    # Measure with TensorFlow's defaults, as TF Serving runs, whatever the optimizer
    # process chose for itself (see tf_process.configure_for_optimizing).
    env = tf_process.with_runtime_defaults({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    payload = "".join(json.dumps(job) + "\n" for job in jobs)
    returncode, stdout, stderr = _stream(
        [sys.executable, "-m", "serving_opt.core.measuring"], payload, env, timeout,
        progress or (lambda _: None), what=what, skip=skip)
    lines = [line for line in stdout if line.startswith("{")]
    if returncode != 0 or len(lines) != len(jobs):
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"{what} failed: {tail}",
                              f"rerun with {skip} to skip it, and report this")
    return [json.loads(line) for line in lines]


def _stream(command: list[str], payload: str, env: dict, timeout: float,
            progress: Callable[[str], None], *, what: str,
            skip: str) -> tuple[int, list[str], str]:
    """Runs ``command`` with ``payload`` on stdin: its return code, the stdout lines that
    are not progress (each progress line went to ``progress`` when it came) and stderr."""
    deadline = time.monotonic() + timeout
    # A group of its own: on a timeout or an interrupt the measuring child it forked is
    # killed with it, not left measuring (and holding the pipes open).
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def read_stdout() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: errors.append(process.stderr.read()),
                                daemon=True)]
    for reader in readers:
        reader.start()
    try:
        try:
            with process.stdin:
                process.stdin.write(payload)
        except BrokenPipeError:
            pass  # it died at start: its return code and stderr say why
        out: list[str] = []
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ServingOptError(f"{what} took over {timeout:.0f} s",
                                      f"rerun with {skip} to skip it") from None
            if line is None:
                break
            message = _progress_of(line)
            if message is None:
                out.append(line.rstrip("\n"))
            else:
                progress(message)
        try:
            returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise ServingOptError(f"{what} took over {timeout:.0f} s",
                                  f"rerun with {skip} to skip it") from None
    except BaseException:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        raise
    for reader in readers:
        reader.join()
    return returncode, out, "".join(errors)


def _progress_of(line: str) -> str | None:
    if not line.startswith('{"' + _PROGRESS + '": '):
        return None
    try:
        return str(json.loads(line)[_PROGRESS])
    except (ValueError, KeyError, TypeError):
        return None


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far, in bytes (the kernel's VmHWM).

    ``getrusage`` needs no ``/proc``: inside the sandbox ``/proc/self`` is synthetic. A
    child forked from a process that imported TensorFlow starts its count afresh (the
    parent's peak is not inherited), so a measuring child's peak is its own: the private
    (anonymous) pages it inherited, as their page-table entries are copied at fork, plus
    what it touched since. It does not include the runtime's shared-library code pages
    the parent had mapped (file-backed: not copied at fork, counted only once the child
    touches them again), which a real server's peak does; see the module's docstring.
    (A process started by ``exec``, by contrast, starts with the high-water mark of the
    address space the ``exec`` replaced, which the kernel carries over: through vfork, as
    ``subprocess`` spawns, that is the spawning parent's whole peak.)
    """
    import resource

    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def held_rss_bytes() -> int:
    """The private memory this process holds now (heap, tensors, Python's objects), in bytes.

    Measured without ``/proc``: a child forked now starts with a copy of this process's
    page tables for its private (anonymous and copied-on-write) pages, which count as
    its resident set at once, while shared file pages (the runtime's code) are only
    counted once touched again. The child's ``getrusage`` peak, taken before it does
    anything, is therefore what this process holds privately: what a steady serving
    process keeps, without the code pages every TF process shares through the page cache.
    Costs one fork (a few ms for a 1 GB process: page tables only, no copy).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only reports its count and leaves
        try:
            os.write(write_fd, str(peak_rss_bytes()).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as got:
            text = got.read()
    finally:
        os.waitpid(pid, 0)
    return int(text or 0)


def rss_bytes(field: str) -> int:
    """This process's memory figure ``field`` of /proc/self/status (``VmRSS``: now,
    ``VmHWM``: the peak), in bytes; 0 where there is none (no ``/proc``, as in the
    sandbox once its ``/proc`` is synthetic: use :func:`peak_rss_bytes` and
    :func:`held_rss_bytes` there).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _function(name: str):
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def serve_jobs() -> int:
    """The helper process: import TensorFlow once, then fork one child per job on stdin."""
    import tensorflow  # noqa: F401 - imported before forking, so children start warm

    from serving_opt.errors import first_line

    for line in sys.stdin:
        job = json.loads(line)
        try:
            # Imported here, before the fork: a child measures the job, not the import.
            run = _function(job["run"])
        except Exception as e:  # noqa: BLE001 - reported to the parent as data
            print(json.dumps({"error": f"{type(e).__name__}: {first_line(e)}"[:1000]}),
                  flush=True)
            continue
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                result = run(job)
            except BaseException as e:  # noqa: BLE001 - reported to the parent as data
                # TF's first line is often only a header ("Graph execution error:"); the
                # cause (an Assert's own message, a missing shard) must reach the user.
                result = {"error": f"{type(e).__name__}: {first_line(e)}"[:1000]}
            with os.fdopen(write_fd, "w") as out:
                out.write(json.dumps(result))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as got:
            text = got.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"error": f"the measuring process died (status {status})"})
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    tf_process.keep_plotting_out()
    sys.exit(serve_jobs())
