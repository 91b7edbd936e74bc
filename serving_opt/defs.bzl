"""Build rules: optimized, parity-checked SavedModels as ordinary Bazel artifacts.

    load("//serving_opt:defs.bzl", "serving_saved_model")

    serving_saved_model(
        name = "classifier_optimized",
        srcs = glob(["classifier/**"]),  # a SavedModel checked into (or built in) the repo
        transforms = "default",
        signatures = ["serving_default"],
    )

`bazel build :classifier_optimized` runs serving_opt's optimizer (freeze, Graph
Transform Tool, Grappler, parity gate) as a build action. The output is one
directory, `bazel-bin/<package>/classifier_optimized/`, holding the optimized
SavedModel itself (`saved_model.pb`, `variables/`, `assets/`), ready to be copied
to `<model base>/<version>/`. A failing parity gate fails the build. The JSON
optimize report is in the `report` output group
(`bazel build :classifier_optimized --output_groups=report`).

Works with Bazel 4.2 (WORKSPACE, Debian's bazel-bootstrap) through 7.
"""

def _find_model_dir(ctx):
    """(directory holding saved_model.pb, files to pass); files is empty for a tree input."""
    srcs = ctx.files.srcs
    if len(srcs) == 1 and srcs[0].is_directory:
        # A directory output of another rule (e.g. a training/export step): take it whole.
        return srcs[0].path, []
    protos = [f for f in srcs if f.basename in ("saved_model.pb", "saved_model.pbtxt")]
    if len(protos) != 1:
        fail(("serving_saved_model: srcs must contain exactly one saved_model.pb " +
              "(or .pbtxt), found %d: %s") % (
            len(protos),
            ", ".join([f.short_path for f in protos]) or "none (a glob that matched nothing?)",
        ))
    model_dir = protos[0].dirname
    outside = [f.short_path for f in srcs if not f.path.startswith(model_dir + "/")]
    if outside:
        fail(("serving_saved_model: srcs must all be inside %s, the directory of " +
              "saved_model.pb; not: %s") % (
            protos[0].short_path.rpartition("/")[0],
            ", ".join(outside),
        ))
    return model_dir, srcs

def _serving_saved_model_impl(ctx):
    model_dir, files = _find_model_dir(ctx)
    out = ctx.actions.declare_directory(ctx.label.name)
    report = ctx.actions.declare_file(ctx.label.name + ".report.json")

    args = ctx.actions.args()
    args.add("--input_dir=" + model_dir)
    args.add("--output_dir=" + out.path)
    args.add("--report=" + report.path)
    args.add("--transforms=" + ctx.attr.transforms)
    args.add("--grappler=" + ctx.attr.grappler)
    args.add("--grappler_rounds=%d" % ctx.attr.grappler_rounds)
    args.add("--signatures=" + ",".join(ctx.attr.signatures))
    args.add("--saved_model_tags=" + ctx.attr.saved_model_tags)
    args.add("--freeze=" + ctx.attr.freeze)
    args.add("--atol=" + ctx.attr.atol)
    args.add("--rtol=" + ctx.attr.rtol)
    args.add("--quantize=" + ctx.attr.quantize)
    args.add("--quantize_min_elements=%d" % ctx.attr.quantize_min_elements)
    args.add("--freeze_max_bytes=%d" % ctx.attr.freeze_max_bytes)
    if not ctx.attr.cold_start:
        args.add("--nocold_start")
    inputs = list(ctx.files.srcs)
    if ctx.file.examples:
        args.add("--examples=" + ctx.file.examples.path)
        inputs.append(ctx.file.examples)
    args.add_all(files)

    # Long src lists go through a params file ("@file", one argument a line).
    args.use_param_file("@%s", use_always = False)
    args.set_param_file_format("multiline")

    ctx.actions.run(
        executable = ctx.attr._tool[DefaultInfo].files_to_run,
        arguments = [args],
        inputs = inputs,
        outputs = [out, report],
        mnemonic = "ServingSavedModel",
        progress_message = "Optimizing SavedModel %s" % ctx.label,
        # The py_binary's stub starts `python` from PATH, and the interpreter (the
        # repo's venv, see //tools/bazel:venv_python.bzl) lives outside Bazel's view.
        use_default_shell_env = True,
        # That interpreter exists on this machine only. Unsandboxed like this repo's
        # tests: the tool copies exactly the declared srcs before reading them, which is
        # what the sandbox would ensure, and Debian's Bazel turns on --sandbox_debug in
        # /etc/bazel/bazelrc, which prints ~60 lines per sandboxed action.
        execution_requirements = {"no-remote": "1", "no-sandbox": "1"},
    )
    return [
        DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out])),
        OutputGroupInfo(report = depset([report])),
    ]

serving_saved_model = rule(
    implementation = _serving_saved_model_impl,
    doc = """Optimizes a SavedModel for TF Serving at build time (serving_opt optimize).

The output, a directory named after the target, is the optimized SavedModel; the
action fails (and nothing is produced) when its answers differ from the source's.
The `<name>.report.json` optimize report is in output group `report`.
""",
    attrs = {
        "srcs": attr.label_list(
            allow_files = True,
            mandatory = True,
            doc = "The SavedModel's files (e.g. glob([\"model/**\"])), all under the " +
                  "directory holding saved_model.pb; or one directory output of another rule.",
        ),
        "transforms": attr.string(
            default = "default",
            doc = "Graph Transform Tool spec; 'default' (lossless preset) or 'none'.",
        ),
        "grappler": attr.string(
            default = "default",
            doc = "Comma list of Grappler passes; 'default' or 'none'.",
        ),
        "grappler_rounds": attr.int(default = 2),
        "signatures": attr.string_list(
            default = [],
            doc = "Signature keys to keep; empty keeps all.",
        ),
        "saved_model_tags": attr.string(default = "serve"),
        "freeze": attr.string(default = "auto", values = ["auto", "always", "never"]),
        "atol": attr.string(default = "1e-5", doc = "Parity gate: absolute tolerance."),
        "rtol": attr.string(default = "1e-4", doc = "Parity gate: relative tolerance."),
        "quantize": attr.string(
            default = "none",
            values = ["none", "int8", "fp16"],
            doc = "Store large weights as int8 or fp16 (lossy; the lossy gate decides).",
        ),
        "quantize_min_elements": attr.int(default = 16384),
        "freeze_max_bytes": attr.int(
            default = 10485760,
            doc = "Variables larger than this stay variables, in a new checkpoint.",
        ),
        "cold_start": attr.bool(
            default = True,
            doc = "Refuse a result that loads slower, answers its first request slower " +
                  "or needs more memory than the original (fresh-process measurement).",
        ),
        "examples": attr.label(
            allow_single_file = True,
            doc = "Parity inputs: TFRecord of tf.Example or JSON lines (default: synthesized).",
        ),
        "_tool": attr.label(
            default = Label("//serving_opt:bazel_build"),
            executable = True,
            cfg = "exec",
        ),
    },
)
