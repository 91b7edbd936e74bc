"""Find TF Serving's batching and thread settings for a model and a load, and prove them.

Measures the model as TF Serving runs it (batch sizes, thread settings, each in a
fresh process), fits the server's own cost per request, searches TF Serving's
batching parameters with a model of its batch scheduler for the most throughput with
p99 under --slo_p99_ms, then proves TF Serving's default (no batching), upstream's
batching defaults and the best settings on a real server under real gRPC/REST load,
each measurement next to the model's prediction. Writes into --output_dir:
batching_parameters.txt, tensorflow_model_server.flags, docker/ (Dockerfile,
compose.yaml, docker.env), docker.diff, tune.json, tune.txt and a chart (tune.png;
tune.svg without matplotlib). Exit 1 when no setting meets the SLO (the report says
how close they came).

Example:
  serving-opt tune --model_base_path=/models/mnv2 --clients=16 --slo_p99_ms=250 \\
      --output_dir=build/tune
"""

from __future__ import annotations

import sys

from absl import flags

from serving_opt.cli import main as cli
from serving_opt.serving import backends

SUMMARY = "find and prove TF Serving batching/thread settings for a load and a p99 SLO"


WORKLOAD_FLAGS = ("slo_p99_ms", "clients", "rate", "rows_per_request")


def define_workload_flags(fv: flags.FlagValues, help_prefix: str = "") -> None:
    """The load tune is asked to serve and its objective; ``optimize --tune`` shares them.

    Example:
        >>> define_workload_flags(fv, help_prefix="With --tune: ")
    """
    flags.DEFINE_float("slo_p99_ms", None,
                       help_prefix + "The p99 latency objective, in milliseconds.",
                       flag_values=fv)
    flags.DEFINE_integer("clients", 0,
                         help_prefix + "Closed-loop clients: each sends its next request "
                         "when its answer arrives (0: none).", flag_values=fv)
    flags.DEFINE_float("rate", 0.0,
                       help_prefix + "Open-loop Poisson arrivals, requests/s (0: none).",
                       flag_values=fv)
    flags.DEFINE_integer("rows_per_request", 1,
                         help_prefix + "Rows (examples, images) in each request.",
                         flag_values=fv)


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("model_base_path", None,
                        "Model base directory (holds <version>/), as TF Serving's flag.",
                        flag_values=fv)
    flags.DEFINE_string("output_dir", None,
                        "Where batching_parameters.txt, the flag line, docker files, the "
                        "report, the table and the chart go.", flag_values=fv)
    define_workload_flags(fv)
    flags.DEFINE_string("model_name", None, "Model name (default: the base's directory name).",
                        flag_values=fv)
    flags.DEFINE_integer("version", None, "Version to tune (default: the highest).",
                         flag_values=fv)
    flags.DEFINE_string("signature_name", "serving_default", "Signature the clients call.",
                        flag_values=fv)
    flags.DEFINE_string("saved_model_tags", "serve", "MetaGraph tag set.", flag_values=fv)
    flags.DEFINE_string("examples", None,
                        "Request inputs: TFRecord of tf.Example or JSON lines (default: "
                        "synthesized from the signature).", flag_values=fv)
    flags.DEFINE_string("tensorflow_intra_op_parallelism", "auto",
                        "Values of TF Serving's flag to measure, e.g. 0,1,2 (0: TensorFlow's "
                        "default); auto: 0 and 1.", flag_values=fv)
    flags.DEFINE_string("tensorflow_inter_op_parallelism", "auto",
                        "Values of TF Serving's flag to measure (every pair with the intra "
                        "values); auto: 0.", flag_values=fv)
    flags.DEFINE_integer("max_batch_size_bound", 0,
                         "Largest batch measured and tried (0: twice the clients' rows, at "
                         "least 32).", flag_values=fv)
    flags.DEFINE_string("allowed_batch_sizes", "none",
                        "none, pow2 (pad to powers of two up to max_batch_size), or a list "
                        "of sizes; the cost of padding is reported either way.",
                        flag_values=fv)
    flags.DEFINE_float("max_reject_fraction", 0.001,
                       "Requests a setting may reject (UNAVAILABLE, max_enqueued_batches).",
                       flag_values=fv)
    flags.DEFINE_float("profile_seconds", 1.0, "Seconds per measured batch size.",
                       flag_values=fv)
    flags.DEFINE_float("duration", 15.0, "Seconds of each proven load point.", flag_values=fv)
    flags.DEFINE_float("warmup", 2.0, "Seconds of load before each point is measured.",
                       flag_values=fv)
    flags.DEFINE_float("calibration_seconds", 5.0,
                       "Seconds of the one-client calibration point.", flag_values=fv)
    flags.DEFINE_integer("prove", 2, "Tuned runners-up proven besides the best.",
                         flag_values=fv)
    flags.DEFINE_bool("recheck", True,
                      "Measure the calibration point again at the end: how far the machine "
                      "itself drifted during the run.", flag_values=fv)
    flags.DEFINE_list("protocols", ["grpc", "rest"], "Load over grpc, rest or both.",
                      flag_values=fv)
    flags.DEFINE_enum("server", "auto", list(backends.BACKENDS),
                      "docker, binary (tensorflow_model_server on PATH), local (serving-opt "
                      "serve --enable_batching), or auto: the first that can run here.",
                      flag_values=fv)
    flags.DEFINE_string("image", backends.DEFAULT_IMAGE, "Docker image for --server=docker.",
                        flag_values=fv)
    flags.DEFINE_string("current_parameters_file", None,
                        "A batching parameters file in use today: proven beside the tuned "
                        "settings.", flag_values=fv)
    flags.DEFINE_float("load_deadline", 300.0, "Seconds to wait for the model to load.",
                       flag_values=fv)
    flags.DEFINE_bool("allow_file_ops", False,
                      "Run a model whose signatures touch files or the host (see "
                      "serving-opt validate). Only for models you trust.", flag_values=fv)
    flags.DEFINE_bool("allow_unsandboxed", False,
                      "Run where the bubblewrap sandbox cannot start. Only for models you "
                      "trust.", flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)
    flags.DEFINE_bool("progress", True, "Print progress on stderr while measuring.",
                      flag_values=fv)
    cli.required("model_base_path", fv)
    cli.required("output_dir", fv)
    cli.required("slo_p99_ms", fv)


def options_from_flags(fv: flags.FlagValues):
    """TuneOptions from the flags; UsageError for a bad value (before any work)."""
    from serving_opt.tune.options import TuneOptions, check_padding, parse_int_list

    return TuneOptions(
        slo_p99_ms=fv.slo_p99_ms, clients=fv.clients, rate=fv.rate,
        rows_per_request=fv.rows_per_request, model_name=fv.model_name, version=fv.version,
        signature_name=fv.signature_name, saved_model_tags=fv.saved_model_tags,
        examples=fv.examples,
        intra_op=parse_int_list(fv.tensorflow_intra_op_parallelism,
                                "--tensorflow_intra_op_parallelism"),
        inter_op=parse_int_list(fv.tensorflow_inter_op_parallelism,
                                "--tensorflow_inter_op_parallelism"),
        max_batch_size_bound=fv.max_batch_size_bound,
        padding=check_padding(fv.allowed_batch_sizes),
        max_reject_fraction=fv.max_reject_fraction, profile_seconds=fv.profile_seconds,
        duration=fv.duration, warmup=fv.warmup, calibration_seconds=fv.calibration_seconds,
        prove=fv.prove, recheck=fv.recheck,
        protocols=tuple(p.strip().lower() for p in fv.protocols),
        server=fv.server, image=fv.image, current_parameters_file=fv.current_parameters_file,
        load_deadline=fv.load_deadline, allow_file_ops=fv.allow_file_ops,
        allow_unsandboxed=fv.allow_unsandboxed)


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
        print(f"{cli.PROG} tune: error: no proven setting met p99 <= {options.slo_p99_ms:g} ms "
              "under the load; raise --slo_p99_ms or lower --clients/--rate (the report "
              "shows how close each came)", file=sys.stderr)
        return 1
    return 0
