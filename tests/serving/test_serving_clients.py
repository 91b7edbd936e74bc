"""Specification of the serving layer's parts: the client interface, the runners, and
the import graph of ``serving_opt/serving`` (no cycles).

Real parts: a real SavedModel, the local runner (``serving-opt serve``) and both clients
over loopback gRPC and HTTP.
"""

from __future__ import annotations

import ast
import dataclasses
import os

import pytest

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.serving import backends, requests
from serving_opt.serving import validate as validate_lib
from serving_opt.serving.grpc_client import GrpcClient
from serving_opt.serving.rest_client import RestClient

SERVING_DIR = os.path.dirname(validate_lib.__file__)


def _serving_imports() -> dict[str, set[str]]:
    """Module -> the serving modules it imports (anywhere in it: at the top, in a function,
    under TYPE_CHECKING), for serving/*.py outside model_server/."""
    names = {f[:-3] for f in os.listdir(SERVING_DIR) if f.endswith(".py") and f != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name in names:
        with open(os.path.join(SERVING_DIR, f"{name}.py")) as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "serving_opt.serving":
                    imported.update(a.name for a in node.names)
                elif node.module.startswith("serving_opt.serving."):
                    imported.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                imported.update(a.name.split(".")[2] for a in node.names
                                if a.name.startswith("serving_opt.serving."))
        graph[name] = (imported & names) - {name}
    return graph


def test_the_serving_modules_import_each_other_without_a_cycle():
    graph = _serving_imports()
    assert {"grpc_client", "requests", "markers", "validate"} <= set(graph)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, "import cycle: " + " -> ".join((*path, module))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
    # The two cycles this layout replaced, named: neither side imports the other back.
    assert "grpc_client" not in graph["requests"] and "validate" not in graph["markers"]


def test_the_runner_factory_builds_each_backend_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, no tensorflow_model_server
    spec = backends.ServerSpec("clf", str(tmp_path), version=3)
    docker = backends.make_server("docker", dataclasses.replace(spec, version=None))
    local = backends.make_server("local", spec)
    try:
        assert isinstance(docker, backends.DockerRunner) and docker.backend == "docker"
        assert isinstance(local, backends.LocalRunner) and "stand-in" in local.note
        assert set(local.endpoints) == {"grpc", "rest"}
        assert local.endpoints["grpc"] == local.address != local.endpoints["rest"]
        assert any(arg.startswith("--model_config_file=") for arg in local.command)
    finally:
        local.stop()  # never started: removes its log and config only
    with pytest.raises(ServingOptError, match="tensorflow_model_server is not on PATH"):
        backends.make_server("binary", spec)
    with pytest.raises(UsageError, match="unknown backend auto"):
        backends.make_server("auto", spec)  # "auto" is resolved before, never run


def _probe(method: str, request) -> requests.Probe:
    return requests.Probe(f"{method} sig", method, request, lambda response: "")


def test_what_a_protocol_cannot_send_is_the_clients_to_leave_out():
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow_serving.apis import inference_pb2, predict_pb2

    predict = predict_pb2.PredictRequest()
    predict.model_spec.name, predict.model_spec.signature_name = "m", "sig"
    predict.model_spec.version.value = 1
    probes = [_probe("Predict", predict), _probe("MultiInference", inference_pb2.
                                                 MultiInferenceRequest())]
    served = {"sig": meta_graph_pb2.SignatureDef()}
    with GrpcClient("127.0.0.1:1", "m", 1, 5) as grpc_client:
        assert [p.name for p in grpc_client.prepare(probes, served)] == [
            "Predict sig", "MultiInference sig"]
    rest = RestClient("127.0.0.1:1", "m", 1, 5).prepare(probes, served)
    assert [p.name for p in rest] == ["REST Predict sig"]
    assert rest[0].path == "m/versions/1:predict"


def test_both_clients_prove_a_model_served_by_the_local_runner(regressor_base):
    version = validate_lib.resolve_version(regressor_base, None)
    model_dir = validate_lib.version_dir(regressor_base, version)
    probes, served = requests.build_probes(model_dir, model_dir, "reg", version,
                                           frozenset({"serve"}),
                                           inputs=requests.ProbeInputs(batch_size=2))
    spec = backends.ServerSpec("reg", regressor_base, version=version)
    with backends.make_server("local", spec) as server:
        for protocol, client_class in validate_lib.CLIENTS.items():
            with client_class(server.endpoints[protocol], "reg", version, 30) as client:
                assert client.protocol == protocol
                client.wait_until_available(server, 240)
                assert client.check_metadata(served)[0]
                sendable = client.prepare(probes, served)
                assert sendable
                for probe in sendable:
                    assert probe.check(client.call(probe)) == "", probe.name
            # A version the server does not serve never becomes AVAILABLE: the client
            # says so by the deadline, naming its protocol's view.
            with client_class(server.endpoints[protocol], "reg", version + 1, 30) as other:
                with pytest.raises(ServingOptError, match="was not AVAILABLE"):
                    other.wait_until_available(server, 2)
    assert server.exit_code() is not None
