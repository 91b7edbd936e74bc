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
* limits: memory (``RLIMIT_DATA``, every process of the sandbox), sized tmpfs mounts,
  threads and processes (a pids cgroup of its own where the host lets serving_opt make
  one, else ``RLIMIT_NPROC`` inside, which the kernel does not apply to root), a
  wall-clock limit on a :class:`Worker`'s call, and bounded output (progress lines, the
  stderr tail);
* no procfs: ``/proc`` holds the CPU and memory facts TensorFlow reads and a neutral
  ``self/exe``/``self/cmdline`` (:func:`_proc_args`): a real one shows host paths in
  ``mountinfo``.

What comes back out is data, not code: a result crosses as JSON of an explicit schema
(:mod:`serving_opt.sandbox_results`), which imports nothing a file names; the published
model is checked statically again outside.

Where bubblewrap cannot run (not installed, no user namespaces, not Linux),
:func:`require` says so in one line and refuses unless the caller passed
``allow_unsandboxed``; reports say which it was (:func:`describe`).

    policy = Policy(read_only=("exports/1",), writable=("models/.serving-opt-run-x",))
    result = call("serving_opt.optimizer:build_in_worker", job, policy=policy)
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

from serving_opt import sandbox_results
from serving_opt.errors import ServingOptError
from serving_opt.sandbox_interpreter import interpreter_dirs  # noqa: F401 - public here
from serving_opt.sandbox_limits import (  # noqa: F401 - public here
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
from serving_opt.savedmodel import loader

# Set inside a sandbox: code that would start one runs in-process instead.
INSIDE_ENV = "SERVING_OPT_SANDBOXED"
PROGRESS_PREFIX = "@@serving-opt-progress@@ "
MAX_RESULT_BYTES = 512 << 20  # a report with its probes and arrays; never a model
MAX_LINE_BYTES = 64 << 10  # a progress line; the rest of a longer line is dropped
STDERR_KEEP_BYTES = 256 << 10  # the tail of a worker's stderr kept for its error message
STDERR_MAX_BYTES = 4 << 20  # the file holding it is cut back to the tail beyond this
TMP_BYTES = 1 << 30  # the sandbox's /tmp (a tmpfs: host memory RLIMIT_DATA does not count)
SHM_BYTES = 256 << 20  # its /dev/shm
SANDBOX_UID = 65534  # "nobody": the sandbox's uid and gid, with no capabilities
HOSTNAME = "sandbox"
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
    """What a sandboxed process may see and touch.

    Example:
        >>> Policy(read_only=("exports/1",), writable=("/models/clf/.serving-opt-run-1",))
    """

    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    network: bool = False  # never for a model; kept for what has no model in it
    memory_bytes: int | None = None  # None: default_memory_bytes()
    tmp_bytes: int = TMP_BYTES  # the private /tmp's size
    timeout_seconds: float | None = None  # a Worker's call; None: no limit
    max_threads: int = MAX_THREADS  # threads and processes, all of the sandbox's
    # Disk bytes under ``writable`` (and the size of any one file it writes); None: no
    # limit, for what has no model in it.
    write_bytes: int | None = WRITE_BYTES


def inside() -> bool:
    """True in a process this module started (a sandbox does not nest)."""
    return os.environ.get(INSIDE_ENV) == "1"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when bubblewrap runs here; else one line saying why not.

    Example:
        >>> unavailable_reason() is None   # Linux with bubblewrap installed
        True
    """
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    try:
        done = subprocess.run(_bwrap_prefix(bwrap, Policy()) + ["/bin/true"],
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

    Example:
        >>> require(False, "optimize")
        True
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


def _python_binds() -> list[str]:
    """The interpreter's prefixes and the real directory of the serving_opt package."""
    package = _package_dir()
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, package,
             os.path.dirname(os.path.realpath(sys.executable))]
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in paths) if os.path.exists(p)]


def _package_dir() -> str:
    # This module's own folder: importing the package root would tie the sandbox to
    # everything the root re-exports (the optimizer, lazily) in the import graph.
    return os.path.dirname(os.path.realpath(__file__))


def package_parent() -> str:
    return os.path.dirname(_package_dir())


def _system_binds() -> list[tuple[str, str]]:
    """(option, path) for the system: /usr and its merged-/usr links, the loader cache."""
    binds: list[tuple[str, str]] = [("--ro-bind", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            binds.append(("--symlink", top))
        elif os.path.isdir(top):
            binds.append(("--ro-bind", top))
    # Not /sys/fs/cgroup: it shows the host's cgroup tree (and, with it, its processes),
    # and nothing a model runs reads it without /proc/self/cgroup, which the sandbox's
    # /proc does not have.
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime",
                 "/sys/devices/system/cpu"):
        if os.path.exists(path):
            binds.append(("--ro-bind", path))
    return binds


def _bwrap_prefix(bwrap: str, policy: Policy, seccomp_fd: int | None = None,
                  program: str = "/bin/true") -> list[str]:
    # An unprivileged uid of its own user namespace, no capabilities, no nested user
    # namespace, a fixed hostname: nothing of the host's identity for a model to read
    # (and bake into the published graph). Files it writes in the bound work directory
    # belong to the host user that ran serving_opt (the one uid the namespace maps).
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-user",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            *(["--disable-userns"] if _supports(bwrap, "--disable-userns") else []),
            "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--hostname", HOSTNAME, "--unshare-cgroup-try"]
    if not policy.network:
        args.append("--unshare-net")
    for option, path in _system_binds():
        if option == "--symlink":
            args += ["--symlink", os.readlink(path), path]
        else:
            args += [option, path, path]
    # tmpfs mounts are host memory RLIMIT_DATA does not count: each has a size, and the
    # /dev tmpfs (which bwrap leaves unsized) is read-only once /dev/shm is mounted.
    sized = _supports(bwrap, "--size")  # bubblewrap >= 0.5
    args += [*_proc_args(program, sized), "--dev", "/dev",
             *(["--size", str(SHM_BYTES)] if sized else []), "--tmpfs", "/dev/shm",
             *(["--size", str(policy.tmp_bytes)] if sized else []), "--tmpfs", "/tmp"]
    for path in _python_binds():
        args += ["--ro-bind", path, path]
    for option, paths in (("--ro-bind", policy.read_only), ("--bind", policy.writable)):
        for source, target in _bind_pairs(paths):
            if option == "--bind" or os.path.exists(source):
                args += [option, source, target]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args


def _proc_args(program: str, sized: bool) -> list[str]:
    """A /proc of a few files, not a procfs. A real one shows the host wherever the
    sandbox touches it: a bind mount's source path in ``/proc/self/mountinfo`` (the
    checkout, the user's directories), the host's boot time and processes' counters.
    bubblewrap cannot hide those per-process files, so the sandbox has none: the CPU and
    memory facts TensorFlow and oneDNN read, and the two files TensorFlow's
    ``GetExecutablePath`` insists on (``self/exe``, ``self/cmdline``), neutral. What a
    sandboxed process measures of itself comes from system calls instead
    (``getrusage``); the caller reads the rest from the host's /proc."""
    args = [*(["--size", str(64 << 10)] if sized else []), "--tmpfs", "/proc"]
    for name in ("cpuinfo", "meminfo"):
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    return [*args, "--dir", "/proc/self", "--symlink", os.path.realpath(program), "/proc/self/exe",
            "--ro-bind", _neutral_cmdline(), "/proc/self/cmdline", "--remount-ro", "/proc"]


@functools.lru_cache(maxsize=1)
def _neutral_cmdline() -> str:
    """A file holding a command line that says nothing of the host (``python3``): what a
    sandboxed process reads as ``/proc/self/cmdline``."""
    import atexit

    fd, path = tempfile.mkstemp(prefix="serving-opt-cmdline-")
    with os.fdopen(fd, "wb") as f:
        f.write(b"python3\0")
    os.chmod(path, 0o444)
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))
    return path


@functools.lru_cache(maxsize=8)
def _supports(bwrap: str, option: str) -> bool:
    """Whether this bubblewrap knows ``option`` (``--disable-userns`` is 0.8's,
    ``--size`` 0.5's): an older one still sandboxes, without that layer."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in done.stdout + done.stderr


def _bind_pairs(paths: Sequence[str]) -> list[tuple[str, str]]:
    # Each path at its real path, and also where the caller names it when that goes
    # through a symlink (a model base like /models/current -> /models/v3): the worker
    # is handed the caller's path, and the sandbox has none of the host's symlinks.
    pairs = {}
    for path in paths:
        real = os.path.realpath(path)
        pairs[(real, real)] = None
        given = os.path.abspath(path)
        if given != real:
            pairs[(real, given)] = None
    return list(pairs)


def command(argv: Sequence[str], policy: Policy, seccomp_fd: int | None = None) -> list[str]:
    """``argv`` wrapped in bubblewrap with ``policy``; paths are bound at their real path.
    ``seccomp_fd``: a file descriptor the child inherits holding :func:`seccomp_program`
    (see :func:`seccomp_pipe`).

    Example:
        >>> command(["python", "-c", "pass"], Policy())[:2]
        ['/usr/bin/bwrap', '--die-with-parent']
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ServingOptError("bubblewrap (bwrap) is not installed",
                              "apt-get install bubblewrap")
    return [*_bwrap_prefix(bwrap, policy, seccomp_fd, program=argv[0]), "--", *argv]


# --- seccomp: system calls no model needs ---------------------------------------------

# x86_64 numbers: ptrace, mount and the new mount API, pivot_root, chroot, swap, reboot,
# host names, kernel modules, kexec, keyrings, unshare/setns, cross-process memory,
# handles to inodes, bpf, perf events, userfaultfd, io_uring (whose operations bypass
# seccomp), acct, quotactl, iopl/ioperm, lookup_dcookie.
_DENIED_SYSCALLS_X86_64 = (
    101, 165, 166, 155, 161, 167, 168, 169, 170, 171, 172, 173, 163, 179, 175, 176, 313,
    246, 320, 248, 249, 250, 272, 308, 310, 311, 303, 304, 321, 298, 323, 425, 426, 427,
    428, 429, 430, 431, 432, 433, 442, 212)
_AUDIT_ARCH_X86_64 = 0xC000003E


def seccomp_program() -> bytes | None:
    """A classic BPF seccomp filter (``struct sock_filter[]``, as bubblewrap's
    ``--seccomp`` reads it): EPERM for the system calls in
    :data:`_DENIED_SYSCALLS_X86_64`, for x32 and for any other architecture's calls;
    None where the machine is not x86_64 (no filter: the namespaces still hold)."""
    import platform
    import struct

    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    ld_w_abs, jmp_jeq, jmp_jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO|EPERM
    denied = _DENIED_SYSCALLS_X86_64
    # 0 load arch; 1 arch?; 2 deny; 3 load nr; 4 x32?; 5.. one test each; allow; deny.
    # A jump's offset counts from the next instruction.
    to_deny = 6 + len(denied)
    program = [(ld_w_abs, 0, 0, 4), (jmp_jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, deny),
               (ld_w_abs, 0, 0, 0), (jmp_jge, to_deny - 5, 0, 0x40000000)]
    for index, number in enumerate(denied):
        program.append((jmp_jeq, to_deny - (5 + index) - 1, 0, number))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def seccomp_pipe() -> int | None:
    """A pipe's read end holding :func:`seccomp_program` (for :func:`command`'s
    ``seccomp_fd`` and ``Popen(pass_fds=...)``); the caller closes it after starting the
    child. None when there is no filter for this machine."""
    program = seccomp_program()
    if program is None:
        return None
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # a few hundred bytes: within the pipe's buffer
    finally:
        os.close(write_end)
    return read_end


def search_path(*directories: str) -> dict:
    """``{"PATH": ...}`` for :func:`environment`: the system's, after ``directories``
    (a tensorflow_model_server outside /usr, bound read-only by the policy)."""
    return {"PATH": os.pathsep.join([*directories, "/usr/local/bin", "/usr/bin", "/bin"])}


def glob_files(pattern: str) -> list[str]:
    """The regular files a local glob matches, absolute: what a sandbox binds for it, one
    by one and read-only (never their directory: a secret or a socket beside the
    examples stays outside). A remote pattern (``gs://...``) binds nothing.

    Example:
        >>> glob_files("data/eval-*.tfrecord")
        ['/home/me/data/eval-0.tfrecord', '/home/me/data/eval-1.tfrecord']
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
    return loader.with_runtime_defaults(env, extra)


def popen(argv: Sequence[str], policy: Policy, env: dict | None = None,
          **popen_kwargs) -> subprocess.Popen:
    """``argv`` started in the sandbox ``policy`` describes, with every limit: the
    environment reduced (:func:`environment`, ``env`` on top), the seccomp filter, the
    memory and write limits, a pids cgroup of ``policy.max_threads`` where one can be
    made, and a :class:`Watchdog` for what no kernel limit holds (the tasks of a root
    sandbox without a cgroup, the bytes under its writable directories). The cgroup
    goes when the process object does (or at :func:`release`).

    Example:
        >>> process = popen([sys.executable, "-c", "print(1)"], Policy(),
        ...                 stdout=subprocess.PIPE)
        >>> process.communicate()[0]
        b'1\n'
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
    process.serving_opt_watchdog = Watchdog(  # type: ignore[attr-defined]
        process, policy.max_threads if unbounded else None, policy.writable,
        policy.write_bytes)
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

    Example:
        >>> worker = Worker(Policy(read_only=("exports/1",)), scratch="/tmp/w")
        >>> worker.call("serving_opt.savedmodel.loader:read_saved_model", "exports/1")
    """

    def __init__(self, policy: Policy, scratch: str, progress: Callable[[str], None] | None = None,
                 env: dict | None = None, preload: str = "tensorflow",
                 sandboxed: bool = True) -> None:
        self.scratch = scratch
        self.result_path = os.path.join(scratch, ".sandbox-result.json")
        self.progress = progress or (lambda _: None)
        self.timeout = policy.timeout_seconds
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
                argv, env=loader.with_runtime_defaults(os.environ, env), **pipes)
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
        if not isinstance(outcome, dict):
            raise ServingOptError("the sandboxed process returned something else than a result",
                                  "report this")
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

    Example:
        >>> call("serving_opt.serving.validate:execute", base, options,
        ...      policy=Policy(read_only=(base,)))
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
    rebuilt = cls(str(error.get("problem", "")), error.get("fix"))
    for name, value in (error.get("attrs") or {}).items():
        if isinstance(value, str):
            setattr(rebuilt, name, value)
    if error.get("report") is not None:
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
        loader.configure_for_optimizing()  # before TensorFlow is imported
        loader.quiet_tensorflow_import()
    elif preload == "tensorflow":
        loader.quiet_tensorflow_import()
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


if __name__ == "__main__":
    loader.keep_plotting_out()
    sys.exit(_serve(sys.argv[1], sys.argv[2]))
