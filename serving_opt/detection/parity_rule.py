"""The parity gate's rule for outputs behind discontinuous ops (NMS, TopK, ArgMax, ...).

Elementwise comparison is the right test for continuous outputs and the wrong one behind
NMS: folding a batch norm moves a score by 1e-7, two boxes that nearly tie swap, and a
whole box moves between output slots. :mod:`serving_opt.stages.parity` measures every
output elementwise, as always; for a signature with discontinuous outputs it also
fetches the continuous tensors that feed the discontinuous ops (:func:`plan`, in both
graphs: :func:`candidate_tensors`) and hands every batch here (:func:`rejudge`):

* lossless work (the tolerance gate): an output that differs is accepted only where
  every tensor feeding its discontinuous op agrees within the tolerance, row by row (a
  near-tie decided the other way by rounding). Detections are compared as detections:
  matched by class and IoU >= 0.99, scores within the tolerance; the verdict says how
  many moved and by how much. Anything else (a wrong weight moves the feeds) fails.
* lossy work (``--quantize``): a detection model's outputs are judged by detection
  agreement (same class, IoU >= 0.5, the share matched at least the lossy gate's
  ``min_top1_agreement``), not by elementwise drift or top-1 rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from serving_opt.core import gates
from serving_opt.core.gates import Kind, OutputCheck, Verdict
from serving_opt.detection import discontinuous, matching

# Lossy work: a detection survives quantization when a box of its class overlaps it
# this much (the usual "same detection" threshold of detection metrics).
LOSSY_IOU = 0.5


@dataclass(frozen=True)
class DiscreteOutputs:
    """One signature's discontinuous outputs and the tensors feeding their ops."""

    analysis: discontinuous.Analysis
    feeds: tuple[str, ...]  # tensors of the reference graph, fetched with the outputs

    @property
    def keys(self) -> tuple[str, ...]:
        return self.analysis.discontinuous_keys()

    @property
    def detection(self) -> matching.DetectionKeys | None:
        return self.analysis.detection


@dataclass(frozen=True)
class Batch:
    """One batch of both runs: outputs by key, feeding tensors by the reference's name
    (a feed missing from the candidate is absent from ``candidate_feeds``)."""

    expected: Mapping[str, np.ndarray]
    actual: Mapping[str, np.ndarray]
    reference_feeds: Mapping[str, np.ndarray]
    candidate_feeds: Mapping[str, np.ndarray]


def plan(graph_def, signature_def, key: str) -> DiscreteOutputs | None:
    """The signature's discontinuous outputs and what to fetch with them; None when
    every output is continuous (parity then compares elementwise only).
    """
    analysis = discontinuous.analyze(graph_def, signature_def, key)
    if not analysis.discontinuous_keys():
        return None
    return DiscreteOutputs(analysis, analysis.feeding_tensors())


def candidate_tensors(discrete: DiscreteOutputs, graph_def, signature_def,
                      key: str) -> dict[str, str]:
    """Reference feed tensor -> the candidate's tensor feeding the same op (rewrites
    rename nodes; :func:`discontinuous.pair_feeds`). Unpaired feeds are left out.
    """
    after = discontinuous.analyze(graph_def, signature_def, key)
    wanted = set(discrete.feeds)
    return {ref: cand for ref, cand in discontinuous.pair_feeds(discrete.analysis, after)
            if ref in wanted}


def rejudge(checks: Mapping[str, OutputCheck], batches: Sequence[Batch],
            discrete: DiscreteOutputs, gate: gates.Gate) -> dict[str, OutputCheck]:
    """``checks`` (one signature's outputs, measured elementwise and judged) with the
    discontinuous outputs judged as what they mean.
    """
    out = dict(checks)
    detection = discrete.detection
    detection_keys = _keys_of(detection) if detection else ()
    if detection and all(k in checks for k in detection_keys) and batches:
        if gate.scores_agreement:
            verdict, agreement = _lossy_detections(batches, detection, gate)
            out.update(_as_detections(checks, detection, verdict, agreement))
        elif any(_differs(checks[k]) for k in detection_keys):
            verdict = _lossless_detections(batches, detection, gate)
            out.update(_as_detections(checks, detection, verdict))
    if gate.scores_agreement:
        return out  # other discrete outputs: the lossy rule's own (agreement of values)
    for key in discrete.keys:
        if key in detection_keys or key not in checks or not _differs(checks[key]):
            continue
        out[key] = _with(checks[key], _lossless_rows(key, batches, gate))
    return out


def _as_detections(checks: dict, detection, verdict: Verdict,
                   agreement: float | None = None) -> dict:
    """The detection outputs' checks, all judged by one verdict: its whole story once, on
    the boxes, and the other outputs pointing there."""
    out = {}
    for k in _keys_of(detection):
        own = verdict if k == detection.boxes else \
            Verdict(verdict.ok, f"judged as detections with {detection.boxes}")
        out[k] = _with(checks[k], own, Kind.DETECTIONS, agreement)
    return out


def _keys_of(keys: matching.DetectionKeys) -> tuple[str, ...]:
    return tuple(k for k in (keys.boxes, keys.scores, keys.classes, keys.num) if k)


def _differs(check: OutputCheck) -> bool:
    """Failed on differing values (a shape, dtype or missing output stays failed)."""
    return not check.broken and check.verdict is not None and not check.verdict.ok


def _with(check: OutputCheck, verdict: Verdict, kind: Kind | None = None,
          agreement: float | None = None) -> OutputCheck:
    return dataclasses.replace(check, verdict=verdict, kind=kind or check.kind,
                               agreement=agreement if agreement is not None
                               else check.agreement)


def _unpaired(batches: Sequence[Batch]) -> list[str]:
    missing: set[str] = set()
    for b in batches:
        missing |= set(b.reference_feeds) - set(b.candidate_feeds)
    return sorted(missing)


def _near_ties(changed_by_batch: Sequence[np.ndarray], batches: Sequence[Batch],
               gate: gates.Gate) -> tuple[bool, str]:
    """Whether every changed row is a near-tie, and the line that says so."""
    changed = sum(int(np.sum(c)) for c in changed_by_batch)
    if not changed:
        return True, ""
    missing = _unpaired(batches)
    if missing:
        return False, (f"{changed} changed rows cannot be excused as near-ties: the tensors "
                       f"feeding the discontinuous op ({', '.join(missing[:3])}) are not "
                       "in the optimized graph")
    if any(np.any(c) and not b.reference_feeds for c, b in zip(changed_by_batch, batches)):
        return False, (f"{changed} changed rows cannot be excused as near-ties: the "
                       "discontinuous op's inputs cannot be fetched (inside a function)")
    excused = unexcused = 0
    worst: matching.NearTieVerdict | None = None
    for rows, b in zip(changed_by_batch, batches):
        verdict = matching.near_tie_verdict(rows, b.reference_feeds, b.candidate_feeds,
                                            gate.atol, gate.rtol)
        excused += verdict.excused
        unexcused += len(verdict.unexcused)
        if not verdict.accepted and worst is None:
            worst = verdict
    if worst is not None:
        return False, worst.summary() + (f" (all batches: {unexcused} of {changed})"
                                         if len(batches) > 1 else "")
    what = "accepted as a near-tie" if excused == 1 else "accepted as near-ties"
    return True, (f"{what}: the tensors feeding the discontinuous op agree within atol "
                  f"{gate.atol:g}, rtol {gate.rtol:g}")


def _lossless_detections(batches: Sequence[Batch], keys: matching.DetectionKeys,
                         gate: gates.Gate) -> Verdict:
    matches = [matching.match_detections(b.expected, b.actual, matching.LOSSLESS_IOU,
                                         gate.atol, gate.rtol, keys) for b in batches]
    merged = matching.DetectionMatch(tuple(i for m in matches for i in m.images),
                                     matching.LOSSLESS_IOU, gate.atol, gate.rtol)
    ok, why = _near_ties([m.changed_images() for m in matches], batches, gate)
    text = f"detections: {merged.summary()}"
    return Verdict(ok, f"{text}; {why}" if why else text)


def _lossy_detections(batches: Sequence[Batch], keys: matching.DetectionKeys,
                      gate: gates.Gate) -> tuple[Verdict, float]:
    error = getattr(gate, "max_probability_error", gates.DEFAULT_MAX_PROBABILITY_ERROR)
    needed = getattr(gate, "min_top1_agreement", gates.DEFAULT_MIN_TOP1_AGREEMENT)
    matches = [matching.match_detections(b.expected, b.actual, LOSSY_IOU, error, 0.0, keys)
               for b in batches]
    merged = matching.DetectionMatch(tuple(i for m in matches for i in m.images), LOSSY_IOU,
                                     error, 0.0)
    most = sum(max(i.reference, i.candidate) for i in merged.images)
    agreement = (merged.matched - merged.score_outside) / most if most else 1.0
    text = f"detection agreement {agreement:.4f}: {merged.summary()}"
    if agreement < needed:
        return Verdict(False, f"{text} (< {needed})"), agreement
    return Verdict(True, text), agreement


def _changed_rows(expected, actual, gate: gates.Gate) -> np.ndarray:
    """bool [rows] (first axis): rows of one output where any element differs."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype.kind in "fc":
        differs = ~gates.float_differences(expected, actual, gate.atol, gate.rtol).close
    else:
        differs = np.asarray(expected != actual)
    if differs.ndim == 0:
        return differs.reshape(1)
    return differs.reshape(len(differs), -1).any(axis=1)


def _lossless_rows(key: str, batches: Sequence[Batch], gate: gates.Gate) -> Verdict:
    changed = [_changed_rows(b.expected[key], b.actual[key], gate) for b in batches]
    rows = sum(len(c) for c in changed)
    count = sum(int(c.sum()) for c in changed)
    ok, why = _near_ties(changed, batches, gate)
    return Verdict(ok, f"{count} of {rows} rows changed, {why}" if ok
                   else f"{count} of {rows} rows changed; {why}")


__all__ = ("Batch", "DiscreteOutputs", "candidate_tensors", "plan", "rejudge")
