"""``serving-opt serve`` with two models: each in a sandbox of its own behind the host's
gRPC router and REST front end. One serve (two models, its descriptors lowered to 256, on
a unix socket path where a stale socket was left) answers every test here.

Model ``reader`` returns the bytes of the file its ``path`` input names (served with
``--allow_file_ops``, so only the sandbox stands in its way); model ``m`` is the
classifier.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from local_server import read_line, serve_command, serve_env, stop_process, write_model_config

NOFILE = 256
IDLE_CONNECTIONS = 300  # per port: more than the limits (64 and 32 here) and than NOFILE


def build_reader(export_dir: str) -> str:
    """``contents_bytes = tf.io.read_file(path)``: a model that reads whatever it is told
    to (``_bytes``: REST answers it in base64)."""
    import tensorflow as tf
    from saved_model_io import save_tf1, serving_default

    with tf.Graph().as_default() as graph:
        path = tf.compat.v1.placeholder(tf.string, [], name="path")
        contents = tf.identity(tf.io.read_file(path), name="contents")
        return save_tf1(graph, export_dir, serving_default({"path": path},
                                                          {"contents_bytes": contents}))


def _lower_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture(scope="module")
def reader_base(tmp_path_factory) -> str:
    base = str(tmp_path_factory.mktemp("reader"))
    build_reader(os.path.join(base, "1"))
    return base


@pytest.fixture(scope="module")
def stale_socket(tmp_path_factory) -> str:
    """A socket file no process listens on: what a killed server leaves behind."""
    path = str(tmp_path_factory.mktemp("unix") / "grpc.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.close()
    return path


@pytest.fixture(scope="module")
def served(reader_base, classifier_base, stale_socket, tmp_path_factory):
    assert stat.S_ISSOCK(os.lstat(stale_socket).st_mode)
    probe = socket.socket(socket.AF_UNIX)
    with pytest.raises(OSError):  # control: a plain bind there fails
        probe.bind(stale_socket)
    probe.close()
    config_dir = tmp_path_factory.mktemp("config")
    config = write_model_config(str(config_dir / "models.config"),
                                {"reader": reader_base, "m": classifier_base})
    monitoring = config_dir / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }')
    process = subprocess.Popen(
        serve_command(f"--model_config_file={config}", "--port=0", "--rest_api_port=-1",
                      f"--monitoring_config_file={monitoring}",
                      f"--grpc_socket_path={stale_socket}", "--allow_file_ops",
                      "--max_num_load_retries=0", "--file_system_poll_wait_seconds=0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=serve_env(),
        preexec_fn=_lower_descriptors)
    try:
        line = read_line(process, timeout=300)
        assert "AVAILABLE on" in line, (line, process.stderr.read() if process.poll() else "")
        grpc_address = line.split(" AVAILABLE on ", 1)[1].split(",")[0]
        rest_address = line.split("REST on ", 1)[1].split(",")[0]
        yield {"line": line, "grpc": grpc_address, "rest": rest_address,
               "unix": f"unix:{stale_socket}", "reader": reader_base,
               "classifier": classifier_base, "process": process}
    finally:
        stop_process(process)


def _grpc_read(address: str, path: str, model: str = "reader") -> bytes:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["path"].CopyFrom(tf.make_tensor_proto(path))
    with grpc.insecure_channel(address) as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=120, wait_for_ready=True)
    return reply.outputs["contents_bytes"].string_val[0]


def _rest(address: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{address}{path}", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.golden
def test_models_served_together_answer_by_name(served):
    assert "model 'reader' version 1; model 'm' version 1 AVAILABLE" in served["line"]
    own = os.path.join(served["reader"], "1", "saved_model.pb")
    with open(own, "rb") as f:
        expected = f.read()
    assert _grpc_read(served["grpc"], own) == expected
    assert _grpc_read(served["unix"], own) == expected  # over the stale socket's path
    status, reply = _rest(served["rest"], "/v1/models/reader:predict",
                          {"inputs": {"path": own}})
    assert status == 200 and base64.b64decode(reply["outputs"]["b64"]) == expected


@pytest.mark.parametrize("relative", ["assets/vocab.txt", "variables/variables.index"])
def test_a_model_cannot_read_another_models_files(served, relative):
    other = os.path.join(served["classifier"], "1", relative)
    # Control: the file is there, and the reader returns it when nothing separates them.
    import tensorflow as tf

    loaded = tf.compat.v2.saved_model.load(os.path.join(served["reader"], "1"))
    run = loaded.signatures["serving_default"]
    with open(other, "rb") as f:
        assert run(path=tf.constant(other))["contents_bytes"].numpy() == f.read()
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_read(served["grpc"], other)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "No such file or directory" in caught.value.details()
    status, reply = _rest(served["rest"], "/v1/models/reader:predict",
                          {"inputs": {"path": other}})
    assert status == 404 and "No such file or directory" in reply["error"]


def test_an_unknown_model_gets_upstreams_not_found(served):
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "nope"
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=60)
        request.model_spec.version.value = 3
        with pytest.raises(grpc.RpcError) as specific:
            stub.Predict(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "Servable not found for request: Latest(nope)"
    assert specific.value.details() == "Servable not found for request: Specific(nope, 3)"
    assert _rest(served["rest"], "/v1/models/nope:predict", {"instances": [1]}) == (
        404, {"error": "Servable not found for request: Latest(nope)"})


def test_reload_config_is_refused_with_the_fix(served):
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    with grpc.insecure_channel(served["grpc"]) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                model_management_pb2.ReloadConfigRequest(), timeout=60)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "restart serve with the new config" in caught.value.details()


def _closed_by_server(sockets: list[socket.socket]) -> int:
    readable, _, _ = select.select(sockets, [], [], 0)
    closed = 0
    for sock in readable:
        try:
            closed += sock.recv(1) == b""
        except OSError:
            closed += 1
    return closed


def test_more_idle_connections_than_the_limit_on_both_ports(served):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * IDLE_CONNECTIONS + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * wanted), hard))
    own = os.path.join(served["reader"], "1", "saved_model.pb")
    with open(own, "rb") as f:
        expected = f.read()
    idle: dict[str, list[socket.socket]] = {"grpc": [], "rest": []}
    try:
        for port in idle:
            host, number = served[port].rsplit(":", 1)
            for _ in range(IDLE_CONNECTIONS):
                sock = socket.create_connection((host, int(number)), timeout=60)
                idle[port].append(sock)
        assert _grpc_read(served["grpc"], own) == expected
        status, reply = _rest(served["rest"], "/v1/models/reader:predict",
                              {"inputs": {"path": own}})
        assert status == 200 and base64.b64decode(reply["outputs"]["b64"]) == expected
        # Control: the limits were reached: the server closed idle connections on each port.
        for port, sockets in idle.items():
            assert _closed_by_server(sockets) > 0, port
    finally:
        for sockets in idle.values():
            for sock in sockets:
                sock.close()
    assert _grpc_read(served["grpc"], own) == expected
    assert _rest(served["rest"], "/v1/models/reader:predict",
                 {"inputs": {"path": own}})[0] == 200
    assert served["process"].poll() is None


def test_a_regular_file_at_the_socket_path_is_refused(classifier_base, tmp_path):
    path = tmp_path / "grpc.sock"
    path.write_text("keep me")
    done = subprocess.run(
        [sys.executable, "-m", "serving_opt.cli", "serve", "--model_name=m", "--port=0",
         f"--model_base_path={classifier_base}", f"--grpc_socket_path={path}"],
        capture_output=True, text=True, timeout=120, env=serve_env())
    assert done.returncode != 0
    assert f"could not listen on the unix socket {path}: Address already in use" in done.stderr
    assert path.read_text() == "keep me"
    assert "TensorFlow" not in done.stderr  # refused before anything loads


def test_when_one_sandbox_dies_serve_stops_with_its_code(reader_base, classifier_base,
                                                         tmp_path):
    config = write_model_config(str(tmp_path / "models.config"),
                                {"reader": reader_base, "m": classifier_base})
    process = subprocess.Popen(
        serve_command(f"--model_config_file={config}", "--port=0", "--allow_file_ops",
                      "--max_num_load_retries=0", "--file_system_poll_wait_seconds=0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=serve_env())
    try:
        assert "AVAILABLE on" in read_line(process, timeout=300)
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as f:
            sandboxes = [int(pid) for pid in f.read().split()]
        assert len(sandboxes) == 2  # one per model
        os.kill(sandboxes[1], signal.SIGKILL)
        code = process.wait(timeout=120)
        stderr = process.stderr.read()
    finally:
        stop_process(process)
    assert code == 128 + signal.SIGKILL
    assert "a sandboxed server was killed (SIGKILL" in stderr


def test_the_metrics_page_holds_every_sandboxs_series(served):
    own = os.path.join(served["reader"], "1", "saved_model.pb")
    assert _rest(served["rest"], "/v1/models/reader:predict", {"inputs": {"path": own}})[0] == 200
    assert _rest(served["rest"], "/v1/models/m:predict", {"instances": [1]})[0] == 400
    with urllib.request.urlopen(f"http://{served['rest']}/metrics", timeout=60) as reply:
        page = reply.read().decode()
    # Each model's series come from its own sandbox's page.
    assert 'request_count{model_name="reader",status="OK"}' in page
    assert 'request_count{model_name="m",status="INVALID_ARGUMENT"}' in page
    types = [line for line in page.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types)) > 0
