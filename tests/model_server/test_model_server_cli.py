"""`serving-opt serve` as users run it: a subprocess, a ready line, requests, SIGTERM."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time

import grpc
import pytest
from local_server import read_line, start_serve
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from serving_opt import samples

READY = re.compile(r"^serving-opt serve: model 'm' version 1 AVAILABLE on 127\.0\.0\.1:(\d+) ")


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def test_serve_prints_one_ready_line_answers_and_exits_cleanly_on_sigterm(
    processes, classifier_base
):
    process = start_serve("--port=0", "--model_name=m", f"--model_base_path={classifier_base}")
    processes.append(process)

    line = read_line(process, timeout=120)
    match = READY.match(line)
    assert match, f"no ready line; got {line!r}; stderr: {process.stderr.read()[-2000:]}"
    with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m"}), timeout=30
        )
        request = classification_pb2.ClassificationRequest(model_spec={"name": "m"})
        for serialized in samples.sample_examples(2):
            request.input.example_list.examples.add().ParseFromString(serialized)
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(
            request, timeout=30
        )
    process.send_signal(signal.SIGTERM)
    returncode = process.wait(timeout=60)

    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert len(reply.result.classifications) == 2
    assert returncode == 0
    assert process.stdout.read() == ""  # exactly one line on stdout


def test_serve_exits_non_zero_when_the_model_does_not_load(processes, model_copy, classifier_base):
    base = model_copy(classifier_base)
    with open(os.path.join(base, "1", "saved_model.pb"), "wb") as f:
        f.write(b"\x0fgarbage")
    process = start_serve(
        "--port=0", "--model_name=m", f"--model_base_path={base}", "--max_num_load_retries=0"
    )
    processes.append(process)

    stdout, stderr = process.communicate(timeout=120)

    assert process.returncode == 1
    assert stdout == ""
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("serving-opt serve: error: Failed to start server. Error: UNKNOWN: ")
    assert f"Can't parse {base}/1/saved_model.pb as binary proto" in last


def _serve_in_process(capsys, monkeypatch, *flags: str) -> tuple[int, str]:
    """`serving-opt serve` run by the CLI's main here, for flag checks that refuse before
    any server starts (one that started would be a failure, not a hang). The exit codes
    of the process itself are the tests above."""
    from serving_opt.cli import main as cli
    from serving_opt.cli.commands import serve

    def started(*args):
        raise AssertionError("a server was started")

    monkeypatch.setattr(serve, "_serve_sandboxed", started)
    monkeypatch.setattr(serve, "_log_to_stderr", started)
    code = cli.main(["serving-opt", "serve", *flags])
    return code, capsys.readouterr().err


def test_serve_refuses_a_rest_port_equal_to_the_grpc_port_with_a_usage_error(capsys,
                                                                             monkeypatch):
    code, stderr = _serve_in_process(capsys, monkeypatch, "--port=8500", "--rest_api_port=8500",
                                     "--model_base_path=/models/m")
    assert code == 2
    assert "--rest_api_port=8500 is the same as --port" in stderr


def test_serve_refuses_a_relative_base_path_like_tf_serving(capsys, monkeypatch):
    code, stderr = _serve_in_process(capsys, monkeypatch, "--model_base_path=models/m")
    assert code == 2
    assert "is relative; TF Serving requires an absolute path" in stderr


def wait_for_stderr(process: subprocess.Popen, text: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if selector.select(1.0) and text in process.stderr.readline():
                return True
        return False
    finally:
        selector.close()


def test_serve_stops_on_sigterm_while_still_waiting_for_a_first_version(processes, tmp_path):
    empty_base = tmp_path / "m"
    empty_base.mkdir()  # no version directory yet: the real server waits, and so do we
    process = start_serve("--port=0", f"--model_base_path={empty_base}")
    processes.append(process)
    assert wait_for_stderr(process, "No versions of servable default found", timeout=120)

    process.send_signal(signal.SIGTERM)
    returncode = process.wait(timeout=60)

    assert returncode == 128 + signal.SIGTERM
    assert process.stdout.read() == ""  # never announced ready


def test_serve_with_onednn_refuses_a_wrongly_ranked_input_and_keeps_serving(
    processes, convnet_base
):
    # With oneDNN's kernels, a [16, 16, 3] image fails a CHECK in the convolution and
    # aborts the whole server (on AVX-512 CPUs); the server must refuse it and go on.
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    process = start_serve("--port=0", "--model_name=m", f"--model_base_path={convnet_base}",
                          env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    processes.append(process)
    match = READY.match(read_line(process, timeout=120))
    assert match, f"no ready line; stderr: {process.stderr.read()[-2000:]}"

    def predict(stub, images):
        request = predict_pb2.PredictRequest(model_spec={"name": "m"})
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        return stub.Predict(request, timeout=30)

    with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            predict(stub, np.ones((16, 16, 3), np.float32))
        answered = predict(stub, np.ones((1, 16, 16, 3), np.float32))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "images:0 must be 4-dimensional, not [16,16,3]" in refused.value.details()
    assert [d.size for d in answered.outputs["scores"].tensor_shape.dim] == [1, 4]
    assert process.poll() is None
