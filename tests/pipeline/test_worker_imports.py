"""What serving-opt's own processes import: TensorFlow without matplotlib.

``import tensorflow`` imports Keras, which imports matplotlib.pyplot when it is installed
(and, in the sandbox's fresh home, rebuilds its font cache): seconds per worker, measuring
or server process. ``tf_process.keep_plotting_out`` keeps it out of those processes only.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600)


def test_a_worker_imports_tensorflow_and_keras_without_matplotlib():
    done = _run("""
        import sys
        from serving_opt.savedmodel import tf_process
        tf_process.keep_plotting_out()
        tf_process.quiet_tensorflow_import()
        import keras
        import tensorflow as tf
        layer = keras.layers.Dense(2)
        print(sys.modules.get("matplotlib", "absent"), layer(tf.ones([1, 3])).shape)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "(1,", "2)"]


def test_a_users_process_keeps_matplotlib_importable():
    # The Python API and the Estimator hook run in the user's process: only the processes
    # serving-opt starts keep plotting out.
    done = _run("""
        import serving_opt
        from serving_opt.savedmodel import tf_process
        tf_process.quiet_tensorflow_import()
        import matplotlib
        print(type(matplotlib).__name__)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "module"
