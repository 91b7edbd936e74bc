"""A Keras 3 model saved with ``tf.saved_model.save`` (keras-team/keras#19274, #20095,
#20096, tensorflow/tensorflow#72963): the signature functions read one set of variable
handles, the restore function restores another. ``tf.saved_model.load`` answers; the
session loader (TF Serving's) loads it and fails every request with "Could not find
variable". inspect names it; optimize repairs it from the checkpoint, proven against the
object-graph call; validate serves the result over gRPC and REST."""

from __future__ import annotations

import os

import numpy as np
import pytest

from serving_opt import OptimizeOptions, inspection, optimize
from serving_opt.errors import ServingOptError
from serving_opt.options import BuildOptions, MeasureOptions, ServingCheck
from serving_opt.serving.validate import ValidateOptions, validate

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def sequential_export(path: str) -> str:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    tf.saved_model.save(model, path)
    return path


def two_input_export(path: str) -> str:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(2)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
    model = keras.Model([a, b], keras.layers.Dense(2)(joined))
    tf.saved_model.save(model, path)
    return path


def module_wrapped_export(path: str) -> str:
    """The reports' other recipe: the Keras 3 model inside a tf.Module, two signatures
    sharing its variables."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    spec = [tf.TensorSpec([None, 4], tf.float32, name="x")]

    class Wrapper(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=spec)
        def serve(self, x):
            return {"y": self.model(x)}

        @tf.function(input_signature=spec)
        def doubled(self, x):
            return {"y2": 2.0 * self.model(x)}

    wrapper = Wrapper()
    tf.saved_model.save(wrapper, path, signatures={"serving_default": wrapper.serve,
                                                   "doubled": wrapper.doubled})
    return path


def _requests(signature) -> dict:
    """One batch of 5 rows per input, as the signature declares them."""
    rng = np.random.default_rng(7)
    return {alias: rng.normal(size=(5, *[d.size for d in spec.tensor_shape.dim][1:]))
            .astype(np.float32) for alias, spec in signature.inputs.items()}


# Plain TensorFlow from here to the tests: the check owes nothing to serving_opt.
def _session_answers(model_dir: str, feeds: dict | None = None):
    """(signature, outputs by alias) through the session loader, as TF Serving loads."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], model_dir)
        sig = meta_graph.signature_def["serving_default"]
        feeds = feeds if feeds is not None else _requests(sig)
        values = session.run({a: t.name for a, t in sig.outputs.items()},
                             {sig.inputs[a].name: v for a, v in feeds.items()})
    return feeds, values


def _object_graph_answers(model_dir: str, feeds: dict) -> dict:
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    out = loaded.signatures["serving_default"](**{a: tf.constant(v) for a, v in feeds.items()})
    return {a: t.numpy() for a, t in out.items()}


def _signature(model_dir: str):
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        return tf.compat.v1.saved_model.loader.load(
            session, ["serve"], model_dir).signature_def["serving_default"]


@pytest.fixture(scope="module", params=["sequential", "two_inputs", "module_wrapped"])
def export(request, tmp_path_factory) -> str:
    build = {"sequential": sequential_export, "two_inputs": two_input_export,
             "module_wrapped": module_wrapped_export}[request.param]
    return build(str(tmp_path_factory.mktemp(request.param) / "1"))


def test_control_the_session_loader_cannot_answer_the_original(export):
    import tensorflow as tf

    with pytest.raises(tf.errors.FailedPreconditionError, match="Could not find variable"):
        _session_answers(export)


def test_inspect_names_the_unbound_variables_and_the_repair(export):
    codes = {r.code: r for r in inspection.inspect_saved_model(export, "serve").risks}
    risk = codes["unbound_variables"]
    assert risk.severity == inspection.SEVERITY_ERROR
    assert "Could not find variable" in risk.message and "restore" in risk.message
    assert "serving-opt optimize repairs it" in risk.message


@pytest.fixture(scope="module")
def repaired(export, tmp_path_factory) -> tuple[str, object]:
    base = str(tmp_path_factory.mktemp("repaired"))
    report = optimize(export, base, OptimizeOptions(**NOT_MEASURED))
    return base, report


def test_optimize_publishes_a_model_the_session_loader_answers_like_the_original(
        export, repaired):
    base, report = repaired
    assert any("the original is not servable" in w and "published model is servable" in w
               for w in report.warnings)
    sig = _signature(export)
    feeds = _requests(sig)
    _, served = _session_answers(os.path.join(base, "1"), feeds)
    expected = _object_graph_answers(export, feeds)
    assert sorted(served) == sorted(expected)
    for alias, value in expected.items():
        np.testing.assert_allclose(served[alias], value, rtol=1e-5, atol=1e-6)
    risks = inspection.inspect_saved_model(os.path.join(base, "1"), "serve").risks
    assert not [r for r in risks if r.severity == inspection.SEVERITY_ERROR]


@pytest.mark.golden(param="sequential")
def test_the_repaired_model_validates_over_grpc_and_rest(repaired):
    base, _ = repaired
    report = validate(base, ValidateOptions(
        serving=ServingCheck(server="local", concurrency=2, duration=0.5)))
    assert report.ok, report.failures
    names = {c.name for c in report.checks if c.ok}
    assert {"Predict serving_default", "REST Predict serving_default"} <= names


def test_keeping_the_variables_is_refused_with_the_fix(export, tmp_path):
    with pytest.raises(ServingOptError, match="not servable as it is.*--freeze=auto"):
        optimize(export, str(tmp_path / "out"), OptimizeOptions(
            build=BuildOptions(freeze="never"), **NOT_MEASURED))
    assert not os.path.exists(tmp_path / "out" / "1")


def _values_lost(src: str, dst: str) -> str:
    """The export with its functions' bound inputs pointed at the root object, which has
    no value in the checkpoint: what the signatures read is nowhere."""
    import shutil

    from tensorflow.core.protobuf import saved_model_pb2

    shutil.copytree(src, dst)
    pb = os.path.join(dst, "saved_model.pb")
    saved = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        saved.ParseFromString(f.read())
    for function in saved.meta_graphs[0].object_graph_def.concrete_functions.values():
        function.bound_inputs[:] = [0] * len(function.bound_inputs)
    with open(pb, "wb") as f:
        f.write(saved.SerializeToString())
    return dst


def test_values_not_in_the_checkpoint_are_refused_saying_what_tf_serving_will_do(
        tmp_path):
    model = _values_lost(sequential_export(str(tmp_path / "orig" / "1")),
                         str(tmp_path / "lost" / "1"))
    (risk,) = [r for r in inspection.inspect_saved_model(model, "serve").risks
               if r.code == "unbound_variables"]
    assert "not in the checkpoint: re-export" in risk.message
    with pytest.raises(ServingOptError, match="cannot be repaired.*fails every request.*"
                       "not in its checkpoint") as raised:
        optimize(model, str(tmp_path / "out"), OptimizeOptions(**NOT_MEASURED))
    assert "model.export()" in str(raised.value.fix)
    assert not os.path.exists(tmp_path / "out" / "1")
