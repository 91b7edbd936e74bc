"""The sandbox's cost on one optimize, sandboxed and not, side by side in one run.

    python benchmarks/sandbox_cost.py INPUT_DIR WORK_DIR [--rounds=3]

Each round runs ``optimize`` (no steady-state benchmark) in a fresh process twice,
alternating: sandboxed (the default), and with bubblewrap treated as unavailable and
``allow_unsandboxed`` given, so the only difference is the sandbox. It prints the median
wall time of each and their ratio, and the peak memory of the whole process tree (the
sandboxed run's worker is a grandchild, which a whole-process timer does not see),
sampled every 0.1 s: the largest single process and the largest total.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # process_tree beside it
from process_tree import tree_stats  # noqa: E402

RUN = """
import shutil, sys
from serving_opt import OptimizeOptions, optimize, sandbox
mode, src, out = sys.argv[1:4]
if mode == "unsandboxed":
    sandbox.unavailable_reason = lambda: "switched off for the measurement"
shutil.rmtree(out, ignore_errors=True)
optimize(src, out, OptimizeOptions(benchmark_runs=0, allow_unsandboxed=mode == "unsandboxed"))
"""


def _tree_rss(root: int) -> tuple[int, int]:
    """(largest single RSS, total RSS) in bytes of ``root`` and its descendants."""
    page = os.sysconf("SC_PAGE_SIZE")
    sizes = [int(stat[21]) * page for stat in tree_stats(root).values() if len(stat) > 21]
    return max(sizes, default=0), sum(sizes)


def run_once(mode: str, src: str, out: str) -> tuple[float, int, int]:
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", RUN, mode, src, out],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    single = total = 0
    while process.poll() is None:
        one, all_ = _tree_rss(process.pid)
        single, total = max(single, one), max(total, all_)
        time.sleep(0.1)
    if process.returncode != 0:
        raise SystemExit(f"{mode} run failed (exit {process.returncode})")
    return time.perf_counter() - start, single, total


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("input_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, int, int]]] = {"sandboxed": [], "unsandboxed": []}
    for i in range(args.rounds):
        order = ["sandboxed", "unsandboxed"] if i % 2 == 0 else ["unsandboxed", "sandboxed"]
        for mode in order:
            results[mode].append(run_once(mode, args.input_dir,
                                          os.path.join(args.work_dir, mode)))
            print(f"round {i + 1} {mode}: {results[mode][-1][0]:.1f} s", file=sys.stderr)
    for mode in results:
        shutil.rmtree(os.path.join(args.work_dir, mode), ignore_errors=True)

    def med(mode: str, k: int) -> float:
        return statistics.median(r[k] for r in results[mode])

    print("measure                      sandboxed   unsandboxed  ratio")
    for label, k, scale, unit in (("wall time (median)", 0, 1, "s"),
                                  ("peak RSS, largest process", 1, 2**20, "MiB"),
                                  ("peak RSS, all processes", 2, 2**20, "MiB")):
        a, b = med("sandboxed", k) / scale, med("unsandboxed", k) / scale
        print(f"{label:28s} {a:9.1f} {unit:3s} {b:9.1f} {unit:3s} {a / b:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
