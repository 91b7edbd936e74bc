"""serving-opt as a Kubeflow Pipelines v2 step (the ``[kfp]`` extra).

:func:`optimize_component` is a lightweight Python component: the exported SavedModel
in (``Input[Model]``, a version directory or a model base whose highest version is
taken), optional examples (``Input[Dataset]``: TFRecord of tf.Example or JSON lines),
and out the published version (``Output[Model]``, a model base holding version 1 and
``serving_opt_report.json``), the report's figures (``Output[Metrics]``) and the report
a person reads (``Output[Markdown]``). A refused model exits the step non-zero with the
one-line reason, so nothing downstream runs. Tools with their own containers: pass
``base_image`` an image that has ``serving-opt`` installed.
"""

# No `from __future__ import annotations`: KFP reads the components' annotations as types.
import os

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from serving_opt.options import BuildOptions, InputOptions, MeasureOptions, OutputOptions

REPORT_NAME = "serving_opt_report.json"


# KFP's interface is the function's signature: one parameter per option it shows.
def _optimize(model: Input[Model], optimized: Output[Model],  # noqa: PLR0913
              metrics: Output[Metrics], report: Output[Markdown],
              examples: Input[Dataset] = None, quantize: str = "none", transforms: str = "",
              signatures: str = "", benchmark_runs: int = -1, measure_seconds: float = 180.0,
              cold_start: bool = True):
    # KFP runs this function's source alone: everything it needs is imported here.
    from serving_opt.integrations.kfp import run_step

    run_step(model, optimized, metrics, report, examples, dict(
        quantize=quantize, transforms=transforms, signatures=signatures,
        benchmark_runs=benchmark_runs, measure_seconds=measure_seconds,
        cold_start=cold_start))


def optimize_component(base_image: str = "python:3.11"):
    """The component; ``base_image`` must have serving-opt[kfp] installed (the step never
    pip-installs: a pipeline runs the tool it was built with)."""
    return dsl.component(_optimize, base_image=base_image, install_kfp_package=False)


def _saved_model_dir(path: str) -> str:
    """``path`` itself when it holds a SavedModel, else its highest numeric version."""
    if any(os.path.exists(os.path.join(path, n))
           for n in ("saved_model.pb", "saved_model.pbtxt")):
        return path
    versions = sorted((int(n) for n in os.listdir(path) if n.isdigit()), reverse=True) \
        if os.path.isdir(path) else []
    return os.path.join(path, str(versions[0])) if versions else path


def report_metrics(data: dict) -> dict[str, float]:
    """The JSON report's figures the pipeline UI shows: sizes, cold start, latency
    ratios (after/before, the median of each batch size) and parity."""
    out: dict[str, float] = {"published": float(bool(data["published"]))}
    before, after = data["size_before"], data.get("size_after")
    out["size_before_bytes"] = float(before["total"])
    if after:
        out["size_after_bytes"] = float(after["total"])
        out["size_ratio"] = after["total"] / before["total"]
    cold = data.get("cold_start")
    if cold:
        for side in ("before", "after"):
            for key in ("load_seconds", "first_request_seconds", "peak_rss_bytes"):
                out[f"cold_start_{key}_{side}"] = float(cold[side][key])
    for r in (data.get("benchmark") or {}).get("ratios", ()):
        out[f"latency_ratio_batch_{r['batch_size']}"] = float(r["median"])
    parity = data.get("parity")
    if parity:
        outputs = parity["outputs"]
        out["parity_ok"] = float(bool(parity["ok"]))
        out["parity_mismatches"] = float(sum(o["mismatches"] for o in outputs))
        out["parity_max_abs_diff"] = max((float(o["max_abs_diff"]) for o in outputs),
                                         default=0.0)
    return out


def run_step(model, optimized, metrics, report, examples, params: dict) -> dict:
    """The step's body on KFP artifacts (anything with ``.path``, ``.metadata`` and, for
    ``metrics``, ``log_metric``); ``params``: the component's parameters. Exits non-zero
    with the one-line reason on a refusal."""
    import serving_opt
    from serving_opt.core import rendering
    from serving_opt.errors import ServingOptError
    from serving_opt.pipeline import report as report_lib

    runs = params["benchmark_runs"]
    options = serving_opt.OptimizeOptions(
        build=BuildOptions(quantize=params["quantize"],
                           transforms=params["transforms"] or None,
                           signatures=tuple(s.strip() for s in params["signatures"].split(",")
                                            if s.strip())),
        inputs=InputOptions(examples=examples.path if examples is not None else None),
        measure=MeasureOptions(benchmark_runs=None if runs < 0 else runs,
                               measure_seconds=params["measure_seconds"],
                               cold_start=params["cold_start"]),
        output=OutputOptions(version=1))
    try:
        result = serving_opt.optimize(_saved_model_dir(model.path), optimized.path, options)
    except ServingOptError as e:
        # SystemExit prints exactly this line on stderr and exits 1: the step fails and
        # KFP runs nothing downstream of it.
        raise SystemExit(f"serving-opt: {e.one_line()}") from None
    data = rendering.to_jsonable(result)
    rendering.write_json(result, os.path.join(optimized.path, REPORT_NAME))
    optimized.metadata.update({
        "verdict": "published" if result.published else "refused",
        "version": result.version,
        "size_before_bytes": data["size_before"]["total"],
        "size_after_bytes": (data["size_after"] or {}).get("total"),
        "serving_opt_version": serving_opt.__version__,
        "report": REPORT_NAME,
    })
    figures = report_metrics(data)
    for name, value in figures.items():
        metrics.log_metric(name, value)
    text = report_lib.format_optimize_report(result)
    with open(report.path, "w") as f:
        f.write(f"# serving-opt: {optimized.metadata['verdict']} version {result.version}\n\n"
                f"```\n{text}\n```\n\nFull report: `{REPORT_NAME}` beside the version "
                "directory.\n")
    return figures


__all__ = ["REPORT_NAME", "optimize_component", "report_metrics", "run_step"]
