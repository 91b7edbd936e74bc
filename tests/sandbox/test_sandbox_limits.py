"""What a sandbox may take from the host beyond its view: no host cgroup facts, bounded
writes to the host's disk, and a bounded number of threads where no pids cgroup can be
made and the host user is root (RLIMIT_NPROC does not apply to uid 0)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import types

import pytest
import tensorflow as tf
from conftest import tree_snapshot
from hostile_models_sandbox_view import (
    SPAWN_300_THREADS,
    _leaking_model,
    build_init_op_lists,
)

from serving_opt import OptimizeOptions, optimize, sandbox
from serving_opt.errors import ServingOptError
from serving_opt.options import GateOptions, MeasureOptions, ServingCheck, TrustOptions

QUICK = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False),
                        trust=TrustOptions(allow_file_ops=True), gate=GateOptions(parity_batches=1))
MIB = 1 << 20


def _run(script: str, policy: sandbox.Policy, *args: str) -> tuple[subprocess.Popen, str]:
    process = sandbox.popen([sys.executable, "-c", textwrap.dedent(script), *args], policy,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=180)
    finally:
        process.kill()
        sandbox.release(process)
    return process, out


# --- no host cgroup facts -----------------------------------------------------------

def test_a_model_lists_nothing_of_the_hosts_cgroups(tmp_path):
    assert os.listdir("/sys/fs/cgroup")  # CONTROL: the host has a tree to leak
    model = build_init_op_lists(str(tmp_path / "models"), "/sys/fs/cgroup/*")
    out = tmp_path / "out"
    optimize(model, str(out), QUICK)
    published = b"".join(tree_snapshot(str(out)).values())
    assert b"nothing read" not in published  # the listing ran, and replaced it
    assert b"/sys/fs/cgroup" not in published


# --- writes to the host's disk ----------------------------------------------------------

_WRITE_FILES = """
    import os, sys, time
    directory, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        for i in range(count):
            with open(os.path.join(directory, f"f{i}"), "wb") as f:
                f.write(b"x" * size)
    except OSError as e:
        print(e.strerror, flush=True)
    print("written", flush=True)
    time.sleep(float(sys.argv[4]))
"""


def _written(directory) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def test_no_file_written_is_larger_than_the_write_limit(tmp_path):
    policy = sandbox.Policy(writable=(str(tmp_path),), write_bytes=8 * MIB)
    _, out = _run(_WRITE_FILES, policy, str(tmp_path), "1", str(32 * MIB), "0")
    assert "File too large" in out
    assert _written(tmp_path) <= 8 * MIB
    # CONTROL: without the limit the same process writes it all.
    (tmp_path / "f0").unlink()
    _run(_WRITE_FILES, sandbox.Policy(writable=(str(tmp_path),), write_bytes=None),
         str(tmp_path), "1", str(32 * MIB), "0")
    assert _written(tmp_path) == 32 * MIB


def test_many_files_past_the_write_limit_stop_the_sandbox(tmp_path):
    policy = sandbox.Policy(writable=(str(tmp_path),), write_bytes=8 * MIB)
    process, out = _run(_WRITE_FILES, policy, str(tmp_path), "24", str(MIB), "300")
    assert "written" in out and "File too large" not in out  # each file is small
    assert process.returncode != 0
    assert "wrote more than 8 MiB to the host's disk" in sandbox.stopped_because(process)
    # CONTROL: without the limit it runs on (and is left to sleep here: killed at once).
    process, out = _run(_WRITE_FILES, sandbox.Policy(writable=(str(tmp_path),),
                                                     write_bytes=None),
                        str(tmp_path), "24", str(MIB), "0")
    assert process.returncode == 0 and sandbox.stopped_because(process) is None


def test_a_directory_bound_twice_is_counted_once(tmp_path):
    # A Worker's scratch is optimize's work directory: 6 MiB under an 8 MiB limit, seen
    # by the watchdog for three seconds, is not 12.
    policy = sandbox.Policy(writable=(str(tmp_path), str(tmp_path)), write_bytes=8 * MIB)
    process, out = _run(_WRITE_FILES, policy, str(tmp_path), "6", str(MIB), "3")
    assert "written" in out
    assert process.returncode == 0 and sandbox.stopped_because(process) is None


def _writes_then_blocks(target_dir: str, work_dirs: str) -> str:
    """The init op writes four 8 MiB files into each directory ``work_dirs`` matches (the
    run's own work directory), then blocks."""
    def read():
        found = tf.strings.reduce_join(tf.io.matching_files(work_dirs))
        data = tf.io.serialize_tensor(tf.zeros([2 * MIB], tf.float32))
        writes = [tf.io.write_file(found + f"/big-{i}", data) for i in range(4)]
        with tf.control_dependencies(writes):
            queue = tf.queue.FIFOQueue(1, [tf.string], shapes=[[]], name="never_filled")
            return queue.dequeue()

    return _leaking_model(os.path.join(target_dir, "writes_then_blocks", "1"), read)


def test_optimize_of_a_model_writing_past_its_limit_is_stopped(tmp_path, monkeypatch):
    out = tmp_path / "out"
    model = _writes_then_blocks(str(tmp_path / "models"), str(out / ".serving-opt-staging-run-*"))
    # The default (four times the input plus 1 GiB) is too much to write in a test.
    monkeypatch.setattr(sandbox, "write_limit", lambda size: 16 * MIB)
    with pytest.raises(ServingOptError, match="wrote more than 16 MiB to the host's disk") as e:
        optimize(model, str(out), dataclasses.replace(QUICK, trust=dataclasses.replace(
            QUICK.trust, sandbox_timeout_seconds=600)))
    assert "\n" not in e.value.problem
    assert not (out / "1").exists()


def test_the_write_limit_grows_with_the_input_model():
    assert sandbox.write_limit(0) == sandbox.WRITE_BYTES
    assert sandbox.write_limit(1 << 30) == 4 * (1 << 30) + sandbox.WRITE_BYTES


# --- threads where no pids cgroup can be made -------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC holds for a non-root host user")
def test_without_a_cgroup_a_root_sandbox_still_stops_at_its_thread_limit(monkeypatch):
    monkeypatch.setattr(sandbox, "make_pids_cgroup", lambda limit: None)
    process, _ = _run(SPAWN_300_THREADS, sandbox.Policy(max_threads=40), "300")
    assert process.returncode != 0
    assert "more than 40 threads" in sandbox.stopped_because(process)
    # CONTROL: as root, without the cgroup and the watchdog, nothing else holds.
    monkeypatch.setattr(sandbox, "Watchdog",
                        lambda *a: types.SimpleNamespace(reason=None, stop=lambda: None))
    process, out = _run(SPAWN_300_THREADS, sandbox.Policy(max_threads=40), "0")
    assert out.split() == ["300"]


# --- a default time limit for every command that runs a model ---------------------------

def test_validate_of_a_model_that_blocks_for_ever_is_stopped(tmp_path):
    from hostile_models_sandbox_view import build_init_op_blocks

    from serving_opt.options import ValidateOptions
    from serving_opt.serving.validate import validate

    base = os.path.dirname(build_init_op_blocks(str(tmp_path / "models")))
    with pytest.raises(ServingOptError, match="--sandbox_timeout_seconds=20") as e:
        validate(base, ValidateOptions(
            serving=ServingCheck(server="local", load_deadline=15),
            trust=TrustOptions(sandbox_timeout_seconds=20)))
    assert "\n" not in e.value.problem


def test_validate_has_a_time_limit_by_default(tmp_path):
    from serving_opt.options import ValidateOptions
    from serving_opt.serving import validate as validate_lib

    policy = validate_lib._sandbox_policy(str(tmp_path), ValidateOptions(
        serving=ServingCheck(load_deadline=60)))
    assert policy.timeout_seconds == 3660.0


def test_compare_passes_its_time_limit_to_the_sandbox(regressor_dir, tmp_path, monkeypatch):
    # Decided here, in process: compare stopped by the default limit, end to end, is
    # test_sandbox_view_and_resources.py::test_compare_on_a_model_that_blocks_for_ever_*.
    pytest.importorskip("apache_beam")
    import json

    from serving_opt.compare import CompareOptions, compare

    examples = tmp_path / "requests.jsonl"
    examples.write_text(json.dumps({"x": [[1.0, 2.0, 3.0]]}) + "\n")
    given = []

    def call(*args, policy, **kwargs):
        given.append(policy.timeout_seconds)
        raise ServingOptError("the stand-in worker stops here")

    monkeypatch.setattr(sandbox, "call", call)
    assert CompareOptions().sandbox_timeout_seconds is None
    for limit in (None, 7.0):
        with pytest.raises(ServingOptError, match="stand-in worker"):
            compare(regressor_dir, regressor_dir, str(examples),
                    CompareOptions(sandbox_timeout_seconds=limit))
    assert given == [None, 7.0]  # None: the Worker's DEFAULT_TIMEOUT_SECONDS


_WRITE_UNLINKED = """
    import os, sys, time
    directory, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    held = []
    for i in range(count):
        path = os.path.join(directory, f"f{i}")
        f = open(path, "wb")
        f.write(b"x" * size)
        f.flush()
        os.unlink(path)  # on the disk still, in no listing
        held.append(f)
    print("written", flush=True)
    time.sleep(float(sys.argv[4]))
"""


def test_files_removed_but_held_open_count_against_the_write_limit(tmp_path, monkeypatch):
    from serving_opt.sandbox import limits as sandbox_limits

    policy = sandbox.Policy(writable=(str(tmp_path),), write_bytes=8 * MIB)
    process, out = _run(_WRITE_UNLINKED, policy, str(tmp_path), "24", str(MIB), "300")
    assert "written" in out and os.listdir(tmp_path) == []
    assert "wrote more than 8 MiB" in sandbox.stopped_because(process)
    # CONTROL: counting the directories alone, the same 24 MiB run to their end.
    monkeypatch.setattr(sandbox_limits, "_unlinked_bytes", lambda *a: 0)
    process, out = _run(_WRITE_UNLINKED, policy, str(tmp_path), "24", str(MIB), "2")
    assert process.returncode == 0 and sandbox.stopped_because(process) is None


@pytest.mark.parametrize("command", ["optimize", "validate", "compare", "tune"])
def test_every_command_that_runs_a_model_takes_the_time_limit_flag(command):
    import importlib

    from absl import flags

    fv = flags.FlagValues()
    importlib.import_module(f"serving_opt.cli.commands.{command}").define_flags(fv)
    assert "sandbox_timeout_seconds" in fv
