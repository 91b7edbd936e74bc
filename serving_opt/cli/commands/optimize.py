"""Optimize a SavedModel for TF Serving and publish it as a new version.

Freezes variables (keeping tables, assets and the init op), applies Graph
Transform Tool transforms and Grappler passes, writes a SavedModel with the same
signatures, checks it answers like the original, and only then renames it into
MODEL_BASE_PATH/<version>. Prints a report table; --report also writes it as JSON.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from serving_opt import options as options_lib
from serving_opt.cli import main as cli
from serving_opt.cli import option_flags
from serving_opt.cli.commands import tune as tune_cli
from serving_opt.core import rendering
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.pipeline import report

SUMMARY = "freeze, transform and re-wrap a SavedModel; publish it after a parity check"


# The option groups whose fields are optimize's flags (serving_opt/options.py).
_GROUPS = {"output": options_lib.OutputOptions, "build": options_lib.BuildOptions,
           "inputs": options_lib.InputOptions, "tolerance": options_lib.Tolerance,
           "gate": options_lib.GateOptions, "measure": options_lib.MeasureOptions,
           "target": options_lib.TargetOptions, "trust": options_lib.TrustOptions,
           "graph_def": options_lib.GraphDefOptions}
# Flags named apart from their fields (OptimizeOptions.inputs is a group).
_RENAME = {"graph_def": {"graph_inputs": "inputs", "graph_outputs": "outputs"}}


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the flags of `serving-opt optimize` on ``fv``: the model directories, one
    flag per option (from the option groups), and how the report is shown.
    """
    cli.define_model_dir(fv, cli.SAVED_MODEL_DIR,
                         "SavedModel directory to optimize (read only), or a frozen GraphDef "
                         "(.pb, e.g. frozen_inference_graph.pb; see --inputs/--outputs).",
                         aliases=("input_dir",))
    cli.define_model_dir(fv, cli.MODEL_BASE_PATH,
                         "Model base directory (holds <version>/); the result goes to "
                         "MODEL_BASE_PATH/<version>.", aliases=("output_base",))
    for name, group in _GROUPS.items():
        option_flags.define(fv, group, rename=_RENAME.get(name))
    flags.DEFINE_bool("validate", False,
                      "Before publishing, serve the result (over gRPC and REST) and compare "
                      "every signature's answers with the result's own in a session (the "
                      "parity gate compared those with the input model; see serving-opt "
                      "validate).", flag_values=fv)
    option_flags.define(fv, options_lib.ServingCheck, help_prefix="With --validate: ")
    flags.DEFINE_string("report", None, "Also write the report as JSON to this file.",
                        flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)
    flags.DEFINE_bool("progress", True, "Print stage progress on stderr.", flag_values=fv)
    flags.DEFINE_bool("tune", False,
                      "After publishing, run serving-opt tune on the published version "
                      "(needs --tune_output_dir, --slo_p99_ms and --clients or --rate).",
                      flag_values=fv)
    flags.DEFINE_string("tune_output_dir", None,
                        "With --tune: where tune writes batching_parameters.txt, the flag "
                        "line, its report and chart.", flag_values=fv)
    tune_cli.define_workload_flags(fv, help_prefix="With --tune: ")


def options_from_flags(fv: flags.FlagValues) -> options_lib.OptimizeOptions:
    """The OptimizeOptions the parsed flags say (fields without a flag keep defaults)."""
    groups = {name: option_flags.read(fv, group, rename=_RENAME.get(name))
              for name, group in _GROUPS.items()}
    validate = option_flags.read(fv, options_lib.ServingCheck) if fv.validate else None
    return options_lib.OptimizeOptions(**groups, validate=validate)


def configure_runtime() -> None:
    """Called by the CLI before TensorFlow is imported (see tf_process.configure_for_optimizing)."""
    from serving_opt.savedmodel import tf_process

    tf_process.configure_for_optimizing()


def main(fv: flags.FlagValues) -> int:
    from serving_opt.pipeline.optimizer import optimize

    if fv.version is not None and fv.version < 0:
        raise UsageError(f"--version={fv.version} is negative", "pass --version=N with N >= 0")
    options = options_from_flags(fv)
    check_dependent_flags(fv)
    tuning = tune_options(fv, options) if fv.tune else None  # checked before any work
    progress = (lambda m: print(m, file=sys.stderr, flush=True)) if fv.progress else None
    try:
        result = optimize(fv.saved_model_dir, fv.model_base_path, options, progress)
    except ServingOptError as e:
        if e.report is not None:
            _emit(e.report, fv)
        raise
    _emit(result, fv)
    if tuning is None:
        return 0
    return _tune(fv, tuning, result, progress)


_TUNE_FLAGS = ("tune_output_dir", *tune_cli.WORKLOAD_FLAGS)


def tune_options(fv: flags.FlagValues, options: options_lib.OptimizeOptions):
    """The TuneOptions of ``--tune``, checked (UsageError before any work).

    The model's inputs, tags and trust are optimize's own: one setting, not two.
    """
    from serving_opt.tune.options import ModelOptions, TuneOptions, WorkloadOptions, check_options

    if not fv.tune_output_dir or fv.slo_p99_ms is None:
        raise UsageError("--tune needs --tune_output_dir and --slo_p99_ms",
                         "e.g. --tune --tune_output_dir=build/tune --slo_p99_ms=100 "
                         "--clients=16")
    tuning = TuneOptions(
        workload=WorkloadOptions(slo_p99_ms=fv.slo_p99_ms,
                                 clients=fv.clients,
                                 rate=fv.rate,
                                 rows_per_request=fv.rows_per_request),
        model=ModelOptions(version=options.output.version,
                           saved_model_tags=options.inputs.saved_model_tags,
                           examples=options.inputs.examples),
        trust=options_lib.TrustOptions(allow_file_ops=options.trust.allow_file_ops,
                                       allow_unsandboxed=options.trust.allow_unsandboxed))
    check_options(tuning)
    return tuning


def _tune(fv: flags.FlagValues, tuning, result, progress) -> int:
    """serving-opt tune on the version just published; 1 when no setting met the SLO."""
    import dataclasses
    import os

    from serving_opt.tune import tune
    from serving_opt.tune.report import format_report

    version = int(os.path.basename(os.path.normpath(result.output_dir)))
    tuning = dataclasses.replace(tuning, model=dataclasses.replace(tuning.model, version=version))
    tuned = tune(fv.model_base_path, tuning, progress, output_dir=fv.tune_output_dir)
    print(format_report(tuned))
    if not tuned.ok:
        print(f"{cli.PROG} optimize: error: published {result.output_dir}, but no tuned "
              f"setting met p99 <= {tuning.workload.slo_p99_ms:g} ms; see {fv.tune_output_dir}",
              file=sys.stderr)
        return 1
    return 0


# Flags that mean nothing without another one: given alone they are a usage error
# naming both, never silently ignored. (flag, what it needs, how to test that).
_VALIDATE_FLAGS = tuple(f.name for f in option_flags.flag_fields(options_lib.ServingCheck))
_QUANTIZE_FLAGS = ("quantize_min_elements", "min_top1_agreement", "max_probability_error")


def check_dependent_flags(fv: flags.FlagValues) -> None:
    """UsageError for a flag given without the flag that gives it meaning."""
    given = [name for name in _VALIDATE_FLAGS if fv[name].present]
    if given and not fv.validate:
        raise UsageError(f"--{given[0]} has no effect without --validate",
                         f"add --validate, or drop --{given[0]}")
    given = [name for name in _QUANTIZE_FLAGS if fv[name].present]
    if given and fv.quantize == "none":
        raise UsageError(f"--{given[0]} has no effect without --quantize",
                         f"add --quantize=int8 (or int4, fp16), or drop --{given[0]}")
    given = [name for name in _TUNE_FLAGS if fv[name].present]
    if given and not fv.tune:
        raise UsageError(f"--{given[0]} has no effect without --tune",
                         f"add --tune, or drop --{given[0]}")
    if fv["cold_start_rounds"].present and not fv.cold_start:
        raise UsageError("--cold_start_rounds has no effect with --nocold_start",
                         "drop one of them")
    if fv["allow_regression"].present and fv.allow_regression and not fv.cold_start \
            and fv.benchmark_runs == 0:
        raise UsageError("--allow_regression has no effect with --nocold_start and "
                         "--benchmark_runs=0 (nothing is measured)", "drop one of them")


def _emit(result, fv: flags.FlagValues) -> None:
    if fv.report:
        rendering.write_json(result, fv.report)
        if getattr(result, "validation", None) is not None:
            from serving_opt.serving.validate import write_marker

            write_marker(result.validation, os.path.dirname(os.path.abspath(fv.report)))
    if fv.json:
        import json

        print(json.dumps(rendering.to_jsonable(result), indent=2))
    else:
        print(report.format_optimize_report(result))
