"""``serving-opt tune``: TF Serving's batching and thread settings, measured and proven.

``profile`` measures the session alone, ``grid`` reads a few settings off it, ``prove``
and ``load`` run each on a real server under real load, ``decide`` compares the best
with upstream's defaults in interleaved rounds, ``report``/``findings``/``outputs`` say
and write what to deploy, ``tuner`` is the run in order. See docs/tune.md.
"""

from __future__ import annotations

# TuneOptions and its groups: each option is spelled in its group.
_OPTIONS = ("BudgetOptions", "ModelOptions", "SearchOptions", "ServerOptions", "TuneOptions",
            "WorkloadOptions")
__all__ = [*_OPTIONS, "TuneReport", "tune"]


def __getattr__(name: str):
    # Lazy: the CLI's --help and usage errors import no TensorFlow.
    if name == "tune":
        from serving_opt.tune.tuner import tune

        return tune
    if name in _OPTIONS:
        from serving_opt.tune import options

        return getattr(options, name)
    if name == "TuneReport":
        from serving_opt.tune.report import TuneReport

        return TuneReport
    raise AttributeError(f"module 'serving_opt.tune' has no attribute {name!r}")
