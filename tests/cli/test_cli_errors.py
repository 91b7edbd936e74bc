"""`serving-opt inspect` as users run it: exit codes, one-line errors, no tracebacks.

The runs that need a real process (`python -m serving_opt.cli`) are started at once by
one module fixture, the others run in this process; the tests only look at the
finished results.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import repo_paths

REPO = repo_paths.REPO


def _env() -> dict:
    env = dict(os.environ)
    # The package is used from the checkout, not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    # As a user would run it: the CLI itself must keep TensorFlow's start-up noise away.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


@pytest.fixture(scope="module")
def paths(classifier_dir, tmp_path_factory) -> dict:
    scratch = str(tmp_path_factory.mktemp("cli"))
    empty = os.path.join(scratch, "empty")
    os.mkdir(empty)
    truncated = os.path.join(scratch, "truncated")
    shutil.copytree(classifier_dir, truncated)
    pb = os.path.join(truncated, "saved_model.pb")
    with open(pb, "rb") as f:
        data = f.read()
    with open(pb, "wb") as f:
        f.write(data[: len(data) // 2])
    return {
        "model": classifier_dir,
        "missing": os.path.join(scratch, "does-not-exist"),
        "empty": empty,
        "truncated": truncated,
    }


# Run as real processes (a shell's exit code, and stderr free of TensorFlow's start-up
# noise when a model is read); the other cases are decided before any model is read and
# run cli.main in the test's process (its exit code is what the entry point exits with).
IN_A_PROCESS = ("truncated", "json", "help", "inspect_help")


@pytest.fixture(scope="module")
def runs(paths) -> dict:
    """Name -> CompletedProcess for every CLI invocation of this module."""
    cases = {
        "missing_dir": ["inspect", f"--saved_model_dir={paths['missing']}"],
        "no_saved_model_pb": ["inspect", f"--saved_model_dir={paths['empty']}"],
        "truncated": ["inspect", f"--saved_model_dir={paths['truncated']}"],
        "missing_tag": ["inspect", f"--saved_model_dir={paths['model']}", "--saved_model_tags=gpu"],
        "verbose": ["inspect", f"--saved_model_dir={paths['missing']}", "--verbosity=1"],
        "json": ["inspect", f"--saved_model_dir={paths['model']}", "--json"],
        "table": ["inspect", f"--saved_model_dir={paths['model']}"],
        "no_dir_flag": ["inspect"],
        "unknown_flag": ["inspect", f"--saved_model_dir={paths['model']}", "--frobnicate=1"],
        "help": ["--help"],
        "inspect_help": ["inspect", "--help"],
        "unknown_command": ["frobnicate"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "serving_opt.cli", *args],
            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, args in cases.items() if name in IN_A_PROCESS
    }
    results = {name: _in_this_process(args) for name, args in cases.items()
               if name not in IN_A_PROCESS}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return results


def _in_this_process(args: list[str]) -> subprocess.CompletedProcess:
    from serving_opt.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["serving-opt", *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _one_line_error(result, exit_code: int, *needles: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == exit_code, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_directory_exits_1_naming_it_and_the_fix(runs, paths):
    _one_line_error(runs["missing_dir"], 1, paths["missing"], "does not exist", "check the path")


def test_directory_without_saved_model_pb_exits_1(runs, paths):
    _one_line_error(
        runs["no_saved_model_pb"], 1, f"no saved_model.pb in {paths['empty']}", "point at"
    )


def test_truncated_saved_model_pb_exits_1(runs, paths):
    _one_line_error(
        runs["truncated"], 1, os.path.join(paths["truncated"], "saved_model.pb"),
        "corrupt or truncated", "re-export",
    )


def test_missing_tag_exits_1_suggesting_the_available_tags(runs, paths):
    _one_line_error(runs["missing_tag"], 1, "no MetaGraph tagged gpu", "--saved_model_tags=serve")


def test_missing_saved_model_dir_flag_exits_2(runs):
    _one_line_error(runs["no_dir_flag"], 2, "--saved_model_dir", "--help")


def test_unknown_flag_exits_2(runs):
    _one_line_error(runs["unknown_flag"], 2, "frobnicate", "--help")


def test_unknown_command_exits_2(runs):
    _one_line_error(runs["unknown_command"], 2, "frobnicate", "inspect")


def test_verbosity_1_shows_the_traceback(runs, paths):
    result = runs["verbose"]
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("check the path (a SavedModel "
                                                           "directory contains saved_model.pb)")


def test_help_exits_0_listing_inspect(runs):
    assert runs["help"].returncode == 0
    assert "inspect" in runs["help"].stdout


def test_inspect_help_exits_0_listing_its_flags(runs):
    result = runs["inspect_help"]
    assert result.returncode == 0
    assert all(f in result.stdout for f in ("--saved_model_dir", "--saved_model_tags", "json"))


def test_json_goes_to_stdout_and_parses(runs, paths):
    result = runs["json"]
    assert (result.returncode, result.stderr) == (0, "")
    data = json.loads(result.stdout)
    assert data["path"] == paths["model"]
    assert {s["key"] for s in data["meta_graphs"][0]["signatures"]} == {
        "serving_default", "classification", "predict",
    }


def test_table_is_the_default_and_names_the_signatures(runs):
    result = runs["table"]
    assert (result.returncode, result.stderr) == (0, "")
    assert not result.stdout.lstrip().startswith("{")
    assert all(k in result.stdout for k in ("serving_default", "classification", "predict"))
