"""The building blocks of the Estimator-like samples, in ``tf.compat.v1``.

``tf.compat.v1.layers`` is gone with Keras 3, so the few layers the samples need are
spelled out with variables and raw ops, as Estimator-era graphs contain them; graphs are
saved as Estimators export them (serving tag, assets, an init op for local variables and
tables). TensorFlow is imported when a sample is built, not when this module is: the
command line quiets TensorFlow before its import.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence

ADAGRAD_INITIAL_ACCUMULATOR = 0.1


@contextlib.contextmanager
def estimator_graph(seed: int) -> Iterator[tuple[object, str]]:
    """(graph, scratch directory): a new default graph with graph-level seed ``seed``, and
    a directory for the files (vocabularies) that become its assets.
    """
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        tf.compat.v1.set_random_seed(seed)
        yield graph, scratch


def write_vocabulary(directory: str, words: Sequence[str]) -> str:
    """Writes ``vocab.txt`` (one word a line) into ``directory``; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(words) + "\n")
    return path


def save_tf1(sess, export_dir: str, signature_def_map: dict, main_op) -> None:
    """Saves the session's graph as an Estimator does: serving tag, asset files, ``main_op``."""
    import tensorflow as tf

    v1 = tf.compat.v1
    builder = v1.saved_model.Builder(export_dir)
    builder.add_meta_graph_and_variables(
        sess,
        [v1.saved_model.tag_constants.SERVING],
        signature_def_map=signature_def_map,
        assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
        main_op=main_op,
        strip_default_attrs=True,
    )
    builder.save()


def save_with_tables(graph, export_dir: str, signatures: dict, trained=(),
                     values: dict | None = None) -> None:
    """Saves with Estimator's init op: local variables and tables initialized at load.

    ``trained``: ops run after the variables' initializers (values "training" gave).
    ``values``: variable name -> array, fed as those variables' initial values (trained
    elsewhere), without adding an op to the saved graph.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    with graph.as_default():
        main_op = tf.group(v1.local_variables_initializer(), v1.tables_initializer())
        with v1.Session(graph=graph) as sess:
            feed = {}
            for var in v1.global_variables():
                if values and var.op.name in values:
                    feed[var.initial_value] = values[var.op.name]
            sess.run(v1.global_variables_initializer(), feed)
            if trained:
                sess.run(list(trained))
            save_tf1(sess, export_dir, signatures, main_op)


def random_initializer(seed: int, stddev: float = 0.5):
    """A seeded normal initializer (the samples' stand-in for trained weights)."""
    import tensorflow as tf

    return tf.compat.v1.random_normal_initializer(stddev=stddev, seed=seed)


def dense(x, units: int, name: str, seed: int, initializer=None):
    """A dense layer (``<name>/kernel``, ``<name>/bias``) without activation."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel", [x.shape[-1], units], initializer=initializer or random_initializer(seed)
        )
        bias = v1.get_variable("bias", [units], initializer=random_initializer(seed + 1, 0.1))
    return tf.nn.bias_add(tf.matmul(x, kernel), bias)


def dnn_logits(net, hidden_units: Sequence[int], logits_units: int, seed: int,
               logits_variance: float = 100.0):
    """A DNNClassifier's layers: Glorot ReLU ``hiddenlayer_<i>`` then ``logits``.

    The logits of a trained classifier are large (confident answers); Glorot's would make
    every answer of an untrained one a near tie. So the logits layer has
    ``logits_variance`` times Glorot's variance (100: ~10x the logits); 1 to train it.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    for i, units in enumerate(hidden_units):
        net = tf.nn.relu(dense(net, units, f"hiddenlayer_{i}", seed + 10 * i,
                               v1.glorot_uniform_initializer(seed + 10 * i)))
    return dense(net, logits_units, "logits", seed + 50,
                 v1.variance_scaling_initializer(logits_variance, "fan_avg", "uniform",
                                                 seed=seed + 50))


def conv2d(x, filters: int, name: str, seed: int):
    """A 3x3 same-padded convolution (``<name>/kernel``), no bias."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel", [3, 3, x.shape[-1], filters], initializer=random_initializer(seed, 0.3)
        )
    return tf.nn.conv2d(x, kernel, strides=1, padding="SAME")


def _batch_norm_variables(channels: int, name: str, seed: int):
    import tensorflow as tf

    v1 = tf.compat.v1
    with v1.variable_scope(name):
        gamma = v1.get_variable(
            "gamma", [channels], initializer=v1.random_uniform_initializer(0.5, 1.5, seed=seed)
        )
        beta = v1.get_variable("beta", [channels], initializer=random_initializer(seed + 1, 0.1))
        mean = v1.get_variable(
            "moving_mean", [channels], initializer=random_initializer(seed + 2, 0.3)
        )
        variance = v1.get_variable(
            "moving_variance", [channels],
            initializer=v1.random_uniform_initializer(0.5, 2.0, seed=seed + 3),
        )
    return gamma, beta, mean, variance


def batch_norm(x, name: str, seed: int):
    """Inference-mode batch norm as unfused Rsqrt/Mul/Add ops (tf.nn.batch_normalization)."""
    import tensorflow as tf

    gamma, beta, mean, variance = _batch_norm_variables(x.shape[-1], name, seed)
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def fused_batch_norm(x, name: str, seed: int):
    """Inference-mode FusedBatchNormV3, what Keras and tf.layers emitted for conv nets."""
    import tensorflow as tf

    gamma, beta, mean, variance = _batch_norm_variables(x.shape[-1], name, seed)
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(
        x, gamma, beta, mean=mean, variance=variance, epsilon=1e-3, is_training=False
    )
    return y


def training_leftovers(embedding_slots: bool, global_step: int = 250_000) -> None:
    """What a training checkpoint adds: global_step and Adagrad accumulators (unused here)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.get_variable(
        "global_step", [], tf.int64, initializer=v1.constant_initializer(global_step),
        trainable=False,
        collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.GLOBAL_STEP])
    for var in v1.trainable_variables():
        if not embedding_slots and "embedding_weights" in var.op.name:
            continue
        v1.get_variable(  # Fill in the init graph, no constant of the table's size
            f"{var.op.name}/Adagrad", var.shape, var.dtype.base_dtype,
            initializer=v1.constant_initializer(ADAGRAD_INITIAL_ACCUMULATOR), trainable=False)


def serialized_example(feature: dict) -> bytes:
    """A serialized tf.Example of ``feature`` (name -> tf.train.Feature)."""
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def bytes_feature(value: str):
    """A tf.train.Feature of one UTF-8 string."""
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))


def float_feature(value: float):
    """A tf.train.Feature of one float."""
    import tensorflow as tf

    return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))


def int64_feature(value: int):
    """A tf.train.Feature of one int64."""
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
