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
from typing import TYPE_CHECKING

import numpy as np

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader
from serving_opt.tune.curve import SPREAD_QUANTILES, ConcurrencyPoint, LatencyCurve
from serving_opt.tune.settings import ThreadSettings

if TYPE_CHECKING:  # the measuring child (maybe another TensorFlow's venv) imports less
    from serving_opt.serving import runtime as runtime_lib

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
    # The environment the server runs TensorFlow with (backends.runtime_env; None: unset): the
    # measuring process gets it too.
    env: tuple[tuple[str, str | None], ...] = ()


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
    env: tuple[tuple[str, str | None], ...] = ()  # the server's environment, as measured with
    kernels: str = ""  # "oneDNN" or "Eigen": TensorFlow's CPU kernels, as measured with

    def curve(self, threads: ThreadSettings) -> LatencyCurve:
        for curve in self.curves:
            if curve.threads == threads:
                return curve
        raise KeyError(f"no curve measured for {threads}")

    def to_dict(self) -> dict:
        return asdict(self)


def profile(model_dir: str, signature: str, plan: ProfilePlan,
            progress: Callable[[str], None] | None = None,
            timeout: float = 3600.0,
            runtime: runtime_lib.Runtime | None = None) -> ModelProfile:
    """Measures ``signature`` of ``model_dir`` under each thread setting of ``plan``.

    ``runtime``: the interpreter (and so the TensorFlow) the measuring process runs,
    the server's (``--serving_version``); None: this one.

    Example:
        >>> profile("/models/clf/1", "serving_default", ProfilePlan()).curves[0].batch_sizes
        (1, 2, 4, 8, 16, 32)
    """
    say = progress or (lambda m: None)
    job = {"model": os.path.abspath(model_dir), "signature": signature,
           "plan": asdict(plan)}
    from serving_opt import sandbox

    elsewhere = runtime is not None and not runtime.is_current
    if sandbox.inside() and not elsewhere and all(os.environ.get(k) == v for k, v in plan.env):
        # The sandboxed worker imported TensorFlow (with the server's environment) and
        # has run nothing yet: fork it per setting rather than import TensorFlow again.
        results = [_fork_and_measure({**job, "threads": asdict(t)}, say)
                   for t in plan.thread_settings]
    else:
        results = _in_helper(job, plan, say, timeout, runtime)
    for result in results:
        if "error" in result:
            raise ServingOptError(f"measuring the model failed: {result['error']}",
                                  "check that the model serves (serving-opt validate), "
                                  "or pass inputs it accepts with --examples")
    # Every thread setting on the first one's machine speed (see probe()).
    reference = results[0].get("probe_s") or 0.0
    curves = tuple(_curve(result, reference) for result in results)
    first = results[0]
    return ModelProfile(signature=signature, curves=curves,
                        merge_s_per_row=first.get("merge_s_per_row", 0.0),
                        input_bytes_per_row=first.get("input_bytes_per_row", 0),
                        output_bytes_per_row=first.get("output_bytes_per_row", 0),
                        inputs_source=first.get("inputs_source", ""),
                        env=tuple(tuple(pair) for pair in first.get("env", ())),
                        kernels=first.get("kernels", ""))


def _in_helper(job: dict, plan: ProfilePlan, say: Callable[[str], None],
               timeout: float, runtime: runtime_lib.Runtime | None = None) -> list[dict]:
    """The jobs in a helper process that imports TensorFlow with TF Serving's defaults
    (``runtime``'s interpreter when given)."""
    # A runtime venv has no serving_opt installed: runtime.env puts this checkout on its
    # PYTHONPATH, as for the local server it runs.
    base = runtime.env() if runtime is not None else dict(os.environ)
    # Measured with TensorFlow's defaults, as TF Serving runs (whatever this process chose),
    # or as the proving server runs it.
    env = loader.with_runtime_defaults({**base, "TF_CPP_MIN_LOG_LEVEL": "3"},
                                       dict(plan.env))
    payload = "".join(json.dumps({**job, "threads": asdict(t)}) + "\n"
                      for t in plan.thread_settings)
    python = runtime.python if runtime is not None else sys.executable
    process = subprocess.Popen([python, "-m", "serving_opt.tune.profile"],
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
    return results


def _curve(result: dict, reference_probe_s: float = 0.0) -> LatencyCurve:
    rows = result["sizes"]
    probe_s = result.get("probe_s") or 0.0
    f = reference_probe_s / probe_s if reference_probe_s > 0 and probe_s > 0 else 1.0
    # The curve is the median run; the jitter (run time over median) gives the rest,
    # stalls included, so the model's mean run is the measured mean.
    return LatencyCurve(
        threads=ThreadSettings(**result["threads"]),
        batch_sizes=tuple(r["batch_size"] for r in rows),
        median_s=tuple(f * r["p50_s"] for r in rows),
        mean_s=tuple(f * r["mean_s"] for r in rows),
        p99_s=tuple(f * r["p99_s"] for r in rows),
        cpu_s=tuple(f * r["cpu_s"] for r in rows),
        runs=tuple(r["runs"] for r in rows),
        spread=tuple(result["spread"]),
        concurrency=tuple(ConcurrencyPoint(c["batch_size"], c["concurrent"],
                                           f * c["median_s"], tuple(c.get("spread", ())))
                          for c in result["concurrency"]),
        load_seconds=result["load_seconds"], probe_s=probe_s, speed_scale=f)


# ------------------------------------------------------------- the measuring process


def feeds_for(model_dir: str, signature: str, rows: int, tags: Sequence[str],
              examples: str | None, seed: int) -> tuple[dict, str]:
    """One feed of ``rows`` rows (by input alias), from ``examples`` or synthesized; and
    where it came from. Shared with the request builder so both send the same data.

    Example:
        >>> feeds_for("/models/clf/1", "serving_default", 4, ("serve",), None, 0)[1]
        'synthesized'
    """
    from serving_opt.savedmodel import examples as examples_lib
    from serving_opt.savedmodel import inputs as inputs_lib

    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    if signature not in meta_graph.signature_def:
        raise ServingOptError(f"signature {signature!r} is not in {model_dir} (it has "
                              f"{sorted(loader.serving_signatures(meta_graph))})",
                              "pass one of those with --signature_name")
    user = examples_lib.read_examples_file(examples) if examples else None
    examples_lib.check_examples(user)
    feeds = inputs_lib.signature_feeds(meta_graph, model_dir, user=user, seed=seed)
    made = feeds(signature, rows)
    return inputs_lib.resize_batch(made.batches, rows), made.source


def _rows(feed: dict, start: int, count: int) -> dict:
    return {alias: value[start:start + count] if np.ndim(value) else value
            for alias, value in feed.items()}


def _say(message: str) -> None:
    print(_PROGRESS + message, flush=True)


_PROBE = np.random.default_rng(0).random(50_000)


def probe() -> float:
    """Seconds of a fixed single-threaded piece of work (a sort): how fast this machine
    runs us right now. Each thread setting is measured in a window of its own; on a
    shared machine windows differ, and the probe puts them on one scale."""
    start = time.perf_counter()
    np.sort(_PROBE)
    return time.perf_counter() - start


def _interleaved(calls: dict[int, Callable[[], object]], seconds: float, min_runs: int,
                 max_runs: int, max_latency_s: float
                 ) -> tuple[dict[int, tuple[list[float], float]], float]:
    """({size: (wall seconds of each run, CPU seconds per run)}, the probe's median):
    sizes run in rounds, a probe in each round.

    A shared machine's stalls come and go; one size after the other would hand a stall
    to whichever size was running, bending the curve. Round-robin (one run of each size
    per round, after two warmup runs each) spreads them over every size alike. A size
    whose first runs already exceed ``max_latency_s`` is dropped, with every larger one.
    """
    probes: list[float] = []
    times: dict[int, list[float]] = {n: [] for n in calls}
    cpu: dict[int, float] = {n: 0.0 for n in calls}
    for call in calls.values():
        call()
        call()
    active = sorted(calls)
    budget = seconds * len(active)
    begin = time.perf_counter()
    while active:
        probes.append(probe())
        for n in list(active):
            c0, t0 = time.process_time(), time.perf_counter()
            calls[n]()
            times[n].append(time.perf_counter() - t0)
            cpu[n] += time.process_time() - c0
        if max_latency_s and len(times[active[0]]) == min_runs:
            over = [n for n in active if float(np.median(times[n])) > max_latency_s]
            if over:
                # Keep the first size over the bound (the curve needs its end), drop the rest.
                active = [n for n in active if n <= over[0]]
                for n in [m for m in calls if m > over[0]]:
                    times.pop(n, None)
        done = len(times[active[0]])
        if done >= max_runs or (done >= min_runs and time.perf_counter() - begin >= budget):
            break
    return {n: (t, cpu[n] / len(t)) for n, t in times.items() if t}, float(np.median(probes))


def _concurrent(call: Callable[[], object], k: int, seconds: float,
                min_runs: int) -> list[float]:
    """Seconds of each run when ``k`` threads run back to back at once."""
    times: list[list[float]] = [[] for _ in range(k)]
    start_line = threading.Barrier(k)
    stop_at: list[float] = []

    def worker(i: int) -> None:
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
    return [x for row in times for x in row]


def _slowdown(call: Callable[[], object], k: int, seconds: float, min_runs: int,
              rounds: int = 3) -> tuple[float, list[float]]:
    """How much longer a run takes with ``k`` at once than alone: the median ratio of
    alternating slices (alone, k at once, alone, ...), so a stall hits both sides; and
    the spread of the runs at once (run time over their slice's median, at
    SPREAD_QUANTILES)."""
    ratios, spread = [], []
    for _ in range(rounds):
        alone = [_one(call) for _ in range(max(2, min_runs))]
        together = _concurrent(call, k, seconds / rounds, min_runs)
        middle = max(float(np.median(together)), 1e-9)
        ratios.append(middle / max(float(np.median(alone)), 1e-9))
        spread += [t / middle for t in together]
    return float(np.median(ratios)), [float(np.percentile(spread, q))
                                      for q in SPREAD_QUANTILES]


def _one(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _measure(job: dict, _say: Callable[[str], None]) -> dict:
    import tensorflow as tf

    from serving_opt.serving.model_server.servable import onednn_kernels_on

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

    _say(f"  [{label}] loaded in {load_seconds:.2f} s; timing batch sizes "
         f"{', '.join(map(str, sizes))} in rounds")
    timed, probe_s = _interleaved({n: runner(n) for n in sizes}, plan["seconds"],
                                  plan["min_runs"], plan["max_runs"], plan["max_latency_s"])
    _say(f"  [{label}] machine-speed probe: {probe_s * 1000:.2f} ms")
    measured, ratios = [], []
    for n in sorted(timed):
        times, cpu = timed[n]
        median = float(np.median(times))
        measured.append({"batch_size": n, "mean_s": float(np.mean(times)), "p50_s": median,
                         "p99_s": float(np.percentile(times, 99)), "cpu_s": cpu,
                         "runs": len(times)})
        ratios += [t / median for t in times]
        _say(f"  [{label}] batch {n}: {median * 1000:.2f} ms (median of {len(times)}), "
             f"{n / median:,.0f} rows/s")
    concurrency = []
    for n, k in plan["concurrency"]:
        if n not in timed:
            continue
        factor, together = _slowdown(runner(n), k, plan["seconds"], plan["min_runs"])
        concurrency.append({"batch_size": n, "concurrent": k,
                            "median_s": factor * float(np.median(timed[n][0])),
                            "spread": together})
        _say(f"  [{label}] {k} runs of batch {n} at once: {factor:.2f}x as long each")
    merge = _merge_cost(session, fetches, feed_tensors, aliases, feed, measured[-1]["batch_size"])
    spread = [float(np.percentile(ratios, q)) for q in SPREAD_QUANTILES]
    session.close()
    return {"threads": asdict(threads), "load_seconds": load_seconds, "sizes": measured,
            "concurrency": concurrency, "spread": spread, "inputs_source": source,
            "probe_s": probe_s, **merge,
            # What the measuring process ran TensorFlow with, for the report to show.
            "env": [[name, os.environ.get(name)] for name, _ in plan["env"]],
            "kernels": "oneDNN" if onednn_kernels_on() else "Eigen"}


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


def _fork_and_measure(job: dict, say: Callable[[str], None]) -> dict:
    """One thread setting in a forked child: TensorFlow's thread pools are made by the
    child's first session, with the child's settings."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            result = _measure(job, say)
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
    return json.loads(text) if text else {"error": f"the measuring process died (status "
                                                   f"{status})"}


def _serve() -> int:
    """The helper: import TensorFlow once, fork a child per job (one thread setting)."""
    loader.quiet_tensorflow_import()
    for line in sys.stdin:
        print(json.dumps(_fork_and_measure(json.loads(line), _say)), flush=True)
    return 0


if __name__ == "__main__":
    loader.keep_plotting_out()
    sys.exit(_serve())
