"""Who owns a hidden staging directory, and removing the ones whose owner is gone.

Every hidden directory a run makes in a model base (``.serving-opt-staging-*``: the
candidate, scratch checkpoints, the validation base) gets an owner record next to it,
``<dir>.owner``, naming the process that made it: PID, the process's start time (so a
reused PID is not mistaken for the owner), boot id and host. A run killed with SIGKILL
cannot clean up after itself; the next ``optimize`` on the same base removes the
directories whose owner process no longer exists, and never those of a live run
(another ``optimize`` working on the same base right now).

The record sits beside the directory rather than inside it, so the directory renamed to
``<base>/<version>`` holds exactly the SavedModel. The record is written before the
directory is made, so a killed run never leaves an unclaimed directory; one without a
record (made by an older serving-opt) is removed only once it is
:data:`UNCLAIMED_MAX_AGE_SECONDS` old. A version moved aside by ``--overwrite``
(``.serving-opt-staging-old-*``) is never removed here.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time

STAGING_PREFIX = ".serving-opt-staging-"
OWNER_SUFFIX = ".owner"
UNCLAIMED_MAX_AGE_SECONDS = 24 * 3600
# A published version moved aside by --overwrite (writer.publish): never removed here.
_NEVER_REMOVED = (STAGING_PREFIX + "old-",)

# Version directories this process published (writer.publish), for a true statement of
# what an interrupted command left behind (cli/main.py).
published: list[str] = []


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _boot_id() -> str | None:
    return _read("/proc/sys/kernel/random/boot_id")


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # Field 2 (the command name) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _zombie(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and stat[stat.rfind(")") + 2:].startswith("Z")


def owner_record(pid: int | None = None) -> dict:
    """What identifies a process: pid, start time, boot id, host."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": process_start(pid), "boot": _boot_id(),
            "host": socket.gethostname()}


def owner_path(directory: str) -> str:
    return os.path.abspath(directory).rstrip(os.sep) + OWNER_SUFFIX


def claim(directory: str, record: dict | None = None) -> None:
    """Writes the owner record of ``directory`` (this process unless ``record``)."""
    path = owner_path(directory)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record or owner_record(), f)
    os.replace(tmp, path)


def release(directory: str) -> None:
    """Removes the owner record (the directory was published, removed or moved)."""
    try:
        os.remove(owner_path(directory))
    except FileNotFoundError:
        pass


def make_claimed_dir(base: str, prefix: str) -> str:
    """A new hidden directory in ``base`` (mode 0755), claimed by this process.

    A full disk (or quota, or read-only filesystem) is a one-line
    :class:`~serving_opt.errors.DiskFullError` naming ``base``, and leaves nothing behind.
    """
    try:
        return _make_claimed_dir(base, prefix)
    except OSError as e:
        from serving_opt.errors import storage_error

        full = storage_error(e, base)
        if full is None:
            raise
        raise full from e


def _make_claimed_dir(base: str, prefix: str) -> str:
    os.makedirs(base, exist_ok=True)
    # The record first, the directory second: killed in between leaves a record without
    # a directory (swept below), never an unclaimed directory.
    for _ in range(100):
        fd, record = tempfile.mkstemp(prefix=prefix, suffix=OWNER_SUFFIX, dir=base)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(owner_record(), f)
            directory = record[:-len(OWNER_SUFFIX)]
            os.mkdir(directory)
        except FileExistsError:
            os.remove(record)
            continue
        except BaseException:
            # A full disk fails the record's write (or the mkdir): no half-written
            # record is left behind in the user's model base.
            os.remove(record)
            raise
        # A server running as another user (Docker) must read it.
        os.chmod(directory, 0o755)
        return directory
    raise FileExistsError(f"no free name {prefix}* in {base}")


def owner_alive(record: dict) -> bool:
    """True unless the recorded process is certainly gone (another host: assumed alive)."""
    if record.get("host") not in (None, socket.gethostname()):
        return True  # a shared filesystem: we cannot see the other host's processes
    boot = _boot_id()
    if record.get("boot") and boot and record["boot"] != boot:
        return False  # recorded before the last reboot
    try:
        pid = int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    if _zombie(pid):
        return False
    start = process_start(pid)
    if record.get("start") and start and record["start"] != start:
        return False  # the PID was reused by a later process
    return True


def remove_stale(base: str) -> list[str]:
    """Removes the hidden directories of ``base`` whose owner is gone; returns their paths."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in sorted(names):
        if not name.startswith(STAGING_PREFIX) or name.startswith(_NEVER_REMOVED) or \
                name.endswith(OWNER_SUFFIX) or OWNER_SUFFIX + ".tmp" in name:
            continue
        path = os.path.join(base, name)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        text = _read(owner_path(path))
        if text is None:
            try:
                old = now - os.lstat(path).st_mtime > UNCLAIMED_MAX_AGE_SECONDS
            except OSError:
                continue
            if not old:
                continue
        else:
            try:
                record = json.loads(text)
            except ValueError:
                record = {}
            if owner_alive(record):
                continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            release(path)
            removed.append(path)
    # Records left without their directory (killed between a rename and the release).
    for name in names:
        if name.startswith(STAGING_PREFIX) and name.endswith(OWNER_SUFFIX):
            path = os.path.join(base, name)
            directory = path[:-len(OWNER_SUFFIX)]
            if os.path.exists(directory):
                continue
            try:
                record = json.loads(_read(path) or "{}")
            except ValueError:
                record = {}
            if not owner_alive(record):
                release(directory)
    return removed
