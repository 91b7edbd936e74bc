"""Cold start: how TF Serving meets a model, measured in fresh processes, before and after.

TF Serving users feel the load time, the first request after a load, and the memory of
the serving process as much as steady-state latency. A graph full of large constants can
load 12x slower, stall its first request for a minute (the load-time Grappler folds it)
and need 9x the memory, while steady-state p50 does not move. So each model is loaded
in a process of its own, the way the server loads it (session loader, Grappler on),
and three numbers are taken: load seconds, first-request seconds, and the peak RSS of
the process.

A fresh ``python`` per measurement would spend most of its time importing TensorFlow,
so one helper process imports it once and forks a child per measurement (nothing
TensorFlow runs in the helper before the fork, so the children start clean). Each
child's peak RSS includes the imported runtime, like a real server's would; the
before and after models are measured alternately, in separate children.

    report = measure("exports/1", "models/clf/.staging", frozenset({"serve"}),
                     "serving_default", feeds)
    report.ratio("load_seconds")        # after / before
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader


@dataclass(frozen=True)
class ColdStart:
    """One model loaded in a fresh process.

    Example:
        >>> ColdStart(0.8, 0.02, 700 << 20, 450 << 20).peak_rss_bytes
        734003200
    """

    load_seconds: float
    first_request_seconds: float
    peak_rss_bytes: int  # the serving process's peak, runtime included
    runtime_rss_bytes: int  # the same process before loading: TensorFlow alone


@dataclass(frozen=True)
class ColdStartReport:
    """Both models' cold start, each the median over ``rounds`` fresh processes."""

    before: ColdStart
    after: ColdStart
    rounds: int

    def ratio(self, measure: str) -> float:
        """``after / before`` for one of ColdStart's fields.

        Example:
            >>> report.ratio("peak_rss_bytes")
            0.42
        """
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

    Example:
        >>> r = measure("build/sample/1", "build/opt/1", frozenset({"serve"}),
        ...             "serving_default", {"inputs": examples})
        >>> r.after.load_seconds < r.before.load_seconds
        True
    """
    scratch = tempfile.mkdtemp(prefix="serving-opt-coldstart-")
    try:
        feeds_path = os.path.join(scratch, "feeds.pkl")
        with open(feeds_path, "wb") as f:
            pickle.dump(feeds, f)
        jobs = []
        for _ in range(rounds):
            for which, path in (("before", reference_dir), ("after", candidate_dir)):
                jobs.append((which, {"model": os.path.abspath(path), "tags": sorted(tags),
                                     "signature": signature_key, "feeds": feeds_path}))
        results = _run_jobs([job for _, job in jobs], timeout)
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
        return ColdStart(
            load_seconds=_median([r["load_seconds"] for r in side]),
            first_request_seconds=_median([r["first_request_seconds"] for r in side]),
            peak_rss_bytes=int(_median([r["peak_rss_bytes"] for r in side])),
            runtime_rss_bytes=int(_median([r["runtime_rss_bytes"] for r in side])),
        )

    return ColdStartReport(summarize(by_side["before"]), summarize(by_side["after"]), rounds)


def _run_jobs(jobs: list[dict], timeout: float) -> list[dict]:
    """Runs the jobs in one helper process (imports TF once, forks per job)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # Measure with TensorFlow's defaults, as TF Serving runs, whatever the optimizer
    # process chose for itself (see loader.configure_for_optimizing).
    for name, value in loader.RUNTIME_DEFAULTS.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    payload = "".join(json.dumps(job) + "\n" for job in jobs)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "serving_opt.stages.coldstart"], input=payload,
            capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired as e:
        raise ServingOptError(f"the cold-start measurement took over {timeout:.0f} s",
                              "rerun with --nocold_start to skip it") from e
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != len(jobs):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"the cold-start measurement failed: {tail}",
                              "rerun with --nocold_start to skip it, and report this")
    return [json.loads(line) for line in lines]


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def benchmark_in_fresh_process(before_dir: str, after_dir: str, tags: frozenset[str],
                               signature_key: str, *, batch_sizes=(1, 32), runs: int = 100,
                               seed: int = 0, examples: str | None = None,
                               timeout: float = 3600.0):
    """The steady-state benchmark (``stages.benchmark``) run in a measuring process.

    The optimizer's own process has loaded, frozen and compared models for minutes,
    and runs TensorFlow configured for that (oneDNN's caching allocator off, so each
    model's memory is returned when its session closes); the numbers users compare
    with TF Serving come from a process configured like the server.

    Example:
        >>> benchmark_in_fresh_process("exports/1", "models/clf/1", frozenset({"serve"}),
        ...                            "serving_default", runs=50).speedup(32)
        1.3
    """
    from serving_opt.stages.benchmark import BenchmarkReport, Latency

    (result,) = _run_jobs([{
        "kind": "benchmark", "before": os.path.abspath(before_dir),
        "after": os.path.abspath(after_dir), "tags": sorted(tags), "signature": signature_key,
        "batch_sizes": list(batch_sizes), "runs": runs, "seed": seed,
        "examples": os.path.abspath(examples) if examples else None}], timeout)
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


def _one_job(job: dict) -> dict:
    """In a forked child: one measurement job (cold start, or the steady-state benchmark)."""
    if job.get("kind") == "benchmark":
        from serving_opt.stages.benchmark import benchmark

        report = benchmark(job["before"], job["after"], frozenset(job["tags"]),
                           job["signature"], batch_sizes=tuple(job["batch_sizes"]),
                           runs=job["runs"], seed=job["seed"], examples=job.get("examples"))
        return {"report": asdict(report)}
    return _cold_start(job)


def _cold_start(job: dict) -> dict:
    """Load like TF Serving, answer one request, report the peak RSS."""
    import numpy as np
    import tensorflow as tf

    runtime_rss = _rss_bytes("VmRSS")
    with open(job["feeds"], "rb") as f:
        feeds = pickle.load(f)
    graph = tf.Graph()
    # Default session options, as TF Serving's: Grappler runs at load, on the first run.
    sess = tf.compat.v1.Session(graph=graph)
    start = time.perf_counter()
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, job["tags"], job["model"])
    load_seconds = time.perf_counter() - start
    sig = meta_graph.signature_def[job["signature"]]
    feed = {sig.inputs[alias].name: np.asarray(value) for alias, value in feeds.items()}
    fetch = [sig.outputs[alias].name for alias in sorted(sig.outputs)]
    start = time.perf_counter()
    sess.run(fetch, feed)
    first = time.perf_counter() - start
    return {"load_seconds": load_seconds, "first_request_seconds": first,
            "peak_rss_bytes": _rss_bytes("VmHWM"), "runtime_rss_bytes": runtime_rss}


def _serve_jobs() -> int:
    """The helper process: import TensorFlow once, then fork one child per job on stdin."""
    import tensorflow  # noqa: F401 - imported before forking, so children start warm

    for line in sys.stdin:
        job = json.loads(line)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                result = _one_job(job)
            except BaseException as e:  # noqa: BLE001 - reported to the parent as data
                # TF's first line is often only a header ("Graph execution error:"); the
                # cause (an Assert's own message, a missing shard) must reach the user.
                from serving_opt.errors import first_line

                result = {"error": f"{type(e).__name__}: {first_line(e)}"[:1000]}
            with os.fdopen(write_fd, "w") as out:
                out.write(json.dumps(result))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as got:
            text = got.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"error": f"the measuring process died (status {status})"})
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve_jobs())
