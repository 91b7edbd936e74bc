"""Specification of issue 13 items 2-4: validate over REST, the target runtime, honest markers.

End to end with the local stand-in (`serving-opt serve`), which serves gRPC and REST from
one process. The "older TF Serving" is the TF 2.15 venv `make venv-tf215` builds
(.venv-tf215): it is handed to the runtime resolver (--serving_runtime_python /
$SERVING_OPT_RUNTIME_2_15), so no test downloads a TensorFlow.

Two stand-ins, named where used: a REST proxy that corrupts the numbers of Predict
answers (HTTP level only; gRPC stays right), and fake `tensorflow_model_server` /
`docker` executables for what the machines lack.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.optimizer import OptimizeOptions, optimize
from serving_opt.serving import backends, rest_client, runtime
from serving_opt.serving.markers import MARKER_OK, write_marker
from serving_opt.serving.validate import ValidateOptions, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY215 = os.path.join(ROOT, ".venv-tf215", "bin", "python")
needs_tf215 = pytest.mark.skipif(not os.path.exists(PY215),
                                 reason="needs the TF 2.15 venv (make venv-tf215)")
BOTH = ValidateOptions(server="local", concurrency=2, duration=0.5)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # Registries and runtimes go to a test directory, never the user's cache.
    monkeypatch.setenv(runtime.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv("SERVING_OPT_RUNTIME_2_15", raising=False)
    monkeypatch.delenv("SERVING_OPT_RUNTIME_2_20", raising=False)


# --- REST ---------------------------------------------------------------------------------

def test_validate_over_grpc_and_rest_passes_on_a_real_model(classifier_base, tmp_path):
    report = validate(classifier_base, BOTH)
    assert report.ok, report.failures
    names = {c.name for c in report.checks}
    assert {"model AVAILABLE", "REST model AVAILABLE", "GetModelMetadata signature_def",
            "REST metadata signature_def", "Classify serving_default",
            "REST Classify serving_default", "REST Predict predict"} <= names
    assert report.protocols == ("grpc", "rest") and report.rest_address
    assert report.load_test.errors == 0 and report.rest_load_test.requests > 0
    assert report.rest_load_test.errors == 0


def test_rest_only(regressor_base):
    report = validate(regressor_base, ValidateOptions(server="local", protocols=("rest",),
                                                      concurrency=1, duration=0.3))
    assert report.ok, report.failures
    assert all(c.name.startswith("REST ") for c in report.checks)
    assert report.load_test.requests > 0 and report.rest_load_test is None


class _CorruptingProxy:
    """Stand-in at the HTTP level: forwards to the server's REST port, doubles every number
    in Predict answers. Status, metadata and gRPC are untouched."""

    def __init__(self) -> None:
        self.target = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, body: bytes | None) -> None:
                request = urllib.request.Request(f"http://{proxy.target}{self.path}",
                                                 data=body, method=self.command)
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        code, data = answer.status, answer.read()
                except urllib.error.HTTPError as e:
                    code, data = e.code, e.read()
                if self.path.endswith(":predict") and code == 200:
                    data = re.sub(rb"(?<![\w.])(\d+\.\d+)",
                                  lambda m: repr(float(m.group(1)) * 2 + 1).encode(), data)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.http.server_address[1]}"


def test_a_wrong_rest_answer_fails_validation_while_grpc_is_right(regressor_base,
                                                                  monkeypatch):
    proxy = _CorruptingProxy()
    real = backends.ServerProcess.rest_address

    def through_proxy(self):
        proxy.target = real.fget(self)
        return proxy.address if proxy.target else None

    monkeypatch.setattr(backends.ServerProcess, "rest_address", property(through_proxy))
    try:
        report = validate(regressor_base, ValidateOptions(server="local", concurrency=0))
    finally:
        proxy.http.shutdown()
    assert not report.ok
    checks = {c.name: c for c in report.checks}
    assert checks["Predict serving_default"].ok and checks["model AVAILABLE"].ok
    assert checks["REST model AVAILABLE"].ok and checks["REST metadata signature_def"].ok
    bad = checks["REST Predict serving_default"]
    assert not bad.ok and "differ" in bad.detail
    assert any(f.startswith("REST Predict") for f in report.failures)


def test_rest_floats_round_trip_float32_exactly():
    # A float32 written with as few digits as round-trip (as the server does) comes back
    # bit for bit after JSON -> float64 -> float32.
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from serving_opt.serving.requests import Probe, _compare

    values = np.array([[0.1, 1 / 3, 1e-30, 12345.678]], dtype=np.float32)
    from tensorflow.core.protobuf import meta_graph_pb2

    signature = meta_graph_pb2.SignatureDef()
    signature.inputs["x"].dtype = tf.string.as_datatype_enum
    signature.outputs["y"].dtype = tf.float32.as_datatype_enum
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "m", "sig"
    request.model_spec.version.value = 1
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([b"\xff\x00"], dtype=object)))
    probe = Probe("Predict sig", "Predict", request, lambda r: "")
    rest = rest_client.to_rest(probe, {"sig": signature})
    body = json.loads(rest.body)
    assert rest.path == "m/versions/1:predict" and body["signature_name"] == "sig"
    assert body["inputs"]["x"] == [{"b64": "/wA="}]
    text = json.dumps({"outputs": [[float(f"{v:.9g}") for v in values[0]]]})
    response = rest.to_response(json.loads(text))
    got = tf.make_ndarray(response.outputs["y"])
    assert got.dtype == np.float32 and (got == values).all()
    assert _compare(values, got, 0.0, 0.0) == ""


def test_docker_and_binary_get_a_rest_port():
    spec = backends.ServerSpec(model_name="clf", model_base="/srv/models/clf")
    command = backends.docker_command(spec, 9123, "so-test", 9124)
    assert "127.0.0.1:9124:8501" in command and "127.0.0.1:9123:8500" in command
    assert "--rest_api_port=9124" in backends.binary_command(spec, 9123, "tms", 9124)
    assert "--rest_api_port=9124" in backends.local_command(spec, 9123, 9124)
    assert backends.DEFAULT_IMAGE == "tensorflow/serving:2.20.0"


def test_bad_protocols_are_a_usage_error(regressor_base):
    with pytest.raises(UsageError, match="--protocols"):
        validate(regressor_base, ValidateOptions(server="local", protocols=("http",)))


# --- the target runtime ---------------------------------------------------------------------

def _webp_model(export_dir: str) -> str:
    """A TF 2.21 model whose signature uses DecodeWebP, an op TF 2.15 does not have (found
    by diffing the two op registries)."""
    import tensorflow as tf

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image")])
        def serve(self, image):
            decoded = tf.map_fn(lambda b: tf.shape(tf.raw_ops.DecodeWebP(contents=b)),
                                image, fn_output_signature=tf.int32)
            return {"shape": decoded}

    module = Module()
    tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve})
    return export_dir


@needs_tf215
def test_optimize_refuses_an_op_the_target_runtime_lacks(tmp_path):
    model = _webp_model(str(tmp_path / "webp" / "1"))
    base = str(tmp_path / "out")
    with pytest.raises(ServingOptError) as raised:
        optimize(model, base, OptimizeOptions(
            benchmark_runs=0, cold_start=False, serving_version="2.15.1",
            serving_runtime_python=PY215))
    message = raised.value.problem
    assert "DecodeWebP" in message and "2.15.1" in message and "\n" not in message
    assert not os.path.exists(os.path.join(base, "1"))  # nothing published
    # The registry was dumped once by the 2.15 interpreter and cached beside its runtime.
    cached = os.path.join(runtime.runtime_dir("2.15.1"), "op_registry.json")
    registry = json.load(open(cached))
    assert registry["tensorflow"] == "2.15.1" and "MatMul" in registry["ops"]
    assert "DecodeWebP" not in registry["ops"]


@needs_tf215
def test_optimize_checks_against_the_target_and_says_so(regressor_dir, tmp_path):
    report = optimize(regressor_dir, str(tmp_path / "ok"), OptimizeOptions(
        benchmark_runs=0, cold_start=False, serving_version="2.15.1",
        serving_runtime_python=PY215))
    note = next(s.note for s in report.stages if s.name == "target_check")
    assert "TensorFlow 2.15.1" in note
    # Without --serving_version and no 2.20 runtime here: skipped, and the report says so.
    report = optimize(regressor_dir, str(tmp_path / "default"),
                      OptimizeOptions(benchmark_runs=0, cold_start=False))
    note = next(s.note for s in report.stages if s.name == "target_check")
    assert note.startswith("skipped") and "--serving_version=2.20.0" in note


def test_attr_unknown_to_the_target_is_refused():
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    node = graph.node.add(name="g", op="GatherNd")
    node.attr["bad_indices_policy"].s = b"IGNORE"
    node.attr["_class"].s = b"internal attrs are fine"
    registry = {"GatherNd": frozenset({"Tparams", "Tindices"})}
    with pytest.raises(ServingOptError, match="attr bad_indices_policy of op GatherNd"):
        runtime.check_graph(graph, registry, "2.15.1")
    del node.attr["bad_indices_policy"]
    assert runtime.check_graph(graph, registry, "2.15.1") == 1


@needs_tf215
def test_local_validation_under_the_tf215_runtime(regressor_base, tmp_path, monkeypatch):
    # The runtime given by variable, as CI would: no download.
    monkeypatch.setenv("SERVING_OPT_RUNTIME_2_15", PY215)
    report = validate(regressor_base, ValidateOptions(
        server="local", serving_version="2.15.1", protocols=("grpc", "rest"), concurrency=1,
        duration=0.3))
    assert report.ok, (report.failures, report.server_log_tail)
    assert report.tensorflow_version == "2.15.1"
    assert report.server == "local:serving-opt serve (stand-in) on TensorFlow 2.15.1"
    assert not report.runtime_note
    marker = write_marker(report, str(tmp_path / "m"))
    text = open(marker).read()
    assert os.path.basename(marker) == MARKER_OK
    assert "server: local:serving-opt serve (stand-in) on TensorFlow 2.15.1" in text
    assert "tensorflow: 2.15.1" in text and "tf_serving: no (stand-in)" in text


def test_a_runtime_of_the_wrong_version_is_refused():
    with pytest.raises(ServingOptError, match="runs TensorFlow 2.21"):
        runtime.resolve_runtime("2.15.1", python=sys.executable)


def test_the_current_interpreter_is_the_runtime_of_its_own_release():
    import tensorflow as tf

    found = runtime.resolve_runtime(tf.__version__)
    assert found.python == sys.executable and found.is_current


def test_installing_a_runtime_offline_fails_in_one_line(monkeypatch):
    # No package index reachable: pip is pointed at a closed port.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    lines = []
    with pytest.raises(ServingOptError) as raised:
        runtime.resolve_runtime("2.12.0", progress=lines.append)
    assert "tensorflow-cpu==2.12.0" in raised.value.problem
    assert "\n" not in raised.value.problem
    assert any("installing the TensorFlow 2.12.0 runtime" in line for line in lines)


# --- honest markers --------------------------------------------------------------------------

def test_marker_names_the_stand_in_and_its_tensorflow(regressor_base, tmp_path):
    import tensorflow as tf

    report = validate(regressor_base, ValidateOptions(server="local", concurrency=0))
    assert report.ok, report.failures
    assert report.server == f"local:serving-opt serve (stand-in) on TensorFlow {tf.__version__}"
    # No 2.20 runtime here: the stand-in ran this TensorFlow, and says so.
    assert "not the target TF Serving's 2.20" in report.runtime_note
    text = open(write_marker(report, str(tmp_path))).read()
    assert text.startswith(f"VALIDATED {report.model_name} version 1\n")
    assert f"tensorflow: {tf.__version__}" in text and "protocols: grpc,rest" in text
    assert "note: the stand-in ran TensorFlow" in text


def _fake_executable(directory, name: str, script: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def test_binary_backend_names_its_version(regressor_base, tmp_path, monkeypatch):
    # Stand-in tensorflow_model_server: answers --version like the real one, otherwise
    # hands its command line to `serving-opt serve`.
    bin_dir = str(tmp_path / "bin")
    os.makedirs(bin_dir)
    _fake_executable(bin_dir, "tensorflow_model_server",
                     "#!/bin/sh\nif [ \"$1\" = --version ]; then\n"
                     "echo 'TensorFlow ModelServer: 2.20.0-rc0+dev.sha.abc'\n"
                     "echo 'TensorFlow Library: 2.20.0'\nexit 0\nfi\n"
                     f"exec {sys.executable} -m serving_opt.cli serve \"$@\"\n")
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    report = validate(regressor_base, ValidateOptions(server="binary", concurrency=0))
    assert report.ok, report.failures
    binary = os.path.join(bin_dir, "tensorflow_model_server")
    assert report.server == f"binary:{binary} 2.20.0-rc0+dev.sha.abc"
    assert report.tensorflow_version == "2.20.0"
    assert "tf_serving: yes" in open(write_marker(report, str(tmp_path / "m"))).read()


def test_docker_backend_names_its_image():
    server = backends.make_server("docker", backends.ServerSpec("clf", "/srv/clf"))
    assert server.description == "docker:tensorflow/serving:2.20.0"
    assert server.tf_version == "2.20.0 (image tag)" and server.rest_port


def test_require_tf_serving_fails_when_only_the_stand_in_can_run(regressor_base, tmp_path,
                                                                 monkeypatch):
    # No Docker engine and no tensorflow_model_server here (environment.md).
    assert backends.resolve_backend("auto") == "local"
    with pytest.raises(ServingOptError, match="only the local stand-in") as raised:
        validate(regressor_base, ValidateOptions(require_server="tf_serving"))
    assert "\n" not in raised.value.problem
    with pytest.raises(UsageError, match="contradicts --server=local"):
        validate(regressor_base, ValidateOptions(server="local", require_server="tf_serving"))
    result = subprocess.run(
        [sys.executable, "-m", "serving_opt.cli", "validate", f"--model_base={regressor_base}",
         "--require_server=tf_serving", f"--report={tmp_path}/r.json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("serving-opt")]
    assert len(errors) == 1 and "--require_server=tf_serving" in errors[0]
    assert not os.path.exists(tmp_path / MARKER_OK)
