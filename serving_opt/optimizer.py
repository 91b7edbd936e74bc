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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from serving_opt import freeze as freeze_lib
from serving_opt import grappler as grappler_lib
from serving_opt import inputs as inputs_lib
from serving_opt import loader, parity, writer
from serving_opt import transforms as transforms_lib
from serving_opt.benchmark import BenchmarkReport, benchmark
from serving_opt.errors import ParityError, ServingOptError, UsageError, ValidationError
from serving_opt.graph import ServingGraph, prune_library

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
    nodes_before = len(meta_graph.graph_def.node)
    size_before = SizeReport.of(input_dir)
    stages.append(StageReport("read", time.perf_counter() - start, nodes_before,
                              f"{kind} model, signatures: {', '.join(keys)}"))

    say(f"[2/7] freezing variables ({options.freeze})")
    start = time.perf_counter()
    graph, frozen, freeze_note = _freeze(input_dir, tags, keys, options.freeze)
    stages.append(StageReport("freeze", time.perf_counter() - start, graph.node_count(),
                              freeze_note))
    if not frozen:
        warnings.append(f"variables kept: {freeze_note}")

    say(f"[3/7] Graph Transform Tool: {transforms_lib.describe(transforms) or 'none'}")
    start = time.perf_counter()
    graph = transforms_lib.apply_transforms(graph, transforms)
    stages.append(StageReport("transforms", time.perf_counter() - start, graph.node_count(),
                              f"{len(transforms)} transforms"))

    say(f"[4/7] Grappler: {','.join(passes) or 'none'} x{options.grappler_rounds}")
    start = time.perf_counter()
    graph = grappler_lib.run_grappler(graph, passes, options.grappler_rounds)
    stages.append(StageReport("grappler", time.perf_counter() - start, graph.node_count(),
                              ",".join(passes)))

    say("[5/7] writing the SavedModel")
    start = time.perf_counter()
    if graph.variables_dir is None:
        graph_def = type(graph.graph_def)()
        graph_def.CopyFrom(graph.graph_def)
        removed = prune_library(graph_def)
        graph = graph.replace(graph_def=graph_def)
    else:
        removed = 0
    staging = writer.make_staging_dir(output_base, version)
    published_dir = None
    try:
        writer.write_saved_model(graph, staging)
        stages.append(StageReport("write", time.perf_counter() - start, graph.node_count(),
                                  f"{removed} unused library functions dropped" if removed
                                  else ""))

        say(f"[6/7] parity gate on {len(keys)} signature(s)")
        start = time.perf_counter()
        parity_report = parity.check_parity(
            input_dir, staging, tags, keys,
            user_inputs=user_inputs, atol=options.atol, rtol=options.rtol,
            batch_size=options.parity_batch_size, num_batches=options.parity_batches,
            seed=options.seed,
        )
        stages.append(StageReport("parity", time.perf_counter() - start, graph.node_count(),
                                  parity_report.summary()))
        size_after = SizeReport.of(staging)
        if not parity_report.ok:
            report = _report(input_dir, output_base, None, version, False, kind, frozen,
                             freeze_note, keys, transforms, lossy, passes, options, stages,
                             size_before, size_after, meta_graph, graph, parity_report, None,
                             warnings)
            raise ParityError(
                f"{parity_report.summary()}; nothing was published",
                "drop the lossy transform, or loosen --atol/--rtol if the drift is acceptable",
            ).with_report(report)
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
        bench = benchmark(input_dir, published_dir, tags, bench_key,
                          batch_sizes=options.benchmark_batch_sizes,
                          runs=options.benchmark_runs, seed=options.seed)
        stages.append(StageReport("benchmark", time.perf_counter() - start, graph.node_count()))
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

    from serving_opt import validate as validate_lib

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


def _freeze(input_dir: str, tags: frozenset[str], keys: Sequence[str],
            mode: str) -> tuple[ServingGraph, bool, str]:
    if mode == "never":
        return freeze_lib.load_unfrozen(input_dir, tags, keys), False, "--freeze=never"
    try:
        graph, info = freeze_lib.freeze_session_model(input_dir, tags, keys)
    except ServingOptError as e:
        if mode == "always" or "could not freeze" not in e.problem and "GiB" not in e.problem:
            raise
        note = f"could not freeze ({e.problem}); optimizing with variables kept"
        return freeze_lib.load_unfrozen(input_dir, tags, keys), False, note
    note = f"{info.variables_frozen} variables ({info.variable_bytes} bytes) frozen"
    if info.dropped_variable_initializers:
        note += f", {len(info.dropped_variable_initializers)} variable initializers dropped " \
                "from the init op"
    return graph, True, note


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
        nodes_before=len(meta_graph.graph_def.node),
        nodes_after=graph.node_count(),
        ops_removed=dict(sorted(removed.items())),
        ops_added=dict(sorted(added.items())),
        parity=parity_report,
        benchmark=bench,
        warnings=tuple(warnings),
        validation=validation,
    )
