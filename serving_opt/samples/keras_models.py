"""The Keras samples: ``keras`` (a small functional model) and two ``keras.applications``
architectures, ``mobilenet_v2`` and ``resnet50``, each exported with ``model.export()``
(a TF2 object-graph SavedModel).

(Not named keras.py: run as a script from this directory, it would shadow Keras.)
"""

from __future__ import annotations

import numpy as np

# Small inputs keep the real architectures (every layer, every batch norm) but make
# them fast: MobileNetV2 at 96x96, ResNet50 at 64x64.
KERAS_APPLICATIONS = {"mobilenet_v2": ("MobileNetV2", 96), "resnet50": ("ResNet50", 64)}


def build_keras(export_dir: str, seed: int = 0) -> str:
    """Writes a small Keras 3 model with ``model.export()`` (a TF2 object-graph SavedModel)."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(5,), name="features")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = keras.layers.Dense(2, name="scores")(hidden)
    model = keras.Model(inputs, outputs)
    if keras.__version__.startswith("2."):  # Keras 2 (TF <= 2.15) has no verbose argument
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # it prints the endpoints instead
            model.export(export_dir)
    else:
        model.export(export_dir, verbose=False)
    return export_dir


def build_keras_application(kind: str, export_dir: str, seed: int = 0) -> str:
    """A ``keras.applications`` model (weights=None, fixed seed) exported with model.export.

    Untrained batch norms are identities (mean 0, variance 1, scale 1, offset 0), so
    folding them would change nothing measurable: they get trained-looking statistics.
    The head outputs logits (``classifier_activation=None``): a parity check on
    saturated probabilities would hide drift.
    """
    import keras

    name, size = KERAS_APPLICATIONS[kind]
    keras.utils.set_random_seed(seed)
    model = getattr(keras.applications, name)(
        input_shape=(size, size, 3), weights=None, classes=10, classifier_activation=None)
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            channels = layer.moving_mean.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.2, channels),
                               rng.normal(0, 0.2, channels), rng.uniform(0.5, 2.0, channels)])
    model.export(export_dir, verbose=False)
    return export_dir
