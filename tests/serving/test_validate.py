"""Specification of `validate`: a real gRPC round trip, answers compared with a reference.

End to end with the local TF-Serving-compatible server (the real one cannot run
here). The Docker engine is the one thing these machines lack: the docker backend
is exercised with a stand-in `docker` executable on PATH that records its
arguments; that mock is named as such in each test that uses it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys

import pytest
from polling import wait_until

from serving_opt.options import MeasureOptions, ServingCheck
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.serving import backends
from serving_opt.serving.validate import ValidateOptions, validate, write_marker

# No load phase where its figures are not the subject (the load phase is asserted on the
# classifier and the regressor).
QUICK = ValidateOptions(serving=ServingCheck(server="local", concurrency=0))
# validate is the subject here, not the optimizer's measurements.
NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def _port_closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) != 0


@pytest.fixture(scope="module")
def optimized_with_validate(classifier_dir, tmp_path_factory):
    """The classifier optimized with --validate and warm-up records written, once for the
    module: (base, report, the base's entries right after the run). The tests that
    validate an optimized classifier use this base too."""
    base = str(tmp_path_factory.mktemp("served") / "clf")
    report = optimize(classifier_dir, base, OptimizeOptions(
        **NOT_MEASURED, validate=ValidateOptions(
            serving=ServingCheck(server="local", concurrency=2, duration=0.5, write_warmup=True))))
    return base, report, sorted(os.listdir(base))


@pytest.fixture(scope="module")
def optimized_classifier_base(optimized_with_validate):
    return optimized_with_validate[0]


@pytest.fixture(scope="module")
def classifier_validated(optimized_classifier_base, classifier_dir):
    """The optimized classifier validated against the original, with a load phase."""
    return validate(optimized_classifier_base,
                    ValidateOptions(
                        reference_dir=classifier_dir,
                        serving=ServingCheck(server="local", concurrency=4, duration=1.0)))


@pytest.mark.golden
def test_optimized_classifier_is_validated_against_the_original(classifier_validated):
    report = classifier_validated
    assert report.ok, report.failures
    names = [c.name for c in report.checks]
    assert "GetModelMetadata signature_def" in names
    assert "Classify serving_default" in names and "Predict predict" in names
    assert report.load_test.requests > 0 and report.load_test.errors == 0
    assert report.backend == "local" and "not TF Serving" in report.backend_note
    assert _port_closed(report.address)  # the server it started is gone


@pytest.fixture(scope="module")
def regressor_validated(regressor_dir, tmp_path_factory):
    """A copy of the regressor (validate writes its warm-up file into the version)
    validated with a short load phase, warm-up records written."""
    base = tmp_path_factory.mktemp("validated") / "reg"
    shutil.copytree(regressor_dir, base / "1")
    return validate(str(base), ValidateOptions(
        serving=ServingCheck(server="local", concurrency=2, duration=0.5, write_warmup=True)))


def test_regressor_gets_regress_requests(regressor_validated):
    report = regressor_validated
    assert report.ok, report.failures
    assert report.load_test.requests > 0 and report.load_test.errors == 0
    assert {"Regress regression", "Regress serving_default"} <= {c.name for c in report.checks}


def test_classify_and_regress_model_gets_multi_inference(multihead_base):
    report = validate(multihead_base, QUICK)
    assert report.ok, report.failures
    assert any(c.name.startswith("MultiInference") and c.ok for c in report.checks)


def test_keras_model_gets_predict(keras_base):
    report = validate(keras_base, QUICK)
    assert report.ok, report.failures
    assert "Predict serving_default" in {c.name for c in report.checks}


def _weights_doubled(model_dir: str, destination: str) -> str:
    """A copy of the model whose float weights are all doubled in its checkpoint."""
    import tensorflow as tf

    shutil.copytree(model_dir, destination)
    prefix = os.path.join(destination, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    values = [reader.get_tensor(n) for n in names]
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[v * 2 if v.dtype.kind == "f" else v for v in values])
    return destination


def test_wrong_answers_are_not_validated(regressor_dir, tmp_path):
    base = tmp_path / "wrong"
    _weights_doubled(regressor_dir, str(base / "1"))
    report = validate(str(base), ValidateOptions(
        reference_dir=regressor_dir, serving=ServingCheck(server="local", concurrency=0)))
    assert not report.ok
    failed = [c for c in report.checks if not c.ok]
    assert any(c.name.startswith("Predict") and "differ" in c.detail for c in failed)
    assert report.load_test is None  # no load phase on a model that answers wrong


def test_model_that_fails_to_load_ends_with_the_servers_error(classifier_dir, model_copy,
                                                               tmp_path):
    base = tmp_path / "broken"
    broken = model_copy(classifier_dir, "broken/1")
    os.remove(os.path.join(broken, "assets", "vocab.txt"))  # the init op will fail
    report = validate(str(base), ValidateOptions(
        reference_dir=classifier_dir, serving=ServingCheck(server="local", load_deadline=60)))
    assert not report.ok
    assert "failed to load" in report.failures[0] and "vocab.txt" in report.failures[0]
    assert _port_closed(report.address)


def test_marker_file_says_the_verdict_and_replaces_a_stale_one(classifier_validated,
                                                                tmp_path):
    report = classifier_validated
    (tmp_path / "NOT_VALIDATED").write_text("stale")
    path = write_marker(report, str(tmp_path))
    assert os.path.basename(path) == "VALIDATED"
    assert sorted(os.listdir(tmp_path)) == ["VALIDATED"]


def test_write_warmup_writes_records_the_server_replays(regressor_validated):
    report = regressor_validated
    assert report.ok, report.failures
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    kinds = []
    for record in tf.compat.v1.io.tf_record_iterator(report.warmup_file):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        kinds.append(log.WhichOneof("log_type"))
    assert kinds.count("predict_log") == 3 and kinds.count("regress_log") == 2


def test_optimize_with_validate_publishes_a_served_and_warmed_model(optimized_with_validate):
    _, report, entries = optimized_with_validate
    assert report.published and report.validation.ok
    assert entries == ["1"]  # no hidden serving base left behind
    assert os.path.exists(os.path.join(report.output_dir, "assets.extra",
                                       "tf_serving_warmup_requests"))
    assert report.validation.warmup_file.startswith(report.output_dir)


def _validate_cli(*flags: str) -> subprocess.CompletedProcess:
    """`serving-opt validate` run as `python -m serving_opt.cli` runs it; its stdout ends
    with the exit code and whether the process imported TensorFlow."""
    argv = ["serving-opt", "validate", *flags]
    code = ("import runpy, sys\n"
            f"sys.argv = {argv!r}\n"
            "try:\n    runpy.run_module('serving_opt.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, 'tensorflow' in sys.modules)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240)


def test_validate_cli_writes_report_and_marker_and_exits_zero(optimized_classifier_base,
                                                               tmp_path):
    out = tmp_path / "validation"
    # validate's own process checks the model statically and runs it only in its sandbox,
    # so it never imports TensorFlow (seconds and memory).
    result = _validate_cli(f"--model_base={optimized_classifier_base}", "--server=local",
                           "--concurrency=0", f"--report={out / 'report.json'}")
    assert result.stdout.split()[-2:] == ["0", "False"], result.stderr
    assert "VALIDATED" in result.stdout
    data = json.loads((out / "report.json").read_text())
    assert data["ok"] is True and data["backend"] == "local"
    assert os.path.exists(out / "VALIDATED")


# --- backends: command lines and process handling -------------------------------------

def _fake_executable(directory, name: str, script: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def test_docker_command_mounts_read_only_and_binds_loopback():
    spec = backends.ServerSpec(model_name="clf", model_base="/srv/models/clf",
                               image="tensorflow/serving:2.20.0")
    command = backends.docker_command(spec, 9123, "so-test")
    assert command[:2] == ["docker", "run"] and "--rm" in command
    assert "/srv/models/clf:/models/clf:ro" in command
    assert "127.0.0.1:9123:8500" in command
    assert "MODEL_NAME=clf" in command
    assert command[command.index("tensorflow/serving:2.20.0") - 1] == "MODEL_BASE_PATH=/models"


def test_binary_command_uses_tensorflow_model_server_flags():
    spec = backends.ServerSpec(model_name="clf", model_base="/srv/models/clf")
    command = backends.binary_command(spec, 9123, "/usr/bin/tensorflow_model_server")
    assert command[0] == "/usr/bin/tensorflow_model_server"
    assert {"--port=9123", "--model_name=clf", "--model_base_path=/srv/models/clf",
            "--rest_api_port=0"} <= set(command)


def test_auto_prefers_docker_then_binary_then_local(tmp_path, monkeypatch):
    # Mock: a `docker` stand-in; the real engine does not exist on these machines.
    bin_dir = str(tmp_path)
    monkeypatch.setenv("PATH", bin_dir)
    assert backends.resolve_backend("auto") == "local"
    _fake_executable(bin_dir, "tensorflow_model_server", "#!/bin/sh\nexit 0\n")
    assert backends.resolve_backend("auto") == "binary"
    _fake_executable(bin_dir, "docker", "#!/bin/sh\nexit 1\n")  # client only, no engine
    assert backends.resolve_backend("auto") == "binary"
    _fake_executable(bin_dir, "docker", "#!/bin/sh\necho 27.3.1\n")  # an engine answers
    assert backends.resolve_backend("auto") == "docker"


# The binary backend end to end (a stand-in tensorflow_model_server that hands its command
# line, unchanged, to `serving-opt serve`): tests/serving/test_validate_runtime.py::
# test_binary_backend_names_the_binary_and_the_version_it_reports.


def test_docker_backend_removes_its_container_on_stop(tmp_path, monkeypatch):
    # Mock: a `docker` stand-in that records calls; `run` blocks like a foreground container.
    calls = tmp_path / "calls.txt"
    bin_dir = str(tmp_path / "bin")
    os.makedirs(bin_dir)
    _fake_executable(bin_dir, "docker",
                     f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                     "if [ \"$1\" = run ]; then exec sleep 60; fi\n")
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    server = backends.make_server("docker", backends.ServerSpec("clf", str(tmp_path)))
    server.start()
    wait_until(lambda: calls.exists() and calls.read_text(), "the fake docker called")
    assert server.exit_code() is None
    server.stop(timeout=5)
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("run --rm --name serving-opt-")
    name = lines[0].split("--name ")[1].split()[0]
    assert f"rm -f {name}" in lines
    assert server.exit_code() is not None


def test_sigterm_during_validation_stops_the_server_it_started(regressor_base):
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_opt.cli", "validate", f"--model_base={regressor_base}",
         "--server=local", "--concurrency=2", "--duration=60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    address = None
    for line in process.stderr:
        if "starting the local server on " in line:
            address = line.split(" on ")[1].strip()
        if line.startswith("load phase"):
            break
    assert address, "validate never started a server"
    process.terminate()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted" in stderr
    assert _port_closed(address)


def test_validate_usage_errors_are_one_line_exit_1_before_any_tensorflow_import(tmp_path):
    """A missing model base is named in one line, exit 1, without importing TensorFlow
    (seconds of work)."""
    result = _validate_cli(f"--model_base={tmp_path / 'nope'}", "--server=local")
    assert result.stdout.split()[-2:] == ["1", "False"], result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("serving-opt validate: error:")
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
