"""Bazel: `bazel run` of the CLI, the serving_saved_model example, and its build action.

The first two tests call `bazel` as a subprocess, so they run under plain pytest only
(`make pytest` runs `make bazel-setup` first). Under `bazel test` they skip: a `bazel`
started inside a test of the same workspace waits forever for the server lock the
outer command holds; `bazel test //...` covers the example through
//examples:tiny_optimized_test instead. The action's tool (serving_opt/bazel_build.py)
is tested in-process everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest
import repo_paths

ROOT = repo_paths.REPO
TINY_MODEL = os.path.join(ROOT, "examples", "tiny_model")

needs_bazel = pytest.mark.skipif(
    "TEST_SRCDIR" in os.environ,
    reason="calls bazel, which cannot run nested inside `bazel test` (server lock); "
           "run with `make pytest`",
)


def _bazel(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    bazel = shutil.which("bazel")
    if bazel is None:
        pytest.fail("bazel is not on PATH; run `make bazel-setup` (`make pytest` does it)")
    env = {k: v for k, v in os.environ.items() if k != "BUILD_WORKING_DIRECTORY"}
    result = subprocess.run([bazel, *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, (
        f"bazel {' '.join(args)} exited {result.returncode} in {cwd}\n"
        f"{result.stderr[-4000:]}\n{result.stdout[-2000:]}"
    )
    return result


@pytest.fixture
def workspace_dir():
    """A scratch directory inside the workspace (bazel must find WORKSPACE above it)."""
    parent = os.path.join(ROOT, "build")  # gitignored and in .bazelignore
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix="test-bazel-", dir=parent)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_bazel
def test_bazel_run_optimize_resolves_paths_against_the_callers_directory(workspace_dir):
    shutil.copytree(TINY_MODEL, os.path.join(workspace_dir, "model"))
    caller = os.path.join(workspace_dir, "sub", "dir")
    os.makedirs(caller)

    result = _bazel("run", "--noshow_progress", "//serving_opt:optimize", "--",
                    "--input_dir=../../model", "--output_base=models/tiny",
                    "--benchmark_runs=0", "--json", "--noprogress", cwd=caller)

    report = json.loads(result.stdout)
    assert report["published"] and report["parity"]["ok"]
    assert report["output_dir"] == os.path.join("models", "tiny", "1")
    assert os.path.isfile(os.path.join(caller, "models", "tiny", "1", "saved_model.pb"))
    assert sorted(os.listdir(os.path.join(caller, "models", "tiny"))) == ["1"]


@needs_bazel
def test_bazel_build_examples_produces_a_saved_model_that_passes_parity():
    from serving_opt.savedmodel import loader
    from serving_opt.stages import parity

    _bazel("build", "--noshow_progress", "//examples/...")
    bazel_bin = _bazel("info", "bazel-bin").stdout.strip()
    built = os.path.join(bazel_bin, "examples", "tiny_optimized")

    assert os.path.isfile(os.path.join(built, "saved_model.pb"))
    meta_graph = loader.find_meta_graph(loader.read_saved_model(built), {"serve"})
    keys = sorted(loader.serving_signatures(meta_graph))
    assert keys == ["scores_only", "serving_default"]
    assert not {n.op for n in meta_graph.graph_def.node} & {"VarHandleOp", "VariableV2"}
    report = parity.check_parity(TINY_MODEL, built, frozenset({"serve"}), keys)
    assert report.ok, report.summary()


# --- the action behind serving_saved_model, in-process -------------------------------------


def _declared_files(model_dir: str) -> list[str]:
    return sorted(os.path.join(root, name) for root, _, names in os.walk(model_dir)
                  for name in names)


def test_build_action_writes_the_saved_model_itself_from_the_declared_files_only(
        regressor_dir, tmp_path):
    from serving_opt.integrations import bazel_build

    # Bazel stages inputs as symlinks, and an unsandboxed action sees undeclared files.
    model = tmp_path / "m"
    model.mkdir()
    for src in _declared_files(regressor_dir):
        link = model / os.path.relpath(src, regressor_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(src)
    (model / "undeclared.txt").write_text("must not reach the output")
    out, report = tmp_path / "out", tmp_path / "out.report.json"
    out.mkdir()
    params = tmp_path / "args.params"  # what Bazel writes for long command lines
    declared = [f for f in _declared_files(str(model)) if not f.endswith("undeclared.txt")]
    params.write_text("\n".join(declared) + "\n")

    code = bazel_build.main([f"--input_dir={model}", f"--output_dir={out}",
                             f"--report={report}", "--signatures=predict", f"@{params}"])

    assert code == 0
    assert sorted(os.listdir(out)) == ["assets", "saved_model.pb", "variables"]
    assert not any(os.path.islink(f) for f in _declared_files(str(out)))
    written = json.loads(report.read_text())
    assert (written["input_dir"], written["output_dir"]) == (str(model), str(out))
    assert written["signatures"] == ["predict"] and written["parity"]["ok"]
    assert written["size_before"]["variables"] > 0  # symlinks resolved: real sizes


def test_build_action_rejects_srcs_outside_the_model_directory(regressor_dir, tmp_path,
                                                               capsys):
    from serving_opt.integrations import bazel_build

    outside = os.path.join(tmp_path, "BUILD")
    open(outside, "w").close()
    code = bazel_build.main([f"--input_dir={regressor_dir}", f"--output_dir={tmp_path / 'o'}",
                             os.path.join(regressor_dir, "saved_model.pb"), outside])

    assert code == 2
    err = capsys.readouterr().err
    assert f"{outside} is not inside the model directory" in err and err.count("\n") == 1


def test_build_action_fails_the_build_when_parity_fails(regressor_dir, tmp_path, capsys):
    from serving_opt.integrations import bazel_build

    code = bazel_build.main([f"--input_dir={regressor_dir}", f"--output_dir={tmp_path / 'o'}",
                             "--transforms=round_weights(num_steps=2)"])

    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("serving_saved_model: ") and "parity failed" in err
    assert err.count("\n") == 1  # one line, no TensorFlow logs
