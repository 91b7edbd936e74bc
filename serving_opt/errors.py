"""The one exception type users see, and the exit codes the CLI maps it to.

Every failure a user can cause (bad path, corrupt model, wrong flag, parity
mismatch) is raised as a :class:`ServingOptError` carrying the problem and the
fix, so the CLI can print exactly one line and exit non-zero without a traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


# Lines of a TensorFlow error that say where, not what: headers, node names, stack frames.
_TF_HEADER = re.compile(r"(Graph execution error:|\d+ root error\(s\) found\.?)$")
_TF_WHERE = re.compile(
    r"(Detected at node .*|Node: .*|\[\[.*\]\]|Original stack trace for .*|File \".*|"
    r"Traceback .*|\(most recent call last\):?|Additional GRPC error information.*|"
    r"Errors may have originated from an input operation\.?)$")
_TF_NODE = re.compile(r"Node: '(.+)'$")


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (TF's run a page long), or its type name.

    TensorFlow's errors start with a header ("Graph execution error:") and give the cause
    lines later, after the node and a stack trace: then the header, the cause and the node.
    """
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if not _TF_HEADER.match(lines[0]):
        return lines[0]
    node = None
    for line in lines[1:]:
        found = _TF_NODE.match(line)
        if found:
            node = node or found.group(1)
        elif not _TF_WHERE.match(line) and not _TF_HEADER.match(line):
            return f"{lines[0]} {line}" + (f" (node {node})" if node else "")
    return lines[0]


class ServingOptError(Exception):
    """A failure with a user-facing explanation."""

    exit_code = EXIT_FAILURE

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(self.one_line())

    report = None  # the partial report of the run that failed, when there is one

    def with_report(self, report) -> ServingOptError:
        self.report = report
        return self

    def one_line(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class UsageError(ServingOptError):
    """Bad flags or arguments: exit code 2, like absl and TF's own tools."""

    exit_code = EXIT_USAGE


class ParityError(ServingOptError):
    """The optimized model does not answer like the original; nothing was published."""


class ValidationError(ServingOptError):
    """The model server did not load or answer the model as required."""


class DiskFullError(ServingOptError):
    """A write failed because the disk is full, over quota or read-only; nothing was
    published. Keeping the variables or any other retry would fail the same way."""


# The write failures that are about where, not what: one line naming the place, not an
# "internal error" with a traceback.
_STORAGE_ERRNOS = {
    errno.ENOSPC: ("the disk is full", "free space there or choose another --output_base"),
    errno.EDQUOT: ("the disk quota is exceeded",
                   "free space there, raise the quota or choose another --output_base"),
    errno.EROFS: ("the filesystem is read-only",
                  "remount it read-write or choose another --output_base"),
}


def _storage_errno(e: BaseException) -> tuple[int, str | None] | None:
    """(errno, path) when ``e`` or an exception it was raised from is a storage failure.

    TensorFlow's file errors and ``shutil.Error`` (copytree) keep only the text of the
    OSError, so their messages are matched against the errno's ``strerror`` too.
    """
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _STORAGE_ERRNOS:
            return current.errno, current.filename
        if isinstance(current, shutil.Error) and current.args and \
                isinstance(current.args[0], list):
            for entry in current.args[0]:
                if isinstance(entry, tuple) and len(entry) == 3:
                    for code in _STORAGE_ERRNOS:
                        if os.strerror(code) in str(entry[2]):
                            return code, str(entry[1])
        text = str(current)
        for code in _STORAGE_ERRNOS:
            if os.strerror(code) in text:
                return code, None
        current = current.__cause__ or current.__context__
    return None


# stages/staging.STAGING_PREFIX: the hidden directories a run writes in a model base.
_HIDDEN_PREFIX = ".serving-opt-staging-"


def _visible_place(path: str) -> str:
    """The model base (the user's --output_base) a hidden staging path is in, else
    ``path``: the place a user can free space on or replace."""
    parts = path.split(os.sep)
    for index, part in enumerate(parts):
        if part.startswith(_HIDDEN_PREFIX):
            return os.sep.join(parts[:index]) or os.sep
    return path


def storage_error(e: BaseException, where: str | None = None,
                  published: str = "nothing was published") -> DiskFullError | None:
    """A one-line :class:`DiskFullError` for a write that failed on a full (ENOSPC),
    over-quota (EDQUOT) or read-only (EROFS) filesystem; None for any other exception.

    ``where`` names the place (a failed ``write()`` has no file name); without it the
    error's own path is used; either way a path inside a hidden staging directory is
    named by its model base. ``published`` says what was published anyway.
    """
    found = _storage_errno(e)
    if found is None:
        return None
    code, path = found
    what, fix = _STORAGE_ERRNOS[code]
    place = where or path
    at = f" at {_visible_place(os.fspath(place))}" if place else ""
    return DiskFullError(f"{what}{at} ({os.strerror(code)}); {published}", fix)
