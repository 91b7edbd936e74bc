"""Rows/s of ``serving-opt compare`` on Beam's DaskRunner at 1, 2 and 4 worker processes.

    .venv/bin/python benchmarks/compare_dask.py --examples=20000 --shards=8

The sample classifier against itself, ``--examples`` tf.Examples in ``--shards`` TFRecord
shards, each worker count on a fresh ``distributed.LocalCluster`` (one thread per worker);
DirectRunner in one process for reference. Prints a Markdown table (docs/compare.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()

    from distributed import LocalCluster
    from test_compare import write_shards

    from serving_opt import samples
    from serving_opt.compare import CompareOptions, compare

    root = tempfile.mkdtemp(prefix="compare-dask-")
    model = samples.build_classifier(os.path.join(root, "m", "1"))
    write_shards(os.path.join(root, "ex"), samples.sample_examples(args.examples, seed=1),
                 args.shards)
    pattern = os.path.join(root, "ex", "part-*.tfrecord")
    rows = []
    direct = compare(model, model, pattern)
    rows.append(("DirectRunner, in process", direct.examples, direct.seconds,
                 direct.examples_per_second))
    for n in (int(w) for w in args.workers.split(",")):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster:
            r = compare(model, model, pattern, CompareOptions(
                runner="DaskRunner",
                pipeline_args=(f"--dask_client_address={cluster.scheduler_address}",)))
        assert r.examples == direct.examples and r.ok
        rows.append((f"DaskRunner, {n} worker(s)", r.examples, r.seconds,
                     r.examples_per_second))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {args.examples} examples in "
          f"{args.shards} shards")
    print("| runner | examples | pipeline s | examples/s |\n|---|---|---|---|")
    for name, n, s, rate in rows:
        print(f"| {name} | {n:,} | {s:.1f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
