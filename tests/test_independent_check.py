"""The tests' independent output check (tests/independent_check.py) fails where it must:
a model whose weight was changed in a copy no longer matches its original, and the check
owes nothing to serving_opt's code."""

from __future__ import annotations

import ast
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
from independent_check import assert_outputs_match, example

v1 = tf.compat.v1
TOLERANCE = dict(rtol=1e-6, atol=1e-6)


def test_the_check_imports_only_numpy_tensorflow_and_the_standard_library():
    path = os.path.join(os.path.dirname(__file__), "independent_check.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    assert roots - set(sys.stdlib_module_names) <= {"numpy", "tensorflow"}, roots


def _tf1_model(path: str) -> str:
    """Serialized tf.Examples in; a float score, an int class and a string label out."""
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        serialized = v1.placeholder(tf.string, [None], name="examples")
        age = v1.parse_example(serialized, {"age": v1.FixedLenFeature([1], tf.float32)})["age"]
        weight = v1.get_variable("weight", initializer=np.float32([[0.5, -0.25, 0.125]]))
        scores = tf.matmul(age, weight)
        classes = tf.argmax(scores, axis=1)
        labels = tf.gather(tf.constant(["low", "mid", "high"]), classes)
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.predict_signature_def(
                {"examples": serialized},
                {"scores": scores, "classes": classes, "labels": labels})})
        builder.save()
    return path


def _scale_tf1_variable(path: str, name: str, factor: float) -> None:
    """Rewrites one variable of the SavedModel at ``path`` in its own checkpoint."""
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        meta_graph = v1.saved_model.loader.load(sess, ["serve"], path)
        variable = next(v for v in v1.global_variables() if v.op.name == name)
        sess.run(variable.assign(variable * factor))
        v1.train.Saver(saver_def=meta_graph.saver_def).save(
            sess, os.path.join(path, "variables", "variables"), write_meta_graph=False,
            write_state=False)


@pytest.fixture(scope="module")
def tf1_model(tmp_path_factory) -> str:
    return _tf1_model(str(tmp_path_factory.mktemp("tf1") / "1"))


FEEDS = {"serving_default": {"examples": np.array(
    [example(age=a) for a in (-3.0, 0.5, 2.0, 7.0)], dtype=object)}}


def test_an_identical_copy_matches_on_every_output(tf1_model, tmp_path):
    copy = shutil.copytree(tf1_model, str(tmp_path / "copy"))
    expected = assert_outputs_match(copy, tf1_model, FEEDS, **TOLERANCE)
    assert sorted(expected["serving_default"]) == ["classes", "labels", "scores"]


def test_a_copy_with_a_changed_variable_fails(tf1_model, tmp_path):
    changed = shutil.copytree(tf1_model, str(tmp_path / "changed"))
    _scale_tf1_variable(changed, "weight", 1.001)
    with pytest.raises(AssertionError, match="serving_default.scores"):
        assert_outputs_match(changed, tf1_model, FEEDS, **TOLERANCE)


def test_every_signature_of_the_original_must_be_fed(tf1_model):
    with pytest.raises(AssertionError, match="the original has"):
        assert_outputs_match(tf1_model, tf1_model, {}, **TOLERANCE)


def test_an_object_graph_original_runs_through_tf_saved_model_load(tmp_path):
    """A TF2 original is run by its own loader; a published copy whose variable changed
    fails against it, the unchanged one passes."""

    class Scale(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([1.5, -2.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": x * self.w, "n": tf.shape(x)[0]}

    module = Scale()
    original = str(tmp_path / "original")
    tf.saved_model.save(module, original, signatures={"serving_default": module.__call__})
    feeds = {"serving_default": {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}}
    assert_outputs_match(original, original, feeds, **TOLERANCE)
    module.w.assign([1.5, -2.002])
    changed = str(tmp_path / "changed")
    tf.saved_model.save(module, changed, signatures={"serving_default": module.__call__})
    with pytest.raises(AssertionError, match="serving_default.y"):
        assert_outputs_match(changed, original, feeds, **TOLERANCE)
