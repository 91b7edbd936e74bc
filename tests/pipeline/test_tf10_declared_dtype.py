"""TF 1.0.0-rc2 exported a regress signature whose input TensorInfo says DT_FLOAT on a
string placeholder (TF Serving's own testdata, saved_model_half_plus_three). TF
Serving's Regress API feeds serialized tf.Examples whatever the declaration says, so
the model serves; parity refused it ("Unsupported object type float") because inputs
were synthesized from the declared dtype."""

from __future__ import annotations

import os

import numpy as np
import pytest
from independent_check import assert_outputs_match, example

from serving_opt import OptimizeOptions, optimize
from serving_opt.options import MeasureOptions
from serving_opt.savedmodel import parse_spec

pytestmark = pytest.mark.in_process  # our own models, stages in this process

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
KEY = "tensorflow/serving/regress"


def half_plus_three_shape(path: str) -> str:
    """y = 0.5 * x + 3 over tf.Examples, its regress input then declared DT_FLOAT."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, name="tf_example")
        x = v1.parse_example(serialized, {"x": v1.FixedLenFeature([1], tf.float32)})["x"]
        a = v1.get_variable("a", initializer=np.float32(0.5))
        y = tf.identity(x * a + 3.0, name="y")
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                KEY: v1.saved_model.signature_def_utils.regression_signature_def(
                    serialized, y)})
            builder.save()
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    with open(pb, "rb") as f:
        saved_model.ParseFromString(f.read())
    info = saved_model.meta_graphs[0].signature_def[KEY].inputs["inputs"]
    info.dtype = tf.float32.as_datatype_enum  # what TF 1.0.0-rc2 wrote
    with open(pb, "wb") as f:
        f.write(saved_model.SerializeToString())
    return path


def test_the_graph_not_the_declaration_says_it_takes_tf_examples(tmp_path):
    from serving_opt.savedmodel import loader

    path = half_plus_three_shape(str(tmp_path / "m" / "1"))
    meta_graph = loader.find_meta_graph(loader.read_saved_model(path), ["serve"], path)
    found = parse_spec.example_input_alias(meta_graph.graph_def, meta_graph.signature_def[KEY])
    assert found is not None and found[0] == "inputs"


def test_optimize_publishes_it_with_its_declaration_unchanged(tmp_path):
    import tensorflow as tf

    src = half_plus_three_shape(str(tmp_path / "m" / "1"))
    report = optimize(src, str(tmp_path / "out"), OptimizeOptions(**NOT_MEASURED))
    xs = [-2.0, 0.0, 1.5, 40.0]
    # tf.Examples, as TF Serving's Regress API feeds them whatever the declaration says.
    feeds = {KEY: {"inputs": np.array([example(x=x) for x in xs], dtype=object)}}
    original = assert_outputs_match(report.output_dir, src, feeds, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(original[KEY]["outputs"][:, 0], [0.5 * x + 3 for x in xs])
    from serving_opt.savedmodel import loader

    published = loader.find_meta_graph(loader.read_saved_model(report.output_dir),
                                       ["serve"], report.output_dir)
    assert published.signature_def[KEY].inputs["inputs"].dtype == \
        tf.float32.as_datatype_enum
