"""Specification of issue 13 items 2-4: validate over REST, the target runtime, honest markers.

End to end with the local stand-in (`serving-opt serve`), which serves gRPC and REST from
one process. The "older TF Serving" is the TF 2.15 venv `make venv-tf215` builds
(.venv-tf215): it is handed to the runtime resolver (--serving_runtime_python /
$SERVING_OPT_RUNTIME_2_15), so no test downloads a TensorFlow.

Two stand-ins, named where used: a REST proxy that corrupts the numbers of Predict
answers (HTTP level only; gRPC stays right), and fake `tensorflow_model_server` /
`docker` executables for what the machines lack. What the host has installed never
decides a result: the tests that depend on what is on PATH set PATH themselves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import types
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import repo_paths

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import MeasureOptions, ServingCheck, TargetOptions, TrustOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.serving import backends, rest_client, runtime
from serving_opt.serving.markers import MARKER_OK, write_marker
from serving_opt.serving.validate import ValidateOptions, validate

# realpath: under Bazel this file is a runfiles symlink; the venvs are beside the source.
ROOT = repo_paths.SOURCE_REPO
PY215 = os.path.join(ROOT, ".venv-tf215", "bin", "python")
needs_tf215 = pytest.mark.skipif(not os.path.exists(PY215),
                                 reason="needs the TF 2.15 venv (make venv-tf215)")
BOTH = ValidateOptions(serving=ServingCheck(server="local", concurrency=2, duration=0.5))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    # Registries and runtimes go to a test directory, never the user's cache.
    _private_env(monkeypatch, str(tmp_path / "cache"))


# --- REST ---------------------------------------------------------------------------------

def _private_env(monkeypatch, cache: str) -> None:
    monkeypatch.setenv(runtime.ENV_CACHE, cache)
    monkeypatch.delenv("SERVING_OPT_RUNTIME_2_15", raising=False)
    monkeypatch.delenv("SERVING_OPT_RUNTIME_2_20", raising=False)


@pytest.fixture(scope="module")
def classifier_validated(classifier_base, tmp_path_factory):
    """The classifier validated over gRPC and REST with a short load phase; module-scoped,
    so it sets the private cache itself (it is set up before the autouse fixture)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _private_env(monkeypatch, str(tmp_path_factory.mktemp("cache")))
        return validate(classifier_base, BOTH)


@pytest.mark.golden
def test_validate_over_grpc_and_rest_passes_on_a_real_model(classifier_validated):
    report = classifier_validated
    assert report.ok, report.failures
    names = {c.name for c in report.checks}
    assert {"model AVAILABLE", "REST model AVAILABLE", "GetModelMetadata signature_def",
            "REST metadata signature_def", "Classify serving_default",
            "REST Classify serving_default", "REST Predict predict"} <= names
    assert report.protocols == ("grpc", "rest") and report.rest_address
    assert report.load_test.errors == 0 and report.rest_load_test.requests > 0
    assert report.rest_load_test.errors == 0


def test_rest_only(regressor_base):
    report = validate(regressor_base, ValidateOptions(
        serving=ServingCheck(server="local", protocols=("rest",), concurrency=1, duration=0.3)))
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
                                                                  monkeypatch, unsandboxed):
    # The proxy sits between validate's client and the server, in this process: validate
    # must run here too, as it does where no sandbox can start (--allow_unsandboxed); a
    # sandboxed client has a network of its own that no proxy outside can reach.
    proxy = _CorruptingProxy()
    real = backends.ServerProcess.rest_address

    def through_proxy(self):
        proxy.target = real.fget(self)
        return proxy.address if proxy.target else None

    monkeypatch.setattr(backends.ServerProcess, "rest_address", property(through_proxy))
    try:
        report = validate(regressor_base, ValidateOptions(
            serving=ServingCheck(server="local", concurrency=0), trust=unsandboxed))
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


def test_the_default_image_is_the_release_the_target_check_assumes():
    # Without --image, docker serves DEFAULT_IMAGE; without --serving_version, optimize
    # checks ops against DEFAULT_SERVING_VERSION's registry: the same TF Serving release.
    spec = backends.ServerSpec(model_name="clf", model_base="/srv/models/clf")
    command = backends.docker_command(spec, 9123, "so-test", 9124)
    assert command[command.index("MODEL_BASE_PATH=/models") + 1] == backends.DEFAULT_IMAGE
    assert ValidateOptions().serving.image == backends.DEFAULT_IMAGE
    assert runtime.image_version(backends.DEFAULT_IMAGE) == runtime.DEFAULT_SERVING_VERSION


def test_bad_protocols_are_a_usage_error(regressor_base):
    with pytest.raises(UsageError, match="--protocols"):
        validate(regressor_base, ValidateOptions(
            serving=ServingCheck(server="local", protocols=("http",))))


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


@pytest.fixture(scope="module")
def tf215_cache(tmp_path_factory) -> str:
    """One private cache for the optimize runs that target 2.15: its op registry is
    dumped by the 2.15 interpreter (a TensorFlow import) once, for both."""
    return str(tmp_path_factory.mktemp("tf215_cache"))


@needs_tf215
def test_optimize_refuses_an_op_the_target_runtime_lacks(tmp_path, tf215_cache, monkeypatch):
    monkeypatch.setenv(runtime.ENV_CACHE, tf215_cache)
    model = _webp_model(str(tmp_path / "webp" / "1"))
    base = str(tmp_path / "out")
    with pytest.raises(ServingOptError) as raised:
        optimize(model, base, OptimizeOptions(
            measure=MeasureOptions(benchmark_runs=0, cold_start=False),
            target=TargetOptions(serving_version="2.15.1", serving_runtime_python=PY215)))
    message = raised.value.problem
    assert "DecodeWebP" in message and "2.15.1" in message and "\n" not in message
    assert not os.path.exists(os.path.join(base, "1"))  # nothing published
    # The registry was dumped once by the 2.15 interpreter and cached beside its runtime.
    cached = os.path.join(runtime.runtime_dir("2.15.1"), "op_registry.json")
    registry = json.load(open(cached))
    assert registry["tensorflow"] == "2.15.1" and "MatMul" in registry["ops"]
    assert "DecodeWebP" not in registry["ops"]


@needs_tf215
def test_optimize_checks_against_the_target_and_says_so(regressor_dir, tmp_path, unsandboxed,
                                                      tf215_cache, monkeypatch):
    monkeypatch.setenv(runtime.ENV_CACHE, tf215_cache)
    # In process: the sandboxed run of the same check is the refusal above.
    report = optimize(regressor_dir, str(tmp_path / "ok"), OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        target=TargetOptions(serving_version="2.15.1", serving_runtime_python=PY215),
        trust=unsandboxed))
    note = next(s.note for s in report.stages if s.name == "target_check")
    assert "TensorFlow 2.15.1" in note


def test_without_a_target_runtime_the_op_check_is_skipped_and_says_so():
    # Without --serving_version and no 2.20 runtime here (private cache, no variable):
    # the stages optimize runs, in process (the 2.15 run above shows the note reaches
    # the report).
    from serving_opt.pipeline import proving, worker
    from serving_opt.pipeline.run import Run

    run = Run("unused", "unused", OptimizeOptions())
    run.plan = types.SimpleNamespace(target=TargetOptions(), validate=None)
    worker.resolve_target(run, sandboxed=True)
    assert run.target_registry is None
    proving.check_target_runtime(run, None, "unused")
    note = next(s.note for s in run.stages if s.name == "target_check")
    assert note.startswith("skipped") and "--serving_version=2.20.0" in note


def test_the_op_check_follows_the_validating_images_release(regressor_dir, tmp_path):
    # --image=tensorflow/serving:<this TF>, no --serving_version: the ops are checked
    # against the release the container runs (here, this interpreter's), not the default.
    from serving_opt.pipeline import plan, worker
    from serving_opt.pipeline.run import Run

    this_tf = runtime.current_tf_version()
    options = OptimizeOptions(validate=ValidateOptions(serving=ServingCheck(
        server="local", image=f"tensorflow/serving:{this_tf}")))
    run = Run(regressor_dir, str(tmp_path / "out"), options)
    run.plan = plan.plan(regressor_dir, str(tmp_path / "out"), options)
    assert plan.target_version(run.plan) == this_tf
    worker.resolve_target(run, sandboxed=True)
    tf_version, source, registry = run.target_registry
    assert (tf_version, source) == (this_tf, "current interpreter") and "MatMul" in registry


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
        serving=ServingCheck(server="local",
                             protocols=("grpc", "rest"),
                             concurrency=1,
                             duration=0.3),
        target=TargetOptions(serving_version="2.15.1")))
    assert report.ok, (report.failures, report.server_log_tail)
    assert report.tensorflow_version == "2.15.1"
    assert report.server == "local:serving-opt serve (stand-in) on TensorFlow 2.15.1"
    assert not report.runtime_note
    marker = write_marker(report, str(tmp_path / "m"))
    text = open(marker).read()
    assert os.path.basename(marker) == MARKER_OK
    assert "server: local:serving-opt serve (stand-in) on TensorFlow 2.15.1" in text
    assert "tensorflow: 2.15.1" in text and "tf_serving: no (stand-in)" in text


def _another_release() -> str:
    """A TensorFlow release that is surely not this interpreter's (the next minor)."""
    import tensorflow as tf

    major, minor = tf.__version__.split(".")[:2]
    return f"{major}.{int(minor) + 1}.0"


def test_a_runtime_of_the_wrong_version_is_refused():
    import tensorflow as tf

    wanted = _another_release()
    with pytest.raises(ServingOptError,
                       match=re.escape(f"runs TensorFlow {tf.__version__}, not {wanted}")):
        runtime.resolve_runtime(wanted, python=sys.executable)


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
    wanted = _another_release()  # not this interpreter's: it must be installed
    with pytest.raises(ServingOptError) as raised:
        runtime.resolve_runtime(wanted, progress=lines.append)
    assert f"tensorflow-cpu=={wanted}" in raised.value.problem
    assert "\n" not in raised.value.problem
    assert any(f"installing the TensorFlow {wanted} runtime" in line for line in lines)


# --- honest markers --------------------------------------------------------------------------

def test_marker_names_the_stand_in_and_its_tensorflow(classifier_validated, tmp_path):
    import tensorflow as tf

    report = classifier_validated
    assert report.ok, report.failures
    assert report.server == f"local:serving-opt serve (stand-in) on TensorFlow {tf.__version__}"
    text = open(write_marker(report, str(tmp_path))).read()
    assert text.startswith(f"VALIDATED {report.model_name} version 1\n")
    assert f"tensorflow: {tf.__version__}" in text and "protocols: grpc,rest" in text
    assert "tf_serving: no (stand-in)" in text
    target = runtime.major_minor(runtime.DEFAULT_SERVING_VERSION)
    if runtime.major_minor(tf.__version__) != target:
        # No runtime of the target release here (private cache, no variable): the
        # stand-in ran this TensorFlow, and says so.
        assert f"not the target TF Serving's {target}" in report.runtime_note
        assert "note: the stand-in ran TensorFlow" in text


def _fake_executable(directory, name: str, script: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def _path_without_servers(tmp_path, *stand_ins: tuple[str, str]) -> str:
    """A PATH of one new directory: no docker, no tensorflow_model_server (whatever the
    host has), only the given stand-ins (name, script) and bubblewrap, which the sandbox
    needs (its absence would only change which error comes first)."""
    bin_dir = tmp_path / "path"
    bin_dir.mkdir()
    bwrap = shutil.which("bwrap")
    if bwrap:
        os.symlink(bwrap, bin_dir / "bwrap")
    for name, script in stand_ins:
        _fake_executable(str(bin_dir), name, script)
    return str(bin_dir)


# An engine that answers, has the image and a bridge network (`docker image inspect` and
# `docker network inspect bridge` succeed).
_DOCKER_ENGINE = ('#!/bin/sh\ncase "$1" in info) echo 27.0.1;; image|network) ;; *) exit 1;; '
                  'esac\n')
_VERSION_ONLY_BINARY = "#!/bin/sh\necho 'TensorFlow ModelServer: 2.20.0'\nexit 0\n"


def test_auto_picks_docker_then_the_binary_then_the_stand_in(tmp_path, monkeypatch):
    # Stand-ins for what this machine lacks: a `docker` client whose `docker info` names an
    # engine, and an executable named tensorflow_model_server. Neither is run to serve.
    monkeypatch.setenv("PATH", _path_without_servers(tmp_path))
    assert backends.resolve_backend("auto") == "local"
    both = tmp_path / "both"
    both.mkdir()
    monkeypatch.setenv("PATH", _path_without_servers(
        both, ("docker", _DOCKER_ENGINE), ("tensorflow_model_server", _VERSION_ONLY_BINARY)))
    assert backends.resolve_backend("auto") == "docker"
    # A sandboxed run cannot drive docker (the socket is root on the host).
    assert backends.resolve_backend("auto", sandboxed=True) == "binary"


def _port_closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) != 0


def test_binary_backend_names_the_binary_and_the_version_it_reports(regressor_base, tmp_path,
                                                                    monkeypatch):
    # Stand-in for the tensorflow_model_server this machine lacks: answers --version like
    # the real one, otherwise hands its command line, unchanged, to `serving-opt serve`:
    # the flags validate passes are TF Serving's, and the process handling works end to
    # end. What validate can truthfully say is which executable answered and what its
    # --version claimed; whether that is really TF Serving, nothing here can know.
    bin_dir = str(tmp_path / "bin")
    os.makedirs(bin_dir)
    _fake_executable(bin_dir, "tensorflow_model_server",
                     "#!/bin/sh\nif [ \"$1\" = --version ]; then\n"
                     "echo 'TensorFlow ModelServer: 2.20.0-rc0+dev.sha.abc'\n"
                     "echo 'TensorFlow Library: 2.20.0'\nexit 0\nfi\n"
                     f"exec {sys.executable} -m serving_opt.cli serve \"$@\"\n")
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    report = validate(regressor_base, ValidateOptions(
        serving=ServingCheck(server="binary", concurrency=0)))
    assert report.ok, report.failures
    assert report.backend == "binary" and _port_closed(report.address)
    binary = os.path.join(bin_dir, "tensorflow_model_server")
    assert report.server == f"binary:{binary} 2.20.0-rc0+dev.sha.abc"
    assert report.tensorflow_version == "2.20.0"
    text = open(write_marker(report, str(tmp_path / "m"))).read()
    assert f"server: binary:{binary} 2.20.0-rc0+dev.sha.abc\n" in text
    assert "tensorflow: 2.20.0\n" in text


def test_docker_backend_names_its_image():
    # Built, never started: no Docker engine is needed.
    server = backends.make_server("docker", backends.ServerSpec("clf", "/srv/clf"))
    assert server.description == f"docker:{backends.DEFAULT_IMAGE}" and server.rest_port
    older = backends.make_server("docker", backends.ServerSpec(
        "clf", "/srv/clf", image="tensorflow/serving:2.15.1-gpu"))
    assert older.description == "docker:tensorflow/serving:2.15.1-gpu"
    assert older.tf_version == "2.15.1 (image tag)"
    latest = backends.make_server("docker", backends.ServerSpec(
        "clf", "/srv/clf", image="tensorflow/serving:latest"))
    assert latest.tf_version == "unknown (image tag names no release)"


def test_require_tf_serving_fails_when_only_the_stand_in_can_run(regressor_base, tmp_path,
                                                                 monkeypatch):
    path = _path_without_servers(tmp_path)
    monkeypatch.setenv("PATH", path)
    options = ValidateOptions(
        serving=ServingCheck(require_server="tf_serving"),
        trust=TrustOptions(allow_unsandboxed=True))
    with pytest.raises(ServingOptError, match="only the local stand-in") as raised:
        validate(regressor_base, options)
    assert "\n" not in raised.value.problem
    with pytest.raises(UsageError, match="contradicts --server=local"):
        validate(regressor_base, ValidateOptions(
            serving=ServingCheck(server="local", require_server="tf_serving")))
    result = subprocess.run(
        [sys.executable, "-m", "serving_opt.cli", "validate", f"--model_base={regressor_base}",
         "--require_server=tf_serving", "--allow_unsandboxed", f"--report={tmp_path}/r.json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": path})
    assert result.returncode == 1
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("serving-opt")]
    assert len(errors) == 1 and "--require_server=tf_serving" in errors[0]
    assert not os.path.exists(tmp_path / MARKER_OK)


def test_require_tf_serving_accepts_a_binary_on_path(regressor_base, tmp_path, monkeypatch):
    # The same check passes once a tensorflow_model_server (a stand-in that serves
    # nothing: validation then fails on the server, not on --require_server) is on PATH.
    monkeypatch.setenv("PATH", _path_without_servers(
        tmp_path, ("tensorflow_model_server", "#!/bin/sh\nexit 1\n")))
    report = validate(regressor_base, ValidateOptions(
        serving=ServingCheck(require_server="tf_serving", concurrency=0, load_deadline=30),
        trust=TrustOptions(allow_unsandboxed=True)))
    assert report.backend == "binary" and not report.ok
