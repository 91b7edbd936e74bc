"""The run record of one ``optimize``: stage timings, warnings, and the report built from them.

The pipeline (``optimizer.py``) passes values from stage to stage; everything that is
*about* the run (how long each stage took, what it left, what went wrong, the numbers the
report prints) is gathered here, so the report is built in one place, from whatever the
run reached, whether it published or failed.

    run = Run("exports/1", "models/clf", say=print)
    with run.stage("freeze", "freezing variables") as stage:
        graph = ...
        stage.done(graph, "14 variables frozen")
    report = run.report()
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from serving_opt.savedmodel import loader

Progress = Callable[[str], None]


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
    """What ``optimize`` did and measured; ``to_dict()`` is the JSON report."""

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
    parity: object | None  # a serving_opt.stages.parity.ParityReport
    benchmark: object | None  # a serving_opt.stages.benchmark.BenchmarkReport
    # Both models loaded in fresh processes (serving_opt.stages.coldstart.ColdStartReport).
    cold_start: object | None = None
    # Large variables kept as variables, each with the reason (checkpoint.KeptVariable).
    variables_kept: tuple = ()
    # Weights stored quantized, and where they are turned back into float.
    quantized: tuple = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    validation: object | None = None  # a serving_opt.serving.validate.ValidationReport
    sandbox: str = ""  # how the model was isolated while it ran (serving_opt.sandbox)
    # Every candidate configuration tried, its verdict and why it was left, in order
    # (serving_opt.pipeline.attempts.AttemptReport); the last is the one published (or refused).
    attempts: tuple = ()
    # A frozen GraphDef input ("input": its feeds and fetches as the signature serves
    # them) and --output_format=graphdef ("output": the .pb written, its feeds/fetches).
    graph_def: dict = field(default_factory=dict)
    # What each Graph Transform Tool pass did to this graph, one line per pass
    # (serving_opt.savedmodel.graph_diff): ops removed, batch norms folded, CheckNumerics removed.
    transform_passes: tuple[str, ...] = ()
    # --input_shapes: what was pinned, whether the pinned candidate was kept, and the
    # side-by-side latency ratio (pinned/unpinned) that decided it.
    input_shapes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Stage:
    """What a running stage reports back: the graph it left and a note."""

    def __init__(self) -> None:
        self.nodes = 0
        self.note = ""

    def done(self, graph, note: str = "") -> None:
        self.nodes = graph.node_count() if graph is not None else 0
        self.note = note


# What one attempt at the candidate sets, undone when the attempt fails.
_ATTEMPT_FIELDS = ("graph", "frozen", "freeze_note", "parity", "size_after", "cold_start",
                   "benchmark", "kept_variables", "quantized", "transform_passes")


class Run:
    """The record of one optimize run; the pipeline fills it in as it goes.

    Fields the stages set: ``plan`` (the options resolved once), ``source`` (the model
    read), ``graph`` (the latest serving graph), ``frozen``/``freeze_note``, ``parity``
    and ``size_after`` (the written candidate), ``validation``, ``benchmark``,
    ``attempts`` (one per candidate tried), and ``output_dir`` once published.
    """

    def __init__(self, input_dir: str, output_base: str, options,
                 say: Progress | None = None, steps: tuple[str, ...] = ()) -> None:
        self.input_dir = input_dir
        # The SavedModel the stages read: the input, or what a .pb input became.
        self.model_dir = input_dir
        self.graph_def: dict = {}  # OptimizeReport.graph_def
        self.transform_passes: tuple[str, ...] = ()
        self.input_shapes: dict = {}  # OptimizeReport.input_shapes
        self.output_base = output_base
        self.options = options
        self.say = say or (lambda _: None)
        self.steps = steps  # the numbered steps, for "[3/9]" progress labels
        self.stages: list[StageReport] = []
        self.warnings: list[str] = []
        self.plan = None
        self.source = None
        self.graph = None
        self.frozen = False
        self.freeze_note = ""
        self.parity = None
        self.size_after = None
        self.quantized: tuple = ()  # stages.quantize.QuantizedTensor
        self.attempts: list = []  # attempts.AttemptReport: kept across restore()
        self.kept_variables: tuple = ()  # checkpoint.KeptVariable: large ones not frozen
        self.scratch_dirs: list[str] = []  # removed when the run ends, however it ends
        self.validation = None
        self.cold_start = None
        self.work_dir: str | None = None  # the claimed directory everything is written in
        self.sandbox = ""  # how the model was isolated (serving_opt.sandbox.describe)
        self.target_registry = None  # (tf_version, source, op registry) of the target
        self.worker_report: OptimizeReport | None = None  # the sandboxed worker's report
        self.benchmark = None
        self.output_dir: str | None = None

    def progress(self, step: str, message: str) -> None:
        """Prints ``[n/N] message`` for a numbered step, an indented line otherwise."""
        if step in self.steps:
            self.say(f"[{self.steps.index(step) + 1}/{len(self.steps)}] {message}")
        else:
            self.say(f"      {message}")

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    @contextlib.contextmanager
    def stage(self, name: str, message: str | None,
              step: str | None = None) -> Iterator[_Stage]:
        """Times one stage; it is recorded even when it raises (with the note set so far)."""
        if message is not None:
            self.progress(step or name, message)
        stage = _Stage()
        start = time.perf_counter()
        try:
            yield stage
        finally:
            self.stages.append(StageReport(name, time.perf_counter() - start, stage.nodes,
                                           stage.note))

    def scratch_dir(self) -> str:
        """A directory for a stage's files, removed when the run ends (however it ends); in
        the model base's work directory, so its files are linked into the version, not
        copied."""
        scratch = self.work_subdir(f"scratch-{self.plan.version}-")
        self.scratch_dirs.append(scratch)
        return scratch

    def work_subdir(self, prefix: str) -> str:
        """A new directory in the run's claimed work directory (removed with it)."""
        import tempfile

        from serving_opt.savedmodel import writer

        return tempfile.mkdtemp(prefix=f"{writer.STAGING_PREFIX}{prefix}", dir=self.work_dir)

    def snapshot(self) -> tuple:
        """The record as it is now, for :meth:`restore`."""
        return (len(self.stages), len(self.warnings),
                {k: getattr(self, k) for k in _ATTEMPT_FIELDS})

    def restore(self, snapshot: tuple) -> None:
        """Forgets an abandoned attempt (its stages, warnings and results), so a fallback's
        report holds only what the published attempt did."""
        stages, warnings, fields = snapshot
        del self.stages[stages:]
        del self.warnings[warnings:]
        for k, v in fields.items():
            setattr(self, k, v)

    def forget_between(self, first: tuple, second: tuple) -> None:
        """Forgets the stages and warnings recorded between two snapshots (a build that
        another replaced), keeping what came after; the results stay as they are."""
        del self.stages[first[0]:second[0]]
        del self.warnings[first[1]:second[1]]

    def adopt(self, worker_report: OptimizeReport) -> None:
        """Takes over what the sandboxed worker did: its stages, warnings and results."""
        self.worker_report = worker_report
        self.stages = list(worker_report.stages)
        self.warnings = list(worker_report.warnings)

    def adopted(self, worker_report: OptimizeReport) -> OptimizeReport:
        """A failed worker's report, completed with what only this process knows."""
        self.adopt(worker_report)
        return self.report()

    def report(self) -> OptimizeReport:
        """The report of the run as far as it got (published or not)."""
        if self.worker_report is not None:
            import dataclasses

            return dataclasses.replace(
                self.worker_report, input_dir=self.input_dir, output_base=self.output_base,
                output_dir=self.output_dir,
                published=self.output_dir is not None, stages=tuple(self.stages),
                warnings=tuple(self.warnings), sandbox=self.sandbox)
        plan, source = self.plan, self.source
        graph = self.graph
        before = collections.Counter()
        if source is not None:
            before.update(n.op for n in source.meta_graph.graph_def.node)
            for function in source.meta_graph.graph_def.library.function:
                before.update(n.op for n in function.node_def)
        after = collections.Counter(graph.op_histogram()) if graph is not None else before
        removed = {op: before[op] - after.get(op, 0) for op in before
                   if before[op] > after.get(op, 0)}
        added = {op: after[op] - before.get(op, 0) for op in after
                 if after[op] > before.get(op, 0)}
        from serving_opt.stages import transforms as transforms_lib

        return OptimizeReport(
            input_dir=self.input_dir,
            output_base=self.output_base,
            output_dir=self.output_dir,
            version=plan.version if plan else 0,
            published=self.output_dir is not None,
            model_kind=source.kind if source else "",
            frozen=self.frozen,
            freeze_note=self.freeze_note,
            signatures=tuple(source.keys) if source else (),
            transforms=transforms_lib.describe(plan.transforms) if plan else "",
            lossy_transforms=plan.lossy if plan else (),
            grappler_passes=plan.passes if plan else (),
            grappler_rounds=self.options.build.grappler_rounds,
            stages=tuple(self.stages),
            size_before=source.size if source else SizeReport(0, 0, 0, 0),
            size_after=self.size_after,
            nodes_before=source.nodes if source else 0,
            nodes_after=graph.node_count() if graph is not None else 0,
            ops_removed=dict(sorted(removed.items())),
            ops_added=dict(sorted(added.items())),
            parity=self.parity,
            benchmark=self.benchmark,
            cold_start=self.cold_start,
            variables_kept=tuple(self.kept_variables),
            quantized=tuple(self.quantized),
            warnings=tuple(self.warnings),
            validation=self.validation,
            sandbox=self.sandbox,
            attempts=tuple(self.attempts),
            graph_def=dict(self.graph_def),
            transform_passes=tuple(self.transform_passes),
            input_shapes=dict(self.input_shapes),
        )
