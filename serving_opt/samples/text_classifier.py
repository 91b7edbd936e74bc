"""The ``text_classifier`` sample: an Estimator-like DNN text classifier, mostly one
embedding table (the shape of users' big exports), and its tf.Examples.

Example:
    >>> build_text_classifier("/tmp/models/text/1", vocab_size=5000, embedding_dim=32)
    '/tmp/models/text/1'
    >>> len(text_examples(4))
    4
"""

from __future__ import annotations

import numpy as np

from serving_opt.samples.tf1 import (
    bytes_feature,
    dnn_logits,
    estimator_graph,
    save_with_tables,
    serialized_example,
    training_leftovers,
    write_vocabulary,
)

TEXT_CLASS_NAMES = tuple(f"topic_{i:02d}" for i in range(20))
TEXT_OOV_BUCKETS = 100


def text_vocabulary(vocab_size: int) -> list[str]:
    """The text classifier's vocabulary: ``w0`` .. ``w<vocab_size - 1>``, one per line.

    Example:
        >>> text_vocabulary(3)
        ['w0', 'w1', 'w2']
    """
    return [f"w{i}" for i in range(vocab_size)]


def build_text_classifier(export_dir: str, seed: int = 0, vocab_size: int = 20000,
                          embedding_dim: int = 64, optimizer_slots: bool = True) -> str:
    """Writes an Estimator-like DNN text classifier SavedModel, mostly one embedding table.

    The shape of users' big exports: serialized tf.Examples with one string feature
    ``text`` (raw text, words separated by spaces) are split into words, looked up in a
    vocabulary-file table (asset ``vocab.txt``: ``vocab_size`` words ``w0``, ``w1``, ...
    plus ``TEXT_OOV_BUCKETS`` hashed OOV buckets), embedded with a mean combiner
    (feature columns: ``categorical_column_with_vocabulary_file`` + ``embedding_column``
    + ``input_layer``, so the table is read through ResourceGather) and classified by a
    256-128 ReLU head into 20 classes (``topic_00`` .. ``topic_19``).

    Signatures as DNNClassifier exports them: ``serving_default`` and ``classification``
    (classify: ``inputs`` to ``classes`` and ``scores``), ``predict`` (``examples`` to
    ``logits``, ``probabilities``, ``class_ids``, ``classes``).

    Like a checkpoint written by training, the variables also hold ``global_step`` and
    Adagrad accumulators (non-trainable ``<variable>/Adagrad``, same shapes, never read
    by the serving graph) for the dense layers and, with ``optimizer_slots``, for the
    embedding table. Sizes: the table is ``(vocab_size + 100) * embedding_dim * 4``
    bytes, so the default is ~5 MB (~10 MB with slots) and ``vocab_size=1_000_000,
    embedding_dim=256`` is 1.02 GB, ~2.05 GB on disk with the embedding slot. Tables
    are initialized in-graph (truncated normal, as ``embedding_column`` does; slots by
    Fill), so the full size builds without a numpy copy or a large graph constant: ~17 s
    and 2.6 GB peak RSS with the slot, ~13 s and 1.6 GB without (2 CPUs, TF 2.21).

    Example:
        >>> build_text_classifier("/tmp/models/text/1", vocab_size=5000, embedding_dim=32)
        '/tmp/models/text/1'
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with estimator_graph(seed) as (graph, scratch):
        vocab_path = write_vocabulary(scratch, text_vocabulary(vocab_size))
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        parsed = v1.io.parse_example(
            serialized, {"text": v1.io.FixedLenFeature([], tf.string, default_value="")})
        words = v1.string_split(parsed["text"], sep=" ")  # SparseTensor [batch, max_words]
        fc = tf.feature_column
        text_column = fc.embedding_column(
            fc.categorical_column_with_vocabulary_file(
                "text", vocab_path, vocabulary_size=vocab_size,
                num_oov_buckets=TEXT_OOV_BUCKETS),
            dimension=embedding_dim, combiner="mean",
            # Trained embeddings are far from their initial 1/sqrt(dim) scale; at it, every
            # answer would be a near-uniform tie and say nothing about top-1 agreement.
            initializer=v1.truncated_normal_initializer(stddev=1.0, seed=seed))
        with v1.variable_scope("dnn"):
            with v1.variable_scope("input_from_feature_columns"):
                net = v1.feature_column.input_layer({"text": words}, [text_column])
            logits = dnn_logits(net, (256, 128), len(TEXT_CLASS_NAMES), seed)
        logits = tf.identity(logits, name="logits")
        probabilities = tf.nn.softmax(logits, name="probabilities")
        class_ids = tf.expand_dims(tf.argmax(logits, axis=1), -1, name="class_ids")
        names = tf.constant(list(TEXT_CLASS_NAMES))
        classes = tf.gather(names, class_ids, name="classes")  # [batch, 1], as Estimator's
        all_classes = tf.tile(names[None, :], tf.stack([tf.shape(logits)[0], 1]),
                              name="all_classes")
        classify = sigs.classification_signature_def(serialized, all_classes, probabilities)
        predict = sigs.predict_signature_def(
            {"examples": serialized},
            {"logits": logits, "probabilities": probabilities, "class_ids": class_ids,
             "classes": classes},
        )
        training_leftovers(optimizer_slots)
        save_with_tables(graph, export_dir, {
            "serving_default": classify, "classification": classify, "predict": predict})
    return export_dir


def text_examples(count: int = 8, seed: int = 0, vocab_size: int = 20000) -> list[bytes]:
    """Serialized tf.Examples for text_classifier: ``text`` of 0-12 space-separated words,
    mostly from its vocabulary, some out of it (hashed to OOV buckets).

    Example:
        >>> len(text_examples(4))
        4
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        words = [f"w{i}" if rng.random() < 0.9 else f"oov{i}"
                 for i in rng.integers(0, vocab_size, size=rng.integers(0, 13))]
        out.append(serialized_example({"text": bytes_feature(" ".join(words))}))
    return out
