"""The ``text_classifier`` sample: an Estimator-like DNN text classifier, mostly one
embedding table (the shape of users' big exports), and its tf.Examples.
"""

from __future__ import annotations

import functools

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
    """The text classifier's vocabulary: ``w0`` .. ``w<vocab_size - 1>``, one per line."""
    return [f"w{i}" for i in range(vocab_size)]


def build_text_classifier(export_dir: str, seed: int = 0, vocab_size: int = 20000,
                          embedding_dim: int = 64, optimizer_slots: bool = True,
                          train_examples: int = 0) -> str:
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

    Untrained (``train_examples=0``), the weights are random, scaled so that most answers
    are not near-ties. With ``train_examples``, the model is first trained on that many
    texts of :func:`topic_texts` (each word belongs to one topic, a text mostly to its
    label's), then exported from a fresh graph with the trained values, as Estimator
    exports from its checkpoint: a real trained table, with the structure quantization
    must keep. Requests of that distribution: ``text_examples(..., topics=True)``.
    Covering a 1M vocabulary a few times takes ~1M examples.
    """
    if train_examples < 0:
        raise ValueError(f"train_examples must be >= 0, got {train_examples}")
    import tensorflow as tf

    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    trained_values = (_train(vocab_size, embedding_dim, seed, train_examples)
                      if train_examples else None)
    with estimator_graph(seed) as (graph, scratch):
        vocab_path = write_vocabulary(scratch, text_vocabulary(vocab_size))
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        parsed = v1.io.parse_example(
            serialized, {"text": v1.io.FixedLenFeature([], tf.string, default_value="")})
        logits = _logits(parsed["text"], vocab_path, vocab_size, embedding_dim, seed,
                         trained=bool(train_examples))
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
            "serving_default": classify, "classification": classify, "predict": predict},
            values=trained_values)
    return export_dir


def _logits(text, vocab_path: str, vocab_size: int, embedding_dim: int, seed: int,
            trained: bool):
    """The model from raw text (a string tensor [batch]) to logits, in the default graph:
    the same variable names whether built to export or to train."""
    import tensorflow as tf

    v1 = tf.compat.v1
    words = v1.string_split(text, sep=" ")  # SparseTensor [batch, max_words]
    fc = tf.feature_column
    text_column = fc.embedding_column(
        fc.categorical_column_with_vocabulary_file(
            "text", vocab_path, vocabulary_size=vocab_size, num_oov_buckets=TEXT_OOV_BUCKETS),
        dimension=embedding_dim, combiner="mean",
        # Trained: embedding_column's own 1/sqrt(dim) start, training sets the scale.
        # Untrained embeddings at that scale would make every answer a near-uniform tie
        # and say nothing about top-1 agreement, so they start far from it.
        initializer=v1.truncated_normal_initializer(
            stddev=embedding_dim ** -0.5 if trained else 1.0, seed=seed))
    with v1.variable_scope("dnn"):
        with v1.variable_scope("input_from_feature_columns"):
            net = v1.feature_column.input_layer({"text": words}, [text_column])
        return dnn_logits(net, (256, 128), len(TEXT_CLASS_NAMES), seed,
                          logits_variance=1.0 if trained else 100.0)


def _train(vocab_size: int, embedding_dim: int, seed: int, examples: int,
           batch: int = 8192) -> dict:
    """Trains the model on ``examples`` texts of :func:`topic_texts` (Adam, one pass in
    batches of ``batch``); its trainable variables'
    values by name. The optimizer's slots stay here: the export is built from a fresh
    graph, as Estimator exports from a checkpoint."""
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(seed + 1)
    with estimator_graph(seed) as (graph, scratch):
        vocab_path = write_vocabulary(scratch, text_vocabulary(vocab_size))
        text = v1.placeholder(tf.string, [None])
        labels = v1.placeholder(tf.int64, [None])
        logits = _logits(text, vocab_path, vocab_size, embedding_dim, seed, trained=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        # Adam, as many Estimator users configure it: Adagrad's steps on a mean of 6 rows
        # are too small for one pass to move a row seen a few times.
        step = v1.train.AdamOptimizer(0.01).minimize(loss)
        with v1.Session(graph=graph) as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            for start in range(0, examples, batch):
                texts, ys = topic_texts(min(batch, examples - start), rng, vocab_size)
                sess.run(step, {text: texts, labels: ys})
            variables = v1.trainable_variables()
            return dict(zip([v.op.name for v in variables], sess.run(variables)))


def word_topics(vocab_size: int) -> np.ndarray:
    """Each vocabulary word's topic (0-19): a fixed pseudo-random assignment, the structure
    a trained text classifier learns.
    """
    return np.random.default_rng(1234).integers(0, len(TEXT_CLASS_NAMES), vocab_size)


@functools.lru_cache(maxsize=2)
def _topic_index(vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Word ids sorted by topic, and where each topic's run starts (the last entry ends
    them): computed once per vocabulary, not for each training batch."""
    topics = word_topics(vocab_size)
    by_topic = np.argsort(topics, kind="stable")
    return by_topic, np.searchsorted(topics[by_topic], np.arange(len(TEXT_CLASS_NAMES) + 1))


def topic_texts(count: int, rng: np.random.Generator,
                vocab_size: int) -> tuple[list[bytes], np.ndarray]:
    """``count`` texts and their labels: a label (uniform over the 20 topics), 0-12 words,
    each of them out of the vocabulary (``oov<i>``) with probability 0.1, else one of the
    label's words with probability 0.6, else any word. Word frequencies are skewed as in
    text: within a topic (and within the vocabulary), a word's rank is ``size * u**4`` for
    uniform u, so the top 1% of words are 32% of the draws and half of them are rare.
    """
    by_topic, starts = _topic_index(vocab_size)
    labels = rng.integers(0, len(TEXT_CLASS_NAMES), count)
    lengths = rng.integers(0, 13, count)
    owner = np.repeat(labels, lengths)
    sizes = starts[owner + 1] - starts[owner]
    topical = by_topic[starts[owner] + (rng.random(owner.size) ** 4 * sizes).astype(np.int64)]
    anyword = (rng.random(owner.size) ** 4 * vocab_size).astype(np.int64)
    ids = np.where(rng.random(owner.size) < 0.6, topical, anyword)
    oov = rng.random(owner.size) < 0.1
    words = [f"oov{i}" if o else f"w{i}" for i, o in zip(ids.tolist(), oov.tolist())]
    ends = np.cumsum(lengths)
    texts = [" ".join(words[e - n:e]).encode() for e, n in zip(ends.tolist(), lengths.tolist())]
    return texts, labels


def text_examples(count: int = 8, seed: int = 0, vocab_size: int = 20000,
                  topics: bool = False) -> list[bytes]:
    """Serialized tf.Examples for text_classifier: ``text`` of 0-12 space-separated words,
    mostly from its vocabulary, some out of it (hashed to OOV buckets). ``topics``: drawn
    as :func:`topic_texts` (the trained model's training distribution), else uniformly.
    """
    rng = np.random.default_rng(seed)
    if topics:
        texts, _ = topic_texts(count, rng, vocab_size)
        return [serialized_example({"text": bytes_feature(t.decode())}) for t in texts]
    out = []
    for _ in range(count):
        words = [f"w{i}" if rng.random() < 0.9 else f"oov{i}"
                 for i in rng.integers(0, vocab_size, size=rng.integers(0, 13))]
        out.append(serialized_example({"text": bytes_feature(" ".join(words))}))
    return out
