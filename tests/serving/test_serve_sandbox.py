"""``serving-opt serve`` runs the models in a sandbox (issue 30, item 5): the
``serving-opt serve`` command users run, as a subprocess, answering real gRPC and REST
requests on host ports, while the models it loads see no host file, no host network and
no host identity.

The hostile models are served with ``--allow_file_ops`` (the static check's opt-in), so
the sandbox alone stands in their way; tests/serving/test_serve_static_check.py shows the same
write is real in an unsandboxed server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest
from hostile_models import HOSTILE, canary_files, host_listener
from local_server import read_line, start_serve, stop_process

READY = "serving-opt serve: model"
QUICK = ("--port=0", "--model_name=m", "--max_num_load_retries=0",
         "--file_system_poll_wait_seconds=0")


def _ready(process: subprocess.Popen) -> str:
    line = read_line(process, timeout=300)
    assert line.startswith(READY), (line, process.stderr.read() if process.poll() else "")
    return line


def _address(line: str) -> str:
    return line.split(" AVAILABLE on ", 1)[1].split(",")[0].split(" ")[0]


def _rest_address(line: str) -> str:
    return line.split("REST on ", 1)[1].split(" ")[0].rstrip(",")


def _status(channel: grpc.Channel) -> int:
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "m"
    reply = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request,
                                                                            timeout=60)
    return reply.model_version_status[0].version


def _predict(address: str, inputs: dict, timeout: float = 60) -> dict:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(address) as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=timeout)
    return {k: tf.make_ndarray(v) for k, v in reply.outputs.items()}


@pytest.fixture(scope="module")
def served_classifier(classifier_base, tmp_path_factory) -> dict:
    """One ``serving-opt serve`` of the classifier on a host port, a REST port and a unix
    socket, asked over each, then stopped by SIGTERM: what it said and answered, for the
    tests below (one server start, not one per test)."""
    path = str(tmp_path_factory.mktemp("unix") / "grpc.sock")
    process = start_serve(*QUICK, f"--model_base_path={classifier_base}",
                          "--rest_api_port=-1", f"--grpc_socket_path={path}")
    seen = {"path": path}
    try:
        seen["line"] = line = _ready(process)
        with grpc.insecure_channel(_address(line)) as channel:
            seen["tcp_version"] = _status(channel)
        with urllib.request.urlopen(f"http://{_rest_address(line)}/v1/models/m",
                                    timeout=60) as reply:
            seen["rest_status"] = json.loads(reply.read())
        with grpc.insecure_channel(f"unix:{path}") as channel:
            seen["unix_version"] = _status(channel)
        process.send_signal(signal.SIGTERM)
        seen["exit_code"] = process.wait(timeout=120)
        seen["stderr"] = process.stderr.read()
    finally:
        stop_process(process)
    seen["socket_left"] = os.path.exists(path)
    return seen


@pytest.mark.golden
def test_serve_answers_grpc_and_rest_from_its_sandbox_and_stops_cleanly(served_classifier):
    seen = served_classifier
    assert "models sandboxed" in seen["line"]
    assert seen["tcp_version"] == 1
    assert seen["rest_status"]["model_version_status"][0]["state"] == "AVAILABLE"
    assert seen["exit_code"] == 0
    assert "stopped (SIGTERM)" in seen["stderr"]


def test_serve_on_a_unix_socket_too(served_classifier):
    seen = served_classifier
    assert f"unix:{seen['path']}" in seen["line"]
    assert seen["unix_version"] == 1
    assert not seen["socket_left"]


def test_a_busy_port_is_an_error_before_anything_loads(classifier_base):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "serving_opt.cli", "serve", "--model_name=m",
             f"--model_base_path={classifier_base}", f"--port={taken.getsockname()[1]}"],
            capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert done.returncode != 0
    assert "could not listen on 127.0.0.1:" in done.stderr
    assert "TensorFlow" not in done.stderr  # refused before any model work


def _served(tmp_path, route: str, *flags: str) -> tuple[subprocess.Popen, str]:
    canary = str(tmp_path / "host" / "canary")
    os.makedirs(os.path.dirname(canary), exist_ok=True)
    export_dir = HOSTILE[route].build(str(tmp_path / "models"), canary)
    process = start_serve(*QUICK, f"--model_base_path={os.path.dirname(export_dir)}",
                          "--allow_file_ops", *flags)
    return process, canary


def test_an_init_op_write_reaches_no_host_file(tmp_path):
    # The write succeeds, into the sandbox's private /tmp (WriteFile makes the missing
    # directories): the version loads, and the host's file is never made.
    process, canary = _served(tmp_path, "init_op_write")
    try:
        _ready(process)
        assert canary_files(canary) == []
    finally:
        stop_process(process)
    assert canary_files(canary) == []


def test_a_request_cannot_dial_a_host_listener(tmp_path):
    listener, address = host_listener()
    export_dir = HOSTILE["register_dataset"].build(str(tmp_path / "models"), "", address)
    process = start_serve(*QUICK, f"--model_base_path={os.path.dirname(export_dir)}",
                          "--allow_file_ops")
    try:
        line = _ready(process)
        # The op retries its dial for a minute or more; a connection it could make would
        # come at once (loopback), so 10 s of retrying without one is the answer. The
        # request must still be running then (DEADLINE_EXCEEDED): a refusal, a failed
        # load or a crashed sandbox would answer otherwise, and would prove nothing.
        # The control, test_sandbox.py's test_a_network_op_dials_a_host_socket_in_plain_
        # tensorflow, shows this model does dial the listener outside the sandbox.
        with pytest.raises(grpc.RpcError) as info:
            _predict(_address(line), {"x": [[1.0, 2.0, 3.0]]}, timeout=10)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing dialled the host
        assert process.poll() is None  # serve outlived the request
    finally:
        stop_process(process)
        listener.close()


def test_serve_refuses_without_bubblewrap_unless_told(classifier_base, tmp_path):
    # A PATH without bwrap: this machine as one where bubblewrap is not installed.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python3")
    env = {"PATH": str(bin_dir)}
    process = start_serve(*QUICK, f"--model_base_path={classifier_base}", env=env)
    try:
        code = process.wait(timeout=120)
        stderr = process.stderr.read()
    finally:
        stop_process(process)
    assert code != 0
    assert "cannot sandbox serve" in stderr and "--allow_unsandboxed" in stderr
    assert shutil.which("bwrap", path=str(bin_dir)) is None
    process = start_serve(*QUICK, f"--model_base_path={classifier_base}",
                          "--allow_unsandboxed", env=env)
    try:
        line = _ready(process)
        assert "models sandboxed" not in line
    finally:
        stop_process(process)


@pytest.mark.parametrize("value", ["-1", "1000"])
def test_a_sandbox_memory_limit_too_small_to_run_is_refused_before_any_work(value,
                                                                          classifier_base):
    done = subprocess.run(
        [sys.executable, "-m", "serving_opt.cli", "serve", "--model_name=m",
         f"--model_base_path={classifier_base}", f"--sandbox_memory_bytes={value}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--sandbox_memory_bytes={value} is below 268435456" in done.stderr
    assert "TensorFlow" not in done.stderr
