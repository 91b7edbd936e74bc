"""Before/after numbers for the sample models, measured side by side in one run each.

    make bench                                   # all kinds, 100 interleaved runs
    .venv/bin/python benchmarks/compare.py --kinds=classifier,mobilenet_v2 --runs=50
    .venv/bin/python benchmarks/compare.py --kinds=text_classifier --full   # the ~1 GB case

Each model is optimized with the default (lossless) settings; the optimizer's own
benchmark times the original and the optimized model in one process, loads alternating
and requests interleaved, and its cold start loads each of them ``--cold_start_rounds``
times in fresh processes (medians). This machine is noisy: ratios, not absolute times,
are the result. Prints one table of ratios and writes build/bench/summary.json.

``text_classifier`` is the big-model case, an Estimator-like DNN text classifier that
is mostly one embedding table (kept as a variable, not frozen: column "kept"). By
default it is built small and quick (vocab 200_000, dim 64, no optimizer slots:
~51 MB); ``--full`` builds the real case instead (vocab 1_000_000, dim 256: ~1 GB,
in its own directory ``text_classifier_full``). Run ``--full`` on a quiet machine.

Regression gate: every model is optimized with ``allow_regression=True`` so all the
numbers are collected, then checked with ``serving_opt.stages.regression`` at a 1.10
tolerance (cold load, first request, serving peak RSS, p50/p99 per batch size). Each
regression is printed with its model and measure, and the exit code is 1 if any
lossless optimization is worse anywhere (or fails), 0 otherwise. summary.json holds
``passed``, ``tolerance``, ``regressions`` (model -> lines) and ``models`` (model ->
full optimize report).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field

ALL_KINDS = ("classifier", "regressor", "convnet", "keras", "mobilenet_v2", "resnet50",
             "text_classifier")
TOLERANCE = 1.10  # serving_opt.stages.regression.DEFAULT_TOLERANCE, pinned for the bench
TEXT_QUICK = {"vocab_size": 200_000, "embedding_dim": 64, "optimizer_slots": False}
TEXT_FULL = {"vocab_size": 1_000_000, "embedding_dim": 256, "optimizer_slots": False}
HEADERS = ("model", "nodes", "size (after/before)", "load", "p50 b1", "p50 b32",
           "load (cold)", "first request", "peak RSS", "kept", "parity max abs diff")


@dataclass(frozen=True)
class Case:
    """One model of the bench: the sample kind, its directory name and build options."""

    kind: str
    name: str
    build_options: dict = field(default_factory=dict)


def cases(kinds: list[str], full: bool) -> list[Case]:
    """The models to run; text_classifier is quick unless ``full``.

    Example:
        >>> [c.name for c in cases(["classifier", "text_classifier"], full=True)]
        ['classifier', 'text_classifier_full']
    """
    out = []
    for kind in kinds:
        if kind != "text_classifier":
            out.append(Case(kind, kind))
        elif full:
            out.append(Case(kind, "text_classifier_full", TEXT_FULL))
        else:
            out.append(Case(kind, kind, TEXT_QUICK))
    return out


def build_model(case: Case, models_dir: str) -> tuple[str, str | None]:
    """Builds the sample once (kept between runs); returns (SavedModel dir, examples file).

    text_classifier gets real requests (words of its vocabulary) as a TFRecord: the
    synthesized ones would be all out of vocabulary.
    """
    from serving_opt import samples

    base = os.path.join(models_dir, case.name)
    source = os.path.join(base, "1")
    if not os.path.exists(os.path.join(source, "saved_model.pb")):
        print(f"building {case.name} ...", file=sys.stderr, flush=True)
        samples.build(case.kind, source, **case.build_options)
    if case.kind != "text_classifier":
        return source, None
    examples = os.path.join(base, "examples.tfrecord")
    if not os.path.exists(examples):
        write_tfrecord(samples.text_examples(64, seed=1,
                                             vocab_size=case.build_options["vocab_size"]),
                       examples)
    return source, examples


def write_tfrecord(records: list[bytes], path: str) -> str:
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


def row(name: str, result) -> list[str]:
    """One table row of after/before ratios for an optimize report."""
    from serving_opt import report

    b, cold = result.benchmark, result.cold_start
    p50 = {lat.batch_size: lat.p50_ms for lat in b.before} if b else {}
    p50_after = {lat.batch_size: lat.p50_ms for lat in b.after} if b else {}

    def cold_ratio(measure: str) -> str:
        if cold is None:
            return "-"
        return report.ratio(getattr(cold.before, measure), getattr(cold.after, measure))

    return [
        name,
        f"{result.nodes_before} -> {result.nodes_after}",
        f"{report.human_bytes(result.size_before.total)} -> "
        f"{report.human_bytes(result.size_after.total)} "
        f"({report.ratio(result.size_before.total, result.size_after.total)})",
        report.ratio(b.load_seconds_before, b.load_seconds_after) if b else "-",
        report.ratio(p50.get(1), p50_after.get(1)),
        report.ratio(p50.get(32), p50_after.get(32)),
        cold_ratio("load_seconds"),
        cold_ratio("first_request_seconds"),
        cold_ratio("peak_rss_bytes"),
        str(len(result.variables_kept)),
        f"{max(o.max_abs_diff for o in result.parity.outputs):.1e}",
    ]


@dataclass(frozen=True)
class Outcome:
    """One model's optimize: its report (partial when it failed) and its regressions."""

    name: str
    report: object | None
    regressions: list[str]
    failed: bool = False


def run_case(case: Case, args: argparse.Namespace) -> Outcome:
    """Optimizes one model, publishing even a regression so every number is collected.

    A failed optimize counts against the gate too: its error is the one line.
    """
    from serving_opt.errors import ServingOptError
    from serving_opt.optimizer import OptimizeOptions, optimize
    from serving_opt.stages import regression

    source, examples = build_model(case, os.path.join(args.out, "models"))
    print(f"optimizing {case.name} ...", file=sys.stderr, flush=True)
    options = OptimizeOptions(version=1, overwrite=True, benchmark_runs=args.runs,
                              examples=examples, cold_start_rounds=args.cold_start_rounds,
                              regression_tolerance=TOLERANCE, allow_regression=True)
    try:
        result = optimize(source, os.path.join(args.out, "optimized", case.name), options)
    except ServingOptError as e:
        return Outcome(case.name, e.report, [f"optimize failed: {e}"], failed=True)
    return Outcome(case.name, result,
                   regression.regressions(result.cold_start, result.benchmark, TOLERANCE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(ALL_KINDS))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cold_start_rounds", type=int, default=3,
                        help="fresh-process loads of each model, medians (default 3: noisy)")
    parser.add_argument("--full", action="store_true",
                        help="text_classifier at full size (~1 GB) instead of the quick one")
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    if args.cold_start_rounds < 1:
        parser.error("--cold_start_rounds must be at least 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    from serving_opt import report
    from serving_opt.stages import loader

    loader.quiet_tensorflow_import()
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # the samples' deprecated APIs
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    outcomes = [run_case(case, args) for case in cases(kinds, args.full)]
    print(report.table(HEADERS, [row(o.name, o.report) for o in outcomes if not o.failed]))
    print("(ratios are after/before: below 1.00x is smaller or faster; load and p50 are "
          "in-process, the cold ones fresh processes, medians of "
          f"{args.cold_start_rounds}; kept: variables not frozen)")
    found = {o.name: o.regressions for o in outcomes}
    passed = not any(found.values())
    summary = {"passed": passed, "tolerance": TOLERANCE, "regressions": found,
               "models": {o.name: report.to_jsonable(o.report) for o in outcomes}}
    path = report.write_json(summary, os.path.join(args.out, "summary.json"))
    print_gate(found)
    print(f"full reports: {path}")
    return 0 if passed else 1


def print_gate(found: dict[str, list[str]]) -> None:
    """The gate's verdict: every regression with its model, or that there is none."""
    bad = {name: lines for name, lines in found.items() if lines}
    if not bad:
        print(f"regression gate: passed (no measure worse than {TOLERANCE:.2f}x the original)")
        return
    print(f"regression gate: FAILED ({TOLERANCE:.2f}x tolerance)")
    for name, lines in bad.items():
        for line in lines:
            print(f"  {name}: {line}")


if __name__ == "__main__":
    sys.exit(main())
