"""Sets the detection sample's class biases: so many detections on the reference frame, and
near-ties among them.

``near_ties`` of the detections tie, to float precision, with an overlapping box of
another anchor of the same class: NMS keeps one of the two, and which one is a rounding
decision (freezing or folding batch norms into the convolutions can flip it). The ties
are chosen with a numpy model of combined NMS, then checked on the live session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from serving_opt.detection.network import (
    ANCHORS,
    IOU_THRESHOLD,
    MAX_DETECTIONS,
    MAX_PER_CLASS,
    NUM_CLASSES,
    SCORE_THRESHOLD,
    Graph,
)


@dataclass(frozen=True)
class NearTie:
    """Two overlapping candidates of one class whose scores tie to float precision.

    ``kept`` and ``other`` are anchor indices (``cell * len(ANCHORS) + anchor``) into the
    model's candidates; ``rank`` is the kept detection's place in ``detection_scores``
    on the reference frame; ``iou`` the overlap of the two decoded boxes.
    """

    rank: int
    detection_class: int  # 1-based, as detection_classes
    kept: int
    other: int
    iou: float
    logit_gap: float  # |logit(kept) - logit(other)|, at most a few ulp


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box ``a`` [4] with each of ``b`` [M, 4] (ymin, xmin, ymax, xmax)."""
    ih = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    iw = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = ih * iw
    area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
    union = area(a) + area(b) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _ranked(logits: np.ndarray, boxes: np.ndarray, top: int = 64) -> list[tuple]:
    """What combined NMS keeps with no score threshold, best first: (logit, anchor
    index, class) per detection. Per class greedy NMS over the ``top`` best candidates,
    as the op does."""
    # The op compares the boxes as decoded; clip_boxes clips only what it returns.
    kept: list[tuple] = []
    for c in range(NUM_CLASSES):
        column = logits[:, c + 1]
        order = np.argsort(-column, kind="stable")[:top]
        chosen: list[int] = []
        for i in order:
            if chosen and np.any(_iou(boxes[i], boxes[chosen]) > IOU_THRESHOLD):
                continue
            chosen.append(int(i))
            if len(chosen) == MAX_PER_CLASS:
                break
        kept.extend((float(column[i]), i, c) for i in chosen)
    kept.sort(key=lambda t: -t[0])
    return kept[:MAX_DETECTIONS]


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


class _Calibrator:
    """Sets the class biases of a live session: near-ties, then the detection count."""

    def __init__(self, sess, g: Graph, reference: np.ndarray) -> None:
        self.sess, self.g, self.feed = sess, g, {g.image: reference}
        self.bias = sess.run(g.class_bias).astype(np.float64)

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        logits, boxes = self.sess.run([self.g.logits, self.g.boxes], self.feed)
        return logits[0], boxes[0]

    def set_bias(self, bias: np.ndarray) -> None:
        self.bias = bias
        self.g.class_bias.load(bias.astype(np.float32), self.sess)

    def make_tie(self, kept_index: int, other: int, cls: int, iou: float) -> NearTie:
        """Raises another overlapping anchor's class bias so that its logit equals the
        kept one's at this cell (to a few ulp)."""
        k = len(ANCHORS)
        channel = (other % k) * (NUM_CLASSES + 1) + cls + 1
        for _ in range(4):  # float32 rounding of conv + bias: converge to a few ulp
            logits, _ = self.run()
            diff = float(logits[kept_index, cls + 1]) - float(logits[other, cls + 1])
            if diff == 0.0:
                break
            bias = self.bias.copy()
            bias[channel] += diff
            self.set_bias(bias)
        logits, _ = self.run()
        gap = abs(float(logits[kept_index, cls + 1]) - float(logits[other, cls + 1]))
        return NearTie(-1, cls + 1, kept_index, other, iou, gap)

    def set_count(self, target: int) -> int:
        """Shifts every class logit so the score threshold falls halfway between the
        ``target``-th and the next detection NMS keeps; returns the count the model
        then answers. Where the numpy model of NMS and the op disagree (a tie ordered
        the other way), the neighbouring gaps are tried."""
        logits, boxes = self.run()
        levels = [r[0] for r in _ranked(logits, boxes)]
        base = self.bias.copy()
        found = 0
        for want in (target, target + 1, target - 1, target + 2, target - 2):
            if not 0 < want < len(levels) or levels[want - 1] == levels[want]:
                continue
            middle = (levels[want - 1] + levels[want]) / 2.0
            self.set_bias(base + (_logit(SCORE_THRESHOLD) - middle))
            found = int(self.sess.run(self.g.outputs["num_detections"], self.feed)[0])
            if found == want:
                return found
        if not found:
            self.set_bias(base)
            raise RuntimeError(f"the model keeps only {len(levels)} candidates")
        return found


def _tie_candidates(logits: np.ndarray, boxes: np.ndarray,
                    ranked: list[tuple]) -> list[tuple]:
    """(logit gap, kept, other, class, IoU) for each kept detection and another anchor of
    its cell that NMS suppressed for it alone (no better kept box of the class overlaps
    it): raised to a tie, which of the two is kept is a rounding decision. Smallest gap
    first: the smaller the raise, the fewer candidates elsewhere it lifts."""
    k = len(ANCHORS)
    found = []
    for rank, (logit, index, cls) in enumerate(ranked):
        better = [i for _, i, c in ranked[:rank] if c == cls]
        cell, anchor = divmod(index, k)
        for other_anchor in range(k):
            other = cell * k + other_anchor
            gap = logit - float(logits[other, cls + 1])
            if other_anchor == anchor or gap < 0:
                continue
            iou = float(_iou(boxes[index], boxes[other][None])[0])
            if iou < IOU_THRESHOLD + 0.01:  # whichever NMS keeps suppresses the other
                continue
            if better and np.any(_iou(boxes[other], boxes[better]) > IOU_THRESHOLD):
                continue
            found.append((gap, index, other, cls, iou))
    return sorted(found)


def _correlate_anchors(sess, g: Graph, spread: float = 0.25) -> None:
    """Makes the anchors of a cell score alike, as trained heads do (neighbouring anchors
    see the same object): each anchor's class kernel becomes the mean over anchors plus
    ``spread`` times its own deviation."""
    kernel = sess.run(g.class_weights)
    shape = kernel.shape
    per_anchor = kernel.reshape(shape[:3] + (len(ANCHORS), NUM_CLASSES + 1))
    mean = per_anchor.mean(axis=3, keepdims=True)
    mixed = mean + spread * (per_anchor - mean)
    g.class_weights.load(mixed.reshape(shape).astype(np.float32), sess)


def _pair_rank(ranked: list[tuple[int, int]], tie: NearTie) -> int | None:
    cls = tie.detection_class - 1
    places = [r for r, found in enumerate(ranked) if found in ((tie.kept, cls), (tie.other, cls))]
    return places[0] if places else None


def calibrate(sess, g: Graph, reference: np.ndarray, detections: int, near_ties: int,
              slack: int = 3) -> tuple[int, tuple[NearTie, ...]]:
    """Sets the class biases: ``near_ties`` ties among the best detections, then the
    threshold so that ``detections`` (up to ``slack`` more, to keep a tie in) pass on the
    ``reference`` frame [1, height, width, 3]. Returns the count and the ties."""
    _correlate_anchors(sess, g)
    calibrator = _Calibrator(sess, g, reference)
    original = calibrator.bias.copy()
    ties: list[NearTie] = []
    count = detections
    logits, boxes = calibrator.run()
    k = len(ANCHORS)
    for _, index, other, cls, iou in _tie_candidates(
            logits, boxes, _ranked(logits, boxes)[:detections + slack])[:16]:
        if len(ties) == near_ties:
            break
        channels = {(t.other % k, t.detection_class) for t in ties} | \
            {(t.kept % k, t.detection_class) for t in ties}
        if (other % k, cls + 1) in channels or (index % k, cls + 1) in channels:
            continue  # one raise per channel, or the first tie would move
        saved = calibrator.bias.copy()
        tie = calibrator.make_tie(index, other, cls, iou)
        logits, boxes = calibrator.run()
        ranked = [(i, c) for _, i, c in _ranked(logits, boxes)]
        # Kept only if every tie stays among the detections (a raised bias lifts that
        # anchor's candidates everywhere); NMS keeps one of each pair.
        ranks = [_pair_rank(ranked, t) for t in ties + [tie]]
        if all(r is not None and r < detections + slack for r in ranks):
            ties.append(tie)
            count = max(detections, max(r for r in ranks if r is not None) + 1)
        else:
            calibrator.set_bias(saved)
    try:
        calibrator.set_count(count)
    except RuntimeError:
        calibrator.set_bias(original)
        raise
    out = sess.run(g.outputs, calibrator.feed)
    found = int(out["num_detections"][0])
    logits, _ = calibrator.run()
    ranked_ties = []
    scores = out["detection_scores"][0]
    classes = out["detection_classes"][0]
    for tie in ties:
        score = 1.0 / (1.0 + math.exp(-float(logits[tie.kept, tie.detection_class])))
        ranks = [r for r in range(found) if classes[r] == tie.detection_class
                 and abs(scores[r] - score) < 1e-6]
        gap = abs(float(logits[tie.kept, tie.detection_class])
                  - float(logits[tie.other, tie.detection_class]))
        ranked_ties.append(NearTie(ranks[0] if ranks else -1, tie.detection_class,
                                   tie.kept, tie.other, tie.iou, gap))
    return found, tuple(ranked_ties)
