"""Matching two runs' detections, top-k sets and argmax answers, and the near-tie rule,
on hand-made outputs (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest

from serving_opt.detection import matching
from serving_opt.detection.matching import (
    DetectionKeys,
    argmax_changes,
    iou_matrix,
    match_detections,
    near_tie_verdict,
    rows_within_tolerance,
    topk_agreement,
)

BOXES = [[0.1, 0.1, 0.3, 0.3], [0.5, 0.5, 0.9, 0.8], [0.2, 0.6, 0.4, 0.9]]
SCORES = [0.9, 0.8, 0.7]
CLASSES = [1.0, 2.0, 1.0]


def outputs(boxes=BOXES, scores=SCORES, classes=CLASSES, slots: int = 5) -> dict:
    """One image of OD-API outputs, padded to ``slots`` like the exporter pads to 100."""
    n = len(scores)
    b = np.zeros((1, slots, 4), np.float32)
    s = np.zeros((1, slots), np.float32)
    c = np.zeros((1, slots), np.float32)
    b[0, :n] = boxes
    s[0, :n] = scores
    c[0, :n] = classes
    return {"detection_boxes": b, "detection_scores": s, "detection_classes": c,
            "num_detections": np.array([n], np.float32)}


def stack(*images: dict) -> dict:
    return {k: np.concatenate([i[k] for i in images]) for k in images[0]}


def test_iou_matrix():
    a = np.array([[0, 0, 1, 1], [0, 0, 0, 0]], np.float32)
    b = np.array([[0, 0, 1, 0.5], [2, 2, 3, 3], [0, 0, 1, 1]], np.float32)
    np.testing.assert_allclose(iou_matrix(a, b), [[0.5, 0, 1], [0, 0, 0]])
    assert iou_matrix(np.zeros((0, 4)), b).shape == (0, 3)


def test_identical_runs_match_and_nothing_moves():
    m = match_detections(outputs(), outputs())
    assert (m.matched, m.moved, m.missing, m.extra, m.replaced) == (3, 0, 0, 0, 0)
    assert m.agrees and m.images[0].identical
    assert m.summary() == "3 of 3 detections matched (IoU >= 0.99), none moved"


def test_order_does_not_matter():
    swapped = outputs([BOXES[2], BOXES[0], BOXES[1]], [SCORES[2], SCORES[0], SCORES[1]],
                      [CLASSES[2], CLASSES[0], CLASSES[1]])
    m = match_detections(outputs(), swapped)
    assert m.agrees and m.moved == 0


def test_a_small_shift_is_a_moved_match_with_its_size():
    boxes = np.array(BOXES)
    boxes[1, 3] += 0.001  # IoU ~0.997
    m = match_detections(outputs(), outputs(boxes))
    assert (m.matched, m.moved) == (3, 1)
    assert m.max_box_shift == pytest.approx(0.001, abs=1e-6)
    assert m.agrees and not m.images[0].identical
    assert m.summary().startswith("3 of 3 detections matched (IoU >= 0.99), 1 moved by at "
                                  "most 0.001")


def test_a_larger_shift_is_not_a_match_at_the_lossless_threshold():
    boxes = np.array(BOXES)
    boxes[1, 3] += 0.05  # IoU ~0.86
    m = match_detections(outputs(), outputs(boxes))
    assert m.matched == 2 and m.replaced == 1 and not m.agrees
    assert m.images[0].min_replaced_iou == pytest.approx(0.857, abs=0.01)
    # The same pair matches at a lossy threshold.
    assert match_detections(outputs(), outputs(boxes), iou_threshold=0.5).agrees


def test_score_tolerance():
    inside = match_detections(outputs(), outputs(scores=[0.9, 0.80004, 0.7]))
    assert inside.agrees and inside.moved == 1 and inside.score_outside == 0
    outside = match_detections(outputs(), outputs(scores=[0.9, 0.81, 0.7]))
    assert outside.matched == 3 and outside.score_outside == 1 and not outside.agrees
    assert outside.max_score_diff == pytest.approx(0.01, abs=1e-6)
    assert "1 with a score off by more than" in outside.summary()


def test_a_changed_class_is_missing_and_extra():
    m = match_detections(outputs(), outputs(classes=[1.0, 3.0, 1.0]))
    assert (m.matched, m.missing, m.extra, m.replaced) == (2, 1, 1, 0)
    assert m.summary().endswith("1 missing, 1 extra; 1 of 1 images differ")


def test_fewer_and_more_detections():
    fewer = match_detections(outputs(), outputs(BOXES[:2], SCORES[:2], CLASSES[:2]))
    assert (fewer.matched, fewer.missing, fewer.extra) == (2, 1, 0)
    more = match_detections(outputs(BOXES[:2], SCORES[:2], CLASSES[:2]), outputs())
    assert (more.matched, more.missing, more.extra) == (2, 0, 1)


def test_padding_beyond_num_detections_is_ignored():
    a, b = outputs(), outputs()
    b["detection_boxes"][0, 4] = [0.3, 0.3, 0.6, 0.6]  # garbage in an unused slot
    b["detection_scores"][0, 4] = 0.5
    assert match_detections(a, b).agrees


def test_without_a_count_positive_scores_count():
    keys = DetectionKeys(num=None)
    a = {k: v for k, v in outputs().items() if k != "num_detections"}
    m = match_detections(a, a, keys=keys)
    assert m.reference == 3 and m.agrees


def test_images_are_matched_separately():
    changed = outputs(classes=[1.0, 2.0, 2.0])
    m = match_detections(stack(outputs(), outputs()), stack(outputs(), changed))
    assert m.changed_images().tolist() == [False, True]
    assert m.reference == 6 and m.matched == 5


def test_batch_sizes_must_agree():
    with pytest.raises(ValueError, match="same batch"):
        match_detections(stack(outputs(), outputs()), outputs())


def test_topk_agreement():
    t = topk_agreement([[3, 1, 2], [0, 1, 2]], [[3, 1, 2], [1, 0, 2]])
    assert (t.rows, t.k, t.same_set, t.same_order) == (2, 3, 2, 1)
    assert t.changed_rows().tolist() == [False, True]
    different = topk_agreement([[3, 1]], [[3, 4]])
    assert different.same_set == 0 and different.mean_overlap == 0.5
    assert t.summary() == "2 of 2 rows have the same top-3 set (1 in the same order)"


def test_argmax_changes():
    a = argmax_changes([[1, 2], [0, 0]], [[1, 2], [0, 1]])
    assert (a.answers, a.changed) == (4, 1)
    assert a.changed_rows().tolist() == [False, True]
    assert a.summary() == "1 of 4 argmax answers changed"


def test_rows_within_tolerance():
    ref = np.zeros((3, 2), np.float32)
    cand = ref.copy()
    cand[1, 0] = 1e-6  # inside atol
    cand[2, 1] = 1e-3  # outside
    ok, agreement = rows_within_tolerance(ref, cand, 3, 1e-5, 1e-4)
    assert ok.tolist() == [True, True, False]
    assert agreement.outside == 1 and agreement.max_abs_diff == pytest.approx(1e-3)
    # No batch axis: the tensor decides for every row.
    ok, _ = rows_within_tolerance(np.ones(5), np.ones(5) * 1.1, 3, 1e-5, 1e-4)
    assert ok.tolist() == [False, False, False]
    # NaN equals NaN; a shape change fails everything.
    nan = np.array([[np.nan], [1.0]])
    assert rows_within_tolerance(nan, nan.copy(), 2, 0, 0)[0].tolist() == [True, True]
    assert not rows_within_tolerance(np.ones((2, 2)), np.ones((2, 3)), 2, 1, 1)[0].any()


def test_near_tie_accepted_only_where_the_feeding_tensors_agree():
    scores = np.linspace(0, 1, 12, dtype=np.float32).reshape(2, 6)
    boxes = np.ones((2, 6, 4), np.float32)
    ref = {"scores": scores, "boxes": boxes}
    close = {"scores": scores + 1e-7, "boxes": boxes}
    verdict = near_tie_verdict([False, True], ref, close, 1e-5, 1e-4)
    assert verdict.accepted and (verdict.changed, verdict.excused) == (1, 1)
    assert verdict.summary().startswith("1 changed answer accepted as a near-tie: the "
                                        "tensors feeding the discontinuous op agree")

    far = {"scores": scores.copy(), "boxes": boxes}
    far["scores"][1, 3] += 0.05  # a real defect in row 1 only
    assert not near_tie_verdict([False, True], ref, far, 1e-5, 1e-4).accepted
    # The same defect in a row whose answer did not change is the elementwise check's
    # business, not this rule's.
    assert near_tie_verdict([True, False], ref, far, 1e-5, 1e-4).accepted
    verdict = near_tie_verdict([True, True], ref, far, 1e-5, 1e-4)
    assert verdict.unexcused == (1,) and verdict.tensors[0].name == "scores"
    assert "1 of 2 changed answers (rows 1) are not near-ties" in verdict.summary()
    assert "scores: 1 of 12 elements outside" in verdict.summary()
    assert near_tie_verdict([False, False], ref, far, 1e-5, 1e-4).summary() == \
        "no discrete answer changed"


def test_near_tie_needs_the_same_feeds_in_both_runs():
    with pytest.raises(ValueError, match="one run only"):
        near_tie_verdict([True], {"a": np.zeros(1)}, {"b": np.zeros(1)}, 1e-5, 1e-4)


def test_lossless_threshold_is_the_default():
    assert matching.LOSSLESS_IOU == 0.99
    assert match_detections(outputs(), outputs()).iou_threshold == 0.99
