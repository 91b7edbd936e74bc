"""The parity gate on outputs behind NMS and ArgMax (serving_opt.detection.parity_rule), through
stages.parity.check_parity on real SavedModels.

The models are built so that a near-tie is decided by the last bits: an original and a
candidate that differ by a bias of 1e-6 on one anchor (what folding's rounding does)
pick different boxes in NMS and different argmax classes, while the scores feeding
those ops agree within the tolerance. A candidate with a real defect (a bias of 0.05)
moves the same answers and the feeding scores with them, and must fail.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from serving_opt.core.gates import LossyGate
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.stages.parity import ParityInputs, check_parity
from tests.saved_model_io import save_tf1, serving_default

v1 = tf.compat.v1
TAGS = frozenset({"serve"})
# Anchors 0 and 1 overlap (IoU 0.9): NMS keeps only the higher scored one. Anchor 2 is
# apart and always kept.
ANCHORS = np.array([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.9], [0.0, 2.0, 1.0, 3.0]],
                   np.float32)
# Row 0: anchor 0 ahead of anchor 1 by 5e-7 (a near-tie). Row 1: no tie (anchor 0 far
# ahead), so only a real defect can change its answer.
LOGITS = [[0.5, 0.5 - 5e-7, 0.2], [2.0, -1.0, 0.3]]
TIE_BREAKER = 1e-6  # the candidate's extra bias on anchor 1: flips row 0 only
DEFECT = 0.05


def _detector(export_dir: str, bias_on_anchor_1: float) -> str:
    """logits [batch, 3] -> sigmoid scores -> CombinedNonMaxSuppression, OD API names."""
    with tf.Graph().as_default() as graph:
        logits = v1.placeholder(tf.float32, [None, 3], name="logits")
        bias = tf.constant([0.0, bias_on_anchor_1, 0.0], tf.float32)
        scores = tf.sigmoid(logits + bias, name="scores")
        batch = tf.shape(logits)[0]
        boxes = tf.tile(tf.constant(ANCHORS)[None, :, None, :], tf.stack([batch, 1, 1, 1]))
        nms = tf.image.combined_non_max_suppression(
            boxes, scores[:, :, None], max_output_size_per_class=3, max_total_size=3,
            iou_threshold=0.5, score_threshold=0.1, clip_boxes=False)
        outputs = {"detection_boxes": tf.identity(nms.nmsed_boxes, "detection_boxes"),
                   "detection_scores": tf.identity(nms.nmsed_scores, "detection_scores"),
                   "detection_classes": tf.identity(nms.nmsed_classes, "detection_classes"),
                   "num_detections": tf.identity(tf.cast(nms.valid_detections, tf.float32),
                                                 "num_detections")}
        return save_tf1(graph, export_dir, serving_default({"logits": logits}, outputs))


def _looped_detector(export_dir: str, bias_on_anchor_1: float) -> str:
    """The same detector with the OD API's TF1 postprocessing: one NMS per image inside a
    while loop, whose inputs cannot be fetched from outside the loop."""
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as graph:
            logits = v1.placeholder(tf.float32, [None, 3], name="logits")
            scores = tf.sigmoid(logits + tf.constant([0.0, bias_on_anchor_1, 0.0]),
                                name="scores")
            anchors = tf.constant(ANCHORS)

            def body(i, boxes_out, scores_out, counts_out):
                keep = tf.image.non_max_suppression(anchors, scores[i], 3, 0.5,
                                                    score_threshold=0.1)
                pad = [[0, 3 - tf.size(keep)]]
                kept_boxes = tf.pad(tf.gather(anchors, keep), pad + [[0, 0]])
                kept_scores = tf.pad(tf.gather(scores[i], keep), pad)
                return (i + 1, boxes_out.write(i, kept_boxes), scores_out.write(i, kept_scores),
                        counts_out.write(i, tf.cast(tf.size(keep), tf.float32)))

            n = tf.shape(logits)[0]
            _, boxes, kept, counts = tf.while_loop(
                lambda i, *_: i < n, body,
                [0, tf.TensorArray(tf.float32, size=n), tf.TensorArray(tf.float32, size=n),
                 tf.TensorArray(tf.float32, size=n)])
            kept_scores = tf.identity(kept.stack(), "detection_scores")
            outputs = {"detection_boxes": tf.identity(boxes.stack(), "detection_boxes"),
                       "detection_scores": kept_scores,
                       "detection_classes": tf.zeros_like(kept_scores, name="classes"),
                       "num_detections": tf.identity(counts.stack(), "num_detections")}
            return save_tf1(graph, export_dir, serving_default({"logits": logits}, outputs))
    finally:
        v1.enable_control_flow_v2()


def _classifier(export_dir: str, bias_on_class_1: float) -> str:
    """logits [batch, 3] -> probabilities and ArgMax class ids."""
    with tf.Graph().as_default() as graph:
        logits = v1.placeholder(tf.float32, [None, 3], name="logits")
        shifted = logits + tf.constant([0.0, bias_on_class_1, 0.0], tf.float32)
        outputs = {"probabilities": tf.nn.softmax(shifted, name="probabilities"),
                   "class_ids": tf.argmax(shifted, axis=1, name="class_ids")}
        return save_tf1(graph, export_dir, serving_default({"logits": logits}, outputs))


@pytest.fixture(scope="module")
def logits_examples(tmp_path_factory):
    path = tmp_path_factory.mktemp("examples") / "logits.jsonl"
    path.write_text("".join(json.dumps({"logits": [row]}) + "\n" for row in LOGITS))
    return examples_lib.read_examples_file(str(path))


@pytest.fixture(scope="module")
def detectors(tmp_path_factory):
    base = tmp_path_factory.mktemp("detectors")
    return {name: _detector(str(base / name), bias) for name, bias in
            (("original", 0.0), ("rounded", TIE_BREAKER), ("defect", DEFECT))}


@pytest.fixture(scope="module")
def looped_detectors(tmp_path_factory):
    base = tmp_path_factory.mktemp("looped")
    return {name: _looped_detector(str(base / name), bias) for name, bias in
            (("original", 0.0), ("rounded", TIE_BREAKER), ("defect", DEFECT))}


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory):
    base = tmp_path_factory.mktemp("classifiers")
    return {name: _classifier(str(base / name), bias) for name, bias in
            (("original", 0.0), ("rounded", TIE_BREAKER), ("defect", 1.6))}


def _parity(models, candidate, examples, **kwargs):
    return check_parity(models["original"], models[candidate], TAGS, ["serving_default"],
                        inputs=ParityInputs(user_inputs=examples, batch_size=1), **kwargs)


def _rows(report):
    return {o.output: o for o in report.outputs}


def test_a_near_tie_decided_the_other_way_passes_and_says_what_moved(detectors,
                                                                      logits_examples):
    report = _parity(detectors, "rounded", logits_examples)
    rows = _rows(report)
    # Elementwise, the boxes differ: the other anchor of the overlapping pair was kept.
    assert rows["detection_boxes"].mismatches > 0
    assert report.ok, report.summary()
    detail = rows["detection_boxes"].detail
    assert "replaced by an overlapping box of its class" in detail
    assert "accepted as a near-tie" in detail
    assert rows["detection_scores"].detail == "judged as detections with detection_boxes"


def test_a_defect_that_moves_the_feeding_scores_fails(detectors, logits_examples):
    report = _parity(detectors, "defect", logits_examples)
    assert not report.ok
    assert "are not near-ties" in _rows(report)["detection_boxes"].detail
    assert "detection_boxes" in report.summary()


def test_identical_detections_need_no_excuse(detectors, logits_examples):
    report = _parity(detectors, "original", logits_examples)
    assert report.ok
    assert all(o.mismatches == 0 and o.detail == "" for o in report.outputs)


def test_the_lossy_gate_judges_detections_by_agreement(detectors, logits_examples):
    rows = _rows(_parity(detectors, "rounded", logits_examples, lossy=LossyGate()))
    # Every detection has a same-class box at IoU >= 0.5 (the kept anchor overlaps 0.9).
    assert rows["detection_boxes"].agreement == 1.0
    assert rows["detection_boxes"].ok
    assert rows["detection_boxes"].detail.startswith("detection agreement 1.0000")


def test_the_lossy_gate_fails_a_detection_lost(detectors, logits_examples, tmp_path):
    # A batch where the defect pushes a kept box under the score threshold: lost.
    path = tmp_path / "low.jsonl"
    path.write_text(json.dumps({"logits": [[-2.15, -9.0, -9.0]]}) + "\n")
    low = examples_lib.read_examples_file(str(path))
    assert 1 / (1 + np.exp(2.15)) > 0.1  # the original keeps one detection
    # A candidate whose every logit is 0.1 lower: the one detection drops below 0.1.
    with tf.Graph().as_default() as graph:
        logits = v1.placeholder(tf.float32, [None, 3], name="logits")
        scores = tf.sigmoid(logits - 0.1, name="scores")
        batch = tf.shape(logits)[0]
        boxes = tf.tile(tf.constant(ANCHORS)[None, :, None, :], tf.stack([batch, 1, 1, 1]))
        nms = tf.image.combined_non_max_suppression(
            boxes, scores[:, :, None], 3, 3, iou_threshold=0.5, score_threshold=0.1)
        outputs = {"detection_boxes": tf.identity(nms.nmsed_boxes),
                   "detection_scores": tf.identity(nms.nmsed_scores),
                   "detection_classes": tf.identity(nms.nmsed_classes),
                   "num_detections": tf.cast(nms.valid_detections, tf.float32)}
        weaker = save_tf1(graph, str(tmp_path / "weaker"),
                          serving_default({"logits": logits}, outputs))
    report = check_parity(detectors["original"], weaker, TAGS, ["serving_default"],
                          inputs=ParityInputs(user_inputs=low, batch_size=1), lossy=LossyGate())
    assert not report.ok
    assert "detection agreement 0.0000" in _rows(report)["detection_boxes"].detail


def test_an_argmax_near_tie_passes(classifiers, logits_examples):
    report = _parity(classifiers, "rounded", logits_examples)
    rows = _rows(report)
    assert rows["class_ids"].mismatches == 1  # row 0 flipped from class 0 to class 1
    assert report.ok, report.summary()
    assert rows["class_ids"].detail.startswith("1 of 2 rows changed, accepted as a near-tie")


def test_an_argmax_changed_by_a_defect_fails(classifiers, logits_examples):
    report = _parity(classifiers, "defect", logits_examples)
    rows = _rows(report)
    assert not rows["class_ids"].ok
    assert "not near-ties" in rows["class_ids"].detail
    assert not rows["probabilities"].ok  # the continuous output fails elementwise too


def test_an_nms_inside_a_tf1_while_loop_is_judged_on_the_tensors_entering_it(
        looped_detectors, logits_examples):
    report = _parity(looped_detectors, "rounded", logits_examples)
    rows = _rows(report)
    assert rows["detection_boxes"].mismatches > 0  # the other anchor was kept
    assert report.ok, report.summary()
    assert "accepted as a near-tie" in rows["detection_boxes"].detail


def test_a_defect_before_a_looped_nms_fails(looped_detectors, logits_examples):
    report = _parity(looped_detectors, "defect", logits_examples)
    assert not report.ok
    assert "are not near-ties" in _rows(report)["detection_boxes"].detail
