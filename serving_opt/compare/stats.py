"""What ``serving-opt compare`` measures for one output of one signature, mergeable.

An :class:`OutputStats` is the accumulator of a Beam ``CombineFn``: ``add_batch`` folds
one batch of (baseline, candidate) answers into it, ``merge`` adds two of them, and its
size does not grow with the input (a fixed histogram, a class-confusion map bounded by
classes x classes, at most ``worst_k`` worst examples). Pure numpy; no Beam, no TF.

Definitions (the tolerance rule of ``serving_opt.core.gates``, the parity gate's): an element
mismatches when not ``|c - b| <= atol + rtol * |b|`` (NaN equal to NaN); integers,
booleans and strings must be equal. Relative diff is ``|c - b| / |b|`` where ``b != 0``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from serving_opt.core import gates

# Upper bounds of the abs-diff histogram: 0 (identical), then one bucket per decade up to
# 1, then everything above. Fixed, so histograms of all workers add up bucket by bucket.
HISTOGRAM_BOUNDS: tuple[float, ...] = (0.0,) + tuple(10.0 ** e for e in range(-9, 1)) \
    + (math.inf,)
DEFAULT_WORST_K = 10


def histogram_labels() -> list[str]:
    """Labels of HISTOGRAM_BOUNDS: '0', '<=1e-09', ..., '<=1', '>1'."""
    labels = ["0"]
    for bound in HISTOGRAM_BOUNDS[1:-1]:
        labels.append(f"<={bound:g}")
    return labels + [f">{HISTOGRAM_BOUNDS[-2]:g}"]


@dataclass
class OutputStats:
    """The running comparison of one (signature, output)."""

    signature: str
    output: str
    atol: float
    rtol: float
    worst_k: int = DEFAULT_WORST_K
    dtype: str = ""
    row_shape: tuple[int, ...] = ()  # the shape of one example's answer
    examples: int = 0
    elements: int = 0
    mismatches: int = 0  # elements
    mismatched_examples: int = 0
    max_abs_diff: float = 0.0
    sum_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    sum_rel_diff: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_BOUNDS))
    # Classifiers: rows whose top-1 class (argmax of probabilities/scores, or the class
    # id) agrees, out of top1_rows; confusion[(baseline_class, candidate_class)] = rows.
    top1_rows: int = 0
    top1_agree: int = 0
    confusion: dict = field(default_factory=dict)
    # Min-heap of (score, negated key) of the worst examples: score = the example's max
    # abs diff (floats) or differing elements (others); only examples that differ at all.
    worst: list = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # shape/dtype breaks, at most 3

    @classmethod
    def empty(cls, signature: str, output: str, atol: float, rtol: float,
              worst_k: int = DEFAULT_WORST_K) -> OutputStats:
        return cls(signature, output, atol, rtol, worst_k)

    @property
    def kind(self) -> gates.Kind:
        """What the output is (gates.Kind), from its name, dtype and answer shape."""
        return gates.output_kind(self.output, self.dtype,
                                 gates.has_class_rows((0,) + self.row_shape))

    def add_break(self, text: str) -> None:
        """Records why the answers cannot be compared (a shape, a dtype, a missing
        output); the first three reasons are kept."""
        if text not in self.details and len(self.details) < 3:
            self.details.append(text)

    def add_missing(self, keys, baseline) -> None:
        """Folds in a batch the candidate answered without this output."""
        self.examples += len(keys)
        self.mismatched_examples += len(keys)
        self.mismatches += max(np.size(baseline), 1)
        self.add_break("output missing from the candidate")

    def add_batch(self, keys, baseline, candidate) -> None:
        """Folds one batch in: ``keys[i]`` names row ``i`` of both arrays."""
        baseline, candidate = np.asarray(baseline), np.asarray(candidate)
        rows = len(keys)
        self.examples += rows
        self.dtype = self.dtype or baseline.dtype.name
        if baseline.ndim and baseline.shape[0] == rows:
            self.row_shape = tuple(int(d) for d in baseline.shape[1:])
        self.elements += baseline.size
        broken = gates.structural_break(baseline, candidate)
        if broken:  # shape or dtype differ: every element counts as a mismatch
            self.add_break(broken)
            self.mismatches += baseline.size or 1
            self.mismatched_examples += rows
            self.histogram[-1] += baseline.size
            for key in keys:
                self._push(math.inf, key)
            return
        per_row = baseline.ndim > 0 and baseline.shape[0] == rows
        if baseline.dtype.kind in "fc":
            d = gates.float_differences(baseline, candidate, self.atol, self.rtol)
            close, finite, diff, rel = d
            mismatches = int((~close).sum())
            self.max_abs_diff = max(self.max_abs_diff, float(diff.max(initial=0.0)))
            self.max_rel_diff = max(self.max_rel_diff, float(rel.max(initial=0.0)))
            self.sum_abs_diff += float(diff.sum())
            self.sum_rel_diff += float(rel.sum())
            # Non-finite where the other is not (inf vs 1.0, NaN vs 1.0): the top bucket.
            flat = np.where(finite | close, diff, math.inf).ravel()
            self.histogram = [a + int(b) for a, b in zip(
                self.histogram, np.bincount(np.searchsorted(HISTOGRAM_BOUNDS, flat),
                                            minlength=len(HISTOGRAM_BOUNDS)))]
            if per_row:
                row_diff = np.where(finite | close, diff, math.inf).reshape(rows, -1)
                row_bad = (~close).reshape(rows, -1).any(axis=1)
                scores = row_diff.max(axis=1, initial=0.0)
            if per_row and gates.is_probability_output(self.output) and baseline.ndim == 2:
                top1 = gates.top1_classes(baseline)
                if top1 is not None:
                    self._classes(top1, gates.top1_classes(candidate))
        else:
            unequal = np.asarray(baseline != candidate)
            mismatches = int(unequal.sum())
            self.histogram[0] += int((~unequal).sum())
            self.histogram[-1] += int(unequal.sum())
            if per_row:
                row_bad = unequal.reshape(rows, -1).any(axis=1)
                scores = unequal.reshape(rows, -1).sum(axis=1).astype(np.float64)
            if per_row and baseline.dtype.kind in "iu" and \
                    gates.is_class_id_output(self.output) and baseline.size == rows:
                self._classes(baseline.reshape(rows), candidate.reshape(rows))
        self.mismatches += mismatches
        if per_row:
            self.mismatched_examples += int(row_bad.sum())
            for index in np.flatnonzero(scores > 0):
                self._push(float(scores[index]), keys[index])
        elif mismatches:
            self.mismatched_examples += rows

    def _classes(self, baseline_ids, candidate_ids) -> None:
        self.top1_rows += len(baseline_ids)
        self.top1_agree += int((baseline_ids == candidate_ids).sum())
        pairs, counts = np.unique(np.stack([baseline_ids, candidate_ids], axis=1), axis=0,
                                  return_counts=True)
        for (b, c), n in zip(pairs.tolist(), counts.tolist()):
            self.confusion[(b, c)] = self.confusion.get((b, c), 0) + n

    def _push(self, score: float, key: str) -> None:
        # Ties on the score go to the smaller key, so the sample is the same on any runner.
        item = (score, _Reversed(key))
        if len(self.worst) < self.worst_k:
            heapq.heappush(self.worst, item)
        elif item > self.worst[0]:
            heapq.heapreplace(self.worst, item)

    def merge(self, other: OutputStats) -> OutputStats:
        """Adds ``other`` into this accumulator (and returns it)."""
        self.dtype = self.dtype or other.dtype
        self.row_shape = self.row_shape or other.row_shape
        for name in ("examples", "elements", "mismatches", "mismatched_examples",
                     "sum_abs_diff", "sum_rel_diff", "top1_rows", "top1_agree"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs_diff = max(self.max_abs_diff, other.max_abs_diff)
        self.max_rel_diff = max(self.max_rel_diff, other.max_rel_diff)
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram)]
        for pair, n in other.confusion.items():
            self.confusion[pair] = self.confusion.get(pair, 0) + n
        for score, key in other.worst:
            self._push(score, key.key)
        for detail in other.details:
            self.add_break(detail)
        return self

    def worst_examples(self) -> list[tuple[str, float]]:
        """(key, score), worst first; ties by key."""
        return [(k.key, s) for s, k in sorted(self.worst, reverse=True)]

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agree / self.top1_rows if self.top1_rows else None


class _Reversed:
    """A key ordered backwards, so a min-heap on (score, key) evicts the larger key first."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __lt__(self, other: _Reversed) -> bool:
        return self.key > other.key

    def __gt__(self, other: _Reversed) -> bool:
        return self.key < other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __getstate__(self):
        return self.key

    def __setstate__(self, state) -> None:
        self.key = state


@dataclass
class ErrorStats:
    """Batches a signature raised on: by both models (behaviour kept), or by one only."""

    signature: str
    both: int = 0  # examples in batches both models rejected
    baseline_only: int = 0
    candidate_only: int = 0
    first_error: str = ""

    def add(self, rows: int, baseline_error: str | None, candidate_error: str | None) -> None:
        if baseline_error and candidate_error:
            self.both += rows
        elif baseline_error:
            self.baseline_only += rows
        elif candidate_error:
            self.candidate_only += rows
        self.first_error = self.first_error or baseline_error or candidate_error or ""

    def merge(self, other: ErrorStats) -> ErrorStats:
        self.both += other.both
        self.baseline_only += other.baseline_only
        self.candidate_only += other.candidate_only
        self.first_error = self.first_error or other.first_error
        return self
