"""Every process that runs a model runs in a sandbox: a SavedModel is code.

A deny-list of ops (``untrusted``) always misses a route, so the processes that load
and run a model (freezing, parity, the TF2 load check, cold start, the benchmark, the
local server under ``validate``, ``compare``'s workers) run under bubblewrap
(``bwrap``, Debian package ``bubblewrap``), each as if the static check were absent:

* the filesystem is empty but for read-only binds of the system (``/usr``, the dynamic
  loader's cache), the Python environment (the interpreter's prefixes and the
  ``serving_opt`` package itself, nothing else of its checkout), the model directories
  and the user's example files; ``/tmp`` is a private tmpfs; no home directory, no
  ``/etc`` beyond the loader's cache;
* one directory is writable: the run's own work directory (a hidden, claimed
  directory of the model base that holds the candidate and scratch files);
* no network (``--unshare-net``: a loopback of its own, so the local server and its
  client talk inside it), no view of other processes (``--unshare-pid``), a new
  session (no terminal injection), ``--die-with-parent``;
* nothing of the host's identity: uid/gid 65534 in a user namespace of its own with no
  capabilities and no nested user namespace, hostname ``sandbox``, the environment
  reduced to the settings TensorFlow and its libraries read (by name); a seccomp
  filter denies the system calls no model needs (:func:`seccomp_program`);
* limits (:mod:`serving_opt.sandbox.limits`): memory (``RLIMIT_DATA``, every process
  of the sandbox), sized tmpfs mounts, threads and processes (a pids cgroup of its own
  where the host lets serving_opt make one, else ``RLIMIT_NPROC`` inside, else for
  root a watchdog counting its tasks), what it writes to the host's disk
  (``RLIMIT_FSIZE`` and the watchdog: optimize four times the input model plus 1 GiB,
  other commands 1 GiB), a wall-clock limit on a :class:`Worker`'s call
  (``--sandbox_timeout_seconds``; :data:`DEFAULT_TIMEOUT_SECONDS` unless the command
  sets its own), and bounded output (progress lines, the stderr tail);
* no procfs: ``/proc`` holds the CPU and memory facts TensorFlow reads and a neutral
  ``self/exe``/``self/cmdline`` (``sandbox.view``): a real one shows host paths in
  ``mountinfo``; no ``/sys/fs/cgroup`` (the host's cgroup tree).

What comes back out is data, not code: a result crosses as JSON of an explicit schema
(:mod:`serving_opt.sandbox.results`), which imports nothing a file names; the published
model is checked statically again outside.

Where bubblewrap cannot run (not installed, no user namespaces, not Linux),
:func:`require` says so in one line and refuses unless the caller passed
``allow_unsandboxed``; reports say which it was (:func:`describe`).

    policy = Policy(read_only=("exports/1",), writable=("models/.serving-opt-run-x",))
    result = call("serving_opt.pipeline.optimizer:build_in_worker", job, policy=policy)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.sandbox import results as sandbox_results
from serving_opt.sandbox.interpreter import interpreter_dirs  # noqa: F401 - public here
from serving_opt.sandbox.limits import (  # noqa: F401 - public here
    MAX_THREADS,
    WRITE_BYTES,
    Watchdog,
    default_memory_bytes,
    limit_threads,
    make_pids_cgroup,
    preexec,
    preexec_confined,
    remove_cgroup,
    write_limit,
)
from serving_opt.sandbox.view import (  # noqa: F401 - public here
    HOSTNAME,
    SANDBOX_UID,
    SHM_BYTES,
    TMP_BYTES,
    bwrap_args,
    package_parent,
    seccomp_pipe,
    seccomp_program,
)
from serving_opt.savedmodel import tf_process

# Set inside a sandbox: code that would start one runs in-process instead.
INSIDE_ENV = "SERVING_OPT_SANDBOXED"
PROGRESS_PREFIX = "@@serving-opt-progress@@ "
DEFAULT_TIMEOUT_SECONDS = 6 * 3600.0  # a Worker's call, unless its policy says otherwise
MAX_RESULT_BYTES = 512 << 20  # a report with its probes and arrays; never a model
MAX_LINE_BYTES = 64 << 10  # a progress line; the rest of a longer line is dropped
STDERR_KEEP_BYTES = 256 << 10  # the tail of a worker's stderr kept for its error message
STDERR_MAX_BYTES = 4 << 20  # the file holding it is cut back to the tail beyond this
# Environment variables a sandboxed process keeps, by exact name: what TensorFlow,
# oneDNN/MKL, OpenMP and the CUDA runtime read to configure themselves. Everything
# else stays outside: tokens and cloud credentials, and any TF_*/CUDA_* that is not a
# setting (Terraform's TF_TOKEN_*, TF_VAR_*): whatever the model can read it can bake
# into the published graph.
_KEEP_ENV = frozenset({
    "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "PYTHONWARNINGS",
    # TensorFlow
    "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_MIN_VLOG_LEVEL",
    "TF_CPP_VMODULE", "TF_CPP_LOG_THREAD_ID", "TF_ENABLE_ONEDNN_OPTS",
    "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_XLA_FLAGS",
    "TF_GRAPPLER_GRAPH_DEF_PATH", "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC",
    "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "TF_GPU_THREAD_MODE",
    "TF_GPU_THREAD_COUNT", "TF_ENABLE_GPU_GARBAGE_COLLECTION", "TF_USE_LEGACY_KERAS",
    "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR",
    "TF_DISABLE_MKL", "TF_MKL_OPTIMIZE_PRIMITIVE_MEMUSE", "TF_RUN_EAGER_OP_AS_FUNCTION",
    "TF_ENABLE_AUTO_MIXED_PRECISION", "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL",
    # OpenMP / Intel OpenMP / MKL / oneDNN
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "OMP_DYNAMIC",
    "OMP_SCHEDULE", "OMP_STACKSIZE", "OMP_MAX_ACTIVE_LEVELS", "KMP_AFFINITY",
    "KMP_BLOCKTIME", "KMP_SETTINGS", "KMP_HW_SUBSET", "KMP_DUPLICATE_LIB_OK",
    "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
    "ONEDNN_VERBOSE", "ONEDNN_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS", "ONEDNN_DEFAULT_FPMATH_MODE",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_VERBOSE", "DNNL_MAX_CPU_ISA",
    "DNNL_CPU_ISA_HINTS", "DNNL_DEFAULT_FPMATH_MODE", "DNNL_PRIMITIVE_CACHE_CAPACITY",
    # CUDA runtime
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_CACHE_DISABLE",
    "CUDA_MODULE_LOADING",
})
# Prefixes only where the namespace is serving_opt's own (SERVING_OPT_RUNTIME_2_15, ...)
# or the locale's.
_KEEP_ENV_PREFIXES = ("SERVING_OPT_", "LC_")

@dataclass(frozen=True)
class Policy:
    """What a sandboxed process may see and touch."""

    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    network: bool = False  # never for a model; kept for what has no model in it
    memory_bytes: int | None = None  # None: default_memory_bytes()
    tmp_bytes: int = TMP_BYTES  # the private /tmp's size
    # A Worker's call; None: DEFAULT_TIMEOUT_SECONDS (a model can block for ever).
    timeout_seconds: float | None = None
    max_threads: int = MAX_THREADS  # threads and processes, all of the sandbox's
    # Disk bytes under ``writable`` (and the size of any one file it writes); None: no
    # limit, for what has no model in it.
    write_bytes: int | None = WRITE_BYTES


def inside() -> bool:
    """True in a process this module started (a sandbox does not nest)."""
    return os.environ.get(INSIDE_ENV) == "1"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when bubblewrap runs here; else one line saying why not."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    try:
        done = subprocess.run(bwrap_args(bwrap, Policy()) + ["/bin/true"],
                              capture_output=True, timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap does not start: {e}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"bubblewrap cannot create its namespaces here ({why})"
    return None


def require(allow_unsandboxed: bool, what: str) -> bool:
    """True when ``what`` will run sandboxed; False when it may run without (the user
    said so); ServingOptError when it may not.
    """
    if inside():
        return False  # already in one: the caller's sandbox holds
    reason = unavailable_reason()
    if reason is None:
        return True
    if allow_unsandboxed:
        return False
    raise ServingOptError(
        f"cannot sandbox {what}: {reason}; a SavedModel is code, so nothing was run",
        "install bubblewrap (and allow user namespaces), or pass --allow_unsandboxed "
        "for a model you trust")


def describe(sandboxed: bool) -> str:
    """The report's line on isolation."""
    if sandboxed:
        return "bubblewrap: read-only model and Python, writable work directory only, " \
               "no network, uid 65534 without capabilities"
    if inside():
        return "inside the caller's bubblewrap sandbox"
    reason = unavailable_reason()
    return "off (--allow_unsandboxed" + (f"; {reason})" if reason else ")")


def command(argv: Sequence[str], policy: Policy, seccomp_fd: int | None = None) -> list[str]:
    """``argv`` wrapped in bubblewrap with ``policy``; paths are bound at their real path.
    ``seccomp_fd``: a file descriptor the child inherits holding :func:`seccomp_program`
    (see :func:`seccomp_pipe`).
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ServingOptError("bubblewrap (bwrap) is not installed",
                              "apt-get install bubblewrap")
    return [*bwrap_args(bwrap, policy, seccomp_fd, program=argv[0]), "--", *argv]


def search_path(*directories: str) -> dict:
    """``{"PATH": ...}`` for :func:`environment`: the system's, after ``directories``
    (a tensorflow_model_server outside /usr, bound read-only by the policy)."""
    return {"PATH": os.pathsep.join([*directories, "/usr/local/bin", "/usr/bin", "/bin"])}


def glob_files(pattern: str) -> list[str]:
    """The regular files a local glob matches, absolute: what a sandbox binds for it, one
    by one and read-only (never their directory: a secret or a socket beside the
    examples stays outside). A remote pattern (``gs://...``) binds nothing.
    """
    import glob

    if "://" in pattern:
        return []
    matched = glob.glob(os.path.abspath(pattern), recursive=True)
    return sorted(path for path in matched if os.path.isfile(path))


def environment(extra: dict | None = None) -> dict:
    """The environment inside: no secrets, HOME and TMPDIR in the private /tmp; TensorFlow
    configured as this process started (not as it configured itself to optimize); in
    ``extra`` a None value unsets."""
    env = {k: v for k, v in os.environ.items()
           if k in _KEEP_ENV or k.startswith(_KEEP_ENV_PREFIXES)}
    env.update({
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "PYTHONPATH": package_parent(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        INSIDE_ENV: "1",
    })
    return tf_process.with_runtime_defaults(env, extra)


def popen(argv: Sequence[str], policy: Policy, env: dict | None = None,
          **popen_kwargs) -> subprocess.Popen:
    """``argv`` started in the sandbox ``policy`` describes, with every limit: the
    environment reduced (:func:`environment`, ``env`` on top), the seccomp filter, the
    memory and write limits, a pids cgroup of ``policy.max_threads`` where one can be
    made, and a :class:`Watchdog` for what no kernel limit holds (the tasks of a root
    sandbox without a cgroup, the bytes under its writable directories). The cgroup
    goes when the process object does (or at :func:`release`).
    """
    import weakref

    cgroup = make_pids_cgroup(policy.max_threads)
    seccomp = seccomp_pipe()
    pass_fds = tuple(popen_kwargs.pop("pass_fds", ())) + ((seccomp,) if seccomp is not None
                                                           else ())
    try:
        process = subprocess.Popen(
            command(argv, policy, seccomp), env=environment(env),
            preexec_fn=preexec_confined(policy.memory_bytes, cgroup, policy.write_bytes),
            cwd=popen_kwargs.pop("cwd", "/tmp"), pass_fds=pass_fds, **popen_kwargs)
    except BaseException:
        remove_cgroup(cgroup)
        raise
    finally:
        if seccomp is not None:
            os.close(seccomp)
    process.serving_opt_cgroup = cgroup  # type: ignore[attr-defined]
    # RLIMIT_NPROC inside holds where the host user is not root.
    unbounded = cgroup is None and os.geteuid() == 0
    watched = policy.writable if policy.write_bytes is not None else ()
    process.serving_opt_watchdog = Watchdog(  # type: ignore[attr-defined]
        process, policy.max_threads if unbounded else None, watched, policy.write_bytes) \
        if unbounded or watched else None
    weakref.finalize(process, remove_cgroup, cgroup)
    return process


def release(process: subprocess.Popen) -> None:
    """Removes the cgroup of a :func:`popen` process that has exited."""
    watchdog = getattr(process, "serving_opt_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    remove_cgroup(getattr(process, "serving_opt_cgroup", None))


def stopped_because(process: subprocess.Popen) -> str | None:
    """Why the :class:`Watchdog` killed a :func:`popen` process, if it did."""
    watchdog = getattr(process, "serving_opt_watchdog", None)
    return watchdog.reason if watchdog is not None else None


# --- results: data only -------------------------------------------------------------

loads = sandbox_results.loads
dumps = sandbox_results.dumps


def _read_result(path: str) -> bytes:
    """A regular file of bounded size, never followed through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RESULT_BYTES:
            raise ServingOptError("the sandboxed process left no usable result",
                                  "rerun with --verbosity=1 and report this")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_RESULT_BYTES + 1)
    finally:
        os.close(fd)


# --- calling a function in a sandbox ------------------------------------------------

class Worker:
    """A sandboxed Python process that imports TensorFlow at once and then runs one call
    sent on its stdin; the caller can do other work (read, check) meanwhile.
    """

    def __init__(self, policy: Policy, scratch: str, progress: Callable[[str], None] | None = None,
                 env: dict | None = None, preload: str = "tensorflow",
                 sandboxed: bool = True) -> None:
        self.scratch = scratch
        self.result_path = os.path.join(scratch, ".sandbox-result.json")
        self.progress = progress or (lambda _: None)
        self.timeout = policy.timeout_seconds if policy.timeout_seconds is not None \
            else DEFAULT_TIMEOUT_SECONDS
        argv = [sys.executable, "-m", "serving_opt.sandbox", preload, self.result_path]
        policy = dataclasses.replace(policy, writable=(*policy.writable, scratch))
        # stderr through a pipe into a file cut back to its tail: a model that writes
        # without end fills neither the host's /tmp nor this process's memory.
        self._stderr = tempfile.TemporaryFile()
        self._stderr_lock = threading.Lock()
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if sandboxed:
            self.process = popen(argv, policy, env, **pipes)
        else:
            self.process = subprocess.Popen(
                argv, env=tf_process.with_runtime_defaults(os.environ, env), **pipes)
        self._reader = threading.Thread(target=self._forward_progress, daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._keep_stderr, daemon=True)
        self._stderr_reader.start()

    def _forward_progress(self) -> None:
        for line in bounded_lines(self.process.stdout, MAX_LINE_BYTES):
            if line.startswith(PROGRESS_PREFIX):
                # Printable text only: a model's names must not drive the terminal.
                text = line[len(PROGRESS_PREFIX):]
                self.progress("".join(c if c.isprintable() else "?" for c in text))

    def _keep_stderr(self) -> None:
        try:
            self._append_stderr()
        except (OSError, ValueError):
            pass  # closed under it: the worker is gone

    def _append_stderr(self) -> None:
        while True:
            chunk = self.process.stderr.read1(1 << 16)
            if not chunk:
                return
            with self._stderr_lock:
                self._stderr.seek(0, os.SEEK_END)
                self._stderr.write(chunk)
                if self._stderr.tell() > STDERR_MAX_BYTES:
                    self._stderr.seek(-STDERR_KEEP_BYTES, os.SEEK_END)
                    tail = self._stderr.read()
                    self._stderr.seek(0)
                    self._stderr.truncate()
                    self._stderr.write(tail)
                self._stderr.flush()

    def call(self, target: str, *args, **kwargs):
        """Runs ``module:function(*args, **kwargs)`` in the worker; returns its result
        (data only) or raises the ServingOptError it raised."""
        try:
            pickle.dump((target, args, kwargs), self.process.stdin)
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it died starting; the exit status below says why
        try:
            code = self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServingOptError(
                f"the sandboxed run was stopped after {self.timeout:.0f} s "
                f"(--sandbox_timeout_seconds={self.timeout:.0f}); nothing was published",
                "raise --sandbox_timeout_seconds for a model this slow; a model that "
                "blocks for ever (a queue nobody fills) never finishes") from None
        except BaseException:
            self.kill()
            raise
        release(self.process)
        self._reader.join(timeout=5)
        self._stderr_reader.join(timeout=5)
        stopped = stopped_because(self.process)
        if stopped is not None:
            raise ServingOptError(f"{stopped}; it was stopped and nothing was published",
                                  "a model that needs this much is not one serving_opt runs")
        if code != 0 or not os.path.exists(self.result_path):
            raise ServingOptError(f"the sandboxed process failed (exit {code}): "
                                  f"{self.stderr_tail()}{_limit_hint(self.stderr_tail(5))}",
                                  "rerun with --verbosity=1; --allow_unsandboxed runs it "
                                  "without the sandbox, for a model you trust")
        outcome = loads(_read_result(self.result_path))
        os.unlink(self.result_path)
        if not isinstance(outcome, dict) or not isinstance(outcome.get("error", {}), dict):
            raise ServingOptError("the sandboxed process returned something else than a result",
                                  "a model that writes files can forge its run's result: "
                                  "rerun without --allow_file_ops")
        if "error" in outcome:
            raise _rebuild_error(outcome["error"])
        return outcome.get("result")

    def stderr_tail(self, lines: int = 1) -> str:
        """The last ``lines`` lines of the worker's stderr (of its last
        :data:`STDERR_KEEP_BYTES` at most)."""
        with self._stderr_lock:
            self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, self._stderr.tell() - STDERR_KEEP_BYTES))
            data = self._stderr.read()
        text = data.decode(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "no output"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        release(self.process)

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()  # a worker never sent a call exits
            except OSError:
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self._stderr_reader.join(timeout=5)
        with self._stderr_lock:
            self._stderr.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.kill()
        self.close()


def bounded_lines(stream, limit: int):
    """The lines of a binary stream as text, each cut at ``limit`` bytes (the rest of a
    longer line is read and dropped, never held)."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if not line.endswith(b"\n"):
            while True:  # drop the rest of an over-long line
                rest = stream.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
        yield line.decode(errors="replace").rstrip("\n")


def _limit_hint(stderr: str) -> str:
    """Names the sandbox's limit a failure looks like it ran into."""
    if "No space left on device" in stderr:
        return f" (the sandbox's /tmp holds {TMP_BYTES >> 20} MiB, sandbox.TMP_BYTES)"
    if "Resource temporarily unavailable" in stderr or "pthread_create" in stderr:
        return f" (a sandbox runs at most {MAX_THREADS} threads, sandbox.MAX_THREADS)"
    if "File too large" in stderr:
        return " (a sandbox writes no file larger than its write limit, sandbox.write_limit)"
    if "MemoryError" in stderr or "bad_alloc" in stderr or "Cannot allocate memory" in stderr:
        return " (the memory limit of each sandboxed process, --sandbox_memory_bytes)"
    return ""


def call(target: str, *args, policy: Policy, sandboxed: bool = True,
         progress: Callable[[str], None] | None = None, env: dict | None = None, **kwargs):
    """One call in a fresh sandboxed worker (see :class:`Worker`); in-process when
    ``sandboxed`` is False, or already inside a sandbox.
    """
    if inside() or not sandboxed:
        return _resolve(target)(*args, **kwargs)
    scratch = tempfile.mkdtemp(prefix="serving-opt-sandbox-")
    try:
        with Worker(policy, scratch, progress, env=env) as worker:
            return worker.call(target, *args, **kwargs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_ERRORS = ("ServingOptError", "UsageError", "ParityError", "ValidationError")


def _rebuild_error(error: dict) -> ServingOptError:
    from serving_opt import errors

    cls_name = error.get("type")
    cls = getattr(errors, cls_name) if cls_name in _ERRORS else ServingOptError
    fix = error.get("fix")
    rebuilt = cls(str(error.get("problem", "")), fix if isinstance(fix, str) else None)
    attrs = error.get("attrs")
    for name, value in (attrs.items() if isinstance(attrs, dict) else ()):
        # Text attributes only, never one of Python's own (a forged file could name them).
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_") \
                and not hasattr(type(rebuilt), name) and isinstance(value, str):
            setattr(rebuilt, name, value)
    if dataclasses.is_dataclass(error.get("report")):
        rebuilt.with_report(error["report"])
    return rebuilt


def _resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    if not module.startswith("serving_opt."):
        raise ValueError(f"{target} is not serving_opt's")
    return getattr(importlib.import_module(module), name)


def say(message: str) -> None:
    """Progress from inside a worker, forwarded by the caller's :class:`Worker`."""
    print(PROGRESS_PREFIX + message.replace("\n", " "), flush=True)


def _serve(preload: str, result_path: str) -> int:
    """The worker: import what is slow now, then run the one call sent on stdin."""
    if inside():
        limit_threads()  # inside the sandbox's user namespace: counted per sandbox
    if preload == "optimize":
        tf_process.configure_for_optimizing()  # before TensorFlow is imported
        tf_process.quiet_tensorflow_import()
    elif preload == "tensorflow":
        tf_process.quiet_tensorflow_import()
    request = sys.stdin.buffer.read()
    if not request:
        return 0  # the caller gave up before sending a call
    target, args, kwargs = pickle.loads(request)  # from the caller: trusted
    outcome: dict
    try:
        outcome = {"result": _resolve(target)(*args, **kwargs)}
    except ServingOptError as e:
        outcome = {"error": {"type": type(e).__name__, "problem": e.problem, "fix": e.fix,
                             "report": e.report,
                             "attrs": {k: v for k, v in vars(e).items()
                                       if isinstance(v, str) and k not in ("problem", "fix")}}}
    except Exception as e:  # noqa: BLE001 - reported to the caller as data
        from serving_opt.errors import first_line

        outcome = {"error": {"type": "ServingOptError",
                             "problem": f"internal error in the sandboxed run: "
                                        f"{type(e).__name__}: {first_line(e)}",
                             "fix": "rerun with --verbosity=1 and report this"}}
    try:
        data = dumps(outcome)
    except TypeError as e:  # a result outside the schema: serving_opt's own bug
        data = dumps({"error": {"type": "ServingOptError",
                                "problem": f"internal error in the sandboxed run: {e}",
                                "fix": "rerun with --verbosity=1 and report this"}})
    with open(result_path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(result_path + ".tmp", result_path)
    return 0
