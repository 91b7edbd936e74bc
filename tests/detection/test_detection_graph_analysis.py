"""Discontinuous-op analysis, the near-tie rule on real runs, and graph_diff, on the
OD-API-shaped sample (built once, in seconds) and small hand-built graphs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from serving_opt.detection import discontinuous, matching, network
from serving_opt.detection import sample as detection_sample
from serving_opt.savedmodel import frozen_graph, graph_diff, loader

OUTPUTS = list(network.OUTPUT_NODES)
ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def signature(detection_graph_def):
    graph = frozen_graph.to_serving_graph(detection_graph_def, outputs=OUTPUTS)
    return graph.signature_defs["serving_default"]


def _frames() -> np.ndarray:
    return np.concatenate([detection_sample.frame(seed=0), detection_sample.frame(seed=1)])


def _run_graph_def(graph_def, images, fetch: list[str]) -> dict:
    import tensorflow as tf

    with tf.Graph().as_default() as graph:
        tf.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run({t: t if ":" in t else f"{t}:0" for t in fetch},
                            {"image_tensor:0": images})


def _transform(graph_def, spec: str, downgrade: bool = False):
    """One pass of TF's Graph Transform Tool (the C++ tool TF 2.x still ships).

    ``downgrade``: FusedBatchNormV3 renamed FusedBatchNorm first, which the tool's
    fold_old_batch_norms needs (what serving_opt's transform stage does before it).
    """
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.util import _pywrap_transform_graph

    source = graph_pb2.GraphDef()
    source.CopyFrom(graph_def)
    if downgrade:
        for node in source.node:
            if node.op == "FusedBatchNormV3":
                node.op = "FusedBatchNorm"
                node.attr.pop("U", None)
    out = graph_pb2.GraphDef()
    out.ParseFromString(_pywrap_transform_graph.TransformGraphWithStringInputs(
        source.SerializeToString(), "image_tensor", ",".join(OUTPUTS), spec))
    return out


@pytest.fixture(scope="module")
def passes(detection_graph_def):
    """(spec, GraphDef after it), in the order a user runs them by hand."""
    steps = []
    current = detection_graph_def
    for spec, downgrade in (("fold_batch_norms", False), ("fold_old_batch_norms", False),
                            ("fold_constants(ignore_errors=true)", False),
                            ("fold_batch_norms", False), ("fold_old_batch_norms", True),
                            ("remove_nodes(op=CheckNumerics)", False)):
        current = _transform(current, spec, downgrade)
        steps.append((spec, current))
    return steps


# ------------------------------------------------------------------- discontinuous ops


def test_the_nms_path_and_its_feeds_are_found(detection_graph_def, signature):
    analysis = discontinuous.analyze(detection_graph_def, signature)
    assert analysis.discontinuous_keys() == tuple(sorted(OUTPUTS))
    assert analysis.continuous_keys() == ()
    (nms,) = analysis.ops
    assert nms.op == "CombinedNonMaxSuppression" and nms.kind == "nms" and not nms.after
    node = next(n for n in detection_graph_def.node if n.name == nms.name)
    # The boxes and scores inputs; not the sizes and thresholds (constants).
    assert analysis.feeding_tensors() == tuple(f"{i}:0" if ":" not in i else i
                                               for i in node.input[:2])
    assert analysis.detection == matching.OD_API_KEYS
    assert analysis.summary().startswith("4 of 4 outputs pass through "
                                         "CombinedNonMaxSuppression; fed by 2")


def test_small_graphs(tmp_path):
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 5], name="x")
        ids = v1.placeholder(tf.int32, [None], name="ids")
        weights = tf.constant(np.arange(25, dtype=np.float32).reshape(5, 5) / 25.0)
        logits = tf.matmul(x, weights, name="logits")
        probs = tf.nn.softmax(logits, name="probs")
        label = tf.argmax(logits, axis=1, name="label")
        # Top-k of something selected by the argmax: a discontinuous op behind another.
        picked = tf.gather(logits, label, axis=1, batch_dims=1, name="picked")
        top = tf.math.top_k(tf.concat([logits, picked[:, None]], 1), k=2).indices
        rounded = tf.cast(logits, tf.int32, name="rounded")  # float -> int: discontinuous
        widened = tf.cast(ids, tf.float32, name="widened")  # int -> float: exact
        same = tf.equal(ids, 3, name="same")  # an integer comparison: exact
        signature = v1.saved_model.signature_def_utils.predict_signature_def(
            {"x": x, "ids": ids},
            {"probs": probs, "label": label, "top": top, "rounded": rounded,
             "widened": widened, "same": same})
    graph_def = graph.as_graph_def()
    analysis = discontinuous.analyze(graph_def, signature)
    assert analysis.continuous_keys() == ("probs", "same", "widened")
    assert set(analysis.discontinuous_keys()) == {"label", "top", "rounded"}
    ops = {o.op: o for o in analysis.ops}
    assert set(ops) == {"ArgMax", "TopKV2", "Cast"}
    assert ops["ArgMax"].feeds == ("logits:0",) and not ops["ArgMax"].after
    assert ops["TopKV2"].after == (ops["ArgMax"].name,)
    # Only the ops fed by continuous tensors give the tensors to compare.
    assert analysis.feeding_tensors() == ("logits:0",)
    assert analysis.detection is None


def _per_image_nms(v2_control_flow: bool):
    """An NMS per image inside a while loop, as the OD API's TF1 postprocessor has it."""
    import tensorflow as tf

    v1 = tf.compat.v1
    if not v2_control_flow:
        v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as graph:
            boxes = v1.placeholder(tf.float32, [None, 8, 4], name="boxes")
            scores = v1.placeholder(tf.float32, [None, 8], name="scores")

            def body(i, out):
                keep = tf.image.non_max_suppression(boxes[i], scores[i], 3, 0.5)
                kept = tf.pad(tf.gather(scores[i], keep), [[0, 3 - tf.size(keep)]])
                return i + 1, out.write(i, kept)

            _, out = tf.while_loop(lambda i, _: i < tf.shape(boxes)[0], body,
                                   [0, tf.TensorArray(tf.float32, size=tf.shape(boxes)[0])])
            kept_scores = tf.identity(out.stack(), name="kept_scores")
            mean = tf.reduce_mean(scores, axis=1, name="mean")
            signature = v1.saved_model.signature_def_utils.predict_signature_def(
                {"boxes": boxes, "scores": scores},
                {"kept_scores": kept_scores, "mean": mean})
    finally:
        v1.enable_control_flow_v2()
    return graph.as_graph_def(), signature


def test_an_nms_inside_a_tf1_while_loop():
    graph_def, signature = _per_image_nms(v2_control_flow=False)
    assert any(n.op == "NextIteration" for n in graph_def.node)  # a cycle
    analysis = discontinuous.analyze(graph_def, signature)
    assert analysis.discontinuous_keys() == ("kept_scores",)
    assert analysis.continuous_keys() == ("mean",)
    (nms,) = analysis.ops
    assert nms.op == "NonMaxSuppressionV3" and not nms.function
    # Its inputs are inside the loop's frame (not fetchable): the tensors entering the
    # loop stand for them.
    assert nms.feeds == ("boxes:0", "scores:0") and not analysis.unfetchable()


def test_an_nms_inside_a_function_has_no_fetchable_feeds():
    graph_def, signature = _per_image_nms(v2_control_flow=True)
    analysis = discontinuous.analyze(graph_def, signature)
    assert analysis.discontinuous_keys() == ("kept_scores",)
    (loop,) = analysis.ops
    assert loop.op.endswith(":NonMaxSuppressionV3") and loop.function
    assert loop.feeds == () and analysis.unfetchable() == (loop,)


def test_a_detection_signature_needs_an_nms(detection_graph_def, signature):
    from tensorflow.core.protobuf import meta_graph_pb2

    renamed = meta_graph_pb2.SignatureDef(method_name=signature.method_name)
    renamed.inputs["images"].CopyFrom(signature.inputs["inputs"])
    for key, info in signature.outputs.items():
        renamed.outputs[f"out_{key.split('_')[-1]}"].CopyFrom(info)
    analysis = discontinuous.analyze(detection_graph_def, renamed)
    # Roles come from the key names; "out_detections" names no count.
    assert analysis.detection == matching.DetectionKeys(
        "out_boxes", "out_scores", "out_classes", None)
    # Boxes that do not come out of an NMS: not a detection model.
    plain = meta_graph_pb2.SignatureDef()
    plain.CopyFrom(signature)
    plain.outputs["detection_boxes"].name = "Postprocessor/ExpandDims:0"
    assert discontinuous.analyze(detection_graph_def, plain).detection is None


def test_folding_moves_nothing_the_near_tie_rule_does_not_excuse(detection_graph_def, signature,
                                                                  passes):
    """The lossless case: the frozen graph against the one the passes folded."""
    folded = passes[-1][1]
    before = discontinuous.analyze(detection_graph_def, signature)
    after = discontinuous.analyze(folded, signature)
    pairs = discontinuous.pair_feeds(before, after)
    assert len(pairs) == 2
    images = _frames()
    ref = _run_graph_def(detection_graph_def, images, OUTPUTS + [p[0] for p in pairs])
    out = _run_graph_def(folded, images, OUTPUTS + [p[1] for p in pairs])
    match = matching.match_detections({k: ref[k] for k in OUTPUTS},
                                      {k: out[k] for k in OUTPUTS})
    verdict = matching.near_tie_verdict(
        match.changed_images(), {a: ref[a] for a, _ in pairs},
        {a: out[b] for a, b in pairs}, ATOL, RTOL)
    assert verdict.accepted, (match.summary(), verdict.summary())
    assert match.reference > 9


def test_the_variables_kept_model_against_the_frozen_one(detection_model, detection_graph_def,
                                                          signature):
    """What the issue's freeze gate saw: the SavedModel (variables) and the frozen graph
    may resolve a near-tie differently; the detections still match or are excused."""
    analysis = discontinuous.analyze(detection_graph_def, signature)
    feeds = list(analysis.feeding_tensors())
    images = _frames()
    sess, meta_graph = loader.load_session(detection_model.saved_model_dir)
    try:
        served = meta_graph.signature_def["serving_default"]
        assert served.inputs["inputs"].name == "image_tensor:0"
        fetch = {k: served.outputs[k].name for k in OUTPUTS}
        fetch.update({t: t for t in feeds})  # the same node names in both graphs
        ref = sess.run(fetch, {"image_tensor:0": images})
    finally:
        sess.close()
    out = _run_graph_def(detection_graph_def, images, OUTPUTS + feeds)
    match = matching.match_detections({k: ref[k] for k in OUTPUTS},
                                      {k: out[k] for k in OUTPUTS})
    verdict = matching.near_tie_verdict(match.changed_images(), {t: ref[t] for t in feeds},
                                        {t: out[t] for t in feeds}, ATOL, RTOL)
    assert verdict.accepted, (match.summary(), verdict.summary())
    for tensor in feeds:  # the elementwise part of the gate passes too
        assert matching.rows_within_tolerance(ref[tensor], out[tensor], 2, ATOL, RTOL)[0].all()


def test_a_corrupted_weight_fails(detection_graph_def, signature):
    from tensorflow.python.framework import tensor_util

    from serving_opt.savedmodel.graph import node_name

    analysis = discontinuous.analyze(detection_graph_def, signature)
    feeds = list(analysis.feeding_tensors())
    corrupted = type(detection_graph_def)()
    corrupted.CopyFrom(detection_graph_def)
    node = next(n for n in corrupted.node if n.name == "FeatureExtractor/Conv2d_3/weights")
    weights = tensor_util.MakeNdarray(node.attr["value"].tensor).copy()
    weights[0, 0, 0, :] *= 1.05  # one input channel's taps of one position, 5% off
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(weights))
    images = _frames()
    ref = _run_graph_def(detection_graph_def, images, OUTPUTS + feeds)
    out = _run_graph_def(corrupted, images, OUTPUTS + feeds)
    match = matching.match_detections({k: ref[k] for k in OUTPUTS},
                                      {k: out[k] for k in OUTPUTS})
    assert not match.agrees
    verdict = matching.near_tie_verdict(match.changed_images(), {t: ref[t] for t in feeds},
                                        {t: out[t] for t in feeds}, ATOL, RTOL)
    assert not verdict.accepted
    assert node_name(verdict.tensors[0].name) in {node_name(f) for f in feeds}
    assert "are not near-ties" in verdict.summary()


# -------------------------------------------------------------------------- graph_diff


def test_the_sample_has_what_the_passes_fold(detection_graph_def):
    patterns = graph_diff.find_patterns(detection_graph_def)
    assert patterns.fused_batch_norms == {"FusedBatchNormV3": 2}
    assert patterns.fused_after_weights == {"Conv2D": 2}
    assert patterns.unfused_batch_norms == {"Conv2D": 3}
    assert patterns.unfused_with_rsqrt == 3
    assert patterns.check_numerics == ("box encodings",)
    assert patterns.foldable > 0


def test_each_pass_says_what_it_did(detection_graph_def, passes):
    diffs = graph_diff.diff_passes(passes, detection_graph_def)
    lines = graph_diff.report_lines(diffs)
    assert [d.name for d in diffs] == [spec for spec, _ in passes]
    # Before fold_constants, neither fold finds constants to fold: say why.
    assert lines[0] == ("fold_batch_norms: no change; 3 unfused batch norms after Conv2D "
                        "left (their scale is still computed, not a constant: fold_constants "
                        "first)")
    assert lines[1].startswith("fold_old_batch_norms: no change; 2 FusedBatchNormV3 after "
                               "Conv2D left")
    assert "the constant part (Rsqrt) of 3 batch norms computed once" in lines[2]
    assert "constant ops folded" in lines[2]
    assert dict(diffs[2].removed)["Rsqrt"] == 3
    assert lines[3].startswith("fold_batch_norms: 3 unfused batch norms (Mul/Add after "
                               "Conv2D) folded into Conv2D (")
    assert dict(diffs[3].removed)["Mul"] == 3
    assert lines[4].startswith("fold_old_batch_norms: 2 FusedBatchNormV3 folded into Conv2D")
    assert dict(diffs[4].added)["BiasAdd"] == 2
    assert lines[5].startswith("remove_nodes(op=CheckNumerics): 1 CheckNumerics removed")
    assert diffs[5].notes == ("NaN and Inf no longer raise an error where CheckNumerics "
                              "stood ('box encodings'): they flow into the outputs",)
    # Nothing of a batch norm is left in the folded graph.
    folded = graph_diff.find_patterns(passes[-1][1])
    assert not folded.fused_batch_norms and not folded.unfused_batch_norms
    assert not folded.check_numerics
    assert graph_diff.op_histogram(passes[-1][1])["Rsqrt"] == 0


def test_a_chain_folded_with_its_constants_in_one_pass(detection_graph_def):
    """fold_constants then fold_batch_norms in one call: the chain is named as such."""
    after = _transform(detection_graph_def, "fold_constants(ignore_errors=true) fold_batch_norms")
    diff = graph_diff.diff_pass("fold_constants fold_batch_norms", detection_graph_def, after)
    assert "3 Rsqrt/Mul/Sub/Add batch norm chains folded into Conv2D" in diff.changes
    assert not diff.notes


def test_an_unchanged_graph():
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="x", op="Placeholder")
    diff = graph_diff.diff_pass("strip_unused_nodes", graph_def, graph_def)
    assert not diff.changed and diff.line() == "strip_unused_nodes: no change"


def test_sample_cli_reuses_an_existing_sample(detection_model, capsys):
    assert detection_sample.main(
        ["--output_dir", detection_model.output_dir, "--time_images=1"]) == 0
    out = capsys.readouterr().out
    assert "already holds a detection sample" in out
    assert "s per 480x640 image" in out
    assert os.path.isfile(detection_model.frozen_graph)


def test_removing_identities_is_not_called_folding(detection_graph_def):
    """An Identity on a constant computes nothing: removing it is not a fold."""
    identities = graph_diff.op_histogram(detection_graph_def)["Identity"]
    assert identities > 0
    after = _transform(detection_graph_def, "remove_nodes(op=Identity)")
    diff = graph_diff.diff_pass("remove_nodes(op=Identity)", detection_graph_def, after)
    removed = dict(diff.removed)["Identity"]
    assert f"{removed} Identities removed" in diff.changes
    assert not any("folded" in change for change in diff.changes), diff.changes
