"""Serve a model base with TF Serving (or the local stand-in) and prove it answers right.

Waits until the version is AVAILABLE, checks the metadata against the
SavedModel, sends Predict for every signature (Classify/Regress for those
signatures, MultiInference when both kinds exist), compares every answer with
the reference model run in-process, over gRPC and REST (--protocols), then runs
a concurrent load phase. Exit 0 only when everything held. With --report, writes
the JSON report and a VALIDATED / NOT_VALIDATED marker file beside it, naming the
server that answered and its TensorFlow version.

The local stand-in runs under the target TF Serving's TensorFlow
(--serving_version; installed once into ~/.cache/serving-opt/runtimes, or
$SERVING_OPT_RUNTIME_2_15-style variables / --serving_runtime_python name one).

Example:
  serving-opt validate --model_base=/models/clf --reference_dir=exports/1700000000
"""

from __future__ import annotations

import os
import sys

from absl import flags

from serving_opt import report
from serving_opt.cli import main as cli
from serving_opt.serving import backends

SUMMARY = "serve a model over gRPC and REST (TF Serving or local) and compare its answers"


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("model_base", None, "Model base directory (holds <version>/).",
                        flag_values=fv)
    flags.DEFINE_string("model_name", None, "Model name (default: the base's directory name).",
                        flag_values=fv)
    flags.DEFINE_integer("version", None, "Version to validate (default: the highest).",
                         flag_values=fv)
    flags.DEFINE_string("reference_dir", None,
                        "SavedModel whose answers are expected (default: the served version).",
                        flag_values=fv)
    flags.DEFINE_enum("server", "auto", list(backends.BACKENDS),
                      "docker, binary (tensorflow_model_server on PATH), local (serving-opt "
                      "serve), or auto: the first that can run here.", flag_values=fv)
    flags.DEFINE_string("image", backends.DEFAULT_IMAGE, "Docker image for --server=docker.",
                        flag_values=fv)
    define_runtime_flags(fv)
    flags.DEFINE_string("examples", None,
                        "Request inputs: TFRecord of tf.Example or JSON lines (default: "
                        "synthesized).", flag_values=fv)
    flags.DEFINE_string("saved_model_tags", "serve", "MetaGraph tag set.", flag_values=fv)
    flags.DEFINE_integer("concurrency", 8, "Concurrent clients in the load phase (0 skips it).",
                         flag_values=fv)
    flags.DEFINE_float("duration", 5.0, "Seconds of the load phase.", flag_values=fv)
    flags.DEFINE_float("load_deadline", 300.0, "Seconds to wait for the model to be AVAILABLE.",
                       flag_values=fv)
    flags.DEFINE_float("atol", 1e-5, "Absolute tolerance for float outputs.", flag_values=fv)
    flags.DEFINE_float("rtol", 1e-4, "Relative tolerance for float outputs.", flag_values=fv)
    flags.DEFINE_bool("allow_file_ops", False,
                      "Run a model whose signatures touch files or the host (WriteFile, ReadFile, "
                      "PyFunc, checkpoint, summary and tf.data file ops, ...; see "
                      "serving_opt/host_ops.py). Off: such a model is refused before it "
                      "runs. Only for models you trust: a SavedModel is code.", flag_values=fv)
    flags.DEFINE_bool("allow_unsandboxed", False,
                      "Run the reference model and the server even where the bubblewrap "
                      "sandbox cannot start. Only for models you trust.", flag_values=fv)
    flags.DEFINE_bool("write_warmup", False,
                      "Write the validation requests to assets.extra/tf_serving_warmup_requests "
                      "of the validated version (replayed by the server at load).",
                      flag_values=fv)
    flags.DEFINE_string("report", None,
                        "Write the JSON report here, and VALIDATED/NOT_VALIDATED beside it.",
                        flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)
    cli.required("model_base", fv)


def define_runtime_flags(fv: flags.FlagValues) -> None:
    """Flags shared with optimize --validate."""
    flags.DEFINE_list("protocols", ["grpc", "rest"],
                      "APIs to validate: grpc, rest or both (every backend serves both).",
                      flag_values=fv)
    flags.DEFINE_string("serving_version", None,
                        "TensorFlow release of the production TF Serving (e.g. 2.20.0): the "
                        "local server runs under it, installed once into the cache if missing. "
                        "Default: the image's release when a runtime for it is already here, "
                        "else this TensorFlow (the report says so).", flag_values=fv)
    flags.DEFINE_string("serving_runtime_python", None,
                        "A python whose TensorFlow is --serving_version's (instead of a cached "
                        "venv; also $SERVING_OPT_RUNTIME_<X>_<Y>).", flag_values=fv)
    flags.DEFINE_enum("require_server", "any", ["any", "tf_serving"],
                      "tf_serving: fail when only the local stand-in can run (no Docker "
                      "engine, no tensorflow_model_server).", flag_values=fv)


def main(fv: flags.FlagValues) -> int:
    from serving_opt.serving.validate import ValidateOptions, validate

    options = ValidateOptions(
        model_name=fv.model_name, version=fv.version, reference_dir=fv.reference_dir,
        server=fv.server, image=fv.image, examples=fv.examples,
        saved_model_tags=fv.saved_model_tags, concurrency=fv.concurrency,
        duration=fv.duration, load_deadline=fv.load_deadline, atol=fv.atol, rtol=fv.rtol,
        write_warmup=fv.write_warmup, allow_file_ops=fv.allow_file_ops,
        protocols=tuple(fv.protocols), serving_version=fv.serving_version,
        serving_runtime_python=fv.serving_runtime_python, require_server=fv.require_server,
        allow_unsandboxed=fv.allow_unsandboxed,
    )
    result = validate(fv.model_base, options,
                      progress=lambda m: print(m, file=sys.stderr, flush=True))
    emit(result, fv.report, fv.json)
    if not result.ok:
        print(f"serving-opt validate: error: {result.failures[0]}", file=sys.stderr)
    return 0 if result.ok else 1


def emit(result, report_path: str | None, as_json: bool) -> None:
    if report_path:
        report.write_json(result, report_path)
        from serving_opt.serving.markers import write_marker

        write_marker(result, os.path.dirname(os.path.abspath(report_path)))
    if as_json:
        import json

        print(json.dumps(report.to_jsonable(result), indent=2))
    else:
        print(report.format_validation_report(result))
