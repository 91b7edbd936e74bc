"""One optimize, from two checkouts of serving_opt, side by side: same model, same figures?

    python benchmarks/before_after.py BEFORE_CHECKOUT AFTER_CHECKOUT INPUT_DIR WORK_DIR \
        [--quantize=none,int8] [--rounds=1]

For a refactoring that must not change behaviour. Each round runs ``serving-opt optimize``
(``--json``) from each checkout (its own ``serving_opt`` first on ``PYTHONPATH``) in a fresh
process, alternating the order, for every ``--quantize`` mode. It prints, per mode, the
wall time and the peak memory of the whole process tree (largest single process and the
total: the sandboxed worker is a grandchild) of each, their ratio, whether the published
models are byte-identical file by file, and which report figures differ (sizes, node
counts, stage notes, parity summary, attempts; timings are measurements and are left out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_cost import _tree_rss  # noqa: E402

# Report keys holding measurements (noise), not results of the optimization.
TIMING_KEYS = ("seconds", "latency", "p50", "p90", "p99", "rss", "cold_start", "benchmark",
               "load", "first_request", "ratio", "wall", "elapsed", "ms")

PATH_KEYS = ("output_dir", "input_dir", "model_base", "output_base", "warmup_file")
MEASURING_STAGES = ("cold_start", "benchmark", "confirm")


def run_once(checkout: str, src: str, out: str, quantize: str) -> tuple[float, int, int, dict]:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    report = out + ".json"
    command = [sys.executable, "-m", "serving_opt.cli", "optimize",
               f"--input_dir={os.path.abspath(src)}",
               f"--output_base={out}", f"--quantize={quantize}", f"--report={report}",
               "--noprogress"]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, cwd=os.path.dirname(out))
    single = total = 0
    while process.poll() is None:
        one, all_ = _tree_rss(process.pid)
        single, total = max(single, one), max(total, all_)
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        tail = process.stderr.read().decode()[-2000:]
        raise SystemExit(f"{checkout} ({quantize}) failed: {tail}")
    with open(report) as f:
        return wall, single, total, json.load(f)


def digest(tree: str) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``tree``; a SavedModel proto by its
    deterministic serialization (map fields are written in any order otherwise)."""
    found = {}
    for folder, _, files in os.walk(tree):
        for name in files:
            path = os.path.join(folder, name)
            h = hashlib.sha256()
            if name == "saved_model.pb":
                from tensorflow.core.protobuf import saved_model_pb2

                with open(path, "rb") as f:
                    proto = saved_model_pb2.SavedModel.FromString(f.read())
                h.update(proto.SerializeToString(deterministic=True))
                found[os.path.relpath(path, tree)] = h.hexdigest()
                continue
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            found[os.path.relpath(path, tree)] = h.hexdigest()
    return found


def figures(report, prefix: str = "") -> dict[str, object]:
    """The report flattened to path -> value, measurements and paths left out."""
    flat: dict[str, object] = {}
    if isinstance(report, dict):
        for key, value in report.items():
            if any(t in key.lower() for t in TIMING_KEYS) or key in PATH_KEYS:
                continue
            if key == "stages":  # the measuring stages' notes are measurements
                value = [v for v in value if v.get("name") not in MEASURING_STAGES]
            flat.update(figures(value, f"{prefix}{key}."))
    elif isinstance(report, list):
        for i, value in enumerate(report):
            flat.update(figures(value, f"{prefix}{i}."))
    else:
        flat[prefix.rstrip(".")] = report
    return flat


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("input_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--quantize", default="none,int8")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    for mode in args.quantize.split(","):
        runs: dict[str, list] = {"before": [], "after": []}
        for i in range(args.rounds):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for which in order:
                out = os.path.join(os.path.abspath(args.work_dir), f"{which}-{mode}")
                runs[which].append(run_once(getattr(args, which), args.input_dir, out, mode))
                print(f"{mode} round {i + 1} {which}: {runs[which][-1][0]:.1f} s",
                      file=sys.stderr)
        published = {w: runs[w][-1][3].get("output_dir") for w in runs}
        same_files = digest(published["before"]) == digest(published["after"])
        fb, fa = figures(runs["before"][-1][3]), figures(runs["after"][-1][3])
        differing = sorted(k for k in set(fb) | set(fa) if fb.get(k) != fa.get(k))

        def med(which: str, k: int, runs: dict = runs) -> float:
            return statistics.median(r[k] for r in runs[which])

        print(f"\n--quantize={mode} ({args.rounds} round(s) each)")
        print("measure                        before        after  after/before")
        for label, k, scale, unit in (("optimize wall time (median)", 0, 1, "s"),
                                      ("peak RSS, largest process", 1, 2**20, "MiB"),
                                      ("peak RSS, all processes", 2, 2**20, "MiB")):
            b, a = med("before", k) / scale, med("after", k) / scale
            print(f"{label:28s} {b:9.1f} {unit:3s} {a:9.1f} {unit:3s} {a / b:.3f}x")
        print("published files identical (saved_model.pb by content): "
              + ("yes" if same_files else "NO"))
        print(f"report figures that differ: {len(differing)}")
        for key in differing[:40]:
            print(f"  {key}: {fb.get(key)!r} -> {fa.get(key)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
