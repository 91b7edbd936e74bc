"""The ``classifier`` and ``multihead`` samples: an Estimator-like DNN classifier."""

from __future__ import annotations

from serving_opt.samples.features import parsed_features
from serving_opt.samples.tf1 import batch_norm, dense, estimator_graph, save_with_tables

CLASS_NAMES = ("negative", "neutral", "positive")


def build_classifier(export_dir: str, seed: int = 0, with_regression: bool = False) -> str:
    """Writes an Estimator-like DNN classifier SavedModel to ``export_dir``.

    Features parsed from serialized tf.Examples: ``word`` (vocabulary-file
    embedding), ``city`` (hashed embedding), ``age`` (float), ``clicks`` (int64).
    A hidden layer with batch norm in inference mode feeds three classes.
    Signatures: ``serving_default`` and ``classification`` (classify), ``predict``;
    with ``with_regression`` also ``positive_score`` (regress: P(positive)), a model
    TF Serving's MultiInference can query with both kinds at once.
    """
    import tensorflow as tf

    sigs = tf.compat.v1.saved_model.signature_def_utils
    with estimator_graph(seed) as (graph, scratch):
        serialized, net = parsed_features(scratch)
        net = dense(net, 16, "hidden", seed + 1)
        net = tf.nn.relu(batch_norm(net, "hidden_bn", seed + 3))
        logits = dense(net, len(CLASS_NAMES), "logits_layer", seed + 7)
        logits = tf.identity(logits, name="logits")
        probabilities = tf.nn.softmax(logits, name="probabilities")
        class_ids = tf.argmax(logits, axis=1, name="class_ids")
        batch = tf.shape(logits)[0]
        classes = tf.tile(
            tf.constant([list(CLASS_NAMES)]), tf.stack([batch, 1]), name="classes"
        )
        classify = sigs.classification_signature_def(serialized, classes, probabilities)
        predict = sigs.predict_signature_def(
            {"examples": serialized},
            {"probabilities": probabilities, "class_ids": class_ids, "logits": logits},
        )
        signatures = {"serving_default": classify, "classification": classify,
                      "predict": predict}
        if with_regression:
            positive = tf.identity(probabilities[:, 2:3], name="positive_score")
            signatures["positive_score"] = sigs.regression_signature_def(serialized, positive)
        save_with_tables(graph, export_dir, signatures)
    return export_dir


def build_multihead(export_dir: str, seed: int = 0) -> str:
    """The classifier plus a regress signature (``positive_score``): classify and regress
    in one model.
    """
    return build_classifier(export_dir, seed, with_regression=True)
