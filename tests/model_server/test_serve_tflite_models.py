"""``serve --prefer_tflite_model``: a model.tflite is code too, and a model without
signatures is served as TF Serving serves it.

- A Select TF ("flex") op that is a host op fails the load unless ``--allow_file_ops``;
  the control runs the same file under TensorFlow 2.15, whose interpreter has the Flex
  delegate, and it reads a host file.
- A builtin-only model without signature runners (upstream's
  saved_model_half_plus_two_tflite) gets one ``serving_default`` keyed by tensor names.
"""

from __future__ import annotations

import os
import subprocess

import grpc
import numpy as np
import pytest
import repo_paths
import tensorflow as tf
from local_server import running
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving_opt.model_server.servable import ServableId
from serving_opt.model_server.status import ServingStatusError
from serving_opt.model_server.tflite import TfLiteServable, flex_nodes

# realpath: under Bazel this file is a runfiles symlink; the venv is beside the source.
TF215_PYTHON = os.path.join(repo_paths.SOURCE_REPO,
                            ".venv-tf215", "bin", "python")

# Runs a model.tflite's default signature with TensorFlow 2.15's interpreter (which has
# the Flex delegate); prints the output.
_RUN_FLEX = """
import sys, numpy as np, tensorflow as tf
runner = tf.lite.Interpreter(model_path=sys.argv[1]).get_signature_runner()
print(int(runner(path=np.array([sys.argv[2].encode()], dtype=object))["y"]))
"""


def _write(version: str, content: bytes) -> str:
    os.makedirs(version)
    with open(os.path.join(version, "model.tflite"), "wb") as f:
        f.write(content)
    return version


@pytest.fixture
def read_file_model(tmp_path) -> str:
    """A version whose model.tflite answers the length of the file named by its input,
    through a flex ReadFile."""

    class ReadsFiles(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1], tf.string, name="path")])
        def serve(self, path):
            return {"y": tf.strings.length(tf.io.read_file(path[0]))}

    module = ReadsFiles()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.serve.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                           tf.lite.OpsSet.SELECT_TF_OPS]
    return _write(str(tmp_path / "m" / "1"), converter.convert())


def test_a_flex_host_op_fails_the_load_unless_file_ops_are_allowed(read_file_model,
                                                                    tmp_path):
    content = open(os.path.join(read_file_model, "model.tflite"), "rb").read()
    assert [n.op for n in flex_nodes(content)][:1] == ["ReadFile"]  # the op is really there
    with pytest.raises(ServingStatusError) as info:
        TfLiteServable.load(ServableId("m", 1), read_file_model)
    assert info.value.code.name == "FAILED_PRECONDITION"
    assert "ReadFile" in info.value.message and "--allow_file_ops" in info.value.message
    TfLiteServable.load(ServableId("m", 1), read_file_model, allow_file_ops=True).close()


def test_a_flex_op_that_is_not_a_host_op_loads(tmp_path):
    class Length(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1], tf.string, name="s")])
        def serve(self, s):
            return {"y": tf.strings.length(s)}

    module = Length()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.serve.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                           tf.lite.OpsSet.SELECT_TF_OPS]
    content = converter.convert()
    assert "StringLength" in [n.op for n in flex_nodes(content)]  # a flex op is there
    version = _write(str(tmp_path / "m" / "1"), content)
    servable = TfLiteServable.load(ServableId("m", 1), version)
    assert sorted(servable.signature_defs) == ["serving_default"]
    servable.close()


def test_control_a_runtime_with_the_flex_delegate_runs_the_host_op(read_file_model,
                                                                   tmp_path):
    if not os.path.exists(TF215_PYTHON):
        pytest.skip(f"no TensorFlow 2.15 runtime at {TF215_PYTHON} (make venv-tf215)")
    secret = tmp_path / "secret"
    secret.write_bytes(b"another model's file")
    done = subprocess.run(
        [TF215_PYTHON, "-c", _RUN_FLEX, os.path.join(read_file_model, "model.tflite"),
         str(secret)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(len(b"another model's file"))]


@pytest.fixture
def half_plus_two_without_signatures(tmp_path) -> str:
    """The base of a builtin-only model.tflite computing y = 0.5 * x + 2, converted from
    a session: it has no SignatureDefs, like upstream's saved_model_half_plus_two_tflite."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        y = tf.identity(0.5 * x + 2.0, name="y")
        content = tf.compat.v1.lite.TFLiteConverter.from_session(sess, [x], [y]).convert()
    assert tf.lite.Interpreter(model_content=content).get_signature_list() == {}  # control
    _write(str(tmp_path / "half_plus_two" / "1"), content)
    return str(tmp_path / "half_plus_two")


def test_a_model_without_signatures_is_served_by_tensor_name(
        half_plus_two_without_signatures):
    with running(model_name="m", model_base_path=half_plus_two_without_signatures, port=0,
                 prefer_tflite_model=True) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            answers = []
            for x in ([1.0], [1.0, 2.0, 5.0]):  # a new length resizes the interpreter
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "m"
                request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(x, np.float32)))
                response = stub.Predict(request, timeout=60)
                answers.append(tf.make_ndarray(response.outputs["y"]).tolist())
                assert response.model_spec.signature_name == "serving_default"
    assert answers == [[2.5], [2.5, 3.0, 4.5]]
