"""What the sandbox shows a model, the host resources it may take, and what optimize
publishes. Each route is built as it was found: a real
SavedModel whose init op reads what the sandbox shows into a variable (freezing folds
it into the published graph), a host canary, a listener or a writer; the host and the
published model are inspected afterwards.

The static check would refuse these models' ReadFile/WriteFile ops: the runs pass
``allow_file_ops`` so that the sandbox alone stands in the way (as tests/sandbox/test_sandbox.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import tree_snapshot
from hostile_models import run_in_plain_tensorflow
from hostile_models_sandbox_view import (
    SPAWN_300_THREADS,
    build_init_op_blocks,
    build_init_op_lists,
    build_init_op_reads,
    build_request_plants,
)

from serving_opt import OptimizeOptions, optimize, sandbox
from serving_opt.errors import ServingOptError
from serving_opt.options import GateOptions, MeasureOptions, TrustOptions

QUICK = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False),
                        trust=TrustOptions(allow_file_ops=True), gate=GateOptions(parity_batches=1))
SECRET = "host-secret-30c4e1"


def _published(out) -> bytes:
    """Every published file's bytes, concatenated (empty when nothing was published)."""
    return b"".join(tree_snapshot(str(out)).values()) if out.exists() else b""


# --- item 3: host facts baked into the published model ----------------------------------

PROC_FILES = ["/proc/self/environ", "/proc/sys/kernel/hostname", "/proc/self/mountinfo"]


@pytest.fixture(scope="module")
def proc_readers(tmp_path_factory) -> dict[str, str]:
    """A model per /proc file, built once, whose init op reads it; the control: loaded by
    plain TensorFlow outside the sandbox, each read the host's file into ``seen``."""
    root = tmp_path_factory.mktemp("proc")
    models = {}
    for i, path in enumerate(PROC_FILES):
        model = build_init_op_reads(str(root), path, route=f"reads_{i}")
        seen = run_in_plain_tensorflow(model)["seen"][0]
        with open(path, "rb") as f:
            assert seen and seen.splitlines()[0] == f.read().splitlines()[0], path
        models[path] = model
    return models


@pytest.mark.parametrize("path", PROC_FILES)
def test_a_model_reads_nothing_of_the_host_in_proc(tmp_path, monkeypatch, proc_readers,
                                                   path):
    monkeypatch.setenv("TF_TOKEN_app_terraform_io", f"{SECRET}-tf-token")
    out = tmp_path / "out"
    # The init op's read ran and found no such file in the sandbox's /proc.
    with pytest.raises(ServingOptError, match=rf"{path}.*No such file or directory"):
        optimize(proc_readers[path], str(out), QUICK)
    assert _published(out) == b""


def test_procfs_in_the_sandbox_shows_no_host_path(tmp_path):
    # Every file under the sandbox's /proc, read from inside: the host directories it
    # binds (the model's, the checkout's) appear nowhere; neither do /proc/self/mountinfo
    # and the environment.
    bound = tmp_path / "models"
    bound.mkdir()
    # The control: a process's own /proc/self/environ shows its environment.
    plain = subprocess.run([sys.executable, "-c",
                            "import sys; sys.stdout.buffer.write(open('/proc/self/environ',"
                            " 'rb').read())"], capture_output=True, env={"CANARY": SECRET})
    assert SECRET.encode() in plain.stdout
    script = textwrap.dedent("""
        import os
        seen = []
        for root, dirs, files in os.walk("/proc"):
            for name in files:
                try:
                    with open(os.path.join(root, name), "rb") as f:
                        seen.append(f.read())
                except OSError:
                    pass
        print(repr(sorted(os.listdir("/proc"))))
        print(repr(b"".join(seen)))
    """)
    done = subprocess.run(sandbox.command([sys.executable, "-c", script],
                                          sandbox.Policy(read_only=(str(bound),))),
                          capture_output=True, text=True, timeout=120,
                          env=sandbox.environment({"CANARY": SECRET}))
    listing, contents = done.stdout.strip().splitlines()[-2:]
    assert eval(listing) == ["cpuinfo", "meminfo", "self"]  # noqa: S307 - our own repr
    contents = eval(contents)  # noqa: S307 - our own repr
    assert str(tmp_path).encode() not in contents and SECRET.encode() not in contents
    assert str(sandbox.package_parent()).encode() not in contents


def test_environment_keeps_settings_by_name_only(monkeypatch):
    for name in ("TF_TOKEN_x", "TF_VAR_y", "CUDA_SECRET", "OMP_SECRET_TOKEN", "KMP_TOKEN"):
        monkeypatch.setenv(name, SECRET)
    for name in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                 "KMP_AFFINITY", "ONEDNN_MAX_CPU_ISA", "SERVING_OPT_CACHE", "LC_ALL"):
        monkeypatch.setenv(name, "1")
    env = sandbox.environment()
    assert SECRET not in env.values()
    assert all(env[name] == "1" for name in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS",
                                             "CUDA_VISIBLE_DEVICES", "KMP_AFFINITY",
                                             "ONEDNN_MAX_CPU_ISA", "SERVING_OPT_CACHE",
                                             "LC_ALL"))


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            children = []
        found += children
        todo += children
    return found


def _host_view_of_sandboxed_python(policy=None) -> tuple[str, dict, str]:
    """(what the process says of itself, its /proc/<pid>/status as the host sees it, its
    limits) for a Python process started in the sandbox."""
    script = ("import os, socket, sys; print(os.getuid(), os.getgid(), socket.gethostname(),"
              " flush=True); sys.stdin.read()")
    process = sandbox.popen([sys.executable, "-c", script], policy or sandbox.Policy(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        said = process.stdout.readline().strip()
        status, limits = {}, ""
        for pid in _descendants(process.pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"socket.gethostname" not in f.read():
                    continue
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":\t", 1) for line in f.read().splitlines()
                              if ":\t" in line)
            with open(f"/proc/{pid}/limits") as f:
                limits = f.read()
        return said, status, limits
    finally:
        process.stdin.close()
        process.wait(timeout=60)
        sandbox.release(process)


def test_the_model_runs_as_nobody_on_a_host_named_sandbox_without_capabilities():
    said, status, _ = _host_view_of_sandboxed_python()
    assert said == f"65534 65534 {sandbox.HOSTNAME}"
    assert status["CapEff"].strip() == "0000000000000000"
    assert status["CapBnd"].strip() == "0000000000000000"
    assert status["Seccomp"].strip() == "2"  # a filter is loaded


def test_a_sandbox_starts_no_more_threads_than_its_limit():
    # Held by a pids cgroup of its own where the host allows one (root included), else by
    # RLIMIT_NPROC in its user namespace (which the kernel does not apply to root).
    # The control: outside the sandbox the same script starts all 300.
    plain = subprocess.run([sys.executable, "-c", SPAWN_300_THREADS], capture_output=True,
                           text=True, timeout=120)
    assert int(plain.stdout.split()[-1]) == 300
    process = sandbox.popen([sys.executable, "-c", SPAWN_300_THREADS],
                            sandbox.Policy(max_threads=40),
                            stdout=subprocess.PIPE, text=True)
    try:
        started = int(process.communicate(timeout=120)[0].split()[-1])
    finally:
        sandbox.release(process)
    assert 0 < started < 40


def test_a_sandboxs_cgroup_goes_with_it():
    process = sandbox.popen([sys.executable, "-c", "pass"], sandbox.Policy())
    process.wait(timeout=60)
    cgroup = process.serving_opt_cgroup
    sandbox.release(process)
    assert cgroup is None or not os.path.exists(cgroup)


# --- item 4: --compare_examples binds the matched files only ----------------------------

def test_compare_examples_bind_only_the_matched_files(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam")
    import json

    data = tmp_path / "data"
    data.mkdir()
    (data / "eval-0.jsonl").write_text(json.dumps({"x": [1.0, 2.0, 3.0]}) + "\n")
    (data / f"{SECRET}.txt").write_text(SECRET)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(data / "agent.sock"))
    listener.listen(1)
    try:
        model = build_init_op_lists(str(tmp_path / "models"), str(data / "*"))
        out = tmp_path / "out"
        # The control: outside the sandbox the model lists the secret and the socket.
        listed = run_in_plain_tensorflow(model)["seen"][0]
        assert f"{SECRET}.txt".encode() in listed and b"agent.sock" in listed
        monkeypatch.chdir(data)
        optimize(model, str(out), dataclasses.replace(QUICK, gate=dataclasses.replace(
            QUICK.gate, compare_examples="eval-*.jsonl")))
        published = _published(out)
        assert b"eval-0.jsonl" in published  # the model saw the examples
        assert SECRET.encode() not in published and b"agent.sock" not in published
    finally:
        listener.close()


def test_glob_files_lists_matched_files_only(tmp_path, monkeypatch):
    (tmp_path / "a-1.tfrecord").write_text("1")
    (tmp_path / "a-2.tfrecord").write_text("2")
    (tmp_path / "a-dir.tfrecord").mkdir()
    (tmp_path / "secret").write_text(SECRET)
    monkeypatch.chdir(tmp_path)
    assert sandbox.glob_files("a-*.tfrecord") == [str(tmp_path / "a-1.tfrecord"),
                                                  str(tmp_path / "a-2.tfrecord")]
    assert sandbox.glob_files("gs://bucket/a-*") == []


# --- item 6: host resources --------------------------------------------------------------

def test_a_worker_progress_line_is_bounded(tmp_path):
    lines = []
    with sandbox.Worker(sandbox.Policy(), str(tmp_path), lines.append, preload="none") as w:
        w.call("serving_opt.sandbox:say", "x" * (8 << 20))
    assert len(lines) == 1 and 0 < len(lines[0]) <= sandbox.MAX_LINE_BYTES


def test_a_models_stderr_is_kept_to_its_tail(tmp_path, monkeypatch):
    import tempfile

    import tensorflow as tf

    files = []

    class Recorded:
        def __getattr__(self, name):
            return getattr(tempfile, name)

        def TemporaryFile(self, *a, **k):  # noqa: N802 - tempfile's name
            f = open(tmp_path / f"stderr-{len(files)}", "wb+")  # noqa: SIM115
            files.append(f.name)
            return f

    monkeypatch.setattr(sandbox, "tempfile", Recorded())

    def shout():
        big = tf.strings.reduce_join(tf.fill([16 << 10], "e" * 1024))  # 16 MiB
        with tf.control_dependencies([tf.print(big, output_stream=sys.stderr)]):
            return tf.constant("printed")

    from hostile_models_sandbox_view import _leaking_model

    model = _leaking_model(str(tmp_path / "models" / "shout" / "1"), shout)
    optimize(model, str(tmp_path / "out"), QUICK)
    assert files and all(os.path.getsize(f) <= sandbox.STDERR_MAX_BYTES for f in files)
    # The 16 MiB print reached a worker's stderr, and only its tail was kept.
    assert any(b"e" * (64 << 10) in open(f, "rb").read() for f in files)  # noqa: SIM115


def test_the_sandboxs_tmpfs_mounts_are_sized_and_dev_is_read_only(tmp_path):
    script = textwrap.dedent("""
        import os
        out = {}
        for path, size in (("/tmp/big", 32 << 20), ("/dev/shm/big", 300 << 20),
                           ("/dev/big", 1 << 20), ("/big", 1 << 20)):
            try:
                with open(path, "wb") as f:
                    for _ in range(size >> 20):
                        f.write(b"\\0" * (1 << 20))
                out[path] = "wrote"
            except OSError as e:
                out[path] = e.strerror
            if os.path.exists(path):
                os.unlink(path)
        print(repr(out))
    """)
    policy = sandbox.Policy(tmp_bytes=8 << 20)
    done = subprocess.run(sandbox.command([sys.executable, "-c", script], policy),
                          capture_output=True, text=True, timeout=120,
                          env=sandbox.environment())
    out = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert out == {"/tmp/big": "No space left on device",
                   "/dev/shm/big": "No space left on device",
                   "/dev/big": "Read-only file system", "/big": "Read-only file system"}


@pytest.fixture(scope="module")
def blocking_model(tmp_path_factory) -> str:
    """The model whose init op waits on a queue nobody fills, built once; the control:
    run by plain TensorFlow, its init op is still waiting when a 2 s deadline cancels it
    (an op that could finish would have at once)."""
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl

    model = build_init_op_blocks(str(tmp_path_factory.mktemp("blocks")))
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as session:
        loader_impl.SavedModelLoader(model).load_graph(graph, ["serve"])
        with pytest.raises(tf.errors.DeadlineExceededError):
            session.run("main_op", options=tf.compat.v1.RunOptions(timeout_in_ms=2000))
    return model


def test_a_model_that_blocks_for_ever_is_stopped(tmp_path, blocking_model):
    said = []
    with pytest.raises(ServingOptError, match="--sandbox_timeout_seconds=12"):
        optimize(blocking_model, str(tmp_path / "out"),
                 dataclasses.replace(QUICK, trust=dataclasses.replace(
                     QUICK.trust, sandbox_timeout_seconds=12)), progress=said.append)
    # The worker had reached the stage that runs the init op: it was the model, blocking,
    # that the limit stopped (not a slow start).
    assert any("freezing variables" in line for line in said), said
    assert not (tmp_path / "out" / "1").exists()


def test_seccomp_denies_what_no_model_needs():
    script = textwrap.dedent("""
        import ctypes, socket
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        for name, number in (("ptrace", 101), ("bpf", 321), ("keyctl", 250),
                             ("perf_event_open", 298), ("mount", 165), ("unshare", 272),
                             ("io_uring_setup", 425)):
            ctypes.set_errno(0)
            result = libc.syscall(number, 0, 0, 0, 0, 0)
            out[name] = (result, ctypes.get_errno())
        s = socket.socket()
        s.bind(("127.0.0.1", 0))  # the local server and its client talk on loopback
        out["tcp"] = True
        print(repr(out))
    """)
    fd = sandbox.seccomp_pipe()
    if fd is None:
        pytest.skip("no seccomp filter for this architecture")
    # The control: the same sandbox without the filter lets unshare(0), a no-op, succeed.
    plain = subprocess.run(sandbox.command([sys.executable, "-c", script], sandbox.Policy()),
                           capture_output=True, text=True, timeout=120,
                           env=sandbox.environment())
    assert eval(plain.stdout.strip().splitlines()[-1])["unshare"] == (0, 0)  # noqa: S307
    try:
        done = subprocess.run(sandbox.command([sys.executable, "-c", script],
                                              sandbox.Policy(), fd),
                              capture_output=True, text=True, timeout=120, pass_fds=(fd,),
                              env=sandbox.environment())
    finally:
        os.close(fd)
    out = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert out.pop("tcp") is True
    assert out == {name: (-1, 1) for name in out}, out


# --- item 7: what gets published ----------------------------------------------------------

def test_files_the_model_wrote_into_its_candidate_are_not_published(tmp_path):
    out = tmp_path / "out"
    pattern = os.path.join(str(out), ".serving-opt-staging-run-*", ".serving-opt-staging-*")
    model = build_request_plants(str(tmp_path / "models"), pattern, SECRET)
    # The control: run by plain TensorFlow, a request plants into a candidate it finds.
    candidate = out / ".serving-opt-staging-run-c" / ".serving-opt-staging-1-c"
    candidate.mkdir(parents=True)
    run_in_plain_tensorflow(model)
    assert (candidate / "planted.txt").read_text() == SECRET
    assert (candidate / "assets.extra" / "tf_serving_warmup_requests").exists()
    shutil.rmtree(out)
    report = optimize(model, str(out), QUICK)
    published = tree_snapshot(str(out / "1"))
    assert sorted(published) == ["saved_model.pb"], sorted(published)  # frozen: no variables
    assert any("planted.txt" in warning for warning in report.warnings), report.warnings


def test_a_hard_linked_asset_is_refused(tmp_path, classifier_dir):
    host_secret = tmp_path / "host" / "secret"
    host_secret.parent.mkdir()
    host_secret.write_text(SECRET)
    model = tmp_path / "model"
    shutil.copytree(classifier_dir, model)
    (model / "assets").mkdir(exist_ok=True)
    os.link(host_secret, model / "assets" / "linked.txt")
    # The control: what a copy of the model would carry is the host's secret.
    assert (model / "assets" / "linked.txt").read_text() == SECRET
    out = tmp_path / "out"
    with pytest.raises(ServingOptError, match="hard link"):
        optimize(str(model), str(out), QUICK)
    assert SECRET.encode() not in _published(out)


def test_the_parent_publishes_only_a_staging_directory_it_created(tmp_path):
    import types

    from serving_opt.pipeline import optimizer
    work = tmp_path / "base" / ".serving-opt-staging-run-x"
    (work / ".serving-opt-staging-1-y").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / ".serving-opt-staging-1-z"
    elsewhere.mkdir(parents=True)
    (work / ".serving-opt-staging-1-link").symlink_to(elsewhere)
    run = types.SimpleNamespace(work_dir=str(work))
    assert optimizer._own_staging(run, str(work / ".serving-opt-staging-1-y")) == \
        str(work / ".serving-opt-staging-1-y")
    for bad in (str(elsewhere), str(work / ".serving-opt-staging-1-link"), str(work),
                str(work / ".serving-opt-staging-1-y" / ".."), "/", None):
        with pytest.raises(ServingOptError, match="not a staging directory"):
            optimizer._own_staging(run, bad)


def test_compare_on_a_model_that_blocks_for_ever_is_stopped_by_the_default_limit(
        tmp_path, blocking_model, monkeypatch):
    pytest.importorskip("apache_beam")
    import json

    from serving_opt.compare import CompareOptions, compare

    examples = tmp_path / "requests.jsonl"
    examples.write_text(json.dumps({"x": [[1.0, 2.0, 3.0]]}) + "\n")
    # No limit given: the default applies (made short here; the value passed through
    # when one is given: test_sandbox_limits.py).
    monkeypatch.setattr(sandbox, "DEFAULT_TIMEOUT_SECONDS", 12.0)
    said = []
    with pytest.raises(ServingOptError, match="--sandbox_timeout_seconds=12"):
        compare(blocking_model, blocking_model, str(examples),
                CompareOptions(allow_file_ops=True), progress=said.append)
    # The pipeline had started, the models loading in it: the model was what blocked.
    assert any(line.startswith("comparing 1 signature") for line in said), said


def test_the_cgroups_of_a_killed_caller_are_swept_by_the_next():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now: a caller SIGKILLed before it removed its cgroup
    live = sandbox.make_pids_cgroup(64)
    assert live is not None, "no pids cgroup can be made here"
    stale = os.path.join(os.path.dirname(live), f"serving-opt-{gone.pid}-0")
    os.mkdir(stale)
    again = sandbox.make_pids_cgroup(64)
    try:
        assert not os.path.exists(stale)
        assert os.path.isdir(live)  # this process's own are never swept
    finally:
        for path in (live, again, stale):
            sandbox.remove_cgroup(path)
