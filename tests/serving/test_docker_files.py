"""The deployment files under docker/ agree with each other and with what the tool serves,
and the docker backend's logic, without an engine.

What needs no engine is checked here: the pinned image tags match the validator's
default, mounts are read-only, models.config is a ModelServerConfig that a
TF-Serving-compatible server (the local one) loads, with two real models; the backend's
command lines, owner labels, stale-container cleanup, pre-flight errors and auto's
choice, with stand-in `docker` clients (each named a mock). tests/serving/test_docker_engine.py
builds and runs all of it on a Docker engine.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import grpc
import pytest
import repo_paths
from google.protobuf import text_format

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import ServingCheck
from serving_opt.serving import backends

DOCKER_DIR = os.path.join(repo_paths.REPO, "docker")


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


# --- the docker backend's logic -----------------------------------------------------------

def test_docker_command_publishes_on_loopback_or_shares_the_host_network():
    spec = backends.ServerSpec("clf", "/srv/models/clf", image="img:1")
    bridge = backends.docker_command(spec, 9000, "so-1", rest_host_port=9001)
    assert bridge[:3] == ["docker", "run", "--rm"] and "--init" in bridge
    assert "127.0.0.1:9000:8500" in bridge and "127.0.0.1:9001:8501" in bridge
    assert "--network" not in bridge
    assert not any(a.startswith("--port=") for a in bridge)  # the image's 8500/8501
    assert f"{backends.OWNER_LABEL}={backends.owner()}" in bridge

    host_spec = dataclasses.replace(spec, docker_network="host")
    host = backends.docker_command(host_spec, 9000, "so-1", rest_host_port=0)
    assert host[host.index("--network") + 1] == "host" and "-p" not in host
    after_image = host[host.index("img:1") + 1:]
    # After the entrypoint's --port=8500 --rest_api_port=8501: these win; 0 turns REST off.
    assert after_image[-2:] == ["--port=9000", "--rest_api_port=0"]
    assert "/srv/models/clf:/models/clf:ro" in host
    with pytest.raises(UsageError, match="docker_network=bridged"):
        backends.docker_command(dataclasses.replace(spec, docker_network="bridged"), 9000,
                                "so-1")
    with pytest.raises(UsageError, match="--docker_network=none"):
        ServingCheck(docker_network="none").check()


def test_an_owner_is_gone_only_when_its_process_is_judged_dead_here():
    me = backends.owner()
    host, namespace, pid, started = me.rsplit(":", 3)
    assert int(pid) == os.getpid() and started
    assert not backends._owner_gone(me)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_owner = backends.owner(child.pid)
    assert not backends._owner_gone(child_owner)  # the control: alive, not gone
    child.wait()
    assert backends._owner_gone(child_owner)
    # The same pid started at another time is another process: gone.
    assert backends._owner_gone(f"{host}:{namespace}:{pid}:{int(started) + 1}")
    # Another host's or pid namespace's owner, or a label not ours, cannot be judged.
    assert not backends._owner_gone(f"elsewhere:{namespace}:{child.pid}:{started}")
    assert not backends._owner_gone(f"{host}:1:{child.pid}:{started}")
    assert not backends._owner_gone("made by hand")


def _fake_docker(tmp_path, monkeypatch, script: str) -> str:
    """Mock: a `docker` client stand-in on PATH; returns the file its calls go to."""
    calls = tmp_path / "calls.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n{script}')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return str(calls)


def test_stale_containers_of_dead_owners_are_removed_and_no_others(tmp_path, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = backends.owner(child.pid)
    child.wait()
    listing = "\\n".join([f"so-dead\t{dead}", f"so-live\t{backends.owner()}",
                          "so-foreign\tother-host:1:2:3"])
    calls = _fake_docker(tmp_path, monkeypatch,
                         f'if [ "$1" = ps ]; then printf "{listing}\\n"; fi\n')
    assert backends.remove_stale_containers() == ["so-dead"]
    lines = open(calls).read().splitlines()
    assert lines[0].startswith(f"ps -a --filter label={backends.OWNER_LABEL}")
    assert lines[1:] == ["rm -f so-dead"]


@pytest.mark.parametrize("script,problem,fix", [
    ("exit 1\n", "no Docker engine answers at", "make docker-engine"),
    ('case "$1" in info) echo 20.10;; ps) ;; image) exit 1;; '
     'pull) echo "pull access denied" >&2; exit 1;; esac\n',
     "image img:1 is not on the Docker engine and cannot be pulled (pull access denied)",
     "make docker-image"),
])
def test_an_explicit_docker_backend_is_checked_before_any_work(tmp_path, monkeypatch, script,
                                                                problem, fix):
    # Mock: a `docker` stand-in without an engine, then one whose engine lacks the image.
    calls = _fake_docker(tmp_path, monkeypatch, script)
    with pytest.raises(ServingOptError) as raised:
        backends.resolve_backend("docker", image="img:1")
    assert problem in str(raised.value) and fix in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not any(line.startswith("run") for line in open(calls).read().splitlines())


def test_auto_takes_docker_only_when_the_engine_has_the_image_and_can_run_it(tmp_path,
                                                                            monkeypatch):
    # Mock: an engine that answers; `image inspect` finds only img:1; nothing is pulled;
    # the engine's bridge network exists while the file "bridge" does.
    bridge = tmp_path / "bridge"
    bridge.touch()
    calls = _fake_docker(tmp_path, monkeypatch,
                         'case "$1" in info) echo 20.10;; image) [ "$3" = img:1 ];; '
                         f'network) [ -e {bridge} ];; *) exit 1;; esac\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no tensorflow_model_server either
    assert backends.resolve_backend("auto", image="img:1") == "docker"
    assert backends.resolve_backend("auto", image="img:2") == "local"
    assert not any(line.startswith(("pull", "run")) for line in open(calls).read().splitlines())

    # dockerd --bridge=none: -p would be ignored and the container unreachable.
    bridge.unlink()
    assert backends.resolve_backend("auto", image="img:1") == "local"
    assert backends.resolve_backend("auto", image="img:1", docker_network="host") == "docker"
    with pytest.raises(ServingOptError, match="no bridge network .* --docker_network=host"):
        backends.resolve_backend("docker", image="img:1")
    assert backends.resolve_backend("docker", image="img:1", docker_network="host") == "docker"
