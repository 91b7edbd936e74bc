"""The local server's REST API answers like its gRPC API and like TF Serving's REST API.

Real HTTP over loopback (urllib) against a real server serving real models; every REST
answer is compared with the gRPC answer of the same server on the same inputs, and with
the model's own answer, computed here by TensorFlow's session loader with no server code
at all (so a bug that both of the server's paths share still fails).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import base64  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from local_server import (  # noqa: E402
    running,
    serve_command,
    serve_env,
    start_serve,
    write_model_config,
)
from polling import wait_until
from saved_model_io import save_tf1  # noqa: E402
from tensorflow.core.example import example_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving_opt import samples  # noqa: E402
from serving_opt.model_server import ServerOptions, ServerStartError, serve  # noqa: E402
from serving_opt.model_server.json_codec import decimal  # noqa: E402

MODELS = ("classifier", "regressor", "convnet", "multihead", "strings")


def build_strings(export_dir: str) -> str:
    """String in/out: ``_bytes`` names, and a signature whose outputs differ in batch."""
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        text = v1.placeholder(tf.string, [None], name="text")
        same = tf.identity(text, name="same")
        first = tf.identity(text[:1], name="first")
        lengths = tf.strings.length(text, name="lengths")
        return save_tf1(graph, export_dir, {
            "serving_default": sigs.predict_signature_def(
                {"text_bytes": text},
                {"out_bytes": same, "out": same, "lengths": lengths},
            ),
            "mismatch": sigs.predict_signature_def(
                {"text": text}, {"all": same, "first": first}
            ),
        })


@pytest.fixture(scope="module")
def bases(classifier_base, regressor_base, convnet_base, multihead_base, tmp_path_factory):
    strings = str(tmp_path_factory.mktemp("strings"))
    build_strings(os.path.join(strings, "1"))
    return {
        "classifier": classifier_base,
        "regressor": regressor_base,
        "convnet": convnet_base,
        "multihead": multihead_base,
        "strings": strings,
    }


@pytest.fixture(scope="module")
def server(bases, tmp_path_factory):
    config = write_model_config(str(tmp_path_factory.mktemp("config") / "models.config"),
                                bases)
    with running(model_config_file=config, port=0, rest_api_port=None) as server:
        yield server


@pytest.fixture(scope="module")
def stubs(server):
    channel = grpc.insecure_channel(server.address)
    yield (
        prediction_service_pb2_grpc.PredictionServiceStub(channel),
        model_service_pb2_grpc.ModelServiceStub(channel),
    )
    channel.close()


def http(server_or_port, method: str, path: str, body=None) -> tuple[int, str, dict]:
    port = server_or_port if isinstance(server_or_port, int) else server_or_port.rest_port
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            # Like TF Serving, non-_bytes strings are written raw, UTF-8 or not.
            return (reply.status, reply.read().decode("utf-8", "surrogateescape"),
                    dict(reply.headers))
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "surrogateescape"), dict(e.headers)


def rest_json(server, method: str, path: str, body=None):
    status, text, headers = http(server, method, path, body)
    assert status == 200, text
    assert headers["Content-Type"] == "application/json"
    return json.loads(text)


def session_answers(model_base: str, signature: str, feeds: dict) -> dict:
    """``signature``'s outputs for ``feeds`` (alias -> value) from version 1 of the model,
    loaded by tf.compat.v1's SavedModel loader into a session of this test."""
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        with graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(
                sess, ["serve"], os.path.join(model_base, "1"))
        sig = meta_graph.signature_def[signature]
        return sess.run({alias: info.name for alias, info in sig.outputs.items()},
                        {sig.inputs[alias].name: value for alias, value in feeds.items()})


def assert_floats_match(got, want) -> None:
    """float32 answers of the same graph in two sessions: equal to a few ulps."""
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-6, atol=1e-7)


def grpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=60)
    return info.value


def tensor(proto) -> np.ndarray:
    return tf.make_ndarray(proto)


def example_json(serialized: bytes) -> dict:
    """A tf.Example as the REST API's feature dict (floats stay JSON floats)."""
    example = example_pb2.Example.FromString(serialized)
    features = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            features[name] = [v.decode() for v in feature.bytes_list.value]
        elif kind == "int64_list":
            features[name] = list(feature.int64_list.value)
        else:
            features[name] = [float(v) for v in feature.float_list.value]
    return features


# ----------------------------------------------------------------------------- status


def test_status_matches_grpc_get_model_status(server, stubs):
    _, models = stubs
    for path, spec in [
        ("/v1/models/convnet", {"name": "convnet"}),
        ("/v1/models/convnet/versions/1", {"name": "convnet", "version": 1}),
    ]:
        body = rest_json(server, "GET", path)
        request = get_model_status_pb2.GetModelStatusRequest()
        json_format.ParseDict({"model_spec": spec}, request)
        reply = models.GetModelStatus(request, timeout=30)
        assert body == json_format.MessageToDict(
            reply, always_print_fields_with_no_presence=True
        )
        assert body["model_version_status"] == [
            {"version": "1", "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}
        ]


def test_metadata_matches_grpc_get_model_metadata(server, stubs):
    predictions, _ = stubs
    for name in MODELS:
        body = rest_json(server, "GET", f"/v1/models/{name}/metadata")
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = name
        reply = predictions.GetModelMetadata(request, timeout=30)
        expected = get_model_metadata_pb2.SignatureDefMap()
        reply.metadata["signature_def"].Unpack(expected)
        got = json_format.ParseDict(body["metadata"]["signature_def"],
                                    get_model_metadata_pb2.SignatureDefMap())
        assert got == expected
        assert body["model_spec"] == {"name": name, "version": "1", "signature_name": ""}


# ----------------------------------------------------------------------------- predict


def convnet_images(count: int) -> np.ndarray:
    return np.random.default_rng(0).random((count, 16, 16, 3), np.float32)


def grpc_predict(stubs, name: str, inputs: dict, signature: str = "") -> dict:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    reply = stubs[0].Predict(request, timeout=60)
    return {alias: tensor(proto) for alias, proto in reply.outputs.items()}


def test_predict_row_and_columnar_formats_give_the_grpc_answers(server, stubs, bases):
    images = convnet_images(3)
    expected = grpc_predict(stubs, "convnet", {"images": images})
    direct = session_answers(bases["convnet"], "serving_default", {"images": images})
    assert expected["label"].tolist() == direct["label"].tolist()
    assert_floats_match(expected["scores"], direct["scores"])

    rows = rest_json(server, "POST", "/v1/models/convnet:predict",
                     {"instances": images.tolist()})["predictions"]
    columns = rest_json(server, "POST", "/v1/models/convnet/versions/1:predict",
                        {"signature_name": "serving_default",
                         "inputs": {"images": images.tolist()}})["outputs"]

    assert [row["label"] for row in rows] == expected["label"].tolist()  # int64: integers
    # JSON floats are written so that they read back as the same float32.
    np.testing.assert_array_equal(
        np.array([row["scores"] for row in rows], np.float32), expected["scores"]
    )
    assert columns["label"] == expected["label"].tolist()
    np.testing.assert_array_equal(np.array(columns["scores"], np.float32), expected["scores"])


def test_predict_with_b64_examples_gives_the_grpc_answers(server, stubs, bases):
    examples = samples.sample_examples(4)
    expected = grpc_predict(stubs, "classifier", {"examples": np.array(examples, object)},
                            signature="predict")
    direct = session_answers(bases["classifier"], "predict",
                             {"examples": np.array(examples, object)})
    np.testing.assert_array_equal(expected["class_ids"], direct["class_ids"])
    for name in ("probabilities", "logits"):
        assert_floats_match(expected[name], direct[name])

    body = rest_json(server, "POST", "/v1/models/classifier:predict", {
        "signature_name": "predict",
        "instances": [{"b64": base64.b64encode(e).decode()} for e in examples],
    })

    for name in ("probabilities", "logits", "class_ids"):
        got = np.array([row[name] for row in body["predictions"]])
        np.testing.assert_array_equal(got.astype(expected[name].dtype), expected[name])


def test_bytes_outputs_come_back_as_b64_and_other_strings_raw(server, stubs, bases):
    texts = [b"\xff\x00binary", b"plain"]
    expected = grpc_predict(stubs, "strings", {"text_bytes": np.array(texts, object)})
    direct = session_answers(bases["strings"], "serving_default",
                             {"text_bytes": np.array(texts, object)})
    assert expected["out_bytes"].tolist() == direct["out_bytes"].tolist() == texts

    _, raw, _ = http(server, "POST", "/v1/models/strings:predict",
                     {"instances": [{"b64": base64.b64encode(t).decode()} for t in texts]})
    status, text, _ = http(server, "POST", "/v1/models/strings:predict",
                           {"inputs": {"text_bytes": [{"b64": base64.b64encode(b"plain").decode()},
                                                      "as text"]}})
    assert status == 200, text
    columns = json.loads(text)["outputs"]
    both = np.array([b"plain", b"as text"], object)
    assert columns["lengths"] == session_answers(
        bases["strings"], "serving_default", {"text_bytes": both})["lengths"].tolist()
    assert columns == {
        "lengths": [5, 7],
        "out": ["plain", "as text"],
        "out_bytes": [{"b64": base64.b64encode(b"plain").decode()},
                      {"b64": base64.b64encode(b"as text").decode()}],
    }
    # Row format: the b64 answer decodes to the exact bytes gRPC returns; the same bytes
    # under a name without _bytes are written raw (not valid UTF-8), as upstream does.
    assert '"out": "\udcff\\u0000binary"' in raw
    start = raw.index('"out_bytes": ') + len('"out_bytes": ')
    first = json.loads(raw[start: raw.index("}", start) + 1])
    assert base64.b64decode(first["b64"]) == expected["out_bytes"][0]


def test_predict_float_encoding_follows_upstream():
    assert decimal(np.float32(0.1)).text == "0.1"
    assert decimal(np.float32(1.0)).text == "1.0"
    assert decimal(np.float32(9000000.0)).text == "9e+06"
    assert decimal(np.float32(1 / 3)).text == "0.333333343"
    assert decimal(1 / 3, double=True).text == "0.33333333333333331"
    assert [decimal(v).text for v in (np.nan, np.inf, -np.inf)] == [
        "NaN", "Infinity", "-Infinity"]


# ----------------------------------------------------------------------------- classify


def test_classify_and_regress_give_the_grpc_answers(server, stubs, bases):
    predictions, _ = stubs
    examples = samples.sample_examples(5)
    features = [example_json(e) for e in examples]
    serialized = {"inputs": np.array(examples, object)}
    for model, signature in [("classifier", ""), ("multihead", "classification")]:
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signature
        for e in examples:
            request.input.example_list.examples.add().ParseFromString(e)
        reply = predictions.Classify(request, timeout=60)
        body = {"examples": features}
        if signature:
            body["signature_name"] = signature
        results = rest_json(server, "POST", f"/v1/models/{model}:classify", body)["results"]
        assert [[label for label, _ in item] for item in results] == [
            [c.label for c in item.classes] for item in reply.result.classifications
        ]
        np.testing.assert_array_equal(
            np.array([[s for _, s in item] for item in results], np.float32),
            np.array([[c.score for c in item.classes]
                      for item in reply.result.classifications], np.float32),
        )
        direct = session_answers(bases[model], signature or "serving_default", serialized)
        assert [[label for label, _ in item] for item in results] == [
            [c.decode() for c in row] for row in direct["classes"]]
        assert_floats_match([[s for _, s in item] for item in results], direct["scores"])
    for model, signature in [("regressor", ""), ("multihead", "positive_score")]:
        request = regression_pb2.RegressionRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signature
        for e in examples:
            request.input.example_list.examples.add().ParseFromString(e)
        reply = predictions.Regress(request, timeout=60)
        body = {"examples": features, "signature_name": signature or "serving_default"}
        results = rest_json(server, "POST", f"/v1/models/{model}:regress", body)["results"]
        np.testing.assert_array_equal(
            np.array(results, np.float32),
            np.array([r.value for r in reply.result.regressions], np.float32),
        )
        direct = session_answers(bases[model], signature or "serving_default", serialized)
        assert_floats_match(results, direct["outputs"].reshape(-1))


def test_regress_with_a_context_merges_it_into_every_example(server):
    examples = [example_json(e) for e in samples.sample_examples(3)]
    city = {"city": examples[0].pop("city")}
    for e in examples[1:]:
        e.pop("city")
    with_context = rest_json(server, "POST", "/v1/models/regressor:regress",
                             {"context": city, "examples": examples})["results"]
    merged = rest_json(server, "POST", "/v1/models/regressor:regress",
                       {"examples": [{**e, **city} for e in examples]})["results"]
    assert with_context == merged


# ----------------------------------------------------------------------------- errors


def assert_error(server, method, path, body, status: int, message: str, exact=True):
    got_status, text, headers = http(server, method, path, body)
    assert got_status == status, text
    assert headers["Content-Type"] == "application/json"
    error = json.loads(text)
    assert list(error) == ["error"]
    if exact:
        assert error["error"] == message
    else:
        assert message in error["error"], error["error"]
    return error["error"]


def test_unknown_model_and_version_are_404_with_the_grpc_messages(server, stubs):
    predictions, models = stubs
    images = {"instances": convnet_images(1).tolist()}
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "nope"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(convnet_images(1)))
    error = grpc_error(predictions.Predict, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert_error(server, "POST", "/v1/models/nope:predict", images, 404, error.details())
    assert error.details() == "Servable not found for request: Latest(nope)"

    request.model_spec.name = "convnet"
    request.model_spec.version.value = 9
    error = grpc_error(predictions.Predict, request)
    assert_error(server, "POST", "/v1/models/convnet/versions/9:predict", images, 404,
                 error.details())
    assert error.details() == "Servable not found for request: Specific(convnet, 9)"

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "nope"
    error = grpc_error(models.GetModelStatus, status_request)
    assert_error(server, "GET", "/v1/models/nope", None, 404, error.details())
    assert_error(server, "GET", "/v1/models/convnet/versions/9", None, 404,
                 "Could not find version 9 of model convnet")


def test_bad_json_and_malformed_requests_are_400(server):
    assert_error(server, "POST", "/v1/models/convnet:predict", b"{bad", 400,
                 "JSON Parse error: Missing a name for object member. at offset: 1")
    assert_error(server, "POST", "/v1/models/convnet:predict", b"", 400,
                 "JSON Parse error: The document is empty")
    assert_error(server, "POST", "/v1/models/convnet:predict", b"[1]", 400,
                 "JSON Value: [1] Is not object")
    assert_error(server, "POST", "/v1/models/convnet:predict", {"x": 1}, 400,
                 "Missing 'inputs' or 'instances' key")
    assert_error(server, "GET", "/v1/models/convnet:predict", None, 400,
                 "Malformed request: GET /v1/models/convnet:predict")
    assert_error(server, "GET", "/v1/models", None, 400, "Missing model name in request.")
    assert_error(server, "POST", "/v1/models/convnet:predict",
                 {"instances": [[1.0], [[1.0]]]}, 400,
                 "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
                 "Expecting shape [1] but got: [1,1]")
    status, text, _ = http(server, "GET", "/not-v1", None)
    assert status == 404 and "Not Found" in text


def test_unknown_signature_is_400(server, stubs):
    assert_error(server, "POST", "/v1/models/convnet:predict",
                 {"signature_name": "nope", "instances": [[1.0]]}, 400,
                 'Serving signature name: "nope" not found in signature def')
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "classifier"
    request.model_spec.signature_name = "nope"
    request.input.example_list.examples.add()
    error = grpc_error(stubs[0].Classify, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_error(server, "POST", "/v1/models/classifier:classify",
                 {"signature_name": "nope", "examples": [{}]}, 400, error.details())


def test_row_format_needs_outputs_of_one_batch_size(server, stubs):
    expected = grpc_predict(stubs, "strings", {"text": np.array([b"a", b"b", b"c"], object)},
                            signature="mismatch")
    assert expected["all"].shape == (3,) and expected["first"].shape == (1,)

    assert_error(server, "POST", "/v1/models/strings:predict",
                 {"signature_name": "mismatch", "instances": ["a", "b", "c"]}, 400,
                 "Tensor name: first has inconsistent batch size: 1 expecting: 3")
    columns = rest_json(server, "POST", "/v1/models/strings:predict",
                        {"signature_name": "mismatch", "inputs": ["a", "b", "c"]})
    assert columns == {"outputs": {"all": ["a", "b", "c"], "first": ["a"]}}


def test_grpc_errors_are_truncated_at_1024_bytes_like_tf_serving(stubs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "convnet"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(convnet_images(1)))
    request.inputs["x" * 2000].CopyFrom(tf.make_tensor_proto(1.0))
    error = grpc_error(stubs[0].Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().endswith("...TRUNCATED")
    assert len(error.details()) == 1024 + len("...TRUNCATED")


# ----------------------------------------------------------------------------- loading


def test_a_session_bundle_directory_fails_with_the_upstream_message(tmp_path):
    base = tmp_path / "m"
    (base / "1").mkdir(parents=True)
    (base / "1" / "export.meta").write_bytes(b"")
    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=str(base), port=0,
                            max_num_load_retries=0, file_system_poll_wait_seconds=0))
    assert "UNIMPLEMENTED: Session Bundle is deprecated and removed." in str(info.value)


def available(running, name: str) -> bool:
    status, text, _ = http(running, "GET", f"/v1/models/{name}", None)
    return status == 200 and any(v["state"] == "AVAILABLE"
                                 for v in json.loads(text)["model_version_status"])


def test_config_file_polling_serves_a_model_added_to_the_file(bases, tmp_path):
    config = write_model_config(str(tmp_path / "models.config"),
                                {"convnet": bases["convnet"]})
    with running(model_config_file=config, port=0, rest_api_port=None,
                 model_config_file_poll_wait_seconds=0.5) as server:
        assert http(server, "GET", "/v1/models/regressor", None)[0] == 404
        write_model_config(config, {"convnet": bases["convnet"], "regressor": bases["regressor"]})
        # GetModelStatus answers 200 while the version is still loading: wait for AVAILABLE.
        wait_until(lambda: available(server, "regressor"), "the new model served",
                   interval=0.3)
        examples = [example_json(e) for e in samples.sample_examples(2)]
        assert len(rest_json(server, "POST", "/v1/models/regressor:regress",
                             {"examples": examples})["results"]) == 2


# ----------------------------------------------------------------------------- the CLI


def test_serve_cli_answers_rest_with_session_parallelism_and_batching(bases, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 8 } batch_timeout_micros { value: 1000 }")
    process = start_serve(
        "--port=0", "--rest_api_port=-1", "--model_name=reg",
        f"--model_base_path={bases['regressor']}",
        "--tensorflow_session_parallelism=2", "--enable_batching",
        f"--batching_parameters_file={batching}",
    )
    try:
        line = process.stdout.readline()
        assert ", REST on 127.0.0.1:" in line, line
        port = int(line.split(", REST on 127.0.0.1:")[1].split()[0])
        examples = [example_json(e) for e in samples.sample_examples(2)]
        assert len(rest_json(port, "POST", "/v1/models/reg:regress",
                             {"examples": examples})["results"]) == 2
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    # Every tensorflow_model_server flag works or is refused: no warnings any more.
    assert "warning" not in stderr, stderr


def test_serve_cli_refuses_an_invalid_batching_parameters_file(bases, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 8 } allowed_batch_sizes: 4")
    process = subprocess.run(
        serve_command("--port=0", f"--model_base_path={bases['regressor']}",
                      "--enable_batching", f"--batching_parameters_file={batching}"),
        capture_output=True, text=True, timeout=120, env=serve_env(),
    )
    assert process.returncode == 1
    assert ("Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
            "expected 8") in process.stderr
