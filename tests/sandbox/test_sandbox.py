"""The sandbox alone holds: hostile SavedModels run with the static check switched off
(``allow_file_ops`` and the check patched out) write nothing outside the run's work
directory, read no host file, reach no host socket, and publish nothing host-side; and
with the sandbox switched off, the static check alone refuses them.

The canary is a real host path the model names: a file the sandbox must not see (it
holds a secret), or a path the model would create. Each route's control runs the same
model in plain TensorFlow outside the sandbox and sees the canary written, the secret
read or the host listener dialed; the sandboxed run then asserts that the op ran and how
it ended there, and the host is inspected afterwards.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
import time
import types
from dataclasses import dataclass

import pytest
import repo_paths
from conftest import tree_snapshot
from hostile_models import (
    HOSTILE,
    REQUEST,
    canary_files,
    host_listener,
    run_in_plain_tensorflow,
)

from serving_opt import OptimizeOptions, optimize, sandbox
from serving_opt.errors import ServingOptError
from serving_opt.options import GateOptions, MeasureOptions, ServingCheck, TrustOptions

SECRET = "host-secret-7f3a9c"
# The secret is the file's second line: a table filled from it looks SECRET up as id 1,
# so the request answers w[1] = 2.0 (a missing key answers w[0] = 1.0).
HOST_FILE = f"padding\n{SECRET}\n"
QUICK = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False),
                        trust=TrustOptions(allow_file_ops=True), gate=GateOptions(parity_batches=1))
WRITE_ROUTES = [r for r, h in HOSTILE.items() if h.effect == "writes"]
READ_ROUTES = [r for r, h in HOSTILE.items() if h.effect == "reads"]


@pytest.fixture
def static_check_off(monkeypatch):
    """The static check switched off in this process (the sandbox must hold alone)."""
    from serving_opt import inspection
    from serving_opt.savedmodel import untrusted
    from serving_opt.serving import validate as validate_lib

    monkeypatch.setattr(untrusted, "refuse_host_ops", lambda *a, **k: None)
    monkeypatch.setattr(inspection, "inspect_saved_model",
                        lambda *a, **k: types.SimpleNamespace(risks=[]))
    monkeypatch.setattr(validate_lib, "_refuse_host_ops", lambda *a, **k: None)


@dataclass(frozen=True)
class Built:
    model: str  # <models>/<route>/1
    host: pathlib.Path  # the host directory the canary lives in, empty but for it
    canary: pathlib.Path


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Built]:
    """Every file route built once for the module, each naming a host canary of its own,
    and its control: run by plain TensorFlow outside any sandbox, the model did write the
    canary, or did read the secret out of it (the written files are removed again)."""
    root = tmp_path_factory.mktemp("hostile")
    built = {}
    for route in WRITE_ROUTES + READ_ROUTES:
        host = root / "host" / route
        host.mkdir(parents=True)
        canary = host / "canary"
        model = HOSTILE[route].build(str(root / "models"), str(canary))
        if route in READ_ROUTES:
            canary.write_text(HOST_FILE)
            assert run_in_plain_tensorflow(model, [SECRET])["y"].tolist() == [2.0], route
        else:
            run_in_plain_tensorflow(model)
            written = canary_files(str(canary))
            assert written, f"{route}: plain TensorFlow wrote no canary"
            for path in written:
                os.remove(path)
        built[route] = Built(model, host, canary)
    return built


def _host_untouched(built: Built) -> bool:
    want = ["canary"] if built.canary.exists() else []
    return os.listdir(built.host) == want and \
        (not want or built.canary.read_text() == HOST_FILE)


def _saves_into_a_missing_directory(built: Built) -> str:
    """What SaveV2 raises in the sandbox: unlike WriteFile it creates no directory, and
    the canary's does not exist there (proof the op ran, and where)."""
    return rf"{re.escape(str(built.host))}; No such file or directory " \
        r"\(node dump\)"


@pytest.mark.parametrize("route", WRITE_ROUTES)
def test_optimize_a_writing_model_leaves_the_host_untouched(route, tmp_path, hostile,
                                                            static_check_off):
    # The write runs (the loader or parity's requests run it) and WriteFile's lands in the
    # sandbox's private /tmp: it succeeds (a failing op fails the run) and the run
    # publishes. SaveV2's fails on the missing directory, by name.
    built = hostile[route]
    before = tree_snapshot(built.model)
    out = tmp_path / "out"
    if HOSTILE[route].op == "SaveV2":
        with pytest.raises(ServingOptError, match=_saves_into_a_missing_directory(built)):
            optimize(built.model, str(out), QUICK)
        assert not (out / "1").exists()
    else:
        report = optimize(built.model, str(out), QUICK)
        assert report.published and report.sandbox.startswith("bubblewrap")
    assert canary_files(str(built.canary)) == [] and os.listdir(built.host) == []
    assert tree_snapshot(built.model) == before  # the input is never modified
    assert os.listdir(out) in ([], ["1"])  # the work directory went with the run


@pytest.mark.parametrize("route", READ_ROUTES)
def test_optimize_a_reading_model_never_sees_the_host_file(route, tmp_path, hostile,
                                                          static_check_off):
    built = hostile[route]
    out = tmp_path / "out"
    with pytest.raises(ServingOptError) as failure:
        optimize(built.model, str(out), QUICK)
    # The table's read ran and found no file where the model runs: the sandbox hid it.
    assert str(built.canary) in str(failure.value), str(failure.value)
    assert "No such file" in str(failure.value) or "NOT_FOUND" in str(failure.value), \
        str(failure.value)
    assert not (out / "1").exists()
    assert _host_untouched(built)


def test_validate_a_hostile_model_leaves_the_host_untouched(hostile, static_check_off):
    from serving_opt.serving.validate import ValidateOptions, validate

    built = hostile["init_op_write"]
    report = validate(os.path.dirname(built.model),
                      ValidateOptions(
                          serving=ServingCheck(server="local",
                                               concurrency=0,
                                               protocols=("grpc",),
                                               load_deadline=120),
                          trust=TrustOptions(allow_file_ops=True)))
    # The server loaded it, so its init op's write ran, into the sandbox's /tmp.
    assert report.ok, report.failures
    assert report.sandbox.startswith("bubblewrap")
    assert os.listdir(built.host) == []


def test_a_requests_write_in_the_served_model_stays_in_the_sandbox(hostile,
                                                                   static_check_off):
    from serving_opt.serving.validate import ValidateOptions, validate

    built = hostile["saver_save_in_signature"]
    # The request's SaveV2 ran in the sandbox and failed there, on the canary's missing
    # directory.
    with pytest.raises(ServingOptError, match=_saves_into_a_missing_directory(built)):
        validate(os.path.dirname(built.model),
                 ValidateOptions(
                     serving=ServingCheck(server="local",
                                          concurrency=2,
                                          duration=1.0,
                                          protocols=("grpc", "rest"),
                                          load_deadline=120),
                     trust=TrustOptions(allow_file_ops=True)))
    assert os.listdir(built.host) == []


def test_compare_a_hostile_model_leaves_the_host_untouched(tmp_path, hostile,
                                                           static_check_off):
    pytest.importorskip("apache_beam")
    from serving_opt.compare import CompareOptions, compare

    built = hostile["gradient_host_op"]
    examples = tmp_path / "examples.jsonl"
    examples.write_text("".join(json.dumps({"x": REQUEST}) + "\n" for _ in range(4)))
    report = compare(built.model, built.model, str(examples),
                     CompareOptions(allow_file_ops=True))
    # Every example ran the gradient, so its WriteFile, in the sandbox.
    assert report.ok and report.examples == 4, report
    assert os.listdir(built.host) == []


def _run_until(process: subprocess.Popen, done, bound: float = 180) -> None:
    """Polls ``done()`` until it holds, ``process`` ended or ``bound`` seconds passed
    (generous: the event comes within seconds), then kills the process group."""
    deadline = time.monotonic() + bound
    while process.poll() is None and not done() and time.monotonic() < deadline:
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, 9)
    process.wait()


def test_a_network_op_dials_a_host_socket_in_plain_tensorflow(tmp_path):
    # The control: the same graph, run by TensorFlow outside the sandbox, connects to a
    # listener on the host's loopback (its client then retries for ever: it is killed).
    listener, address = host_listener()
    listener.setblocking(True)
    listener.settimeout(180)
    model = HOSTILE["register_dataset"].build(str(tmp_path / "models"), "", address)
    script = f"from hostile_models import run_in_plain_tensorflow as run; run({model!r})"
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": repo_paths.TESTS})
    try:
        connection, _ = listener.accept()
        connection.close()
    finally:
        os.killpg(process.pid, 9)
        process.wait()
        listener.close()


def test_a_network_op_reaches_no_host_socket(tmp_path):
    # The same model (the control is above) under optimize, the static check patched out
    # in a separate process: a tf.data service client retries for ever, and a sandbox
    # dies with its parent. The workers' stderr goes to a file, with TensorFlow's info
    # log on: once the client logs that its dial failed and it will retry, the op has
    # dialed and the run is stopped (a connection it made would be in the backlog).
    listener, address = host_listener()
    model = HOSTILE["register_dataset"].build(str(tmp_path / "models"), "", address)
    worker_log = tmp_path / "worker-stderr.log"
    script = textwrap.dedent(f"""
        import tempfile, types
        from serving_opt import inspection, optimize, sandbox
        from serving_opt.options import *  # QUICK's repr names the groups
        from serving_opt.savedmodel import untrusted
        untrusted.refuse_host_ops = lambda *a, **k: None
        inspection.inspect_saved_model = lambda *a, **k: types.SimpleNamespace(risks=[])

        class WorkerStderrToFile:
            def __getattr__(self, name):
                return getattr(tempfile, name)

            def TemporaryFile(self, *a, **k):
                return open({str(worker_log)!r}, "ab+")

        sandbox.tempfile = WorkerStderrToFile()
        try:
            optimize({model!r}, {str(tmp_path / 'out')!r},
                     {QUICK!r})
        except Exception as e:
            print("refused:", e)
    """)
    with open(tmp_path / "run.log", "wb") as run_log:  # a pipe nobody reads could fill
        process = subprocess.Popen([sys.executable, "-c", script], stdout=run_log,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})

    def log() -> str:
        return worker_log.read_text(errors="replace") if worker_log.exists() else ""

    _run_until(process, lambda: "Failed to register dataset" in log())
    try:
        connection, _ = listener.accept()
        connection.close()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    assert not connected, "the model reached a host socket"
    # The op ran and dialed the address; the sandbox's own loopback has nobody there.
    dial = next((line for line in log().splitlines() if "Failed to register" in line), "")
    assert address in dial and "Connection refused" in dial, (dial or log()[-3000:])


@pytest.mark.parametrize("route", list(HOSTILE))
def test_without_the_sandbox_the_static_check_alone_refuses(route, tmp_path, hostile,
                                                            monkeypatch):
    # The sandbox switched off as on a machine without bubblewrap, with the user's
    # consent to run unsandboxed: nothing but the static check stands in the way. The
    # controls (the hostile fixture, the plain-TensorFlow dial) show each route acting.
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "switched off by the test")
    if route in hostile:
        built = hostile[route]
        model = built.model
    else:  # the network route: pointed at a listener nobody reaches when nothing runs
        listener, address = host_listener()
        model = HOSTILE[route].build(str(tmp_path / "models"), "", address)
    out = tmp_path / "out"
    with pytest.raises(ServingOptError, match=rf"^{HOSTILE[route].op} node .*"
                                              r"refusing to optimize it, nothing was run"):
        optimize(model, str(out), OptimizeOptions(
            measure=MeasureOptions(benchmark_runs=0, cold_start=False),
            trust=TrustOptions(allow_unsandboxed=True)))
    assert not (out / "1").exists()
    if route in hostile:
        assert _host_untouched(built)
    else:
        with pytest.raises(BlockingIOError):
            listener.accept()
        listener.close()


def test_no_sandbox_and_no_consent_refuses_before_running(tmp_path, monkeypatch,
                                                          classifier_dir):
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "no user namespaces")
    with pytest.raises(ServingOptError) as failure:
        optimize(classifier_dir, str(tmp_path / "out"), OptimizeOptions(
            measure=MeasureOptions(benchmark_runs=0)))
    assert "no user namespaces" in str(failure.value)
    assert "--allow_unsandboxed" in str(failure.value)
    assert not (tmp_path / "out" / "1").exists()


@pytest.fixture(scope="module")
def through_a_symlink(tmp_path_factory, classifier_dir):
    """The classifier optimized (defaults, measuring off) through /…/current -> /…/real/model,
    once for the module: (scratch dir, report, the output base's entries right after)."""
    scratch = tmp_path_factory.mktemp("symlinked")
    shutil.copytree(classifier_dir, scratch / "real" / "model")
    (scratch / "current").symlink_to(scratch / "real" / "model")
    report = optimize(str(scratch / "current"), str(scratch / "out"),
                      OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    return scratch, report, sorted(os.listdir(scratch / "out"))


def test_the_report_says_the_run_was_sandboxed(through_a_symlink):
    _, report, entries = through_a_symlink
    assert report.published
    assert report.sandbox.startswith("bubblewrap")
    # Only the version is left in the base: the work directory went with the run.
    assert entries == ["1"]


def test_a_sandboxed_process_sees_no_home_no_secrets_and_no_network(tmp_path, monkeypatch):
    readable = tmp_path / "readable"
    readable.mkdir()
    (readable / "data").write_text("ok")
    listener, address = host_listener()
    host, port = address.split(":")
    monkeypatch.setenv("SERVICE_TOKEN", SECRET)
    home = os.path.expanduser("~")
    script = textwrap.dedent("""
        import os, socket, sys
        def attempt(act):
            try:
                act()
                return True
            except OSError as e:
                return e.strerror
        out = {}
        out["home"] = sorted(os.listdir(sys.argv[4])) if os.path.isdir(sys.argv[4]) else []
        out["etc_passwd"] = os.path.exists("/etc/passwd")
        out["readable"] = open(sys.argv[1]).read()
        out["wrote"] = attempt(lambda: open(sys.argv[1] + "-new", "w").close())
        s = socket.socket()
        s.settimeout(60)
        out["net"] = attempt(lambda: s.connect((sys.argv[2], int(sys.argv[3]))))
        out["env"] = sorted(k for k in os.environ if "TOKEN" in k or "SECRET" in k)
        print(repr(out))
    """)
    argv = [sys.executable, "-c", script, str(readable / "data"), host, port, home]

    def run(command, env):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        return eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr

    # The sandbox binds of the home directory only the way to the interpreter (pyenv's).
    interpreter = {os.path.relpath(os.path.realpath(p), home).split(os.sep)[0]
                   for p in (sys.executable, sys.base_prefix)} - {".."}
    # The control: outside the sandbox the same script sees it all, and dials the host.
    plain = run(argv, dict(os.environ))
    assert set(plain.pop("home")) - interpreter, "the control sees nothing in the home"
    assert plain == {"etc_passwd": True, "readable": "ok", "wrote": True, "net": True,
                     "env": ["SERVICE_TOKEN"]}
    listener.accept()[0].close()
    out = run(sandbox.command(argv, sandbox.Policy(read_only=(str(readable),))),
              sandbox.environment())
    assert set(out.pop("home")) <= interpreter
    assert out == {"etc_passwd": False, "readable": "ok",
                   "wrote": "Read-only file system", "net": "Connection refused", "env": []}
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_environment_drops_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/root/key.json")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    env = sandbox.environment()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GOOGLE_APPLICATION_CREDENTIALS" not in env
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["HOME"] == "/tmp"


def test_environment_runs_tensorflow_as_the_process_started_not_as_it_set_itself(
        monkeypatch):
    # The optimizer turns oneDNN off for itself (its caching allocator keeps every loaded
    # model's memory); workers, servers and measurements must get TF's default back.
    from serving_opt.savedmodel import tf_process
    from serving_opt.serving import backends

    monkeypatch.setitem(tf_process.RUNTIME_DEFAULTS, "TF_ENABLE_ONEDNN_OPTS", None)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")

    assert "TF_ENABLE_ONEDNN_OPTS" not in sandbox.environment()
    assert backends.runtime_env("local") == {"TF_ENABLE_ONEDNN_OPTS": None}
    assert sandbox.environment({"TF_ENABLE_ONEDNN_OPTS": "1"})["TF_ENABLE_ONEDNN_OPTS"] == "1"
    monkeypatch.setitem(tf_process.RUNTIME_DEFAULTS, "TF_ENABLE_ONEDNN_OPTS", "0")  # user's choice
    assert sandbox.environment()["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_a_sandbox_result_is_data_only():
    # The boundary's own tests: tests/sandbox/test_sandbox_results.py.
    assert sandbox.loads(sandbox.dumps({"a": (1, 2.0, "x", b"y")})) == {"a": (1, 2.0, "x", b"y")}
    with pytest.raises(ServingOptError):
        sandbox.loads(pickle.dumps({"a": 1}))


def test_relative_paths_reach_the_sandboxed_worker(tmp_path, classifier_dir, monkeypatch):
    # The worker runs in /tmp of its own sandbox: every path it is given is absolute, and
    # the report names the paths as the user gave them.
    shutil.copytree(classifier_dir, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    report = optimize("model", "out", OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    assert (report.input_dir, report.output_dir) == ("model", os.path.join("out", "1"))
    assert os.path.isfile(tmp_path / "out" / "1" / "saved_model.pb")


def test_a_model_reached_through_a_symlink_reaches_the_sandboxed_worker(through_a_symlink):
    # /models/current -> /models/v3: the worker is handed the user's path, and the
    # sandbox has none of the host's symlinks, so the real directory is bound there too.
    scratch, report, _ = through_a_symlink
    assert os.path.islink(scratch / "current")
    assert report.input_dir == str(scratch / "current")
    assert report.sandbox and "bubblewrap" in report.sandbox
    assert os.path.isfile(scratch / "out" / "1" / "saved_model.pb")


def test_docker_needs_consent_to_run_unsandboxed(tmp_path, regressor_base, monkeypatch):
    # Mock: a `docker` stand-in whose engine answers and has the image but whose `run`
    # fails at once, so the test sees only which way validate decided before any
    # container could start (tests/serving/test_docker_engine.py runs the real engine).
    from serving_opt.serving.validate import ValidateOptions, validate

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text('#!/bin/sh\n'
                    'case "$1" in info) echo 28.2;; image|network|ps) ;; *) exit 3;; esac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ServingOptError, match="--allow_unsandboxed"):
        validate(regressor_base, ValidateOptions(
            serving=ServingCheck(server="docker", concurrency=0)))
    report = validate(regressor_base, ValidateOptions(
        serving=ServingCheck(server="docker", concurrency=0, load_deadline=5),
        trust=TrustOptions(allow_unsandboxed=True)))
    assert not report.ok and report.sandbox.startswith("off")


def test_validate_never_runs_the_init_op_of_a_version_it_does_not_check(
        tmp_path, hostile, regressor_dir, static_check_off, unsandboxed):
    # Both layers off (no sandbox, no static check): only the specific version policy
    # keeps version 2's init op, a host writer (its control: the hostile fixture), from
    # running.
    from serving_opt.serving.validate import ValidateOptions, validate

    built = hostile["init_op_write"]
    base = tmp_path / "base"
    shutil.copytree(regressor_dir, base / "1")
    shutil.copytree(built.model, base / "2")
    report = validate(str(base), ValidateOptions(
        version=1,
        serving=ServingCheck(server="local",
                             concurrency=0,
                             protocols=("grpc",),
                             load_deadline=120),
        trust=TrustOptions(allow_file_ops=True, allow_unsandboxed=True)))
    assert report.ok, report.failures
    assert report.ignored_versions == (2,)
    assert os.listdir(built.host) == []
