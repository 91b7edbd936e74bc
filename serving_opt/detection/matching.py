"""Comparing two runs' discrete answers as what they mean (numpy only).

Elementwise comparison is the wrong test for outputs that pass through NMS, TopK or
ArgMax: a rounding difference that reorders two detections of nearly equal score moves
whole boxes between output slots. Here two runs of one batch are compared as
detections matched by class and IoU (:func:`match_detections`), as top-k sets
(:func:`topk_agreement`) and as argmax answers (:func:`argmax_changes`), each with a
one-line summary. :func:`near_tie_verdict` is the lossless rule of issue 22: a changed
discrete answer is accepted only for rows where the continuous tensors feeding the
discontinuous op agree within tolerance (a near-tie decided the other way by rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

LOSSLESS_IOU = 0.99
# Below the match threshold, a box of the same class overlapping this much is reported
# as replaced (a near-tie NMS decided the other way), not as one missing and one extra.
REPLACED_IOU = 0.5


@dataclass(frozen=True)
class DetectionKeys:
    """Output names of a detection signature; ``num`` None when there is none (every
    row with a positive score counts)."""

    boxes: str = "detection_boxes"
    scores: str = "detection_scores"
    classes: str = "detection_classes"
    num: str | None = "num_detections"


OD_API_KEYS = DetectionKeys()


@dataclass(frozen=True)
class ImageMatch:
    """One image's detections, reference against candidate.

    ``matched``: pairs of one class with IoU >= the threshold; ``moved``: of those, the
    ones not identical (IoU < 1 or any score difference); ``score_outside``: of those,
    the ones whose score differs by more than the tolerance; ``replaced``: a reference
    detection without a match whose place a candidate box of its class took (IoU >=
    REPLACED_IOU); ``missing``/``extra``: reference/candidate detections left over.
    """

    reference: int
    candidate: int
    matched: int
    moved: int
    score_outside: int
    replaced: int
    missing: int
    extra: int
    max_box_shift: float  # largest coordinate difference of a matched pair
    max_score_diff: float  # largest score difference of a matched pair
    min_replaced_iou: float  # 1.0 when nothing was replaced

    @property
    def agrees(self) -> bool:
        """Every detection matched, every score within tolerance."""
        return self.matched == self.reference == self.candidate and not self.score_outside

    @property
    def identical(self) -> bool:
        return self.agrees and not self.moved


@dataclass(frozen=True)
class DetectionMatch:
    """The detections of a batch, reference against candidate, image by image."""

    images: tuple[ImageMatch, ...]
    iou_threshold: float
    score_atol: float
    score_rtol: float

    def _sum(self, field: str) -> int:
        return sum(getattr(i, field) for i in self.images)

    @property
    def reference(self) -> int:
        return self._sum("reference")

    @property
    def candidate(self) -> int:
        return self._sum("candidate")

    @property
    def matched(self) -> int:
        return self._sum("matched")

    @property
    def moved(self) -> int:
        return self._sum("moved")

    @property
    def score_outside(self) -> int:
        return self._sum("score_outside")

    @property
    def replaced(self) -> int:
        return self._sum("replaced")

    @property
    def missing(self) -> int:
        return self._sum("missing")

    @property
    def extra(self) -> int:
        return self._sum("extra")

    @property
    def max_box_shift(self) -> float:
        return max((i.max_box_shift for i in self.images), default=0.0)

    @property
    def max_score_diff(self) -> float:
        return max((i.max_score_diff for i in self.images), default=0.0)

    @property
    def agrees(self) -> bool:
        return all(i.agrees for i in self.images)

    def changed_images(self) -> np.ndarray:
        """bool [images]: where the detections do not all agree (the rows a lossless
        gate must excuse with :func:`near_tie_verdict` or fail)."""
        return np.array([not i.agrees for i in self.images], dtype=bool)

    def summary(self) -> str:
        """One line, e.g. "9 of 9 detections matched (IoU >= 0.99), 1 moved by at most
        0.004 (score 1.2e-07)".
        """
        text = (f"{self.matched} of {self.reference} detections matched "
                f"(IoU >= {self.iou_threshold:g})")
        if self.moved:
            text += (f", {self.moved} moved by at most {self.max_box_shift:.3g} "
                     f"(score {self.max_score_diff:.2g})")
        elif self.matched:
            text += ", none moved"
        if self.score_outside:
            text += (f", {self.score_outside} with a score off by more than "
                     f"{self.score_atol:g} + {self.score_rtol:g}x")
        if self.replaced:
            worst = min(i.min_replaced_iou for i in self.images)
            text += (f", {self.replaced} replaced by an overlapping box of its class "
                     f"(IoU >= {worst:.2f})")
        if self.missing:
            text += f", {self.missing} missing"
        if self.extra:
            text += f", {self.extra} extra"
        images = len(self.images)
        changed = int(self.changed_images().sum())
        if changed:
            text += f"; {changed} of {images} images differ"
        return text


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each box of ``a`` [n, 4] with each of ``b`` [m, 4] (ymin, xmin, ymax, xmax
    or any consistent corner order): [n, m]. Empty boxes overlap nothing.
    """
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0.0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0.0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0.0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
    return out


def _greedy_pairs(iou: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """One-to-one pairs with IoU >= threshold, best overlap first."""
    pairs = []
    if iou.size == 0:
        return pairs
    order = np.argsort(-iou, axis=None, kind="stable")
    used_a: set[int] = set()
    used_b: set[int] = set()
    for flat in order:
        i, j = divmod(int(flat), iou.shape[1])
        if iou[i, j] < threshold:
            break
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        pairs.append((i, j))
    return pairs


def _image(boxes, scores, classes, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.asarray(boxes, np.float64)[:count].reshape(-1, 4),
            np.asarray(scores, np.float64)[:count].reshape(-1),
            np.asarray(classes)[:count].reshape(-1))


def match_image(ref_boxes, ref_scores, ref_classes, cand_boxes, cand_scores, cand_classes,
                iou_threshold: float = LOSSLESS_IOU, score_atol: float = 1e-5,
                score_rtol: float = 1e-4) -> ImageMatch:
    """Matches one image's detections (already cut to the valid count) by class and IoU."""
    rb, rs, rc = _image(ref_boxes, ref_scores, ref_classes, len(ref_scores))
    cb, cs, cc = _image(cand_boxes, cand_scores, cand_classes, len(cand_scores))
    matched = moved = outside = replaced = 0
    shift = score_diff = 0.0
    worst_replaced = 1.0
    left_r: list[int] = []
    left_c: list[int] = []
    for cls in np.unique(np.concatenate([rc, cc])):
        ri = np.flatnonzero(rc == cls)
        ci = np.flatnonzero(cc == cls)
        iou = iou_matrix(rb[ri], cb[ci])
        pairs = _greedy_pairs(iou, iou_threshold)
        for i, j in pairs:
            matched += 1
            d_box = float(np.max(np.abs(rb[ri[i]] - cb[ci[j]])))
            d_score = float(abs(rs[ri[i]] - cs[ci[j]]))
            if iou[i, j] < 1.0 or d_score > 0 or d_box > 0:
                moved += 1
            if d_score > score_atol + score_rtol * abs(rs[ri[i]]) or np.isnan(d_score):
                outside += 1
            shift = max(shift, d_box)
            score_diff = max(score_diff, d_score)
        rest_r = [i for i in range(len(ri)) if i not in {p[0] for p in pairs}]
        rest_c = [j for j in range(len(ci)) if j not in {p[1] for p in pairs}]
        loose = _greedy_pairs(iou[np.ix_(rest_r, rest_c)], REPLACED_IOU) \
            if rest_r and rest_c else []
        for i, j in loose:
            replaced += 1
            worst_replaced = min(worst_replaced, float(iou[rest_r[i], rest_c[j]]))
        left_r += [rest_r[i] for i in range(len(rest_r)) if i not in {p[0] for p in loose}]
        left_c += [rest_c[j] for j in range(len(rest_c)) if j not in {p[1] for p in loose}]
    return ImageMatch(len(rs), len(cs), matched, moved, outside, replaced, len(left_r),
                      len(left_c), shift, score_diff, worst_replaced)


def _counts(outputs: Mapping[str, np.ndarray], keys: DetectionKeys) -> np.ndarray:
    scores = np.asarray(outputs[keys.scores])
    if keys.num is not None and keys.num in outputs:
        num = np.asarray(outputs[keys.num]).reshape(-1)
        return np.clip(np.nan_to_num(num).astype(np.int64), 0, scores.shape[-1])
    return (np.nan_to_num(scores) > 0).sum(axis=-1).reshape(-1)


def match_detections(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                     iou_threshold: float = LOSSLESS_IOU, score_atol: float = 1e-5,
                     score_rtol: float = 1e-4, keys: DetectionKeys = OD_API_KEYS
                     ) -> DetectionMatch:
    """Matches two runs' detections image by image: OD-API outputs (boxes [batch, n, 4],
    scores and classes [batch, n], num_detections [batch]) by output name.
    """
    ref_counts, cand_counts = _counts(reference, keys), _counts(candidate, keys)
    if len(ref_counts) != len(cand_counts):
        raise ValueError(f"the runs answered {len(ref_counts)} and {len(cand_counts)} "
                         "images; compare runs of the same batch")
    images = []
    for b in range(len(ref_counts)):
        r, c = int(ref_counts[b]), int(cand_counts[b])
        images.append(match_image(
            np.asarray(reference[keys.boxes])[b][:r], np.asarray(reference[keys.scores])[b][:r],
            np.asarray(reference[keys.classes])[b][:r],
            np.asarray(candidate[keys.boxes])[b][:c], np.asarray(candidate[keys.scores])[b][:c],
            np.asarray(candidate[keys.classes])[b][:c],
            iou_threshold, score_atol, score_rtol))
    return DetectionMatch(tuple(images), iou_threshold, score_atol, score_rtol)


@dataclass(frozen=True)
class TopKAgreement:
    """Rows of top-k indices (``[..., k]``, e.g. TopKV2's second output), compared."""

    rows: int
    k: int
    same_set: int  # rows whose k indices are the same set
    same_order: int  # of those, rows in the same order too
    mean_overlap: float  # mean |intersection| / k over rows
    changed_mask: np.ndarray  # bool [rows]: not the same indices in the same order

    def changed_rows(self) -> np.ndarray:
        """bool [rows]: rows whose top-k indices changed (set or order)."""
        return self.changed_mask

    def summary(self) -> str:
        """E.g. "31 of 32 rows have the same top-5 set (30 in the same order)"."""
        return (f"{self.same_set} of {self.rows} rows have the same top-{self.k} set "
                f"({self.same_order} in the same order)")


def topk_agreement(reference, candidate) -> TopKAgreement:
    """Compares top-k index outputs row by row (the last axis holds the k indices)."""
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    if ref.shape != cand.shape:
        raise ValueError(f"top-k outputs of shapes {ref.shape} and {cand.shape} differ")
    k = ref.shape[-1] if ref.ndim else 1
    ref = ref.reshape(-1, k)
    cand = cand.reshape(-1, k)
    same_set = same_order = 0
    overlap = 0.0
    changed = np.zeros(len(ref), dtype=bool)
    for row, (a, b) in enumerate(zip(ref, cand)):
        common = len(set(a.tolist()) & set(b.tolist()))
        overlap += common / k if k else 1.0
        if set(a.tolist()) == set(b.tolist()):
            same_set += 1
            if np.array_equal(a, b):
                same_order += 1
                continue
        changed[row] = True
    rows = len(ref)
    return TopKAgreement(rows, k, same_set, same_order, overlap / rows if rows else 1.0,
                         changed)


@dataclass(frozen=True)
class ArgmaxChanges:
    """Argmax (ArgMax/ArgMin output, or class ids) answers, compared elementwise."""

    answers: int
    changed: int
    changed_mask: np.ndarray  # bool, the answers' shape

    def changed_rows(self) -> np.ndarray:
        """bool [rows]: rows (first axis) where any answer changed."""
        mask = self.changed_mask
        return mask.reshape(len(mask), -1).any(axis=1) if mask.ndim else mask.reshape(1)

    def summary(self) -> str:
        """E.g. "1 of 32 argmax answers changed"."""
        return f"{self.changed} of {self.answers} argmax answers changed"


def argmax_changes(reference, candidate) -> ArgmaxChanges:
    """Counts argmax answers that differ between two runs."""
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    if ref.shape != cand.shape:
        raise ValueError(f"argmax outputs of shapes {ref.shape} and {cand.shape} differ")
    mask = ref != cand
    return ArgmaxChanges(int(ref.size), int(mask.sum()), mask)


@dataclass(frozen=True)
class TensorAgreement:
    """How far one feeding tensor of the candidate is from the reference."""

    name: str
    max_abs_diff: float
    outside: int  # elements outside atol + rtol * |reference|
    elements: int


@dataclass(frozen=True)
class NearTieVerdict:
    """Whether a lossless run's changed discrete answers are near-ties.

    ``accepted`` when every changed row's feeding tensors agree within tolerance;
    ``excused`` rows are changed rows with agreeing feeds, ``unexcused`` the others.
    """

    accepted: bool
    changed: int
    excused: int
    unexcused: tuple[int, ...]  # row indices
    tensors: tuple[TensorAgreement, ...]  # worst first
    atol: float
    rtol: float

    def summary(self) -> str:
        """E.g. "1 changed answer accepted as a near-tie: the tensors feeding the
        discontinuous op agree within atol 1e-05, rtol 0.0001"."""
        tol = f"atol {self.atol:g}, rtol {self.rtol:g}"
        if not self.changed:
            return "no discrete answer changed"
        if self.accepted:
            what = "answer accepted as a near-tie" if self.changed == 1 else \
                "answers accepted as near-ties"
            return (f"{self.changed} changed {what}: the tensors feeding the discontinuous "
                    f"op agree within {tol}")
        worst = self.tensors[0] if self.tensors else None
        where = (f"; {worst.name}: {worst.outside} of {worst.elements} elements outside, "
                 f"max abs diff {worst.max_abs_diff:.3g}") if worst and worst.outside else ""
        rows = ", ".join(str(r) for r in self.unexcused[:5])
        more = "..." if len(self.unexcused) > 5 else ""
        return (f"{len(self.unexcused)} of {self.changed} changed answers (rows {rows}{more}) "
                f"are not near-ties: the tensors feeding the discontinuous op differ beyond "
                f"{tol}{where}")


def rows_within_tolerance(reference, candidate, rows: int, atol: float, rtol: float
                          ) -> tuple[np.ndarray, TensorAgreement]:
    """bool [rows]: where ``candidate`` is within ``atol + rtol * |reference|`` of
    ``reference`` (NaN equal to NaN). A tensor whose first axis is not ``rows`` long
    (no batch axis) counts for every row; a shape change fails every row.
    """
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    if ref.shape != cand.shape:
        return np.zeros(rows, bool), TensorAgreement("", float("inf"), int(ref.size),
                                                      int(ref.size))
    if ref.dtype.kind in "fc" or cand.dtype.kind in "fc":
        close = np.isclose(cand.astype(np.float64), ref.astype(np.float64), atol=atol,
                           rtol=rtol, equal_nan=True)
        with np.errstate(invalid="ignore"):
            diff = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
        finite = diff[np.isfinite(diff)]
        max_diff = float(finite.max()) if finite.size else 0.0
        if (~np.isfinite(diff) & ~close).any():
            max_diff = float("inf")
    else:
        close = ref == cand
        max_diff = 0.0 if close.all() else float("nan")
    agreement = TensorAgreement("", max_diff, int((~close).sum()), int(ref.size))
    if ref.ndim and ref.shape[0] == rows:
        return close.reshape(rows, -1).all(axis=1), agreement
    return np.full(rows, bool(close.all())), agreement


def near_tie_verdict(changed_rows, reference_feeds: Mapping[str, np.ndarray],
                     candidate_feeds: Mapping[str, np.ndarray], atol: float,
                     rtol: float) -> NearTieVerdict:
    """Decides whether changed discrete answers are acceptable in a lossless run.

    ``changed_rows``: bool [rows] where the discrete output changed (e.g.
    :meth:`DetectionMatch.changed_images`); ``*_feeds``: tensor name -> value of the
    continuous tensors feeding the discontinuous op (from
    :func:`serving_opt.detection.discontinuous.analyze`), in both runs. A changed row is
    excused only when every feeding tensor agrees there within ``atol + rtol *
    |reference|``: the discrete op saw (nearly) the same numbers and a near-tie went
    the other way. Any other change fails.
    """
    changed = np.asarray(changed_rows, dtype=bool).reshape(-1)
    rows = len(changed)
    missing = sorted(set(reference_feeds) ^ set(candidate_feeds))
    if missing:
        raise ValueError(f"feeding tensors {missing} are in one run only")
    agree = np.ones(rows, dtype=bool)
    tensors = []
    for name in sorted(reference_feeds):
        ok, agreement = rows_within_tolerance(reference_feeds[name], candidate_feeds[name],
                                              rows, atol, rtol)
        agree &= ok
        tensors.append(TensorAgreement(name, agreement.max_abs_diff, agreement.outside,
                                       agreement.elements))
    tensors.sort(key=lambda t: (-t.outside, -np.nan_to_num(t.max_abs_diff, nan=np.inf)))
    unexcused = tuple(int(r) for r in np.flatnonzero(changed & ~agree))
    excused = int((changed & agree).sum())
    return NearTieVerdict(not unexcused, int(changed.sum()), excused, unexcused,
                          tuple(tensors), atol, rtol)
