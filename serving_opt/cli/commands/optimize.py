"""Optimize a SavedModel for TF Serving and publish it as a new version.

Freezes variables (keeping tables, assets and the init op), applies Graph
Transform Tool transforms and Grappler passes, writes a SavedModel with the same
signatures, checks it answers like the original, and only then renames it into
OUTPUT_BASE/<version>. Prints a report table; --report also writes it as JSON.

Example:
  serving-opt optimize --input_dir=exports/1700000000 --output_base=/models/clf
"""

from __future__ import annotations

import os
import sys

from absl import flags

from serving_opt import report
from serving_opt.cli import main as cli
from serving_opt.errors import ServingOptError, UsageError

SUMMARY = "freeze, transform and re-wrap a SavedModel; publish it after a parity check"


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("input_dir", None, "SavedModel directory to optimize (read only).",
                        flag_values=fv)
    flags.DEFINE_string("output_base", None,
                        "Model base directory; the result goes to OUTPUT_BASE/<version>.",
                        flag_values=fv)
    flags.DEFINE_integer("version", None,
                         "Version directory to write (default: highest existing + 1).",
                         flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace an existing version directory.",
                      flag_values=fv)
    flags.DEFINE_string(
        "transforms", "default",
        "Graph Transform Tool spec, e.g. 'strip_unused_nodes fold_constants(ignore_errors=true) "
        "fold_batch_norms'. 'default' is a lossless preset; 'none' skips the tool.",
        flag_values=fv)
    flags.DEFINE_string("grappler", "default",
                        "Comma list of Grappler passes; 'default' = "
                        "pruning,constfold,arithmetic,dependency; 'none' skips Grappler.",
                        flag_values=fv)
    flags.DEFINE_integer("grappler_rounds", 2, "How many times to run the Grappler passes.",
                         flag_values=fv)
    flags.DEFINE_list("signatures", [], "Signature keys to keep (default: all).",
                      flag_values=fv)
    flags.DEFINE_string("saved_model_tags", "serve", "MetaGraph tag set, comma separated.",
                        flag_values=fv)
    flags.DEFINE_enum("freeze", "auto", ["auto", "always", "never"],
                      "Freeze variables into constants: auto falls back to keeping them when "
                      "freezing fails; always makes that an error.", flag_values=fv)
    flags.DEFINE_integer("freeze_max_bytes", 10 * 2**20,
                         "Variables larger than this stay variables (in a new checkpoint "
                         "holding only what serving reads); smaller ones become constants. "
                         "Large constants make TF Serving load slower and use more memory.",
                         flag_values=fv)
    flags.DEFINE_integer("max_constant_bytes", 64 * 1024,
                         "Constants still larger than this after folding (e.g. batch-norm-"
                         "folded conv weights) are stored as variables of the new checkpoint, "
                         "so TF Serving restores them instead of parsing and re-optimizing "
                         "them at load; -1 keeps them constants.", flag_values=fv)
    flags.DEFINE_bool("cold_start", True,
                      "Load both models in fresh processes (load time, first request, peak "
                      "RSS) and refuse a candidate that is worse (--nocold_start skips it).",
                      flag_values=fv)
    flags.DEFINE_integer("cold_start_rounds", 1,
                         "Fresh processes per model for the cold start (median is used).",
                         flag_values=fv)
    flags.DEFINE_float("regression_tolerance", 1.10,
                       "A measure worse than the original by more than this factor (plus a "
                       "small absolute slack) blocks publishing.", flag_values=fv)
    flags.DEFINE_bool("allow_regression", False,
                      "Publish even when the result is slower, bigger in memory or slower to "
                      "load than the original (the report says so).", flag_values=fv)
    flags.DEFINE_enum("quantize", "none", ["none", "int8", "fp16"],
                      "Store large float weights as int8 (scale per row for embedding "
                      "tables, per output channel otherwise) or fp16. Tables are gathered "
                      "quantized and only the gathered rows dequantized; other weights are "
                      "dequantized once, at load. Lossy: the lossy gate decides.",
                      flag_values=fv)
    flags.DEFINE_integer("quantize_min_elements", 16384,
                         "Weights with fewer elements stay float.", flag_values=fv)
    flags.DEFINE_float("min_top1_agreement", 0.995,
                       "With --quantize: fraction of rows whose top-1 class (probabilities/"
                       "scores) or whose class ids/names must agree with the original.",
                       flag_values=fv)
    flags.DEFINE_float("max_probability_error", 0.05,
                       "With --quantize: largest change allowed in a probability/score.",
                       flag_values=fv)
    flags.DEFINE_bool("allow_file_ops", False,
                      "Run a model whose signatures touch files or the host (WriteFile, ReadFile, "
                      "PyFunc, checkpoint, summary and tf.data file ops, ...; see "
                      "serving_opt/host_ops.py). Off: such a model is refused before it "
                      "runs. Only for models you trust: a SavedModel is code.", flag_values=fv)
    flags.DEFINE_bool("allow_unsandboxed", False,
                      "Run the model even where the bubblewrap sandbox cannot start (no "
                      "bwrap, no user namespaces, not Linux). Only for models you trust.",
                      flag_values=fv)
    flags.DEFINE_integer("sandbox_memory_bytes", None,
                         "Memory limit of each sandboxed process (default: 3/4 of the RAM).",
                         lower_bound=1 << 28, flag_values=fv)
    flags.DEFINE_string("examples", None,
                        "Inputs for the parity check: TFRecord of tf.Example, or JSON lines "
                        "of {alias: value} requests (default: synthesized).", flag_values=fv)
    flags.DEFINE_string("compare_examples", None,
                        "A last gate before publishing: compare both models on every example "
                        "of these TFRecord/JSON-lines shards (a glob; local, gs://, s3://) "
                        "on Apache Beam, as serving-opt compare does. Needs "
                        "pip install serving-opt[beam].", flag_values=fv)
    flags.DEFINE_float("atol", 1e-5, "Absolute tolerance for float outputs.", flag_values=fv)
    flags.DEFINE_float("rtol", 1e-4, "Relative tolerance for float outputs.", flag_values=fv)
    flags.DEFINE_integer("benchmark_runs", 100,
                         "Interleaved timed runs per batch size (0 skips the benchmark).",
                         flag_values=fv)
    flags.DEFINE_string("report", None, "Also write the report as JSON to this file.",
                        flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)
    flags.DEFINE_bool("progress", True, "Print stage progress on stderr.", flag_values=fv)
    flags.DEFINE_bool("validate", False,
                      "Before publishing, serve the result over gRPC and compare every "
                      "signature's answers with the input model (see serving-opt validate).",
                      flag_values=fv)
    flags.DEFINE_enum("server", "auto", ["auto", "docker", "binary", "local"],
                      "Model server for --validate.", flag_values=fv)
    flags.DEFINE_string("image", None, "Docker image for --server=docker.", flag_values=fv)
    flags.DEFINE_bool("write_warmup", False,
                      "With --validate: write the validation requests as "
                      "assets.extra/tf_serving_warmup_requests into the published model.",
                      flag_values=fv)
    flags.DEFINE_integer("concurrency", 8, "With --validate: clients in the load phase.",
                         flag_values=fv)
    flags.DEFINE_float("duration", 5.0, "With --validate: seconds of the load phase.",
                       flag_values=fv)
    flags.DEFINE_string("serving_version", None,
                        "TensorFlow release of the TF Serving that will load the result (e.g. "
                        "2.15.1): an op or attr its registry lacks refuses the run (its runtime "
                        "is installed once into ~/.cache/serving-opt if missing); with "
                        "--validate the local server runs under it. Default: checked against "
                        "the current TF Serving release only if its runtime is already here.",
                        flag_values=fv)
    flags.DEFINE_string("serving_runtime_python", None,
                        "A python whose TensorFlow is --serving_version's (instead of a cached "
                        "venv; also $SERVING_OPT_RUNTIME_<X>_<Y>).", flag_values=fv)
    flags.DEFINE_list("protocols", ["grpc", "rest"],
                      "With --validate: grpc, rest or both.", flag_values=fv)
    flags.DEFINE_enum("require_server", "any", ["any", "tf_serving"],
                      "With --validate: tf_serving fails when only the local stand-in can run.",
                      flag_values=fv)
    cli.required("input_dir", fv)
    cli.required("output_base", fv)


def configure_runtime() -> None:
    """Called by the CLI before TensorFlow is imported (see loader.configure_for_optimizing)."""
    from serving_opt.savedmodel import loader

    loader.configure_for_optimizing()


def main(fv: flags.FlagValues) -> int:
    from serving_opt.optimizer import OptimizeOptions, optimize

    if fv.version is not None and fv.version < 0:
        raise UsageError(f"--version={fv.version} is negative", "pass --version=N with N >= 0")
    options = OptimizeOptions(
        transforms=fv.transforms,
        grappler=fv.grappler,
        grappler_rounds=fv.grappler_rounds,
        signatures=tuple(fv.signatures),
        saved_model_tags=fv.saved_model_tags,
        version=fv.version,
        overwrite=fv.overwrite,
        freeze=fv.freeze,
        examples=fv.examples,
        compare_examples=fv.compare_examples,
        atol=fv.atol,
        rtol=fv.rtol,
        benchmark_runs=fv.benchmark_runs,
        freeze_max_bytes=fv.freeze_max_bytes,
        max_constant_bytes=None if fv.max_constant_bytes < 0 else fv.max_constant_bytes,
        cold_start=fv.cold_start,
        cold_start_rounds=fv.cold_start_rounds,
        regression_tolerance=fv.regression_tolerance,
        allow_regression=fv.allow_regression,
        allow_file_ops=fv.allow_file_ops,
        quantize=fv.quantize,
        quantize_min_elements=fv.quantize_min_elements,
        min_top1_agreement=fv.min_top1_agreement,
        max_probability_error=fv.max_probability_error,
        serving_version=fv.serving_version,
        serving_runtime_python=fv.serving_runtime_python,
        allow_unsandboxed=fv.allow_unsandboxed,
        sandbox_memory_bytes=fv.sandbox_memory_bytes,
    )
    check_dependent_flags(fv)
    if fv.validate:
        import dataclasses

        from serving_opt.serving.validate import ValidateOptions

        validate_options = ValidateOptions(
            server=fv.server, examples=fv.examples, saved_model_tags=fv.saved_model_tags,
            concurrency=fv.concurrency, duration=fv.duration, atol=fv.atol, rtol=fv.rtol,
            write_warmup=fv.write_warmup, allow_file_ops=fv.allow_file_ops,
            protocols=tuple(fv.protocols), serving_version=fv.serving_version,
            serving_runtime_python=fv.serving_runtime_python,
            require_server=fv.require_server,
        )
        if fv.image:
            validate_options = dataclasses.replace(validate_options, image=fv.image)
        options = dataclasses.replace(options, validate=validate_options)
    progress = (lambda m: print(m, file=sys.stderr, flush=True)) if fv.progress else None
    try:
        result = optimize(fv.input_dir, fv.output_base, options, progress)
    except ServingOptError as e:
        if e.report is not None:
            _emit(e.report, fv)
        raise
    _emit(result, fv)
    return 0


# Flags that mean nothing without another one: given alone they are a usage error
# naming both, never silently ignored. (flag, what it needs, how to test that).
_VALIDATE_FLAGS = ("server", "image", "write_warmup", "concurrency", "duration", "protocols",
                   "require_server")
_QUANTIZE_FLAGS = ("quantize_min_elements", "min_top1_agreement", "max_probability_error")


def check_dependent_flags(fv: flags.FlagValues) -> None:
    """UsageError for a flag given without the flag that gives it meaning.

    Example:
        serving-opt optimize ... --protocols=rest      # without --validate
        -> usage error: --protocols has no effect without --validate
    """
    given = [name for name in _VALIDATE_FLAGS if fv[name].present]
    if given and not fv.validate:
        raise UsageError(f"--{given[0]} has no effect without --validate",
                         f"add --validate, or drop --{given[0]}")
    given = [name for name in _QUANTIZE_FLAGS if fv[name].present]
    if given and fv.quantize == "none":
        raise UsageError(f"--{given[0]} has no effect without --quantize",
                         f"add --quantize=int8 (or fp16), or drop --{given[0]}")
    if fv["cold_start_rounds"].present and not fv.cold_start:
        raise UsageError("--cold_start_rounds has no effect with --nocold_start",
                         "drop one of them")
    if fv["allow_regression"].present and fv.allow_regression and not fv.cold_start \
            and fv.benchmark_runs == 0:
        raise UsageError("--allow_regression has no effect with --nocold_start and "
                         "--benchmark_runs=0 (nothing is measured)", "drop one of them")


def _emit(result, fv: flags.FlagValues) -> None:
    if fv.report:
        report.write_json(result, fv.report)
        if getattr(result, "validation", None) is not None:
            from serving_opt.serving.validate import write_marker

            write_marker(result.validation, os.path.dirname(os.path.abspath(fv.report)))
    if fv.json:
        import json

        print(json.dumps(report.to_jsonable(result), indent=2))
    else:
        print(report.format_optimize_report(result))
