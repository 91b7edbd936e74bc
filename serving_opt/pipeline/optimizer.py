"""The optimize pipeline: plan, read, build and prove candidates, validate, publish.

    report = optimize("exports/1700000000", "models/clf")
    print(report.output_dir)        # models/clf/<next version>

Every user error is caught before the first expensive step (the options, transform
specs, the target version: :func:`~serving_opt.pipeline.plan.plan`), the source directory is
only ever read, and the new version directory appears (atomically, by rename) only
after the gates passed. A refused run raises a :class:`~serving_opt.errors.ServingOptError`
(ParityError when the answers differ) carrying the full report, and leaves nothing
behind in the model base.

``optimize()`` reads as the list of stages, and :func:`build_candidate` as the stages of
one candidate; :mod:`serving_opt.pipeline.attempts` decides which candidates are tried (frozen,
tables only, variables kept) and why each was left. The stages' wrappers are in
:mod:`building` (freeze .. write) and :mod:`proving` (the gates
and the measurements); the sandboxed worker that runs them is :mod:`serving_opt.pipeline.worker`.
The run record (:class:`~serving_opt.pipeline.run.Run`) times them, gathers warnings and builds
the report. See docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass

from serving_opt import sandbox as sandbox_lib
from serving_opt.errors import ServingOptError, ValidationError
from serving_opt.options import (  # noqa: F401 - the options' public home is serving_opt.options
    FREEZE_MODES,
    MAX_GRAPPLER_ROUNDS,
    MAX_REGRESSION_TOLERANCE,
    MAX_RTOL,
    OptimizeOptions,
    ServingCheck,
    ValidateOptions,
    check_options,
)
from serving_opt.pipeline import attempts, building, proving
from serving_opt.pipeline import worker as worker_lib
from serving_opt.pipeline.plan import Plan, plan
from serving_opt.pipeline.run import OptimizeReport, Progress, Run, SizeReport, StageReport
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader, model_files, tf_process, writer
from serving_opt.savedmodel import staging as staging_lib
from serving_opt.savedmodel.graph import total_node_count
from serving_opt.stages import grappler as grappler_lib

__all__ = ["OptimizeOptions", "OptimizeReport", "Plan", "SizeReport", "StageReport",
           "check_options", "optimize", "plan"]


# The worker imports this module, not the other way round (worker.py holds the job).
_WORKER_TARGET = "serving_opt.pipeline.optimizer:build_in_worker"


@dataclass(frozen=True)
class Source:
    """The model as read: its MetaGraph, the signatures to keep, and its measurements."""

    meta_graph: object
    keys: tuple[str, ...]
    kind: str  # "tf1" | "tf2"
    nodes: int
    size: SizeReport
    # --input_shapes resolved: {key: {alias: shape}} (savedmodel.shapes); {} when none.
    pinned: dict = dataclasses.field(default_factory=dict)


def validate_options(options: OptimizeOptions) -> ValidateOptions:
    """The ValidateOptions ``--validate`` runs with, built from ``options``
    (:meth:`OptimizeOptions.validate_options`).
    """
    options.check()
    return options.validate_options()


def optimize(
    input_dir: str,
    output_base: str,
    options: OptimizeOptions | None = None,
    progress: Progress | None = None,
) -> OptimizeReport:
    """Optimizes the SavedModel at ``input_dir`` into a new version under ``output_base``.

    Raises UsageError for bad options (before any work), ServingOptError for
    unreadable models, ParityError (with ``.report``) when the result differs.
    """
    options = OptimizeOptions() if options is None else options
    steps = ("read", "freeze", "transforms", "grappler", "rewrites", "write", "parity",
             "cold_start", "benchmark") \
        + (("validate",) if options.validate is not None else ()) + ("publish",)
    run = Run(input_dir, output_base, options, progress, steps)
    run.plan = plan(input_dir, output_base, options)
    trust = run.plan.trust
    sandboxed = sandbox_lib.require(trust.allow_unsandboxed, f"optimize {input_dir}")
    if sandboxed and trust.allow_unsandboxed and run.plan.validate is not None \
            and run.plan.validate.serving.server == "docker":
        sandboxed = False  # the Docker client cannot run in a sandbox; the user trusts it
    run.sandbox = sandbox_lib.describe(sandboxed)
    model_files.refuse_foreign_hard_links(input_dir, output_base)  # on the host: it sees them all
    worker_lib.resolve_target(run, sandboxed)
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
            worker = sandbox_lib.Worker(worker_lib.policy(run), run.work_dir, run.say,
                                        preload="optimize", env=worker_lib.env(run))
            staging, worker_report = worker.call(_WORKER_TARGET, worker_lib.job(run))
            staging = _own_staging(run, staging)
            run.adopt(worker_report)
            from serving_opt.pipeline import candidate_check
            extra = candidate_check.check_in_fresh_process(
                staging, run.plan.inputs.saved_model_tags, trust.allow_file_ops)
            _remove_extra_files(run, staging, extra)
        else:
            staging = build_and_validate(run)
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


def build_in_worker(job: worker_lib.WorkerJob) -> tuple[str, OptimizeReport]:
    """In the sandbox: read (the static check, before anything loads the model), then
    freeze .. validate; returns the staging directory and the report.

    The candidate stays in the work directory; the caller checks it and publishes it.
    """
    run = Run(job.input_dir, job.output_base, job.plan.options, sandbox_lib.say, job.steps)
    run.plan, run.work_dir = job.plan, job.work_dir
    run.stages, run.warnings = list(job.stages), list(job.warnings)
    run.target_registry = job.target_registry
    try:
        staging = build_and_validate(run)
    except ServingOptError as e:
        if e.report is None:
            e.with_report(run.report())
        raise
    finally:
        for scratch in run.scratch_dirs:
            writer.discard(scratch)
    return staging, run.report()


def build_and_validate(run: Run) -> str:
    """Stages 1-10, in the sandboxed worker (or here, unsandboxed): read, the candidates
    until one is proven and measured no worse, then the serving validation; returns the
    candidate's staging directory, unpublished."""
    run.source = read(run)
    staging = attempts.try_candidates(run, build_candidate, proving.measure)
    try:
        if run.plan.output.output_format == "graphdef":
            write_graph_def(run, staging)
        if run.plan.validate is not None:
            run.validation = serve_before_publishing(run, staging)
    except BaseException:
        writer.discard(staging)
        raise
    return staging


def build_candidate(run: Run, candidate: attempts.Candidate, note: str = "") -> str:
    """One candidate, freeze .. parity, into a staging directory; returns it, proven but
    unpublished (a refused one raises, and leaves nothing behind). With
    ``--input_shapes``, the pinned build replaces it where it measures faster."""
    frozen = building.freeze(run, candidate, note)
    built_from = run.snapshot()
    staging = build_from(run, frozen, candidate)
    if run.source.pinned:
        from serving_opt.pipeline import pinning
        staging = pinning.pin_if_faster(run, frozen, staging,
                                        lambda graph: build_from(run, graph, candidate),
                                        built_from)
    if not candidate.frozen:
        run.warn(f"variables kept: {run.freeze_note}")
    return staging


def build_from(run: Run, graph, candidate: attempts.Candidate) -> str:
    """Inline .. parity: a candidate from its frozen (or loaded) graph, written and
    proven; returns its staging directory."""
    if candidate.frozen and grappler_lib.function_calls(graph.graph_def):
        graph = building.inline(run, graph)
    graph = building.transform(run, graph)
    graph = building.grappler(run, graph)
    graph = building.rewrite(run, graph)
    if candidate.quantize == "bf16":
        graph = building.bf16(run, graph)
    if candidate.frozen and run.plan.build.max_constant_bytes is not None:
        graph = building.externalize(run, graph)
    if candidate.quantize not in ("none", "bf16"):
        graph = building.quantize(run, graph, candidate)
    staging = building.write(run, graph)
    try:
        proving.check_target_runtime(run, graph, staging)
        proving.prove(run, graph, staging)
    except BaseException:
        writer.discard(staging)
        raise
    return staging


def read(run: Run) -> Source:
    """Stage 1: the source's MetaGraph for the requested tags and signatures."""
    plan_ = run.plan
    if plan_.lossy:
        run.warn(f"lossy transforms requested ({', '.join(plan_.lossy)}); the parity gate "
                 f"decides with atol={plan_.tolerance.atol}, rtol={plan_.tolerance.rtol}")
    run.progress("read", f"reading {run.input_dir}")
    tf_process.configure_for_optimizing()
    tf_process.quiet_tensorflow_import()  # so the read stage times reading, not importing TF
    with run.stage("read", None) as stage:
        examples_lib.check_examples(plan_.user_inputs)
        if plan_.graph_def_input:
            run.model_dir = saved_model_from_graph_def(run)
        saved_model = loader.read_saved_model(run.model_dir)
        model_files.check_model_files(run.model_dir)  # no symlink out of the model is followed
        meta_graph = loader.find_meta_graph(saved_model, plan_.tags, run.model_dir)
        keys = tuple(loader.select_signatures(meta_graph, plan_.build.signatures))
        kind = "tf2" if loader.is_tf2(meta_graph) else "tf1"
        inputs_lib.check_user_inputs_fit(meta_graph, keys, plan_.user_inputs)
        pinned = pin_inputs(run, meta_graph, keys)
        check_untrusted(run, meta_graph, keys)  # before anything runs the model
        source = Source(meta_graph, keys, kind, total_node_count(meta_graph.graph_def),
                        SizeReport.of(run.model_dir), pinned)
        stage.nodes = source.nodes
        stage.note = f"{kind} model, signatures: {', '.join(keys)}"
        if plan_.graph_def_input:
            stage.note = f"frozen GraphDef, served as {', '.join(keys)}"
    return source


def pin_inputs(run: Run, meta_graph, keys: tuple[str, ...]) -> dict:
    """``--input_shapes`` resolved against the kept signatures: {key: {alias: shape}};
    usage errors (no such input, a contradicted dimension, the user's own requests of
    another shape) before anything loads the model."""
    from serving_opt.savedmodel import shapes as shapes_lib

    if not run.plan.pins:
        return {}
    pinned = shapes_lib.resolve(meta_graph, keys, run.plan.pins)
    shapes_lib.batch_size(pinned)  # one batch size, or a usage error
    shapes_lib.check_requests(pinned, meta_graph.signature_def, run.plan.user_inputs)
    if not shapes_lib.pins_unknown(meta_graph, pinned):
        run.warn("--input_shapes pins nothing the model leaves unknown: ignored")
        return {}
    return pinned


def saved_model_from_graph_def(run: Run) -> str:
    """A frozen GraphDef input as a SavedModel (one ``serving_default`` predict signature,
    no variables) in the work directory: what every stage then reads, and the reference
    the candidate is proven against. The static check runs on it before it is written."""
    from serving_opt.savedmodel import frozen_graph

    options = run.plan.options.graph_def
    export_dir = os.path.join(run.work_subdir("graphdef-"), "1")
    converted = frozen_graph.convert(
        run.input_dir, export_dir, options.graph_inputs or None,
        options.graph_outputs or None, options.signature_keys or None,
        allow_file_ops=run.plan.trust.allow_file_ops)
    run.graph_def["input"] = {"inputs": dict(converted.inputs),
                              "outputs": dict(converted.outputs),
                              "nodes": converted.nodes, "nodes_dropped": converted.dropped}
    feeds = ", ".join(f"{k}={v}" for k, v in converted.inputs.items())
    run.progress("-", f"frozen GraphDef: serving_default takes {feeds}; returns "
                      f"{', '.join(converted.outputs)}"
                 + (f" ({converted.dropped} nodes no output needs left out)"
                    if converted.dropped else ""))
    return export_dir


def write_graph_def(run: Run, staging: str) -> None:
    """``--output_format=graphdef``: the proven candidate's graph also as a frozen
    GraphDef inside its version directory (published with it, atomically)."""
    from serving_opt.options import GRAPH_DEF_NAME
    from serving_opt.savedmodel import frozen_graph

    written = frozen_graph.write_graph_def(frozen_graph.saved_model_graph(staging, run.plan.tags),
                                       os.path.join(staging, GRAPH_DEF_NAME))
    run.graph_def["output"] = {"file": GRAPH_DEF_NAME, "size_bytes": written.size_bytes,
                               "inputs": dict(written.inputs),
                               "outputs": dict(written.outputs)}
    run.size_after = SizeReport.of(staging)
    run.progress("-", f"wrote {GRAPH_DEF_NAME} ({written.size_bytes / 1e6:.1f} MB): feed "
                      f"{', '.join(written.inputs.values())}")


def check_untrusted(run: Run, meta_graph, keys: tuple[str, ...]) -> None:
    """A SavedModel is code: host ops refuse the run (unless ``--allow_file_ops``), so do
    the risks ``inspect`` rates ERROR; its warnings go into the report."""
    from serving_opt import inspection
    from serving_opt.inspection import risks as risks_lib
    from serving_opt.savedmodel import untrusted

    if not run.plan.trust.allow_file_ops:
        untrusted.refuse_host_ops(meta_graph, keys, "optimize")
    risks = inspection.inspect_saved_model(run.model_dir, run.plan.tags).risks
    host_codes = ("code_execution_op", "file_write_op", "file_read_op", "host_op")
    # Errors of the original that what optimize writes does not have: reported only.
    repaired = (risks_lib.VARIABLES_V1, risks_lib.UNBOUND_VARIABLES)
    for risk in risks:
        # Host ops of the kept signatures were refused above; the others are reported.
        if risk.severity == inspection.SEVERITY_ERROR and risk.code not in \
                host_codes + repaired:
            raise ServingOptError(f"inspect rates this model an error ({risk.code}): "
                                  f"{risk.message}; nothing was run",
                                  "fix the model (serving-opt inspect lists its risks)")
        run.warn(f"inspect: {risk.code}: {risk.message}")


def serve_before_publishing(run: Run, staging: str):
    """Stage 10 (``--validate``): serves the staged model over gRPC and REST and checks
    its answers.

    TF Serving only loads integer version directories, so the staging directory is
    moved into ``<base>/.serving-opt-validate-*/<version>`` (same filesystem: a
    rename), served from there, and moved back; nothing unproven is ever published.
    """
    from serving_opt.serving import validate as validate_lib

    version, output_base = run.plan.version, run.output_base
    with run.stage("validate", "serving the result over gRPC before publishing (validate)") \
            as stage:
        hidden_base = run.work_subdir("validate-")
        served = os.path.join(hidden_base, str(version))
        os.rename(staging, served)
        try:
            planned = run.plan.validate
            serving = dataclasses.replace(planned.serving, model_name=planned.serving.model_name
                                          or os.path.basename(os.path.abspath(output_base)))
            # The server must answer as the candidate does in a session; that the
            # candidate answers as the input does is the parity gate's proof (which
            # knows near-ties behind NMS; an elementwise check against the input
            # would not).
            opts = dataclasses.replace(planned, serving=serving, version=version,
                                       reference_dir=served)
            result = validate_lib.validate(hidden_base, opts, progress=run.say)
        finally:
            os.rename(served, staging)
            os.rmdir(hidden_base)
        # Report the paths the model is published under, not the hidden serving base.
        final = os.path.join(output_base, str(version))
        result = dataclasses.replace(
            result,
            model_base=os.path.abspath(output_base),
            reference_dir=os.path.abspath(final),
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


def check_candidate(run: Run, staging: str) -> None:
    """What came out of the sandbox is checked like any model before it is published:
    no link or special file, no host op the source did not have and the user allowed;
    nothing but a SavedModel's files."""
    from serving_opt.pipeline import candidate_check
    extra = candidate_check.check(staging, run.plan.inputs.saved_model_tags,
                                  run.plan.trust.allow_file_ops)
    _remove_extra_files(run, staging, extra)


def _own_staging(run: Run, staging) -> str:
    """The staging directory the worker names is one this run's work directory holds
    (a direct child, a real directory with the staging prefix), never another path."""
    work_dir = os.path.realpath(run.work_dir)
    if isinstance(staging, str) and os.path.basename(staging).startswith(
            writer.STAGING_PREFIX) and os.path.realpath(os.path.dirname(staging)) == work_dir \
            and os.path.isdir(staging) and not os.path.islink(staging):
        return os.path.join(work_dir, os.path.basename(staging))
    raise ServingOptError(f"the sandboxed worker named {staging!r} as its candidate, which is "
                          f"not a staging directory of {run.work_dir}; nothing was published",
                          "report this (a model must not steer what is published)")


def _remove_extra_files(run: Run, staging: str, extra: list[str]) -> None:
    """Files beyond a SavedModel's in the candidate (written by the model while it ran)
    are removed before publishing, and named in the report; so is a warmup file when
    neither the source had one nor ``--validate --write_warmup`` wrote one."""
    from serving_opt.pipeline import candidate_check
    warmup = os.path.join("assets.extra", "tf_serving_warmup_requests")
    validate = run.plan.validate
    expected = os.path.isfile(os.path.join(run.input_dir, warmup)) or (
        validate is not None and validate.serving.write_warmup)
    if not expected and os.path.lexists(os.path.join(staging, warmup)):
        extra = [*extra, warmup]
    # The user's own files under assets.extra/ (notes, configs) are carried over by the
    # writer: kept where byte-identical to the source's, whatever the model wrote.
    extra = [e for e in extra if not _copied_from_source(run.input_dir, staging, e)]
    if not extra:
        return

    candidate_check.remove_extra_files(staging, extra)
    shown = ", ".join(extra[:5]) + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
    run.warn(f"removed {len(extra)} file(s) that are no part of a SavedModel from the "
             f"candidate before publishing: {shown}")


def _copied_from_source(source: str, staging: str, relative: str) -> bool:
    """Whether ``relative`` is an ``assets.extra/`` file of the source model, copied: a
    regular file (no link) in both, the same bytes."""
    import filecmp

    if relative.split(os.sep, 1)[0] != "assets.extra" or not os.path.isdir(source):
        return False
    ours, theirs = os.path.join(staging, relative), os.path.join(source, relative)
    if os.path.islink(ours) or os.path.islink(theirs):
        return False
    return os.path.isfile(ours) and os.path.isfile(theirs) and \
        filecmp.cmp(ours, theirs, shallow=False)


def publish(run: Run, staging: str) -> str:
    """Stage 11: the staging directory renamed to ``<base>/<version>``, atomically."""
    published = writer.publish(staging, run.output_base, run.plan.version,
                               run.plan.output.overwrite)
    run.progress("-", f"published {published}")
    return published
