"""The deployment files under docker/ agree with each other and with what the tool serves.

No Docker engine exists on these machines, so the images are not built here; what
can be checked is checked for real: the pinned image tags match the validator's
default, mounts are read-only, and models.config is a ModelServerConfig that a
TF-Serving-compatible server (the local one) loads, with two real models.
"""

from __future__ import annotations

import os
import re

import grpc
import pytest
from google.protobuf import text_format

from serving_opt.serving import backends

DOCKER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docker")


def _read(name: str) -> str:
    with open(os.path.join(DOCKER_DIR, name)) as f:
        return f.read()


def test_every_file_pins_the_same_tf_serving_tag_as_the_validator():
    default_tag = backends.DEFAULT_IMAGE.split(":")[1]
    assert re.search(r"^ARG TF_SERVING_TAG=(\S+)$", _read("Dockerfile"), re.M).group(1) \
        == default_tag
    for compose in ("compose.yaml", "compose.multi.yaml"):
        images = re.findall(r"image:\s*(\S+)", _read(compose))
        assert images == [backends.DEFAULT_IMAGE], compose


def test_dockerfile_bakes_the_model_base_where_the_entrypoint_looks():
    dockerfile = _read("Dockerfile")
    assert "COPY ${MODEL_BASE} /models/${MODEL}" in dockerfile
    # Not an ARG named MODEL_NAME: the base image's ENV MODEL_NAME=model shadows it.
    assert re.search(r"^ENV MODEL_NAME=\$\{MODEL\}", dockerfile, re.M)
    assert not re.search(r"^ARG MODEL_NAME\b", dockerfile, re.M)
    assert re.search(r"MODEL_BASE_PATH=/models\b", dockerfile)


def test_compose_mounts_models_read_only_and_publishes_grpc_and_rest():
    compose = _read("compose.yaml")
    assert re.search(r"- \$\{MODEL_BASE:-[^}]+\}:/models/\$\{MODEL_NAME:-classifier\}:ro", compose)
    assert '"${GRPC_PORT:-8500}:8500"' in compose and '"${REST_PORT:-8501}:8501"' in compose


@pytest.fixture
def models_config(tmp_path, classifier_base, regressor_base) -> str:
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(_read("models.config"), config)
    bases = {"classifier": classifier_base, "regressor": regressor_base}
    for model in config.model_config_list.config:
        model.base_path = bases[model.name]  # the example's /models/<name>, made local
    path = tmp_path / "models.config"
    path.write_text(text_format.MessageToString(config))
    return str(path)


def test_models_config_serves_both_models(models_config):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    from serving_opt.model_server import ServerOptions, serve

    server = serve(ServerOptions(model_config_file=models_config, port=0,
                                 startup_timeout_seconds=120))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            for name in ("classifier", "regressor"):
                request = get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = name
                status = stub.GetModelStatus(request, timeout=10)
                assert [s.state for s in status.model_version_status] == [30], name
    finally:
        server.stop()
