"""What tune writes for a deployment is what TF Serving reads.

``batching_parameters.txt`` is parsed as a ``tensorflow.serving.BatchingParameters``
text proto and checked with TF Serving's own startup checks (the local server's
reader, batching.py, built from session_bundle_config.proto's fields since the
tensorflow-serving-api wheel does not ship that proto; with upstream's generated
module when it is importable); the flag line is accepted by the flags TF Serving
defines (as the local server mirrors them); the docker files mount and pass what
the server needs. The report is made by the real functions (grid, recommend,
findings) on a synthetic profile and given measurements, so no model runs here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import repo_paths
from absl import flags
from tune_reports import synthetic_report

from serving_opt.cli.commands import serve as serve_command
from serving_opt.model_server.batching import parse_batching_parameters
from serving_opt.serving import backends
from serving_opt.tune import outputs, tuner
from serving_opt.tune.report import TuneReport, format_report
from serving_opt.tune.settings import (
    PARAMETERS_FILENAME,
    BatchingSettings,
    ServingSettings,
    ThreadSettings,
)

DOCKER_DIR = os.path.join(repo_paths.REPO, "docker")


def _upstream_message():
    """TF Serving's generated BatchingParameters, when a package ships it."""
    try:
        from tensorflow_serving.servables.tensorflow import session_bundle_config_pb2
    except ImportError:
        return None
    return session_bundle_config_pb2.BatchingParameters


@pytest.mark.parametrize("settings", [
    BatchingSettings(),
    BatchingSettings(max_batch_size=16, batch_timeout_micros=2_000, max_enqueued_batches=1,
                     num_batch_threads=1),
    BatchingSettings(max_batch_size=32, batch_timeout_micros=0, max_enqueued_batches=4,
                     num_batch_threads=2, allowed_batch_sizes=(8, 16, 32),
                     pad_variable_length_inputs=True),
])
def test_batching_parameters_parse_as_tf_serving_reads_them(settings):
    text = settings.text_proto()
    values = parse_batching_parameters(text)  # raises like TF Serving at startup
    resolved = settings.resolved()
    assert values["max_batch_size"] == resolved.max_batch_size
    assert values["batch_timeout_micros"] == resolved.batch_timeout_micros
    assert values["max_enqueued_batches"] == resolved.max_enqueued_batches
    assert values["num_batch_threads"] == resolved.num_batch_threads
    assert values.get("allowed_batch_sizes", []) == list(resolved.allowed_batch_sizes)
    assert values.get("pad_variable_length_inputs", False) == resolved.pad_variable_length_inputs
    upstream = _upstream_message()
    if upstream is not None:
        from google.protobuf import text_format

        message = text_format.Parse(text, upstream())
        assert message.max_batch_size.value == resolved.max_batch_size
        assert list(message.allowed_batch_sizes) == list(resolved.allowed_batch_sizes)


def test_a_written_file_reads_back_as_the_same_settings(tmp_path):
    settings = BatchingSettings(24, 1_500, 2, 2, (8, 24))
    path = tmp_path / PARAMETERS_FILENAME
    path.write_text(settings.text_proto())
    assert tuner.read_current_parameters(str(path)) == settings


def test_settings_tf_serving_would_refuse_are_named():
    bad = BatchingSettings(max_batch_size=16, allowed_batch_sizes=(4, 8))
    assert bad.problems() == ["the last allowed_batch_sizes entry (8) must equal "
                              "max_batch_size (16)"]
    with pytest.raises(Exception, match="Last entry in allowed_batch_sizes"):
        parse_batching_parameters(bad.text_proto())


@pytest.fixture(scope="module")
def report() -> TuneReport:
    return synthetic_report()


def test_the_recommendation_is_the_measured_best_within_the_slo(report):
    rows = {p.label: p.measured.rows_per_second for p in report.proven}
    winner = max(rows, key=rows.get)
    assert report.recommendation.settings == next(p.settings for p in report.proven
                                                  if p.label == winner)
    assert report.recommended_label == winner
    # The fastest point over the SLO, or rejecting too many, is never recommended.
    for bad in ({"p99_ms": 400.0}, {"rejected": 5}):
        fast = dataclasses.replace(
            report.proven[-1], label="fast", measured=dataclasses.replace(
                report.proven[-1].measured, rows_per_second=10 * rows[winner],
                ok=100 - bad.get("rejected", 0), **bad))
        points = [*report.proven, fast]
        assert tuner.recommend(points, report.objective, "grpc", "mnv2").settings == \
            report.recommendation.settings
        control = dataclasses.replace(fast, measured=dataclasses.replace(
            fast.measured, p99_ms=45.0, rejected=0, ok=100))
        assert tuner.recommend([*report.proven, control], report.objective, "grpc",
                               "mnv2").settings == fast.settings


def test_every_output_is_written_and_consistent(report, tmp_path):
    out = outputs.write(report, str(tmp_path))
    rec = report.recommendation
    settings = rec.settings
    assert settings.batching is not None
    expected = {"batching_parameters", "flags", "dockerfile", "docker_compose", "docker_env",
                "docker_diff", "chart", "json", "table"}
    assert expected <= set(out)
    for path in out.values():
        assert os.path.getsize(path) > 0

    values = parse_batching_parameters(open(out["batching_parameters"]).read())
    assert values["max_batch_size"] == settings.batching.max_batch_size

    line = open(out["flags"]).read().split()
    assert line[0] == "tensorflow_model_server"
    assert "--enable_batching=true" in line
    assert f"--batching_parameters_file=/config/{PARAMETERS_FILENAME}" in line
    fv = flags.FlagValues()
    serve_command.define_flags(fv)
    fv(["serve", *line[1:]])  # every flag is one tensorflow_model_server defines
    assert fv.enable_batching and fv.model_name == "mnv2"

    dockerfile = open(out["dockerfile"]).read()
    assert re.search(r"^FROM \$\{TF_SERVING_IMAGE\}:\$\{TF_SERVING_TAG\}$", dockerfile, re.M)
    assert "ARG TF_SERVING_IMAGE=tensorflow/serving" in dockerfile
    assert f"ARG TF_SERVING_TAG={backends.DEFAULT_IMAGE.split(':')[1]}" in dockerfile
    assert f"COPY ${{BATCHING_PARAMETERS}} /config/{PARAMETERS_FILENAME}" in dockerfile
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    assert "--enable_batching=true" in cmd
    assert f"--batching_parameters_file=/config/{PARAMETERS_FILENAME}" in cmd

    compose = open(out["docker_compose"]).read()
    assert f"image: {backends.DEFAULT_IMAGE}" in compose
    assert f"../{PARAMETERS_FILENAME}:/config/{PARAMETERS_FILENAME}:ro" in compose
    assert "      - --enable_batching=true" in compose
    diff = open(out["docker_diff"]).read()
    assert f"+COPY ${{BATCHING_PARAMETERS}} /config/{PARAMETERS_FILENAME}" in diff
    env = dict(line.split("=", 1) for line in open(out["docker_env"]).read().split())
    assert env["TF_INTRA_OP"] == str(settings.threads.intra_op)
    assert env["MODEL_NAME"] == "mnv2"

    data = json.loads(open(out["json"]).read(), parse_constant=_refuse)
    assert data["ok"] is True
    assert [p["label"] for p in data["proven"]] == [p.label for p in report.proven]
    assert data["grid"] == list(report.grid)
    table = open(out["table"]).read()
    assert "recommendation" in table and rec.command in table
    with open(out["chart"], "rb") as f:
        head = f.read(8)
    assert head.startswith(b"\x89PNG") or head.startswith(b"<svg")


def _refuse(name: str):
    raise AssertionError(f"{name} in the JSON report")


def test_the_table_shows_the_grid_and_measurements_and_claims_no_prediction(report):
    table = format_report(report)
    assert "grid: threads intra default, inter default: knee at batch" in table
    assert f"{report.recommended_label} " in table and "p99 ms" in table
    for claim in ("pred ", "predict", "the model's", "model vs", "calibrat", ">25%"):
        assert claim not in table.lower(), claim


def test_the_project_override_passes_what_tune_writes():
    override = open(os.path.join(DOCKER_DIR, "compose.tuned.yaml")).read()
    assert f"/batching_parameters.txt:/config/{PARAMETERS_FILENAME}:ro" in override
    assert "- --enable_batching=true" in override
    assert f"- --batching_parameters_file=/config/{PARAMETERS_FILENAME}" in override
    assert "${TF_INTRA_OP:-0}" in override and "${TF_INTER_OP:-0}" in override
    assert tuner.CONTAINER_PARAMETERS == f"/config/{PARAMETERS_FILENAME}"


def test_no_batching_recommended_writes_no_parameters_file(report, tmp_path):
    plain = dataclasses.replace(
        report, recommendation=dataclasses.replace(
            report.recommendation, settings=ServingSettings(None, ThreadSettings(1, 0)),
            parameters_text="",
            flags=ServingSettings(None, ThreadSettings(1, 0)).flags("/models/mnv2", "mnv2")))
    out = outputs.write(plain, str(tmp_path))
    assert "batching_parameters" not in out and "docker_env" not in out
    assert not os.path.exists(tmp_path / PARAMETERS_FILENAME)
    assert "--tensorflow_intra_op_parallelism=1" in open(out["flags"]).read()
    assert "--enable_batching" not in open(out["dockerfile"]).read()


def test_upstream_is_compared_by_the_mean_of_its_first_and_last_measurement(report):
    from serving_opt.tune import findings
    from serving_opt.tune.report import AGAIN_LABEL

    first = next(p for p in report.proven if p.label == tuner.UPSTREAM_LABEL)
    once = findings.upstream_rows_per_second(report, "closed", "grpc")
    assert once == (first.measured.rows_per_second, "measured once")
    # The machine sped up by half between the first and the last measurement.
    faster = dataclasses.replace(first.measured,
                                 rows_per_second=1.5 * first.measured.rows_per_second)
    again = dataclasses.replace(first, label=AGAIN_LABEL, measured=faster)
    drifted = dataclasses.replace(report, proven=(*report.proven, again))
    rows, how = findings.upstream_rows_per_second(drifted, "closed", "grpc")
    assert rows == 1.25 * first.measured.rows_per_second and how == "mean of first and last"
    comparison = findings.findings(drifted)[0]
    assert f"({rows:,.0f} rows/s, mean of first and last; p99" in comparison


def test_the_report_crosses_the_sandbox_boundary_unchanged(report):
    # tune's report comes back from its sandboxed worker as the boundary's JSON schema.
    from serving_opt.sandbox import results as sandbox_results

    assert sandbox_results.loads(sandbox_results.dumps(report)) == report
