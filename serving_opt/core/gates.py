"""When a candidate's answers count as the original's: the tolerance rule and the lossy rule.

The parity gate (``stages.parity``), ``serving-opt compare`` and ``serving-opt validate``
all judge answers here, so the three cannot drift apart.

* The tolerance rule (lossless work: freezing, folding, Grappler): integers, booleans and
  strings equal; floats element-wise within ``atol + rtol * |reference|`` (numpy.isclose
  semantics, NaN equal to NaN); shapes and dtypes the same.
* The lossy rule (quantized weights, :class:`LossyGate`): a classifier must keep its
  answer. A classifier's per-class rows (probabilities, scores) keep their top-1 class in
  ``min_top1_agreement`` of the rows and move no value by more than
  ``max_probability_error``; integer and string outputs (class ids, class names) keep
  ``min_top1_agreement`` of their values; other floats (logits, embeddings, regressions)
  are reported, not gated.

Each output is measured into an :class:`OutputCheck` (its :class:`Kind`, how many elements
differ and by how much, how often the answer agrees), and a gate judges it into a
:class:`Verdict`. Callers read the verdict only, so a new kind of output (detections
matched by IoU, top-k sets) is a new kind, its measurement and its rule, all here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

import numpy as np

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
# The lossy gate (--quantize). Top-1 agreement is the verdict: 99.5% of rows keep
# their class (flips happen on near ties). The probability bound is a guard against a
# broken table (errors of 0.3 and more): measured here, int8 moves the worst of 10240
# probabilities of a confident 20-class text classifier by 0.03 (its mean by 1e-3),
# fp16 by 0.002.
DEFAULT_MIN_TOP1_AGREEMENT = 0.995
DEFAULT_MAX_PROBABILITY_ERROR = 0.05
# The lossy gate decides on a 95% Wilson interval of the agreement, not on one count:
# 3 flips in 512 rows is 0.9941, and its interval [0.983, 0.998] cannot tell 99.4% from
# 99.8%. While the interval straddles the threshold the caller draws more rows.
CONFIDENCE_Z = 1.96
# A flip counts against the model only where the original's top-1 margin exceeds what
# the quantization moves a margin: this quantile of |dp(top-1)| + |dp(top-2)| over all
# rows. A flip inside it is a near-tie decided the other way, not a changed answer.
NEAR_TIE_QUANTILE = 0.99
# More near-ties than this share of the rows: the inputs say little (random tokens make
# near-ties everywhere), and the verdict says to pass --examples.
NEAR_TIE_WARNING_SHARE = 0.5
# Outputs a classifier's answer is read from: gated on top-1 agreement and max error.
PROBABILITY_OUTPUTS = frozenset({"probabilities", "scores", "probs", "predictions"})
# Integer outputs that are one class per row: their rows make a class-confusion table.
CLASS_ID_OUTPUTS = frozenset({"class_ids", "classes_ids", "class_id", "predicted_class"})
# Not-gated outputs of the lossy gate say so in their verdict.
NOT_GATED = "reported, not gated (lossy)"


def is_float_dtype(dtype: str) -> bool:
    """Whether a dtype name (numpy's) is a floating or complex type."""
    return dtype.startswith(("float", "complex", "bfloat"))


def is_probability_output(name: str) -> bool:
    """Whether an output's name says it holds a classifier's probabilities or scores."""
    return name.lower() in PROBABILITY_OUTPUTS


def is_class_id_output(name: str) -> bool:
    """Whether an output's name says it holds one class id per row."""
    return name.lower() in CLASS_ID_OUTPUTS


def has_class_rows(shape: Iterable[int]) -> bool:
    """Whether an answer of this shape (batch first) holds rows of two or more classes."""
    shape = tuple(shape)
    return len(shape) >= 2 and shape[-1] >= 2


class Kind(str, enum.Enum):
    """What an output is, which decides how the lossy gate judges it."""

    PROBABILITIES = "probabilities"  # a classifier's per-class rows: top-1 and max error
    DISCRETE = "discrete"  # integers, booleans, strings (class ids, names): share equal
    VALUES = "values"  # other floats (logits, embeddings, regressions): reported
    # A detection model's outputs (boxes, scores, classes, count behind NMS), judged as
    # detections by serving_opt.detection.parity_rule.
    DETECTIONS = "detections"


def output_kind(name: str, dtype: str, class_rows: bool) -> Kind:
    """The kind of an output from its name, dtype name and whether it has class rows."""
    if not is_float_dtype(dtype):
        return Kind.DISCRETE
    if class_rows and is_probability_output(name):
        return Kind.PROBABILITIES
    return Kind.VALUES


# --- element-wise comparison ------------------------------------------------------------

class FloatDifferences(NamedTuple):
    """Element-wise differences of two float arrays (float64, the reference's shape)."""

    close: np.ndarray  # within atol + rtol * |reference|, NaN equal to NaN
    finite: np.ndarray  # both values finite
    abs_diff: np.ndarray  # |candidate - reference| where both are finite, else 0
    rel_diff: np.ndarray  # abs_diff / |reference| where the reference is finite and not 0


def float_differences(reference, candidate, atol: float, rtol: float) -> FloatDifferences:
    """The tolerance rule element by element, for float arrays of one shape."""
    ref = np.asarray(reference).astype(np.float64)
    cand = np.asarray(candidate).astype(np.float64)
    close = np.isclose(cand, ref, atol=atol, rtol=rtol, equal_nan=True)
    finite = np.isfinite(ref) & np.isfinite(cand)
    diff = np.where(finite, np.abs(cand - ref), 0.0)
    rel = np.where(finite & (ref != 0), diff / np.maximum(np.abs(ref), 1e-30), 0.0)
    return FloatDifferences(close, finite, diff, rel)


def structural_break(reference, candidate) -> str:
    """What makes two arrays incomparable (shape or dtype), or "" when they compare.
    """
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    if reference.shape != candidate.shape:
        return f"shape {candidate.shape} != {reference.shape}"
    if reference.dtype != candidate.dtype:
        return f"dtype {candidate.dtype} != {reference.dtype}"
    return ""


class ArrayDiff(NamedTuple):
    """Two arrays under the tolerance rule. A break (shape or dtype) counts every element
    as differing (at least one)."""

    differing: int
    max_abs_diff: float
    max_rel_diff: float
    broken: str  # "shape (3,) != (2,)", "dtype ... != ...", or ""


def compare_arrays(reference, candidate, atol: float, rtol: float) -> ArrayDiff:
    """How ``candidate`` differs from ``reference`` under the tolerance rule."""
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    broken = structural_break(reference, candidate)
    if broken:
        return ArrayDiff(reference.size or 1, 0.0, 0.0, broken)
    if reference.dtype.kind in "fc":
        d = float_differences(reference, candidate, atol, rtol)
        return ArrayDiff(int((~d.close).sum()), float(d.abs_diff.max(initial=0.0)),
                         float(d.rel_diff.max(initial=0.0)), "")
    equal = reference == candidate
    return ArrayDiff(int((~np.asarray(equal)).sum()), 0.0, 0.0, "")


def top1_classes(answer) -> np.ndarray | None:
    """The top-1 class of each row of a float answer with class rows, or None.

    Rows are the answer's last axis (``(batch, ..., classes)`` read as rows of classes).
    """
    answer = np.asarray(answer)
    if answer.dtype.kind not in "fc" or not has_class_rows(answer.shape):
        return None
    return answer.reshape(-1, answer.shape[-1]).argmax(axis=1)


def _agreeing(expected: np.ndarray, actual: np.ndarray) -> tuple[int, int]:
    """(rows, rows agreeing): top-1 classes of float class rows, elements otherwise."""
    if expected.dtype.kind in "fc":
        want = top1_classes(expected)
        if want is None:
            return 0, 0  # not per-class rows
        return len(want), int((want == top1_classes(actual)).sum())
    return expected.size, int((expected == actual).sum())


@dataclass(frozen=True)
class RowAgreement:
    """Row by row, for one output's class rows over every batch: whether the top-1
    class flipped, and whether the original's row was a near-tie."""

    flipped: tuple[np.ndarray, ...]  # bool [rows] per batch
    near_tie: tuple[np.ndarray, ...]  # bool [rows] per batch
    tie_margin: float

    def count(self) -> AgreementCount:
        flips = sum(int(f.sum()) for f in self.flipped)
        ties = sum(int(t.sum()) for t in self.near_tie)
        tie_flips = sum(int((f & t).sum()) for f, t in zip(self.flipped, self.near_tie))
        rows = sum(len(f) for f in self.flipped) - ties
        return AgreementCount(rows, rows - (flips - tie_flips), ties, tie_flips,
                              self.tie_margin)

    def decisive(self, changed: Iterable[np.ndarray]) -> AgreementCount:
        """Another output's changed rows (one bool [rows] per batch), counted on this
        output's decisive rows: a class id of a near-tie row may flip with it."""
        rows = agreeing = ties = tie_flips = 0
        for c, t in zip(changed, self.near_tie):
            rows += int((~t).sum())
            agreeing += int((~c & ~t).sum())
            ties += int(t.sum())
            tie_flips += int((c & t).sum())
        return AgreementCount(rows, agreeing, ties, tie_flips, self.tie_margin)


def row_agreement(pairs: Iterable[tuple], cap: float = np.inf) -> RowAgreement | None:
    """Top-1 flips and near-ties of float class rows, or None when they are not class
    rows.

    The tie margin is what the answers moved the original's top-two classes
    (``|dp1| + |dp2|``) in the rows that kept their class, at :data:`NEAR_TIE_QUANTILE`,
    and at most ``cap`` (the lossy gate: twice its probability bound). Flipped rows are
    left out of it: one broken row must not excuse the others.
    """
    top2, kept_moves = [], []
    for expected, actual in pairs:
        expected = np.asarray(expected, dtype=np.float64)
        actual = np.asarray(actual, dtype=np.float64)
        if not has_class_rows(expected.shape) or expected.shape != actual.shape:
            return None
        e = expected.reshape(-1, expected.shape[-1])
        a = actual.reshape(-1, actual.shape[-1])
        order = np.argsort(-e, axis=1, kind="stable")[:, :2]
        rows = np.arange(len(e))
        first, second = order[:, 0], order[:, 1]
        margin = e[rows, first] - e[rows, second]
        move = np.abs(a[rows, first] - e[rows, first]) + np.abs(a[rows, second] - e[rows, second])
        flipped = a.argmax(axis=1) != first
        top2.append((margin, flipped))
        kept_moves.append(move[~flipped & np.isfinite(move)])
    if not top2:
        return None
    kept = np.concatenate(kept_moves)
    tie_margin = float(np.quantile(kept, NEAR_TIE_QUANTILE)) if kept.size else 0.0
    tie_margin = min(tie_margin, cap)
    return RowAgreement(tuple(f for _, f in top2), tuple(m <= tie_margin for m, _ in top2),
                        tie_margin)


def changed_rows(expected, actual) -> np.ndarray:
    """bool [rows] (first axis): rows of an exact-compared output where a value differs."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    differs = np.asarray(expected != actual)
    if differs.ndim == 0:
        return differs.reshape(1)
    return differs.reshape(len(differs), -1).any(axis=1)


# --- one output, judged -------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """A gate's word on one output. ``reason`` says what the counts do not: the break,
    the rule that failed, or a note on an output passed unjudged ("" when the counts
    say it all)."""

    ok: bool
    reason: str = ""
    # The lossy gate only: the agreement's interval straddles the threshold, so ``ok``
    # is the point estimate's word; more rows would decide it.
    undecided: bool = False


def wilson_interval(agreeing: int, rows: int, z: float = CONFIDENCE_Z) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if rows <= 0:
        return 0.0, 1.0
    p = agreeing / rows
    z2 = z * z
    centre = (p + z2 / (2 * rows)) / (1 + z2 / rows)
    half = z * np.sqrt(p * (1 - p) / rows + z2 / (4 * rows * rows)) / (1 + z2 / rows)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


@dataclass(frozen=True)
class AgreementCount:
    """How many rows (values, for integers and strings) kept their answer.

    ``near_ties`` rows are left out of ``rows``: the original's top-1 margin there was
    within ``tie_margin``, what the quantization moves a margin, so a flip is a tie
    decided the other way (``near_tie_flips`` of them flipped).
    """

    rows: int
    agreeing: int
    near_ties: int = 0
    near_tie_flips: int = 0
    tie_margin: float = 0.0

    @property
    def agreement(self) -> float | None:
        return self.agreeing / self.rows if self.rows else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.agreeing, self.rows)

    def describe(self) -> str:
        """Example: ``'2047 of 2048 rows agree (0.9995, 95% [0.9972, 0.9999])'``."""
        lo, hi = self.interval
        text = (f"{self.agreeing} of {self.rows} rows agree "
                f"({self.agreement or 0:.4f}, 95% [{lo:.4f}, {hi:.4f}])")
        if self.near_ties:
            text += (f"; {self.near_ties} near-tie rows not counted (top-1 margin within "
                     f"{self.tie_margin:.3g}, {self.near_tie_flips} of them flipped)")
        return text

    def __add__(self, other: AgreementCount) -> AgreementCount:
        return AgreementCount(self.rows + other.rows, self.agreeing + other.agreeing,
                              self.near_ties + other.near_ties,
                              self.near_tie_flips + other.near_tie_flips,
                              max(self.tie_margin, other.tie_margin))


@dataclass(frozen=True)
class OutputCheck:
    """One output of one signature, measured over every batch, and (once a gate judged
    it) the verdict."""

    signature: str
    output: str
    kind: Kind
    dtype: str = ""
    shape: tuple[int, ...] = ()  # of the last batch's answer
    elements: int = 0
    differing: int = 0  # elements outside the measuring tolerances (all of them on a break)
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    # Rows (or, for integers and strings, values) whose answer agrees; None when not
    # scored (the tolerance gate) or when there is nothing to score.
    agreement: float | None = None
    broken: str = ""  # shape/dtype differ, or the output is missing: fails every gate
    verdict: Verdict | None = None  # None until a gate judged it
    # The counts behind ``agreement`` (the lossy gate decides on their interval); None
    # where only the share is known (the gate then decides on the share).
    count: AgreementCount | None = None


class Gate(Protocol):
    """A rule for answers: measures with ``atol``/``rtol`` (and top-1 agreement when
    ``scores_agreement``), judges an :class:`OutputCheck` into a :class:`Verdict`."""

    atol: float
    rtol: float
    scores_agreement: bool

    def judge(self, check: OutputCheck) -> Verdict: ...


@dataclass(frozen=True)
class ToleranceGate:
    """The tolerance rule: no element may differ beyond ``atol + rtol * |reference|``."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    scores_agreement: ClassVar[bool] = False

    def judge(self, check: OutputCheck) -> Verdict:
        if check.broken:
            return Verdict(False, check.broken)
        return Verdict(check.differing == 0)


@dataclass(frozen=True)
class LossyGate:
    """What "same answers" means for lossy work (quantized weights).

    Probabilities/scores outputs: the row's top-1 class must agree in at least
    ``min_top1_agreement`` of the rows, and no value may move more than
    ``max_probability_error``. Integer and string outputs (class ids, class names):
    at least ``min_top1_agreement`` of the elements equal. Other float outputs
    (logits, embeddings) are reported, not gated. Differences are counted exactly.
    """

    min_top1_agreement: float = DEFAULT_MIN_TOP1_AGREEMENT
    max_probability_error: float = DEFAULT_MAX_PROBABILITY_ERROR
    atol: ClassVar[float] = 0.0
    rtol: ClassVar[float] = 0.0
    scores_agreement: ClassVar[bool] = True

    def judge(self, check: OutputCheck) -> Verdict:
        if check.broken:
            return Verdict(False, check.broken)
        if check.kind is Kind.PROBABILITIES:
            verdict = self._agreement(check, "top-1 agreement")
            refused = not verdict.ok and not verdict.undecided
            if refused or check.max_abs_diff <= self.max_probability_error:
                return verdict
            # A value seen moved past the bound is a fact about the candidate that no
            # number of further rows undoes: the refusal is decided even where the
            # agreement's interval straddles the threshold (the caller draws no more).
            bound = (f"max abs diff {check.max_abs_diff:.3g} > "
                     f"{self.max_probability_error}")
            if verdict.undecided:
                bound += (" decides the refusal (top-1 agreement left undecided, as more "
                          f"rows would not change the verdict: {_agreement_text(check)})")
            return Verdict(False, bound)
        if check.kind is Kind.DISCRETE and check.agreement is not None:
            return self._agreement(check, "agreement")
        return Verdict(True, NOT_GATED)

    def _agreement(self, check: OutputCheck, what: str) -> Verdict:
        """The agreement's verdict: on its interval where the counts are known."""
        need, count = self.min_top1_agreement, check.count
        if count is None:
            if check.agreement is not None and check.agreement < need:
                return Verdict(False, f"{what} {check.agreement:.4f} < {need}")
            return Verdict(True)
        text = count.describe()
        total = count.rows + count.near_ties
        if total and count.near_ties / total > NEAR_TIE_WARNING_SHARE:
            text += ("; most rows are near-ties, so these inputs say little about the "
                     "model's answers (synthesized text of random tokens does that): pass "
                     "--examples drawn from real traffic")
        if not count.rows:
            return Verdict(True, f"{what}: no row decides ({text})", undecided=True)
        lo, hi = count.interval
        agreement = count.agreement or 0.0
        if lo >= need:
            return Verdict(True, f"{what}: {text}")
        if hi < need:
            return Verdict(False, f"{what} {agreement:.4f} < {need}: {text}")
        return Verdict(agreement >= need, f"{what}: {text}: the interval straddles {need}, "
                       "undecided (more rows, --examples or a longer --measure_seconds "
                       "would decide it)", undecided=True)


def _agreement_text(check: OutputCheck) -> str:
    """The agreement's counts and interval (``AgreementCount.describe``), or its share."""
    if check.count is not None:
        return check.count.describe()
    return f"{check.agreement or 0:.4f}"


def judged(check: OutputCheck, gate: Gate) -> OutputCheck:
    """``check`` with ``gate``'s verdict."""
    return dataclasses.replace(check, verdict=gate.judge(check))


def check_output(signature: str, output: str, pairs: Iterable[tuple], gate: Gate) -> OutputCheck:
    """Measures one output over batches of ``(expected, actual)`` answers and judges it.

    ``actual`` is None where the candidate did not return the output.
    """
    pairs = list(pairs)
    differing = elements = 0
    max_abs = max_rel = 0.0
    breaks: list[str] = []
    shape: tuple[int, ...] = ()
    dtype = ""
    for expected, actual in pairs:
        expected = np.asarray(expected)
        shape, dtype = tuple(int(d) for d in expected.shape), expected.dtype.name
        elements += expected.size
        if actual is None:
            differing += expected.size or 1
            breaks.append("output missing")
            continue
        diff = compare_arrays(expected, actual, gate.atol, gate.rtol)
        differing += diff.differing
        max_abs, max_rel = max(max_abs, diff.max_abs_diff), max(max_rel, diff.max_rel_diff)
        if diff.broken:
            breaks.append(diff.broken)
    broken = "; ".join(dict.fromkeys(breaks))
    agreement = None
    count = None
    class_rows = has_class_rows(shape)
    if gate.scores_agreement and not broken:
        rows = agree = 0
        for expected, actual in pairs:
            r, a = _agreeing(np.asarray(expected), np.asarray(actual))
            rows, agree = rows + r, agree + a
        agreement = agree / rows if rows else None
        # Rows scored are class rows (floats); a float output with none is not a classifier's.
        class_rows = rows > 0
        if rows:
            count = AgreementCount(rows, agree)
            if is_float_dtype(dtype) and is_probability_output(output):
                by_row = row_agreement(pairs, _tie_cap(gate))
                if by_row is not None:
                    count = by_row.count()
                    agreement = count.agreement
    check = OutputCheck(
        signature=signature, output=output, kind=output_kind(output, dtype, class_rows),
        dtype=dtype, shape=shape, elements=elements, differing=differing,
        max_abs_diff=max_abs, max_rel_diff=max_rel, agreement=agreement, broken=broken,
        count=count)
    return judged(check, gate)


def _tie_cap(gate: Gate) -> float:
    """The largest tie margin a gate allows: a probability may move by its bound, so a
    margin by twice that."""
    return 2 * getattr(gate, "max_probability_error", DEFAULT_MAX_PROBABILITY_ERROR)


def check_signature(signature: str, per_output: dict[str, list], gate: Gate,
                    ) -> dict[str, OutputCheck]:
    """Every output of one signature measured and judged (:func:`check_output`); under
    the lossy gate, an integer or string output with one value per row of a
    probabilities output (class ids, class names) is counted on that output's decisive
    rows: where the original's top-1 was a near-tie, its class id may flip with it.
    """
    checks = {alias: check_output(signature, alias, pairs, gate)
              for alias, pairs in per_output.items() if pairs}
    if not gate.scores_agreement:
        return checks
    by_row = None
    for alias in sorted(checks):
        check = checks[alias]
        if check.kind is Kind.PROBABILITIES and check.count is not None:
            by_row = row_agreement(per_output[alias], _tie_cap(gate))
            if by_row is not None:
                break
    if by_row is None or not by_row.tie_margin:
        return checks
    for alias, check in checks.items():
        if check.kind is not Kind.DISCRETE or check.count is None:
            continue
        pairs = per_output[alias]
        changed = []
        for (expected, actual), flipped in zip(pairs, by_row.flipped):
            expected, actual = np.asarray(expected), np.asarray(actual)
            if expected.ndim == 0 or len(expected) != len(flipped) or \
                    expected.shape != actual.shape:
                break
            changed.append(changed_rows(expected, actual))
        else:
            count = by_row.decisive(changed)
            checks[alias] = judged(dataclasses.replace(
                check, count=count, agreement=count.agreement), gate)
    return checks
