"""Measure the model as TF Serving runs it: latency per batch size, per thread setting.

TF Serving sizes TensorFlow's thread pools once per process, so each thread setting is
measured in a fresh process (a helper imports TensorFlow once and forks a child per
setting). Each child loads the model as the server does, builds inputs from
``--examples`` or the signature, and times the batch sizes in rounds (one run of each
per round) so a stall of a shared machine hits every size alike. Sizes whose run
already misses the latency bound are not measured further up. The curves feed the
grid (``grid``): they choose which settings are worth a server; they predict nothing.
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
from serving_opt.savedmodel import loader, tf_process
from serving_opt.tune.settings import ThreadSettings

if TYPE_CHECKING:  # the measuring child (maybe another TensorFlow's venv) imports less
    from serving_opt.serving import runtime as runtime_lib

_PROGRESS = "@@profile@@ "


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure.

    ``max_latency_s`` stops measuring larger batches once one run takes longer (0:
    measure all).
    """

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    thread_settings: tuple[ThreadSettings, ...] = (ThreadSettings(),)
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
class LatencyCurve:
    """One thread setting's measured session runs: the median seconds per batch size."""

    threads: ThreadSettings
    batch_sizes: tuple[int, ...]
    median_s: tuple[float, ...]
    runs: tuple[int, ...] = ()
    load_seconds: float = 0.0

    def seconds(self, rows: int) -> float:
        """The median run of ``rows`` rows (a measured size; KeyError otherwise)."""
        if rows not in self.batch_sizes:
            raise KeyError(f"batch size {rows} was not measured")
        return self.median_s[self.batch_sizes.index(rows)]

    def rows_per_second(self, rows: int) -> float:
        return rows / max(self.seconds(rows), 1e-12)


@dataclass(frozen=True)
class ModelProfile:
    """The curves of every thread setting, and what they were measured with."""

    signature: str
    curves: tuple[LatencyCurve, ...]
    inputs_source: str = ""
    env: tuple[tuple[str, str | None], ...] = ()  # the server's environment, as measured with
    kernels: str = ""  # "oneDNN" or "Eigen": TensorFlow's CPU kernels, as measured with

    def curve(self, threads: ThreadSettings) -> LatencyCurve:
        for curve in self.curves:
            if curve.threads == threads:
                return curve
        raise KeyError(f"no curve measured for {threads}")


def profile(model_dir: str, signature: str, plan: ProfilePlan,
            progress: Callable[[str], None] | None = None,
            timeout: float = 3600.0,
            runtime: runtime_lib.Runtime | None = None) -> ModelProfile:
    """Measures ``signature`` of ``model_dir`` under each thread setting of ``plan``.

    ``runtime``: the interpreter (and so the TensorFlow) the measuring process runs,
    the server's (``--serving_version``); None: this one.
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
    curves = tuple(LatencyCurve(ThreadSettings(**r["threads"]),
                                tuple(x["batch_size"] for x in r["sizes"]),
                                tuple(x["p50_s"] for x in r["sizes"]),
                                tuple(x["runs"] for x in r["sizes"]), r["load_seconds"])
                   for r in results)
    first = results[0]
    return ModelProfile(signature=signature, curves=curves,
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
    env = tf_process.with_runtime_defaults({**base, "TF_CPP_MIN_LOG_LEVEL": "3"},
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


# ------------------------------------------------------------- the measuring process


def feeds_for(model_dir: str, signature: str, rows: int, tags: Sequence[str],
              examples: str | None, seed: int) -> tuple[dict, str]:
    """One feed of ``rows`` rows (by input alias), from ``examples`` or synthesized; and
    where it came from. Shared with the request builder so both send the same data.
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


def _interleaved(calls: dict[int, Callable[[], object]], seconds: float, min_runs: int,
                 max_runs: int, max_latency_s: float) -> dict[int, list[float]]:
    """{size: wall seconds of each run}: sizes run in rounds.

    A shared machine's stalls come and go; one size after the other would hand a stall
    to whichever size was running, bending the curve. Round-robin (one run of each size
    per round, after two warmup runs each) spreads them over every size alike. A size
    whose first runs already exceed ``max_latency_s`` is dropped, with every larger one.
    """
    times: dict[int, list[float]] = {n: [] for n in calls}
    for call in calls.values():
        call()
        call()
    active = sorted(calls)
    budget = seconds * len(active)
    begin = time.perf_counter()
    while active:
        for n in list(active):
            t0 = time.perf_counter()
            calls[n]()
            times[n].append(time.perf_counter() - t0)
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
    return {n: t for n, t in times.items() if t}


def _measure(job: dict, _say: Callable[[str], None]) -> dict:
    import tensorflow as tf

    from serving_opt.model_server.servable import onednn_kernels_on

    plan = job["plan"]
    threads = ThreadSettings(**job["threads"])
    label = threads.describe()
    sizes = sorted(set(plan["batch_sizes"]))
    feed, source = feeds_for(job["model"], job["signature"], sizes[-1], plan["tags"],
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
    timed = _interleaved({n: runner(n) for n in sizes}, plan["seconds"], plan["min_runs"],
                         plan["max_runs"], plan["max_latency_s"])
    measured = []
    for n in sorted(timed):
        median = float(np.median(timed[n]))
        measured.append({"batch_size": n, "p50_s": median, "runs": len(timed[n])})
        _say(f"  [{label}] batch {n}: {median * 1000:.2f} ms (median of {len(timed[n])}), "
             f"{n / median:,.0f} rows/s")
    session.close()
    return {"threads": asdict(threads), "load_seconds": load_seconds, "sizes": measured,
            "inputs_source": source,
            # What the measuring process ran TensorFlow with, for the report to show.
            "env": [[name, os.environ.get(name)] for name, _ in plan["env"]],
            "kernels": "oneDNN" if onednn_kernels_on() else "Eigen"}


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
    tf_process.quiet_tensorflow_import()
    for line in sys.stdin:
        print(json.dumps(_fork_and_measure(json.loads(line), _say)), flush=True)
    return 0


if __name__ == "__main__":
    tf_process.keep_plotting_out()
    sys.exit(_serve())
