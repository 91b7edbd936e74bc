"""`serving-opt optimize` as users run it: exit codes, one-line errors, JSON report.

A success and a failure run as real subprocesses (the exit code a shell sees); the usage
errors, which come before any work, run ``cli.main`` in this process. Behaviour is in
test_optimize.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from serving_opt.cli import main as cli


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving_opt.cli", "optimize", *args],
                          capture_output=True, text=True, timeout=timeout)


def _in_process(capsys, *args: str) -> tuple[int, str]:
    """(exit code, last stderr line) of ``serving-opt optimize`` run by cli.main here."""
    code = cli.main(["serving-opt", "optimize", *args])
    return code, _last_line(capsys.readouterr().err)


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_success_exits_0_prints_the_table_and_writes_the_json_report(classifier_dir, tmp_path):
    report_path = tmp_path / "r" / "report.json"
    result = _cli(f"--input_dir={classifier_dir}", f"--output_base={tmp_path / 'out'}",
                  # The benchmark's table is checked, not the cold start's.
                  "--benchmark_runs=3", "--nocold_start", f"--report={report_path}")
    assert result.returncode == 0, result.stderr
    assert "published" in result.stdout and "parity" in result.stdout
    data = json.loads(report_path.read_text())
    assert data["published"] is True
    assert data["output_dir"] == str(tmp_path / "out" / "1")
    assert data["parity"]["ok"] is True
    assert {lat["batch_size"] for lat in data["benchmark"]["after"]} == {1, 32}
    assert "Traceback" not in result.stderr


def test_parity_failure_exits_1_names_the_output_and_publishes_nothing(regressor_dir,
                                                                       tmp_path):
    report_path = tmp_path / "report.json"
    result = _cli(f"--input_dir={regressor_dir}", f"--output_base={tmp_path / 'out'}",
                  "--transforms=round_weights(num_steps=2)", "--benchmark_runs=0",
                  f"--report={report_path}")
    assert result.returncode == 1
    line = _last_line(result.stderr)
    assert line.startswith("serving-opt optimize: error: parity failed:")
    assert "outputs:" in line or "predictions:" in line
    assert "max abs diff" in line and "nothing was published" in line
    assert os.listdir(tmp_path / "out") == []
    assert json.loads(report_path.read_text())["published"] is False


def test_unknown_transform_is_a_usage_error_listing_valid_names(classifier_dir, tmp_path,
                                                                capsys):
    code, line = _in_process(capsys, f"--input_dir={classifier_dir}",
                             f"--output_base={tmp_path / 'out'}",
                             "--transforms=fold_constants fold_batchnorm")
    assert code == 2
    assert "unknown transform 'fold_batchnorm'" in line and "fold_batch_norms" in line
    assert not os.path.exists(tmp_path / "out")


def test_existing_version_exits_1_without_touching_it(classifier_dir, tmp_path, capsys):
    os.makedirs(tmp_path / "out" / "1")
    code, line = _in_process(capsys, f"--input_dir={classifier_dir}",
                             f"--output_base={tmp_path / 'out'}", "--version=1")
    assert code == 1
    assert "already exists" in line
    assert os.listdir(tmp_path / "out" / "1") == []


def test_missing_required_flag_is_a_usage_error(capsys):
    code, line = _in_process(capsys, "--input_dir=x")
    assert code == 2
    assert "--output_base" in line
