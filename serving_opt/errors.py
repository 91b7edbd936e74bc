"""The one exception type users see, and the exit codes the CLI maps it to.

Every failure a user can cause (bad path, corrupt model, wrong flag, parity
mismatch) is raised as a :class:`ServingOptError` carrying the problem and the
fix, so the CLI can print exactly one line and exit non-zero without a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (TF's run a page long), or its type name.

    Example:
        >>> first_line(ValueError("bad shape\n  details..."))
        'bad shape'
    """
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


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
