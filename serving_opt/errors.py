"""The one exception type users see, and the exit codes the CLI maps it to.

Every failure a user can cause (bad path, corrupt model, wrong flag, parity
mismatch) is raised as a :class:`ServingOptError` carrying the problem and the
fix, so the CLI can print exactly one line and exit non-zero without a traceback.
"""

from __future__ import annotations

import re

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

    Example:
        >>> first_line(ValueError("bad shape\n  details..."))
        'bad shape'
        >>> first_line(RuntimeError("Graph execution error:\n\nDetected at node 'r' "
        ...                         "defined at:\nNode: 'r'\nRead less bytes than requested"))
        'Graph execution error: Read less bytes than requested (node r)'
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
    """A failure with a user-facing explanation.

    Example:
        >>> raise ServingOptError("no saved_model.pb in /tmp/x", fix="point --input_dir at "
        ...                       "a SavedModel directory")
    """

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
