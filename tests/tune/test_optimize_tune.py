"""``serving-opt optimize --tune``: its flags are checked with optimize's, before any work.

The tuning itself is ``serving-opt tune``'s (tests/tune/test_tune_cli.py runs it end to end);
here: a tune flag without ``--tune`` is a usage error, ``--tune`` without its objective or
output directory is one, and tune's own checks (a bad SLO) come before optimize starts,
so nothing is published.
"""

from __future__ import annotations

import os

import pytest

from serving_opt.cli import main as cli


def run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["serving-opt", "optimize", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--slo_p99_ms=100"], "--slo_p99_ms has no effect without --tune"),
    (["--clients=4"], "--clients has no effect without --tune"),
    (["--tune", "--clients=4", "--slo_p99_ms=100"],
     "--tune needs --tune_output_dir and --slo_p99_ms"),
    (["--tune", "--tune_output_dir=t", "--clients=4"],
     "--tune needs --tune_output_dir and --slo_p99_ms"),
    (["--tune", "--tune_output_dir=t", "--slo_p99_ms=0", "--clients=4"],
     "--slo_p99_ms=0.0 must be a positive number"),
    (["--tune", "--tune_output_dir=t", "--slo_p99_ms=100"], "nothing to tune for"),
])
def test_tune_flags_are_checked_before_any_work(classifier_dir, tmp_path, capsys, extra,
                                                message):
    base = tmp_path / "out"
    code, err = run(capsys, f"--saved_model_dir={classifier_dir}",
                    f"--model_base_path={base}", *extra)

    assert code == 2, err
    assert message in err, err
    assert not os.path.exists(base) or os.listdir(base) == []
