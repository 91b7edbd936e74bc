"""The candidates optimize tries, in order, and the verdict that ends each attempt.

    staging = attempts.try_candidates(run, build, measure)   # the one taken: its staging dir

The configurations come from the options, in order (:func:`candidates`):

    --freeze=auto --quantize=int8     1. frozen, int8: all large weights
                                      2. frozen, int8: tables only
                                      3. variables kept, int8: all large weights
                                      4. variables kept, int8: tables only
    --freeze=always                   1 and 2;   --freeze=never: 3 only
    --quantize=int4                   tables only (2 and 4): int4 never quantizes dense
                                      weights, so there is nothing to fall back from
    --quantize=none                   frozen, then variables kept (auto)

An attempt builds one candidate and proves it (freeze .. parity), then measures it; it
ends in a :class:`Verdict`. What follows a verdict is one rule (:func:`next_candidate`):

    ok                                     the candidate is taken
    lossy_gate_failed, dense weights among the quantized ones
                                           the frozen tables-only candidate, if listed
    parity_failed, unusable or regression  of a frozen candidate: the variables-kept
                                           candidate quantizing the same weights, if listed
    anything else                          the run ends: the attempt's error ("could not
                                           freeze ..." for a frozen candidate that could not
                                           be built or proven), or the regression (refused,
                                           or taken with --allow_regression)

The run record is restored here, and only here, before the next attempt, so its stages
and warnings are the taken attempt's; the report lists every attempt (:class:`AttemptReport`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from serving_opt.errors import DiskFullError, ParityError, ServingOptError, UsageError, first_line
from serving_opt.savedmodel import writer

# Verdicts: how one attempt ended.
OK = "ok"  # proven and measured no worse: taken
PARITY_FAILED = "parity_failed"  # the exact gate refused a lossless candidate
LOSSY_GATE_FAILED = "lossy_gate_failed"  # a gate refused a candidate built with lossy work
REGRESSION = "regression"  # proven, but measured worse than the original
UNUSABLE = "unusable"  # could not be built, loaded or proven (freezing, inlining, ...)
ERROR = "error"  # an error no other configuration changes (usage, target runtime, disk)

# How the quantize stage says a weight is turned back into float once, at load: a dense
# weight (tables are dequantized per request, gathered rows only).
_DEQUANTIZED_AT_LOAD = "at load (init op)"


@dataclass(frozen=True)
class Candidate:
    """One configuration of the candidate: frozen or not, which weights quantized."""

    frozen: bool
    quantize: str = "none"
    tables_only: bool = False  # quantize only the embedding tables (gathered per row)
    # int8 tables with a scale per row always, not per column where the rows allow it:
    # finer, and a little slower (stages.quantize)
    row_scales: bool = False

    def describe(self) -> str:
        what = "frozen" if self.frozen else "variables kept"
        if self.quantize == "none":
            return what
        if self.quantize == "bf16":
            return f"{what}, bf16 compute"
        return f"{what}, {self.quantize}: " + ("tables only" if self.tables_only
                                               else "all large weights") \
            + (", a scale per table row" if self.row_scales else "")


@dataclass(frozen=True)
class Verdict:
    """How one attempt ended; the loop and the report read it."""

    outcome: str  # one of the verdicts above
    reason: str = ""  # what went wrong, one line ("" when ok)
    worse: tuple[str, ...] = ()  # regression: the measures worse than the original's
    dense_quantized: bool = False  # lossy gate: dense weights were among the quantized
    column_scales: bool = False  # lossy gate: a table had a scale per column
    # The attempt's exception, raised again when this verdict ends the run.
    error: Exception | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AttemptReport:
    """One attempt in the report: its configuration, its verdict, and what followed."""

    candidate: Candidate
    outcome: str
    reason: str
    then: str  # "taken", "retried: <configuration>", "refused: nothing was published", ...


def candidates(freeze: str, quantize: str) -> tuple[Candidate, ...]:
    """The configurations ``--freeze`` and ``--quantize`` allow, in the order tried."""
    # int4 quantizes the tables alone (dense weights dequantized at load would shrink
    # the files, not the server): its candidates say so, and no retry drops dense ones.
    scopes = {"none": (False,), "bf16": (False,), "int4": (True,)}.get(quantize, (False, True))
    frozen = tuple(Candidate(True, quantize, tables) for tables in scopes)
    if freeze == "never":
        return (Candidate(False, quantize, scopes[0]),)  # no retry: nothing to fall back to
    if freeze == "always" or quantize == "bf16":  # bf16 folds constants (stages.bf16)
        return frozen
    return frozen + tuple(Candidate(False, quantize, tables) for tables in scopes)


def judge_failure(error: Exception, candidate: Candidate, lossy_transforms: bool,
                  quantized: Sequence = ()) -> Verdict:
    """The verdict of an attempt that raised ``error``; ``quantized`` are the weights its
    quantize stage stored (stages.quantize.QuantizedTensor).
    """
    from serving_opt.serving.runtime import TargetRuntimeError

    if isinstance(error, (UsageError, TargetRuntimeError, DiskFullError)):
        return Verdict(ERROR, first_line(error), error=error)
    # What differed, without the verdict a refused run prints ("nothing was published").
    reason = getattr(error, "difference", None) or first_line(error)
    if isinstance(error, ParityError):
        if lossy_transforms or candidate.quantize != "none":
            # The lossy work's verdict, not freezing's: keeping the variables would not
            # change it (and would make a lossy transform a no-op that passes).
            dense = any(q.dequantized == _DEQUANTIZED_AT_LOAD for q in quantized)
            columns = any(q.column_scales for q in quantized)
            return Verdict(LOSSY_GATE_FAILED, first_line(error), dense_quantized=dense,
                           column_scales=columns, error=error)
        return Verdict(PARITY_FAILED, reason, error=error)
    return Verdict(UNUSABLE, reason, error=error)


def next_candidate(listed: Sequence[Candidate], current: Candidate,
                   verdict: Verdict) -> Candidate | None:
    """The candidate to try after ``verdict`` on ``current``; None: the run ends."""
    later = [replace(c, row_scales=current.row_scales)
             for c in listed[listed.index(replace(current, row_scales=False)) + 1:]]
    dense_first = verdict.dense_quantized and current.frozen and not current.tables_only
    if verdict.outcome == LOSSY_GATE_FAILED and dense_first:
        # Quantized dense weights only shrink files; tables shrink the server too. Keep
        # what the gate accepts: the tables alone.
        return next((c for c in later if c.frozen and c.tables_only), None)
    if verdict.outcome == LOSSY_GATE_FAILED and verdict.column_scales \
            and not current.row_scales:
        # The tables' scale per column was too coarse for the gate: one per row.
        return replace(current, row_scales=True)
    if verdict.outcome in (PARITY_FAILED, UNUSABLE, REGRESSION) and current.frozen:
        return next((c for c in later if not c.frozen and c.tables_only == current.tables_only),
                    None)
    return None


Build = Callable[..., str]  # (run, candidate, note) -> the proven candidate's staging dir
Measure = Callable[..., list]  # (run, staging) -> the measures worse than the original's


def try_candidates(run, build: Build, measure: Measure) -> str:
    """Tries the plan's candidates until one is taken; returns its staging directory.

    Raises the error of the attempt that ended the run (see the module docstring); the
    report (``run.attempts``) has every attempt either way.
    """
    listed = run.plan.candidates
    candidate = listed[0]
    note = "" if candidate.frozen else "--freeze=never"
    while True:
        before = run.snapshot()
        verdict, staging = _attempt(run, candidate, note, build, measure)
        following = next_candidate(listed, candidate, verdict)
        if verdict.outcome == OK:
            _record(run, candidate, verdict, "taken")
            return staging
        if following is None:
            return _end(run, candidate, verdict, staging)
        _record(run, candidate, verdict, f"retried: {following.describe()}")
        writer.discard(staging)
        run.restore(before)
        note = _retry_note(run, verdict, candidate, following)
        candidate = following


def _attempt(run, candidate: Candidate, note: str, build: Build,
             measure: Measure) -> tuple[Verdict, str | None]:
    try:
        staging = build(run, candidate, note)
    except Exception as e:  # noqa: BLE001 - auto must never crash on a freezing failure
        return judge_failure(e, candidate, bool(run.plan.lossy), run.quantized), None
    try:  # interrupted or failed while measuring: the candidate is not left behind
        worse = measure(run, staging)
    except BaseException:
        writer.discard(staging)
        raise
    if worse:
        return Verdict(REGRESSION, worse[0], worse=tuple(worse)), staging
    return Verdict(OK), staging


def _retry_note(run, verdict: Verdict, current: Candidate, following: Candidate) -> str:
    """Says why on the progress line; returns the next attempt's freeze note."""
    if verdict.outcome == LOSSY_GATE_FAILED:
        what = "a scale per table row" if following.row_scales and not current.row_scales \
            else "only the embedding tables quantized"
        run.progress("-", f"lossy gate refused ({verdict.reason}); retrying with {what}")
        return ""
    if verdict.outcome == REGRESSION:
        run.progress("-", f"frozen candidate is worse ({verdict.reason}); retrying with "
                           "variables kept")
        return f"the frozen candidate was worse ({verdict.reason}); variables kept"
    what = "the frozen graph answered differently" if verdict.outcome == PARITY_FAILED \
        else "freezing failed"
    run.progress("-", f"{what} ({verdict.reason}); retrying with the variables kept")
    # The build warns "variables kept: <note>", naming the cause.
    return (f"{what} ({verdict.reason}); optimized with the variables kept "
            "(--freeze=always makes that an error)")


def _end(run, candidate: Candidate, verdict: Verdict, staging: str | None) -> str:
    """The last attempt's verdict ends the run: raised, or (a regression the user allows)
    its candidate taken."""
    if verdict.outcome == REGRESSION:
        if run.plan.gate.allow_regression:
            _record(run, candidate, verdict, "taken despite the regression "
                                              "(--allow_regression)")
            for line in verdict.worse:
                run.warn(f"published despite a regression (--allow_regression): {line}")
            return staging
        _record(run, candidate, verdict, "refused: nothing was published")
        writer.discard(staging)
        raise ServingOptError(
            f"the optimized model is worse than the original: {verdict.reason}; nothing was "
            "published",
            "rerun with --allow_regression to publish it anyway, or try --freeze=never",
        )
    _record(run, candidate, verdict, "refused: nothing was published")
    error = verdict.error
    if candidate.frozen and verdict.outcome in (PARITY_FAILED, UNUSABLE) \
            and not isinstance(error, ServingOptError):
        raise ServingOptError(
            f"could not freeze the variables of {run.input_dir}: {verdict.reason}",
            "rerun with --freeze=auto (falls back) or --freeze=never",
        ) from error
    raise error


def _record(run, candidate: Candidate, verdict: Verdict, then: str) -> None:
    run.attempts.append(AttemptReport(candidate, verdict.outcome, verdict.reason, then))
