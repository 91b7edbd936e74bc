"""Shows what a SavedModel holds and what could hurt serving it.

Per MetaGraph: signatures (inputs/outputs with dtype, shape and tensor), init op, assets,
node counts and op histograms; for the directory: size on disk, variables (count, bytes,
the largest five); and risks (file or Python ops reachable from a signature, assets
outside assets/ or missing, dangling signature tensors, more than 2 GiB of variables).
Reads files only; nothing is loaded or run.
"""

from __future__ import annotations

import sys

from absl import flags

from serving_opt import inspection
from serving_opt.cli import main as cli
from serving_opt.core.rendering import printable
from serving_opt.errors import EXIT_FAILURE, UsageError
from serving_opt.savedmodel import frozen_graph, tf_process

SUMMARY = "show signatures, variables, ops, size on disk and serving risks of a SavedModel"
FAIL_ON = ["error", "warning", "never"]


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the flags of `serving-opt inspect` on ``fv``."""
    cli.define_model_dir(fv, cli.SAVED_MODEL_DIR,
                         "SavedModel directory (the one holding saved_model.pb), or a frozen "
                         "GraphDef .pb (its candidate inputs and outputs are listed).")
    flags.DEFINE_string(
        "saved_model_tags", None,
        "Comma-separated tag set of the MetaGraph to inspect, e.g. 'serve' ('': the "
        "MetaGraph with no tags); default: all.",
        flag_values=fv,
    )
    flags.DEFINE_boolean(
        "json", False, "Print the report as JSON (docs/inspect-json-schema.md).", flag_values=fv
    )
    flags.DEFINE_enum(
        "fail_on", "error", FAIL_ON,
        "Exit 1 when a risk of this severity or worse is found (error: ERROR risks; "
        "warning: ERROR or WARNING risks; never: always exit 0). The report is printed "
        "either way.", flag_values=fv,
    )


def main(fv: flags.FlagValues) -> int:
    """Inspects ``--saved_model_dir`` and prints the report on stdout; returns 0, or 1
    when a risk at or above ``--fail_on`` was found (one line on stderr says so).
    """
    if not fv.saved_model_dir.strip():
        raise UsageError("--saved_model_dir is empty", "pass the SavedModel directory")
    if fv.verbosity <= 0:
        tf_process.quiet_tensorflow_import()
    if frozen_graph.is_graph_def_path(fv.saved_model_dir):
        from serving_opt.inspection.frozen_graph_report import inspect_graph_def

        report = inspect_graph_def(fv.saved_model_dir)
    else:
        report = inspection.inspect_saved_model(fv.saved_model_dir, fv.saved_model_tags)
    print(report.to_json() if fv.json else report.format_table())
    levels = {"error": (inspection.SEVERITY_ERROR,),
              "warning": (inspection.SEVERITY_ERROR, inspection.SEVERITY_WARNING),
              "never": ()}[fv.fail_on]
    failing = [r for r in report.risks if r.severity in levels]
    if failing:
        first = failing[0]
        print(f"{cli.PROG} inspect: error: {len(failing)} risk(s) at or above "
              f"--fail_on={fv.fail_on}, first: {first.severity.upper()} {first.code} "
              f"({printable(first.subject)}); see the risks in the report "
              "(--fail_on=never only reports)",
              file=sys.stderr, flush=True)
        return EXIT_FAILURE
    return 0
