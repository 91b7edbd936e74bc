"""A MetaGraph with no tags (old TF Hub exports) is selected by the empty tag set,
``--saved_model_tags=''``, as ``saved_model_cli --tag_set ''`` selects it: through the
CLI and the Python API, in inspect and optimize."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from serving_opt import OptimizeOptions, inspection, optimize
from serving_opt.errors import ServingOptError
from serving_opt.options import InputOptions, MeasureOptions

pytestmark = pytest.mark.in_process  # our own models, stages in this process

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
ROWS = np.arange(6, dtype=np.float32).reshape(3, 2)


def tagless_export(path: str) -> str:
    """A TF1 Builder export (which insists on tags), its tag list then emptied."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as session:
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        w = v1.get_variable("w", initializer=np.array([[1.5], [-2.0]], np.float32))
        y = tf.identity(tf.matmul(x, w) + 0.25, name="y")
        session.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.signature_def_utils.predict_signature_def(
                {"x": x}, {"y": y})})
        builder.save()
    pb = os.path.join(path, "saved_model.pb")
    saved = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        saved.ParseFromString(f.read())
    del saved.meta_graphs[0].meta_info_def.tags[:]
    with open(pb, "wb") as f:
        f.write(saved.SerializeToString())
    return path


def _answer(model_dir: str) -> np.ndarray:
    """Plain TensorFlow's session loader, given the empty tag set."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, [], model_dir)
        sig = meta_graph.signature_def["serving_default"]
        return session.run(sig.outputs["y"].name, {sig.inputs["x"].name: ROWS})


@pytest.fixture(scope="module")
def tagless(tmp_path_factory) -> str:
    return tagless_export(str(tmp_path_factory.mktemp("tagless") / "1"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving_opt.cli", *args],
                          capture_output=True, text=True, timeout=600)


def test_control_the_default_tags_miss_it_and_the_error_names_the_empty_set(tagless,
                                                                          tmp_path):
    with pytest.raises(ServingOptError, match="no MetaGraph tagged serve") as raised:
        optimize(tagless, str(tmp_path / "out"), OptimizeOptions(**NOT_MEASURED))
    assert "--saved_model_tags=''" in raised.value.fix


def test_inspect_selects_it_by_the_empty_set(tagless):
    (meta_graph,) = inspection.inspect_saved_model(tagless, "").meta_graphs
    assert meta_graph.tags == ()
    with pytest.raises(ServingOptError, match="--saved_model_tags=''"):
        inspection.inspect_saved_model(tagless, "serve")
    result = _cli("inspect", f"--saved_model_dir={tagless}", "--saved_model_tags=", "--json")
    assert result.returncode == 0, result.stderr
    assert '"tags": []' in result.stdout


def test_optimize_api_publishes_it_with_the_same_answers(tagless, tmp_path):
    report = optimize(tagless, str(tmp_path / "out"),
                      OptimizeOptions(inputs=InputOptions(saved_model_tags=""), **NOT_MEASURED))
    np.testing.assert_allclose(_answer(report.output_dir), _answer(tagless), rtol=1e-6)


def test_optimize_cli_takes_the_empty_value(tagless, tmp_path):
    out = str(tmp_path / "out")
    result = _cli("optimize", f"--saved_model_dir={tagless}", f"--model_base_path={out}",
                  "--saved_model_tags=", "--benchmark_runs=0", "--nocold_start")
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_allclose(_answer(os.path.join(out, "1")), _answer(tagless), rtol=1e-6)
