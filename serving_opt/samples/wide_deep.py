"""The ``wide_deep`` sample: an Estimator-like wide & deep binary classifier, and its
tf.Examples.
"""

from __future__ import annotations

import numpy as np

from serving_opt.samples.tf1 import (
    bytes_feature,
    dnn_logits,
    estimator_graph,
    float_feature,
    save_with_tables,
    serialized_example,
    training_leftovers,
    write_vocabulary,
)

WIDE_DEEP_COUNTRIES = ("us", "gb", "de", "fr", "in", "br", "jp", "mx", "ca", "au")
WIDE_DEEP_DEVICES = ("android", "ios", "web", "tv")
WIDE_DEEP_OOV_BUCKETS = 10
WIDE_DEEP_USER_BUCKETS = 100_000


def wide_deep_vocabulary(vocab_size: int) -> list[str]:
    """The wide & deep model's item vocabulary: ``item0`` .. ``item<vocab_size - 1>``."""
    return [f"item{i}" for i in range(vocab_size)]


def _wide_deep_columns(vocab_path: str, vocab_size: int, embedding_dim: int, seed: int):
    """(wide columns, deep columns), as a DNNLinearCombinedClassifier is given them."""
    import tensorflow as tf

    fc = tf.feature_column
    item = fc.categorical_column_with_vocabulary_file(
        "item_id", vocab_path, vocabulary_size=vocab_size,
        num_oov_buckets=WIDE_DEEP_OOV_BUCKETS)
    user = fc.categorical_column_with_hash_bucket("user_id", WIDE_DEEP_USER_BUCKETS)
    country = fc.categorical_column_with_vocabulary_list("country", WIDE_DEEP_COUNTRIES,
                                                         num_oov_buckets=1)
    device = fc.categorical_column_with_vocabulary_list("device", WIDE_DEEP_DEVICES,
                                                        num_oov_buckets=1)
    wide = [item, user, country, device,
            fc.crossed_column(["country", "device"], hash_bucket_size=1000),
            fc.crossed_column(["user_id", "device"], hash_bucket_size=10_000)]
    deep = [
        # Trained embeddings are far from their initial 1/sqrt(dim) scale (see
        # build_text_classifier): at it, the answers would be near ties.
        fc.embedding_column(item, dimension=embedding_dim, combiner="mean",
                            initializer=tf.compat.v1.truncated_normal_initializer(
                                stddev=1.0, seed=seed)),
        fc.indicator_column(country),
        fc.indicator_column(device),
        fc.numeric_column("age", normalizer_fn=lambda x: (x - 45.0) / 15.0),
        fc.numeric_column("price", normalizer_fn=lambda x: tf.math.log1p(x) - 3.0),
    ]
    return wide, deep


def build_wide_deep(export_dir: str, seed: int = 0, vocab_size: int = 100_000,
                    embedding_dim: int = 32) -> str:
    """Writes an Estimator-like wide & deep binary classifier SavedModel.

    What ``DNNLinearCombinedClassifier`` exports, built with ``tf.compat.v1``: serialized
    tf.Examples with ``item_id`` (string, vocabulary-file table of ``vocab_size`` items
    ``item0``, ``item1``, ... plus 10 OOV buckets, asset ``vocab.txt``), ``user_id``
    (string, hashed into 100,000 buckets), ``country`` and ``device`` (vocabulary lists),
    ``age`` and ``price`` (floats). The **wide** part is a linear model
    (``linear_model``) over the categorical columns and two hashed crosses (country x
    device, user x device); the **deep** part embeds ``item_id`` (``embedding_column``,
    ``vocab_size x embedding_dim``: 12.8 MB at the defaults, read through ResourceGather),
    one-hot country and device and the numeric features into a 128-64 ReLU DNN. Their
    logits are summed; a logistic head gives ``probabilities`` [batch, 2].

    Weights look trained (linear weights non-zero, confident logits), so top-1 agreement
    of a quantized copy means something. Signatures as the Estimator exports a binary
    classifier: ``serving_default`` and ``classification`` (classify: ``classes``
    "0"/"1" and ``scores``), ``regression`` (regress: P(class 1)), ``predict``
    (``logits``, ``logistic``, ``probabilities``, ``class_ids``, ``classes``).
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with estimator_graph(seed) as (graph, scratch):
        vocab_path = write_vocabulary(scratch, wide_deep_vocabulary(vocab_size))
        wide, deep = _wide_deep_columns(vocab_path, vocab_size, embedding_dim, seed)
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        features = v1.io.parse_example(
            serialized, tf.feature_column.make_parse_example_spec(wide + deep))
        with v1.variable_scope("dnn"):
            with v1.variable_scope("input_from_feature_columns"):
                net = v1.feature_column.input_layer(features, deep)
            dnn = dnn_logits(net, (128, 64), 1, seed)
        with v1.variable_scope("linear"):
            linear_logits = v1.feature_column.linear_model(features, wide, units=1)
        # linear_model starts its weights at zero; training moves them.
        linear_vars = v1.get_collection(v1.GraphKeys.GLOBAL_VARIABLES, scope="linear")
        trained = [v.assign(v1.random_normal(v.shape, stddev=0.5, seed=seed + 100 + i))
                   for i, v in enumerate(linear_vars)]
        logits = tf.add(dnn, linear_logits, name="logits")
        logistic = tf.sigmoid(logits, name="logistic")
        probabilities = tf.concat([1.0 - logistic, logistic], axis=1, name="probabilities")
        class_ids = tf.cast(logits > 0.0, tf.int64, name="class_ids")  # [batch, 1]
        classes = tf.strings.as_string(class_ids, name="classes")
        all_classes = tf.tile(tf.constant([["0", "1"]]), tf.stack([tf.shape(logits)[0], 1]),
                              name="all_classes")
        classify = sigs.classification_signature_def(serialized, all_classes, probabilities)
        regress = sigs.regression_signature_def(serialized, logistic)
        predict = sigs.predict_signature_def(
            {"examples": serialized},
            {"logits": logits, "logistic": logistic, "probabilities": probabilities,
             "class_ids": class_ids, "classes": classes},
        )
        training_leftovers(embedding_slots=False)
        save_with_tables(graph, export_dir, {
            "serving_default": classify, "classification": classify, "regression": regress,
            "predict": predict}, trained=trained)
    return export_dir


def wide_deep_examples(count: int = 8, seed: int = 0, vocab_size: int = 100_000) -> list[bytes]:
    """Serialized tf.Examples for wide_deep: items mostly of its vocabulary (5% out of
    it), hashed users, countries and devices (a few unknown), ages and prices.
    """
    rng = np.random.default_rng(seed)
    countries = list(WIDE_DEEP_COUNTRIES) + ["zz"]
    devices = list(WIDE_DEEP_DEVICES) + ["fridge"]
    out = []
    for _ in range(count):
        item = int(rng.integers(vocab_size))
        out.append(serialized_example({
            "item_id": bytes_feature(f"item{item}" if rng.random() < 0.95 else f"new{item}"),
            "user_id": bytes_feature(f"user{rng.integers(1_000_000)}"),
            "country": bytes_feature(str(rng.choice(countries, p=[0.098] * 10 + [0.02]))),
            "device": bytes_feature(str(rng.choice(devices, p=[0.245] * 4 + [0.02]))),
            "age": float_feature(float(rng.uniform(18, 80))),
            "price": float_feature(float(rng.lognormal(3.0, 1.0))),
        }))
    return out
