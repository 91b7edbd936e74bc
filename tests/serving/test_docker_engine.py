"""The Docker path against a real Docker engine: the backend, its cleanup, docker/'s files.

Runs the contract image (tools/docker/image.sh: TF Serving's image contract with this
project's server and TensorFlow inside, a stand-in for tensorflow/serving, which no
registry here serves) on the engine `make test` starts (tools/docker/engine.sh). The
backend's containers share the host's network (--docker_network=host: the engine has
no default bridge), so every request goes to 127.0.0.1. Where no engine answers or the
image is missing, each test is skipped with that one line, which no fresh machine is
expected to take (tools/test_skips.py fails the run). The command lines and the labels'
logic are tested without an engine in tests/serving/test_docker_files.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid
from importlib import metadata

import independent_check
import numpy as np
import pytest
import repo_paths
from conftest import tree_snapshot
from polling import wait_until

from serving_opt.serving import backends

CLI = [sys.executable, "-m", "serving_opt.cli"]
IMAGE = os.environ.get("SERVING_OPT_CONTRACT_IMAGE") or \
    f"serving-opt/tfs-contract:{metadata.version('tensorflow')}"
DOCKER_DIR = os.path.join(repo_paths.REPO, "docker")
ON_HOST = ["--server=docker", f"--image={IMAGE}", "--docker_network=host",
           "--allow_unsandboxed"]
WARMUP = os.path.join("assets.extra", "tf_serving_warmup_requests")


@pytest.fixture(scope="module", autouse=True)
def engine():
    engine_address = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not backends.docker_available():
        pytest.skip(f"no Docker engine answers at {engine_address} (make docker-engine "
                    "starts one; make test does)")
    if not backends.docker_image_present(IMAGE):
        pytest.skip(f"the contract image {IMAGE} is not on the Docker engine (make "
                    "docker-image builds it; make test does)")


# --- helpers ----------------------------------------------------------------------------

def _wait(condition, what: str):
    return wait_until(condition, what, timeout=240.0, interval=0.2)


def _containers(pid: int | None = None) -> dict[str, str]:
    """Name -> state of the containers a serving-opt process started (by its owner label),
    all of them when ``pid`` is None."""
    listed = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={backends.OWNER_LABEL}", "--format",
         f'{{{{.Names}}}}\t{{{{.Label "{backends.OWNER_LABEL}"}}}}\t{{{{.State}}}}'],
        capture_output=True, text=True, check=True, timeout=60)
    out = {}
    for line in listed.stdout.splitlines():
        name, owner, state = line.split("\t")
        if pid is None or owner.split(":")[2] == str(pid):
            out[name] = state
    return out


def _inspect(name: str) -> dict:
    done = subprocess.run(["docker", "inspect", name], capture_output=True, text=True,
                          check=True, timeout=60)
    return json.loads(done.stdout)[0]


def _rest(address: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://{address}{path}", data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def _versions(rest_address: str, name: str) -> dict[int, dict]:
    """Version -> its status entry, from the REST model status; {} while unreachable."""
    try:
        status = _rest(rest_address, f"/v1/models/{name}")
    except OSError:
        return {}
    return {int(v["version"]): v for v in status.get("model_version_status", [])}


def _predict(grpc_address: str, rest_address: str, name: str, images: np.ndarray,
             version: int | None = None) -> list[dict]:
    """The convnet's serving_default outputs for ``images`` over gRPC and over REST."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = "serving_default"
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
    with grpc.insecure_channel(grpc_address) as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=60)
    answered = {k: tf.make_ndarray(v) for k, v in reply.outputs.items()}
    assert version is None or reply.model_spec.version.value == version
    path = f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + ":predict"
    outputs = _rest(rest_address, path, {"signature_name": "serving_default",
                                         "inputs": {"images": images.tolist()}})["outputs"]
    return [answered, {k: np.asarray(v) for k, v in outputs.items()}]


def _assert_answers(answers: list[dict], model_dir: str, images: np.ndarray) -> None:
    """Each protocol's answers are plain TensorFlow's, run on the same version's files."""
    expected = independent_check.run_session(
        model_dir, {"serving_default": {"images": images}})["serving_default"]
    for answered in answers:
        assert sorted(answered) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_allclose(answered[key], value, rtol=1e-5, atol=1e-6)


def _images(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((3, 16, 16, 3), dtype=np.float32)


def _publish(source_dir: str, base: str, version: int, warmup: bytes | None = None) -> str:
    """Copies a version in whole (built beside the base, then renamed in), as optimize
    publishes: the polling server never sees half a version."""
    building = os.path.join(os.path.dirname(base), f".building-{version}")
    shutil.copytree(source_dir, building)
    if warmup is not None:
        os.makedirs(os.path.join(building, "assets.extra"), exist_ok=True)
        with open(os.path.join(building, WARMUP), "wb") as f:
            f.write(warmup)
    target = os.path.join(base, str(version))
    os.rename(building, target)
    return target


def _run(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


# --- the backend, end to end ------------------------------------------------------------

def test_validate_in_a_container_checks_only_the_asked_version_over_grpc_and_rest(
        classifier_dir, tmp_path):
    # Version 2 is not a SavedModel: a server that loaded any version but the one checked
    # (TF Serving's default policy serves the highest) would never make version 1
    # AVAILABLE, and the run would fail.
    base = tmp_path / "clf"
    shutil.copytree(classifier_dir, base / "1")
    (base / "2").mkdir()
    (base / "2" / "saved_model.pb").write_bytes(b"not a SavedModel")
    before = tree_snapshot(str(base))

    run = _start_validate(str(base), "--version=1", "--concurrency=2", "--duration=1")
    out = "".join(run.communicate(timeout=900))
    assert run.returncode == 0, out
    assert "VALIDATED clf version 1 (docker: " in out
    assert f"server     docker:{IMAGE}" in out
    assert "a stand-in, not TF Serving" in out  # the contract image says what it is
    assert "serving version 1 only; ignoring version(s) 2" in out
    for check in ("model AVAILABLE", "REST model AVAILABLE", "Classify serving_default",
                  "REST Predict predict", "REST Classify serving_default"):
        assert any(line.startswith(check) and " yes " in line
                   for line in out.splitlines()), check
    assert "load phase" in out and "\nREST " in out  # both load phases ran
    assert _containers(run.pid) == {}  # removed on success
    assert tree_snapshot(str(base)) == before  # mounted read-only; nothing written


def test_optimize_validates_in_a_container_that_picks_up_new_versions_and_reads_warmup(
        convnet_dir, tmp_path):
    base = str(tmp_path / "conv")
    report_path = tmp_path / "report.json"
    done = _run("optimize", f"--input_dir={convnet_dir}", f"--output_base={base}",
                "--version=1", "--validate", *ON_HOST, "--write_warmup",
                "--concurrency=1", "--duration=0.5", "--benchmark_runs=0", "--nocold_start",
                f"--report={report_path}")
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    validation = report["validation"]
    assert validation["ok"] is True
    assert validation["server"] == f"docker:{IMAGE}"
    assert os.path.getsize(os.path.join(base, "1", WARMUP)) > 0  # what the server replays

    # The published base, served by the backend as a user's tensorflow/serving would be:
    # every version the policy allows (the highest), new ones picked up by polling.
    spec = backends.ServerSpec("conv", base, image=IMAGE, docker_network="host")
    server = backends.make_server("docker", spec)
    with server:
        rest = server.rest_address
        _wait(lambda: _versions(rest, "conv").get(1, {}).get("state") == "AVAILABLE",
              "version 1 is AVAILABLE")
        (name,) = _containers(os.getpid())
        container = _inspect(name)
        assert container["HostConfig"]["NetworkMode"] == "host"
        (mount,) = container["Mounts"]
        assert (mount["Source"], mount["Destination"], mount["RW"]) == (
            base, "/models/conv", False)
        images = _images()
        _assert_answers(_predict(server.address, rest, "conv", images, 1),
                        os.path.join(base, "1"), images)

        # Published while serving: picked up, warmup file and all.
        _publish(os.path.join(base, "1"), base, 2)
        _wait(lambda: _versions(rest, "conv").get(2, {}).get("state") == "AVAILABLE",
              "version 2, published while serving, is AVAILABLE")
        _assert_answers(_predict(server.address, rest, "conv", images, 2),
                        os.path.join(base, "2"), images)

        # A version whose warmup file is not TFRecords fails its load: the server in the
        # container reads the file (the control: version 2, the same model with a good
        # warmup file, loaded).
        _publish(os.path.join(base, "1"), base, 3, warmup=b"not TFRecords")
        failed = _wait(lambda: _versions(rest, "conv").get(3, {}).get("state") == "END"
                       and _versions(rest, "conv")[3], "version 3's load has ended")
        assert failed["status"]["error_code"] != "OK", failed
        assert "warmup" in (failed["status"]["error_message"] + server.log_tail(200)).lower()
        _assert_answers(_predict(server.address, rest, "conv", images, 2),
                        os.path.join(base, "2"), images)  # still served
    assert _containers(os.getpid()) == {}  # removed on stop


def _start_validate(base: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "validate", f"--model_base={base}", *ON_HOST, *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until_container_runs(process: subprocess.Popen) -> str:
    """Reads the run's progress until it starts its server, then waits for the container
    to run; returns the container's name."""
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("starting the docker server"):
            break
    else:
        pytest.fail("validate ended before it started a server:\n" + "".join(seen))
    running = _wait(lambda: [n for n, state in _containers(process.pid).items()
                             if state == "running"], f"run {process.pid}'s container runs")
    return running[0]


def _docker_client(pid: int) -> int:
    """The `docker run` client a serving-opt process started."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                    if cmdline.read().split(b"\0")[:2] == [b"docker", b"run"]:
                        return int(child)
    pytest.fail(f"process {pid} has no docker run child")


def test_no_container_outlives_a_failed_interrupted_or_killed_run(classifier_dir, tmp_path):
    base = tmp_path / "clf"
    shutil.copytree(classifier_dir, base / "1")
    # Four runs at once: failed, and, once their containers run (the model loading or
    # served: the guarantee holds in every phase), Ctrl-C, SIGKILL of serving-opt, SIGKILL
    # of serving-opt and its docker client.
    broken = tmp_path / "broken"
    broken.mkdir()
    _publish(str(base / "1"), str(broken), 1, warmup=b"not TFRecords")
    failing = _start_validate(str(broken), "--concurrency=0")
    runs = {kind: _start_validate(str(base), "--concurrency=1", "--duration=300")
            for kind in ("sigint", "sigkill", "sigkill_both")}
    try:
        for process in runs.values():
            _until_container_runs(process)
            assert len(_containers(process.pid)) == 1

        # Ctrl-C: validate stops the server it started and says so.
        interrupted = runs["sigint"]
        interrupted.send_signal(signal.SIGINT)
        _, err = interrupted.communicate(timeout=120)
        assert interrupted.returncode == 130 and "interrupted" in err
        assert _containers(interrupted.pid) == {}

        # SIGKILL of serving-opt: the kernel's parent-death SIGTERM reaches the docker
        # client, which passes it to the container (--sig-proxy; --init's PID 1 passes it
        # to the server); --rm removes it.
        killed = runs["sigkill"]
        killed.kill()
        killed.wait()
        _wait(lambda: _containers(killed.pid) == {}, "the killed run's container is gone")

        # SIGKILL of both: nothing can stop the container now (the control: it runs on),
        # until the next --server=docker run on this host removes it, its owner gone.
        both = runs["sigkill_both"]
        os.kill(_docker_client(both.pid), signal.SIGKILL)
        both.kill()
        both.wait()
        (orphan,) = _containers(both.pid)
        assert _inspect(orphan)["State"]["Running"] is True
        # Not the failing run's container: its owner is alive.
        live = set(_containers(failing.pid))
        removed = backends.remove_stale_containers()
        assert orphan in removed and not live & set(removed)
        assert _containers(both.pid) == {}

        # Failure: the container read the bad warmup file, the load failed, it is gone.
        out, err = failing.communicate(timeout=600)
        assert failing.returncode == 1, err
        assert "warmup" in (out + err).lower()
        assert _containers(failing.pid) == {}
    finally:
        for process in (failing, *runs.values()):
            process.kill()
            process.wait()
        for name in [n for p in (failing, *runs.values()) for n in _containers(p.pid)]:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def test_docker_errors_are_one_line_before_any_work(convnet_dir, tmp_path, monkeypatch):
    base = tmp_path / "conv"
    shutil.copytree(convnet_dir, base / "1")
    missing = "serving-opt/no-such-image:0"
    dead = f"unix://{tmp_path}/no-engine.sock"
    cases = [
        (["validate", f"--model_base={base}", f"--image={missing}"], None,
         f"image {missing} is not on the Docker engine and cannot be pulled"),
        (["validate", f"--model_base={base}", f"--image={IMAGE}"], dead,
         f"no Docker engine answers at {dead}"),
        (["optimize", f"--input_dir={base / '1'}", f"--output_base={tmp_path / 'out'}",
          "--validate", f"--image={missing}"], None, f"image {missing} is not on"),
    ]
    for args, docker_host, problem in cases:
        env = dict(os.environ, **({"DOCKER_HOST": docker_host} if docker_host else {}))
        done = _run(*args, "--server=docker", "--docker_network=host", "--allow_unsandboxed",
                    "--noprogress" if args[0] == "optimize" else "--concurrency=0", env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert problem in lines[0] and "Traceback" not in done.stderr
        assert ("make docker-image" if "image" in problem else "make docker-engine") \
            in lines[0]
    assert not (tmp_path / "out").exists()  # optimize refused before any work
    assert sorted(os.listdir(base)) == ["1"]

    # Ports published (-p, the default) on an engine without a bridge: Docker would start
    # the container unreachable; refused in one line naming the host network instead.
    if subprocess.run(["docker", "network", "inspect", "bridge"], capture_output=True,
                      check=False).returncode != 0:
        done = _run("validate", f"--model_base={base}", "--server=docker", f"--image={IMAGE}",
                    "--allow_unsandboxed", "--concurrency=0")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert "has no bridge network" in lines[0] and "--docker_network=host" in lines[0]

    # auto takes the engine only with the image already there: nothing is pulled.
    monkeypatch.setenv("PATH", os.path.dirname(shutil.which("docker")))
    assert backends.resolve_backend("auto", image=IMAGE, docker_network="host") == "docker"
    assert backends.resolve_backend("auto", image=missing, docker_network="host") == "local"


# --- docker/'s files on the contract image ----------------------------------------------

def test_the_docker_directory_builds_and_serves_on_the_contract_image(convnet_dir, tmp_path):
    name = "conv"
    images = _images(1)
    repository, tag = IMAGE.rsplit(":", 1)
    baked = f"serving-opt/test-baked-{uuid.uuid4().hex[:8]}:1"
    context = tmp_path / "context"
    shutil.copytree(convnet_dir, context / "models" / name / "1")
    env = dict(os.environ, DOCKER_BUILDKIT="0")  # the engine's own builder (no buildx)
    subprocess.run(["docker", "build", "--quiet", "-f", os.path.join(DOCKER_DIR, "Dockerfile"),
                    "--build-arg", f"TF_SERVING_IMAGE={repository}",
                    "--build-arg", f"TF_SERVING_TAG={tag}",
                    "--build-arg", f"MODEL={name}",
                    "--build-arg", f"MODEL_BASE=models/{name}", "-t", baked, str(context)],
                   check=True, capture_output=True, env=env, timeout=600)
    container = f"serving-opt-test-{uuid.uuid4().hex[:8]}"
    project = f"serving-opt-test-{uuid.uuid4().hex[:8]}"
    compose = ["docker-compose", "-p", project, "-f", os.path.join(DOCKER_DIR, "compose.yaml"),
               "-f", str(tmp_path / "image.yaml")]
    (tmp_path / "image.yaml").write_text(f"services:\n  serving:\n    image: {IMAGE}\n")
    try:
        # The image with the model baked in: its entrypoint serves /models/conv; the
        # ports are flags after it (the host's network).
        grpc_port, rest_port = backends.free_port(), backends.free_port()
        subprocess.run(["docker", "run", "-d", "--name", container, "--network",
                        "host", baked, f"--port={grpc_port}", f"--rest_api_port={rest_port}"],
                       check=True, capture_output=True, timeout=120)
        _serves(container, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}", name,
                str(context / "models" / name / "1"), images)

        # compose.yaml as written, the image swapped for the local tag (an override
        # file): the base mounted read-only, the ports published on its own network.
        grpc_port, rest_port = backends.free_port(), backends.free_port()
        compose_env = dict(os.environ, MODEL_NAME=name, MODEL_BASE=str(context / "models" / name),
                           GRPC_PORT=str(grpc_port), REST_PORT=str(rest_port))
        subprocess.run([*compose, "up", "-d"], check=True, capture_output=True,
                       env=compose_env, timeout=300)
        _serves(f"{project}_serving_1", f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}",
                name, str(context / "models" / name / "1"), images)
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
        subprocess.run([*compose, "down"], capture_output=True, check=False,
                       env=dict(os.environ, MODEL_NAME=name, MODEL_BASE="."))
        subprocess.run(["docker", "rmi", baked], capture_output=True, check=False)
    listed = subprocess.run(["docker", "images", "-a", "--format", "{{.Repository}}"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert baked.split(":")[0] not in listed  # the built image and its layers are gone


def _serves(container: str, grpc_address: str, rest_address: str, name: str,
            model_dir: str, images: np.ndarray) -> None:
    def available():
        if not _inspect(container)["State"]["Running"]:
            logs = subprocess.run(["docker", "logs", "--tail", "20", container],
                                  capture_output=True, text=True, check=False)
            pytest.fail(f"{container} exited:\n{logs.stdout}{logs.stderr}")
        return _versions(rest_address, name).get(1, {}).get("state") == "AVAILABLE"

    _wait(available, f"{name} version 1 is AVAILABLE at {rest_address}")
    _assert_answers(_predict(grpc_address, rest_address, name, images), model_dir, images)
