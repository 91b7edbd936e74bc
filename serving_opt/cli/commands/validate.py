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
"""

from __future__ import annotations

import os
import sys

from absl import flags

from serving_opt import options as options_lib
from serving_opt.cli import main as cli
from serving_opt.cli import option_flags
from serving_opt.core import rendering
from serving_opt.pipeline import report

SUMMARY = "serve a model over gRPC and REST (TF Serving or local) and compare its answers"


# The option groups whose fields are validate's flags (serving_opt/options.py); the
# same groups optimize --validate takes, so the flags mean the same in both.
_GROUPS = {"serving": options_lib.ServingCheck, "inputs": options_lib.InputOptions,
           "tolerance": options_lib.Tolerance, "target": options_lib.TargetOptions,
           "trust": options_lib.TrustOptions}
# Validate's sandboxes take no memory limit (optimize's worker does).
_SKIP = {"trust": ("sandbox_memory_bytes",)}
_RENAME = {"reference_dir": "reference_" + cli.SAVED_MODEL_DIR}


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the flags of `serving-opt validate` on ``fv``."""
    cli.define_model_dir(fv, cli.MODEL_BASE_PATH, "Model base directory (holds <version>/).",
                         aliases=("model_base",))
    option_flags.define(fv, options_lib.ValidateOptions, rename=_RENAME)  # version, reference
    cli.alias("reference_dir", _RENAME["reference_dir"], fv)
    for name, group in _GROUPS.items():
        option_flags.define(fv, group, skip=_SKIP.get(name, ()))
    flags.DEFINE_string("report", None,
                        "Write the JSON report here, and VALIDATED/NOT_VALIDATED beside it.",
                        flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)


def options_from_flags(fv: flags.FlagValues) -> options_lib.ValidateOptions:
    """The ValidateOptions the parsed flags say (fields without a flag keep defaults)."""
    groups = {name: option_flags.read(fv, group, skip=_SKIP.get(name, ()))
              for name, group in _GROUPS.items()}
    return option_flags.read(fv, options_lib.ValidateOptions, rename=_RENAME, **groups)


def main(fv: flags.FlagValues) -> int:
    from serving_opt.serving.validate import validate

    result = validate(fv.model_base_path, options_from_flags(fv),
                      progress=lambda m: print(m, file=sys.stderr, flush=True))
    emit(result, fv.report, fv.json)
    if not result.ok:
        print(f"serving-opt validate: error: {rendering.printable(result.failures[0])}",
              file=sys.stderr)
    return 0 if result.ok else 1


def emit(result, report_path: str | None, as_json: bool) -> None:
    if report_path:
        rendering.write_json(result, report_path)
        from serving_opt.serving.markers import write_marker

        write_marker(result, os.path.dirname(os.path.abspath(report_path)))
    if as_json:
        import json

        print(json.dumps(rendering.to_jsonable(result), indent=2))
    else:
        print(report.format_validation_report(result))
