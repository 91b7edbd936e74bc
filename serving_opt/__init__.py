"""serving_opt: smaller, faster, proven-equivalent TensorFlow SavedModels for TF Serving."""

from __future__ import annotations

__version__ = "0.1.0"

# The option groups (serving_opt.options): build, inputs, tolerance, gate, measure,
# target, trust, output, and validate's own.
_OPTIONS = ("BuildOptions", "GateOptions", "InputOptions", "MeasureOptions", "OptimizeOptions",
            "OutputOptions", "ServingCheck", "TargetOptions", "Tolerance", "TrustOptions",
            "ValidateOptions")

__all__ = [*_OPTIONS, "OptimizeReport", "ServingOptError", "optimize", "__version__"]


def __getattr__(name: str):
    # Lazy, so `import serving_opt` (and the CLI's --help) does not import TensorFlow.
    if name in _OPTIONS:
        from serving_opt import options

        return getattr(options, name)
    if name in ("OptimizeReport", "optimize"):
        from serving_opt.pipeline import optimizer
        return getattr(optimizer, name)
    if name == "ServingOptError":
        from serving_opt.errors import ServingOptError

        return ServingOptError
    raise AttributeError(f"module 'serving_opt' has no attribute {name!r}")
