"""Exports written with ``strip_default_attrs=True`` (the Estimator's default since
TF 1.9) go in: a Placeholder of unknown shape then has no ``shape`` attr, and Grappler
refused the graph kept with its variables ("Failed to import metagraph")."""

from __future__ import annotations

import os

import numpy as np
import pytest
from independent_check import assert_outputs_match

from serving_opt import OptimizeOptions, optimize
from serving_opt.options import BuildOptions, MeasureOptions
from serving_opt.stages.grappler import with_default_attrs

pytestmark = pytest.mark.in_process  # our own models, stages in this process

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def stripped_export(path: str) -> str:
    """A TF1 model whose string input has no static shape, saved with default attrs
    stripped; its output is the input's length, plus a variable."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        words = v1.placeholder(tf.string, shape=None, name="words")
        scale = v1.get_variable("scale", initializer=np.float32(2.0))
        lengths = tf.cast(tf.strings.length(words), tf.float32) * scale
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            signature = v1.saved_model.signature_def_utils.predict_signature_def(
                {"words": words}, {"lengths": lengths})
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={"serving_default": signature},
                strip_default_attrs=True)
            builder.save()
    return path


def _placeholder(path: str):
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    graph_def = saved_model.meta_graphs[0].graph_def
    return graph_def, next(n for n in graph_def.node if n.name == "words")


def test_the_export_really_lacks_the_shape_attr(tmp_path):
    _, node = _placeholder(stripped_export(str(tmp_path / "m" / "1")))
    assert "shape" not in node.attr


def test_default_attrs_are_filled_for_grappler(tmp_path):
    graph_def, _ = _placeholder(stripped_export(str(tmp_path / "m" / "1")))
    filled = next(n for n in with_default_attrs(graph_def).node if n.name == "words")
    assert filled.attr["shape"].shape.unknown_rank
    assert "shape" not in next(n for n in graph_def.node if n.name == "words").attr


def test_optimize_keeps_its_variables_and_publishes(tmp_path):
    src = stripped_export(str(tmp_path / "m" / "1"))
    report = optimize(src, str(tmp_path / "out"),
                      OptimizeOptions(build=BuildOptions(freeze="never"), **NOT_MEASURED))
    assert not report.frozen
    # Words of unknown rank, as the stripped placeholder takes them: a 2-D batch.
    words = np.array([["a", "hello"], ["", "naïve"]], dtype=object)
    assert_outputs_match(report.output_dir, src, {"serving_default": {"words": words}},
                         rtol=1e-6, atol=0)
