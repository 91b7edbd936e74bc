"""When the original cannot answer at all, the parity gate says why before any advice
about inputs: the inputs (suggest --examples), the loader (state the session loader left
unset: no input would do), or the runtime (an op this TensorFlow cannot run)."""

from __future__ import annotations

import numpy as np
import pytest

from serving_opt.errors import ServingOptError
from serving_opt.stages.parity import check_parity

SERVE = frozenset({"serve"})


def _export(path: str, build) -> str:
    """A TF1 Builder export of ``build(x) -> (y, saver or None)`` over x: [None] float."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as session:
        x = v1.placeholder(tf.float32, [None], name="x")
        y, saver = build(x)
        if v1.global_variables():  # a run of any kind places the whole graph
            session.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(session, ["serve"], saver=saver,
                                             signature_def_map={
            "serving_default": v1.saved_model.signature_def_utils.predict_signature_def(
                {"x": x}, {"y": y})})
        builder.save()
    return path


def _rejects_every_input(x):
    import tensorflow as tf

    check = tf.debugging.assert_greater(x, 1e30, message="x must exceed 1e30")
    with tf.control_dependencies([check]):
        return tf.identity(x, name="y"), None


def _reads_an_unsaved_variable(x):
    import tensorflow as tf

    v1 = tf.compat.v1
    saved = v1.get_variable("saved", initializer=np.float32(1.0), use_resource=True)
    unsaved = v1.get_variable("unsaved", initializer=np.float32(2.0), use_resource=True)
    # The saver covers one variable; the loader never initializes the other.
    return tf.identity(x * saved * unsaved, name="y"), v1.train.Saver([saved])


def _uses_an_op_without_a_kernel(x):
    import tensorflow as tf

    buckets = tf.raw_ops.BoostedTreesBucketize(
        float_values=[x], bucket_boundaries=[tf.constant([0.5, 1.0])])
    return tf.identity(buckets[0], name="y"), None


def _why(model: str) -> ServingOptError:
    with pytest.raises(ServingOptError) as raised:
        check_parity(model, model, SERVE, ["serving_default"])
    return raised.value


def _control_runs_and_fails(model: str, error: str) -> None:
    """The original really fails when run as TF Serving would (not at load)."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        sig = tf.compat.v1.saved_model.loader.load(session, ["serve"], model) \
            .signature_def["serving_default"]
        with pytest.raises(tf.errors.OpError, match=error):
            session.run(sig.outputs["y"].name, {sig.inputs["x"].name: [1.0, 2.0]})


def test_inputs_it_rejects_suggest_examples(tmp_path):
    model = _export(str(tmp_path / "1"), _rejects_every_input)
    _control_runs_and_fails(model, "x must exceed 1e30")
    why = _why(model)
    assert "fails on synthesized inputs" in why.problem and "x must exceed" in why.problem
    assert "--examples" in why.fix


def test_state_the_loader_left_unset_names_the_loader_not_the_inputs(tmp_path):
    model = _export(str(tmp_path / "1"), _reads_an_unsaved_variable)
    _control_runs_and_fails(model, "unsaved")
    why = _why(model)
    assert "session loader" in why.problem and "whatever the inputs" in why.problem
    assert "unsaved" in why.problem
    assert "--examples" not in why.fix and "re-export" in why.fix


def test_an_op_this_runtime_cannot_run_names_the_op_and_the_version(tmp_path):
    import tensorflow as tf

    model = _export(str(tmp_path / "1"), _uses_an_op_without_a_kernel)
    _control_runs_and_fails(model, "No OpKernel")
    why = _why(model)
    assert "BoostedTreesBucketize" in why.problem and tf.__version__ in why.problem
    assert "--serving_version" in why.problem and "--examples" not in why.fix
