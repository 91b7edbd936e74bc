"""The limits of a sandbox that are not its view: memory, file sizes, threads and
processes, and what it may write to the host's disk.

Threads and processes: a pids cgroup of its own where the host lets serving_opt make
one; else ``RLIMIT_NPROC`` inside the sandbox's user namespace, which the kernel does
not apply to root; for root without a cgroup, a :class:`Watchdog` on the host that
counts the sandbox's tasks and kills it past the limit. Writing: ``RLIMIT_FSIZE`` for
any one file, and the :class:`Watchdog` for the bytes under its writable directories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

MAX_THREADS = 4096  # threads and processes of one sandbox
WRITE_BYTES = 1 << 30  # what a sandbox may write to the host's disk, by default
MAX_WRITTEN_FILES = 100_000  # and the files and directories it may make there
WATCH_SECONDS = 0.05  # the watchdog's period: its overshoot is what a model does in it


def default_memory_bytes() -> int:
    """Three quarters of the machine's memory, per sandboxed process."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return int(pages * size * 3 // 4)
    except (ValueError, OSError):
        return 16 << 30



def preexec(memory_bytes: int | None, write_bytes: int | None = None) -> Callable[[], None]:
    """Sets the memory limit, and the size of any one file written (RLIMIT_FSIZE), in
    the child before bubblewrap runs (inherited by all)."""
    limits = [("RLIMIT_DATA", memory_bytes or default_memory_bytes())]
    if write_bytes is not None:
        limits.append(("RLIMIT_FSIZE", write_bytes))

    def apply() -> None:
        import resource

        for name, limit in limits:
            # Never more than this process may have: a server started under a limit (a
            # container's, a test's prlimit) keeps it for its sandbox.
            _, hard = resource.getrlimit(getattr(resource, name))
            bound = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(getattr(resource, name), (bound, bound))

    return apply



# --- a pids cgroup per sandbox: the thread limit that holds for root too -------------

_CGROUP_ROOT = "/sys/fs/cgroup"
_cgroup_serial = iter(range(1 << 62))


def _own_cgroup_dirs() -> list[str]:
    """Where this process's pids cgroup lives, v1 (``pids`` hierarchy) then v2."""
    dirs = []
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            dirs.append(os.path.join(_CGROUP_ROOT, "pids", path.lstrip("/")))
        elif controllers == "":
            dirs.append(os.path.join(_CGROUP_ROOT, path.lstrip("/")))
    return dirs


def make_pids_cgroup(limit: int) -> str | None:
    """A new pids cgroup below this process's own, holding at most ``limit`` tasks
    (threads and processes); None where none can be made here (no pids controller, or
    not delegated to this user): :func:`limit_threads` then bounds a non-root sandbox, the
    :class:`Watchdog` a root one.

    RLIMIT_NPROC alone does not: the kernel exempts uid 0, which the sandbox's uid maps
    to when serving_opt runs as root (containers, CI).
    """
    for parent in _own_cgroup_dirs():
        _sweep_stale_cgroups(parent)
        path = os.path.join(parent, f"serving-opt-{os.getpid()}-{next(_cgroup_serial)}")
        try:
            os.mkdir(path, 0o755)  # fails where the parent is missing or not ours
        except OSError:
            continue
        try:
            _write_cgroup_file(path, "pids.max", str(limit))
            return path
        except OSError:
            remove_cgroup(path)
    return None


def _sweep_stale_cgroups(parent: str) -> None:
    # A caller killed outside Python (SIGKILL) never removes its cgroups: the next one
    # does, for processes that are gone. rmdir refuses a cgroup that still has tasks.
    import re

    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = re.fullmatch(r"serving-opt-(\d+)-\d+", name)
        if match is None or int(match[1]) == os.getpid():
            continue
        try:
            os.kill(int(match[1]), 0)
            continue  # alive (or its pid reused): not ours to judge
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            pass


def _write_cgroup_file(cgroup: str, name: str, value: str) -> None:
    # Never created: in a directory that is not a cgroup (a plain tmpfs where the
    # unified hierarchy would be), the write fails instead of making a file that limits
    # nothing.
    fd = os.open(os.path.join(cgroup, name), os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def remove_cgroup(path: str | None) -> None:
    """Removes a cgroup of :func:`make_pids_cgroup` once its processes are gone."""
    import time

    if not path:
        return
    # Its tasks leave it a moment after the sandbox's leader is reaped.
    for _ in range(40):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def preexec_confined(memory_bytes: int | None, cgroup: str | None,
                     write_bytes: int | None = None) -> Callable[[], None]:
    """:func:`preexec`, and the child joins ``cgroup`` before bubblewrap starts, so
    every process and thread of the sandbox counts against its limit."""
    limit_memory = preexec(memory_bytes, write_bytes)

    def apply() -> None:
        limit_memory()
        if cgroup:
            _write_cgroup_file(cgroup, "cgroup.procs", str(os.getpid()))

    return apply



def limit_threads(limit: int = MAX_THREADS) -> None:
    """RLIMIT_NPROC for this process and its children, set inside the sandbox: the kernel
    counts it per user namespace, so it bounds this sandbox's threads and processes, not
    the host user's. (A host running serving_opt as root is exempt: the kernel does not
    apply RLIMIT_NPROC to uid 0, which the sandbox's uid maps to there; the pids cgroup
    of :func:`popen` holds there, else the :class:`Watchdog`.)"""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard == resource.RLIM_INFINITY or hard > limit:
        soft = limit if soft == resource.RLIM_INFINITY else min(soft, limit)
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, limit))


class Watchdog:
    """Watches a sandbox from the host and kills it past a limit: ``max_tasks`` threads
    and processes (counted in the host's /proc, from the sandbox's first process down:
    a process of its pid namespace never leaves that tree), ``write_bytes`` of disk
    blocks (or :data:`MAX_WRITTEN_FILES` entries) under ``writable``. ``reason`` says
    which, once it has.

    Polling lets a model overshoot by what it does in one period (:data:`WATCH_SECONDS`
    for tasks, ten for bytes); RLIMIT_FSIZE and the memory limit bound that. Files
    removed but held open count; a removed file only mapped (no descriptor) does not."""

    def __init__(self, process: subprocess.Popen, max_tasks: int | None,
                 writable: Sequence[str] = (), write_bytes: int | None = None) -> None:
        self.process = process
        self.max_tasks = max_tasks
        self.writable = _outermost(writable) if write_bytes is not None else ()
        self.write_bytes = write_bytes
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"sandbox-watchdog-{process.pid}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        tick = 0
        while not self._stop.wait(WATCH_SECONDS) and self.process.poll() is None:
            tick += 1
            reason = None
            if self.max_tasks is not None:
                tasks = _tasks(self.process.pid, self.max_tasks)
                if len(tasks) > self.max_tasks:
                    reason = (f"the sandboxed run started more than {self.max_tasks} threads "
                              f"and processes (the sandbox's limit, sandbox.MAX_THREADS)")
            if reason is None and self.writable and tick % 10 == 0:
                reason = _over_written(self.writable, self.write_bytes,
                                       _unlinked_bytes(self.process.pid, self.writable))
            if reason is not None:
                self.reason = reason
                self._kill()
                return

    def _kill(self) -> None:
        # The sandbox's processes, then bubblewrap: its pid namespace dies with its first
        # process, so nothing forked meanwhile survives.
        for pid in [*_tasks(self.process.pid, None, processes_only=True)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.process.kill()
        except OSError:
            pass


def _tasks(root: int, limit: int | None, processes_only: bool = False) -> list[int]:
    """The threads (or, with ``processes_only``, the processes) of ``root``'s tree, as
    the host's /proc lists them; the walk stops once past ``limit``."""
    found: list[int] = []
    todo = [root]
    while todo and (limit is None or len(found) <= limit):
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found += [pid] if processes_only else [int(t) for t in tids]
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                pass
    return found


def _outermost(directories: Sequence[str]) -> tuple[str, ...]:
    """Each directory once, none inside another: nothing is counted twice."""
    real = sorted(dict.fromkeys(os.path.realpath(d) for d in directories))
    return tuple(d for d in real if not any(d.startswith(o.rstrip("/") + "/") for o in real))


def _unlinked_bytes(root: int, directories: Sequence[str]) -> int:
    """The disk blocks of files under ``directories`` that the sandbox's processes hold
    open after removing them: still on the disk, in no directory listing."""
    held: dict[tuple[int, int], int] = {}
    for pid in _tasks(root, None, processes_only=True):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not target.endswith(" (deleted)") or not any(
                        target.startswith(d.rstrip("/") + "/") for d in directories):
                    continue
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            held[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return sum(held.values())


def _over_written(directories: Sequence[str], limit: int, unlinked: int = 0) -> str | None:
    """Why what lies under ``directories`` (with ``unlinked`` bytes removed but held
    open) is past ``limit`` disk bytes (or :data:`MAX_WRITTEN_FILES` entries), else
    None."""
    used, entries = unlinked, 0
    todo = list(directories)
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    entries += 1
                    info = entry.stat(follow_symlinks=False)
                    used += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            continue
        if used > limit:
            return (f"the sandboxed run wrote more than {limit >> 20} MiB to the host's "
                    f"disk (its write limit: optimize's is four times the input model plus "
                    f"{WRITE_BYTES >> 30} GiB, other commands' {WRITE_BYTES >> 30} GiB)")
        if entries > MAX_WRITTEN_FILES:
            return (f"the sandboxed run made more than {MAX_WRITTEN_FILES} files "
                    "(its limit, sandbox_limits.MAX_WRITTEN_FILES)")
    return None


def write_limit(input_bytes: int) -> int:
    """What a run on a model of ``input_bytes`` may write: its candidates and their
    scratch, four times the input, plus :data:`WRITE_BYTES` of slack."""
    return 4 * input_bytes + WRITE_BYTES
