"""The files of a model, read safely: a saved_model.pb only as a regular file within
protobuf's limit, and no symlink out of the model, special file or foreign hard link.

Every step that opens a user's model (optimize, validate, serve's load) runs these
checks first, so a model cannot make the tool block, read the host's files or publish
them.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel.graph import PROTOBUF_LIMIT_BYTES

# The largest message protobuf parses (INT_MAX bytes): a larger saved_model.pb cannot be
# read by any TensorFlow, so it is refused before a byte of it is read.
MAX_SAVED_MODEL_BYTES = PROTOBUF_LIMIT_BYTES - 1

_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages ("a named pipe (FIFO)", ...).
    """
    for test, kind in _FILE_KINDS:
        if test(mode):
            return kind
    return "not a regular file"


class UnsafeModelFile(ServingOptError):
    """A file of a model that is not read: a symlink where a regular file must be, a
    special file (FIFO, device, socket) or a saved_model.pb over protobuf's limit.

    ``reason`` is the problem without the fix, for servers that report their own way.
    """

    def __init__(self, path: str, reason: str, fix: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(reason, fix)


def read_model_file(path: str, limit: int = MAX_SAVED_MODEL_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; never blocks,
    never reads more than the size it had when opened.

    ``saved_model.pb`` as a FIFO would block the open forever, as a link to ``/dev/zero``
    it would be read until memory runs out: the file is opened O_NOFOLLOW|O_NONBLOCK,
    fstat'ed, and exactly st_size bytes are read. A symlink is followed only to a regular
    file: Bazel runfiles and Kubernetes volumes present model files as links, and TF
    Serving reads through them; the link is resolved first and its target opened with
    O_NOFOLLOW, so a target swapped meanwhile is refused, not followed. Raises
    :class:`UnsafeModelFile` (one line, naming the path and the fix) and
    FileNotFoundError when it does not exist.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NOCTTY", 0)
    target = ""
    opened = path
    if os.path.islink(path):
        target = _readlink(path)
        opened = os.path.realpath(path)
        try:
            mode = os.stat(opened).st_mode
        except OSError:
            raise UnsafeModelFile(
                path, f"{path} is a symlink that points to nothing ({target})",
                "replace the link with the file it should point to") from None
        if not stat.S_ISREG(mode):
            raise _not_regular(path, file_kind(mode), target)
    try:
        fd = os.open(opened, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW: made a symlink after the check above
            raise _not_regular(path, "a symlink", target) from None
        if e.errno == errno.ENXIO:  # a socket
            raise _not_regular(path, file_kind(os.lstat(opened).st_mode), target) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, file_kind(info.st_mode), target)
        if info.st_size > limit:
            raise UnsafeModelFile(
                path,
                f"{path} is {info.st_size} bytes, over protobuf's 2 GiB limit "
                f"({limit} bytes); no TensorFlow can parse it",
                "re-export the model with its large weights as variables (in variables/), "
                "not as constants in the graph",
            )
        data = bytearray(info.st_size)
        view = memoryview(data)
        done = 0
        while done < info.st_size:  # a file truncated meanwhile ends early: parsing says so
            n = os.readv(fd, [view[done:]])
            if n == 0:
                break
            done += n
        view.release()
        del data[done:]
        return bytes(data)
    finally:
        os.close(fd)


def _not_regular(path: str, kind: str, target: str = "") -> UnsafeModelFile:
    if target:
        return UnsafeModelFile(
            path, f"{path} is a symlink to {kind} ({target}), not to a regular file; "
            "reading it could block or never end",
            "replace it with the real file (copy the model again or re-export it)",
        )
    return UnsafeModelFile(
        path, f"{path} is {kind}, not a regular file; reading it could block or never end",
        "replace it with the real file (copy the model again or re-export it)",
    )


# The directories of a SavedModel whose files are copied into (or served from) a result.
MODEL_FILE_DIRS = ("assets", "assets.extra", "variables")


@dataclass(frozen=True)
class UnsafeLink:
    """A symlink in a model's file directories that must not be followed."""

    path: str  # the link, under the model directory
    target: str  # what it points to (os.readlink)
    reason: str  # "points outside the model directory", "points to nothing", "loops"


def unsafe_links(saved_model_dir: str) -> list[UnsafeLink]:
    """Symlinks (files or directories) anywhere in the model directory (``assets/``,
    ``assets.extra/``, ``variables/``, ``fingerprint.pb``, ...) that lead outside it, to
    nothing, or into a loop.

    A link whose target is inside the model directory is harmless: copying it copies a
    file of the model. Nothing outside the model directory is opened or listed here.
    """
    root = os.path.realpath(saved_model_dir)
    found: list[UnsafeLink] = []
    try:
        names = sorted(os.listdir(saved_model_dir))
    except OSError:
        return found  # unreadable: the reader says so
    # The file directories first: their links are the ones copied into a result.
    names.sort(key=lambda name: name not in MODEL_FILE_DIRS)
    for name in names:
        _scan_links(os.path.join(saved_model_dir, name), root, (root,), found)
    return found


def _scan_links(path: str, root: str, ancestors: tuple[str, ...],
                found: list[UnsafeLink]) -> None:
    real = os.path.realpath(path)
    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if real != root and not real.startswith(root + os.sep):
            found.append(UnsafeLink(path, target, "points outside the model directory"))
            return
        if not os.path.exists(real):
            found.append(UnsafeLink(path, target, "points to nothing"))
            return
        if real in ancestors:
            found.append(UnsafeLink(path, target, "loops back to a directory containing it"))
            return
    if not os.path.isdir(real):
        return
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return  # unreadable: the step that needs it says so
    for name in names:
        _scan_links(os.path.join(path, name), root, ancestors + (real,), found)


@dataclass(frozen=True)
class SpecialFile:
    """An entry of a model that is not read: a FIFO, device or socket (``kind``), or a
    symlink to one (``target``)."""

    path: str
    kind: str  # "a named pipe (FIFO)", "a character device", ...
    target: str = ""  # for a symlink: what it points to


def special_files(saved_model_dir: str) -> list[SpecialFile]:
    """Entries of the model directory that no step may open: anything but regular files,
    directories and symlinks, and symlinks inside the model that lead to such a file.
    Only ``lstat``/``stat``: nothing is opened.

    Opening a FIFO blocks until a writer comes; TensorFlow restoring from one, or
    ``shutil.copytree`` copying one, would hang the run (links out of the model are
    unsafe_links' business and are not followed here).
    """
    root = os.path.realpath(saved_model_dir)
    found: list[SpecialFile] = []
    for dirpath, dirnames, filenames in os.walk(saved_model_dir):  # links are not entered
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                continue
            if not stat.S_ISLNK(mode):
                found.append(SpecialFile(path, file_kind(mode)))
                continue
            real = os.path.realpath(path)
            if real != root and not real.startswith(root + os.sep):
                continue
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue  # dangling or looping: unsafe_links says so
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(SpecialFile(path, file_kind(mode), _readlink(path)))
    return found


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def check_model_files(saved_model_dir: str, base: str | None = None) -> None:
    """Refuses a model holding a symlink that leads outside the model directory (or to
    nothing, or into a loop): copying it would publish a file of the build host; or a
    special file (FIFO, device, socket, or a link to one): reading it could block forever
    or never end; and, given the model's ``base``, an asset hard-linked outside the model
    and that base (:func:`refuse_foreign_hard_links`). One line, naming the path and the
    fix. optimize and serve's load both run it: every file check in one place.
    """
    links = unsafe_links(saved_model_dir)
    if links:
        link = links[0]
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise ServingOptError(
            f"{link.path} is a symlink that {link.reason} ({link.target}){more}; "
            "symlinks out of a SavedModel are never followed",
            "replace the link with a copy of the file if it belongs to the model, "
            "or re-export the model",
        )
    check_special_files(saved_model_dir)
    if base is not None:
        refuse_foreign_hard_links(saved_model_dir, base)


def _asset_files(model_dir: str):
    for sub in ("assets", "assets.extra"):
        for root, _dirs, files in os.walk(os.path.join(model_dir, sub)):
            for name in files:
                path = os.path.join(root, name)
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode):
                    yield path, info


def refuse_foreign_hard_links(model_dir: str, base: str) -> None:
    """Refuses an asset of ``model_dir`` with a hard link outside the model and the
    versions of ``base`` (a ``cp -al`` copy of a version is fine): it is another file
    too, maybe one of the build host's (or another model's), whose bytes the model would
    read or publish (symlinks out of a model are refused for the same reason).
    """
    linked = {}
    for path, info in _asset_files(model_dir):
        if info.st_nlink > 1:
            linked.setdefault((info.st_dev, info.st_ino), (path, info.st_nlink))
    if not linked:
        return
    seen: dict = {}
    trees = [model_dir] + [os.path.join(base, name) for name in
                           (os.listdir(base) if os.path.isdir(base) else ())
                           if os.path.isdir(os.path.join(base, name))
                           and not os.path.islink(os.path.join(base, name))]
    for tree in dict.fromkeys(os.path.realpath(t) for t in trees):
        for _path, info in _asset_files(tree):
            key = (info.st_dev, info.st_ino)
            if key in linked:
                seen[key] = seen.get(key, 0) + 1
    for key, (path, count) in linked.items():
        if seen.get(key, 0) < count:
            raise ServingOptError(
                f"asset {path} has {count} hard links, some outside the model and its "
                "model base: it is another file too, whose contents the model would "
                "read or publish",
                "replace it with a copy of its own (cp --no-preserve=links) if it belongs "
                "to the model")


def check_special_files(saved_model_dir: str) -> None:
    """Raises :class:`UnsafeModelFile` for the first of :func:`special_files`."""
    found = special_files(saved_model_dir)
    if not found:
        return
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    error = _not_regular(first.path, first.kind, first.target)
    raise UnsafeModelFile(first.path, error.reason + more, error.fix)
