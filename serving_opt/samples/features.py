"""The tf.Examples the classifier, multihead and regressor samples parse, and their columns.

Four features, as an Estimator's parsing receiver reads them: ``word`` (string,
vocabulary-file embedding over :data:`VOCABULARY` plus one OOV bucket), ``city``
(string, hashed embedding), ``age`` (float) and ``clicks`` (int64), both normalized in
their column.
"""

from __future__ import annotations

import numpy as np

from serving_opt.samples.tf1 import (
    bytes_feature,
    float_feature,
    int64_feature,
    serialized_example,
    write_vocabulary,
)

VOCABULARY = ("apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "honeydew")


def _feature_columns(vocab_path: str):
    import tensorflow as tf

    fc = tf.feature_column
    word = fc.categorical_column_with_vocabulary_file(
        "word", vocab_path, num_oov_buckets=1
    )
    city = fc.categorical_column_with_hash_bucket("city", hash_bucket_size=20)
    return [
        fc.embedding_column(word, dimension=6),
        fc.embedding_column(city, dimension=3),
        # Estimator users normalize in the column; it also keeps the logits unsaturated,
        # so parity checks compare meaningful probabilities.
        fc.numeric_column("age", normalizer_fn=lambda x: (x - 45.0) / 15.0),
        fc.numeric_column(
            "clicks", dtype=tf.int64,
            normalizer_fn=lambda x: (tf.cast(x, "float32") - 25.0) / 15.0,
        ),
    ]


def parsed_features(scratch: str):
    """The Estimator parsing receiver: serialized tf.Examples in, the input layer out.

    ``scratch`` receives the vocabulary file (an asset of the saved model).
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    columns = _feature_columns(write_vocabulary(scratch, VOCABULARY))
    serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
    features = v1.io.parse_example(serialized, tf.feature_column.make_parse_example_spec(columns))
    return serialized, v1.feature_column.input_layer(features, columns)


def sample_examples(count: int = 8, seed: int = 0) -> list[bytes]:
    """Serialized tf.Examples matching the classifier/regressor parsing spec."""
    rng = np.random.default_rng(seed)
    words = list(VOCABULARY) + ["not-in-vocabulary"]
    return [
        serialized_example({
            "word": bytes_feature(rng.choice(words)),
            "city": bytes_feature(f"city-{rng.integers(100)}"),
            "age": float_feature(float(rng.uniform(18, 80))),
            "clicks": int64_feature(int(rng.integers(0, 50))),
        })
        for _ in range(count)
    ]
