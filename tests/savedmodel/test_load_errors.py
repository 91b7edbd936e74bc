"""A model that cannot load says why: the op this TensorFlow lacks, not TF's wrapper.

Real case (issue 29, item 6): an Estimator's boosted-trees model uses
``BoostedTreesBucketize``, which TF 2.16+ still registers but without a kernel; the
first session run (the checkpoint restore) fails, and TF's saver wraps the reason in
"Restoring from checkpoint failed ... Original error:", which was all the user saw.

The models are real SavedModels written with the TF1 Builder around a stand-in op
(``Bucketize``), whose node is then renamed in ``saved_model.pb``: TF itself cannot
build a session over a graph holding an op without a kernel.
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from serving_opt.errors import ServingOptError
from serving_opt.options import MeasureOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import loader

SERVE = frozenset({"serve"})
FAST = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def _build(path: str, *, variable: bool, op: str | None = None, name: str = "w") -> str:
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None], name="x")
        tf.constant([0.0, 1.0], name="boundaries")
        y = tf.cast(tf.raw_ops.Bucketize(input=x, boundaries=[0.0, 1.0], name="bucketize"),
                    tf.float32)
        if variable:
            y = y * v1.get_variable(name, initializer=2.0, use_resource=True)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": v1.saved_model.predict_signature_def({"x": x},
                                                                            {"y": y})})
            builder.save()
    if op is not None:
        pb = os.path.join(path, "saved_model.pb")
        saved_model = saved_model_pb2.SavedModel()
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
        for node in saved_model.meta_graphs[0].graph_def.node:
            if node.name == "bucketize":  # BoostedTreesBucketize(float_values, boundaries)
                node.op = op
                del node.input[:]
                node.input.extend(["x", "boundaries"])
                node.attr.clear()
                node.attr["num_features"].i = 1
        with open(pb, "wb") as f:
            f.write(saved_model.SerializeToString())
    return path


def test_restore_failing_on_an_op_without_kernel_names_the_op_and_runtime(tmp_path):
    model = _build(str(tmp_path / "1"), variable=True, op="BoostedTreesBucketize")
    with pytest.raises(ServingOptError) as caught:
        loader.load_session(model, SERVE)
    message = str(caught.value)
    assert "\n" not in message
    assert "BoostedTreesBucketize" in message
    assert f"TensorFlow {tf.__version__}" in message
    assert "Restoring from checkpoint failed" not in message
    assert "Original error" not in message
    assert caught.value.fix and "TF Serving" in caught.value.fix


def test_unregistered_op_names_the_op_and_runtime(tmp_path):
    model = _build(str(tmp_path / "1"), variable=True, op="SentencepieceEncodeSparse")
    with pytest.raises(ServingOptError) as caught:
        loader.load_session(model, SERVE)
    message = str(caught.value)
    assert "\n" not in message
    assert "op SentencepieceEncodeSparse" in message
    assert f"TensorFlow {tf.__version__} (this runtime) does not register" in message
    assert "contrib" not in message  # TF's note about tf.contrib's lazy registration


def test_checkpoint_missing_a_key_keeps_the_root_cause(tmp_path):
    """Not an op: the wrapper's own words ("Restoring from checkpoint failed") are
    dropped for the innermost reason, the key the checkpoint lacks."""
    model = _build(str(tmp_path / "1"), variable=True, name="w")
    other = _build(str(tmp_path / "other"), variable=True, name="v")
    for name in os.listdir(os.path.join(model, "variables")):
        os.remove(os.path.join(model, "variables", name))
    for name in os.listdir(os.path.join(other, "variables")):
        os.rename(os.path.join(other, "variables", name), os.path.join(model, "variables", name))
    with pytest.raises(ServingOptError) as caught:
        loader.load_session(model, SERVE)
    message = str(caught.value)
    assert "\n" not in message
    assert "Restoring from checkpoint failed" not in message
    assert "not found in checkpoint" in message


def test_optimize_names_the_missing_kernel_of_a_model_without_variables(tmp_path):
    """No variables: the load itself runs nothing, and the first run (the parity gate's)
    meets the missing kernel: the error names the op, not "pass --examples"."""
    model = _build(str(tmp_path / "1"), variable=False, op="BoostedTreesBucketize")
    with pytest.raises(ServingOptError) as caught:
        optimize(model, str(tmp_path / "out"), FAST)
    message = str(caught.value)
    assert "BoostedTreesBucketize" in message
    assert f"TensorFlow {tf.__version__}" in message
    assert "--examples" not in message
