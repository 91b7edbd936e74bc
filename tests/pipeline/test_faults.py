"""Faults: a killed or interrupted optimizer leaves no server, no half version, no litter.

The kill tests run the real CLI (``serving-opt optimize --validate --server=local``) in a
subprocess, SIGKILL it when its progress line for a stage appears, and then check what
a TF Serving polling the model base would see (no integer version directory, or a
complete one), that no process of the run survives (the local model server stops within
seconds: it watches a pipe only the optimizer held), and that the next run succeeds and
removes the staging directories the killed one left.

Signals are timed by what the child shows, never by sleeping: a progress line on its
stderr, a process it started, a library it mapped, a port its server listens on, or a
write it is blocked in. Every wait has a deadline that fails the test saying what did
not happen.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from polling import wait_until

from serving_opt import samples
from serving_opt.errors import ServingOptError, first_line
from serving_opt.options import MeasureOptions, OutputOptions
from serving_opt.savedmodel import staging as staging_lib
from serving_opt.savedmodel import writer

PREFIX = writer.STAGING_PREFIX


# ------------------------------------------------------------------ helpers


class Cli:
    """``serving-opt optimize`` in a subprocess, its stderr lines readable as they come."""

    def __init__(self, *args: str, stdout=subprocess.DEVNULL, env: dict | None = None) -> None:
        env = env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving_opt.cli", "optimize", *args],
            stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
            # A test runner started in the background ignores SIGINT; the CLI must not.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited before {pattern!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 60.0) -> tuple[int, list[str]]:
        code = self.process.wait(timeout)
        while True:
            line = self._queue.get(timeout=10)
            if line is None:
                return code, self.lines
            self.lines.append(line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


def processes_mentioning(text: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line contains ``text``, but not us."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:  # a zombie's cmdline is empty
            found[int(name)] = cmdline
    return found


def wait_until_gone(text: str, timeout: float = 30.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = processes_mentioning(text)
        if not alive:
            return {}
        time.sleep(0.2)
    return processes_mentioning(text)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie's cmdline is empty)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read())
    except OSError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = parent_of(pid)
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


def descendants_mentioning(ancestor: int, text: str) -> list[int]:
    return [pid for pid in processes_mentioning(text) if descends_from(pid, ancestor)]


def listens_on(pid: int, port: int) -> bool:
    """Whether a socket of ``pid``'s network namespace listens on ``port`` (read from /proc,
    so it works for a server in a sandbox with a network of its own)."""
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
                return True
    return False


def maps_tensorflow(pid: int) -> bool:
    """Whether ``pid`` has loaded TensorFlow's shared library: its import is under way."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "_pywrap_tensorflow_internal" in f.read()
    except OSError:
        return False


def hidden_entries(base: str) -> list[str]:
    return sorted(n for n in os.listdir(base) if n.startswith(PREFIX)) \
        if os.path.isdir(base) else []


def what_tf_serving_sees(base: str) -> dict[str, bool]:
    """Integer version directories of ``base`` -> complete (a SavedModel that parses)."""
    from serving_opt.savedmodel import loader

    seen = {}
    for name in os.listdir(base) if os.path.isdir(base) else ():
        if name.isdigit():
            try:
                loader.read_saved_model(os.path.join(base, name))
                seen[name] = True
            except Exception:  # noqa: BLE001
                seen[name] = False
    return seen


def next_run(source: str, base: str):
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    return optimize(source, base, OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False)))


@pytest.fixture(scope="module")
def source(regressor_dir) -> str:
    return regressor_dir


# ------------------------------------------------------------------ SIGKILL at each stage

STAGES = {
    "freeze": r"^\[2/\d+\] freezing",
    "write": r"^\[6/\d+\] writing",
    "parity": r"^\[7/\d+\] parity",
    "validate": r"starting the local server",
}


def kill_at(stage: str, source: str, base: str) -> None:
    """Runs the CLI into ``base`` and SIGKILLs it at ``stage`` (see STAGES)."""
    cli = Cli(f"--input_dir={source}", f"--output_base={base}", "--validate",
              "--server=local", "--benchmark_runs=0", "--nocold_start", "--concurrency=0")
    line = cli.wait_for(STAGES[stage])
    if stage == "validate":
        # Killed while the model server serves the candidate: once the server exists, the
        # process driving it (its parent, which would check and then publish) is stopped;
        # the server goes on loading until it listens, and then the CLI is killed.
        port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        server = wait_until(lambda: descendants_mentioning(cli.process.pid, f"--port={port}"),
                            "the local server started")[0]
        os.kill(parent_of(server), signal.SIGSTOP)
        wait_until(lambda: listens_on(server, port), "the local server listening")
    cli.kill()
    if stage == "validate":
        # Its command line names a config file in the sandbox, not the base: by its pid.
        wait_until(lambda: not alive(server), "the local server gone", timeout=30.0)


def test_sigkill_at_each_stage_leaves_nothing_running_and_the_next_run_cleans_up(
        source, tmp_path):
    # One base for every stage: each killed run's successor is the next stage's run (which
    # removes what the killed one left before it starts freezing), and a last run that
    # publishes: one full optimize instead of one per stage.
    base = str(tmp_path / "models" / "reg")
    left_before: list[str] = []
    for stage in STAGES:
        kill_at(stage, source, base)

        # No process of the run survives: the server notices its parent is gone (pipe EOF).
        assert wait_until_gone(base) == {}, stage
        # A TF Serving polling the base sees no version (or only a complete one).
        assert what_tf_serving_sees(base) == {}, stage
        left = hidden_entries(base)
        # This run removed what the one killed before it left, before freezing.
        assert not set(left_before) & set(left), (stage, left_before, left)
        if stage != "freeze":
            assert any(not n.endswith(staging_lib.OWNER_SUFFIX) for n in left), (stage, left)
        left_before = left

    report = next_run(source, base)

    assert report.output_dir == os.path.join(base, "1")
    assert what_tf_serving_sees(base) == {"1": True}
    assert hidden_entries(base) == []  # the killed run's staging dirs (and records) removed


def test_a_live_runs_staging_dirs_are_never_removed_by_another_run(source, tmp_path):
    base = str(tmp_path / "reg")
    cli = Cli(f"--input_dir={source}", f"--output_base={base}", "--version=1",
              "--benchmark_runs=0", "--nocold_start")
    cli.wait_for(r"^\[6/\d+\] writing")
    os.kill(cli.process.pid, signal.SIGSTOP)  # alive, but not finishing meanwhile
    try:
        theirs = [n for n in hidden_entries(base) if not n.endswith(staging_lib.OWNER_SUFFIX)]
        assert theirs  # at least the freeze scratch dir
        report = next_run_version(source, base, 2)
        assert report.output_dir == os.path.join(base, "2")
        assert all(os.path.isdir(os.path.join(base, n)) for n in theirs)
    finally:
        os.kill(cli.process.pid, signal.SIGCONT)
    code, lines = cli.finish()
    assert code == 0, lines
    assert what_tf_serving_sees(base) == {"1": True, "2": True}
    assert hidden_entries(base) == []


def next_run_version(source: str, base: str, version: int):
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    return optimize(source, base, OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=version)))


# ------------------------------------------------------------------ owner records


def _claimed(base: str, record: dict | None = None) -> str:
    path = staging_lib.make_claimed_dir(base, f"{PREFIX}7-")
    if record is not None:
        staging_lib.claim(path, record)
    return path


def test_stale_dirs_are_removed_only_when_their_owner_is_gone(tmp_path):
    base = str(tmp_path)
    mine = _claimed(base)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        other_live = _claimed(base, staging_lib.owner_record(sleeper.pid))
        dead_pid = subprocess.Popen(["true"])
        dead_pid.wait()
        dead = _claimed(base, staging_lib.owner_record(dead_pid.pid))
        reused = _claimed(base, dict(staging_lib.owner_record(sleeper.pid), start="1"))
        rebooted = _claimed(base, dict(staging_lib.owner_record(), boot="another-boot"))
        other_host = _claimed(base, dict(staging_lib.owner_record(dead_pid.pid),
                                         host="another-host"))
        young = tempfile_dir(base, f"{PREFIX}young-")
        old = tempfile_dir(base, f"{PREFIX}7-unclaimed-")
        os.utime(old, (time.time() - 2 * staging_lib.UNCLAIMED_MAX_AGE_SECONDS,) * 2)
        moved_aside = tempfile_dir(base, f"{PREFIX}old-3-")  # a version --overwrite moved
        os.utime(moved_aside, (0, 0))

        removed = staging_lib.remove_stale(base)

        assert sorted(removed) == sorted([dead, reused, rebooted, old])
        for kept in (mine, other_live, other_host, young, moved_aside):
            assert os.path.isdir(kept)
        for gone in removed:
            assert not os.path.exists(staging_lib.owner_path(gone))
        sleeper.kill()
        sleeper.wait()
        assert staging_lib.remove_stale(base) == [other_live]
    finally:
        sleeper.kill()
        sleeper.wait()
    writer.discard(mine)
    assert not os.path.exists(staging_lib.owner_path(mine))


def test_a_record_without_its_directory_is_swept_once_its_owner_is_gone(tmp_path):
    # Killed between writing the record and making the directory (make_claimed_dir).
    base = str(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = os.path.join(base, f"{PREFIX}7-x")
    staging_lib.claim(orphan, staging_lib.owner_record(dead.pid))
    live = os.path.join(base, f"{PREFIX}7-y")
    staging_lib.claim(live)
    empty = os.path.join(base, f"{PREFIX}7-z{staging_lib.OWNER_SUFFIX}")
    open(empty, "w").close()  # killed before the record was written

    assert staging_lib.remove_stale(base) == []

    assert sorted(os.listdir(base)) == [os.path.basename(live) + staging_lib.OWNER_SUFFIX]


def tempfile_dir(base: str, prefix: str) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=prefix, dir=base)


def test_the_published_version_holds_no_owner_record(tmp_path):
    base = str(tmp_path)
    staged = writer.make_staging_dir(base, 1)
    open(os.path.join(staged, "saved_model.pb"), "wb").close()
    assert os.path.isfile(staging_lib.owner_path(staged))

    target = writer.publish(staged, base, 1)

    assert os.listdir(target) == ["saved_model.pb"]
    assert os.listdir(base) == ["1"]


# ------------------------------------------------------------------ servers die with us

_FAKE_SERVER = """\
    import json, os, signal, sys, time
    out = os.environ["FAKE_SERVER_OUT"]
    def term(*_):
        # What `docker run` does with a signal (--sig-proxy): pass it on and exit.
        with open(out + ".term", "w") as f:
            f.write("SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    with open(out + ".argv", "w") as f:
        json.dump(sys.argv, f)
    # Written whole, then renamed: the test reads it as soon as it exists, and the
    # SIGTERM it then causes must not find it half-written.
    with open(out + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(out + ".pid.tmp", out + ".pid")
    while True:
        time.sleep(0.1)
"""

_PARENT = """\
    import sys, time
    from serving_opt.serving import backends
    server = backends.make_server(sys.argv[1], backends.ServerSpec("m", sys.argv[2]))
    server.start()
    print(server.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("backend,executable", [("binary", "tensorflow_model_server"),
                                                ("docker", "docker")])
def test_a_server_client_gets_sigterm_when_its_parent_is_killed(backend, executable,
                                                                tmp_path):
    """No TF Serving binary and no Docker engine on this machine: stand-ins on PATH record
    what they were run with and whether the kernel's parent-death SIGTERM reached them.
    For docker that SIGTERM is what `docker run` proxies to the container (then --rm);
    a SIGKILLed docker client cannot stop its container (backends.py says so)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / executable
    fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent(_FAKE_SERVER))
    fake.chmod(0o755)
    out = str(tmp_path / "fake")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_SERVER_OUT=out)
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_PARENT), backend,
                               str(tmp_path / "models")], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        pid = int(parent.stdout.readline())
        wait_until(lambda: os.path.exists(out + ".pid"), "the stand-in server started")
        parent.kill()
        parent.wait()

        wait_until(lambda: os.path.exists(out + ".term"),
                   "SIGTERM reached the server (else it outlived its parent)", timeout=30.0)
        assert wait_until_gone(out) == {}
        assert pid == int(open(out + ".pid").read())
    finally:
        parent.kill()
        parent.wait()
    argv = json.load(open(out + ".argv"))
    if backend == "docker":
        assert argv[1:3] == ["run", "--rm"] and argv[3] == "--name"
        assert argv[4].startswith("serving-opt-")


def test_the_server_log_is_unlinked_and_its_tail_kept(tmp_path):
    from serving_opt.serving import backends

    server = backends.ServerProcess("local", ["sh", "-c", "echo loading; echo failed; "
                                              "sleep 30"], backends.free_port())
    server.start()
    try:
        wait_until(lambda: "failed" in server.log_tail(), "the server's second log line")
        # Nothing in /tmp even if we were killed now.
        assert os.readlink(f"/proc/self/fd/{server._log.fileno()}").endswith("(deleted)")
    finally:
        server.stop()
    assert server.log_tail() == "loading\nfailed\n"
    assert server.exit_code() is not None


# ------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_while_tensorflow_is_imported_is_one_line(source, tmp_path):
    base = str(tmp_path / "reg")
    cli = Cli(f"--input_dir={source}", f"--output_base={base}")
    # The CLI never imports TensorFlow itself: its sandboxed worker does, from the start
    # (it maps TensorFlow's library early in an import that then runs for seconds).
    importing = wait_until(
        lambda: [p for p in descendants_mentioning(cli.process.pid, "") if maps_tensorflow(p)],
        "TensorFlow's import started in a process of the run", timeout=60.0)
    cli.process.send_signal(signal.SIGINT)
    code, lines = cli.finish()

    assert code == 130
    assert lines[-1] == ("serving-opt optimize: interrupted; nothing was published; any "
                         "server or staging directory it had started is stopped and removed")
    # Nothing else but progress lines ("[1/11] reading ..."): no traceback, no TF logs.
    assert all(re.match(r"\[\d+/\d+\] |\s", line) for line in lines[:-1]), lines
    assert not os.path.exists(base) or os.listdir(base) == []
    for pid in importing:
        wait_until(lambda p=pid: not alive(p), f"the importing process {pid} gone",
                   timeout=30.0)


def test_ctrl_c_during_the_benchmark_says_nothing_was_published(source, tmp_path):
    base = str(tmp_path / "reg")
    cli = Cli(f"--input_dir={source}", f"--output_base={base}", "--nocold_start",
              "--benchmark_runs=100000")
    cli.wait_for(r"^\[9/\d+\] benchmark")
    # Interrupted while the measuring process (it runs 100000 timed runs) is alive.
    measuring = wait_until(
        lambda: descendants_mentioning(cli.process.pid, "serving_opt.core.measuring"),
        "the benchmark's measuring process started")
    cli.process.send_signal(signal.SIGINT)
    code, lines = cli.finish()

    assert code == 130
    assert not any("Traceback" in line for line in lines), lines
    assert lines[-1].startswith("serving-opt optimize: interrupted; nothing was published")
    assert what_tf_serving_sees(base) == {}
    assert hidden_entries(base) == []
    assert wait_until_gone(base) == {}
    for pid in measuring:
        wait_until(lambda p=pid: not alive(p), f"the measuring process {pid} gone",
                   timeout=30.0)


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is already full: a process writing to it blocks at once."""
    import fcntl

    read_end, write_end = os.pipe()
    flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags)  # the child must block, not fail
    return read_end, write_end


def test_ctrl_c_after_publishing_names_the_published_version(source, tmp_path):
    from serving_opt.savedmodel import loader

    base = str(tmp_path / "reg")
    # The CLI prints its report on stdout only once optimize has returned; with stdout a
    # full pipe (and unbuffered), that first write blocks, so the CLI cannot exit on its
    # own before the Ctrl-C.
    read_end, write_end = full_pipe()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    cli = Cli(f"--input_dir={source}", f"--output_base={base}", "--nocold_start",
              "--benchmark_runs=0", stdout=write_end, env=env)
    os.close(write_end)
    try:
        published = cli.wait_for(r"^\s*published ")
        assert published.split("published ", 1)[1] == os.path.join(base, "1")
        # Optimize's last act is removing its work directory and that directory's owner
        # record; once both are gone it has returned (or is returning) to the CLI.
        wait_until(lambda: not hidden_entries(base), "the run's work directory removed")
        # Blocked on its full stdout, it cannot have exited: if it has, something read the
        # pipe, and the interrupt below would test nothing.
        assert cli.process.poll() is None, ("exited before the interrupt", cli.lines[-3:])
        cli.process.send_signal(signal.SIGINT)
        # Read what it printed, so nothing it writes while exiting blocks it again.
        threading.Thread(target=_drain, args=(read_end,), daemon=True).start()
        code, lines = cli.finish()
    finally:
        cli.process.kill()

    assert code == 130, lines[-6:]  # the end says where the interrupt landed
    assert lines[-1] == (f"serving-opt optimize: interrupted after publishing "
                         f"{os.path.join(base, '1')} (complete); any server or staging "
                         "directory it had started is stopped and removed"), lines
    assert not any("Traceback" in line for line in lines), lines
    # The published version is whole: it loads and answers like the source.
    assert what_tf_serving_sees(base) == {"1": True}
    assert hidden_entries(base) == []
    examples = samples.sample_examples(8, seed=5)
    answers = []
    for model in (source, os.path.join(base, "1")):
        sess, meta_graph = loader.load_session(model)
        try:
            sig = meta_graph.signature_def["serving_default"]
            feed = {sig.inputs[next(iter(sig.inputs))].name: examples}
            answers.append(sess.run({k: v.name for k, v in sig.outputs.items()}, feed))
        finally:
            sess.close()
    for key in answers[0]:
        np.testing.assert_allclose(answers[1][key], answers[0][key], rtol=1e-4, atol=1e-5)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 1 << 16):
            pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------ errors keep the cause


def test_a_truncated_data_file_error_keeps_the_cause(source, model_copy):
    from serving_opt.savedmodel import loader

    model = model_copy(source)
    variables = os.path.join(model, "variables")
    data = [n for n in os.listdir(variables) if n.startswith("variables.data-")][0]
    path = os.path.join(variables, data)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)

    with pytest.raises(ServingOptError) as info:
        loader.load_session(model)

    message = info.value.one_line()
    assert "\n" not in message
    assert "Read less bytes than requested" in message, message
    assert "node save/RestoreV2" in message


def test_first_line_skips_tensorflow_headers_and_stack_frames():
    text = ("Graph execution error:\n\nDetected at node 'x' defined at (most recent call "
            "last):\n  File \"a.py\", line 1, in <module>\nNode: 'x'\n"
            "Data loss: Checksum does not match\n\t [[{{node x}}]]\n\n"
            "Original stack trace for 'x':\n  File \"a.py\", line 1, in <module>\n")
    assert first_line(RuntimeError(text)) == \
        "Graph execution error: Data loss: Checksum does not match (node x)"
    assert first_line(ValueError("plain\nsecond")) == "plain"
    assert first_line(ValueError("")) == "ValueError"
