"""``serving-opt serve`` runs the static check before it loads a version (issue 30, item
5, its first half): a model whose init op writes a host file never loads, and nothing is
written; ``--allow_file_ops`` (not a TF Serving flag) is the opt-in for a trusted model.
These tests serve in this process (no sandbox: the static check alone holds);
tests/serving/test_serve_sandbox.py serves the same model with the opt-in, in the sandbox."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hostile_models import HOSTILE, canary_files

from serving_opt.model_server import ServerOptions, ServerStartError, serve

FAST = {"port": 0, "file_system_poll_wait_seconds": 0.1, "max_num_load_retries": 0}


@pytest.fixture
def init_op_write(tmp_path):
    canary = str(tmp_path / "host" / "canary")
    os.makedirs(os.path.dirname(canary))
    export_dir = HOSTILE["init_op_write"].build(str(tmp_path / "models"), canary)
    return os.path.dirname(export_dir), canary


def test_a_version_with_host_ops_does_not_load_and_nothing_runs(init_op_write):
    base, canary = init_op_write
    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, **FAST))
    message = str(info.value)
    assert "FAILED_PRECONDITION" in message and "WriteFile" in message
    assert "--allow_file_ops" in message
    assert canary_files(canary) == []


def test_allow_file_ops_loads_a_trusted_model(init_op_write):
    base, canary = init_op_write
    server = serve(ServerOptions(model_name="m", model_base_path=base, allow_file_ops=True,
                                 **FAST))
    try:
        assert server.available_versions() == {"m": [1]}
    finally:
        server.stop()
    assert canary_files(canary) == [canary]  # it ran: the opt-in is real


def test_the_cli_refuses_it_and_names_the_flag(init_op_write):
    base, canary = init_op_write
    done = subprocess.run(
        [sys.executable, "-m", "serving_opt.cli", "serve", "--port=0",
         f"--model_base_path={base}", "--model_name=m", "--max_num_load_retries=0"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "WriteFile" in done.stderr and "--allow_file_ops" in done.stderr
    assert canary_files(canary) == []
