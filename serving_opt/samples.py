"""Small but realistic SavedModels to try the tool on (and to test it with).

They mimic what Estimators export (TF1 graphs, tf.Example parsing receivers,
vocabulary-file tables, classify/regress/predict signatures) but are built with
``tf.compat.v1`` so they exist on TF 2.16+ where ``tf.estimator`` is gone. Each
builder takes seconds and is deterministic for a given seed.

Usage:
    python -m serving_opt.samples --kind=classifier --output_dir=build/sample/1
    python -m serving_opt.samples --kind=text_classifier --output_dir=build/big/1 \
        --vocab_size=1000000 --embedding_dim=256   # ~2 GB, see build_text_classifier
    python -m serving_opt.samples --kind=wide_deep --output_dir=build/wide_deep/1
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence

import numpy as np

VOCABULARY = ("apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "honeydew")
CLASS_NAMES = ("negative", "neutral", "positive")

_KINDS = ("classifier", "multihead", "regressor", "convnet", "keras", "mobilenet_v2",
          "resnet50", "text_classifier", "wide_deep")

TEXT_CLASS_NAMES = tuple(f"topic_{i:02d}" for i in range(20))
TEXT_OOV_BUCKETS = 100
ADAGRAD_INITIAL_ACCUMULATOR = 0.1

WIDE_DEEP_COUNTRIES = ("us", "gb", "de", "fr", "in", "br", "jp", "mx", "ca", "au")
WIDE_DEEP_DEVICES = ("android", "ios", "web", "tv")
WIDE_DEEP_OOV_BUCKETS = 10
WIDE_DEEP_USER_BUCKETS = 100_000


def _tf():
    import tensorflow as tf

    return tf


def _write_vocabulary(directory: str, words: Sequence[str] = VOCABULARY) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(words) + "\n")
    return path


def _feature_columns(vocab_path: str):
    fc = _tf().feature_column
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
            "clicks", dtype=_tf().int64,
            normalizer_fn=lambda x: (_tf().cast(x, "float32") - 25.0) / 15.0,
        ),
    ]


def _save_tf1(sess, export_dir: str, signature_def_map: dict, main_op) -> None:
    tf = _tf()
    builder = tf.compat.v1.saved_model.Builder(export_dir)
    builder.add_meta_graph_and_variables(
        sess,
        [tf.compat.v1.saved_model.tag_constants.SERVING],
        signature_def_map=signature_def_map,
        assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
        main_op=main_op,
        strip_default_attrs=True,
    )
    builder.save()


def _parsed_features(scratch: str):
    """The Estimator parsing receiver: serialized tf.Examples in, the input layer out."""
    tf = _tf()
    v1 = tf.compat.v1
    columns = _feature_columns(_write_vocabulary(scratch))
    serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
    features = v1.io.parse_example(serialized, tf.feature_column.make_parse_example_spec(columns))
    return serialized, v1.feature_column.input_layer(features, columns)


def _save_with_tables(graph, export_dir: str, signatures: dict, trained=()) -> None:
    """Saves with Estimator's init op: local variables and tables initialized at load.

    ``trained``: ops run after the variables' initializers (values "training" gave).
    """
    v1 = _tf().compat.v1
    with graph.as_default():
        main_op = _tf().group(v1.local_variables_initializer(), v1.tables_initializer())
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            if trained:
                sess.run(list(trained))
            _save_tf1(sess, export_dir, signatures, main_op)


def _random_initializer(seed: int, stddev: float = 0.5):
    return _tf().compat.v1.random_normal_initializer(stddev=stddev, seed=seed)


# tf.compat.v1.layers is gone with Keras 3, so the few layers the samples need are
# spelled out with variables and raw ops, as Estimator-era graphs contain them.
def _dense(x, units: int, name: str, seed: int, initializer=None):
    v1 = _tf().compat.v1
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel", [x.shape[-1], units], initializer=initializer or _random_initializer(seed)
        )
        bias = v1.get_variable("bias", [units], initializer=_random_initializer(seed + 1, 0.1))
    return _tf().nn.bias_add(_tf().matmul(x, kernel), bias)


def _conv2d(x, filters: int, name: str, seed: int):
    v1 = _tf().compat.v1
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel", [3, 3, x.shape[-1], filters], initializer=_random_initializer(seed, 0.3)
        )
    return _tf().nn.conv2d(x, kernel, strides=1, padding="SAME")


def _batch_norm_variables(channels: int, name: str, seed: int):
    v1 = _tf().compat.v1
    with v1.variable_scope(name):
        gamma = v1.get_variable(
            "gamma", [channels], initializer=v1.random_uniform_initializer(0.5, 1.5, seed=seed)
        )
        beta = v1.get_variable("beta", [channels], initializer=_random_initializer(seed + 1, 0.1))
        mean = v1.get_variable(
            "moving_mean", [channels], initializer=_random_initializer(seed + 2, 0.3)
        )
        variance = v1.get_variable(
            "moving_variance", [channels],
            initializer=v1.random_uniform_initializer(0.5, 2.0, seed=seed + 3),
        )
    return gamma, beta, mean, variance


def _batch_norm(x, name: str, seed: int):
    """Inference-mode batch norm as unfused Rsqrt/Mul/Add ops (tf.nn.batch_normalization)."""
    gamma, beta, mean, variance = _batch_norm_variables(x.shape[-1], name, seed)
    return _tf().nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def _fused_batch_norm(x, name: str, seed: int):
    """Inference-mode FusedBatchNormV3, what Keras and tf.layers emitted for conv nets."""
    gamma, beta, mean, variance = _batch_norm_variables(x.shape[-1], name, seed)
    y, _, _ = _tf().compat.v1.nn.fused_batch_norm(
        x, gamma, beta, mean=mean, variance=variance, epsilon=1e-3, is_training=False
    )
    return y


def build_classifier(export_dir: str, seed: int = 0, with_regression: bool = False) -> str:
    """Writes an Estimator-like DNN classifier SavedModel to ``export_dir``.

    Features parsed from serialized tf.Examples: ``word`` (vocabulary-file
    embedding), ``city`` (hashed embedding), ``age`` (float), ``clicks`` (int64).
    A hidden layer with batch norm in inference mode feeds three classes.
    Signatures: ``serving_default`` and ``classification`` (classify), ``predict``;
    with ``with_regression`` also ``positive_score`` (regress: P(positive)), a model
    TF Serving's MultiInference can query with both kinds at once.

    Example:
        >>> build_classifier("/tmp/models/clf/1")
        '/tmp/models/clf/1'
    """
    tf = _tf()
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        v1.set_random_seed(seed)
        serialized, net = _parsed_features(scratch)
        net = _dense(net, 16, "hidden", seed + 1)
        net = tf.nn.relu(_batch_norm(net, "hidden_bn", seed + 3))
        logits = _dense(net, len(CLASS_NAMES), "logits_layer", seed + 7)
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
        _save_with_tables(graph, export_dir, signatures)
    return export_dir


def text_vocabulary(vocab_size: int) -> list[str]:
    """The text classifier's vocabulary: ``w0`` .. ``w<vocab_size - 1>``, one per line."""
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
    tf = _tf()
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        v1.set_random_seed(seed)
        vocab_path = _write_vocabulary(scratch, text_vocabulary(vocab_size))
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
            for i, units in enumerate((256, 128)):  # Glorot, as DNNClassifier's layers
                net = tf.nn.relu(_dense(net, units, f"hiddenlayer_{i}", seed + 10 * i,
                                        v1.glorot_uniform_initializer(seed + 10 * i)))
            # Logits of a trained classifier are large (confident answers); Glorot's would
            # make every answer a near tie. 100x the variance: ~10x the logits.
            logits = _dense(net, len(TEXT_CLASS_NAMES), "logits", seed + 50,
                            v1.variance_scaling_initializer(100.0, "fan_avg", "uniform",
                                                            seed=seed + 50))
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
        _training_leftovers(optimizer_slots)
        _save_with_tables(graph, export_dir, {
            "serving_default": classify, "classification": classify, "predict": predict})
    return export_dir


def _training_leftovers(embedding_slots: bool, global_step: int = 250_000) -> None:
    """What a training checkpoint adds: global_step and Adagrad accumulators (unused here)."""
    tf = _tf()
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


def wide_deep_vocabulary(vocab_size: int) -> list[str]:
    """The wide & deep model's item vocabulary: ``item0`` .. ``item<vocab_size - 1>``."""
    return [f"item{i}" for i in range(vocab_size)]


def _wide_deep_columns(vocab_path: str, vocab_size: int, embedding_dim: int, seed: int):
    """(wide columns, deep columns), as a DNNLinearCombinedClassifier is given them."""
    tf = _tf()
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

    Example:
        >>> build_wide_deep("/tmp/models/wide_deep/1", vocab_size=5000, embedding_dim=16)
        '/tmp/models/wide_deep/1'
    """
    tf = _tf()
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        v1.set_random_seed(seed)
        vocab_path = _write_vocabulary(scratch, wide_deep_vocabulary(vocab_size))
        wide, deep = _wide_deep_columns(vocab_path, vocab_size, embedding_dim, seed)
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        features = v1.io.parse_example(
            serialized, tf.feature_column.make_parse_example_spec(wide + deep))
        with v1.variable_scope("dnn"):
            with v1.variable_scope("input_from_feature_columns"):
                net = v1.feature_column.input_layer(features, deep)
            for i, units in enumerate((128, 64)):
                net = tf.nn.relu(_dense(net, units, f"hiddenlayer_{i}", seed + 10 * i,
                                        v1.glorot_uniform_initializer(seed + 10 * i)))
            # Confident logits, as a trained model's (see build_text_classifier).
            dnn_logits = _dense(net, 1, "logits", seed + 50,
                                v1.variance_scaling_initializer(100.0, "fan_avg", "uniform",
                                                                seed=seed + 50))
        with v1.variable_scope("linear"):
            linear_logits = v1.feature_column.linear_model(features, wide, units=1)
        # linear_model starts its weights at zero; training moves them.
        linear_vars = v1.get_collection(v1.GraphKeys.GLOBAL_VARIABLES, scope="linear")
        trained = [v.assign(v1.random_normal(v.shape, stddev=0.5, seed=seed + 100 + i))
                   for i, v in enumerate(linear_vars)]
        logits = tf.add(dnn_logits, linear_logits, name="logits")
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
        _training_leftovers(embedding_slots=False)
        _save_with_tables(graph, export_dir, {
            "serving_default": classify, "classification": classify, "regression": regress,
            "predict": predict}, trained=trained)
    return export_dir


def build_regressor(export_dir: str, seed: int = 0) -> str:
    """Writes an Estimator-like linear regressor SavedModel to ``export_dir``.

    Signatures: ``serving_default`` and ``regression`` (regress), ``predict``.

    Example:
        >>> build_regressor("/tmp/models/reg/1")
        '/tmp/models/reg/1'
    """
    tf = _tf()
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        v1.set_random_seed(seed)
        serialized, net = _parsed_features(scratch)
        predictions = _dense(net, 1, "linear", seed + 1)
        predictions = tf.identity(predictions, name="predictions")
        regress = sigs.regression_signature_def(serialized, predictions)
        predict = sigs.predict_signature_def(
            {"examples": serialized}, {"predictions": predictions}
        )
        _save_with_tables(
            graph, export_dir,
            {"serving_default": regress, "regression": regress, "predict": predict},
        )
    return export_dir


def build_convnet(export_dir: str, seed: int = 0) -> str:
    """Writes a small conv net with batch norm (inference mode) taking float images.

    Signature ``serving_default`` (predict): ``images`` float [None, 16, 16, 3] to
    ``scores`` [None, 4] and ``label`` int64 [None].

    Example:
        >>> build_convnet("/tmp/models/cnn/1")
        '/tmp/models/cnn/1'
    """
    tf = _tf()
    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        v1.set_random_seed(seed)
        images = v1.placeholder(tf.float32, [None, 16, 16, 3], name="images")
        net = images
        for i, filters in enumerate((8, 16)):
            net = _conv2d(net, filters, f"conv{i}", seed + 10 * i)
            net = tf.nn.relu(_fused_batch_norm(net, f"conv{i}_bn", seed + 10 * i + 2))
        net = tf.reduce_mean(net, axis=[1, 2])
        scores = _dense(net, 4, "head", seed + 60)
        scores = tf.identity(scores, name="scores")
        label = tf.argmax(scores, axis=1, name="label")
        predict = sigs.predict_signature_def({"images": images}, {"scores": scores, "label": label})
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            _save_tf1(sess, export_dir, {"serving_default": predict}, None)
    return export_dir


def build_keras(export_dir: str, seed: int = 0) -> str:
    """Writes a small Keras 3 model with ``model.export()`` (a TF2 object-graph SavedModel).

    Example:
        >>> build_keras("/tmp/models/keras/1")
        '/tmp/models/keras/1'
    """
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


# Small inputs keep the real architectures (every layer, every batch norm) but make
# them fast: MobileNetV2 at 96x96, ResNet50 at 64x64.
KERAS_APPLICATIONS = {"mobilenet_v2": ("MobileNetV2", 96), "resnet50": ("ResNet50", 64)}


def build_keras_application(kind: str, export_dir: str, seed: int = 0) -> str:
    """A ``keras.applications`` model (weights=None, fixed seed) exported with model.export.

    Untrained batch norms are identities (mean 0, variance 1, scale 1, offset 0), so
    folding them would change nothing measurable: they get trained-looking statistics.
    The head outputs logits (``classifier_activation=None``): a parity check on
    saturated probabilities would hide drift.

    Example:
        >>> build_keras_application("mobilenet_v2", "/tmp/models/mnv2/1")
        '/tmp/models/mnv2/1'
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


_BUILDERS = {
    "classifier": build_classifier,
    "multihead": lambda export_dir, seed=0: build_classifier(export_dir, seed, True),
    "regressor": build_regressor,
    "convnet": build_convnet,
    "keras": build_keras,
    "mobilenet_v2": lambda export_dir, seed=0: build_keras_application(
        "mobilenet_v2", export_dir, seed),
    "resnet50": lambda export_dir, seed=0: build_keras_application("resnet50", export_dir, seed),
    "text_classifier": build_text_classifier,
    "wide_deep": build_wide_deep,
}


def build(kind: str, export_dir: str, seed: int = 0, **options) -> str:
    """Builds the sample model ``kind`` (one of ``_KINDS``).

    ``options`` go to the builder: ``vocab_size``, ``embedding_dim`` and
    ``optimizer_slots`` for text_classifier; ``vocab_size`` and ``embedding_dim`` for
    wide_deep.

    Example:
        >>> build("regressor", "/tmp/models/reg/1")
        '/tmp/models/reg/1'
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown sample kind {kind!r}; choose one of {', '.join(_KINDS)}")
    return _BUILDERS[kind](export_dir, seed, **options)


def sample_examples(count: int = 8, seed: int = 0) -> list[bytes]:
    """Serialized tf.Examples matching the classifier/regressor parsing spec.

    Example:
        >>> len(sample_examples(4))
        4
    """
    tf = _tf()
    rng = np.random.default_rng(seed)
    words = list(VOCABULARY) + ["not-in-vocabulary"]
    out = []
    for _ in range(count):
        feature = {
            "word": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[rng.choice(words).encode()])
            ),
            "city": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[f"city-{rng.integers(100)}".encode()])
            ),
            "age": tf.train.Feature(
                float_list=tf.train.FloatList(value=[float(rng.uniform(18, 80))])
            ),
            "clicks": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(rng.integers(0, 50))])
            ),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        out.append(example.SerializeToString())
    return out


def text_examples(count: int = 8, seed: int = 0, vocab_size: int = 20000) -> list[bytes]:
    """Serialized tf.Examples for text_classifier: ``text`` of 0-12 space-separated words,
    mostly from its vocabulary, some out of it (hashed to OOV buckets).

    Example:
        >>> len(text_examples(4))
        4
    """
    tf = _tf()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        words = [f"w{i}" if rng.random() < 0.9 else f"oov{i}"
                 for i in rng.integers(0, vocab_size, size=rng.integers(0, 13))]
        feature = {"text": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[" ".join(words).encode()]))}
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        out.append(example.SerializeToString())
    return out


def wide_deep_examples(count: int = 8, seed: int = 0, vocab_size: int = 100_000) -> list[bytes]:
    """Serialized tf.Examples for wide_deep: items mostly of its vocabulary (5% out of
    it), hashed users, countries and devices (a few unknown), ages and prices.

    Example:
        >>> len(wide_deep_examples(4))
        4
    """
    tf = _tf()
    rng = np.random.default_rng(seed)
    countries = list(WIDE_DEEP_COUNTRIES) + ["zz"]
    devices = list(WIDE_DEEP_DEVICES) + ["fridge"]

    def strings(value: str):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))

    def floats(value: float):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))

    out = []
    for _ in range(count):
        item = int(rng.integers(vocab_size))
        feature = {
            "item_id": strings(f"item{item}" if rng.random() < 0.95 else f"new{item}"),
            "user_id": strings(f"user{rng.integers(1_000_000)}"),
            "country": strings(str(rng.choice(countries, p=[0.098] * 10 + [0.02]))),
            "device": strings(str(rng.choice(devices, p=[0.245] * 4 + [0.02]))),
            "age": floats(float(rng.uniform(18, 80))),
            "price": floats(float(rng.lognormal(3.0, 1.0))),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        out.append(example.SerializeToString())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The samples use deprecated-but-real TF1 APIs on purpose (that is what Estimators
    # exported); their deprecation warnings and TF's C++ start-up lines are noise here.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from serving_opt.savedmodel import loader

    loader.quiet_tensorflow_import()
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    parser.add_argument("--kind", choices=_KINDS, default="classifier")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="text_classifier and wide_deep: words (items) in vocab.txt "
                             "(default 20000, wide_deep 100000)")
    parser.add_argument("--embedding_dim", type=int, default=None,
                        help="text_classifier and wide_deep: embedding width "
                             "(default 64, wide_deep 32)")
    parser.add_argument("--nooptimizer_slots", dest="optimizer_slots", action="store_false",
                        help="text_classifier only: no Adagrad slot for the embedding "
                             "(halves the export at full size)")
    args = parser.parse_args(argv)
    options = {}
    if args.kind in ("text_classifier", "wide_deep"):
        if args.kind == "text_classifier":
            options = {"optimizer_slots": args.optimizer_slots}
        elif not args.optimizer_slots:
            parser.error("--nooptimizer_slots applies to --kind=text_classifier only")
        if args.vocab_size is not None:
            options["vocab_size"] = args.vocab_size
        if args.embedding_dim is not None:
            options["embedding_dim"] = args.embedding_dim
    elif args.vocab_size is not None or args.embedding_dim is not None \
            or not args.optimizer_slots:
        parser.error("--vocab_size, --embedding_dim and --nooptimizer_slots apply to "
                     "--kind=text_classifier and wide_deep only")
    if os.path.exists(os.path.join(args.output_dir, "saved_model.pb")):
        print(f"{args.output_dir} already holds a SavedModel; leaving it as it is")
        return 0
    build(args.kind, args.output_dir, args.seed, **options)
    print(f"wrote {args.kind} SavedModel to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
