"""Compare two SavedModels on a whole evaluation set, as a job on Apache Beam.

Reads TFRecord shards of serialized tf.Example (or JSON lines of requests) matching
--examples from any filesystem Beam reads (local, gs://, s3://), runs both models on
every example with Beam's RunInference (the session loader, as TF Serving loads), and
reports per signature output: mismatches under --atol/--rtol, abs/rel diffs and their
histogram, top-1 agreement and class confusion for classifiers, and the worst examples
(<shard>:<record index>). Exit 0 when nothing differs, 1 otherwise. Arguments after --
go to Beam (--project, --region, --temp_location, ...). See docs/compare.md.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import flags

from serving_opt import options as options_lib
from serving_opt.cli import main as cli
from serving_opt.cli import option_flags
from serving_opt.core.rendering import printable
from serving_opt.errors import UsageError

SUMMARY = "compare two models on every example of sharded TFRecords (Apache Beam)"
PASSES_ARGS_AFTER_DASHES = True  # `-- --project=p --region=r`: Beam pipeline options


_MODELS = {"baseline": "SavedModel whose answers are expected.",
           "candidate": "SavedModel to compare with it."}
# The shared option groups compare takes (serving_opt/options.py); the examples and the
# signatures are compare's own (shards to read; signatures the examples fit).
_GROUPS = {"inputs": (options_lib.InputOptions, ("examples",)),
           "tolerance": (options_lib.Tolerance, ()),
           "trust": (options_lib.TrustOptions, ())}
_HELP = {"allow_unsandboxed": "Run the models even where the bubblewrap sandbox cannot start, "
                              "or on remote examples with a local runner. Only for models "
                              "you trust.",
         "sandbox_memory_bytes": "Memory limit of each process of the sandboxed pipeline "
                                 "(default: 3/4 of the RAM).",
         "sandbox_timeout_seconds": "Wall-clock limit of the sandboxed pipeline: a model "
                                    "that blocks for ever is stopped (default: 6 hours; "
                                    "raise it for a very large comparison)."}


def define_flags(fv: flags.FlagValues) -> None:
    """Defines the flags of `serving-opt compare` on ``fv``."""
    from serving_opt.compare import CompareOptions

    default = {f.name: f.default for f in dataclasses.fields(CompareOptions)}
    for role, text in _MODELS.items():
        cli.define_model_dir(fv, f"{role}_{cli.SAVED_MODEL_DIR}", text, aliases=(role,))
    flags.DEFINE_string("examples", None,
                        "Glob of TFRecord shards of serialized tf.Example, or of JSON-lines "
                        "files of {alias: [rows]} requests; local, gs://, s3://.",
                        flag_values=fv)
    cli.required("examples", fv)
    flags.DEFINE_list("signatures", list(default["signatures"]),
                      "Signature keys to compare (default: every one the examples fit).",
                      flag_values=fv)
    for group, skip in _GROUPS.values():
        option_flags.define(fv, group, skip=skip, help=_HELP)
    flags.DEFINE_string("runner", default["runner"],
                        "Beam runner: DirectRunner, PrismRunner, DataflowRunner, FlinkRunner, "
                        "SparkRunner, ...", flag_values=fv)
    flags.DEFINE_integer("direct_num_workers", default["direct_num_workers"],
                         "DirectRunner: worker processes (>1 runs them in parallel).",
                         flag_values=fv)
    flags.DEFINE_integer("batch_size", default["batch_size"], "Largest batch sent to a model.",
                         flag_values=fv)
    flags.DEFINE_integer("worst", default["worst_k"], "Worst examples kept per output.",
                         flag_values=fv)
    flags.DEFINE_string("report", None, "Also write the report as JSON to this file.",
                        flag_values=fv)
    flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.",
                      flag_values=fv)


def main(fv: flags.FlagValues, pipeline_args: list[str] | None = None) -> int:
    from serving_opt.compare import CompareOptions, compare, format_report
    from serving_opt.core import rendering as report_lib

    pipeline_args = list(pipeline_args or [])
    stray = [a for a in pipeline_args if not a.startswith("-")]
    if stray:
        raise UsageError(f"unexpected argument(s) {' '.join(stray)}",
                         "Beam options after -- take the form --name=value")
    shared = {name: option_flags.read(fv, group, skip=skip)
              for name, (group, skip) in _GROUPS.items()}
    options = CompareOptions(
        signatures=tuple(fv.signatures), saved_model_tags=shared["inputs"].saved_model_tags,
        runner=fv.runner, direct_num_workers=fv.direct_num_workers,
        pipeline_args=tuple(pipeline_args), batch_size=fv.batch_size,
        atol=shared["tolerance"].atol, rtol=shared["tolerance"].rtol, worst_k=fv.worst,
        allow_file_ops=shared["trust"].allow_file_ops,
        allow_unsandboxed=shared["trust"].allow_unsandboxed,
        sandbox_memory_bytes=shared["trust"].sandbox_memory_bytes,
        sandbox_timeout_seconds=shared["trust"].sandbox_timeout_seconds,
    )
    result = compare(fv.baseline_saved_model_dir, fv.candidate_saved_model_dir, fv.examples,
                     options, progress=lambda m: print(m, file=sys.stderr, flush=True))
    if fv.report:
        report_lib.write_json(result, fv.report)
    if fv.json:
        import json

        print(json.dumps(report_lib.to_jsonable(result), indent=2))
    else:
        print(format_report(result))
    if not result.ok:
        print(f"serving-opt compare: {printable(result.failures()[0])}", file=sys.stderr)
    return 0 if result.ok else 1
