"""A measuring process: TensorFlow configured like TF Serving, one fresh child per job.

The optimizer's own process has loaded, frozen and compared models for minutes, and
runs TensorFlow configured for that (see ``loader.configure_for_optimizing``); numbers
users compare with TF Serving must come from a process configured like the server.
A fresh ``python`` per measurement would spend most of its time importing TensorFlow,
so one helper process imports it once and forks a child per job (nothing TensorFlow
runs in the helper before the fork, so the children start clean, and a child's peak
RSS includes the imported runtime, like a real server's would).

A job is a JSON object naming the function that runs it, ``"run": "module:function"``;
the function takes the job and returns a JSON-able dict. The stages that measure
(``stages.coldstart``, ``stages.benchmark``) bring their own jobs.

    results = run_jobs([{"run": "serving_opt.stages.coldstart:cold_start_job", ...}],
                       timeout=600, what="the cold-start measurement",
                       skip="--nocold_start")
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader


def run_jobs(jobs: list[dict], timeout: float, *, what: str, skip: str) -> list[dict]:
    """Runs the jobs in one measuring process, each in a forked child; their results in
    order. A job that raised has ``{"error": "<type>: <first line>"}`` for a result.

    ``what`` names the measurement and ``skip`` the flag that skips it, for the error
    when the process itself fails or overruns ``timeout`` seconds.

    Example:
        >>> run_jobs([{"run": "serving_opt.stages.coldstart:cold_start_job", ...}], 600,
        ...          what="the cold-start measurement", skip="--nocold_start")[0]["load_seconds"]
        0.8
    """
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
            [sys.executable, "-m", "serving_opt.measuring"], input=payload,
            capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired as e:
        raise ServingOptError(f"{what} took over {timeout:.0f} s",
                              f"rerun with {skip} to skip it") from e
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != len(jobs):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"{what} failed: {tail}",
                              f"rerun with {skip} to skip it, and report this")
    return [json.loads(line) for line in lines]


def rss_bytes(field: str) -> int:
    """This process's memory figure ``field`` of /proc/self/status (``VmRSS``: now,
    ``VmHWM``: the peak), in bytes; 0 where there is none.

    Example:
        >>> rss_bytes("VmHWM") >= rss_bytes("VmRSS") > 0
        True
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _function(name: str):
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def serve_jobs() -> int:
    """The helper process: import TensorFlow once, then fork one child per job on stdin."""
    import tensorflow  # noqa: F401 - imported before forking, so children start warm

    from serving_opt.errors import first_line

    for line in sys.stdin:
        job = json.loads(line)
        try:
            # Imported here, before the fork: a child measures the job, not the import.
            run = _function(job["run"])
        except Exception as e:  # noqa: BLE001 - reported to the parent as data
            print(json.dumps({"error": f"{type(e).__name__}: {first_line(e)}"[:1000]}),
                  flush=True)
            continue
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                result = run(job)
            except BaseException as e:  # noqa: BLE001 - reported to the parent as data
                # TF's first line is often only a header ("Graph execution error:"); the
                # cause (an Assert's own message, a missing shard) must reach the user.
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
    sys.exit(serve_jobs())
