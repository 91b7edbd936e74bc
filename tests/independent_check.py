"""Compares a published model with its original using plain TensorFlow only.

``optimize()`` raises when its own parity gate fails, so its report cannot be the
evidence that its output is right. This module is: it loads the published model as TF
Serving does (the TF1 session loader, ``serve`` tag), the original by the loader its
kind needs (the session loader, ``tf.saved_model.load`` for a TF2 object graph,
``import_graph_def`` for a frozen ``.pb``), runs both on inputs the test built, and
compares every output of every signature of the original under an explicit tolerance.
It imports nothing of serving_opt (tests/test_independent_check.py holds it to that), so
a bug shared by the optimizer and its parity gate cannot hide here.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

SERVE = "serve"
INIT_OP_KEY = "__saved_model_init_op"


def _meta_graph(saved_model_dir: str):
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return next(mg for mg in saved_model.meta_graphs if SERVE in mg.meta_info_def.tags)


def signature_keys(saved_model_dir: str) -> list[str]:
    return sorted(k for k in _meta_graph(saved_model_dir).signature_def if k != INIT_OP_KEY)


def is_object_graph(saved_model_dir: str) -> bool:
    """Written by tf.saved_model.save / Keras export, which tf.saved_model.load restores."""
    return len(_meta_graph(saved_model_dir).object_graph_def.nodes) > 0


def run_session(saved_model_dir: str, feeds: dict) -> dict:
    """{signature key: {input alias: array}} -> {key: {output alias: array}}, run in a
    fresh graph and session as TF Serving's session loader runs a SavedModel."""
    v1 = tf.compat.v1
    out = {}
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        meta_graph = v1.saved_model.loader.load(sess, [SERVE], saved_model_dir)
        for key, feed in feeds.items():
            signature = meta_graph.signature_def[key]
            out[key] = sess.run({a: t.name for a, t in signature.outputs.items()},
                                {signature.inputs[a].name: v for a, v in feed.items()})
    return out


def run_object_graph(saved_model_dir: str, feeds: dict) -> dict:
    """As run_session, through TF2's object-graph loader and its concrete functions."""
    loaded = tf.saved_model.load(saved_model_dir)
    return {key: {a: t.numpy() for a, t in loaded.signatures[key](
        **{k: tf.constant(v) for k, v in feed.items()}).items()}
        for key, feed in feeds.items()}


def run_graph_def(pb_path: str, feed: dict, fetches) -> dict:
    """A frozen GraphDef imported into a fresh graph: {tensor name: array} in, fetches out."""
    v1 = tf.compat.v1
    graph_def = v1.GraphDef()
    with open(pb_path, "rb") as f:
        graph_def.ParseFromString(f.read())
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        tf.import_graph_def(graph_def, name="")
        return sess.run(fetches, feed)


def assert_same(actual: dict, expected: dict, *, rtol: float, atol: float,
                where: str = "") -> None:
    """Same output aliases, shapes and dtypes; floats allclose, everything else equal.
    An output with no elements fails: it would prove nothing."""
    assert sorted(actual) == sorted(expected), f"{where}: outputs {sorted(actual)} " \
        f"!= the original's {sorted(expected)}"
    for alias, want in expected.items():
        got = np.asarray(actual[alias])
        want = np.asarray(want)
        label = f"{where}.{alias}"
        assert want.size > 0, f"{label}: the original answered no values; choose inputs " \
            "that exercise it"
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{label}: {got.dtype}{list(got.shape)} != the original's " \
            f"{want.dtype}{list(want.shape)}"
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=label)
        else:
            np.testing.assert_array_equal(got, want, err_msg=label)


def assert_outputs_match(published_dir: str, original_dir: str, feeds: dict, *,
                         rtol: float, atol: float) -> dict:
    """Every signature of the original, run on ``feeds`` (one batch per signature key,
    which must cover them all), answers the same from the published model, which is
    loaded as TF Serving loads it. Returns the original's outputs."""
    keys = signature_keys(original_dir)
    assert sorted(feeds) == keys, f"feeds for {sorted(feeds)}, the original has {keys}"
    original_runner = run_object_graph if is_object_graph(original_dir) else run_session
    expected = original_runner(original_dir, feeds)
    actual = run_session(published_dir, feeds)
    for key in keys:
        assert_same(actual[key], expected[key], rtol=rtol, atol=atol, where=key)
    return expected


def example_feeds(saved_model_dir: str, serialized) -> dict:
    """The same serialized tf.Examples for every signature, each of which takes them as
    its one input (an Estimator export's classify, regress and predict signatures)."""
    feeds = {}
    for key in signature_keys(saved_model_dir):
        (alias,) = _meta_graph(saved_model_dir).signature_def[key].inputs
        feeds[key] = {alias: np.array(serialized, dtype=object)}
    return feeds


def example(**features) -> bytes:
    """A serialized tf.Example: str/bytes values as bytes_list, ints int64_list, floats
    float_list; a scalar or a list per feature."""
    feature = {}
    for name, value in features.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if all(isinstance(v, (str, bytes)) for v in values):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() if isinstance(v, str) else v for v in values]))
        elif all(isinstance(v, (int, np.integer)) for v in values):
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


# --- detection: NMS picks one of two near-tied boxes by rounding -------------------------

def _nms_op(graph):
    ops = [op for op in graph.get_operations() if op.type == "CombinedNonMaxSuppression"]
    assert len(ops) == 1, f"{len(ops)} CombinedNonMaxSuppression ops; the rule needs one"
    return ops[0]


def _nms_fetches(graph) -> dict:
    """The candidates NMS chooses among (boxes [b, n, q, 4], scores [b, n, classes]), and
    its IoU and score thresholds."""
    op = _nms_op(graph)
    return {"boxes": op.inputs[0], "scores": op.inputs[1], "iou_threshold": op.inputs[4],
            "score_threshold": op.inputs[5]}


def run_detector_graph_def(pb_path: str, input_name: str, images: np.ndarray,
                           outputs) -> dict:
    """The frozen .pb's named outputs and its NMS candidates for ``images``."""
    v1 = tf.compat.v1
    graph_def = v1.GraphDef()
    with open(pb_path, "rb") as f:
        graph_def.ParseFromString(f.read())
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        tf.import_graph_def(graph_def, name="")
        return sess.run({"outputs": {name: f"{name}:0" for name in outputs},
                         "nms": _nms_fetches(graph)}, {input_name: images})


def run_detector_saved_model(saved_model_dir: str, key: str, alias: str,
                             images: np.ndarray) -> dict:
    """The signature's outputs and the NMS candidates, loaded as TF Serving loads it."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        signature = v1.saved_model.loader.load(sess, [SERVE], saved_model_dir) \
            .signature_def[key]
        return sess.run({"outputs": {a: t.name for a, t in signature.outputs.items()},
                         "nms": _nms_fetches(graph)}, {signature.inputs[alias].name: images})


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box ``a`` with each of ``b`` (ymin, xmin, ymax, xmax; either corner order)."""
    def area(box):
        return np.abs(box[..., 2] - box[..., 0]) * np.abs(box[..., 3] - box[..., 1])
    lo = np.maximum(np.minimum(a[0:2], a[2:4]), np.minimum(b[:, 0:2], b[:, 2:4]))
    hi = np.minimum(np.maximum(a[0:2], a[2:4]), np.maximum(b[:, 0:2], b[:, 2:4]))
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def near_ties(nms: dict, image: int, score_atol: float) -> list[tuple[int, int, int]]:
    """(class column, candidate, candidate) pairs NMS may resolve either way: one class,
    both over the score threshold, overlapping over the IoU threshold, scores within
    ``score_atol``. Computed from one model's candidates, so the count is measured."""
    scores, boxes = nms["scores"][image], nms["boxes"][image]
    pairs = []
    for column in range(scores.shape[1]):
        column_boxes = boxes[:, 0 if boxes.shape[1] == 1 else column]
        live = np.flatnonzero(scores[:, column] > nms["score_threshold"])
        for n, i in enumerate(live):
            rest = live[n + 1:]
            close = rest[np.abs(scores[rest, column] - scores[i, column]) <= score_atol]
            if close.size:
                overlap = _iou(column_boxes[i], column_boxes[close]) > nms["iou_threshold"]
                pairs += [(column, int(i), int(j)) for j in close[overlap]]
    return pairs


def _unmatched(rows, others, score_atol, box_atol) -> list[int]:
    """Rows (class, score, box) of one side with no equal row on the other, paired greedily."""
    free = list(range(len(others)))
    missing = []
    for r, (cls, score, box) in enumerate(rows):
        hit = next((o for o in free if others[o][0] == cls
                    and abs(others[o][1] - score) <= score_atol
                    and np.max(np.abs(others[o][2] - box)) <= box_atol), None)
        if hit is None:
            missing.append(r)
        else:
            free.remove(hit)
    return missing


def assert_detections_match(published: dict, original: dict, *, score_atol: float,
                            box_atol: float, names=("detection_boxes", "detection_scores",
                                                    "detection_classes", "num_detections")
                            ) -> dict:
    """The rule for a detector, per image of the batch:

    * every NMS candidate (box and score) within the tolerances: the whole network up to
      NMS, independent of which boxes NMS then keeps;
    * the same number of detections, paired one to one (same class, score and box within
      the tolerances) in any order, except detections that the original's own candidates
      explain as a near-tie (``near_ties``): at most one unpaired detection per near-tie.

    Returns {"detections": total over the batch, "near_ties": pairs found, "flips":
    detections paired with none}, for the test to assert on.
    """
    for name in ("boxes", "scores"):
        np.testing.assert_allclose(published["nms"][name], original["nms"][name], rtol=0,
                                   atol=box_atol if name == "boxes" else score_atol,
                                   err_msg=f"NMS candidate {name}")
    boxes_name, scores_name, classes_name, count_name = names
    want, got = original["outputs"], published["outputs"]
    assert sorted(got) == sorted(want), f"outputs {sorted(got)} != {sorted(want)}"
    np.testing.assert_array_equal(got[count_name], want[count_name], err_msg=count_name)
    totals = {"detections": 0, "near_ties": 0, "flips": 0}
    for image, count in enumerate(want[count_name].astype(int)):
        rows = [[(side[classes_name][image, d], side[scores_name][image, d],
                  side[boxes_name][image, d]) for d in range(count)] for side in (want, got)]
        flips = _unmatched(rows[0], rows[1], score_atol, box_atol)
        assert len(_unmatched(rows[1], rows[0], score_atol, box_atol)) == len(flips)
        ties = near_ties(original["nms"], image, score_atol)
        tied_scores = {original["nms"]["scores"][image, i, c] for c, a, b in ties for i in (a, b)}
        for d in flips:
            score = rows[0][d][1]
            assert any(abs(score - s) <= score_atol for s in tied_scores), \
                f"image {image}: detection {d} (class {rows[0][d][0]}, score {score:.6f}) " \
                f"differs and is no near-tie of the original's candidates"
        assert len(flips) <= len(ties), f"image {image}: {len(flips)} detections differ, " \
            f"{len(ties)} near-ties explain at most as many"
        # Rows past the count are padding; they must be padding on both sides.
        for name in (boxes_name, scores_name, classes_name):
            np.testing.assert_array_equal(got[name][image, count:], want[name][image, count:],
                                          err_msg=f"{name} padding")
        totals["detections"] += count
        totals["near_ties"] += len(ties)
        totals["flips"] += len(flips)
    return totals
