"""How a process that runs TensorFlow is set up: the environment it gives the processes it
starts, oneDNN's allocator off while optimizing, no matplotlib, a quiet import.

serving-opt's own processes (the worker, measuring and server processes) call these
before TensorFlow is imported; a user's process (the Python API) keeps its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# The environment the optimizer process changes for itself (see configure_for_optimizing),
# as the process started with it (None: unset): what serving and measuring processes get,
# so that they run TensorFlow as TF Serving would on this machine, or as the user chose.
RUNTIME_DEFAULTS: dict = {"TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS")}


def with_runtime_defaults(env: Mapping[str, str], extra: Mapping | None = None) -> dict:
    """``env`` with :data:`RUNTIME_DEFAULTS` applied, then ``extra``: a None value unsets."""
    env = dict(env)
    for name, value in {**RUNTIME_DEFAULTS, **(extra or {})}.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def configure_for_optimizing() -> bool:
    """Makes this process return each loaded model's memory when its session closes.

    With oneDNN's optimizations on (TF's default on x86), tensors come from a caching
    allocator that keeps them after the session closes: optimizing a 1 GB model loaded
    it three times and held 2.8 GB. Off, the memory is returned. Only possible before
    TensorFlow is imported; measurements run in their own processes with the defaults.
    Returns whether it took effect.
    """
    import sys

    if "tensorflow" in sys.modules:
        return False
    # A user's choice stands (and measuring processes get it too, see RUNTIME_DEFAULTS).
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    return True


def keep_plotting_out() -> None:
    """Keeps matplotlib out of this process, for the processes serving-opt starts itself.

    ``import tensorflow`` imports Keras, and Keras imports ``matplotlib.pyplot`` whenever
    matplotlib is installed (``keras.src.visualization``; serving-opt installs it for tune's
    chart). That costs every worker, measuring and server process ~1.3 s, and 2-5 s more
    in the sandbox, whose fresh home makes matplotlib rebuild its font cache, for plots none
    of them makes. Keras takes the ImportError as "no matplotlib". Never called in a
    user's process (the Python API, the Estimator hook): their code may plot.
    """
    if "matplotlib" not in sys.modules:
        sys.modules["matplotlib"] = None  # import machinery: None means "not importable"


def quiet_tensorflow_import() -> None:
    """Imports TensorFlow with the process's stderr (file descriptor 2) silenced.

    TF 2.19+ logs CUDA and CPU-feature INFO lines from C++ while importing, before absl
    logging is initialised, so TF_CPP_MIN_LOG_LEVEL does not stop them (tensorflow#100442);
    they would bury the CLI's one-line errors. Python exceptions still propagate. A no-op
    once TensorFlow is imported.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
