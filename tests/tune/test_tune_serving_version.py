"""``tune --serving_version``: the proof's server and the session profile run under the
TF Serving release production runs (issue 31).

Function-level: the runtime resolution (this venv's TensorFlow resolves to this
interpreter, nothing installed), the Docker image it implies, and the profile and the
server started by a run going through the runtime's interpreter (a wrapper script
standing for another venv's python, which logs how it was called and runs this one).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys

import pytest
from polling import wait_until
from tune_reports import synthetic_report

from serving_opt.errors import UsageError
from serving_opt.serving import backends
from serving_opt.serving import runtime as runtime_lib
from serving_opt.tune import tuner
from serving_opt.tune.options import ServerOptions, TuneOptions, WorkloadOptions
from serving_opt.tune.profile import ProfilePlan, profile
from serving_opt.tune.report import format_report
from serving_opt.tune.settings import ThreadSettings, tf_serving_default

THIS_TF = runtime_lib.current_tf_version()


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> str:
    """No cached runtime venv, no interpreter named by the environment."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(runtime_lib.ENV_CACHE, str(cache))
    for name in list(os.environ):
        if name.startswith(runtime_lib.ENV_RUNTIME_PREFIX):
            monkeypatch.delenv(name)
    return str(cache)


@pytest.fixture
def wrapped(tmp_path) -> tuple[runtime_lib.Runtime, str]:
    """A Runtime whose python is a wrapper of this one (another venv's, as far as tune
    knows); the wrapper appends its arguments and PYTHONPATH to the returned log."""
    log = tmp_path / "calls.log"
    python = tmp_path / "rt" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$* PYTHONPATH=$PYTHONPATH" >> {log}\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return (runtime_lib.Runtime(str(python), THIS_TF, "given interpreter", str(tmp_path / "rt")),
            str(log))


def test_this_venvs_release_resolves_to_this_interpreter_without_installing(empty_cache):
    options = TuneOptions(
        workload=WorkloadOptions(clients=4),
        serving=ServerOptions(serving_version=runtime_lib.major_minor(THIS_TF)))
    runtime, note = tuner.local_runtime(options)
    assert runtime is not None and runtime.python == sys.executable
    assert runtime.source == "current interpreter" and runtime.tf_version == THIS_TF
    assert note == ""
    assert not os.path.exists(empty_cache)  # nothing installed


def test_without_serving_version_a_missing_target_runtime_is_a_note(empty_cache):
    options = TuneOptions(
        workload=WorkloadOptions(clients=4),
        serving=ServerOptions(image="tensorflow/serving:2.3.0"))
    runtime, note = tuner.local_runtime(options)
    assert runtime is None
    assert f"the stand-in ran TensorFlow {THIS_TF}, not the target TF Serving's 2.3" in note
    assert "--serving_version=2.3.0 installs one" in note


@pytest.mark.parametrize("given, image", [
    ({"serving_version": "2.15.1"}, "tensorflow/serving:2.15.1"),
    ({"serving_version": "2.15.1", "image": "registry.local/tfs:prod"}, "registry.local/tfs:prod"),
    ({"serving_version": "2.15", "image": "tensorflow/serving:2.15.1-gpu"},
     "tensorflow/serving:2.15.1-gpu"),
    ({}, backends.DEFAULT_IMAGE),
])
def test_docker_image_follows_serving_version_unless_image_is_given(given, image):
    options = TuneOptions(workload=WorkloadOptions(clients=4),
                          serving=ServerOptions(server="docker", **given))
    options.check()
    assert options.serving.docker_image() == image


@pytest.mark.parametrize("given, message", [
    ({"serving_version": "latest"}, "--serving_version=latest is not a TensorFlow version"),
    ({"serving_version": "2.15.1", "image": "tensorflow/serving:2.19.0"},
     "--image=tensorflow/serving:2.19.0 runs TF Serving 2.19.0, not --serving_version=2.15.1"),
    ({"docker_network": "overlay"}, "--docker_network=overlay is not one of bridge, host"),
])
def test_python_api_usage_errors_before_any_work(tmp_path, given, message):
    with pytest.raises(UsageError) as raised:
        # The model base does not exist: the usage error comes first.
        tuner.tune(str(tmp_path / "none"), TuneOptions(
            workload=WorkloadOptions(clients=4), serving=ServerOptions(**given)))
    assert message in raised.value.one_line()
    assert raised.value.fix


class _Resolved(Exception):
    pass


def test_docker_runs_the_asked_image_on_the_asked_network(convnet_base, monkeypatch):
    asked = {}

    def resolve_backend(name, sandboxed=False, image=None, docker_network=None):
        asked.update(name=name, image=image, docker_network=docker_network)
        raise _Resolved  # what follows would start a container

    monkeypatch.setattr(backends, "resolve_backend", resolve_backend)
    with pytest.raises(_Resolved):
        tuner.tune(convnet_base, TuneOptions(
            workload=WorkloadOptions(clients=4),
            serving=ServerOptions(server="docker", serving_version="2.15.1",
                                  docker_network="host")))
    assert asked == {"name": "docker", "image": "tensorflow/serving:2.15.1",
                     "docker_network": "host"}


def test_the_profile_runs_under_the_runtimes_interpreter(convnet_dir, wrapped):
    runtime, log = wrapped
    plan = ProfilePlan(batch_sizes=(1, 2), thread_settings=(ThreadSettings(),), seconds=0.01,
                       min_runs=1, max_runs=3)
    result = profile(convnet_dir, "serving_default", plan, runtime=runtime)
    assert result.curves[0].batch_sizes == (1, 2)
    calls = open(log).read()
    assert "-m serving_opt.tune.profile" in calls
    # The runtime's venv has no serving_opt: this checkout goes first on its PYTHONPATH.
    assert f"PYTHONPATH={runtime_lib._PACKAGE_ROOT}" in calls


def test_a_runs_servers_start_under_the_runtimes_interpreter(convnet_base, wrapped):
    runtime, log = wrapped
    spec = backends.ServerSpec(model_name="convnet", model_base=convnet_base, version=1)
    run = tuner._Run(convnet_base, 1, TuneOptions(
        workload=WorkloadOptions(clients=4)), "local", lambda m: None,
                     "convnet", spec, ("grpc",), (), None, runtime)
    server = run.launch(tf_serving_default(ThreadSettings()))
    try:
        assert server.command[0] == runtime.python
        assert server.tf_version == runtime.tf_version
        wait_until(lambda: os.path.exists(log), "the wrapper's log of the server's start")
    finally:
        server.stop()
    assert "-m serving_opt.cli serve" in open(log).read()


def test_the_report_names_the_servers_tensorflow():
    report = dataclasses.replace(synthetic_report(), tensorflow_version="2.15.1")
    assert "  tensorflow 2.15.1 (the server's)" in format_report(report).splitlines()
    assert report.to_dict()["tensorflow_version"] == "2.15.1"


def test_server_options_check_alone():
    with pytest.raises(UsageError, match="is not a TensorFlow version"):
        ServerOptions(serving_version="2.x").check()
