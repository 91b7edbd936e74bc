"""The build action behind ``serving_saved_model`` (``//serving_opt:defs.bzl``).

Bazel declares the output directory; this fills it with the optimized SavedModel
itself (``saved_model.pb`` at its top, not a ``<version>/`` subdirectory):

    bazel_build --input_dir=examples/tiny_model --output_dir=bazel-out/.../tiny_optimized \\
        --report=bazel-out/.../tiny_optimized.report.json [optimize options] \\
        examples/tiny_model/saved_model.pb examples/tiny_model/variables/... (the srcs)

Only the listed files are used: they are copied (symlinks resolved) into a scratch
copy of the model first, so an unsandboxed action cannot read files the BUILD file
did not declare, and sizes in the report are real even when Bazel stages inputs as
symlinks. Without files, ``--input_dir`` is taken whole (a directory output of
another rule). The result goes through :func:`serving_opt.optimize` (parity gate
included, no benchmark) into a scratch model base inside the output directory, then
moves up into it. Silent on success; on failure one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence

SCRATCH_PREFIX = ".serving-opt-bazel-"


# The optimize options the rule passes, by group (serving_opt/options/): each is a flag
# of the same name whose default is the option's own (None here: the option's default).
_OPTIONS = {
    "build": ("transforms", "grappler", "grappler_rounds", "signatures", "freeze", "quantize",
              "quantize_min_elements", "freeze_max_bytes"),
    "inputs": ("saved_model_tags", "examples"),
    "tolerance": ("atol", "rtol"),
}


def _parser() -> argparse.ArgumentParser:
    from serving_opt import options as options_lib

    # "@file" arguments: Bazel passes long src lists in a params file, one argument a line.
    p = argparse.ArgumentParser(prog="serving_saved_model", fromfile_prefix_chars="@",
                                description=__doc__.splitlines()[0])
    p.add_argument("--input_dir", required=True,
                   help="the directory holding saved_model.pb (execroot-relative)")
    p.add_argument("--output_dir", required=True, help="the declared output directory")
    p.add_argument("--report", help="write the optimize report as JSON here")
    for group, names in _OPTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(options_lib.OptimizeOptions.GROUPS[group])}
        for name in names:
            f = fields[name]
            kind = f.type.replace(" ", "").split("|")[0]
            p.add_argument(f"--{name}", help=f.metadata.get("help"),
                           choices=f.metadata.get("choices"),
                           type={"int": int, "float": float}.get(kind, str))
    p.add_argument("--nocold_start", dest="cold_start", action="store_false", default=None)
    p.add_argument("--verbosity", type=int, default=0,
                   help="1: stage progress, TensorFlow's logs and tracebacks")
    p.add_argument("srcs", nargs="*", help="the model's files, all under --input_dir")
    return p


def options(args: argparse.Namespace):
    """The OptimizeOptions of the action: the flags given, the options' defaults for the
    others; version 1 and no benchmark (timing on a busy build machine means nothing).
    """
    from serving_opt import options as options_lib

    def given(names):
        values = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
        if "signatures" in values:
            values["signatures"] = tuple(s for s in values["signatures"].split(",") if s)
        return values

    groups = {group: options_lib.OptimizeOptions.GROUPS[group](**given(names))
              for group, names in _OPTIONS.items()}
    return options_lib.OptimizeOptions(
        **groups, output=options_lib.OutputOptions(version=1),
        measure=options_lib.MeasureOptions(benchmark_runs=0, **given(("cold_start",))))


def copy_model(input_dir: str, srcs: Sequence[str], dest: str) -> str:
    """Copies the declared files of the model at ``input_dir`` (or all of it) into ``dest``."""
    from serving_opt.errors import UsageError

    if not srcs:
        shutil.copytree(input_dir, dest)  # follows symlinks: real files in the copy
        return dest
    root = os.path.normpath(input_dir)
    for src in srcs:
        rel = os.path.relpath(os.path.normpath(src), root)
        if rel.startswith(os.pardir + os.sep) or rel == os.pardir or os.path.isabs(rel):
            raise UsageError(f"{src} is not inside the model directory {input_dir}",
                             "list only the SavedModel's files in srcs")
        target = os.path.join(dest, rel)
        if os.path.isdir(src):
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(src, target)
    return dest


def build(args: argparse.Namespace) -> None:
    """Optimizes ``args.input_dir`` into the (empty or new) ``args.output_dir``."""
    from serving_opt.core import rendering as report_lib
    from serving_opt.pipeline.optimizer import optimize

    out = args.output_dir
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        from serving_opt.errors import UsageError

        raise UsageError(f"output directory {out} is not empty", "Bazel declares it empty")
    # Inside the output directory: same filesystem (renames, no copies), writable even
    # in a sandbox, and removed with the output if the action fails.
    scratch = os.path.join(out, SCRATCH_PREFIX + "work")
    model = copy_model(args.input_dir, args.srcs, os.path.join(scratch, "input"))
    base = os.path.join(scratch, "base")
    progress = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbosity > 0 else None
    # A failure raises before anything is published; Bazel then discards the outputs.
    result = optimize(model, base, options(args), progress)
    for name in os.listdir(result.output_dir):
        os.rename(os.path.join(result.output_dir, name), os.path.join(out, name))
    shutil.rmtree(scratch)
    if args.report:
        # Name the action's real input and output, not the scratch copies.
        result = dataclasses.replace(result, input_dir=args.input_dir, output_base=out,
                                     output_dir=out)
        report_lib.write_json(result, args.report)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``//serving_opt:bazel_build``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.verbosity <= 0:
        # Bazel prints whatever an action writes; a successful build should print nothing,
        # a failed one this tool's one line. The C++ Graph Transform Tool even logs the
        # errors it ignores at ERROR level, and TF's Python deprecation notices are WARNINGs.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import logging

        from absl import logging as absl_logging

        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        absl_logging.set_verbosity(absl_logging.ERROR)
    from serving_opt.core.rendering import printable
    from serving_opt.errors import ServingOptError
    from serving_opt.savedmodel import tf_process

    tf_process.configure_for_optimizing()
    tf_process.quiet_tensorflow_import()
    try:
        build(args)
    except ServingOptError as e:
        if args.verbosity > 0:
            import traceback

            traceback.print_exc()
        print(f"serving_saved_model: {args.input_dir}: {printable(e.one_line())}",
              file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
