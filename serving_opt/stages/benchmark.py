"""Side-by-side load time and latency of the original and the optimized model.

Machines are noisy, so the two are never timed in separate runs: both load in
one process, loads alternate (A B B A ...), and requests interleave with the order
flipped every iteration, so drift hits both equally. Sessions use the default
config, which runs Grappler at load just as TF Serving does: a gain reported here
is on top of what the server would do anyway.

The optimizer runs it in a measuring process (:func:`benchmark_in_fresh_process`,
``serving_opt.measuring``), configured like the server, not in its own.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from serving_opt import measuring
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader


@dataclass(frozen=True)
class Latency:
    """Request latency percentiles for one model at one batch size, in milliseconds."""

    batch_size: int
    p50_ms: float
    p99_ms: float
    runs: int


@dataclass(frozen=True)
class BenchmarkReport:
    """Before/after numbers measured in one run.

    Example:
        >>> report.speedup(32)
        1.4
    """

    signature: str
    load_seconds_before: float
    load_seconds_after: float
    before: tuple[Latency, ...]
    after: tuple[Latency, ...]

    def speedup(self, batch_size: int) -> float | None:
        """p50 before / p50 after at ``batch_size`` (above 1 means faster)."""
        b = next((x for x in self.before if x.batch_size == batch_size), None)
        a = next((x for x in self.after if x.batch_size == batch_size), None)
        if not a or not b or a.p50_ms <= 0:
            return None
        return b.p50_ms / a.p50_ms

    def to_dict(self) -> dict:
        return asdict(self)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def _timed_load(path: str, tags: frozenset[str]):
    start = time.perf_counter()
    sess, mg = loader.load_session(path, tags)
    return time.perf_counter() - start, sess, mg


def benchmark(
    before_dir: str,
    after_dir: str,
    tags: frozenset[str],
    signature_key: str,
    *,
    batch_sizes: Sequence[int] = (1, 32),
    runs: int = 100,
    loads: int = 3,
    seed: int = 0,
    warmup: int = 5,
    examples: str | None = None,
) -> BenchmarkReport:
    """Measures load time and p50/p99 latency of one signature, before vs. after.

    Example:
        >>> r = benchmark("build/sample/1", "build/optimized/1", frozenset({"serve"}),
        ...               "serving_default", runs=50)
        >>> [lat.batch_size for lat in r.after]
        [1, 32]
    """
    load_before: list[float] = []
    load_after: list[float] = []
    for i in range(max(1, loads)):
        order = [(before_dir, load_before), (after_dir, load_after)]
        for path, sink in (order if i % 2 == 0 else order[::-1]):
            seconds, sess, _ = _timed_load(path, tags)
            sink.append(seconds)
            sess.close()

    _, sess_a, mg_a = _timed_load(before_dir, tags)
    _, sess_b, mg_b = _timed_load(after_dir, tags)
    try:
        sig_a = mg_a.signature_def[signature_key]
        sig_b = mg_b.signature_def[signature_key]
        # The user's examples when given (a model may refuse synthesized inputs), grown
        # or cut to each batch size so the figure is for the batch it names.
        user = examples_lib.read_examples_file(examples) if examples else None
        feeds = inputs_lib.signature_feeds(mg_a, before_dir, user=user, seed=seed)
        before: list[Latency] = []
        after: list[Latency] = []
        for batch in batch_sizes:
            feed = inputs_lib.resize_batch(feeds(signature_key, batch).batches, batch)
            call_a = _callable(sess_a, sig_a, feed)
            call_b = _callable(sess_b, sig_b, feed)
            for _ in range(warmup):
                call_a()
                call_b()
            times_a: list[float] = []
            times_b: list[float] = []
            for i in range(runs):
                pair = [(call_a, times_a), (call_b, times_b)]
                for call, sink in (pair if i % 2 == 0 else pair[::-1]):
                    start = time.perf_counter()
                    call()
                    sink.append((time.perf_counter() - start) * 1000.0)
            before.append(Latency(batch, _percentile(times_a, 50), _percentile(times_a, 99), runs))
            after.append(Latency(batch, _percentile(times_b, 50), _percentile(times_b, 99), runs))
    finally:
        sess_a.close()
        sess_b.close()
    return BenchmarkReport(
        signature=signature_key,
        load_seconds_before=statistics.median(load_before),
        load_seconds_after=statistics.median(load_after),
        before=tuple(before),
        after=tuple(after),
    )


def _callable(session, signature_def, feed_by_alias: dict):
    """A prebuilt session callable, so the timing measures the graph, not Python feeding."""
    aliases = sorted(feed_by_alias)
    feed_tensors = [session.graph.get_tensor_by_name(signature_def.inputs[a].name)
                    for a in aliases]
    fetches = [signature_def.outputs[a].name for a in sorted(signature_def.outputs)]
    fn = session.make_callable(fetches, feed_list=feed_tensors)
    values = [feed_by_alias[a] for a in aliases]
    return lambda: fn(*values)


def benchmark_in_fresh_process(before_dir: str, after_dir: str, tags: frozenset[str],
                               signature_key: str, *, batch_sizes=(1, 32), runs: int = 100,
                               seed: int = 0, examples: str | None = None,
                               timeout: float = 3600.0) -> BenchmarkReport:
    """:func:`benchmark` run in a measuring process (``serving_opt.measuring``).

    The optimizer's own process has loaded, frozen and compared models for minutes,
    and runs TensorFlow configured for that (oneDNN's caching allocator off, so each
    model's memory is returned when its session closes); the numbers users compare
    with TF Serving come from a process configured like the server.

    Example:
        >>> benchmark_in_fresh_process("exports/1", "models/clf/1", frozenset({"serve"}),
        ...                            "serving_default", runs=50).speedup(32)
        1.3
    """
    (result,) = measuring.run_jobs([{
        "run": "serving_opt.stages.benchmark:benchmark_job",
        "before": os.path.abspath(before_dir), "after": os.path.abspath(after_dir),
        "tags": sorted(tags), "signature": signature_key, "batch_sizes": list(batch_sizes),
        "runs": runs, "seed": seed,
        "examples": os.path.abspath(examples) if examples else None}], timeout,
        what="the benchmark", skip="--benchmark_runs=0")
    if "error" in result:
        raise ServingOptError(f"the benchmark failed: {result['error']}",
                              "rerun with --benchmark_runs=0 to skip it")
    report = result["report"]
    return BenchmarkReport(
        signature=report["signature"],
        load_seconds_before=report["load_seconds_before"],
        load_seconds_after=report["load_seconds_after"],
        before=tuple(Latency(**lat) for lat in report["before"]),
        after=tuple(Latency(**lat) for lat in report["after"]),
    )


def benchmark_job(job: dict) -> dict:
    """In a measuring process's child: :func:`benchmark` on the job's arguments."""
    report = benchmark(job["before"], job["after"], frozenset(job["tags"]), job["signature"],
                       batch_sizes=tuple(job["batch_sizes"]), runs=job["runs"],
                       seed=job["seed"], examples=job.get("examples"))
    return {"report": asdict(report)}
