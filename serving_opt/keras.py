"""Public path of the Keras integration: ``import serving_opt.keras``.

The code lives in :mod:`serving_opt.integrations.keras_export`; this name is the same
module object, so patching or logging through either path is the same thing.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _real_keras_if_shadowed() -> None:
    """Loads the real Keras when this file was imported *as* top-level ``keras``.

    That happens when ``serving_opt/`` itself is on ``sys.path``, which Python does for
    any script run from that directory: ``python serving_opt/cli/optimize_main.py``, and every
    ``py_binary`` whose main lives there (``bazel run //serving_opt:optimize``), since
    Bazel's stub starts ``python <runfiles>/serving_opt/...``. Then an
    ``import keras`` anywhere in the process (TensorFlow's ``tf.keras`` included) would
    find this file. Putting the real package into ``sys.modules["keras"]`` while this
    module executes makes that import return the real Keras (the import system re-reads
    ``sys.modules`` after executing a module), without touching ``sys.path``.
    """
    def is_this_file(path: str | None) -> bool:
        # samefile: Bazel's runfiles and symlinked checkouts reach this file by other paths.
        try:
            return bool(path) and os.path.samefile(path, __file__)
        except OSError:
            return False

    path = [p for p in sys.path if not is_this_file(os.path.join(p or os.curdir, "keras.py"))]
    spec = importlib.machinery.PathFinder.find_spec("keras", path)
    if spec is None or spec.loader is None or is_this_file(spec.origin):
        raise ImportError(f"keras is not installed (only {__file__} shadows the name)")
    real = importlib.util.module_from_spec(spec)
    sys.modules["keras"] = real
    spec.loader.exec_module(real)



if __name__ == "keras":
    _real_keras_if_shadowed()
else:
    from serving_opt.integrations import keras_export as _impl

    sys.modules[__name__] = _impl
