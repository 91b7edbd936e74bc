"""Synthesized inputs a model refuses as its signature declares them (issue 29, item 5).

Four real shapes of model, each a SavedModel written here with the TF1 Builder:

* a TF 1.0 signature that declares no shape for a ``[None, 1]`` placeholder (the
  graph's shape completes it: ``synthesized (graph shapes)``);
* an input of unknown rank that must be a scalar (``synthesized (scalars)``);
* a signature that only runs at batch 1, a reshape to ``[1, ...]`` inside
  (``synthesized (batch 1)``);
* a VarLenFeature string that tf.Transform densifies to ``[batch, 1]``, so one value
  per example is all it takes (``synthesized (one value per feature)``).

Before, parity refused all four with "pass real inputs with --examples". Each is run
through the parity gate (the original against itself: the inputs are the subject, not
the optimizer), and one end to end through ``optimize``, its cold start included (which
must synthesize the way parity found the model runs).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from independent_check import assert_outputs_match, example

from serving_opt.errors import ServingOptError
from serving_opt.options import BuildOptions, GateOptions, MeasureOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader, parse_spec
from serving_opt.stages import parity

pytestmark = pytest.mark.in_process  # our own models, stages in this process

SERVE = frozenset({"serve"})
KEY = "serving_default"
v1 = tf.compat.v1


def _save(path: str, graph, inputs: dict, outputs: dict, *, no_shapes: bool = False) -> str:
    """Writes ``graph`` with one predict signature; ``no_shapes``: its inputs declare no
    shape (unknown rank), as TF 1.0's signature helpers wrote them."""
    with graph.as_default(), v1.Session(graph=graph) as sess:
        sess.run(v1.global_variables_initializer())
        signature = v1.saved_model.predict_signature_def(inputs, outputs)
        if no_shapes:
            for info in signature.inputs.values():
                info.tensor_shape.Clear()
                info.tensor_shape.unknown_rank = True
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={KEY: signature})
        builder.save()
    return path


def _weight(shape, name="w"):
    values = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape) / 10.0
    return v1.get_variable(name, initializer=tf.constant(values), use_resource=True)


def graph_shapes_model(path: str) -> str:
    """TF 1.0: the signature says nothing of x's shape, the placeholder is [None, 1]."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        y = tf.matmul(x, _weight([1, 2]), name="y")
    return _save(path, graph, {"x": x}, {"y": y}, no_shapes=True)


def scalar_model(path: str) -> str:
    """An input of unknown rank (signature and graph) that the graph reshapes to []."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, None, name="threshold")
        y = tf.multiply(tf.reshape(x, []), _weight([3]), name="y")
    return _save(path, graph, {"threshold": x}, {"y": y})


def batch_one_model(path: str) -> str:
    """Declares [None, 4] but reshapes to [1, 2]: only batch 1 runs."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.matmul(tf.reshape(x, [1, 4]), _weight([4, 2]), name="y")
    return _save(path, graph, {"x": x}, {"y": y})


def one_value_model(path: str) -> str:
    """tf.Examples with a VarLenFeature string that tf.Transform's
    sparse_tensor_to_dense_with_shape makes [batch, 1]: a second value fails."""
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        parsed = tf.io.parse_example(serialized, {
            "word": tf.io.VarLenFeature(tf.string),
            "age": tf.io.FixedLenFeature([1], tf.float32, default_value=[30.0]),
        })
        batch = tf.shape(serialized, out_type=tf.int64)[0]
        word = tf.sparse.to_dense(tf.sparse.reset_shape(parsed["word"], [batch, 1]),
                                  default_value="")
        bucket = tf.cast(tf.strings.to_hash_bucket_fast(word, 10), tf.float32)
        y = tf.identity(tf.concat([bucket, parsed["age"]], axis=1) * _weight([2]), name="y")
    return _save(path, graph, {"examples": serialized}, {"y": y})


MODELS = {
    "graph shapes": graph_shapes_model,
    "scalars": scalar_model,
    "batch 1": batch_one_model,
    "one value per feature": one_value_model,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param.replace(" ", "_")) / "1")
    return request.param, MODELS[request.param](path)


def _declared_inputs_fail_on_the_original(path: str) -> None:
    """The premise: the inputs synthesized as the signature declares them (before this
    change, the only ones) are refused by the original (the graph-shapes model's feed
    contradicts its placeholder)."""
    sess, mg = loader.load_session(path, SERVE)
    try:
        signature = mg.signature_def[KEY]
        synthesizer = inputs_lib.InputSynthesizer(seed=0)
        feed = {}
        for alias, info in signature.inputs.items():
            if parse_spec.example_input_alias(mg.graph_def, signature) is not None:
                spec = parse_spec.find_example_spec(mg.graph_def, info.name)
                feed[alias] = np.array(synthesizer.examples(spec, 16), dtype=object)
            else:
                feed[alias] = synthesizer.tensor(info.dtype, inputs_lib.tensor_info_shape(info),
                                                 16)
        with pytest.raises(Exception):  # noqa: B017 - TF's or the session's own
            loader.run_signature(sess, signature, feed)
    finally:
        sess.close()


def test_parity_runs_on_the_first_inputs_the_original_answers(model):
    mode, path = model
    _declared_inputs_fail_on_the_original(path)
    report = parity.check_parity(path, path, SERVE, [KEY])
    assert report.ok, report.summary()
    assert report.input_sources == {KEY: f"synthesized ({mode})"}
    assert report.batches_run >= 2
    assert all(o.elements > 0 for o in report.outputs)
    assert f"synthesized ({mode})" in report.summary()


def test_feeds_of_the_mode_the_original_answers(model):
    """The feed builder, given the mode parity found, makes inputs the original runs
    (what the cold start and anyone after parity use)."""
    mode, path = model
    sess, mg = loader.load_session(path, SERVE)
    try:
        feeds = inputs_lib.signature_feeds(mg, path, seed=3)
        made = feeds(KEY, 1, 1, mode=inputs_lib.mode_of(f"synthesized ({mode})"))
        assert made.source == f"synthesized ({mode})"
        answer = loader.run_signature(sess, mg.signature_def[KEY], made.batches[0])
        assert np.all(np.isfinite(answer["y"]))
    finally:
        sess.close()


def test_graph_shape_completes_an_undeclared_signature(tmp_path):
    path = graph_shapes_model(str(tmp_path / "1"))
    mg = loader.find_meta_graph(loader.read_saved_model(path), SERVE)
    info = mg.signature_def[KEY].inputs["x"]
    assert inputs_lib.tensor_info_shape(info) is None
    assert inputs_lib.graph_tensor_shape(mg.graph_def, info.name) == (-1, 1)
    assert inputs_lib.declared_shape(mg.graph_def, info) == ((-1, 1), True)
    made = inputs_lib.signature_feeds(mg, path)(KEY, 16, 2)
    assert [b["x"].shape for b in made.batches] == [(16, 1), (16, 1)]


def test_nothing_runs_refuses_naming_the_last_failure_and_the_fix(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, None, name="x")
        w = _weight([1])
        check = tf.debugging.assert_greater(x, 1000.0, message="x must be above 1000")
        with tf.control_dependencies([check]):
            y = tf.identity(x * w, name="y")
    path = _save(str(tmp_path / "1"), graph, {"x": x}, {"y": y})
    with pytest.raises(ServingOptError) as caught:
        parity.check_parity(path, path, SERVE, [KEY])
    message = str(caught.value)
    assert "\n" not in message
    assert "synthesized (scalars)" in message and "synthesized (batch 1)" in message
    assert "x must be above 1000" in message
    assert "--examples" in message


def test_optimize_end_to_end_with_cold_start(tmp_path):
    """optimize publishes the scalar model; its cold start synthesizes scalars too (the
    declared inputs would fail the first request)."""
    src = scalar_model(str(tmp_path / "src" / "1"))
    # freeze=always and allow_regression: a cold start that noise on a busy machine makes
    # look worse is not answered by a retry with variables kept that measures it all again;
    # the inputs the cold start ran on, not the gate, are this test's subject.
    report = optimize(src, str(tmp_path / "out"),
                      OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=True),
                                      build=BuildOptions(freeze="always"),
                                      gate=GateOptions(allow_regression=True)))
    assert_outputs_match(report.output_dir, src, {KEY: {"threshold": np.float32(-2.5)}},
                         rtol=1e-6, atol=1e-6)
    assert report.parity.input_sources == {KEY: "synthesized (scalars)"}
    assert report.cold_start is not None
    assert os.path.isfile(os.path.join(report.output_dir, "saved_model.pb"))


def test_optimize_end_to_end_one_value_per_feature(tmp_path):
    src = one_value_model(str(tmp_path / "src" / "1"))
    report = optimize(src, str(tmp_path / "out"),
                      OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    examples = np.array([example(word="cat", age=41.0), example(word="dog"),
                         example(age=7.5)], dtype=object)
    assert_outputs_match(report.output_dir, src, {KEY: {"examples": examples}},
                         rtol=1e-6, atol=1e-6)
    assert report.parity.input_sources == {KEY: "synthesized (one value per feature)"}


def test_the_benchmark_runs_on_the_inputs_parity_found(tmp_path):
    """The batch-1-only model is benchmarked at batch 1 on single rows (batch 32 would
    fail on it), and the report says why only batch 1 was measured."""
    src = batch_one_model(str(tmp_path / "src" / "1"))
    report = optimize(src, str(tmp_path / "out"),
                      # Timing decides nothing here: a noisy machine must not fail it.
                      OptimizeOptions(
                          measure=MeasureOptions(benchmark_runs=5, cold_start=False),
                          gate=GateOptions(allow_regression=True)))
    assert report.parity.input_sources == {KEY: "synthesized (batch 1)"}
    assert report.benchmark is not None
    assert [lat.batch_size for lat in report.benchmark.after] == [1]
    assert any("benchmark at batch 1 only" in w for w in report.warnings)


def test_a_tensor_info_without_any_shape_is_unknown_not_a_scalar():
    """TF 1.0's signatures wrote no tensor_shape field at all; read as a message, that
    is a known scalar unless its absence is checked."""
    from tensorflow.core.protobuf import meta_graph_pb2

    from serving_opt.savedmodel import inputs

    absent = meta_graph_pb2.TensorInfo(name="x:0", dtype=1)
    scalar = meta_graph_pb2.TensorInfo(name="x:0", dtype=1)
    scalar.tensor_shape.SetInParent()
    assert inputs.tensor_info_shape(absent) is None
    assert inputs.tensor_info_shape(scalar) == ()
