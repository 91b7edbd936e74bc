"""``serving-opt tune``: TF Serving's batching and thread settings, found and proven.

One module per idea: ``settings`` (what is tuned, and the files TF Serving reads),
``profile`` (the session alone, per batch size and thread setting), ``curve`` (those
measurements, interpolated), ``scheduler`` (a discrete-event model of TF Serving's
batch scheduler), ``calibrate`` (the server's own cost per request), ``search`` (the
best settings and the throughput/p99 front), ``load`` (a gRPC/REST load generator,
closed and open loop), ``payloads`` (its requests), ``prove`` (real servers under real
load), ``findings`` and ``report`` (what it means), ``outputs`` (the files a deployment
uses), ``tuner`` (the run, in order).

Example:
    >>> from serving_opt.tune import TuneOptions, tune
    >>> report = tune("/models/mnv2", TuneOptions(clients=16, slo_p99_ms=250),
    ...               output_dir="build/tune")
    >>> print(report.recommendation.command)
"""

from __future__ import annotations

__all__ = ["TuneOptions", "TuneReport", "tune"]


def __getattr__(name: str):
    # Lazy: the CLI's --help and usage errors import no TensorFlow.
    if name == "tune":
        from serving_opt.tune.tuner import tune

        return tune
    if name == "TuneOptions":
        from serving_opt.tune.options import TuneOptions

        return TuneOptions
    if name == "TuneReport":
        from serving_opt.tune.report import TuneReport

        return TuneReport
    raise AttributeError(f"module 'serving_opt.tune' has no attribute {name!r}")
