"""A SavedModel whose Builder was given a V1 saver (``write_version=V1``): one
``variables/variables`` file and no index. TF's Python loader restores it; TF Serving's
C++ loader looks for ``variables.index``, finds none, restores nothing ("The specified
SavedModel has no variables; no checkpoints were restored") and serves uninitialized
variables. inspect says so; optimize repairs it (frozen, or a V2 checkpoint)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from serving_opt import OptimizeOptions, inspection, optimize
from serving_opt.errors import ServingOptError
from serving_opt.options import BuildOptions, MeasureOptions

pytestmark = pytest.mark.in_process  # our own models, stages in this process

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
TRAINED = np.float32(3.25)  # the checkpoint's value; the initializer says 1.0


def v1_export(path: str) -> str:
    import tensorflow as tf
    from tensorflow.core.protobuf import saver_pb2

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        w = v1.get_variable("w", initializer=np.float32(1.0))
        y = tf.multiply(x, w, name="y")
        saver = v1.train.Saver(write_version=saver_pb2.SaverDef.V1, sharded=False)
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            session.run(w.assign(TRAINED))  # "training": differs from the initializer
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                session, ["serve"], saver=saver, signature_def_map={
                    "serving_default": v1.saved_model.signature_def_utils
                    .predict_signature_def({"x": x}, {"y": y})})
            builder.save()
    assert not os.path.exists(os.path.join(path, "variables", "variables.index"))
    return path


def _answer(model_dir: str) -> float:
    import tensorflow as tf

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], model_dir)
        sig = meta_graph.signature_def["serving_default"]
        out = session.run(sig.outputs["y"].name, {sig.inputs["x"].name: [[2.0]]})
    return float(out[0][0])


@pytest.fixture(scope="module")
def v1_dir(tmp_path_factory) -> str:
    return v1_export(str(tmp_path_factory.mktemp("v1") / "1"))


def test_inspect_says_tf_serving_would_not_restore_it(v1_dir):
    risks = inspection.inspect_saved_model(v1_dir, frozenset({"serve"})).risks
    codes = {r.code: r for r in risks}
    assert "variables_v1_checkpoint" in codes and "variables_missing" not in codes
    assert codes["variables_v1_checkpoint"].severity == inspection.SEVERITY_ERROR
    assert "serving-opt optimize rewrites it" in codes["variables_v1_checkpoint"].message


def test_optimize_rewrites_it_as_tf_serving_restores(v1_dir, tmp_path):
    report = optimize(v1_dir, str(tmp_path / "out"), OptimizeOptions(**NOT_MEASURED))
    out = report.output_dir
    # Frozen: the trained value is in the graph (no checkpoint left to skip), or a V2
    # checkpoint with its index holds it.
    leftover = os.listdir(os.path.join(out, "variables"))
    assert leftover == [] or "variables.index" in leftover
    assert _answer(out) == pytest.approx(2.0 * TRAINED)
    risks = inspection.inspect_saved_model(out, frozenset({"serve"})).risks
    assert not [r for r in risks if r.severity == inspection.SEVERITY_ERROR]


def test_keeping_its_variables_is_refused_with_the_fix(v1_dir, tmp_path):
    with pytest.raises(ServingOptError, match="V1-format checkpoint.*--freeze=auto"):
        optimize(v1_dir, str(tmp_path / "out"),
                 OptimizeOptions(build=BuildOptions(freeze="never"), **NOT_MEASURED))
    assert not os.path.exists(os.path.join(tmp_path, "out", "1"))
