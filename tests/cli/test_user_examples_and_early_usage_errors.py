"""Measurements use the user's examples, usage errors come before any work, warmup only
after the answers matched, and validate serves only the version it checks."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from serving_opt import OptimizeOptions, optimize
from serving_opt.cli import main as cli
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import (
    BuildOptions,
    GateOptions,
    InputOptions,
    MeasureOptions,
    ServingCheck,
    TargetOptions,
    Tolerance,
)
from serving_opt.serving.validate import ValidateOptions, validate


def build_checked_model(export_dir: str, scale: float = 1.0) -> str:
    """A model that validates its input, as production models do: Assert(x >= 0)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=np.arange(8, dtype=np.float32)
                                      .reshape(4, 2) * scale / 8.0)
        check = tf.debugging.Assert(tf.reduce_all(x >= 0), ["x must be >= 0"], name="check")
        with tf.control_dependencies([check]):
            y = tf.identity(tf.matmul(tf.sqrt(x), w), name="y")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sig = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(sess, ["serve"],
                                                 signature_def_map={"serving_default": sig})
            builder.save()
    return export_dir


def write_examples(path: str, rows: int = 6) -> str:
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"x": rng.uniform(0, 3, (1, 4)).round(3).tolist()}) + "\n")
    return path


@pytest.fixture(scope="module")
def checked_model(tmp_path_factory) -> str:
    return build_checked_model(str(tmp_path_factory.mktemp("checked") / "1"))


def test_cold_start_and_benchmark_use_the_users_examples(checked_model, tmp_path):
    examples = write_examples(str(tmp_path / "x.jsonl"))
    # freeze=always and allow_regression: the frozen candidate is published whatever the
    # (noisy) timings say, instead of a retry with variables kept that measures it all
    # again; the measurements, not the gate, are this test's subject.
    report = optimize(checked_model, str(tmp_path / "out"),
                      OptimizeOptions(
                          inputs=InputOptions(examples=examples),
                          measure=MeasureOptions(benchmark_runs=3),
                          build=BuildOptions(freeze="always"),
                          gate=GateOptions(allow_regression=True)))
    assert report.published
    assert report.cold_start is not None and report.benchmark is not None
    # Both batch sizes were measured, from the examples grown to the batch named.
    assert [lat.batch_size for lat in report.benchmark.after] == [1, 32]


def test_a_refused_synthesized_input_keeps_the_ops_own_message(checked_model, tmp_path):
    # No examples: synthesized inputs are negative somewhere, the model's Assert refuses
    # them, and the user must read the Assert's text, not TF's empty header.
    with pytest.raises(ServingOptError) as failure:
        optimize(checked_model, str(tmp_path / "out"),
                 OptimizeOptions(
                     measure=MeasureOptions(benchmark_runs=0), gate=GateOptions(parity_batches=1)))
    assert "x must be >= 0" in str(failure.value)
    assert not os.path.exists(tmp_path / "out" / "1")


def test_benchmark_job_reads_examples_in_the_measuring_process(checked_model, tmp_path):
    from serving_opt.stages import benchmark

    examples = write_examples(str(tmp_path / "x.jsonl"))
    report = benchmark.benchmark_in_fresh_process(
        checked_model, checked_model, frozenset({"serve"}), "serving_default",
        schedule=benchmark.BenchmarkSchedule(batch_sizes=(3,), runs=2),
        inputs=benchmark.BenchmarkInputs(examples=examples))
    assert report.after[0].batch_size == 3 and report.after[0].runs == 2


def test_resize_batch_cycles_rows_to_the_size_asked():
    from serving_opt.savedmodel.inputs import resize_batch

    batches = [{"x": np.array([[1.0], [2.0]])}, {"x": np.array([[3.0]])}]
    grown = resize_batch(batches, 5)["x"].ravel().tolist()
    assert grown == [1.0, 2.0, 3.0, 1.0, 2.0]
    assert resize_batch(batches, 1)["x"].ravel().tolist() == [1.0]


# --- usage errors come before any work --------------------------------------------

@pytest.mark.parametrize("flags", [
    ["--protocols=carrier_pigeon"],
    ["--server=docker"],
    ["--concurrency=-5"],
    ["--require_server=tf_serving"],
    ["--min_top1_agreement=0.9"],
    ["--validate", "--protocols=http"],
    ["--validate", "--concurrency=-5"],
    ["--rtol=1e308"],
    ["--regression_tolerance=inf"],
    ["--grappler_rounds=1000000"],
])
def test_cli_usage_errors_exit_2_before_reading_the_model(flags, tmp_path, capsys):
    # The input does not exist: any error but a usage error means work was attempted
    # before the flags were checked. In this process (cli.main is what the entry point
    # exits with): the exit code of a real process is tests/cli/test_optimize_cli.py's.
    out = tmp_path / "out"
    code = cli.main(["serving-opt", "optimize", f"--input_dir={tmp_path / 'missing'}",
                     f"--output_base={out}", "--noprogress", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "missing" not in err  # it never got as far as the input directory
    assert not out.exists()


def test_api_checks_validate_options_in_plan(tmp_path):
    with pytest.raises(UsageError, match="protocols"):
        optimize(str(tmp_path / "missing"), str(tmp_path / "out"),
                 OptimizeOptions(validate=ValidateOptions(
                     serving=ServingCheck(protocols=("http",)))))
    with pytest.raises(UsageError, match="concurrency"):
        optimize(str(tmp_path / "missing"), str(tmp_path / "out"),
                 OptimizeOptions(validate=ValidateOptions(serving=ServingCheck(concurrency=-5))))


def test_shared_settings_cannot_disagree(tmp_path):
    with pytest.raises(UsageError, match="atol"):
        optimize(str(tmp_path / "missing"), str(tmp_path / "out"),
                 OptimizeOptions(
                     validate=ValidateOptions(
                         tolerance=Tolerance(atol=0.5)), tolerance=Tolerance(atol=1e-3)))
    with pytest.raises(UsageError, match="serving_version"):
        optimize(str(tmp_path / "missing"), str(tmp_path / "out"),
                 OptimizeOptions(
                     validate=ValidateOptions(target=TargetOptions(serving_version="2.20.0")),
                     target=TargetOptions(serving_version="2.15.1")))


def test_shared_settings_flow_from_optimize_to_validate():
    from serving_opt.pipeline.optimizer import validate_options

    merged = validate_options(OptimizeOptions(
        validate=ValidateOptions(), tolerance=Tolerance(atol=1e-3, rtol=1e-2),
        inputs=InputOptions(examples="e.jsonl")))
    assert (merged.tolerance.atol, merged.tolerance.rtol, merged.inputs.examples) \
        == (1e-3, 1e-2, "e.jsonl")


def test_parity_option_hint_names_real_settings(tmp_path):
    with pytest.raises(UsageError) as failure:
        optimize(str(tmp_path / "missing"), str(tmp_path / "out"),
                 OptimizeOptions(gate=GateOptions(parity_batch_size=0)))
    assert "--parity_batch_size" not in failure.value.one_line()
    assert "OptimizeOptions" in failure.value.one_line()


# --- warmup only after the answers matched; only the checked version is served ------

def _copy_base(source_dir: str, base: str, versions=("1",)) -> str:
    for v in versions:
        shutil.copytree(source_dir, os.path.join(base, v))
    return base


def test_warmup_is_not_written_when_the_answers_differ(checked_model, tmp_path):
    # Served: the model with other weights; reference: the original. The answers differ.
    base = str(tmp_path / "base")
    build_checked_model(os.path.join(base, "1"), scale=2.0)
    report = validate(base, ValidateOptions(
        reference_dir=checked_model,
        serving=ServingCheck(server="local",
                             write_warmup=True,
                             concurrency=0,
                             protocols=("grpc",)),
        inputs=InputOptions(examples=write_examples(str(tmp_path / "x.jsonl")))))
    assert not report.ok
    assert report.warmup_file is None
    assert not os.path.exists(os.path.join(base, "1", "assets.extra"))


def test_warmup_is_written_once_the_answers_matched(checked_model, tmp_path):
    base = _copy_base(checked_model, str(tmp_path / "base"))
    report = validate(base, ValidateOptions(
        serving=ServingCheck(server="local",
                             write_warmup=True,
                             concurrency=0,
                             protocols=("grpc",)),
        inputs=InputOptions(examples=write_examples(str(tmp_path / "x.jsonl")))))
    assert report.ok, report.failures
    assert report.warmup_file == os.path.join(base, "1", "assets.extra",
                                              "tf_serving_warmup_requests")
    assert os.path.getsize(report.warmup_file) > 0


def test_validate_serves_only_the_version_it_checks_read_as_tf_serving_reads_it(
        regressor_dir, tmp_path):
    # Version 2 in a zero-padded directory ("02", which TF Serving reads as 2), and a
    # higher version 3 whose load would fail the server if it ever ran: a saved_model.pb
    # that is not a SavedModel at all.
    base = str(tmp_path / "base")
    shutil.copytree(regressor_dir, os.path.join(base, "02"))
    os.makedirs(os.path.join(base, "3"))
    with open(os.path.join(base, "3", "saved_model.pb"), "wb") as f:
        f.write(b"not a SavedModel")
    report = validate(base, ValidateOptions(
        version=2,
        serving=ServingCheck(server="local",
                             concurrency=0,
                             protocols=("grpc",),
                             load_deadline=120)))
    assert report.ok, report.failures
    assert report.version == 2
    assert report.ignored_versions == (3,)


def test_the_highest_version_is_read_from_zero_padded_directories_too(tmp_path):
    # Without --version, validate checks the highest: "02" is version 2, above "1".
    from serving_opt.serving.validate import resolve_version, version_dir

    base = str(tmp_path / "base")
    for name in ("1", "02", "not-a-version"):
        os.makedirs(os.path.join(base, name))
    assert resolve_version(base, None) == 2
    assert version_dir(base, 2) == os.path.join(base, "02")
    assert resolve_version(base, 1) == 1


def test_model_config_pins_the_version():
    from serving_opt.model_server.model_config import parse_config_text
    from serving_opt.serving import backends

    spec = backends.ServerSpec("clf", "/m/clf", version=7)
    config = parse_config_text(backends.model_config_text(spec, "/m/clf"))
    model = config.model_config_list.config[0]
    assert (model.name, model.base_path) == ("clf", "/m/clf")
    assert list(model.model_version_policy.specific.versions) == [7]
