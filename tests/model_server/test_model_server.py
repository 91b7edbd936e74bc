"""The local model server answers like TF Serving: real gRPC over loopback, real models.

One server (module fixture) serves the sample classifier, regressor, conv net and Keras
model plus a tiny classify+regress model built here; expectations are computed
independently (TF session in-process, TF2 loader, or numpy).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import threading  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import running, write_model_config  # noqa: E402
from saved_model_io import (  # noqa: E402
    edit_saved_model,
    read_saved_model,
    save_tf1,
    serving_default,
)
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving_opt import samples  # noqa: E402
from serving_opt.model_server import ServerOptions, ServerStartError, serve  # noqa: E402
from serving_opt.model_server.prediction_service import PredictionService  # noqa: E402
from serving_opt.model_server.request_options import RequestOptions  # noqa: E402

CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"
MULTI_WEIGHTS = np.array([[1.0, -1.0], [0.5, 2.0]], np.float32)


def build_multi_head(export_dir: str) -> str:
    """A TF1 model with a classify and a regress signature over the same tf.Examples."""
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        x = v1.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([2], tf.float32)})["x"]
        scores = tf.nn.softmax(tf.matmul(x, tf.constant(MULTI_WEIGHTS)), name="scores")
        classes = tf.tile(tf.constant([["a", "b"]]), tf.stack([tf.shape(x)[0], 1]))
        total = tf.reduce_sum(x, axis=1, keepdims=True, name="total")
        classify = sigs.classification_signature_def(serialized, classes, scores)
        regress = sigs.regression_signature_def(serialized, total)
        return save_tf1(graph, export_dir, {
            "serving_default": classify, "classify": classify, "regress": regress})


def build_slow(export_dir: str) -> str:
    """Counts to the fed ``n`` in a while loop: a run as long as the client wants."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        n = v1.placeholder(tf.int64, [], name="n")
        count = tf.while_loop(lambda i: i < n, lambda i: i + 1, [tf.constant(0, tf.int64)])[0]
        save_tf1(graph, export_dir,
                 serving_default({"n": n}, {"count": tf.identity(count, name="count")}))

    def default_n_to_7(meta_graph):
        # SignatureDef.defaults has no Python builder API: add n=7 to the saved proto.
        defaults = meta_graph.signature_def["serving_default"].defaults
        defaults["n"].CopyFrom(tf.make_tensor_proto(np.int64(7)))

    edit_saved_model(export_dir, default_n_to_7)
    return export_dir


def x_example(values) -> bytes:
    floats = tf.train.FloatList(value=[float(v) for v in values])
    feature = {"x": tf.train.Feature(float_list=floats)}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def bases(tmp_path_factory, classifier_base, regressor_base, convnet_base, keras_base):
    extra = tmp_path_factory.mktemp("model_server_models")
    multi = os.path.join(str(extra), "multi")
    slow = os.path.join(str(extra), "slow")
    build_multi_head(os.path.join(multi, "1"))
    build_slow(os.path.join(slow, "1"))
    return {
        "clf": classifier_base,
        "reg": regressor_base,
        "cnn": convnet_base,
        "keras": keras_base,
        "multi": multi,
        "slow": slow,
    }


@pytest.fixture(scope="module")
def server(bases, tmp_path_factory):
    config = write_model_config(
        str(tmp_path_factory.mktemp("model_server_config") / "models.config"), bases)
    with running(model_config_file=config, port=0, max_num_load_retries=0) as server:
        yield server


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="module")
def predictions(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def models(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value


def run_in_session(saved_model_dir: str, signature_key: str, feeds_by_alias: dict) -> dict:
    """The expectation: the signature run in-process with a plain TF1 session."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], saved_model_dir)
        signature = meta_graph.signature_def[signature_key]
        feeds = {signature.inputs[a].name: v for a, v in feeds_by_alias.items()}
        aliases = sorted(signature.outputs)
        values = sess.run([signature.outputs[a].name for a in aliases], feeds)
    return dict(zip(aliases, values))


def classification_request(model: str, examples, signature: str = ""):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for serialized in examples:
        request.input.example_list.examples.add().ParseFromString(serialized)
    return request


def predict_request(model: str, signature: str = "", **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return request


# ------------------------------------------------------------------------ Classify


def test_classify_scores_and_labels_match_an_in_process_session(predictions, classifier_dir):
    examples = samples.sample_examples(8)
    expected = run_in_session(
        classifier_dir, "serving_default", {"inputs": np.array(examples, dtype=object)}
    )

    response = predictions.Classify(classification_request("clf", examples), timeout=30)

    scores = [[c.score for c in row.classes] for row in response.result.classifications]
    labels = [[c.label for c in row.classes] for row in response.result.classifications]
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-6, atol=0)
    assert labels == [[b.decode() for b in row] for row in expected["classes"]]


def test_classify_reply_names_the_model_version_and_resolved_signature(predictions):
    response = predictions.Classify(
        classification_request("clf", samples.sample_examples(1)), timeout=30
    )

    assert response.model_spec.name == "clf"
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"


def test_classify_with_context_concatenates_context_and_each_example(predictions):
    context = tf.train.Example()
    context.features.feature["age"].float_list.value.append(33.0)
    context.features.feature["city"].bytes_list.value.append(b"city-7")
    partial = []
    for word, clicks in (("apple", 3), ("fig", 40)):
        example = tf.train.Example()
        example.features.feature["word"].bytes_list.value.append(word.encode())
        example.features.feature["clicks"].int64_list.value.append(clicks)
        partial.append(example)
    merged = []
    for example in partial:
        full = tf.train.Example()
        full.CopyFrom(context)
        full.MergeFrom(example)
        merged.append(full.SerializeToString())
    with_context = classification_pb2.ClassificationRequest()
    with_context.model_spec.name = "clf"
    with_context.input.example_list_with_context.context.CopyFrom(context)
    with_context.input.example_list_with_context.examples.extend(partial)

    got = predictions.Classify(with_context, timeout=30).result
    want = predictions.Classify(classification_request("clf", merged), timeout=30).result

    assert got == want


def test_classify_unknown_signature_is_invalid_argument(predictions):
    error = rpc_error(
        predictions.Classify, classification_request("clf", samples.sample_examples(1), "nope")
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "No signature was found with the name: nope"


def test_classify_on_a_predict_signature_fails_the_structure_check(predictions):
    error = rpc_error(
        predictions.Classify,
        classification_request("clf", samples.sample_examples(1), "predict"),
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Expected one or two output Tensors, found 3"


def test_classify_without_examples_is_input_is_empty(predictions):
    error = rpc_error(predictions.Classify, classification_request("clf", []))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Input is empty."


# ------------------------------------------------------------------------- Regress


def test_regress_matches_an_in_process_session(predictions, regressor_dir):
    examples = samples.sample_examples(6, seed=3)
    expected = run_in_session(
        regressor_dir, "serving_default", {"inputs": np.array(examples, dtype=object)}
    )
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "reg"
    for serialized in examples:
        request.input.example_list.examples.add().ParseFromString(serialized)

    response = predictions.Regress(request, timeout=30)

    got = [r.value for r in response.result.regressions]
    np.testing.assert_allclose(got, expected["outputs"].reshape(-1), rtol=1e-6, atol=0)
    assert response.model_spec.signature_name == "serving_default"


def test_regress_on_a_classify_signature_is_invalid_argument(predictions):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "multi"
    request.model_spec.signature_name = "classify"
    request.input.example_list.examples.add().ParseFromString(x_example([1, 2]))

    error = rpc_error(predictions.Regress, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Expected one output Tensor."


# ------------------------------------------------------------------------- Predict


def test_predict_replies_with_typed_fields_dtype_and_shape(predictions):
    examples = np.array(samples.sample_examples(3), dtype=object)

    response = predictions.Predict(
        predict_request("clf", "predict", examples=examples), timeout=30
    )

    probabilities = response.outputs["probabilities"]
    class_ids = response.outputs["class_ids"]
    assert probabilities.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in probabilities.tensor_shape.dim] == [3, 3]
    assert len(probabilities.float_val) == 9 and not probabilities.tensor_content
    assert class_ids.dtype == types_pb2.DT_INT64 and len(class_ids.int64_val) == 3
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "predict"


def test_predict_matches_the_session_for_the_convnet(predictions, convnet_dir):
    images = np.random.default_rng(0).normal(size=(4, 16, 16, 3)).astype(np.float32)
    expected = run_in_session(convnet_dir, "serving_default", {"images": images})

    response = predictions.Predict(predict_request("cnn", images=images), timeout=30)

    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["scores"]), expected["scores"], rtol=1e-5, atol=1e-6
    )
    assert list(response.outputs["label"].int64_val) == expected["label"].tolist()


def test_predict_on_keras_model_matches_the_tf2_loader(predictions, keras_dir):
    features = np.random.default_rng(1).normal(size=(5, 5)).astype(np.float32)
    signature = tf.saved_model.load(keras_dir).signatures["serving_default"]
    expected = {k: v.numpy() for k, v in signature(features=tf.constant(features)).items()}

    response = predictions.Predict(predict_request("keras", features=features), timeout=30)

    assert sorted(response.outputs) == sorted(expected)
    for alias, value in expected.items():
        np.testing.assert_allclose(
            tf.make_ndarray(response.outputs[alias]), value, rtol=1e-5, atol=1e-6
        )


def test_predict_does_not_check_placeholder_shapes_client_side(predictions):
    # [1, 8, 8, 3] contradicts the [?, 16, 16, 3] placeholder, but every kernel accepts it:
    # TF Serving answers, where Python's Session.run would refuse before running.
    small = np.ones((1, 8, 8, 3), np.float32)

    response = predictions.Predict(predict_request("cnn", images=small), timeout=30)

    assert [d.size for d in response.outputs["scores"].tensor_shape.dim] == [1, 4]


def test_a_wrongly_ranked_input_of_a_convolution_is_refused_before_the_run(predictions):
    # With oneDNN's kernels it would abort the server; the graph decides, whatever the CPU
    # (tests/model_server/test_serve_feed_ranks.py runs both kernel sets).
    error = rpc_error(
        predictions.Predict, predict_request("cnn", images=np.ones((2, 16, 16), np.float32))
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "images:0 must be 4-dimensional, not [2,16,16]" in error.details()
    assert "Conv2D" in error.details()


def test_predict_runs_a_classify_signature_when_method_names_are_not_checked(predictions):
    examples = np.array(samples.sample_examples(2), dtype=object)

    response = predictions.Predict(predict_request("clf", inputs=examples), timeout=30)

    assert sorted(response.outputs) == ["classes", "scores"]


def test_predict_with_a_scalar_input_returns_a_scalar(predictions):
    response = predictions.Predict(predict_request("slow", n=np.int64(5)), timeout=30)

    count = response.outputs["count"]
    assert count.tensor_shape.dim == [] and list(count.int64_val) == [5]


def test_predict_uses_signature_defaults_for_missing_inputs(predictions):
    response = predictions.Predict(predict_request("slow"), timeout=30)

    assert list(response.outputs["count"].int64_val) == [7]


def test_predict_output_filter_returns_only_the_requested_aliases(predictions):
    request = predict_request("cnn", images=np.zeros((1, 16, 16, 3), np.float32))
    request.output_filter.append("label")

    response = predictions.Predict(request, timeout=30)

    assert list(response.outputs) == ["label"]


def test_predict_unknown_output_filter_alias_is_invalid_argument(predictions):
    request = predict_request("cnn", images=np.zeros((1, 16, 16, 3), np.float32))
    request.output_filter.append("nope")

    error = rpc_error(predictions.Predict, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "output tensor alias not found in signature: nope Outputs expected to be in the set "
        "{label,scores}."
    )


def test_predict_duplicate_output_filter_alias_is_invalid_argument(predictions):
    request = predict_request("cnn", images=np.zeros((1, 16, 16, 3), np.float32))
    request.output_filter.extend(["label", "label"])

    error = rpc_error(predictions.Predict, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "duplicate output tensor alias: label"


def test_predict_unknown_signature_is_failed_precondition(predictions):
    error = rpc_error(
        predictions.Predict, predict_request("cnn", "nope", images=np.zeros((1, 16, 16, 3)))
    )

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == 'Serving signature key "nope" not found.'


def test_predict_wrong_input_alias_is_invalid_argument(predictions):
    error = rpc_error(
        predictions.Predict, predict_request("cnn", pixels=np.zeros((1, 16, 16, 3), np.float32))
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(
        "Signature input alias: images(feed name: images:0) not found in request"
    )


def test_predict_extra_input_reports_sent_extra_and_missing(predictions):
    request = predict_request(
        "cnn", images=np.zeros((1, 16, 16, 3), np.float32), mask=np.zeros(1, np.float32)
    )

    error = rpc_error(predictions.Predict, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input size does not match signature: 2!=1 len({images,mask}) != len({images}). "
        "Sent extra: {mask}. Missing but required: {}."
    )


def test_predict_wrong_dtype_fails_in_the_session_with_tf_text(predictions):
    error = rpc_error(
        predictions.Predict,
        predict_request("cnn", images=np.array([[[[b"x"]]]], dtype=object)),
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Expects arg[0] to be float but string is provided"


def test_predict_without_model_spec_is_invalid_argument(predictions):
    error = rpc_error(predictions.Predict, predict_pb2.PredictRequest())

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Missing ModelSpec"


def test_unknown_model_is_not_found_latest(predictions):
    error = rpc_error(predictions.Predict, predict_request("nope", images=np.zeros(1)))

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Servable not found for request: Latest(nope)"


def test_unloaded_version_is_not_found_specific(predictions):
    request = predict_request("cnn", images=np.zeros((1, 16, 16, 3), np.float32))
    request.model_spec.version.value = 3

    error = rpc_error(predictions.Predict, request)

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Servable not found for request: Specific(cnn, 3)"


def test_client_deadline_becomes_the_session_run_timeout(server):
    class Context:  # the two ServicerContext methods the service uses
        def time_remaining(self):
            return 0.3

        def abort(self, code, details):
            raise grpc.RpcError(code, details)

    service = PredictionService(server.core, RequestOptions())
    outcome: list[BaseException] = []

    def predict() -> None:
        try:
            service.Predict(predict_request("slow", n=np.int64(10**12)), Context())
        except BaseException as e:  # noqa: BLE001 - checked below
            outcome.append(e)

    # In a thread with a deadline of its own: a run timeout that does not work must fail
    # this test, not hang the suite (the loop would run for hours).
    thread = threading.Thread(target=predict, daemon=True)
    thread.start()
    thread.join(60)

    assert not thread.is_alive(), "Session.run was not stopped at the client's deadline"
    assert len(outcome) == 1 and isinstance(outcome[0], grpc.RpcError), outcome
    assert outcome[0].args[0] == grpc.StatusCode.DEADLINE_EXCEEDED


# ------------------------------------------------------------------ MultiInference


def multi_request(*tasks, examples=None):
    request = inference_pb2.MultiInferenceRequest()
    for model, signature, method in tasks:
        task = request.tasks.add()
        task.model_spec.name = model
        task.model_spec.signature_name = signature
        task.method_name = method
    for serialized in examples or []:
        request.input.example_list.examples.add().ParseFromString(serialized)
    return request


def test_multi_inference_classifies_and_regresses_in_task_order(predictions):
    xs = np.array([[1.0, 2.0], [-3.0, 0.5]], np.float32)
    logits = xs @ MULTI_WEIGHTS
    want_scores = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    request = multi_request(
        ("multi", "regress", REGRESS),
        ("multi", "classify", CLASSIFY),
        examples=[x_example(x) for x in xs],
    )

    response = predictions.MultiInference(request, timeout=30)

    regression, classification = response.results
    np.testing.assert_allclose(
        [r.value for r in regression.regression_result.regressions], xs.sum(axis=1), rtol=1e-6
    )
    got_scores = [[c.score for c in row.classes]
                  for row in classification.classification_result.classifications]
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5)
    assert [r.model_spec.signature_name for r in response.results] == ["regress", "classify"]
    assert regression.model_spec.version.value == 1


def test_multi_inference_predict_task_is_unimplemented(predictions):
    request = multi_request(("multi", "classify", PREDICT), examples=[x_example([1, 2])])

    error = rpc_error(predictions.MultiInference, request)

    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error.details() == f"Unsupported signature method_name: {PREDICT}"


def test_multi_inference_tasks_must_name_the_same_model(predictions):
    request = multi_request(
        ("multi", "classify", CLASSIFY), ("clf", "serving_default", CLASSIFY),
        examples=[x_example([1, 2])],
    )

    error = rpc_error(predictions.MultiInference, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "All ModelSpecs in a MultiInferenceRequest must access the same model name."
    )


def test_multi_inference_duplicate_signature_is_invalid_argument(predictions):
    request = multi_request(
        ("multi", "classify", CLASSIFY), ("multi", "classify", CLASSIFY),
        examples=[x_example([1, 2])],
    )

    error = rpc_error(predictions.MultiInference, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Duplicate evaluation of signature: classify"


# ---------------------------------------------------------------- metadata, status


def test_get_model_metadata_is_the_saved_models_signature_def_map(predictions, keras_dir):
    expected = dict(read_saved_model(keras_dir).meta_graphs[0].signature_def)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "keras"

    response = predictions.GetModelMetadata(request, timeout=30)

    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    assert dict(signature_map.signature_def) == expected
    assert "__saved_model_init_op" in signature_map.signature_def
    assert (response.model_spec.name, response.model_spec.version.value) == ("keras", 1)


def test_get_model_metadata_rejects_other_fields(predictions):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["graph"])
    request.model_spec.name = "clf"

    error = rpc_error(predictions.GetModelMetadata, request)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "Metadata field graph is not supported"


def test_get_model_status_reports_the_loaded_version_available(models):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "reg"

    response = models.GetModelStatus(request, timeout=30)

    [status] = response.model_version_status
    assert (status.version, status.state) == (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)
    assert (status.status.error_code, status.status.error_message) == (0, "")


def test_get_model_status_unknown_model_is_not_found(models):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"

    error = rpc_error(models.GetModelStatus, request)

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Could not find any versions of model nope"


# ------------------------------------------------------------------------- warmup


def write_warmup(version_dir: str, logs) -> None:
    extra = os.path.join(version_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, "tf_serving_warmup_requests")) as writer:
        for log in logs:
            writer.write(log.SerializeToString())


def test_warmup_replays_classify_regress_and_multi_inference_logs(bases, model_copy):
    base = model_copy(bases["multi"])
    examples = [x_example([1, 2]), x_example([3, 4])]
    classify = prediction_log_pb2.PredictionLog()
    classify.classify_log.request.CopyFrom(classification_request("any", examples, "classify"))
    regress = prediction_log_pb2.PredictionLog()
    regress.regress_log.request.model_spec.signature_name = "regress"
    regress.regress_log.request.input.CopyFrom(classify.classify_log.request.input)
    multi = prediction_log_pb2.PredictionLog()
    multi.multi_inference_log.request.CopyFrom(
        multi_request(("any", "classify", CLASSIFY), ("any", "regress", REGRESS),
                      examples=examples)
    )
    write_warmup(os.path.join(base, "1"), [classify, regress, multi])

    # Raises if any replay fails.
    with running(model_name="m", model_base_path=base, port=0,
                 max_num_load_retries=0) as server:
        assert server.available_versions() == {"m": [1]}


def test_a_failing_classify_warmup_log_fails_the_load(bases, model_copy):
    base = model_copy(bases["multi"])
    classify = prediction_log_pb2.PredictionLog()
    classify.classify_log.request.CopyFrom(
        classification_request("any", [x_example([1, 2])], "nope")
    )
    write_warmup(os.path.join(base, "1"), [classify])

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, port=0,
                            max_num_load_retries=0))

    assert "INVALID_ARGUMENT: No signature was found with the name: nope" in str(info.value)
