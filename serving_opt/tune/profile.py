"""Measure the model as TF Serving runs it: latency per batch size, per thread setting.

TF Serving loads a model with the session loader (Grappler on, at load and first run)
into a session configured by ``--tensorflow_intra_op_parallelism`` /
``--tensorflow_inter_op_parallelism``. TensorFlow sizes its thread pools once per
process, from the first session's configuration, so each thread setting is measured
in a **fresh process**: one helper process imports TensorFlow once and forks a child
per setting before any session exists (as ``stages/coldstart`` does). Each child:

1. loads the model like the server (timed);
2. builds one request's worth of inputs per row from ``--examples`` when given, else
   synthesized from the signature (``savedmodel.inputs``), grown to every batch size;
3. runs the signature back to back at each batch size for ``seconds`` (after two
   warmup runs): mean, p50, p99 and CPU time per run, and every run's time over the
   mean (the jitter);
4. runs k copies at once (k threads, one session, as concurrent requests or batch
   threads do) at a few batch sizes: how much overlapping runs slow each other;
5. times what the batching session adds per row: merging single-row inputs into one
   batch and splitting the outputs back.

Sizes whose single run already exceeds the latency objective are not measured further
up (no batch that size can meet it).

Example:
    >>> result = profile("/models/mnv2/1", "serving_default", ProfilePlan(
    ...     batch_sizes=(1, 2, 4, 8), thread_settings=(ThreadSettings(),)))
    >>> result.curves[0].rows_per_second(8) > result.curves[0].rows_per_second(1)
    True
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader
from serving_opt.tune.curve import SPREAD_QUANTILES, ConcurrencyPoint, LatencyCurve
from serving_opt.tune.settings import ThreadSettings

_PROGRESS = "@@profile@@ "


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure.

    ``concurrency`` lists (batch_size, k) points; ``max_latency_s`` stops measuring
    larger batches once one run takes longer (0: measure all).

    Example:
        >>> ProfilePlan(batch_sizes=(1, 2, 4), concurrency=((1, 2), (4, 2)))
    """

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    thread_settings: tuple[ThreadSettings, ...] = (ThreadSettings(),)
    concurrency: tuple[tuple[int, int], ...] = ()
    seconds: float = 1.0
    min_runs: int = 3
    max_runs: int = 2000
    max_latency_s: float = 0.0
    tags: tuple[str, ...] = ("serve",)
    examples: str | None = None
    seed: int = 0


@dataclass(frozen=True)
class ModelProfile:
    """The curves of every thread setting, and what the batcher adds per row.

    Example:
        >>> profile.best_curve(16).threads
        ThreadSettings(intra_op=0, inter_op=0)
    """

    signature: str
    curves: tuple[LatencyCurve, ...]
    merge_s_per_row: float = 0.0
    input_bytes_per_row: int = 0
    output_bytes_per_row: int = 0
    inputs_source: str = ""

    def curve(self, threads: ThreadSettings) -> LatencyCurve:
        for curve in self.curves:
            if curve.threads == threads:
                return curve
        raise KeyError(f"no curve measured for {threads}")

    def to_dict(self) -> dict:
        return asdict(self)


def profile(model_dir: str, signature: str, plan: ProfilePlan,
            progress: Callable[[str], None] | None = None,
            timeout: float = 3600.0) -> ModelProfile:
    """Measures ``signature`` of ``model_dir`` under each thread setting of ``plan``.

    Example:
        >>> profile("/models/clf/1", "serving_default", ProfilePlan()).curves[0].batch_sizes
        (1, 2, 4, 8, 16, 32)
    """
    say = progress or (lambda m: None)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # Measured with TensorFlow's defaults, as TF Serving runs (whatever this process chose).
    for name, value in loader.RUNTIME_DEFAULTS.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    job = {"model": os.path.abspath(model_dir), "signature": signature,
           "plan": asdict(plan)}
    payload = "".join(json.dumps({**job, "threads": asdict(t)}) + "\n"
                      for t in plan.thread_settings)
    process = subprocess.Popen([sys.executable, "-m", "serving_opt.tune.profile"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, text=True)
    results: list[dict] = []
    stderr_lines: list[str] = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        process.stdin.write(payload)
        process.stdin.close()
        for line in process.stdout:
            if line.startswith(_PROGRESS):
                say(line[len(_PROGRESS):].rstrip("\n"))
            elif line.startswith("{"):
                results.append(json.loads(line))
            if time.monotonic() > deadline:
                raise ServingOptError(f"measuring the model took over {timeout:.0f} s",
                                      "lower --profile_seconds or --max_batch_size_bound")
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0 or len(results) != len(plan.thread_settings):
        tail = ([ln.strip() for ln in stderr_lines if ln.strip()] or ["no output"])[-1]
        raise ServingOptError(f"measuring the model failed: {tail}",
                              "rerun with --verbosity=1, and report this")
    for result in results:
        if "error" in result:
            raise ServingOptError(f"measuring the model failed: {result['error']}",
                                  "check that the model serves (serving-opt validate), "
                                  "or pass inputs it accepts with --examples")
    curves = tuple(_curve(result) for result in results)
    first = results[0]
    return ModelProfile(signature=signature, curves=curves,
                        merge_s_per_row=first.get("merge_s_per_row", 0.0),
                        input_bytes_per_row=first.get("input_bytes_per_row", 0),
                        output_bytes_per_row=first.get("output_bytes_per_row", 0),
                        inputs_source=first.get("inputs_source", ""))


def _curve(result: dict) -> LatencyCurve:
    rows = result["sizes"]
    return LatencyCurve(
        threads=ThreadSettings(**result["threads"]),
        batch_sizes=tuple(r["batch_size"] for r in rows),
        mean_s=tuple(r["mean_s"] for r in rows),
        p50_s=tuple(r["p50_s"] for r in rows),
        p99_s=tuple(r["p99_s"] for r in rows),
        cpu_s=tuple(r["cpu_s"] for r in rows),
        runs=tuple(r["runs"] for r in rows),
        spread=tuple(result["spread"]),
        concurrency=tuple(ConcurrencyPoint(**c) for c in result["concurrency"]),
        load_seconds=result["load_seconds"])


# ------------------------------------------------------------- the measuring process


def feeds_for(model_dir: str, signature: str, rows: int, tags: Sequence[str],
              examples: str | None, seed: int) -> tuple[dict, str]:
    """One feed of ``rows`` rows (by input alias), from ``examples`` or synthesized; and
    where it came from. Shared with the request builder so both send the same data.

    Example:
        >>> feeds_for("/models/clf/1", "serving_default", 4, ("serve",), None, 0)[1]
        'synthesized'
    """
    from serving_opt.savedmodel import inputs as inputs_lib

    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    if signature not in meta_graph.signature_def:
        raise ServingOptError(f"signature {signature!r} is not in {model_dir} (it has "
                              f"{sorted(loader.serving_signatures(meta_graph))})",
                              "pass one of those with --signature_name")
    user = inputs_lib.read_examples_file(examples) if examples else None
    inputs_lib.check_examples(user)
    feeds = inputs_lib.signature_feeds(meta_graph, model_dir, user=user, seed=seed)
    made = feeds(signature, rows)
    return inputs_lib.resize_batch(made.batches, rows), made.source


def _rows(feed: dict, start: int, count: int) -> dict:
    return {alias: value[start:start + count] if np.ndim(value) else value
            for alias, value in feed.items()}


def _say(message: str) -> None:
    print(_PROGRESS + message, flush=True)


def _time_runs(call: Callable[[], object], seconds: float, min_runs: int,
               max_runs: int) -> tuple[list[float], float]:
    """(wall seconds of each run, CPU seconds per run) of back-to-back runs."""
    for _ in range(2):
        call()
    times: list[float] = []
    cpu_start = time.process_time()
    begin = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs
                                     or time.perf_counter() - begin < seconds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times, (time.process_time() - cpu_start) / len(times)


def _concurrent(call: Callable[[], object], k: int, seconds: float,
                min_runs: int) -> float:
    """Mean seconds per run when ``k`` threads run back to back at once."""
    times: list[list[float]] = [[] for _ in range(k)]
    start_line = threading.Barrier(k)
    stop_at: list[float] = []

    def worker(i: int) -> None:
        call()
        start_line.wait()
        if i == 0:
            stop_at.append(time.perf_counter() + seconds)
        while not stop_at:
            time.sleep(0)
        while len(times[i]) < min_runs or time.perf_counter() < stop_at[0]:
            begin = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - begin)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for row in times for x in row]
    return float(np.mean(flat))


def _measure(job: dict) -> dict:
    import tensorflow as tf

    plan = job["plan"]
    threads = ThreadSettings(**job["threads"])
    label = threads.describe()
    sizes = sorted(set(plan["batch_sizes"]))
    largest = max([sizes[-1], *[n for n, _ in plan["concurrency"]]])
    feed, source = feeds_for(job["model"], job["signature"], largest, plan["tags"],
                             plan["examples"], plan["seed"])
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=threads.session_config())
    begin = time.perf_counter()
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(session, plan["tags"], job["model"])
    load_seconds = time.perf_counter() - begin
    signature = meta_graph.signature_def[job["signature"]]
    aliases = sorted(feed)
    feed_tensors = [graph.get_tensor_by_name(signature.inputs[a].name) for a in aliases]
    fetches = [signature.outputs[a].name for a in sorted(signature.outputs)]

    def runner(rows: int):
        part = _rows(feed, 0, rows)
        fn = session.make_callable(fetches, feed_list=feed_tensors)
        values = [part[a] for a in aliases]
        return lambda: fn(*values)

    _say(f"  [{label}] loaded in {load_seconds:.2f} s")
    measured, ratios = [], []
    for n in sizes:
        times, cpu = _time_runs(runner(n), plan["seconds"], plan["min_runs"], plan["max_runs"])
        mean = float(np.mean(times))
        measured.append({"batch_size": n, "mean_s": mean,
                         "p50_s": float(np.percentile(times, 50)),
                         "p99_s": float(np.percentile(times, 99)), "cpu_s": cpu,
                         "runs": len(times)})
        ratios += [t / mean for t in times]
        _say(f"  [{label}] batch {n}: {mean * 1000:.2f} ms, {n / mean:,.0f} rows/s")
        if plan["max_latency_s"] and mean > plan["max_latency_s"]:
            break
    concurrency = []
    for n, k in plan["concurrency"]:
        if n > measured[-1]["batch_size"] and n not in sizes:
            continue
        mean = _concurrent(runner(n), k, plan["seconds"], plan["min_runs"])
        concurrency.append({"batch_size": n, "concurrent": k, "mean_s": mean})
        _say(f"  [{label}] {k} runs of batch {n} at once: {mean * 1000:.2f} ms each")
    merge = _merge_cost(session, fetches, feed_tensors, aliases, feed, measured[-1]["batch_size"])
    spread = [float(np.percentile(ratios, q)) for q in SPREAD_QUANTILES]
    session.close()
    return {"threads": asdict(threads), "load_seconds": load_seconds, "sizes": measured,
            "concurrency": concurrency, "spread": spread, "inputs_source": source, **merge}


def _merge_cost(session, fetches, feed_tensors, aliases, feed: dict, rows: int) -> dict:
    """Seconds per row the batching session spends merging one-row inputs and splitting
    outputs (numpy concatenate and split, as both servers copy), and bytes per row."""
    rows = max(1, min(rows, 64))
    singles = [_rows(feed, i, 1) for i in range(rows)]
    outputs = session.run(fetches, dict(zip(feed_tensors, [_rows(feed, 0, rows)[a]
                                                           for a in aliases])))
    begin = time.perf_counter()
    repeats = 5
    for _ in range(repeats):
        for alias in aliases:
            if np.ndim(singles[0][alias]):
                np.concatenate([s[alias] for s in singles])
        for value in outputs:
            if np.ndim(value):
                np.split(np.asarray(value), rows)
    per_row = (time.perf_counter() - begin) / repeats / rows
    in_bytes = sum(_nbytes(singles[0][a]) for a in aliases)
    out_bytes = sum(_nbytes(np.asarray(v)) // max(1, rows) for v in outputs)
    return {"merge_s_per_row": per_row, "input_bytes_per_row": int(in_bytes),
            "output_bytes_per_row": int(out_bytes)}


def _nbytes(value) -> int:
    value = np.asarray(value)
    if value.dtype == object:
        return int(sum(len(v) for v in value.ravel()))
    return int(value.nbytes)


def _serve() -> int:
    """The helper: import TensorFlow once, fork a child per job (one thread setting)."""
    loader.quiet_tensorflow_import()
    for line in sys.stdin:
        job = json.loads(line)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                result = _measure(job)
            except BaseException as e:  # noqa: BLE001 - reported to the parent as data
                from serving_opt.errors import first_line

                text = e.one_line() if isinstance(e, ServingOptError) else first_line(e)
                result = {"error": f"{type(e).__name__}: {text}"[:1000]}
            with os.fdopen(write_fd, "w") as out:
                out.write(json.dumps(result))
            sys.stdout.flush()
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as got:
            text = got.read()
        _, status = os.waitpid(pid, 0)
        print(text or json.dumps({"error": f"the measuring process died (status {status})"}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
