"""Cold start: how TF Serving meets a model, measured in fresh processes, before and after.

TF Serving users feel the load time, the first request after a load, and the memory of
the serving process as much as steady-state latency. A graph full of large constants can
load 12x slower, stall its first request for a minute (the load-time Grappler folds it)
and need 9x the memory, while steady-state p50 does not move. So each model is loaded
in a process of its own, the way the server loads it (session loader, Grappler on),
and these numbers are taken: load seconds (restore, init op and the warmup requests
TF Serving replays before the version is AVAILABLE), first-request seconds, and the
process's peak and steady (held after the first request) resident memory, with the
runtime's own share, plus both at every stage of the load (``stages``), which says where
a peak comes from.

Memory is measured without ``/proc`` (the sandbox's is synthetic): the peak with
``getrusage`` (the kernel's VmHWM), what the process holds with a forked probe
(``measuring.held_rss_bytes``).

The measurements run in a measuring process (``serving_opt.core.measuring``: TensorFlow
imported once, a forked child per measurement). A child's RSS counts the runtime's
private memory it inherits, but not TensorFlow's shared-library code pages (a fork does
not copy those page-table entries), which a server process holds (~315 MiB for TF 2.21):
absolute figures are that much below a server's, alike before and after, so a ratio here
flatters a memory saving. ``savedmodel.native_load`` measures as tensorflow_model_server
holds memory (benchmarks/int8_memory.py). The before and after models are measured
alternately, in separate children.

    report = measure("exports/1", "models/clf/.staging", frozenset({"serve"}),
                     "serving_default", feeds)
    report.ratio("load_seconds")        # after / before
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from serving_opt.core import measuring
from serving_opt.errors import ServingOptError


@dataclass(frozen=True)
class ColdStart:
    """One model loaded in a fresh process.

    ``stages`` holds ``(stage, peak bytes so far, bytes held)`` after each stage of the
    load (``runtime``, ``graph``, ``restore``, ``init op``, ``warmup``, ``first
    request``): a stage whose peak is far above what it holds made a transient copy.
    """

    load_seconds: float
    first_request_seconds: float
    peak_rss_bytes: int  # the serving process's peak, runtime included
    runtime_rss_bytes: int  # the same process before loading: TensorFlow alone
    # Held after the first request (what a Kubernetes limit sees between requests);
    # 0 when not measured (reports written before it was).
    steady_rss_bytes: int = 0
    stages: tuple = ()


@dataclass(frozen=True)
class ColdStartReport:
    """Both models' cold start, each the median over ``rounds`` fresh processes."""

    before: ColdStart
    after: ColdStart
    rounds: int

    def ratio(self, measure: str) -> float:
        """``after / before`` for one of ColdStart's fields."""
        before = getattr(self.before, measure)
        return getattr(self.after, measure) / before if before else 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def measure(reference_dir: str, candidate_dir: str, tags: frozenset[str], signature_key: str,
            feeds: dict, rounds: int = 1, timeout: float = 1800.0) -> ColdStartReport:
    """Loads each model ``rounds`` times in fresh processes, alternating, and runs one request.

    ``feeds`` maps the signature's input aliases to numpy arrays (one request).
    """
    scratch = tempfile.mkdtemp(prefix="serving-opt-coldstart-")
    try:
        feeds_path = os.path.join(scratch, "feeds.pkl")
        with open(feeds_path, "wb") as f:
            pickle.dump(feeds, f)
        jobs = []
        for _ in range(rounds):
            for which, path in (("before", reference_dir), ("after", candidate_dir)):
                jobs.append((which, {"run": "serving_opt.stages.coldstart:cold_start_job",
                                     "model": os.path.abspath(path), "tags": sorted(tags),
                                     "signature": signature_key, "feeds": feeds_path}))
        results = measuring.run_jobs([job for _, job in jobs], timeout,
                                     what="the cold-start measurement", skip="--nocold_start")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    by_side: dict[str, list[dict]] = {"before": [], "after": []}
    for (which, _), result in zip(jobs, results):
        if "error" in result:
            side = "original" if which == "before" else "optimized"
            raise ServingOptError(
                f"the {side} model failed its cold-start load: {result['error']}",
                "rerun with --nocold_start to skip the cold-start gate, and report this",
            )
        by_side[which].append(result)

    def summarize(side: list[dict]) -> ColdStart:
        return summarize_runs(side)

    return ColdStartReport(summarize(by_side["before"]), summarize(by_side["after"]), rounds)


def summarize_runs(runs: list[dict]) -> ColdStart:
    """The median of each measure over :func:`cold_start_job` results of one model."""
    stages = []
    names = [name for name, _, _ in runs[0].get("stages", ())]
    for i, name in enumerate(names):
        rows = [r["stages"][i] for r in runs if len(r.get("stages", ())) > i]
        stages.append((name, int(_median([row[1] for row in rows])),
                       int(_median([row[2] for row in rows]))))
    return ColdStart(
        load_seconds=_median([r["load_seconds"] for r in runs]),
        first_request_seconds=_median([r["first_request_seconds"] for r in runs]),
        peak_rss_bytes=int(_median([r["peak_rss_bytes"] for r in runs])),
        runtime_rss_bytes=int(_median([r["runtime_rss_bytes"] for r in runs])),
        steady_rss_bytes=int(_median([r.get("steady_rss_bytes", 0) for r in runs])),
        stages=tuple(stages),
    )


def cold_start_job(job: dict) -> dict:
    """In a measuring process's child: load like TF Serving (session loader: graph,
    restore, init op; then the model's warmup requests), answer one request, and report
    the times and the memory after each stage.
    """
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl

    from serving_opt.savedmodel import warmup_replay

    stages: list[tuple[str, int, int]] = []
    overhead = [0.0]  # seconds the probes took: not the model's load time

    def stage(name: str) -> None:
        began = time.perf_counter()
        stages.append((name, measuring.peak_rss_bytes(), measuring.held_rss_bytes()))
        overhead[0] += time.perf_counter() - began

    stage("runtime")
    with open(job["feeds"], "rb") as f:
        feeds = pickle.load(f)
    graph = tf.Graph()
    # Default session options, as TF Serving's: Grappler runs at load, on the first run.
    sess = tf.compat.v1.Session(graph=graph)
    start = time.perf_counter()
    # tf.compat.v1.saved_model.loader.load's own three steps, apart, so the memory of
    # each is seen (the restore and the init op are where a table's copies would be).
    model_loader = loader_impl.SavedModelLoader(job["model"])
    with graph.as_default():
        saver, _ = model_loader.load_graph(graph, job["tags"])
        stage("graph")
        model_loader.restore_variables(sess, saver)
        stage("restore")
        model_loader.run_init_ops(sess, job["tags"])
        stage("init op")
    meta_graph = model_loader.get_meta_graph_def_from_tags(job["tags"])
    # TF Serving replays assets.extra/tf_serving_warmup_requests before the version is
    # AVAILABLE: its time is load time, and the first request comes after it.
    replayed = warmup_replay.replay(sess, meta_graph, job["model"])
    if replayed:
        stage("warmup")
    load_seconds = time.perf_counter() - start - overhead[0]
    sig = meta_graph.signature_def[job["signature"]]
    feed = {sig.inputs[alias].name: np.asarray(value) for alias, value in feeds.items()}
    fetch = [sig.outputs[alias].name for alias in sorted(sig.outputs)]
    start = time.perf_counter()
    sess.run(fetch, feed)
    first = time.perf_counter() - start
    stage("first request")
    return {"load_seconds": load_seconds, "first_request_seconds": first,
            "peak_rss_bytes": stages[-1][1], "runtime_rss_bytes": stages[0][2],
            "steady_rss_bytes": stages[-1][2], "warmup_records": replayed,
            "stages": [list(s) for s in stages]}
