"""Original vs lossless, int8, fp16 and the GTT quantize_weights recipe, side by side.

    make bench                                    # the three models, every mode
    .venv/bin/python benchmarks/compare.py --runs=50
    .venv/bin/python benchmarks/compare.py --kinds=wide_deep --modes=lossless,int8
    .venv/bin/python benchmarks/compare.py --kinds=text_classifier --full   # the ~1 GB case

The models (``--kinds``, default all three):

* ``text_classifier``: the embedding-heavy case, an Estimator-like DNN text classifier
  that is mostly one embedding table. Quick by default (vocab 200_000 x 64, no optimizer
  slots: ~51 MB); ``--full`` builds the real case (vocab 1_000_000 x 256: ~1 GB, in its
  own directory ``text_classifier_full``). Run ``--full`` on a quiet machine.
* ``wide_deep``: an Estimator-style wide & deep binary classifier (``samples.build_wide_deep``:
  linear part over hashed and crossed features, 100_000 x 32 item embedding into a
  128-64 DNN).
* ``mobilenet_v2``: keras.applications MobileNetV2 (96x96 input, logits head).

Each model is optimized once per mode (``--modes``, default all four), each run
measuring the original and its candidate side by side: the optimizer's benchmark times
both in one process (loads alternating, requests interleaved) and its cold start loads
each ``--cold_start_rounds`` times in fresh processes (medians). The modes:

* ``lossless``: the default settings;
* ``int8`` / ``fp16``: ``--quantize`` (the optimizer's lossy gate is opened wide so that
  every number is collected; agreement is judged here);
* ``gtt``: the classic recipe, everything frozen into constants, then the Graph Transform
  Tool's ``strip_unused_nodes fold_constants quantize_weights`` (parity at atol=rtol=1).

The "original" row is the original side of the lossless run (of the first run that
produced numbers, if it failed). Every other row's ratios are against the original
measured in its own run. This machine is noisy: the ratios are the result.

Agreement: the same for every row, computed here, not by the optimizer: the original
and the published model are loaded (``loader.load_session``) and run on the same inputs
(``--agreement_rows``: real-looking requests for the text and wide & deep models,
uniform random images for MobileNetV2); the share of rows whose top-1 class (argmax of
the probabilities, or of the logits for MobileNetV2) is the same.

Gates: lossless rows keep the regression gate (``serving_opt.stages.regression`` at a
1.10 tolerance: cold load, first request, serving peak RSS, p50/p99 per batch size): the
exit code is 1 if a lossless optimization is worse anywhere (or fails), 0 otherwise.
Quantized rows (int8, fp16, gtt) are reported, and flagged in the notes column if their
p50 at batch 1 or 32 is over 1.05x the original or their agreement is below 99.5%.

Writes build/bench/quantize.md (the table), build/bench/quantize.png (ratios to the
original per model and mode) and build/bench/summary.json (``passed``, ``tolerance``,
``regressions``, ``flags``, ``agreement`` and the full optimize reports, model -> mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field

from serving_opt.options import GateOptions, InputOptions, MeasureOptions, OutputOptions, Tolerance

ALL_KINDS = ("classifier", "regressor", "convnet", "keras", "mobilenet_v2", "resnet50",
             "text_classifier", "wide_deep")
DEFAULT_KINDS = ("text_classifier", "wide_deep", "mobilenet_v2")
MODES = ("lossless", "int8", "fp16", "gtt")
MODE_LABELS = {"original": "original", "lossless": "lossless", "int8": "int8",
               "fp16": "fp16", "gtt": "GTT quantize_weights"}
TOLERANCE = 1.10  # serving_opt.stages.regression.DEFAULT_TOLERANCE, pinned for the bench
P50_FLAG = 1.05  # quantized rows: flagged above this p50 ratio
AGREEMENT_FLAG = 0.995  # quantized rows: flagged below this top-1 agreement
# The classic recipe: freeze everything, fold, store every large constant as 8 bits.
GTT_RECIPE = "strip_unused_nodes fold_constants(ignore_errors=true) quantize_weights"
TEXT_QUICK = {"vocab_size": 200_000, "embedding_dim": 64, "optimizer_slots": False}
TEXT_FULL = {"vocab_size": 1_000_000, "embedding_dim": 256, "optimizer_slots": False}
WIDE_DEEP = {"vocab_size": 100_000, "embedding_dim": 32}
COLUMNS = ("size", "cold load", "first request", "peak RSS", "p50 b1", "p99 b1", "p50 b32",
           "p99 b32")  # keys of measures()
HEADERS = ("model", "mode") + COLUMNS + ("agreement", "notes")
CHART_MEASURES = ("size", "cold load", "first request", "peak RSS", "p50 b32")


@dataclass(frozen=True)
class Case:
    """One model of the bench: the sample kind, its directory name and build options."""

    kind: str
    name: str
    build_options: dict = field(default_factory=dict)


def cases(kinds: list[str], full: bool) -> list[Case]:
    """The models to run; text_classifier is quick unless ``full``.

    Example:
        >>> [c.name for c in cases(["wide_deep", "text_classifier"], full=True)]
        ['wide_deep', 'text_classifier_full']
    """
    out = []
    for kind in kinds:
        if kind == "wide_deep":
            out.append(Case(kind, kind, WIDE_DEEP))
        elif kind != "text_classifier":
            out.append(Case(kind, kind))
        elif full:
            out.append(Case(kind, "text_classifier_full", TEXT_FULL))
        else:
            out.append(Case(kind, kind, TEXT_QUICK))
    return out


def example_requests(case: Case, count: int, seed: int) -> list[bytes] | None:
    """Serialized tf.Examples the model understands, or None for tensor-input models."""
    from serving_opt import samples

    if case.kind == "text_classifier":
        return samples.text_examples(count, seed=seed,
                                     vocab_size=case.build_options["vocab_size"])
    if case.kind == "wide_deep":
        return samples.wide_deep_examples(count, seed=seed,
                                          vocab_size=case.build_options["vocab_size"])
    if case.kind in ("classifier", "regressor", "multihead"):
        return samples.sample_examples(count, seed=seed)
    return None


def build_model(case: Case, models_dir: str) -> tuple[str, str | None]:
    """Builds the sample once (kept between runs); returns (SavedModel dir, examples file).

    text_classifier and wide_deep get real requests (words, items of their vocabulary)
    as a TFRecord: synthesized ones would be all out of vocabulary.
    """
    from serving_opt import samples

    base = os.path.join(models_dir, case.name)
    source = os.path.join(base, "1")
    if not os.path.exists(os.path.join(source, "saved_model.pb")):
        print(f"building {case.name} ...", file=sys.stderr, flush=True)
        samples.build(case.kind, source, **case.build_options)
    if case.kind not in ("text_classifier", "wide_deep"):
        return source, None
    examples = os.path.join(base, "examples.tfrecord")
    if not os.path.exists(examples):
        write_tfrecord(example_requests(case, 64, seed=1), examples)
    return source, examples


def write_tfrecord(records: list[bytes], path: str) -> str:
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


def mode_options(mode: str, base):
    """The OptimizeOptions of one mode, from the options every mode shares.

    Example:
        >>> mode_options("int8", OptimizeOptions()).build.quantize
        'int8'
    """
    if mode == "lossless":
        return base
    if mode in ("int8", "fp16"):
        # Agreement is judged by the bench, the same way for every row: the optimizer's
        # lossy gate must not refuse the candidate before it is measured.
        return dataclasses.replace(
            base, build=dataclasses.replace(base.build, quantize=mode),
            gate=dataclasses.replace(base.gate, min_top1_agreement=0.0, max_probability_error=1.0))
    if mode == "gtt":
        # The recipe works on constants: freeze every variable, keep constants constants.
        return dataclasses.replace(
            base, build=dataclasses.replace(base.build, transforms=GTT_RECIPE, freeze="always",
                                            freeze_max_bytes=2**50, max_constant_bytes=None),
            tolerance=Tolerance(atol=1.0, rtol=1.0))
    raise ValueError(f"unknown mode {mode!r}")


@dataclass
class Outcome:
    """One optimize of one model in one mode: its report (partial when it failed), the
    published directory, the gate's regressions (lossless) or flags (quantized)."""

    name: str
    mode: str
    report: object | None
    output_dir: str | None = None
    regressions: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    agreement: float | None = None
    failed: bool = False
    default_only: bool = False  # published with serving_default alone (gtt fallback)

    @property
    def measured(self) -> bool:
        r = self.report
        return not self.failed and r is not None and r.cold_start is not None \
            and r.benchmark is not None


def run_mode(case: Case, mode: str, source: str, examples: str | None,
             args: argparse.Namespace) -> Outcome:
    """Optimizes one model in one mode, publishing even a regression so every number is
    collected. A failed optimize is an outcome too: its error is the note."""
    from serving_opt.errors import ParityError, ServingOptError
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
    from serving_opt.stages import regression

    print(f"optimizing {case.name} ({mode}) ...", file=sys.stderr, flush=True)
    base = OptimizeOptions(
        output=OutputOptions(version=1, overwrite=True),
        measure=MeasureOptions(benchmark_runs=args.runs, cold_start_rounds=args.cold_start_rounds),
        inputs=InputOptions(examples=examples),
        gate=GateOptions(regression_tolerance=TOLERANCE, allow_regression=True))
    options = mode_options(mode, base)
    output_base = os.path.join(args.out, "optimized", case.name, mode)
    notes, default_only = [], False
    try:
        try:
            result = optimize(source, output_base, options)
        except ParityError:
            if mode != "gtt":
                raise
            # Flipped class ids or names fail even atol=rtol=1: measure the classify
            # signature alone (the one the benchmark and cold start use anyway).
            print(f"  {case.name} (gtt): parity failed on all signatures; retrying with "
                  "serving_default only", file=sys.stderr, flush=True)
            options = dataclasses.replace(options, build=dataclasses.replace(
                options.build, signatures=("serving_default",)))
            result = optimize(source, output_base, options)
            notes.append("serving_default only (other signatures' class ids differ)")
            default_only = True
    except ServingOptError as e:
        line = str(e).splitlines()[0]
        return Outcome(case.name, mode, e.report, notes=[f"failed: {line}"],
                       regressions=[f"optimize failed: {line}"] if mode == "lossless" else [],
                       failed=True)
    outcome = Outcome(case.name, mode, result, output_dir=result.output_dir, notes=notes,
                      default_only=default_only)
    if mode == "lossless":
        outcome.regressions = regression.regressions(result.cold_start, result.benchmark,
                                                     TOLERANCE)
    return outcome


# -- agreement ------------------------------------------------------------------------


def _answer(meta_graph) -> tuple[str, str] | None:
    """(signature key, output alias) of the model's class scores, or None (no classes)."""
    from tensorflow.core.framework import types_pb2

    sigs = meta_graph.signature_def
    for key in ("predict", "serving_default"):
        if key in sigs:
            for alias in ("probabilities", "scores"):
                if alias in sigs[key].outputs:
                    return key, alias
    if "serving_default" in sigs:
        for alias, info in sorted(sigs["serving_default"].outputs.items()):
            dims = [d.size for d in info.tensor_shape.dim]
            if info.dtype == types_pb2.DT_FLOAT and len(dims) == 2 and dims[1] >= 2:
                return "serving_default", alias  # logits: the same argmax
    return None


def agreement_feeds(case: Case, meta_graph, key: str, rows: int, batch: int,
                    seed: int) -> list[dict]:
    """Batches of the signature's one input: requests, or uniform [-1, 1) images."""
    import numpy as np
    from tensorflow.core.framework import types_pb2

    sig = meta_graph.signature_def[key]
    if len(sig.inputs) != 1:
        raise ValueError(f"signature {key} has {len(sig.inputs)} inputs; the bench feeds one")
    ((_, info),) = sig.inputs.items()
    rng = np.random.default_rng(seed)
    if info.dtype == types_pb2.DT_STRING:
        records = example_requests(case, rows, seed)
        if records is None:
            raise ValueError(f"{case.kind}: no requests known for a string input")
        data = np.array(records, dtype=object)
    else:
        dims = [d.size for d in info.tensor_shape.dim]
        shape = [rows] + [d if d > 0 else 1 for d in dims[1:]]
        data = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    return [{info.name: data[i:i + batch]} for i in range(0, rows, batch)]


def top1(model_dir: str, key: str, alias: str, feeds: list[dict]):
    """The argmax class of every row, one model loaded (then closed) at a time."""
    import numpy as np

    from serving_opt.savedmodel import loader

    sess, meta_graph = loader.load_session(model_dir)
    try:
        fetch = meta_graph.signature_def[key].outputs[alias].name
        return np.concatenate([sess.run(fetch, feed).argmax(axis=-1) for feed in feeds])
    finally:
        sess.close()


def measure_agreement(case: Case, source: str, outcomes: list[Outcome],
                      args: argparse.Namespace) -> None:
    """Sets each published outcome's top-1 agreement with the original (same inputs)."""
    from tensorflow.core.framework import types_pb2

    from serving_opt.savedmodel import loader

    meta_graph = loader.find_meta_graph(loader.read_saved_model(source),
                                        frozenset({loader.SERVE_TAG}), source)
    answer = _answer(meta_graph)
    if answer is None:
        return
    key, alias = answer
    strings = any(info.dtype == types_pb2.DT_STRING
                  for info in meta_graph.signature_def[key].inputs.values())
    batch = 256 if strings else 64  # requests are cheap; images are not
    feeds = agreement_feeds(case, meta_graph, key, args.agreement_rows, batch, seed=7)
    print(f"agreement of {case.name}: {args.agreement_rows} rows of {key}/{alias} ...",
          file=sys.stderr, flush=True)
    reference = top1(source, key, alias, feeds)
    for outcome in outcomes:
        if outcome.output_dir is None:
            continue
        try:
            # A model published with fewer signatures is read through serving_default.
            k, a = ("serving_default", "scores") if outcome.default_only \
                and key == "predict" else (key, alias)
            outcome.agreement = float((top1(outcome.output_dir, k, a, feeds)
                                       == reference).mean())
        except Exception as e:  # noqa: BLE001 - a broken model is a result of the bench
            outcome.notes.append(f"agreement not measured: {str(e).splitlines()[0]}")


# -- the table and the chart ----------------------------------------------------------


def _latency(bench, side: str) -> dict[int, object]:
    return {lat.batch_size: lat for lat in getattr(bench, side)} if bench else {}


def measures(report, side: str) -> dict[str, float | None]:
    """One side ("before" | "after") of a report as plain numbers (None: not measured)."""
    size = report.size_before if side == "before" else report.size_after
    cold = getattr(report.cold_start, side) if report.cold_start else None
    lat = _latency(report.benchmark, side)

    def p(batch: int, q: str):
        return getattr(lat[batch], q) if batch in lat else None

    return {
        "size": size.total if size else None,
        "cold load": cold.load_seconds if cold else None,
        "first request": cold.first_request_seconds if cold else None,
        "peak RSS": cold.peak_rss_bytes if cold else None,
        "p50 b1": p(1, "p50_ms"), "p99 b1": p(1, "p99_ms"),
        "p50 b32": p(32, "p50_ms"), "p99 b32": p(32, "p99_ms"),
    }


def ratios(outcome: Outcome) -> dict[str, float | None]:
    """after / before of every measure, within the outcome's own run."""
    before, after = measures(outcome.report, "before"), measures(outcome.report, "after")
    return {k: after[k] / before[k] if before[k] and after[k] is not None else None
            for k in before}


def flag(outcome: Outcome) -> None:
    """Quantized rows: flags p50 over 1.05x the original and agreement under 99.5%."""
    if outcome.mode == "lossless" or not outcome.measured:
        return
    r = ratios(outcome)
    for measure in ("p50 b1", "p50 b32"):
        if r[measure] is not None and r[measure] > P50_FLAG:
            outcome.flags.append(f"{measure} {r[measure]:.3f}x > {P50_FLAG:.2f}x")
    if outcome.agreement is not None and outcome.agreement < AGREEMENT_FLAG:
        outcome.flags.append(f"agreement {outcome.agreement:.1%} < {AGREEMENT_FLAG:.1%}")


def _fmt(measure: str, value: float | None) -> str:
    from serving_opt.core import rendering
    if value is None:
        return "-"
    if measure in ("size", "peak RSS"):
        return rendering.human_bytes(int(value))
    if measure == "cold load":
        return f"{value:.2f} s"
    if measure == "first request":
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} ms"


def table_rows(name: str, outcomes: list[Outcome]) -> list[list[str]]:
    """The original row, then one row per mode: values with their ratio to the original."""
    measured = [o for o in outcomes if o.measured]
    origin = next((o for o in measured if o.mode == "lossless"), measured[0] if measured
                  else None)
    columns = COLUMNS
    rows = []
    if origin is not None:
        before = measures(origin.report, "before")
        rows.append([name, "original"] + [_fmt(c, before[c]) for c in columns]
                    + ["100%", f"(original side of the {origin.mode} run)"])
    for o in outcomes:
        notes = "; ".join(o.regressions + o.flags + o.notes)
        if not o.measured:
            rows.append([name, MODE_LABELS[o.mode]] + ["-"] * len(columns)
                        + [_agreement(o), notes or "not measured"])
            continue
        after, r = measures(o.report, "after"), ratios(o)
        cells = [f"{_fmt(c, after[c])} ({r[c]:.2f}x)" if r[c] is not None
                 else _fmt(c, after[c]) for c in columns]
        rows.append([name, MODE_LABELS[o.mode]] + cells + [_agreement(o), notes])
    return rows


def _agreement(o: Outcome) -> str:
    return "-" if o.agreement is None else f"{o.agreement:.1%}"


def markdown(rows: list[list[str]]) -> str:
    """A GitHub markdown table.

    Example:
        >>> print(markdown([["a", "b"]]).splitlines()[1][:12])
        |---|---|---|
    """
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


def chart(results: dict[str, list[Outcome]], path: str) -> str:
    """Grouped bars per model: each measure's ratio to the original, one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.6 * len(names)), squeeze=False)
    colors = {"lossless": "#4c72b0", "int8": "#55a868", "fp16": "#8172b2", "gtt": "#c44e52"}
    for ax, name in zip(axes[:, 0], names):
        shown = [o for o in results[name] if o.measured]
        width = 0.8 / max(len(shown), 1)
        for i, o in enumerate(shown):
            r = ratios(o)
            xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(CHART_MEASURES))]
            values = [r[m] or 0.0 for m in CHART_MEASURES]
            bars = ax.bar(xs, values, width, label=MODE_LABELS[o.mode], color=colors[o.mode])
            for bar, value in zip(bars, values):
                ax.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value),
                            ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                            textcoords="offset points")
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--", zorder=0)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.FixedLocator(
            [0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256]))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xticks(range(len(CHART_MEASURES)), CHART_MEASURES)
        ax.set_ylabel("ratio to the original")
        ax.set_title(name, loc="left", fontweight="bold")
        ax.legend(loc="upper left", fontsize=8, ncols=len(shown) or 1, frameon=False)
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, 0.1), max(high, 2.0) * 1.6)  # room for the labels and legend
    fig.suptitle("serving-opt: ratio to the original (below 1 = smaller / faster)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- main -----------------------------------------------------------------------------


def _list(value: str, allowed: tuple[str, ...], flag_name: str,
          parser: argparse.ArgumentParser) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        parser.error(f"{flag_name}: {', '.join(bad) or 'empty'}; choose from "
                     f"{', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help=f"sample kinds (default {','.join(DEFAULT_KINDS)})")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"optimizations (default {','.join(MODES)})")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cold_start_rounds", type=int, default=3,
                        help="fresh-process loads of each model, medians (default 3: noisy)")
    parser.add_argument("--agreement_rows", type=int, default=1024,
                        help="rows compared for top-1 agreement (default 1024)")
    parser.add_argument("--full", action="store_true",
                        help="text_classifier at full size (~1 GB) instead of the quick one")
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    if args.cold_start_rounds < 1:
        parser.error("--cold_start_rounds must be at least 1")
    if args.agreement_rows < 1:
        parser.error("--agreement_rows must be at least 1")
    kinds = _list(args.kinds, ALL_KINDS, "--kinds", parser)
    modes = _list(args.modes, MODES, "--modes", parser)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    from serving_opt.core import rendering
    from serving_opt.savedmodel import tf_process

    tf_process.quiet_tensorflow_import()
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # the samples' deprecated APIs
    results: dict[str, list[Outcome]] = {}
    for case in cases(kinds, args.full):
        source, examples = build_model(case, os.path.join(args.out, "models"))
        outcomes = [run_mode(case, mode, source, examples, args) for mode in modes]
        measure_agreement(case, source, outcomes, args)
        for outcome in outcomes:
            flag(outcome)
        results[case.name] = outcomes

    rows = [row for name, outcomes in results.items() for row in table_rows(name, outcomes)]
    text = markdown(rows)
    legend = (f"Values of the optimized model with its ratio to the original measured in "
              f"the same run (below 1.00x: smaller or faster). Cold start: fresh "
              f"processes, medians of {args.cold_start_rounds}; latency: {args.runs} "
              f"interleaved runs. Agreement: top-1 class equal to the original's on "
              f"{args.agreement_rows} rows. Quantized rows are flagged above "
              f"{P50_FLAG:.2f}x p50 or below {AGREEMENT_FLAG:.1%} agreement; lossless rows "
              f"are gated at {TOLERANCE:.2f}x.")
    md_path = os.path.join(args.out, "quantize.md")
    os.makedirs(args.out, exist_ok=True)
    with open(md_path, "w") as f:
        f.write("# serving-opt: original vs lossless, int8, fp16, GTT quantize_weights\n\n"
                f"{text}\n\n{legend}\n")
    print(text)
    print()
    print(legend)
    png_path = chart(results, os.path.join(args.out, "quantize.png"))

    found = {name: [line for o in outcomes if o.mode == "lossless" for line in o.regressions]
             for name, outcomes in results.items()}
    passed = not any(found.values())
    summary = {
        "passed": passed, "tolerance": TOLERANCE, "regressions": found,
        "flags": {name: {o.mode: o.flags for o in outcomes if o.flags}
                  for name, outcomes in results.items()},
        "agreement": {name: {o.mode: o.agreement for o in outcomes}
                      for name, outcomes in results.items()},
        "models": {name: {o.mode: rendering.to_jsonable(o.report) for o in outcomes}
                   for name, outcomes in results.items()},
    }
    json_path = rendering.write_json(summary, os.path.join(args.out, "summary.json"))
    print_gate(found)
    print(f"table: {md_path}; chart: {png_path}; full reports: {json_path}")
    return 0 if passed else 1


def print_gate(found: dict[str, list[str]]) -> None:
    """The lossless gate's verdict: every regression with its model, or that there is none."""
    bad = {name: lines for name, lines in found.items() if lines}
    if not bad:
        print(f"regression gate (lossless): passed (no measure worse than {TOLERANCE:.2f}x "
              "the original)")
        return
    print(f"regression gate (lossless): FAILED ({TOLERANCE:.2f}x tolerance)")
    for name, lines in bad.items():
        for line in lines:
            print(f"  {name}: {line}")


if __name__ == "__main__":
    sys.exit(main())
