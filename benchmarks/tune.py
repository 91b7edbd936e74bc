"""The tuning case of ``make bench``: ``serving-opt tune`` on MobileNetV2 and the text
classifier, 16 closed-loop clients sending one row each, p99 under 250 ms.

    make bench                                        # runs this after compare.py
    .venv/bin/python benchmarks/tune.py --kinds=mobilenet_v2 --duration=15
    .venv/bin/python benchmarks/tune.py --kinds=text_classifier --full   # the ~1 GB case

The models:

* ``mobilenet_v2``: Keras MobileNetV2 at 160x160, alpha 0.5 (weights=None, trained-looking
  batch norms, 1000 logits), exported with ``model.export``: the issue's image model;
* ``text_classifier``: the Estimator-like text classifier (``samples``), quick by default
  (vocab 200,000 x 64), ``--full`` the ~1 GB one (1,000,000 x 256), with real requests
  (words of its vocabulary) as ``--examples``.

Each is tuned into ``<out>/tune/<model>/`` (every file ``tune`` writes), and
``<out>/tune.md`` sums up: TF Serving's default (no batching), upstream's batching
defaults and every grid setting as measured, the recommended one's ratios and the share
of the in-process ceiling reached. The bar (measured on a 2-core machine, through the
local server): for MobileNetV2 the recommended setting >= 1.6x the default with p99
under 250 ms and >= 1.3x upstream's defaults; for the text classifier the same
comparison, reported, and p99 under the SLO; ``--strict`` exits 1 when a model misses it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from serving_opt.tune.options import BudgetOptions, ModelOptions, ServerOptions, WorkloadOptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # independent_load beside it

KINDS = ("mobilenet_v2", "text_classifier")
TEXT_QUICK = {"vocab_size": 200_000, "embedding_dim": 64, "optimizer_slots": False}
TEXT_FULL = {"vocab_size": 1_000_000, "embedding_dim": 256, "optimizer_slots": False}


def build_mobilenet(export_dir: str, seed: int = 0) -> None:
    """MobileNetV2 160x160, alpha 0.5, logits; batch norms with trained-looking statistics."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(input_shape=(160, 160, 3), alpha=0.5, weights=None,
                                           classes=1000, classifier_activation=None)
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            channels = layer.moving_mean.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.2, channels),
                               rng.normal(0, 0.2, channels), rng.uniform(0.5, 2.0, channels)])
    model.export(export_dir, verbose=False)


def build(kind: str, models_dir: str, full: bool) -> tuple[str, str, str | None]:
    """(name, model base, examples file) of one case, built once and kept."""
    from serving_opt import samples

    if kind == "mobilenet_v2":
        name = "mobilenet_v2_160_a050"
        base = os.path.join(models_dir, name)
        if not os.path.exists(os.path.join(base, "1", "saved_model.pb")):
            print(f"building {name} ...", file=sys.stderr, flush=True)
            build_mobilenet(os.path.join(base, "1"))
        return name, base, None
    options = TEXT_FULL if full else TEXT_QUICK
    name = "text_classifier_full" if full else "text_classifier"
    base = os.path.join(models_dir, name)
    if not os.path.exists(os.path.join(base, "1", "saved_model.pb")):
        print(f"building {name} ...", file=sys.stderr, flush=True)
        samples.build("text_classifier", os.path.join(base, "1"), **options)
    examples = os.path.join(models_dir, f"{name}-examples.tfrecord")
    if not os.path.exists(examples):
        import tensorflow as tf

        with tf.io.TFRecordWriter(examples) as writer:
            for record in samples.text_examples(256, seed=1,
                                                vocab_size=options["vocab_size"]):
                writer.write(record)
    return name, base, examples


def summarize(name: str, report, throughput_bar: bool = True) -> tuple[list[str], bool]:
    """Markdown lines for one model, and whether it met the bar (the throughput ratios
    only with ``throughput_bar``)."""
    from serving_opt.tune import findings
    from serving_opt.tune.tuner import DEFAULT_LABEL, UPSTREAM_LABEL

    def point(label: str):
        return next((p for p in report.proven if p.label == label and p.workload == "closed"
                     and p.protocol == "grpc"), None)

    # What tune hands the user: the recommended setting (the measured best within the SLO).
    chosen = report.recommended_label
    default, upstream, tuned = point(DEFAULT_LABEL), point(UPSTREAM_LABEL), point(chosen)
    from serving_opt.tune.report import headline

    kernels = f", {report.profile.kernels} kernels" if report.profile.kernels else ""
    lines = [f"## {name}", "", f"server: {report.server}{kernels}", ""]
    if report.hardware is not None:  # the result holds for this machine only
        lines += [f"hardware: {report.hardware.describe()}", ""]
    lines += [f"**{line}**" for line in headline(report)]
    decision = report.decision
    if decision is not None:
        # The interleaved rounds that decided against upstream's defaults, side by side.
        labels = list(decision.rows)
        lines += ["", "| round | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for i in range(len(decision.rows[labels[0]])):
            lines.append(f"| {i + 1} | " + " | ".join(
                f"{decision.rows[k][i]:,.0f} rows/s, p99 {decision.p99_ms[k][i]:.0f} ms"
                for k in labels) + " |")
        lines += ["", f"{decision.tuned_label} / upstream: {decision.vs_upstream.describe()}; "
                  f"load generator {decision.generator_cpu_share:.0%} of the cores"]
    lines += ["", "| settings | rows/s | p99 ms |", "|---|---|---|"]
    for p in report.proven:
        if p.workload == "closed" and p.protocol == "grpc":
            lines.append(f"| {p.label}: {p.settings.describe()} | "
                         f"{p.measured.rows_per_second:,.0f} | {p.measured.p99_ms:.1f} |")
    ok = False
    if default and upstream and tuned:
        x_default = tuned.measured.rows_per_second / default.measured.rows_per_second
        # Upstream's defaults are measured first and last: their mean, against drift.
        upstream_rows, _ = findings.upstream_rows_per_second(report, "closed", "grpc")
        x_upstream = tuned.measured.rows_per_second / upstream_rows
        under = tuned.measured.p99_ms <= report.objective.slo_p99_ms
        ok = under and (not throughput_bar or (x_default >= 1.6 and x_upstream >= 1.3))
        lines += ["", f"recommended ({chosen}): {x_default:.2f}x the default, "
                  f"{x_upstream:.2f}x upstream's defaults, p99 {tuned.measured.p99_ms:.0f} ms "
                  f"({'under' if under else 'over'} {report.objective.slo_p99_ms:g} ms); "
                  f"the bar {'met' if ok else 'NOT met'}"]
    lines += ["", *[f"- {finding}" for finding in report.findings], ""]
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--full", action="store_true",
                        help="the ~1 GB text classifier (run it on a quiet machine)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--slo_p99_ms", type=float, default=250.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--profile_seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of upstream's defaults against the best")
    parser.add_argument("--protocols", default="grpc,rest")
    parser.add_argument("--out", default="build/bench")
    parser.add_argument("--independent_seconds", type=float, default=20.0,
                        help="seconds per point of the independent check of the written "
                        "files (benchmarks/independent_load.py); 0 skips it")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a model misses the issue's bar")
    args = parser.parse_args(argv)
    from serving_opt.tune import TuneOptions, tune

    models_dir = os.path.join(args.out, "models")
    lines = ["# serving-opt tune", "",
             f"{args.clients} closed-loop clients, one row per request, p99 SLO "
             f"{args.slo_p99_ms:g} ms, {args.duration:g} s per proven point.", ""]
    all_ok = True
    summary = {}
    for kind in [k for k in args.kinds.split(",") if k]:
        name, base, examples = build(kind, models_dir, args.full)
        options = TuneOptions(
            workload=WorkloadOptions(clients=args.clients, slo_p99_ms=args.slo_p99_ms),
            model=ModelOptions(examples=examples),
            budget=BudgetOptions(duration=args.duration,
                                 profile_seconds=args.profile_seconds,
                                 rounds=args.rounds),
            serving=ServerOptions(protocols=tuple(args.protocols.split(","))))
        report = tune(base, options, lambda m: print(m, file=sys.stderr, flush=True),
                      output_dir=os.path.join(args.out, "tune", name))
        more, ok = summarize(name, report, throughput_bar=kind == "mobilenet_v2")
        lines += more
        if args.independent_seconds > 0 and report.ok:
            # The written files, served as a user serves them, under a generator that is
            # not the project's: no batching, upstream's defaults and the set side by side.
            import independent_load

            from serving_opt.tune import payloads

            requests, _ = payloads.build(report.model_dir, report.model_name, report.version,
                                         report.signature, 1, examples=examples)
            results = independent_load.compare(
                base, report.model_name, os.path.join(args.out, "tune", name),
                list(requests), clients=args.clients, seconds=args.independent_seconds,
                rounds=args.rounds)
            more, bar = independent_load.summary_lines(results, args.slo_p99_ms)
            upstream_chosen = report.recommendation.basis.startswith("upstream's batching")
            lines += ["### the written files under an independent load generator", "", *more,
                      "", f"the issue's bar (>=1.6x no batching, >=1.1x upstream's defaults, "
                      "or upstream's defaults recommended with the reason): "
                      f"{'met' if bar or upstream_chosen else 'NOT met'}", ""]
            ok = ok and (bar or upstream_chosen)
        all_ok = all_ok and ok
        summary[name] = {"ok": ok, "report": os.path.join(args.out, "tune", name, "tune.json")}
    path = os.path.join(args.out, "tune.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "tune-summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\n".join(lines))
    print(f"wrote {path}", file=sys.stderr)
    return 1 if args.strict and not all_ok else 0


if __name__ == "__main__":
    sys.exit(main())
