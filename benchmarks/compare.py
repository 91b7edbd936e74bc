"""Before/after numbers for the sample models, measured side by side in one run each.

    make bench                                   # all kinds, 100 interleaved runs
    .venv/bin/python benchmarks/compare.py --kinds=classifier,mobilenet_v2 --runs=50

Each model is optimized with the default settings; the optimizer's own benchmark
times the original and the optimized model in one process, loads alternating and
requests interleaved (this machine is noisy: ratios, not absolute times, are the
result). Prints one table of ratios and writes build/bench/summary.json.
"""

from __future__ import annotations

import argparse
import os
import sys

ALL_KINDS = ("classifier", "regressor", "convnet", "keras", "mobilenet_v2", "resnet50")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(ALL_KINDS))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    from serving_opt import report, samples
    from serving_opt.optimizer import OptimizeOptions, optimize
    from serving_opt.stages import loader

    loader.quiet_tensorflow_import()
    rows, summary = [], {}
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        source = os.path.join(args.out, "models", kind, "1")
        if not os.path.exists(os.path.join(source, "saved_model.pb")):
            print(f"building {kind} ...", file=sys.stderr, flush=True)
            samples.build(kind, source)
        print(f"optimizing {kind} ...", file=sys.stderr, flush=True)
        result = optimize(source, os.path.join(args.out, "optimized", kind),
                          OptimizeOptions(version=1, overwrite=True, benchmark_runs=args.runs))
        b = result.benchmark
        summary[kind] = report.to_jsonable(result)
        p50 = {lat.batch_size: lat.p50_ms for lat in b.before}
        p50_after = {lat.batch_size: lat.p50_ms for lat in b.after}
        rows.append([
            kind,
            f"{result.nodes_before} -> {result.nodes_after}",
            f"{report.human_bytes(result.size_before.total)} -> "
            f"{report.human_bytes(result.size_after.total)} "
            f"({report.ratio(result.size_before.total, result.size_after.total)})",
            f"{report.ratio(b.load_seconds_before, b.load_seconds_after)}",
            f"{report.ratio(p50[1], p50_after[1])}",
            f"{report.ratio(p50[32], p50_after[32])}",
            f"{max(o.max_abs_diff for o in result.parity.outputs):.1e}",
        ])
    print(report.table(["model", "nodes", "size (after/before)", "load", "p50 b1", "p50 b32",
                        "parity max abs diff"], rows))
    print("(ratios are after/before: below 1.00x is smaller or faster)")
    path = report.write_json(summary, os.path.join(args.out, "summary.json"))
    print(f"full reports: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
