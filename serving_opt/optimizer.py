"""The optimize pipeline: read, freeze, transform, Grappler, write, prove, publish.

    report = optimize("exports/1700000000", "models/clf")
    print(report.output_dir)        # models/clf/<next version>

Every user error is caught before the first expensive step (flags, transform
specs, the target version), the source directory is only ever read, and the new
version directory appears (atomically, by rename) only after the parity gate
passed. A failed gate raises :class:`~serving_opt.errors.ParityError` carrying
the full report, and leaves nothing behind in the model base.

``optimize()`` reads as the list of stages; each stage is a function below it that
takes values and returns values. The run record (:class:`~serving_opt.run.Run`)
times them, gathers warnings and builds the report. See docs/architecture.md.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass

from serving_opt import gates
from serving_opt import sandbox as sandbox_lib
from serving_opt.errors import (
    DiskFullError,
    ParityError,
    ServingOptError,
    UsageError,
    ValidationError,
    first_line,
)
from serving_opt.graph import ServingGraph, prune_library, total_node_count
from serving_opt.run import OptimizeReport, Progress, Run, SizeReport, StageReport
from serving_opt.savedmodel import checkpoint, loader, writer
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import staging as staging_lib
from serving_opt.stages import benchmark as benchmark_lib
from serving_opt.stages import coldstart, parity, rewrites
from serving_opt.stages import freeze as freeze_lib
from serving_opt.stages import grappler as grappler_lib
from serving_opt.stages import quantize as quantize_lib
from serving_opt.stages import regression as regression_lib
from serving_opt.stages import transforms as transforms_lib
from serving_opt.stages.tf2_load import check_loads_in_tf2

__all__ = ["OptimizeOptions", "OptimizeReport", "SizeReport", "StageReport", "check_options",
           "optimize"]

FREEZE_MODES = ("auto", "always", "never")
MAX_RTOL = 1.0  # a relative tolerance above 100% lets any answer through
MAX_GRAPPLER_ROUNDS = 20
MAX_REGRESSION_TOLERANCE = 100.0


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything ``serving-opt optimize`` can be told; defaults are the safe choice.

    Example:
        >>> OptimizeOptions(transforms="fold_constants fold_batch_norms", benchmark_runs=0)
    """

    transforms: str | None = None  # Graph Transform Tool spec; None = lossless preset
    grappler: str | None = None  # comma list; None = default passes; "none" = off
    grappler_rounds: int = grappler_lib.DEFAULT_ROUNDS
    signatures: tuple[str, ...] = ()  # empty = all
    saved_model_tags: str = loader.SERVE_TAG
    version: int | None = None  # None = next free
    overwrite: bool = False
    freeze: str = "auto"
    examples: str | None = None
    atol: float = gates.DEFAULT_ATOL
    rtol: float = gates.DEFAULT_RTOL
    parity_batch_size: int = 16
    parity_batches: int = 2
    benchmark_runs: int = 100  # 0 skips the benchmark
    benchmark_batch_sizes: tuple[int, ...] = (1, 32)
    seed: int = 0
    # Variables larger than this stay variables, in a new checkpoint (docs: big models).
    freeze_max_bytes: int = freeze_lib.DEFAULT_FREEZE_MAX_BYTES
    # Constants still above this after folding are stored as variables (None = never).
    max_constant_bytes: int | None = checkpoint.DEFAULT_MAX_CONSTANT_BYTES
    # Load both models in fresh processes and refuse a candidate that is worse.
    cold_start: bool = True
    cold_start_rounds: int = 1
    regression_tolerance: float = regression_lib.DEFAULT_TOLERANCE
    allow_regression: bool = False  # publish a regression anyway, with a warning
    # A model whose signatures touch files or the host (serving_opt.host_ops) is refused
    # before it runs at all, unless the user trusts it (--allow_file_ops).
    allow_file_ops: bool = False
    # Lossy, opt-in: weights stored as int8 (per row / per channel scales) or fp16.
    quantize: str = "none"
    quantize_min_elements: int = quantize_lib.DEFAULT_MIN_ELEMENTS
    # The lossy gate (quantize != none): classifiers' top-1 must agree this often, and
    # probabilities/scores move at most this much; other float outputs are reported.
    min_top1_agreement: float = gates.DEFAULT_MIN_TOP1_AGREEMENT
    max_probability_error: float = gates.DEFAULT_MAX_PROBABILITY_ERROR
    # Serve the result over gRPC before publishing (serving-opt validate); None = skip.
    validate: object | None = None  # a serving_opt.serving.validate.ValidateOptions
    # A last gate after parity: both models on every example of these TFRecord/JSON-lines
    # shards, on Apache Beam's DirectRunner (serving_opt.compare; needs the beam extra).
    compare_examples: str | None = None
    # The TensorFlow release of the TF Serving that will load the result: its op registry
    # must have every op and attr written (installed once if missing). None: checked
    # against the current TF Serving release only when a runtime for it is already here
    # (cached, $SERVING_OPT_RUNTIME_X_Y, this interpreter); the report says which.
    serving_version: str | None = None
    serving_runtime_python: str | None = None  # an interpreter with that TensorFlow
    # Run the model outside the bubblewrap sandbox where none can start (serving_opt.sandbox).
    allow_unsandboxed: bool = False
    sandbox_memory_bytes: int | None = None  # per sandboxed process; None: 3/4 of the RAM


@dataclass(frozen=True)
class Plan:
    """The options resolved once, before any work: what every stage will be asked to do."""

    transforms: tuple  # of transforms_lib.Transform
    default_preset: bool  # the transforms are the lossless preset, not the user's spec
    lossy: tuple[str, ...]
    passes: tuple[str, ...]
    tags: frozenset[str]
    version: int
    user_inputs: object | None  # examples_lib.UserInputs
    validate: object | None = None  # the ValidateOptions of --validate, shared values merged


@dataclass(frozen=True)
class Source:
    """The model as read: its MetaGraph, the signatures to keep, and its measurements."""

    meta_graph: object
    keys: tuple[str, ...]
    kind: str  # "tf1" | "tf2"
    nodes: int
    size: SizeReport


def check_options(options: OptimizeOptions) -> None:
    """Raises UsageError naming the first bad option; used before any work is done.

    Also checks the transform spec, Grappler passes and tags, so an Estimator
    exporter can fail at construction rather than after training.

    Example:
        >>> check_options(OptimizeOptions(freeze="sometimes"))
        Traceback (most recent call last):
        UsageError: --freeze=sometimes is not one of auto, always, never
    """
    if options.freeze not in FREEZE_MODES:
        raise UsageError(f"--freeze={options.freeze} is not one of {', '.join(FREEZE_MODES)}",
                         "use --freeze=auto, always or never")
    if not (0 <= options.atol < math.inf and 0 <= options.rtol <= MAX_RTOL):  # refuses nan
        raise UsageError(f"--atol={options.atol} and --rtol={options.rtol} must be finite, "
                         f">= 0, and rtol at most {MAX_RTOL:g} (beyond that nothing is "
                         "compared)", "e.g. --atol=1e-5 --rtol=1e-4")
    if options.version is not None and not (isinstance(options.version, int) and
                                            0 <= options.version <= writer.MAX_VERSION):
        raise UsageError(f"--version={options.version} is not a version TF Serving reads",
                         f"pass --version=N with 0 <= N <= {writer.MAX_VERSION} (int64)")
    if not 1 <= options.grappler_rounds <= MAX_GRAPPLER_ROUNDS:
        raise UsageError(f"--grappler_rounds={options.grappler_rounds} must be within "
                         f"[1, {MAX_GRAPPLER_ROUNDS}] (a round that changes nothing ends the "
                         "loop anyway)", "e.g. --grappler_rounds=2")
    if options.parity_batch_size < 1 or options.parity_batches < 1:
        raise UsageError("OptimizeOptions.parity_batch_size and parity_batches must be >= 1",
                         "e.g. OptimizeOptions(parity_batch_size=16, parity_batches=2)")
    if options.benchmark_runs < 0:
        raise UsageError("--benchmark_runs must be >= 0", "0 skips the benchmark")
    if options.freeze_max_bytes < 0:
        raise UsageError("--freeze_max_bytes must be >= 0",
                         "e.g. --freeze_max_bytes=10485760 (0 keeps every variable)")
    if options.quantize not in quantize_lib.MODES:
        raise UsageError(f"--quantize={options.quantize} is not one of "
                         f"{', '.join(quantize_lib.MODES)}", "use --quantize=int8 or fp16")
    if options.quantize_min_elements < 0:
        raise UsageError("--quantize_min_elements must be >= 0", "e.g. 16384")
    if not 0.0 <= options.min_top1_agreement <= 1.0:
        raise UsageError("--min_top1_agreement must be within [0, 1]", "e.g. 0.995")
    if not 0.0 <= options.max_probability_error <= 1.0:
        raise UsageError("--max_probability_error must be within [0, 1]", "e.g. 0.05")
    if options.cold_start_rounds < 1:
        raise UsageError("--cold_start_rounds must be >= 1", "e.g. --cold_start_rounds=3")
    if not 1.0 <= options.regression_tolerance <= MAX_REGRESSION_TOLERANCE:  # refuses nan
        raise UsageError(f"--regression_tolerance={options.regression_tolerance} must be "
                         f"within [1, {MAX_REGRESSION_TOLERANCE:g}]",
                         "e.g. --regression_tolerance=1.1 (10% worse is tolerated); "
                         "--allow_regression publishes whatever the measures say")
    transforms_lib.resolve_spec(options.transforms)
    grappler_lib.parse_passes(options.grappler)
    if not loader.parse_tags(options.saved_model_tags):
        raise UsageError("--saved_model_tags is empty", "e.g. --saved_model_tags=serve")
    if options.compare_examples:
        from serving_opt.compare import require_beam

        require_beam()
    if options.serving_version is not None:
        from serving_opt.serving import runtime as runtime_lib

        runtime_lib.check_version(options.serving_version)
    if options.validate is not None:
        validate_options(options)


# ValidateOptions fields that optimize decides: one setting for the whole run, so the
# validation cannot judge with other tolerances, inputs or runtime than the gates did.
_SHARED_WITH_VALIDATE = ("atol", "rtol", "examples", "saved_model_tags", "serving_version",
                         "serving_runtime_python", "seed")


def validate_options(options: OptimizeOptions):
    """The ValidateOptions ``--validate`` runs with: the user's, with every setting shared
    with optimize taken from ``options``; UsageError when the two disagree.

    Example:
        >>> validate_options(OptimizeOptions(atol=1e-3, validate=ValidateOptions())).atol
        0.001
    """
    import dataclasses

    from serving_opt.serving import validate as validate_lib

    given = options.validate
    if not isinstance(given, validate_lib.ValidateOptions):
        raise UsageError(f"OptimizeOptions.validate is a {type(given).__name__}, not a "
                         "ValidateOptions", "pass validate=ValidateOptions(...) or None")
    defaults = validate_lib.ValidateOptions()
    shared = {}
    for name in _SHARED_WITH_VALIDATE:
        mine, theirs = getattr(options, name), getattr(given, name)
        if theirs != getattr(defaults, name) and theirs != mine:
            raise UsageError(f"ValidateOptions.{name}={theirs!r} disagrees with "
                             f"OptimizeOptions.{name}={mine!r}",
                             f"set {name} once, on OptimizeOptions")
        shared[name] = mine
    merged = dataclasses.replace(
        given, **shared, allow_file_ops=options.allow_file_ops or given.allow_file_ops,
        allow_unsandboxed=options.allow_unsandboxed or given.allow_unsandboxed)
    if given.version is not None and options.version is not None \
            and given.version != options.version:
        raise UsageError(f"ValidateOptions.version={given.version} disagrees with "
                         f"OptimizeOptions.version={options.version}",
                         "leave ValidateOptions.version unset: optimize validates the version "
                         "it writes")
    validate_lib.check_options(merged)
    return merged


def optimize(
    input_dir: str,
    output_base: str,
    options: OptimizeOptions = OptimizeOptions(),
    progress: Progress | None = None,
) -> OptimizeReport:
    """Optimizes the SavedModel at ``input_dir`` into a new version under ``output_base``.

    Raises UsageError for bad options (before any work), ServingOptError for
    unreadable models, ParityError (with ``.report``) when the result differs.

    Example:
        >>> r = optimize("build/sample/1", "build/optimized",
        ...              OptimizeOptions(benchmark_runs=0))
        >>> r.output_dir
        'build/optimized/1'
    """
    steps = ("read", "freeze", "transforms", "grappler", "rewrites", "write", "parity",
             "cold_start", "benchmark") \
        + (("validate",) if options.validate is not None else ()) + ("publish",)
    run = Run(input_dir, output_base, options, progress, steps)
    run.plan = plan(input_dir, output_base, options)
    sandboxed = sandbox_lib.require(options.allow_unsandboxed, f"optimize {input_dir}")
    if sandboxed and options.allow_unsandboxed and run.plan.validate is not None \
            and run.plan.validate.server == "docker":
        sandboxed = False  # the Docker client cannot run in a sandbox; the user trusts it
    run.sandbox = sandbox_lib.describe(sandboxed)
    _resolve_target(run, sandboxed)
    for stale in staging_lib.remove_stale(output_base):  # never a live run's
        run.progress("-", f"removed {stale}, left behind by a run that was killed")
    # Everything this run writes is inside one claimed, hidden directory of the model
    # base: the only place its sandbox may write; removed however the run ends.
    run.work_dir = os.path.abspath(
        staging_lib.make_claimed_dir(output_base, f"{writer.STAGING_PREFIX}run-"))
    staging = worker = None
    try:
        if sandboxed:
            # This process never imports TensorFlow: the worker reads and checks the model
            # (before anything loads it) and builds the candidate; a fresh process that
            # parses only checks what it wrote.
            worker = sandbox_lib.Worker(_sandbox_policy(run), run.work_dir, run.say,
                                        preload="optimize", env=_sandbox_env(run))
            staging, worker_report = worker.call(
                "serving_opt.optimizer:build_in_worker", _worker_job(run))
            run.adopt(worker_report)
            from serving_opt import candidate_check

            candidate_check.check_in_fresh_process(staging, options.saved_model_tags,
                                                   options.allow_file_ops)
        else:
            run.source = read(run)
            staging = build_proven_candidate(run)
            if run.plan.validate is not None:
                run.validation = serve_before_publishing(run, staging)
            check_candidate(run, staging)
        run.output_dir = publish(run, staging)
        staging = None
    except ServingOptError as e:
        e.with_report(run.report() if e.report is None else run.adopted(e.report))
        raise
    finally:
        if worker is not None:
            worker.kill()
            worker.close()
        writer.discard(staging)
        for scratch in run.scratch_dirs:
            writer.discard(scratch)
        shutil.rmtree(run.work_dir, ignore_errors=True)
        staging_lib.release(run.work_dir)
    return run.report()


@dataclass(frozen=True)
class WorkerJob:
    """What the sandboxed worker needs to build, prove and measure the candidate."""

    input_dir: str
    output_base: str
    options: OptimizeOptions
    plan: Plan
    steps: tuple[str, ...]
    stages: tuple
    warnings: tuple[str, ...]
    work_dir: str
    target_registry: object


def _worker_job(run: Run) -> WorkerJob:
    """The job, every path absolute: the worker runs elsewhere (cwd /tmp, in its sandbox)."""
    import dataclasses

    def absolute(path: str | None) -> str | None:
        return os.path.abspath(path) if path and "://" not in path else path

    options = dataclasses.replace(run.options, examples=absolute(run.options.examples),
                                  compare_examples=absolute(run.options.compare_examples))
    plan_ = run.plan
    if plan_.validate is not None:
        plan_ = dataclasses.replace(plan_, validate=dataclasses.replace(
            plan_.validate, examples=absolute(plan_.validate.examples)))
    return WorkerJob(os.path.abspath(run.input_dir), os.path.abspath(run.output_base), options,
                     plan_, run.steps, tuple(run.stages), tuple(run.warnings),
                     run.work_dir, run.target_registry)


def build_in_worker(job: WorkerJob) -> tuple[str, OptimizeReport]:
    """In the sandbox: read (the static check, before anything loads the model), then
    freeze .. validate; returns the staging directory and the report.

    The candidate stays in the work directory; the caller checks it and publishes it.
    """
    from serving_opt import sandbox as sandbox_lib

    run = Run(job.input_dir, job.output_base, job.options, sandbox_lib.say, job.steps)
    run.plan, run.work_dir = job.plan, job.work_dir
    run.stages, run.warnings = list(job.stages), list(job.warnings)
    run.target_registry = job.target_registry
    try:
        run.source = read(run)
        staging = build_proven_candidate(run)
        if run.plan.validate is not None:
            run.validation = serve_before_publishing(run, staging)
    except ServingOptError as e:
        if e.report is None:
            e.with_report(run.report())
        raise
    finally:
        for scratch in run.scratch_dirs:
            writer.discard(scratch)
    return staging, run.report()


def _sandbox_policy(run: Run) -> sandbox_lib.Policy:
    """Read: the model, the user's example files, the target runtime; write: the work dir."""
    options = run.options
    read_only = [run.input_dir]
    for path in (options.examples,):
        if path:
            read_only.append(path)
    if options.compare_examples:
        read_only.append(sandbox_lib.glob_root(options.compare_examples))
    validate = run.plan.validate
    if validate is not None:
        from serving_opt.serving import validate as validate_lib

        read_only.extend(sandbox_lib.interpreter_dirs(validate.serving_runtime_python))
        read_only.extend(validate_lib.binary_dirs(validate))
    return sandbox_lib.Policy(read_only=tuple(read_only), writable=(run.work_dir,),
                              memory_bytes=options.sandbox_memory_bytes)


def _sandbox_env(run: Run) -> dict:
    """A tensorflow_model_server outside /usr on the worker's PATH (--server=binary)."""
    if run.plan.validate is None:
        return {}
    from serving_opt.serving import validate as validate_lib

    return sandbox_lib.search_path(*validate_lib.binary_dirs(run.plan.validate))


def _resolve_target(run: Run, sandboxed: bool) -> None:
    """Before any sandbox starts: the target runtime (installed if asked, which needs the
    network) and its op registry; the validate backend (docker cannot be driven from a
    sandbox: its client needs the Docker socket, which is root on the host)."""
    import dataclasses

    from serving_opt.serving import runtime as runtime_lib

    options = run.options
    version, python = options.serving_version, options.serving_runtime_python
    target = version or runtime_lib.DEFAULT_SERVING_VERSION
    runtime = runtime_lib.resolve_runtime(version, python, run.say) if version \
        else runtime_lib.find_runtime(target, python)
    if runtime is not None:
        run.target_registry = (runtime.tf_version, runtime.source,
                               runtime_lib.op_registry(runtime))
    validate = run.plan.validate
    if validate is None:
        return
    from serving_opt.serving import backends

    backend = backends.resolve_backend(validate.server, sandboxed=sandboxed)
    if backend == "local" and runtime is not None and version is not None:
        validate = dataclasses.replace(validate, serving_runtime_python=runtime.python)
    run.plan = dataclasses.replace(run.plan, validate=dataclasses.replace(validate,
                                                                          server=backend))


def check_candidate(run: Run, staging: str) -> None:
    """What came out of the sandbox is checked like any model before it is published:
    no link or special file, no host op the source did not have and the user allowed."""
    from serving_opt import untrusted

    loader.check_model_files(staging)
    if not run.options.allow_file_ops:
        meta_graph = loader.find_meta_graph(loader.read_saved_model(staging), run.plan.tags,
                                            staging)
        untrusted.refuse_host_ops(meta_graph, tuple(sorted(meta_graph.signature_def)),
                                  "publish")


def plan(input_dir: str, output_base: str, options: OptimizeOptions) -> Plan:
    """Resolves and checks everything the user asked for; fails before any work."""
    check_options(options)
    transforms = transforms_lib.resolve_spec(options.transforms)
    default_preset = options.transforms is None or \
        options.transforms.strip().lower() == "default"
    _check_paths(input_dir, output_base)
    writer.check_not_source(input_dir, output_base)  # by device and inode, not by name
    version = options.version if options.version is not None else writer.next_version(output_base)
    writer.check_target(output_base, version, options.overwrite, source=input_dir)
    writer.check_writable(output_base)
    return Plan(
        transforms=transforms,
        default_preset=default_preset,
        lossy=tuple(t.name for t in transforms if t.lossy),
        passes=grappler_lib.parse_passes(options.grappler),
        tags=loader.parse_tags(options.saved_model_tags),
        version=version,
        user_inputs=examples_lib.read_examples_file(options.examples) if options.examples
        else None,
        validate=validate_options(options) if options.validate is not None else None,
    )


def _check_paths(input_dir: str, output_base: str) -> None:
    src = os.path.realpath(input_dir)
    dst = os.path.realpath(output_base)
    if dst == src or dst.startswith(src + os.sep):
        raise UsageError(
            f"--output_base {output_base} is inside --input_dir {input_dir}",
            "write to a separate model base (e.g. the parent of the version directory)",
        )


def read(run: Run) -> Source:
    """Stage 1: the source's MetaGraph for the requested tags and signatures."""
    options, plan_ = run.options, run.plan
    if plan_.lossy:
        run.warn(f"lossy transforms requested ({', '.join(plan_.lossy)}); the parity gate "
                 f"decides with atol={options.atol}, rtol={options.rtol}")
    run.progress("read", f"reading {run.input_dir}")
    loader.configure_for_optimizing()
    loader.quiet_tensorflow_import()  # so the read stage times reading, not importing TF
    with run.stage("read", None) as stage:
        examples_lib.check_examples(plan_.user_inputs)
        saved_model = loader.read_saved_model(run.input_dir)
        loader.check_model_files(run.input_dir)  # no symlink out of the model is followed
        meta_graph = loader.find_meta_graph(saved_model, plan_.tags, run.input_dir)
        keys = tuple(loader.select_signatures(meta_graph, options.signatures))
        kind = "tf2" if loader.is_tf2(meta_graph) else "tf1"
        check_untrusted(run, meta_graph, keys)  # before anything runs the model
        source = Source(meta_graph, keys, kind, total_node_count(meta_graph.graph_def),
                        SizeReport.of(run.input_dir))
        stage.nodes = source.nodes
        stage.note = f"{kind} model, signatures: {', '.join(keys)}"
    return source


def check_untrusted(run: Run, meta_graph, keys: tuple[str, ...]) -> None:
    """A SavedModel is code: host ops refuse the run (unless ``--allow_file_ops``), so do
    the risks ``inspect`` rates ERROR; its warnings go into the report."""
    from serving_opt import inspection, untrusted

    if not run.options.allow_file_ops:
        untrusted.refuse_host_ops(meta_graph, keys, "optimize")
    risks = inspection.inspect_saved_model(run.input_dir, run.plan.tags).risks
    host_codes = ("code_execution_op", "file_write_op", "file_read_op", "host_op")
    for risk in risks:
        # Host ops of the kept signatures were refused above; the others are reported.
        if risk.severity == inspection.SEVERITY_ERROR and risk.code not in host_codes:
            raise ServingOptError(f"inspect rates this model an error ({risk.code}): "
                                  f"{risk.message}; nothing was run",
                                  "fix the model (serving-opt inspect lists its risks)")
        run.warn(f"inspect: {risk.code}: {risk.message}")


def build_proven_candidate(run: Run) -> str:
    """The candidate, proven equal and measured no worse than the original.

    A candidate worse on any measure (cold start, steady-state latency) is retried with
    every variable kept under ``--freeze=auto``; still worse, the run fails naming the
    measure, unless ``--allow_regression``.
    """
    before = run.snapshot()
    staging = build_candidate(run)
    try:  # interrupted or failed while measuring: the candidate is not left behind
        worse = measure(run, staging)
        if worse and run.frozen and run.options.freeze == "auto":
            writer.discard(staging)
            staging = None
            first = worse[0]
            run.restore(before)
            run.progress("-", f"frozen candidate is worse ({first}); retrying with variables kept")
            staging = _candidate(run, frozen=False,
                                 note=f"the frozen candidate was worse ({first}); variables kept")
            worse = measure(run, staging)
        if worse:
            if not run.options.allow_regression:
                writer.discard(staging)
                raise ServingOptError(
                    f"the optimized model is worse than the original: {worse[0]}; nothing was "
                    "published",
                    "rerun with --allow_regression to publish it anyway, or try --freeze=never",
                )
            for line in worse:
                run.warn(f"published despite a regression (--allow_regression): {line}")
        return staging
    except BaseException:
        writer.discard(staging)
        raise


def build_candidate(run: Run) -> str:
    """Freeze .. parity into a staging directory; returns it, proven but unpublished.

    The frozen graph first; with ``--freeze=auto`` any failure of it (freezing,
    inlining, transforms on the frozen graph, loading, parity) falls back to keeping
    the variables. A parity failure with lossy transforms requested is the transforms'
    verdict, not freezing's, so it is raised as it is.
    """
    mode = run.options.freeze
    if mode == "never":
        return _candidate(run, frozen=False, note="--freeze=never")
    before = run.snapshot()
    from serving_opt.serving.runtime import TargetRuntimeError

    try:
        return _candidate(run, frozen=True)
    except (UsageError, TargetRuntimeError, DiskFullError):
        raise  # keeping the variables would not change the verdict
    except Exception as e:  # noqa: BLE001 - auto must never crash on a freezing failure
        if isinstance(e, ParityError) and run.options.quantize != "none" \
                and not run.quantize_tables_only \
                and any(q.dequantized.startswith("at load") for q in run.quantized):
            # Quantized dense weights only shrink files; tables shrink the server too.
            # Keep what the gate accepts: the tables alone.
            first = first_line(e)
            run.restore(before)
            run.quantize_tables_only = True
            run.progress("-", f"lossy gate refused ({first}); retrying with only the "
                              "embedding tables quantized")
            return build_candidate(run)
        if isinstance(e, ParityError) and (run.plan.lossy or run.options.quantize != "none"):
            raise  # the lossy work's verdict, not freezing's
        # What went wrong with the frozen graph, without the verdict a refused run would
        # print ("nothing was published"): this run goes on, with the variables kept.
        reason = getattr(e, "difference", None) or first_line(e)
        if mode == "always":
            if isinstance(e, ServingOptError):
                raise
            raise ServingOptError(
                f"could not freeze the variables of {run.input_dir}: {reason}",
                "rerun with --freeze=auto (falls back) or --freeze=never",
            ) from e
        run.restore(before)
        what = "the frozen graph answered differently" if isinstance(e, ParityError) \
            else "freezing failed"
        run.progress("-", f"{what} ({reason}); retrying with the variables kept")
        # _candidate warns "variables kept: <note>", naming the cause.
        return _candidate(run, frozen=False,
                          note=f"{what} ({reason}); optimized with the variables kept "
                          "(--freeze=always makes that an error)")


def _candidate(run: Run, frozen: bool, note: str = "") -> str:
    """One attempt at the candidate: the stages from freeze to parity, in order."""
    graph = freeze(run, frozen, note)
    if frozen and grappler_lib.function_calls(graph.graph_def):
        graph = inline(run, graph)
    graph = transform(run, graph)
    graph = grappler(run, graph)
    graph = rewrite(run, graph)
    if frozen and run.options.max_constant_bytes is not None:
        graph = externalize(run, graph)
    if run.options.quantize != "none":
        graph = quantize(run, graph)
    staging = write(run, graph)
    try:
        check_target_runtime(run, graph, staging)
        prove(run, graph, staging)
    except BaseException:
        writer.discard(staging)
        raise
    if not frozen:
        run.warn(f"variables kept: {run.freeze_note}")
    return staging


def freeze(run: Run, frozen: bool, note: str = "") -> ServingGraph:
    """Stage 2: the serving graph, its variables frozen into constants (or kept)."""
    plan_, keys = run.plan, run.source.keys
    message = f"freezing variables ({run.options.freeze})" if frozen \
        else "loading with variables kept"
    with run.stage("freeze", message) as stage:
        if frozen:
            # Large variables are saved here from the loaded session, then linked into
            # the version written; a scratch directory of the model base, so nothing
            # half-written is ever where TF Serving looks.
            scratch = _scratch_dir(run)
            graph, info = freeze_lib.freeze_session_model(
                run.input_dir, plan_.tags, keys, max_bytes=run.options.freeze_max_bytes,
                variables_dir=os.path.join(scratch, "variables"))
            note = _freeze_note(info)
            run.kept_variables = info.large_variables_kept
            for var in info.large_variables_kept:
                run.progress("-", f"kept as a variable: {var.name} ({var.reason})")
        else:
            graph = freeze_lib.load_unfrozen(run.input_dir, plan_.tags, keys)
        run.graph, run.frozen, run.freeze_note = graph, frozen, note
        stage.done(graph, note)
    return graph


def inline(run: Run, graph: ServingGraph) -> ServingGraph:
    """TF2 only: the work is inside library functions the transforms cannot see."""
    with run.stage("inline", "inlining the signature functions", step="-") as stage:
        graph, inlined = grappler_lib.inline_functions(graph)
        run.graph = graph
        stage.done(graph, f"{inlined} function calls inlined")
    return graph


def transform(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 3: the Graph Transform Tool, with the spec's syntax and the signatures kept."""
    transforms = run.plan.transforms
    message = f"Graph Transform Tool: {transforms_lib.describe(transforms) or 'none'}"
    with run.stage("transforms", message) as stage:
        # The default preset is a convenience: a transform of it that fails on this graph
        # is left out with a warning. A spec the user wrote fails the run instead.
        skipped: list[str] | None = [] if run.plan.default_preset else None
        graph = transforms_lib.apply_transforms(graph, transforms, skipped)
        for message in skipped or ():
            run.warn(f"default transform left out: {message}")
        run.graph = graph
        stage.done(graph, f"{len(transforms)} transforms")
    return graph


def grappler(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 4: Grappler's passes, as many rounds as asked."""
    passes, rounds = run.plan.passes, run.options.grappler_rounds
    with run.stage("grappler", f"Grappler: {','.join(passes) or 'none'} x{rounds}") as stage:
        graph = grappler_lib.run_grappler(graph, passes, rounds)
        run.graph = graph
        stage.done(graph, ",".join(passes))
    return graph


def rewrite(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 5: the project's own rewrites, and dropping library functions nothing calls."""
    notes = []
    with run.stage("rewrites", "rewrites: BiasAdds, unused functions") as stage:
        if run.plan.transforms or run.plan.passes:
            # After Grappler, which merges the Adds folding leaves behind.
            graph, bias_adds = rewrites.constant_adds_to_bias_adds(graph)
            if bias_adds:
                notes.append(f"{bias_adds} constant Adds after convs made BiasAdds")
        if graph.variables_dir is None:
            # A kept saver still names its save/restore functions; frozen graphs need none.
            graph_def = type(graph.graph_def)()
            graph_def.CopyFrom(graph.graph_def)
            removed = prune_library(graph_def)
            graph = graph.replace(graph_def=graph_def)
            if removed:
                notes.append(f"{removed} unused library functions dropped")
        run.graph = graph
        stage.done(graph, "; ".join(notes))
    return graph


def externalize(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 5b: large constants left after folding become variables of a new checkpoint."""
    limit = run.options.max_constant_bytes
    with run.stage("externalize", f"constants over {limit} bytes to variables",
                   step="-") as stage:
        scratch = _scratch_dir(run)
        graph, moved = checkpoint.externalize_constants(graph, limit, scratch)
        run.graph = graph
        run.kept_variables = graph.kept_variables
        stage.done(graph, f"{len(moved)} constants ({sum(v.nbytes for v in moved)} bytes) "
                   "stored as variables" if moved else "")
    return graph


def quantize(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 5c (``--quantize``): large float weights stored as int8 or fp16."""
    mode = run.options.quantize
    with run.stage("quantize", f"quantizing weights ({mode})", step="-") as stage:
        scratch = _scratch_dir(run)
        graph, done = quantize_lib.quantize(graph, mode, run.options.quantize_min_elements,
                                            scratch, tables_only=run.quantize_tables_only)
        run.graph = graph
        run.kept_variables = graph.kept_variables
        run.quantized = tuple(done)
        stage.done(graph, f"{len(done)} tensors ({sum(q.bytes_before for q in done)} -> "
                   f"{sum(q.bytes_after for q in done)} bytes)")
    if run.quantize_tables_only:
        run.warn(f"--quantize={mode}: the lossy gate refused the model with its dense "
                 "weights quantized too; only the embedding tables are")
    if not done:
        run.warn(f"--quantize={mode}: no weight of this model was large enough or reachable "
                 "as a variable (freezing off?)")
    return graph


def write(run: Run, graph: ServingGraph) -> str:
    """Stage 6: the SavedModel, in a hidden staging directory of the model base."""
    with run.stage("write", "writing the SavedModel") as stage:
        staging = _work_subdir(run, f"{run.plan.version}-")
        try:
            writer.write_saved_model(graph, staging)
        except BaseException:
            writer.discard(staging)
            raise
        run.size_after = SizeReport.of(staging)
        stage.done(graph)
    return staging


def check_target_runtime(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 6b: every op and attr written must be in the target TF Serving's TensorFlow.

    The registry was resolved before any work (``_resolve_target``: installing a runtime
    needs the network, which no sandbox has). The written file is checked (the writer
    strips attrs at their default value, as TF does, so a new attr left at its default
    does not count).
    """
    from serving_opt.serving import runtime as runtime_lib

    target = run.options.serving_version or runtime_lib.DEFAULT_SERVING_VERSION
    with run.stage("target_check", f"checking ops against TensorFlow {target}'s registry",
                   step="-") as stage:
        if run.target_registry is None:
            stage.done(graph, f"skipped: no TensorFlow {runtime_lib.major_minor(target)} "
                       f"runtime here (--serving_version={target} installs one)")
            return
        tf_version, source, registry = run.target_registry
        saved_model = loader.read_saved_model(staging)
        checked = sum(runtime_lib.check_graph(mg.graph_def, registry, tf_version)
                      for mg in saved_model.meta_graphs)
        stage.done(graph, f"{checked} nodes: every op and attr is in TensorFlow "
                   f"{tf_version} ({source})")


def prove(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 7: the parity gate on every signature, then the TF2 loader's structure check."""
    options, plan_, keys = run.options, run.plan, run.source.keys
    batch_size, batches = options.parity_batch_size, options.parity_batches
    lossy = options.quantize != "none"
    if lossy:
        # An agreement rate is a proportion: 32 rows cannot tell 99.5% from 97%.
        batch_size, batches = max(batch_size, 64), max(batches, 8)
    with run.stage("parity", f"parity gate on {len(keys)} signature(s)") as stage:
        report = parity.check_parity(
            run.input_dir, staging, plan_.tags, keys,
            user_inputs=plan_.user_inputs, atol=options.atol, rtol=options.rtol,
            batch_size=batch_size, num_batches=batches, seed=options.seed,
            lossy=gates.LossyGate(options.min_top1_agreement, options.max_probability_error)
            if lossy else None,
        )
        run.parity = report
        stage.done(graph, report.summary())
        if not report.ok:
            if not run.frozen:
                run.warn(f"variables kept: {run.freeze_note}")
            lossy_work = list(plan_.lossy) + ([f"--quantize={options.quantize}"] if lossy
                                              else [])
            fix = (f"drop the lossy work ({', '.join(lossy_work)}), or loosen the gate if the "
                   "drift is acceptable" if lossy_work else
                   "no lossy transform was asked for: report this; --freeze=never or "
                   "--transforms=none narrows down which step changed the answers")
            error = ParityError(f"{report.summary()}; nothing was published", fix)
            error.difference = report.summary()  # what differed, without the verdict
            raise error
    if options.compare_examples:
        compare_gate(run, graph, staging)
    with run.stage("tf2_load", "checking it loads with tf.saved_model.load", step="-") as stage:
        # The session loader ran in the gate; TF2's loader must take the result too.
        stage.done(graph, check_loads_in_tf2(staging, run.input_dir, plan_.tags,
                                             graph.signature_defs))


def compare_gate(run: Run, graph: ServingGraph, staging: str) -> None:
    """Stage 7b (``--compare_examples``): both models on every example of the shards, on
    Beam's DirectRunner, judged like the parity gate (exact, or the lossy gate)."""
    from serving_opt import compare as compare_lib

    options = run.options
    with run.stage("compare", f"comparing on {options.compare_examples}", step="-") as stage:
        report = compare_lib.compare(run.input_dir, staging, options.compare_examples,
                                     compare_lib.CompareOptions(
                                         signatures=tuple(options.signatures),
                                         saved_model_tags=options.saved_model_tags,
                                         atol=options.atol, rtol=options.rtol,
                                         allow_file_ops=options.allow_file_ops))
        lossy = gates.LossyGate(options.min_top1_agreement, options.max_probability_error) \
            if options.quantize != "none" else None
        failures = report.failures(lossy)
        stage.done(graph, f"{report.examples} examples: "
                   + ("ok" if not failures else failures[0]))
    if failures:
        raise ParityError(f"compare on {options.compare_examples}: {failures[0]}; nothing "
                          "was published",
                          "see serving-opt compare for the full report of the examples")


def serve_before_publishing(run: Run, staging: str):
    """Stage 8 (``--validate``): serves the staged model over gRPC and checks its answers.

    TF Serving only loads integer version directories, so the staging directory is
    moved into ``<base>/.serving-opt-validate-*/<version>`` (same filesystem: a
    rename), served from there, and moved back; nothing unproven is ever published.
    """
    import dataclasses

    from serving_opt.serving import validate as validate_lib

    version, output_base = run.plan.version, run.output_base
    with run.stage("validate", "serving the result over gRPC before publishing (validate)") \
            as stage:
        hidden_base = _work_subdir(run, "validate-")
        served = os.path.join(hidden_base, str(version))
        os.rename(staging, served)
        try:
            opts = dataclasses.replace(
                run.plan.validate,
                model_name=run.plan.validate.model_name or os.path.basename(
                    os.path.abspath(output_base)),
                version=version,
                reference_dir=run.input_dir,
            )
            result = validate_lib.validate(hidden_base, opts, progress=run.say)
        finally:
            os.rename(served, staging)
            os.rmdir(hidden_base)
        # Report the paths the model is published under, not the hidden serving base.
        final = os.path.join(output_base, str(version))
        result = dataclasses.replace(
            result,
            model_base=os.path.abspath(output_base),
            warmup_file=result.warmup_file.replace(served, final) if result.warmup_file
            else None,
        )
        run.validation = result
        stage.done(run.graph, f"{result.backend}: "
                   + ("ok" if result.ok else result.failures[0]))
    if not result.ok:
        raise ValidationError(
            f"serving validation failed ({result.failures[0]}); nothing was published",
            "see the validation table; rerun with --novalidate to publish anyway",
        )
    run.size_after = SizeReport.of(staging)  # the warmup file is part of the model now
    return result


def publish(run: Run, staging: str) -> str:
    """Stage 9: the staging directory renamed to ``<base>/<version>``, atomically."""
    published = writer.publish(staging, run.output_base, run.plan.version,
                               run.options.overwrite)
    run.progress("-", f"published {published}")
    return published


def measure(run: Run, staging: str) -> list[str]:
    """Stages 8-9: cold start in fresh processes, then steady-state latency side by side;
    returns the measures on which the candidate is worse than the original."""
    options, keys = run.options, run.source.keys
    key = "serving_default" if "serving_default" in keys else keys[0]
    run.cold_start = None
    run.benchmark = None
    if options.cold_start:
        message = f"cold start: load + first request in fresh processes " \
                  f"(x{options.cold_start_rounds})"
        with run.stage("cold_start", message) as stage:
            run.cold_start = _cold_start(run, staging, key)
            stage.done(run.graph, _cold_note(run.cold_start))
    else:
        run.progress("cold_start", "cold start skipped (--nocold_start)")
        run.warn("cold-start gate off (--nocold_start): load time, first request and "
                 "memory were not compared")
    if options.benchmark_runs > 0:
        message = f"benchmark: load time and latency, {options.benchmark_runs} interleaved runs"
        with run.stage("benchmark", message) as stage:
            try:
                run.benchmark = _steady_state(run, staging, key)
            except Exception as e:  # noqa: BLE001 - a failed measurement gates nothing
                run.warn(f"benchmark skipped: {first_line(e)}")
            stage.done(run.graph, "" if run.benchmark else "failed, see warnings")
    else:
        run.progress("benchmark", "benchmark skipped")
    worse = regression_lib.regressions(run.cold_start, run.benchmark,
                                       options.regression_tolerance)
    if worse:
        worse = _confirm(run, staging, key, worse)
    return worse


def _confirm(run: Run, staging: str, key: str, worse: list[str]) -> list[str]:
    """A regression counts only if a second measurement shows it too.

    A busy build machine (two test shards, a compile) can slow one fresh process by
    more than the tolerance; a real regression (a 1 GB constant graph) reproduces.
    """
    options = run.options
    run.progress("-", f"worse on {worse[0]}; measuring again to confirm")
    cold, bench = run.cold_start, run.benchmark
    with run.stage("confirm", "confirming the regression", step="-") as stage:
        if cold is not None:
            cold = _cold_start(run, staging, key)
        if bench is not None and any(regression_lib.is_steady_state(line) for line in worse):
            bench = _steady_state(run, staging, key)
        again = regression_lib.regressions(cold, bench, options.regression_tolerance)
        stage.done(run.graph, "; ".join(again) or "not reproduced")
    first = {regression_lib.measure_of(line) for line in worse}
    confirmed = [line for line in again if regression_lib.measure_of(line) in first]
    if confirmed:
        run.cold_start, run.benchmark = cold, bench  # the measurement that confirmed it
    else:
        run.warn(f"a first measurement was worse ({worse[0]}); a second one was not")
    return confirmed


def _cold_start(run: Run, staging: str, key: str):
    """Both models loaded in fresh processes, answering one synthesized request."""
    # The user's examples when given: a model that checks its inputs (an Assert that
    # x >= 0) must meet the requests it will really get, not synthesized ones.
    feeds = inputs_lib.signature_feeds(run.source.meta_graph, run.input_dir,
                                       user=run.plan.user_inputs,
                                       seed=run.options.seed)(key, 1).batches[0]
    return coldstart.measure(run.input_dir, staging, run.plan.tags, key, feeds,
                             rounds=run.options.cold_start_rounds)


def _steady_state(run: Run, staging: str, key: str):
    """The interleaved latency benchmark of both models, in a measuring process."""
    options = run.options
    return benchmark_lib.benchmark_in_fresh_process(
        run.input_dir, staging, run.plan.tags, key, batch_sizes=options.benchmark_batch_sizes,
        runs=options.benchmark_runs, seed=options.seed, examples=options.examples)


def _scratch_dir(run: Run) -> str:
    """A directory for a stage's files, removed when the run ends (however it ends); in
    the model base's work directory, so its files are linked into the version, not copied."""
    scratch = _work_subdir(run, f"scratch-{run.plan.version}-")
    run.scratch_dirs.append(scratch)
    return scratch


def _work_subdir(run: Run, prefix: str) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=f"{writer.STAGING_PREFIX}{prefix}", dir=run.work_dir)


def _cold_note(cold) -> str:
    return (f"load {cold.ratio('load_seconds'):.2f}x, first request "
            f"{cold.ratio('first_request_seconds'):.2f}x, peak RSS "
            f"{cold.ratio('peak_rss_bytes'):.2f}x")


def _freeze_note(info: freeze_lib.FreezeInfo) -> str:
    note = f"{info.variables_frozen} variables ({info.variable_bytes} bytes) frozen"
    if info.dropped_variable_initializers:
        note += f", {len(info.dropped_variable_initializers)} variable initializers dropped " \
                "from the init op"
    if info.variables_kept:
        note += f", {len(info.variables_kept)} asset-path variables kept for the init op"
    if info.large_variables_kept:
        kept = info.large_variables_kept
        note += f", {len(kept)} large variables ({sum(v.nbytes for v in kept)} bytes) kept " \
                "as variables in a new checkpoint"
    return note
