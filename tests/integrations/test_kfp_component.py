"""The KFP v2 component runs in a real two-step pipeline under kfp.local (subprocesses,
no cluster): its Metrics hold the JSON report's numbers, its Model a loadable version,
and a refused model fails the step with the one-line reason so nothing downstream runs."""

# No `from __future__ import annotations`: KFP reads the components' annotations as types.
import importlib
import json
import os
import re
import sys
from typing import NamedTuple

import pytest

from serving_opt.options import MeasureOptions

kfp = pytest.importorskip("kfp")
# `python -m pytest` puts the repository on sys.path, where docker/ (the images'
# build files) imports as a namespace package that kfp.local takes for the Docker SDK and
# fails on; without the SDK it falls back to the subprocess runner, as we want.
if not hasattr(importlib.import_module("docker"), "DockerClient"):
    sys.modules["docker"] = None
from kfp import dsl, local  # noqa: E402
from kfp.dsl import Dataset, Markdown, Metrics, Model, Output  # noqa: E402

import serving_opt  # noqa: E402
from serving_opt import OptimizeOptions, ServingOptError, optimize, samples  # noqa: E402
from serving_opt.integrations.kfp import REPORT_NAME, optimize_component  # noqa: E402

optimize_saved_model = optimize_component()


@dsl.component(install_kfp_package=False)
def export_model(source: str, eval_file: str, model: Output[Model],
                 examples: Output[Dataset]):
    # Stands in for a training step: its export and eval examples become artifacts.
    import os
    import shutil

    shutil.copytree(source, os.path.join(model.path, "1"))
    shutil.copyfile(eval_file, examples.path)


@dsl.component(install_kfp_package=False)
def deploy(model: dsl.Input[Model], marker: str):
    with open(marker, "w") as f:
        f.write(model.path)


class Outputs(NamedTuple):
    optimized: Model
    metrics: Metrics
    report: Markdown


@dsl.pipeline
def optimize_pipeline(source: str, eval_file: str, marker: str) -> Outputs:
    exported = export_model(source=source, eval_file=eval_file)
    # Fast: the benchmark skipped, one cold start per model. (kfp.local needs every
    # input artifact given; a cluster lets examples be left out.)
    step = optimize_saved_model(model=exported.outputs["model"],
                                examples=exported.outputs["examples"], benchmark_runs=0,
                                measure_seconds=60.0)
    deploy(model=step.outputs["optimized"], marker=marker)
    return Outputs(optimized=step.outputs["optimized"], metrics=step.outputs["metrics"],
                   report=step.outputs["report"])


@pytest.fixture
def kfp_local(tmp_path):
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "pipeline_root"), raise_on_error=False)
    return tmp_path


def test_pipeline_publishes_the_version_and_its_metrics_are_the_reports(kfp_local):
    source = samples.build_classifier(str(kfp_local / "export" / "1"))
    eval_file = str(kfp_local / "eval.tfrecord")
    import tensorflow as tf

    with tf.io.TFRecordWriter(eval_file) as w:
        for record in samples.sample_examples(32):
            w.write(record)
    marker = str(kfp_local / "deployed")
    run = optimize_pipeline(source=source, eval_file=eval_file, marker=marker)
    optimized, metrics, report = (run.outputs[k] for k in ("optimized", "metrics", "report"))

    assert os.path.exists(marker)  # the downstream step ran on the published version
    assert optimized.metadata["verdict"] == "published"
    version_dir = os.path.join(optimized.path, "1")
    # The published report, read on its own, holds exactly the Metrics' numbers.
    with open(os.path.join(optimized.path, REPORT_NAME)) as f:
        data = json.load(f)
    assert data["published"] is True and data["version"] == 1
    expected = {
        "published": 1.0,
        "size_before_bytes": data["size_before"]["total"],
        "size_after_bytes": data["size_after"]["total"],
        "size_ratio": data["size_after"]["total"] / data["size_before"]["total"],
        "parity_ok": 1.0,
        "parity_mismatches": sum(o["mismatches"] for o in data["parity"]["outputs"]),
        "parity_max_abs_diff": max(o["max_abs_diff"] for o in data["parity"]["outputs"]),
    }
    for side in ("before", "after"):
        for key in ("load_seconds", "first_request_seconds", "peak_rss_bytes"):
            expected[f"cold_start_{key}_{side}"] = data["cold_start"][side][key]
    assert metrics.metadata == pytest.approx(expected, rel=0, abs=0)
    assert optimized.metadata["size_after_bytes"] == data["size_after"]["total"]
    assert optimized.metadata["serving_opt_version"] == serving_opt.__version__
    with open(report.path) as f:
        assert "published version 1" in f.read()

    # The Model artifact holds a version TF's own session loader serves from.
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], version_dir)
        assert "predict" in meta.signature_def


def test_a_refused_model_fails_its_step_with_the_reason_and_nothing_downstream_runs(
        kfp_local, capfd):
    from hostile_models_sandbox_view import build_init_op_reads

    secret = kfp_local / "secret.txt"
    secret.write_text("not for the model")
    source = build_init_op_reads(str(kfp_local / "export"), str(secret))
    eval_file = kfp_local / "eval.jsonl"
    eval_file.write_text(json.dumps({"x": [[1.0, 2.0, 3.0]]}) + "\n")
    marker = str(kfp_local / "deployed")
    optimize_pipeline(source=source, eval_file=str(eval_file), marker=marker)
    out = capfd.readouterr()
    log = re.sub(r"\x1b\[[0-9;]*m", "", out.out + out.err)  # kfp.local's colours
    lines = [line.strip() for line in log.splitlines()
             if line.strip().startswith("serving-opt: ")]
    # Exactly the line the Python API refuses the same model with.
    with pytest.raises(ServingOptError) as refused:
        optimize(source, str(kfp_local / "direct"), OptimizeOptions(
            measure=MeasureOptions(benchmark_runs=0)))
    assert "ReadFile" in refused.value.one_line()
    assert lines == [f"serving-opt: {refused.value.one_line()}"], log[-3000:]
    assert "Task 'optimize' finished with status FAILURE" in log
    assert not os.path.exists(marker)
