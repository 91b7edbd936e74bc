"""``serving-opt compare``: baseline vs candidate on a whole evaluation set, on Apache Beam.

    report = compare("models/clf/1", "models/clf/2", "gs://bucket/eval/part-*.tfrecord")
    print(format_report(report))

The examples (TFRecord shards of serialized tf.Example, or JSON lines of requests) are
read by Beam from any filesystem it has (local, gs://, s3://), batched, run through both
models with Beam's ``RunInference`` and our SavedModel handler (the session loader, as
TF Serving loads), and compared per signature output with combiners: count, mismatches
under the parity gate's tolerances, abs/rel diffs, a histogram, top-1 agreement and class
confusion for classifiers, and the worst examples by key (``<shard>:<record index>``).
Nothing is collected to the driver but the combined statistics. See docs/compare.md.

Needs the ``beam`` extra (``pip install serving-opt[beam]``); the error says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, UsageError, first_line
from serving_opt.stages import parity

DEFAULT_BATCH_SIZE = 256

__all__ = ["CompareOptions", "CompareReport", "OutputComparison", "compare", "format_report",
           "require_beam"]


def require_beam() -> None:
    """Raises the one-line error when Apache Beam is not installed.

    Example:
        >>> require_beam()  # nothing when it is
    """
    try:
        import apache_beam  # noqa: F401
        import google_crc32c  # noqa: F401
    except ImportError as e:
        raise ServingOptError(
            f"serving-opt compare runs on Apache Beam, which is not installed ({e.name} "
            "missing)", "pip install serving-opt[beam]") from None


@dataclass(frozen=True)
class CompareOptions:
    """What ``serving-opt compare`` can be told. ``pipeline_args`` go to Beam as they are
    (``--project=... --region=...``); ``runner`` and ``direct_num_workers`` are shortcuts."""

    signatures: tuple[str, ...] = ()  # empty: every signature the examples fit
    saved_model_tags: str = "serve"
    runner: str = "DirectRunner"
    direct_num_workers: int = 1  # DirectRunner/Prism: >1 runs worker processes
    pipeline_args: tuple[str, ...] = ()
    batch_size: int = DEFAULT_BATCH_SIZE  # BatchElements' maximum
    atol: float = parity.DEFAULT_ATOL
    rtol: float = parity.DEFAULT_RTOL
    worst_k: int = 10
    allow_file_ops: bool = False
    # Run the models outside the bubblewrap sandbox where none can start (local runners;
    # a remote runner's workers run them elsewhere).
    allow_unsandboxed: bool = False


@dataclass(frozen=True)
class OutputComparison:
    """One output of one signature over every example (see stats.OutputStats)."""

    signature: str
    output: str
    dtype: str
    examples: int
    elements: int
    mismatches: int
    mismatched_examples: int
    max_abs_diff: float
    mean_abs_diff: float
    max_rel_diff: float
    mean_rel_diff: float
    histogram: dict  # bucket label ("0", "<=1e-06", ">1") -> elements
    top1_agreement: float | None = None  # classifiers: probabilities/scores or class ids
    top1_rows: int = 0
    confusion: tuple = ()  # (baseline class, candidate class, rows), every pair seen
    worst: tuple = ()  # (example key, score): max abs diff, or differing elements
    detail: str = ""


@dataclass(frozen=True)
class CompareReport:
    """The comparison's verdict. ``ok``: no element mismatched under atol/rtol and no
    batch was rejected by one model only."""

    ok: bool
    baseline: str
    candidate: str
    examples_pattern: str
    shards: int
    examples: int
    runner: str
    workers: int
    atol: float
    rtol: float
    outputs: tuple[OutputComparison, ...]
    errors: tuple[dict, ...]  # per signature: rejected batches (both / one model only)
    skipped: dict  # signature -> why it was not compared
    seconds: float
    examples_per_second: float

    def failures(self, lossy: parity.LossyGate | None = None) -> list[str]:
        """What fails the gate: exact (atol/rtol), or with ``lossy`` the lossy gate's
        rules (top-1 agreement and max probability error for classifier outputs)."""
        out = []
        for e in self.errors:
            if e["baseline_only"] or e["candidate_only"]:
                out.append(f"{e['signature']}: {e['baseline_only'] + e['candidate_only']} "
                           f"examples rejected by one model only ({e['first_error']})")
        for o in self.outputs:
            name = f"{o.signature}/{o.output}"
            if o.detail and ("missing" in o.detail or "!=" in o.detail):
                out.append(f"{name}: {o.detail}")
            elif lossy is None:
                if o.mismatches:
                    out.append(f"{name}: {o.mismatches} of {o.elements} elements in "
                               f"{o.mismatched_examples} of {o.examples} examples differ "
                               f"(max abs diff {o.max_abs_diff:.3g})")
            elif o.top1_agreement is not None and o.top1_agreement < lossy.min_top1_agreement:
                out.append(f"{name}: top-1 agreement {o.top1_agreement:.4f} < "
                           f"{lossy.min_top1_agreement}")
            elif o.dtype.startswith("float") and \
                    o.output.lower() in parity.PROBABILITY_OUTPUTS and \
                    o.max_abs_diff > lossy.max_probability_error:
                out.append(f"{name}: max abs diff {o.max_abs_diff:.3g} > "
                           f"{lossy.max_probability_error}")
            elif not o.dtype.startswith(("float", "complex", "bfloat")) and o.examples and \
                    o.mismatched_examples / o.examples > 1 - lossy.min_top1_agreement:
                out.append(f"{name}: {o.mismatched_examples} of {o.examples} examples differ")
        return out

    def summary(self) -> str:
        if self.ok:
            worst = max((o.max_abs_diff for o in self.outputs), default=0.0)
            return (f"compare ok: {self.examples} examples, {len(self.outputs)} outputs "
                    f"match (max abs diff {worst:.2g})")
        return "compare: " + "; ".join(self.failures()[:3])


# --- reading the models' signatures in the driver -----------------------------------------

def _meta_graph(model_dir: str, tags: frozenset):
    from serving_opt.savedmodel import loader

    if "://" not in model_dir:
        return loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    from apache_beam.io.filesystems import FileSystems

    scratch = tempfile.mkdtemp(prefix="serving-opt-pb-")
    try:
        for name in ("saved_model.pb", "saved_model.pbtxt"):
            path = model_dir.rstrip("/") + "/" + name
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type="uncompressed") as src, \
                        open(os.path.join(scratch, name), "wb") as dst:
                    shutil.copyfileobj(src, dst)
                break
        return loader.find_meta_graph(loader.read_saved_model(scratch), tags, model_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _match_shards(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as e:  # noqa: BLE001 - Beam's BeamIOError for a missing directory
        raise ServingOptError(f"--examples={pattern}: cannot list it ({first_line(e)})",
                              "check the path and your access to it") from None
    if not found:
        raise ServingOptError(f"--examples={pattern} matches no files",
                              "check the pattern (a glob, e.g. /data/eval-*.tfrecord)")
    for meta in found:
        if meta.size_in_bytes == 0:
            raise ServingOptError(f"shard {meta.path} is empty (0 bytes)",
                                  "remove the empty shard or narrow --examples")
    return sorted(m.path for m in found)


def _input_kind(shard: str) -> tuple[str, set]:
    """("tfrecord", {}) or ("json", aliases of the first request) from the first shard."""
    from apache_beam.io.filesystems import FileSystems

    from serving_opt.compare import pipeline as pl

    with FileSystems.open(shard) as f:
        head = pl._read_exact(f, 12)
        if pl.looks_like_tfrecord(head):
            return "tfrecord", set()
        if head.lstrip()[:1] == b"{":
            line = head + f.readline() if hasattr(f, "readline") else head
            try:
                return "json", set(json.loads(line))
            except (ValueError, TypeError):
                raise ServingOptError(f"shard {shard} line 1 is not valid JSON",
                                      "write one JSON request per line") from None
    raise ServingOptError(
        f"shard {shard} is neither a TFRecord nor JSON lines (starts with {head[:8]!r})",
        "write TFRecords of serialized tf.Example, or one JSON request per line")


def _plans(meta_graph, candidate_mg, keys: Sequence[str], explicit: bool, kind: str,
           aliases: set):
    from tensorflow.python.framework import dtypes

    from serving_opt.compare.pipeline import SignaturePlan
    from serving_opt.savedmodel import inputs as inputs_lib

    plans, skipped = [], {}
    for key in keys:
        sig = meta_graph.signature_def[key]
        if key not in candidate_mg.signature_def:
            raise ServingOptError(f"signature {key} is missing from the candidate",
                                  "compare models with the same signatures, or pass "
                                  "--signatures")
        dtype_of = {a: ("object" if i.dtype == dtypes.string.as_datatype_enum
                        else dtypes.as_dtype(i.dtype).as_numpy_dtype.__name__)
                    for a, i in sig.inputs.items()}
        example = None
        reason = ""
        if kind == "tfrecord":
            found = inputs_lib.example_input_alias(meta_graph.graph_def, sig)
            if found is None:
                reason = "it does not take serialized tf.Examples"
            else:
                example = found[0]
        elif not aliases <= set(sig.inputs):
            reason = f"its inputs ({', '.join(sorted(sig.inputs))}) do not take the " \
                     f"requests' ({', '.join(sorted(aliases))})"
        if reason:
            if explicit:
                raise UsageError(f"signature {key} cannot be compared on these examples: "
                                 f"{reason}", "pass examples it takes, or drop it from "
                                 "--signatures")
            skipped[key] = reason
            continue
        plans.append(SignaturePlan(key, example, tuple(sorted(dtype_of.items())),
                                   tuple(sorted(sig.outputs))))
    if not plans:
        raise ServingOptError(
            "no signature takes these examples ("
            + "; ".join(f"{k}: {r}" for k, r in skipped.items()) + ")",
            "pass TFRecords of tf.Example for classify/regress/predict-on-examples "
            "signatures, or JSON lines of the signature's inputs")
    return tuple(plans), skipped


def _pipeline_options(options: CompareOptions):
    from apache_beam.options.pipeline_options import PipelineOptions

    args = [f"--runner={options.runner}"]
    extra = list(options.pipeline_args)
    if options.direct_num_workers > 1:
        args.append(f"--direct_num_workers={options.direct_num_workers}")
        if not any(a.startswith("--direct_running_mode") for a in extra):
            # Threads would share one Python interpreter; processes use every core.
            args.append("--direct_running_mode=multi_processing")
    return PipelineOptions(args + extra)


def _results_dir(pipeline_options) -> tuple[str, bool]:
    """Where the job writes its small result file: under --temp_location when given (a
    remote runner's workers cannot write to this machine), else a local temp dir."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    temp = pipeline_options.view_as(GoogleCloudOptions).temp_location
    if temp:
        return temp.rstrip("/") + f"/serving-opt-compare-{uuid.uuid4().hex}", False
    return tempfile.mkdtemp(prefix="serving-opt-compare-"), True


def _pipeline_failure(e: BaseException) -> ServingOptError:
    from serving_opt.compare.pipeline import MARK_CLOSE, MARK_OPEN

    text = str(e)
    start = text.find(MARK_OPEN)
    if start >= 0:
        end = text.find(MARK_CLOSE, start)
        message = text[start + len(MARK_OPEN):end if end > 0 else None].strip()
        problem, _, fix = message.partition("; ")
        return ServingOptError(problem, fix or None)
    return ServingOptError(f"the comparison pipeline failed: {first_line(e)}",
                           "rerun with --verbosity=1 for the runner's traceback")


def compare(baseline: str, candidate: str, examples: str,
            options: CompareOptions = CompareOptions(),
            progress: Callable[[str], None] | None = None) -> CompareReport:
    """Compares two SavedModels' answers on every example matching ``examples``.

    Example:
        >>> r = compare("build/sample/1", "build/models/classifier/1",
        ...             "build/eval/part-*.tfrecord", CompareOptions(direct_num_workers=2))
        >>> r.ok, r.examples
        (True, 100000)
    """
    require_beam()
    say = progress or (lambda _m: None)
    if options.batch_size < 1 or options.worst_k < 0 or options.direct_num_workers < 1:
        raise UsageError("--batch_size and --direct_num_workers must be >= 1, --worst_k >= 0",
                         "e.g. --batch_size=256")
    from serving_opt import sandbox as sandbox_lib
    from serving_opt import untrusted
    from serving_opt.savedmodel import loader

    tags = loader.parse_tags(options.saved_model_tags)
    base_mg = _meta_graph(baseline, tags)
    cand_mg = _meta_graph(candidate, tags)
    keys = loader.select_signatures(base_mg, options.signatures)
    if not options.allow_file_ops:
        untrusted.refuse_host_ops(base_mg, keys, "compare")
        untrusted.refuse_host_ops(cand_mg, [k for k in keys if k in cand_mg.signature_def],
                                  "compare")
    del base_mg, cand_mg
    local_runner = options.runner.lower().replace("runner", "") in ("direct", "prism",
                                                                   "interactive")
    sandboxed = local_runner and sandbox_lib.require(options.allow_unsandboxed,
                                                     f"compare {candidate}")
    if not sandboxed:
        return execute(baseline, candidate, examples, options, say)
    if "://" in examples:
        raise ServingOptError(
            f"--examples={examples} needs the network, which the sandbox running the models "
            "does not have; nothing was run",
            "copy the shards to a local directory, or pass --allow_unsandboxed for models "
            "you trust")
    # Absolute paths: the pipeline runs elsewhere (cwd /tmp, in its sandbox); the report
    # names the paths as the user gave them.
    given = {"baseline": baseline, "candidate": candidate, "examples_pattern": examples}
    baseline, candidate = os.path.abspath(baseline), os.path.abspath(candidate)
    examples = os.path.abspath(examples)
    policy = sandbox_lib.Policy(read_only=(baseline, candidate, sandbox_lib.glob_root(examples)))
    report = sandbox_lib.call("serving_opt.compare:execute", baseline, candidate, examples,
                              options, policy=policy, progress=say)
    import dataclasses

    return dataclasses.replace(report, **given)


def execute(baseline: str, candidate: str, examples: str, options: CompareOptions,
            progress: Callable[[str], None] | None = None) -> CompareReport:
    """The pipeline itself (in the sandbox for local runners): both models on every example."""
    import apache_beam as beam

    from serving_opt import sandbox as sandbox_lib
    from serving_opt.compare import pipeline as pl
    from serving_opt.savedmodel import loader

    say = progress or sandbox_lib.say
    tags = loader.parse_tags(options.saved_model_tags)
    base_mg = _meta_graph(baseline, tags)
    cand_mg = _meta_graph(candidate, tags)
    keys = loader.select_signatures(base_mg, options.signatures)
    shards = _match_shards(examples)
    kind, aliases = _input_kind(shards[0])
    plans, skipped = _plans(base_mg, cand_mg, keys, bool(options.signatures), kind, aliases)
    del base_mg, cand_mg

    pipeline_options = _pipeline_options(options)
    results_dir, local_results = _results_dir(pipeline_options)
    results = results_dir.rstrip("/") + "/results.jsonl"
    tag_tuple = tuple(sorted(tags))
    say(f"comparing {len(plans)} signature(s) on {len(shards)} shard(s) with "
        f"{options.runner}" + (f" ({options.direct_num_workers} workers)"
                               if options.direct_num_workers > 1 else ""))
    start = time.perf_counter()
    try:
        p = beam.Pipeline(options=pipeline_options)
        pl.build(p, shards,
                 pl.SavedModelHandler(baseline, tag_tuple, plans, "baseline"),
                 pl.SavedModelHandler(candidate, tag_tuple, plans, "candidate"),
                 batch_size=options.batch_size, atol=options.atol, rtol=options.rtol,
                 worst_k=options.worst_k, results_prefix=results)
        try:
            p.run().wait_until_finish()
        except ServingOptError:
            raise
        except Exception as e:  # noqa: BLE001 - the runner wraps the worker's error
            raise _pipeline_failure(e) from e
        seconds = time.perf_counter() - start
        lines = _read_results(results)
    finally:
        if local_results:
            shutil.rmtree(results_dir, ignore_errors=True)
    return _report(lines, baseline, candidate, examples, len(shards), options, skipped,
                   seconds)


def _read_results(path: str) -> list[dict]:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type="uncompressed") as f:
        lines = [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
    if "://" in path:
        FileSystems.delete([path])
    return lines


def _report(lines: list[dict], baseline: str, candidate: str, pattern: str, shards: int,
            options: CompareOptions, skipped: dict, seconds: float) -> CompareReport:
    from serving_opt.compare.stats import histogram_labels

    labels = histogram_labels()
    count = next((line["examples"] for line in lines if line["kind"] == "count"), 0)
    outputs, errors = [], []
    for line in lines:
        if line["kind"] == "errors":
            errors.append({k: v for k, v in line.items() if k != "kind"})
        elif line["kind"] == "output":
            top1 = line["top1_agree"] / line["top1_rows"] if line["top1_rows"] else None
            outputs.append(OutputComparison(
                signature=line["signature"], output=line["output"], dtype=line["dtype"],
                examples=line["examples"], elements=line["elements"],
                mismatches=line["mismatches"],
                mismatched_examples=line["mismatched_examples"],
                max_abs_diff=line["max_abs_diff"], mean_abs_diff=line["mean_abs_diff"],
                max_rel_diff=line["max_rel_diff"], mean_rel_diff=line["mean_rel_diff"],
                histogram=dict(zip(labels, line["histogram"])), top1_agreement=top1,
                top1_rows=line["top1_rows"],
                confusion=tuple(tuple(c) for c in line["confusion"]),
                worst=tuple(tuple(w) for w in line["worst"]),
                detail="; ".join(line["details"])))
    outputs.sort(key=lambda o: (o.signature, o.output))
    errors.sort(key=lambda e: e["signature"])
    report = CompareReport(
        ok=True, baseline=baseline, candidate=candidate, examples_pattern=pattern,
        shards=shards, examples=count, runner=options.runner,
        workers=options.direct_num_workers, atol=options.atol, rtol=options.rtol,
        outputs=tuple(outputs), errors=tuple(errors), skipped=dict(skipped),
        seconds=round(seconds, 3),
        examples_per_second=round(count / seconds, 1) if seconds > 0 else 0.0)
    import dataclasses

    return dataclasses.replace(report, ok=not report.failures())


def _g(x: float) -> str:
    return f"{x:.3g}"


def format_report(report: CompareReport) -> str:
    """The report as aligned tables: one row per output, then histograms, the worst
    examples and the classes that moved.

    Example:
        >>> print(format_report(report))
    """
    from serving_opt.report import table

    head = (f"compare {report.baseline} (baseline) vs {report.candidate} (candidate)\n"
            f"  {report.examples} examples from {report.shards} shard(s) of "
            f"{report.examples_pattern}; {report.runner}"
            + (f", {report.workers} workers" if report.workers > 1 else "")
            + f"; {report.seconds:.1f} s ({report.examples_per_second:.0f} examples/s)\n"
            f"  tolerances: atol={report.atol:g}, rtol={report.rtol:g}")
    rows = []
    for o in report.outputs:
        rows.append([o.signature, o.output, o.examples, o.mismatches, o.mismatched_examples,
                     _g(o.max_abs_diff), _g(o.mean_abs_diff), _g(o.max_rel_diff),
                     "-" if o.top1_agreement is None else f"{o.top1_agreement:.4%}"])
    parts = [head, "", table(["signature", "output", "examples", "mismatches",
                              "examples differing", "max abs", "mean abs", "max rel",
                              "top-1 agreement"], rows, indent="  ")]
    differing = [o for o in report.outputs if any(
        v for k, v in o.histogram.items() if k != "0")]
    if differing:
        labels = list(differing[0].histogram)
        parts += ["", "  abs diff histogram (elements)",
                  table(["signature/output"] + labels,
                        [[f"{o.signature}/{o.output}"] + [o.histogram[k] for k in labels]
                         for o in differing], indent="  ")]
    worst = [(o, w) for o in report.outputs for w in o.worst[:3]]
    if worst:
        parts += ["", "  worst examples (first 3 per output; all in the JSON report)",
                  table(["signature/output", "example", "score"],
                        [[f"{o.signature}/{o.output}", k, _g(s)] for o, (k, s) in worst],
                        indent="  ")]
    moved = [(o, c) for o in report.outputs for c in o.confusion if c[0] != c[1]]
    if moved:
        moved.sort(key=lambda oc: -oc[1][2])
        parts += ["", "  classes that moved (baseline -> candidate; top 10)",
                  table(["signature/output", "baseline", "candidate", "examples"],
                        [[f"{o.signature}/{o.output}", b, c, n] for o, (b, c, n)
                         in moved[:10]], indent="  ")]
    for e in report.errors:
        parts.append(f"  {e['signature']}: rejected by both {e['both']}, baseline only "
                     f"{e['baseline_only']}, candidate only {e['candidate_only']} examples"
                     + (f" ({e['first_error']})" if e["first_error"] else ""))
    for key, why in report.skipped.items():
        parts.append(f"  skipped {key}: {why}")
    parts += ["", "  result: " + ("OK, the candidate answers like the baseline" if report.ok
                                  else "DIFFERENT: " + "; ".join(report.failures()[:3]))]
    return "\n".join(parts)
