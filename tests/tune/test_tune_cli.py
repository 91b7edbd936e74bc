"""``serving-opt tune``: usage errors before any work, and one real run end to end.

The end-to-end run uses a tiny real model (the conv net sample), the real sandbox, a
real local server with ``--enable_batching``, and real gRPC and REST load, with a
budget of 0.2 s per point; it asserts which points were proven and that every file a
deployment uses is written and agrees with the report, never on the figures themselves.
"""

from __future__ import annotations

import json
import os

import pytest

from serving_opt.cli import main as cli
from serving_opt.model_server import model_config
from serving_opt.model_server.batching import parse_batching_parameters


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["serving-opt", "tune", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args, message", [
    (["--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4"],
     "missing required flag(s) --model_base_path"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--clients=4"],
     "missing required flag(s) --slo_p99_ms"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250"],
     "nothing to tune for: give --clients=N"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=0", "--clients=4"],
     "--slo_p99_ms=0.0 must be a positive number"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--tensorflow_intra_op_parallelism=two"], "is not 'auto' or a list of thread counts"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--allowed_batch_sizes=16,8"], "--allowed_batch_sizes=16,8 must increase"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--protocols=grpc,pigeon"], "must name grpc, rest or both"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--rate=-3"],
     "--rate=-3.0 must be a positive number"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--rows_per_request=8", "--max_batch_size_bound=4"], "is below --rows_per_request=8"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--serving_version=latest"], "--serving_version=latest is not a TensorFlow version"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--server=docker", "--image=tensorflow/serving:2.19.0", "--serving_version=2.15.1"],
     "runs TF Serving 2.19.0, not --serving_version=2.15.1"),
    # The scheduler model's flags went with it: unknown, not silently ignored.
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--prove=2"], "Unknown command line flag 'prove'"),
    (["--model_base_path=/m", "--output_dir=/tmp/x", "--slo_p99_ms=250", "--clients=4",
      "--calibration_seconds=2"], "Unknown command line flag 'calibration_seconds'"),
])
def test_usage_errors_are_one_line_with_the_fix_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""


def test_a_missing_model_base_fails_before_any_work(capsys, tmp_path):
    code, _, err = run(capsys, f"--model_base_path={tmp_path}/none", "--clients=4",
                       "--slo_p99_ms=250", f"--output_dir={tmp_path}/out")
    assert code == 1
    assert "does not exist" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")


def test_an_unknown_signature_is_a_usage_error(capsys, convnet_base, tmp_path):
    code, _, err = run(capsys, f"--model_base_path={convnet_base}", "--clients=4",
                       "--slo_p99_ms=250", f"--output_dir={tmp_path}/out",
                       "--signature_name=nope")
    assert code == 2
    assert "--signature_name=nope is not a signature" in err and "serving_default" in err


@pytest.mark.golden
def test_tune_end_to_end_writes_every_output(capsys, convnet_base, tmp_path):
    out_dir = tmp_path / "tune"
    code, out, err = run(
        capsys, f"--model_base_path={convnet_base}", "--clients=4", "--rate=40",
        "--slo_p99_ms=2000", f"--output_dir={out_dir}", "--tensorflow_intra_op_parallelism=0",
        # Every budget at (or near) its floor: what is asserted is which points and files
        # are written, never the figures. A bound of one row keeps the grid to its two
        # batch thread counts (the grid's reading is test_tune_grid's): each is a server.
        "--max_batch_size_bound=1", "--profile_seconds=0.01", "--duration=0.2", "--warmup=0",
        "--rounds=1", "--norecheck", "--protocols=grpc,rest")
    assert code == 0, err
    # Progress showed while it measured, step by step.
    for step in ("1/3 measuring", "2/3 proving"):
        assert step in err
    report = json.loads((out_dir / "tune.json").read_text())
    assert report["ok"] is True
    labels = {(p["label"], p["workload"], p["protocol"]) for p in report["proven"]}
    for label in ("TF Serving default (no batching)", "upstream batching defaults"):
        for workload in ("closed", "open"):
            assert (label, workload, "grpc") in labels
            assert (label, workload, "rest") in labels
    # The grid read off the measured curve, each setting proven on a server of its own.
    assert report["grid"] and "knee at batch" in report["grid"][0]
    grid_points = {p["label"] for p in report["proven"] if p["label"].startswith("grid #")}
    assert len(grid_points) == 2
    for label in grid_points:
        assert {(label, w, "grpc") for w in ("closed", "open")} <= labels
    for point in report["proven"]:
        assert point["measured"]["ok"] > 0
        assert "predicted" not in point
    assert report["server"].startswith("local:serving-opt serve")
    assert "bubblewrap" in report["sandbox"]
    # The session was profiled as the local server runs it: as this process started
    # (conftest turns oneDNN's kernels off unless the run asks for them).
    onednn = os.environ["TF_ENABLE_ONEDNN_OPTS"]
    assert report["profile"]["env"] == [["TF_ENABLE_ONEDNN_OPTS", onednn]]
    if onednn == "0":
        assert report["profile"]["kernels"] == "Eigen"

    recommendation = report["recommendation"]
    flags_line = (out_dir / "tensorflow_model_server.flags").read_text().strip()
    assert flags_line == recommendation["command"]
    for name in ("tune.txt", "docker/Dockerfile", "docker/compose.yaml", "docker.diff"):
        assert (out_dir / name).stat().st_size > 0, name
    assert (out_dir / "tune.png").exists() or (out_dir / "tune.svg").exists()
    if recommendation["settings"]["batching"] is not None:
        text = (out_dir / "batching_parameters.txt").read_text()
        values = parse_batching_parameters(text)
        assert values["max_batch_size"] == recommendation["settings"]["batching"][
            "max_batch_size"]
        assert "--enable_batching=true" in flags_line
    assert "recommendation" in out and "grid:" in out and "pred rows/s" not in out
    # The hardware is part of the result: this machine's CPU, its cores and the kernels
    # the profile says ran, in the JSON and in the text with its warning.
    hardware = report["hardware"]
    assert hardware["cores"] == len(os.sched_getaffinity(0))
    assert hardware["cpu_model"] and hardware["kernels"] == report["profile"]["kernels"]
    assert "hardware" in out and "warning" in out
    # models.config is a --model_config_file TF Serving reads: the model, where the
    # Docker image mounts models (/models/<name>).
    config = model_config.read_config_file(str(out_dir / "models.config"))
    [served] = model_config.model_configs(config)
    assert served.name == report["model_name"]
    assert served.base_path == f"/models/{served.name}"
