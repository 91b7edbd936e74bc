"""The optimize pipeline: read, freeze, transform, Grappler, write, prove, publish.

    report = optimize("exports/1700000000", "models/clf")
    print(report.output_dir)        # models/clf/<next version>

Every user error is caught before the first expensive step (flags, transform
specs, the target version), the source directory is only ever read, and the new
version directory appears (atomically, by rename) only after the parity gate
passed. A failed gate raises :class:`~serving_opt.errors.ParityError` carrying
the full report, and leaves nothing behind in the model base.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from serving_opt.errors import ParityError, ServingOptError, UsageError, ValidationError
from serving_opt.graph import ServingGraph, prune_library, total_node_count
from serving_opt.stages import freeze as freeze_lib
from serving_opt.stages import grappler as grappler_lib
from serving_opt.stages import inputs as inputs_lib
from serving_opt.stages import loader, parity, writer
from serving_opt.stages import transforms as transforms_lib
from serving_opt.stages.benchmark import BenchmarkReport, benchmark

FREEZE_MODES = ("auto", "always", "never")


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
    atol: float = parity.DEFAULT_ATOL
    rtol: float = parity.DEFAULT_RTOL
    parity_batch_size: int = 16
    parity_batches: int = 2
    benchmark_runs: int = 100  # 0 skips the benchmark
    benchmark_batch_sizes: tuple[int, ...] = (1, 32)
    seed: int = 0
    # Serve the result over gRPC before publishing (serving-opt validate); None = skip.
    validate: object | None = None  # a serving_opt.validate.ValidateOptions


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage: how long it took and the graph it left."""

    name: str
    seconds: float
    nodes: int
    note: str = ""


@dataclass(frozen=True)
class SizeReport:
    """Bytes on disk of one SavedModel directory."""

    total: int
    saved_model_pb: int
    variables: int
    assets: int
    assets_extra: int = 0  # warmup requests and other serving extras

    @staticmethod
    def of(path: str) -> SizeReport:
        def size(sub: str) -> int:
            full = os.path.join(path, sub)
            if os.path.isdir(full):
                return loader.dir_size(full)
            return os.path.getsize(full) if os.path.isfile(full) else 0

        return SizeReport(
            total=loader.dir_size(path),
            saved_model_pb=size("saved_model.pb"),
            variables=size("variables"),
            assets=size("assets"),
            assets_extra=size("assets.extra"),
        )


@dataclass(frozen=True)
class OptimizeReport:
    """What ``optimize`` did and measured; ``to_dict()`` is the JSON report.

    Example:
        >>> report.published, report.output_dir
        (True, 'models/clf/2')
    """

    input_dir: str
    output_base: str
    output_dir: str | None
    version: int
    published: bool
    model_kind: str  # "tf1" | "tf2"
    frozen: bool
    freeze_note: str
    signatures: tuple[str, ...]
    transforms: str
    lossy_transforms: tuple[str, ...]
    grappler_passes: tuple[str, ...]
    grappler_rounds: int
    stages: tuple[StageReport, ...]
    size_before: SizeReport
    size_after: SizeReport | None
    nodes_before: int
    nodes_after: int
    ops_removed: dict
    ops_added: dict
    parity: parity.ParityReport | None
    benchmark: BenchmarkReport | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    validation: object | None = None  # a serving_opt.validate.ValidationReport

    def to_dict(self) -> dict:
        return asdict(self)


Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _quiet(_: str) -> None:
    pass


def _validate_options(options: OptimizeOptions) -> None:
    if options.freeze not in FREEZE_MODES:
        raise UsageError(f"--freeze={options.freeze} is not one of {', '.join(FREEZE_MODES)}",
                         "use --freeze=auto, always or never")
    if options.atol < 0 or options.rtol < 0:
        raise UsageError("--atol and --rtol must be >= 0", "e.g. --atol=1e-5 --rtol=1e-4")
    if options.grappler_rounds < 1:
        raise UsageError("--grappler_rounds must be >= 1", "e.g. --grappler_rounds=2")
    if options.parity_batch_size < 1 or options.parity_batches < 1:
        raise UsageError("parity batch size and count must be >= 1", "e.g. --parity_batch_size=16")
    if options.benchmark_runs < 0:
        raise UsageError("--benchmark_runs must be >= 0", "0 skips the benchmark")


def _check_paths(input_dir: str, output_base: str) -> None:
    src = os.path.realpath(input_dir)
    dst = os.path.realpath(output_base)
    if dst == src or dst.startswith(src + os.sep):
        raise UsageError(
            f"--output_base {output_base} is inside --input_dir {input_dir}",
            "write to a separate model base (e.g. the parent of the version directory)",
        )


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
    say = progress or _quiet
    _validate_options(options)
    transforms = transforms_lib.resolve_spec(options.transforms)
    passes = grappler_lib.parse_passes(options.grappler)
    tags = loader.parse_tags(options.saved_model_tags)
    _check_paths(input_dir, output_base)
    version = options.version if options.version is not None else writer.next_version(output_base)
    writer.check_target(output_base, version, options.overwrite)
    user_inputs = inputs_lib.read_examples_file(options.examples) if options.examples else None

    stages: list[StageReport] = []
    warnings: list[str] = []
    lossy = tuple(t.name for t in transforms if t.lossy)
    if lossy:
        warnings.append(f"lossy transforms requested ({', '.join(lossy)}); the parity gate "
                        f"decides with atol={options.atol}, rtol={options.rtol}")

    say(f"[1/7] reading {input_dir}")
    loader.quiet_tensorflow_import()  # so the read stage times reading, not importing TF
    start = time.perf_counter()
    saved_model = loader.read_saved_model(input_dir)
    meta_graph = loader.find_meta_graph(saved_model, tags, input_dir)
    keys = loader.select_signatures(meta_graph, options.signatures)
    kind = "tf2" if loader.is_tf2(meta_graph) else "tf1"
    nodes_before = total_node_count(meta_graph.graph_def)
    size_before = SizeReport.of(input_dir)
    stages.append(StageReport("read", time.perf_counter() - start, nodes_before,
                              f"{kind} model, signatures: {', '.join(keys)}"))

    build = _CandidateBuilder(input_dir, output_base, version, tags, keys, kind, transforms,
                              lossy, passes, options, user_inputs, size_before, meta_graph,
                              warnings, list(stages), say)
    candidate = build.with_fallback()
    graph, frozen, freeze_note = candidate.graph, candidate.frozen, candidate.freeze_note
    stages.extend(candidate.stages)
    parity_report, size_after, staging = candidate.parity, candidate.size_after, candidate.staging
    published_dir = None
    try:
        validation = None
        if options.validate is not None:
            say("[6/7] serving the result over gRPC before publishing (validate)")
            start = time.perf_counter()
            validation = _validate_staged(staging, input_dir, output_base, version,
                                          options.validate, say)
            stages.append(StageReport("validate", time.perf_counter() - start, graph.node_count(),
                                      f"{validation.backend}: "
                                      + ("ok" if validation.ok else validation.failures[0])))
            if not validation.ok:
                report = _report(input_dir, output_base, None, version, False, kind, frozen,
                                 freeze_note, keys, transforms, lossy, passes, options, stages,
                                 size_before, SizeReport.of(staging), meta_graph, graph,
                                 parity_report, None, warnings, validation)
                raise ValidationError(
                    f"serving validation failed ({validation.failures[0]}); nothing was published",
                    "see the validation table; rerun with --novalidate to publish anyway",
                ).with_report(report)
            size_after = SizeReport.of(staging)
        published_dir = writer.publish(staging, output_base, version, options.overwrite)
        staging = None
    finally:
        writer.discard(staging)

    say(f"      published {published_dir}")
    bench = None
    if options.benchmark_runs > 0:
        say(f"[7/7] benchmark: load time and latency, {options.benchmark_runs} interleaved runs")
        start = time.perf_counter()
        bench_key = "serving_default" if "serving_default" in keys else keys[0]
        try:
            bench = benchmark(input_dir, published_dir, tags, bench_key,
                              batch_sizes=options.benchmark_batch_sizes,
                              runs=options.benchmark_runs, seed=options.seed)
        except Exception as e:  # noqa: BLE001 - the model is published and proven by now
            # A measurement must not turn a published, proven model into a failed run.
            warnings.append(f"benchmark skipped: {_first_line(e)}")
        stages.append(StageReport("benchmark", time.perf_counter() - start, graph.node_count(),
                                  "" if bench else "failed, see warnings"))
    else:
        say("[7/7] benchmark skipped")
    return _report(input_dir, output_base, published_dir, version, True, kind, frozen,
                   freeze_note, keys, transforms, lossy, passes, options, stages, size_before,
                   size_after, meta_graph, graph, parity_report, bench, warnings, validation)


def _validate_staged(staging: str, input_dir: str, output_base: str, version: int,
                     validate_options, say: Progress):
    """Serves the staged model from a hidden model base, so nothing unproven is published.

    TF Serving only loads integer version directories, so the staging directory is
    moved into ``<base>/.serving-opt-validate-*/<version>`` (same filesystem: a
    rename), served from there, and moved back.
    """
    import dataclasses
    import tempfile

    from serving_opt.serving import validate as validate_lib

    hidden_base = tempfile.mkdtemp(prefix=f"{writer.STAGING_PREFIX}validate-", dir=output_base)
    os.chmod(hidden_base, 0o755)
    served = os.path.join(hidden_base, str(version))
    os.rename(staging, served)
    try:
        opts = dataclasses.replace(
            validate_options,
            model_name=validate_options.model_name or os.path.basename(
                os.path.abspath(output_base)),
            version=version,
            reference_dir=input_dir,
        )
        result = validate_lib.validate(hidden_base, opts, progress=say)
        # Report the paths the model is published under, not the hidden serving base.
        final = os.path.join(output_base, str(version))
        return dataclasses.replace(
            result,
            model_base=os.path.abspath(output_base),
            warmup_file=result.warmup_file.replace(served, final) if result.warmup_file
            else None,
        )
    finally:
        os.rename(served, staging)
        os.rmdir(hidden_base)


def _freeze_note(info: freeze_lib.FreezeInfo) -> str:
    note = f"{info.variables_frozen} variables ({info.variable_bytes} bytes) frozen"
    if info.dropped_variable_initializers:
        note += f", {len(info.dropped_variable_initializers)} variable initializers dropped " \
                "from the init op"
    if info.variables_kept:
        note += f", {len(info.variables_kept)} asset-path variables kept for the init op"
    return note


def _first_line(e: BaseException) -> str:
    if isinstance(e, ServingOptError):
        return e.problem
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@dataclass
class _Candidate:
    """A written, parity-checked SavedModel in a staging directory, not yet published."""

    graph: ServingGraph
    frozen: bool
    freeze_note: str
    stages: list
    parity: parity.ParityReport
    size_after: SizeReport
    staging: str


@dataclass
class _CandidateBuilder:
    """Runs freeze .. parity once (frozen, or with variables kept) into a staging dir."""

    input_dir: str
    output_base: str
    version: int
    tags: frozenset
    keys: list
    kind: str
    transforms: tuple
    lossy: tuple
    passes: tuple
    options: OptimizeOptions
    user_inputs: object
    size_before: SizeReport
    meta_graph: object
    warnings: list
    stages: list  # the stages before this one (read), for a failure's report
    say: Progress

    def with_fallback(self) -> _Candidate:
        """The frozen candidate; with --freeze=auto, any failure of it (freezing, inlining,
        transforms on the frozen graph, loading, parity) falls back to keeping variables.

        A parity failure with lossy transforms requested is the transforms' verdict,
        not freezing's, so it is raised as it is.
        """
        mode = self.options.freeze
        if mode == "never":
            return self.build(frozen=False, note="--freeze=never")
        try:
            return self.build(frozen=True)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - auto must never crash on a freezing failure
            if isinstance(e, ParityError) and self.lossy:
                raise
            reason = _first_line(e)
            if mode == "always":
                if isinstance(e, ServingOptError):
                    raise
                raise ServingOptError(
                    f"could not freeze the variables of {self.input_dir}: {reason}",
                    "rerun with --freeze=auto (falls back) or --freeze=never",
                ) from e
            self.say(f"      frozen graph unusable ({reason}); retrying with variables kept")
            note = f"frozen graph unusable ({reason}); optimizing with variables kept"
            return self.build(frozen=False, note=note)

    def build(self, frozen: bool, note: str = "") -> _Candidate:
        options, say, stages = self.options, self.say, []
        say(f"[2/7] freezing variables ({options.freeze})" if frozen
            else "[2/7] loading with variables kept")
        start = time.perf_counter()
        if frozen:
            graph, info = freeze_lib.freeze_session_model(self.input_dir, self.tags, self.keys)
            note = _freeze_note(info)
        else:
            graph = freeze_lib.load_unfrozen(self.input_dir, self.tags, self.keys)
        stages.append(StageReport("freeze", time.perf_counter() - start, graph.node_count(),
                                  note))
        if frozen and grappler_lib.function_calls(graph.graph_def):
            # TF2: the work is inside library functions the transforms cannot see.
            say("[2/7] inlining the signature functions")
            start = time.perf_counter()
            graph, inlined = grappler_lib.inline_functions(graph)
            stages.append(StageReport("inline", time.perf_counter() - start,
                                      graph.node_count(), f"{inlined} function calls inlined"))

        say(f"[3/7] Graph Transform Tool: {transforms_lib.describe(self.transforms) or 'none'}")
        start = time.perf_counter()
        # The default preset is a convenience: a transform of it that fails on this graph
        # is left out with a warning. A spec the user wrote fails the run instead.
        default_preset = options.transforms is None or \
            options.transforms.strip().lower() == "default"
        skipped: list[str] | None = [] if default_preset else None
        graph = transforms_lib.apply_transforms(graph, self.transforms, skipped)
        for message in skipped or ():
            self.warnings.append(f"default transform left out: {message}")
        stages.append(StageReport("transforms", time.perf_counter() - start, graph.node_count(),
                                  f"{len(self.transforms)} transforms"))

        say(f"[4/7] Grappler: {','.join(self.passes) or 'none'} x{options.grappler_rounds}")
        start = time.perf_counter()
        graph = grappler_lib.run_grappler(graph, self.passes, options.grappler_rounds)
        grappler_note = ",".join(self.passes)
        if self.transforms or self.passes:
            # After Grappler, which merges the Adds folding leaves behind.
            graph, bias_adds = transforms_lib.constant_adds_to_bias_adds(graph)
            if bias_adds:
                grappler_note += f"; {bias_adds} constant Adds after convs made BiasAdds"
        stages.append(StageReport("grappler", time.perf_counter() - start, graph.node_count(),
                                  grappler_note))

        say("[5/7] writing the SavedModel")
        start = time.perf_counter()
        removed = 0
        if graph.variables_dir is None:
            graph_def = type(graph.graph_def)()
            graph_def.CopyFrom(graph.graph_def)
            removed = prune_library(graph_def)
            graph = graph.replace(graph_def=graph_def)
        staging = writer.make_staging_dir(self.output_base, self.version)
        try:
            writer.write_saved_model(graph, staging)
            stages.append(StageReport("write", time.perf_counter() - start, graph.node_count(),
                                      f"{removed} unused library functions dropped" if removed
                                      else ""))

            say(f"[6/7] parity gate on {len(self.keys)} signature(s)")
            start = time.perf_counter()
            parity_report = parity.check_parity(
                self.input_dir, staging, self.tags, self.keys,
                user_inputs=self.user_inputs, atol=options.atol, rtol=options.rtol,
                batch_size=options.parity_batch_size, num_batches=options.parity_batches,
                seed=options.seed,
            )
            size_after = SizeReport.of(staging)
            if not parity_report.ok:
                stages.append(StageReport("parity", time.perf_counter() - start,
                                          graph.node_count(), parity_report.summary()))
                report = _report(self.input_dir, self.output_base, None, self.version, False,
                                 self.kind, frozen, note, self.keys, self.transforms,
                                 self.lossy, self.passes, options, self.stages + stages,
                                 self.size_before,
                                 size_after, self.meta_graph, graph, parity_report, None,
                                 self.warnings + ([] if frozen else [f"variables kept: {note}"]))
                raise ParityError(
                    f"{parity_report.summary()}; nothing was published",
                    "drop the lossy transform, or loosen --atol/--rtol if the drift is "
                    "acceptable",
                ).with_report(report)
            # The session loader ran in the gate; TF2's loader must take the result too.
            load_note = check_loads_in_tf2(staging, self.input_dir, self.tags,
                                           graph.signature_defs)
            stages.append(StageReport("parity", time.perf_counter() - start,
                                      graph.node_count(),
                                      f"{parity_report.summary()}; {load_note}"))
        except BaseException:
            writer.discard(staging)
            raise
        if not frozen:
            self.warnings.append(f"variables kept: {note}")
        return _Candidate(graph, frozen, note, stages, parity_report, size_after, staging)


def check_loads_in_tf2(candidate_dir: str, reference_dir: str, tags: frozenset[str],
                       signature_defs: dict) -> str:
    """Loads the candidate with ``tf.saved_model.load`` (TF2 Python serving, tf.function
    users) and checks every kept signature is there with the same output aliases.

    The session loader (TF Serving's) already ran in the parity gate, on the real
    model. This check is about structure (signatures, init op, assets, saver), so it
    loads a copy whose large constants are stored as one broadcast zero: a second
    full load would cost as much as the parity gate. A model whose source does not
    load this way either is not held to it.

    Example:
        >>> check_loads_in_tf2("models/clf/.staging", "exports/1", frozenset({"serve"}),
        ...                    {"serving_default": sig})
        'loads with tf.saved_model.load (1 signatures)'
    """
    import gc
    import shutil
    import tempfile

    import tensorflow as tf

    def load(path: str) -> dict:
        loaded = tf.saved_model.load(path, tags=sorted(tags))
        out = {k: sorted(loaded.signatures[k].structured_outputs)
               for k in signature_defs if k in loaded.signatures}
        del loaded
        gc.collect()
        return out

    scratch = tempfile.mkdtemp(prefix="serving-opt-tf2-load-")
    try:
        copy = writer.structure_copy(candidate_dir, os.path.join(scratch, "1"))
        try:
            outputs = load(copy)
        except Exception as e:  # noqa: BLE001 - judged against the source below
            try:
                load(reference_dir)
            except Exception:  # noqa: BLE001
                return "not loadable with tf.saved_model.load (neither is the source)"
            raise ServingOptError(
                f"the optimized model does not load with tf.saved_model.load: "
                f"{_first_line(e)}",
                "rerun with --freeze=never, and report this",
            ) from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wrong = [k for k, sig in signature_defs.items()
             if outputs.get(k) != sorted(sig.outputs)]
    if wrong:
        raise ServingOptError(
            f"tf.saved_model.load does not see signature(s) {', '.join(wrong)} of the "
            "optimized model with their outputs", "rerun with --freeze=never, and report this")
    return f"loads with tf.saved_model.load ({len(outputs)} signatures)"


def _report(input_dir, output_base, output_dir, version, published, kind, frozen, freeze_note,
            keys, transforms, lossy, passes, options, stages, size_before, size_after,
            meta_graph, graph, parity_report, bench, warnings, validation=None) -> OptimizeReport:
    import collections

    before = collections.Counter(n.op for n in meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
        before.update(n.op for n in function.node_def)
    after = collections.Counter(graph.op_histogram())
    removed = {op: before[op] - after.get(op, 0) for op in before if before[op] > after.get(op, 0)}
    added = {op: after[op] - before.get(op, 0) for op in after if after[op] > before.get(op, 0)}
    return OptimizeReport(
        input_dir=input_dir,
        output_base=output_base,
        output_dir=output_dir,
        version=version,
        published=published,
        model_kind=kind,
        frozen=frozen,
        freeze_note=freeze_note,
        signatures=tuple(keys),
        transforms=transforms_lib.describe(transforms),
        lossy_transforms=lossy,
        grappler_passes=passes,
        grappler_rounds=options.grappler_rounds,
        stages=tuple(stages),
        size_before=size_before,
        size_after=size_after,
        nodes_before=total_node_count(meta_graph.graph_def),
        nodes_after=graph.node_count(),
        ops_removed=dict(sorted(removed.items())),
        ops_added=dict(sorted(added.items())),
        parity=parity_report,
        benchmark=bench,
        warnings=tuple(warnings),
        validation=validation,
    )
