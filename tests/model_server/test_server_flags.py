"""Issue 33: every tensorflow_model_server flag `serving-opt serve` accepts works as
upstream's or is refused at start-up: TFLite models, Prometheus metrics, the profiler
service, the gRPC health service, TF Text ops, upstream's bad-config wording, --version,
and the refusals."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import urllib.request  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import read_line, running, serve_command, serve_env, start_serve  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving_opt.cli import main as cli  # noqa: E402
from serving_opt.cli.commands import serve as serve_command_module  # noqa: E402
from serving_opt.model_server import ServerStartError, serve  # noqa: E402
from serving_opt.model_server.servable import with_custom_op_hint  # noqa: E402
from serving_opt.model_server.server import ServerOptions  # noqa: E402
from serving_opt.model_server.status import not_found  # noqa: E402


def _cli(args: list[str]) -> int:
    """``serving-opt ARGS`` in this process; its exit code (SIGTERM's handler restored)."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return cli.main(["serving-opt", *args])
    finally:
        signal.signal(signal.SIGTERM, previous)


READY = re.compile(r"AVAILABLE on 127\.0\.0\.1:(\d+), REST on 127\.0\.0\.1:(\d+) ")


def _scaler(factor: float):
    class Scale(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * factor}

    return Scale()


@pytest.fixture(scope="module")
def tflite_base(tmp_path_factory) -> str:
    """Version 1 holds a SavedModel computing 2x and, beside it, a model.tflite converted
    here from a function computing 3x: the answer says which one is served."""
    base = tmp_path_factory.mktemp("tflite") / "m"
    version = str(base / "1")
    saved = _scaler(2.0)
    tf.saved_model.save(saved, version, signatures={"serving_default": saved.serve})
    lite = _scaler(3.0)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [lite.serve.get_concrete_function()], lite)
    with open(os.path.join(version, "model.tflite"), "wb") as f:
        f.write(converter.convert())
    return str(base)


def _predict(address: str, name: str = "m", rows=((1.0, 2.0, 3.0),)):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(rows, np.float32)))
    with grpc.insecure_channel(address) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=30)
    return tf.make_ndarray(response.outputs["y"])


def _rest(port: int, method: str, path: str, body=None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ------------------------------------------------------------------ TFLite (in process)


def test_prefer_tflite_model_serves_model_tflite_with_its_signature_defs(tflite_base):
    with running(model_name="m", model_base_path=tflite_base, port=0,
                 prefer_tflite_model=True, num_tflite_pools=2,
                 max_num_load_retries=0) as server:
        np.testing.assert_allclose(_predict(server.address, rows=[[1, 2, 3], [0, 1, 0]]),
                                   [[3, 6, 9], [0, 3, 0]])
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "m"
        with grpc.insecure_channel(server.address) as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(
                channel).GetModelMetadata(request, timeout=30)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        reply.metadata["signature_def"].Unpack(signatures)
        signature = signatures.signature_def["serving_default"]
        assert list(signature.inputs) == ["x"] and list(signature.outputs) == ["y"]
        assert signature.method_name == "tensorflow/serving/predict"
    # Without the flag the same version is its SavedModel (2x).
    with running(model_name="m", model_base_path=tflite_base, port=0,
                 max_num_load_retries=0) as server:
        np.testing.assert_allclose(_predict(server.address), [[2, 4, 6]])


# ------------------------------------- one sandboxed CLI server: TFLite, metrics, profiler


def test_serve_cli_tflite_prometheus_profiler_and_health(tflite_base, tmp_path):
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text(
        'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }')
    process = start_serve(
        "--port=0", "--rest_api_port=-1", "--model_name=m", f"--model_base_path={tflite_base}",
        "--prefer_tflite_model", f"--monitoring_config_file={monitoring}",
        "--enable_grpc_healthcheck_service", "--max_num_load_retries=0")
    try:
        line = read_line(process, timeout=180)
        match = READY.search(line)
        assert match, line
        address, rest_port = f"127.0.0.1:{match[1]}", int(match[2])

        # TFLite through the sandbox, over gRPC and REST.
        np.testing.assert_allclose(_predict(address), [[3, 6, 9]])
        status, body = _rest(rest_port, "POST", "/v1/models/m:predict",
                             {"instances": [[1.0, 1.0, 1.0]]})
        assert status == 200 and json.loads(body)["predictions"] == [[3.0, 3.0, 3.0]], body
        with pytest.raises(grpc.RpcError) as missing:
            _predict(address, name="nope")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        # A real scrape: upstream's names, labels and histogram lines.
        status, page = _rest(rest_port, "GET", "/monitoring/prometheus/metrics")
        assert status == 200
        lines = page.splitlines()
        assert "# TYPE :tensorflow:serving:request_count counter" in lines
        assert ':tensorflow:serving:request_count{model_name="m",status="OK"} 2' in lines
        assert (':tensorflow:serving:request_count{model_name="nope",status="NOT_FOUND"} 1'
                in lines)
        assert "# TYPE :tensorflow:serving:request_latency histogram" in lines
        for api, entrypoint in (("Predict", "GRPC"), ("predict", "REST")):
            labels = f'model_name="m",API="{api}",entrypoint="{entrypoint}"'
            assert f':tensorflow:serving:request_latency_bucket{{{labels},le="10"}}' in page
            assert (f':tensorflow:serving:request_latency_bucket{{{labels},le="+Inf"}} 1'
                    in lines)
            assert f":tensorflow:serving:request_latency_count{{{labels}}} 1" in lines
        # Failed requests count, but have no latency (upstream records OK ones only).
        assert 'model_name="nope",API' not in page

        # A real profiler client call against the server's gRPC port.
        logdir = str(tmp_path / "profile")
        tf.profiler.experimental.client.trace(f"grpc://{address}", logdir, 300)
        traces = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        assert traces and os.path.getsize(traces[0]) > 0, os.listdir(logdir)

        # The standard gRPC health service.
        with grpc.insecure_channel(address) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            assert check(b"", timeout=10) == b"\x08\x01"  # SERVING
            assert check(b"\n\x11PredictionService", timeout=10) == b"\x08\x01"
            with pytest.raises(grpc.RpcError) as unknown:
                check(b"\n\x07Unknown", timeout=10)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    assert "warning" not in stderr.lower().replace("userwarning", ""), stderr[-2000:]


def test_serialization_as_tensor_content_answers_in_tensor_content(tflite_base):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2, 3]], np.float32)))
    for flag in (True, False):
        with running(model_name="m", model_base_path=tflite_base, port=0,
                     enable_serialization_as_tensor_content=flag,
                     max_num_load_retries=0) as server, grpc.insecure_channel(
                         server.address) as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                request, timeout=30)
        output = reply.outputs["y"]
        assert bool(output.tensor_content) is flag and bool(output.float_val) is not flag
        np.testing.assert_allclose(tf.make_ndarray(output), [[2, 4, 6]])


def test_force_allow_any_version_labels_for_unavailable_models(tflite_base, tmp_path):
    def config_with(labels: str):
        config = tmp_path / "models.config"
        config.write_text(
            f"model_config_list {{ config {{ name: 'm' base_path: '{tflite_base}' "
            f"model_platform: 'tensorflow' {labels} }} }}")
        return config

    # Only the label to a version that never loads: which of two labels a server checks
    # first (and whether version 1 has loaded by then) is not this test's business.
    refused = config_with("version_labels { key: 'next' value: 7 }")
    with pytest.raises(ServerStartError, match="Request to assign label to version 7"):
        serve(ServerOptions(model_config_file=str(refused), port=0, max_num_load_retries=0,
                            allow_version_labels_for_unavailable_models=False))
    config = config_with("version_labels { key: 'stable' value: 1 } "
                         "version_labels { key: 'next' value: 7 }")
    with running(model_config_file=str(config), port=0, max_num_load_retries=0,
                 force_allow_any_version_labels_for_unavailable_models=True) as server:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        request.model_spec.version_label = "next"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([1, 3], np.float32)))
        with grpc.insecure_channel(server.address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as missing:
                stub.Predict(request, timeout=30)
            assert missing.value.details() == "Servable not found for request: Specific(m, 7)"
            request.model_spec.version_label = "stable"
            assert stub.Predict(request, timeout=30).model_spec.version.value == 1


def test_profiler_and_health_are_off_when_disabled(tflite_base):
    with running(model_name="m", model_base_path=tflite_base, port=0, enable_profiler=False,
                 max_num_load_retries=0) as server, grpc.insecure_channel(
                     server.address) as channel:
        for method in ("/tensorflow.ProfilerService/Profile", "/grpc.health.v1.Health/Check"):
            with pytest.raises(grpc.RpcError) as off:
                channel.unary_unary(method)(b"", timeout=10)
            assert off.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_prometheus_page_is_404_unless_enabled(tflite_base, tmp_path):
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text("prometheus_config { enable: false }")
    with running(model_name="m", model_base_path=tflite_base, port=0, rest_api_port=-1,
                 monitoring_config_file=str(monitoring), max_num_load_retries=0) as server:
        assert _rest(server.rest_port, "GET", "/monitoring/prometheus/metrics")[0] == 404
    monitoring.write_text("prometheus_config { enable: yes_please }")
    with pytest.raises(ServerStartError, match="Error parsing text-format "
                       "tensorflow.serving.MonitoringConfig"):
        serve(ServerOptions(model_name="m", model_base_path=tflite_base, port=0,
                            rest_api_port=-1, monitoring_config_file=str(monitoring),
                            max_num_load_retries=0))


# -------------------------------------------------------------------------- TF Text ops

def test_a_model_with_tf_text_ops_loads_and_answers(tmp_path):
    # `make venv` installs the `text` extra: a missing package fails here, not a skip.
    import tensorflow_text as text

    class Tokens(tf.Module):
        def __init__(self):
            self.tokenizer = text.WhitespaceTokenizer()

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
        def serve(self, sentences):
            return {"num_tokens": self.tokenizer.tokenize(sentences).row_lengths()}

    model = Tokens()
    base = tmp_path / "text"
    tf.saved_model.save(model, str(base / "1"), signatures={"serving_default": model.serve})
    graph_ops = {n.op for f in tf.saved_model.load(str(base / "1")).signatures[
        "serving_default"].graph.as_graph_def().library.function for n in f.node_def}
    assert any(op.startswith("TFText>") for op in graph_ops), graph_ops
    # Through the sandboxed CLI, as users run it.
    process = start_serve("--port=0", "--model_name=t", f"--model_base_path={base}",
                          "--max_num_load_retries=0")
    try:
        line = read_line(process, timeout=180)
        match = re.search(r"AVAILABLE on (127\.0\.0\.1:\d+) ", line)
        assert match, line
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "t"
        request.inputs["sentences"].CopyFrom(tf.make_tensor_proto([b"a b c", b"hello"]))
        with grpc.insecure_channel(match[1]) as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                request, timeout=30)
        assert tf.make_ndarray(reply.outputs["num_tokens"]).tolist() == [3, 1]
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_an_unregistered_op_names_the_package_to_install(monkeypatch):
    real = importlib.util.find_spec
    error = not_found("Op type not registered 'ConstrainedSequence' in binary running on x.")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow_text" else real(name, *a))
    hinted = with_custom_op_hint(error)
    assert hinted.code == error.code
    assert hinted.message.startswith(error.message)
    assert "install the `tensorflow-text` package" in hinted.message
    # Other load errors are left alone.
    assert with_custom_op_hint(not_found("elsewhere")).message == "elsewhere"


# ------------------------------------------- start-up: wording, --version, refusals


def test_a_bad_model_config_file_says_upstreams_words(tmp_path, capsys):
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { name: 'm' no_such_field: 1 } }")
    # Through the CLI (sandboxed, the default: the host reads the config to bind paths).
    assert _cli(["serve", "--port=0", f"--model_config_file={bad}"]) == 1
    assert ("Error parsing text-format tensorflow.serving.ModelServerConfig"
            in capsys.readouterr().err)
    with pytest.raises(ServerStartError, match="Error parsing text-format "
                       "tensorflow.serving.ModelServerConfig"):
        serve(ServerOptions(model_config_file=str(bad), port=0))


def test_version_prints_upstreams_two_lines(capsys):
    assert _cli(["serve", "--version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("TensorFlow ModelServer: ") and "stand-in" in out[0]
    assert out[1] == f"TensorFlow Library: {tf.__version__}"


def test_help_says_upstream_listens_on_all_interfaces(capsys):
    assert _cli(["serve", "--help"]) == 0
    assert "listens on all interfaces" in capsys.readouterr().out


_NON_DEFAULT = {bool: "true", int: "2", float: "0.5", str: "/etc/some.config"}


@pytest.mark.parametrize("kind,name,default,missing", serve_command_module.REFUSED_FLAGS,
                         ids=[f[1] for f in serve_command_module.REFUSED_FLAGS])
def test_unimplemented_flags_are_usage_errors_at_start_up(kind, name, default, missing,
                                                         capsys):
    value = _NON_DEFAULT[kind]
    assert _cli(["serve", "--model_base_path=/nonexistent/m", f"--{name}={value}"]) == 2
    err = capsys.readouterr().err
    assert f"--{name} is not implemented by serving-opt serve" in err and missing in err, err
    # At upstream's default it changes nothing, so it is accepted (past the flag checks).
    assert _cli(["serve", "--model_base_path=relative/m", f"--{name}={default}"]) == 2
    assert "is relative" in capsys.readouterr().err


def test_mixed_precision_other_than_bfloat16_is_refused(capsys):
    assert _cli(["serve", "--model_base_path=/m", "--mixed_precision=float16"]) == 2
    assert "the only mode is bfloat16" in capsys.readouterr().err


def test_tflite_with_batching_is_refused(capsys):
    assert _cli(["serve", "--model_base_path=/m", "--prefer_tflite_model",
                    "--enable_batching"]) == 2
    assert "no batching of TFLite models" in capsys.readouterr().err


def test_session_flags_build_upstreams_session_config(tmp_path):
    from serving_opt.model_server.server import grpc_channel_arguments, session_config_of

    config_file = tmp_path / "session.config"
    config_file.write_text("allow_soft_placement: true intra_op_parallelism_threads: 7")
    config = session_config_of(ServerOptions(tensorflow_session_config_file=str(config_file),
                                             tensorflow_session_parallelism=3))
    assert config.allow_soft_placement
    assert (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads) == (3, 3)
    config = session_config_of(ServerOptions(tensorflow_intra_op_parallelism=1,
                                             tensorflow_session_parallelism=3))
    assert (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads) == (1, 0)
    assert session_config_of(ServerOptions()) is None
    with pytest.raises(Exception, match="You cannot configure all"):
        session_config_of(ServerOptions(tensorflow_intra_op_parallelism=1,
                                        tensorflow_inter_op_parallelism=1,
                                        tensorflow_session_parallelism=1))
    config = session_config_of(ServerOptions(mixed_precision="bfloat16"))
    assert config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 == 1  # ON
    assert grpc_channel_arguments("grpc.max_connection_age_ms=1000,grpc.x=abc") == [
        ("grpc.max_connection_age_ms", 1000), ("grpc.x", "abc")]


def test_serve_cli_refuses_before_loading_anything():
    # The sandboxed CLI as users run it: a refused flag is exit code 2, one line.
    process = subprocess.run(
        serve_command("--port=0", "--model_base_path=/nonexistent/m", "--use_alts_credentials"),
        capture_output=True, text=True, timeout=120, env=serve_env())
    assert process.returncode == 2
    assert "no ALTS" in process.stderr
