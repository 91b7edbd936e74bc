"""Stage 0 of optimize: the options checked and resolved once, before any work.

    p = plan("exports/1", "models/clf", OptimizeOptions())
    p.version, p.candidates[0].describe()      # (1, 'frozen')

Every user error is raised here (the options' own checks, the paths, the target
version), so a mistake costs no model load. The stages then read what they need from
the plan (its option groups and what was resolved from them), not from the options.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from serving_opt.errors import UsageError
from serving_opt.options import (
    BuildOptions,
    GateOptions,
    InputOptions,
    MeasureOptions,
    OptimizeOptions,
    OutputOptions,
    TargetOptions,
    Tolerance,
    TrustOptions,
    ValidateOptions,
)
from serving_opt.pipeline import attempts
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import frozen_graph, loader, model_files, writer
from serving_opt.savedmodel import shapes as shapes_lib
from serving_opt.stages import grappler as grappler_lib
from serving_opt.stages import transforms as transforms_lib


@dataclass(frozen=True)
class Plan:
    """What every stage will be asked to do: the checked options and what was resolved
    from them.
    """

    options: OptimizeOptions
    transforms: tuple  # of transforms_lib.Transform
    default_preset: bool  # the transforms are the lossless preset, not the user's spec
    lossy: tuple[str, ...]  # the lossy transforms asked for
    passes: tuple[str, ...]
    tags: frozenset[str]
    version: int
    user_inputs: object | None  # examples_lib.UserInputs
    candidates: tuple[attempts.Candidate, ...]  # the configurations to try, in order
    # The ValidateOptions of --validate, built from the options (the backend and runtime
    # are resolved before the sandbox starts); None: no validation.
    validate: ValidateOptions | None = None
    # The input is a frozen GraphDef (.pb): the worker makes it a SavedModel first.
    graph_def_input: bool = False
    # --input_shapes, parsed (savedmodel.shapes.PinnedShape); resolved when the model is read.
    pins: tuple = ()

    @property
    def build(self) -> BuildOptions:
        return self.options.build

    @property
    def inputs(self) -> InputOptions:
        return self.options.inputs

    @property
    def tolerance(self) -> Tolerance:
        return self.options.tolerance

    @property
    def gate(self) -> GateOptions:
        return self.options.gate

    @property
    def measure(self) -> MeasureOptions:
        return self.options.measure

    @property
    def target(self) -> TargetOptions:
        return self.options.target

    @property
    def trust(self) -> TrustOptions:
        return self.options.trust

    @property
    def output(self) -> OutputOptions:
        return self.options.output


def plan(input_dir: str, output_base: str, options: OptimizeOptions) -> Plan:
    """Resolves and checks everything the user asked for; fails before any work."""
    options.check()
    graph_def_input = _check_graph_def_input(input_dir, options)
    if options.output.output_format == "graphdef" and options.build.max_constant_bytes:
        # A .pb has no checkpoint: every weight stays a constant, in both outputs.
        options = dataclasses.replace(options, build=dataclasses.replace(
            options.build, max_constant_bytes=None))
    build = options.build
    transforms = transforms_lib.resolve_spec(build.transforms)
    _check_paths(input_dir, output_base)
    if not graph_def_input:
        # The file system's refusals, here in milliseconds: in the sandboxed worker they
        # came after TensorFlow's import (seconds); the worker checks again.
        loader.check_saved_model_dir(input_dir)
        model_files.check_model_files(input_dir)
        model_files.check_special_files(input_dir)
    writer.check_not_source(input_dir, output_base)  # by device and inode, not by name
    output = options.output
    version = output.version if output.version is not None \
        else writer.next_version(output_base)
    writer.check_target(output_base, version, output.overwrite, source=input_dir)
    writer.check_writable(output_base)
    examples = options.inputs.examples
    return Plan(
        options=options,
        transforms=transforms,
        default_preset=build.transforms is None or build.transforms.strip().lower() == "default",
        lossy=tuple(t.name for t in transforms if t.lossy),
        passes=grappler_lib.parse_passes(build.grappler),
        tags=loader.parse_tags(options.inputs.saved_model_tags),
        version=version,
        user_inputs=examples_lib.read_examples_file(examples) if examples else None,
        candidates=attempts.candidates(
            "always" if options.output.output_format == "graphdef" else build.freeze,
            build.quantize),
        validate=options.validate_options(),
        graph_def_input=graph_def_input,
        pins=shapes_lib.parse(build.input_shapes),
    )


def _check_graph_def_input(input_dir: str, options: OptimizeOptions) -> bool:
    """Whether the input is a frozen GraphDef; the .pb-only flags are usage errors
    without one. (Its tensors are resolved when the worker reads it.)"""
    is_pb = frozen_graph.is_graph_def_path(input_dir)
    given = options.graph_def.given()
    if not is_pb:
        if given:
            raise UsageError(f"--{given[0]} applies to a frozen GraphDef (.pb) input only, "
                             f"and {input_dir} is not one",
                             f"drop --{given[0]} (a SavedModel has signatures)")
        return False
    if not os.path.isfile(input_dir):
        raise UsageError(f"{input_dir} is not a file", "pass the frozen GraphDef (.pb) itself")
    if options.build.freeze == "never":
        raise UsageError("--freeze=never with a frozen GraphDef input: it has no variables "
                         "to keep", "drop --freeze=never")
    if options.build.signatures:
        raise UsageError("--signatures with a frozen GraphDef input: the .pb becomes one "
                         "signature, serving_default", "drop --signatures")
    return True


def _check_paths(input_dir: str, output_base: str) -> None:
    src = os.path.realpath(input_dir)
    dst = os.path.realpath(output_base)
    if dst == src or dst.startswith(src + os.sep):
        raise UsageError(
            f"--output_base {output_base} is inside --input_dir {input_dir}",
            "write to a separate model base (e.g. the parent of the version directory)",
        )


def target_version(plan: Plan) -> str:
    """The TF Serving release the ops are checked against: ``--serving_version``, else the
    validating image's tag (``--image=tensorflow/serving:2.21.0``), else the current one."""
    from serving_opt.serving import runtime as runtime_lib

    image = plan.validate.serving.image if plan.validate is not None else None
    return runtime_lib.target_version(plan.target.serving_version, image)
