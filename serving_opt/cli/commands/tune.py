"""Find TF Serving's batching and thread settings for a model and a load, and prove them.

Measures the model as TF Serving runs it (batch sizes, thread settings, each in a
fresh process), reads a small grid of batching settings off that curve (max_batch_size
at its knee, timeouts 0, 1 ms and half a request's run, 1 or a batch thread per core),
then proves TF Serving's default (no batching), upstream's batching defaults and each
grid setting on a real server under real gRPC/REST load; the measured best within
p99 --slo_p99_ms is recommended. Writes into --output_dir:
batching_parameters.txt, tensorflow_model_server.flags, models.config (a
--model_config_file snippet), docker/ (Dockerfile, compose.yaml, docker.env),
docker.diff, tune.json, tune.txt and a chart (tune.png; tune.svg without matplotlib).
Unless the best beats upstream's batching defaults by more than the noise over
--rounds interleaved rounds, upstream's defaults are recommended. Exit 1 when no
setting meets the SLO (the report says how close they came). The flags are made from
TuneOptions' groups (serving_opt/tune/options.py).
"""

from __future__ import annotations

import sys

from absl import flags

from serving_opt.cli import main as cli
from serving_opt.cli import option_flags

SUMMARY = "find and prove TF Serving batching/thread settings for a load and a p99 SLO"


WORKLOAD_FLAGS = ("slo_p99_ms", "clients", "rate", "rows_per_request")


def _tree():
    # Imported when the flags are made, not when the CLI starts (no TensorFlow here).
    from serving_opt.tune import options as tune_options

    return tune_options


def define_workload_flags(fv: flags.FlagValues, help_prefix: str = "") -> None:
    """The load tune is asked to serve and its objective; ``optimize --tune`` shares them."""
    option_flags.define(fv, _tree().WorkloadOptions, help_prefix=help_prefix,
                        module_name=__name__)


def define_flags(fv: flags.FlagValues) -> None:
    """Every flag of ``serving-opt tune``: the model base and output directory, then one
    flag per option of ``TuneOptions`` (made from its groups), then how to print.
    """
    tree = _tree()
    flags.DEFINE_string("model_base_path", None,
                        "Model base directory (holds <version>/), as TF Serving's flag.",
                        flag_values=fv)
    flags.DEFINE_string("output_dir", None,
                        "Where batching_parameters.txt, the flag line, docker files, the "
                        "report, the table and the chart go.", flag_values=fv)
    for name, group in tree.TuneOptions.GROUPS.items():
        skip = tree.TRUST_FLAGS_SKIPPED if name == "trust" else ()
        option_flags.define(fv, group, skip=skip, module_name=__name__)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)
    flags.DEFINE_bool("progress", True, "Print progress on stderr while measuring.",
                      flag_values=fv)
    cli.required("model_base_path", fv)
    cli.required("output_dir", fv)
    cli.required("slo_p99_ms", fv)


def options_from_flags(fv: flags.FlagValues):
    """TuneOptions from the flags; UsageError for a bad value (before any work)."""
    tree = _tree()
    groups = {}
    for name, group in tree.TuneOptions.GROUPS.items():
        skip = tree.TRUST_FLAGS_SKIPPED if name == "trust" else ()
        groups[name] = option_flags.read(fv, group, skip=skip)
    return tree.TuneOptions(**groups)


def main(fv: flags.FlagValues) -> int:
    from serving_opt.tune import tune
    from serving_opt.tune.options import check_options
    from serving_opt.tune.report import format_report

    options = options_from_flags(fv)
    check_options(options)
    progress = (lambda m: print(m, file=sys.stderr, flush=True)) if fv.progress else None
    result = tune(fv.model_base_path, options, progress, output_dir=fv.output_dir)
    if fv.json:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_report(result))
    if not result.ok:
        print(f"{cli.PROG} tune: error: no proven setting met p99 <= "
              f"{options.workload.slo_p99_ms:g} ms under the load; raise --slo_p99_ms or lower "
              "--clients/--rate (the report shows how close each came)", file=sys.stderr)
        return 1
    return 0
