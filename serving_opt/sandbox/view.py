"""What a sandbox sees: bubblewrap's arguments for a :class:`sandbox.Policy` (the
system, the Python environment, a /proc of a few files, sized tmpfs mounts, the
policy's binds) and the seccomp filter of the system calls no model needs."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

TMP_BYTES = 1 << 30  # the sandbox's /tmp (a tmpfs: host memory RLIMIT_DATA does not count)
SHM_BYTES = 256 << 20  # its /dev/shm
SANDBOX_UID = 65534  # "nobody": the sandbox's uid and gid, with no capabilities
HOSTNAME = "sandbox"


def _python_binds() -> list[tuple[str, str]]:
    """(source, target): what an installation is made of of each of the interpreter's
    prefixes (``bin``, ``lib``, ``lib64``, a venv's ``pyvenv.cfg``; never the whole
    prefix, which may hold anything), and the real directory of the serving_opt
    package."""
    prefixes = dict.fromkeys(os.path.realpath(p) for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix))
    paths = [os.path.join(p, name) for p in prefixes if p != "/usr"
             for name in ("bin", "lib", "lib64", "pyvenv.cfg")]
    paths += [_package_dir(), os.path.dirname(os.path.realpath(sys.executable))]
    # A link inside a prefix (a venv's lib64 -> lib) is bound at its own path too.
    pairs = {(os.path.realpath(p), p): None for p in paths if os.path.exists(p)}
    return list(pairs)


def _package_dir() -> str:
    # serving_opt's folder, from this module's own path (serving_opt/sandbox/view.py):
    # importing the package root would tie the sandbox to everything the root re-exports
    # (the optimizer, lazily) in the import graph.
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


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


def bwrap_args(bwrap: str, policy, seccomp_fd: int | None = None,
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
    for source, target in _python_binds():
        args += ["--ro-bind", source, target]
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
