"""Stages 2-6 of optimize: the stages that build one candidate, freeze .. write.

Each wraps one stage of ``serving_opt.stages`` in the run record (``run.stage`` times it
and keeps its note): it takes the run and the graph so far and returns the next graph.
``optimizer.build_candidate`` calls them in order for one configuration
(:class:`~serving_opt.pipeline.attempts.Candidate`); what they are asked comes from the plan.

    graph = freeze(run, Candidate(frozen=True))
    graph = transform(run, graph)
"""

from __future__ import annotations

import os

from serving_opt.pipeline.attempts import Candidate
from serving_opt.pipeline.run import Run, SizeReport
from serving_opt.savedmodel import checkpoint, graph_diff, writer
from serving_opt.savedmodel.graph import ServingGraph, prune_library
from serving_opt.stages import bf16 as bf16_lib
from serving_opt.stages import freeze as freeze_lib
from serving_opt.stages import grappler as grappler_lib
from serving_opt.stages import quantize as quantize_lib
from serving_opt.stages import rewrites
from serving_opt.stages import transforms as transforms_lib
from serving_opt.stages import vocabulary as vocabulary_lib


def freeze(run: Run, candidate: Candidate, note: str = "") -> ServingGraph:
    """Stage 2: the serving graph, its variables frozen into constants (or kept)."""
    plan, keys = run.plan, run.source.keys
    message = f"freezing variables ({plan.build.freeze})" if candidate.frozen \
        else "loading with variables kept"
    with run.stage("freeze", message) as stage:
        if candidate.frozen:
            # Large variables are saved here from the loaded session, then linked into
            # the version written; a scratch directory of the model base, so nothing
            # half-written is ever where TF Serving looks.
            scratch = run.scratch_dir()
            graph, info = freeze_lib.freeze_session_model(
                run.model_dir, plan.tags, keys, max_bytes=plan.build.freeze_max_bytes,
                variables_dir=os.path.join(scratch, "variables"))
            note = freeze_note(info)
            run.kept_variables = info.large_variables_kept
            if info.rebound:
                run.warn(f"the original is not servable: TF Serving loads it but fails every "
                         f"request, its signatures reading {len(info.rebound)} variable(s) "
                         "its restore op never initializes (Keras 3 tf.saved_model.save); "
                         "their values were frozen from the checkpoint and the published "
                         "model is servable (parity checked against tf.saved_model.load)")
            for var in info.large_variables_kept:
                run.progress("-", f"kept as a variable: {var.name} ({var.reason})")
        else:
            graph = freeze_lib.load_unfrozen(run.model_dir, plan.tags, keys)
        run.graph, run.frozen, run.freeze_note = graph, candidate.frozen, note
        stage.done(graph, note)
    return graph


def inline(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 2b, TF2 only: the work is inside library functions the transforms cannot see."""
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
        trace: list = []
        graph = transforms_lib.apply_transforms(graph, transforms, skipped, trace)
        for message in skipped or ():
            run.warn(f"default transform left out: {message}")
        if trace:  # what each pass did, on this graph
            run.transform_passes = tuple(
                d.line() for d in graph_diff.diff_passes(trace[1:], trace[0][1]))
        run.graph = graph
        stage.done(graph, f"{len(transforms)} transforms")
    return graph


def grappler(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 4: Grappler's passes, as many rounds as asked."""
    passes, rounds = run.plan.passes, run.plan.build.grappler_rounds
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


def bf16(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 5a (``--quantize=bf16``): compute in bfloat16, while the weights are still
    constants (folded to bfloat16 once, not cast on every request)."""
    with run.stage("bf16", "bfloat16 compute", step="-") as stage:
        graph, converted = bf16_lib.to_bf16(graph)
        run.graph = graph
        stage.done(graph, f"{converted} ops compute in bfloat16")
    return graph


def externalize(run: Run, graph: ServingGraph) -> ServingGraph:
    """Stage 5b: large constants left after folding become variables of a new checkpoint."""
    limit = run.plan.build.max_constant_bytes
    with run.stage("externalize", f"constants over {limit} bytes to variables",
                   step="-") as stage:
        graph, moved = checkpoint.externalize_constants(graph, limit, run.scratch_dir())
        run.graph = graph
        run.kept_variables = graph.kept_variables
        stage.done(graph, f"{len(moved)} constants ({sum(v.nbytes for v in moved)} bytes) "
                   "stored as variables" if moved else "")
    return graph


def quantize(run: Run, graph: ServingGraph, candidate: Candidate) -> ServingGraph:
    """Stage 5c (``--quantize``): large float weights stored as int8, int4 or fp16 (only
    the embedding tables, for a tables-only candidate and always for int4)."""
    mode = candidate.quantize
    skipped: list[tuple[str, int]] = []  # large dense weights a tables-only run left float
    with run.stage("quantize", f"quantizing weights ({mode})", step="-") as stage:
        graph, done = quantize_lib.quantize(graph, mode, run.plan.build.quantize_min_elements,
                                            run.scratch_dir(), tables_only=candidate.tables_only,
                                            skipped=skipped, row_scales=candidate.row_scales)
        # Already lossy, and judged by the gate: vocabulary tables as fingerprint hash tables.
        graph, compacted = vocabulary_lib.compact_vocabularies(
            graph, run.plan.build.quantize_min_elements, run.scratch_dir())
        run.graph = graph
        run.kept_variables = graph.kept_variables
        run.quantized = tuple(done)
        stage.done(graph, f"{len(done)} tensors ({sum(q.bytes_before for q in done)} -> "
                   f"{sum(q.bytes_after for q in done)} bytes)" + "".join(
                       f"; vocabulary {v.table}: {v.entries} words as a fingerprint hash table "
                       f"({v.bytes_after} bytes)" for v in compacted))
    if mode == "int4":
        if skipped:
            run.warn(f"--quantize=int4 quantizes embedding tables only: dense weights stay "
                     f"float32 ({len(skipped)}, {sum(b for _, b in skipped)} bytes; dequantized "
                     "at load they would shrink the files, not the server; --quantize=int8 "
                     "stores them as int8 on disk)")
    elif candidate.tables_only:
        run.warn(f"--quantize={mode}: the lossy gate refused the model with its dense "
                 "weights quantized too; only the embedding tables are")
    if not done:
        run.warn(f"--quantize={mode}: no weight of this model was large enough or reachable "
                 "as a variable (freezing off?)")
    return graph


def write(run: Run, graph: ServingGraph) -> str:
    """Stage 6: the SavedModel, in a hidden staging directory of the model base."""
    with run.stage("write", "writing the SavedModel") as stage:
        staging = run.work_subdir(f"{run.plan.version}-")
        try:
            writer.write_saved_model(graph, staging)
        except BaseException:
            writer.discard(staging)
            raise
        run.size_after = SizeReport.of(staging)
        stage.done(graph)
    return staging


def freeze_note(info: freeze_lib.FreezeInfo) -> str:
    """What freezing did, one line for the report."""
    note = f"{info.variables_frozen} variables ({info.variable_bytes} bytes) frozen" \
        if info.variables_frozen or info.large_variables_kept else \
        "no variables: nothing to freeze"
    if info.rebound:
        note += f", {len(info.rebound)} of them unbound in the original (read by the " \
                "signatures, never restored)"
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
