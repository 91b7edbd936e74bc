"""The ``regressor`` sample: an Estimator-like linear regressor."""

from __future__ import annotations

from serving_opt.samples.features import parsed_features
from serving_opt.samples.tf1 import dense, estimator_graph, save_with_tables


def build_regressor(export_dir: str, seed: int = 0) -> str:
    """Writes an Estimator-like linear regressor SavedModel to ``export_dir``.

    It parses the classifier's features (serving_opt.samples.features).
    Signatures: ``serving_default`` and ``regression`` (regress), ``predict``.
    """
    import tensorflow as tf

    sigs = tf.compat.v1.saved_model.signature_def_utils
    with estimator_graph(seed) as (graph, scratch):
        serialized, net = parsed_features(scratch)
        predictions = dense(net, 1, "linear", seed + 1)
        predictions = tf.identity(predictions, name="predictions")
        regress = sigs.regression_signature_def(serialized, predictions)
        predict = sigs.predict_signature_def(
            {"examples": serialized}, {"predictions": predictions}
        )
        save_with_tables(
            graph, export_dir,
            {"serving_default": regress, "regression": regress, "predict": predict},
        )
    return export_dir
