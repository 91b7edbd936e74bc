"""Writes the tests/corpus SavedModels of one TensorFlow release (issue 29).

Run by the python of a throwaway venv that has `tensorflow-cpu==2.NN.*` (and `tf-keras`
where it exists), built by `make corpus-models`:

    build/corpus-venvs/tf-2.NN/bin/python tools/corpus_writers/write_models.py \
        --out tests/corpus/models/tf-2.NN

Every kind is written by that release's own writers (tf.compat.v1.saved_model.Builder,
tf.saved_model.save, Keras 2's model.save, Keras 3's model.export), so the corpus holds
what those releases really put on disk. Each kind is tried on its own: one that fails is
reported (and recorded in WRITER.json beside the models) and the others are still written.
Values are fixed (numpy seed, explicit initial values), so reruns compute the same outputs.

Kinds (each a SavedModel directory under --out):
  estimator_tf1    TF1 graph in an Estimator's shape: serialized tf.Example placeholder ->
                   tf.io.parse_example -> vocabulary-file categorical column + embedding
                   column + numeric column -> dense layers; classify (serving_default,
                   classification), regress (regression) and predict signatures; the
                   vocabulary file is an asset; main op = tables initializer.
  keras2           Keras 2 (tf.keras <= 2.15, tf_keras >= 2.16) functional Dense +
                   BatchNormalization model, tf.saved_model.save.
  keras2_model_save  the same model through Keras 2's model.save(path, save_format="tf").
  keras3           Keras 3 (bundled from 2.16) Dense + BatchNormalization, model.export(path).
  keras3_saved_model_save  the same Keras 3 model through tf.saved_model.save(model, path):
                   the session loader (TF Serving's) loads it and fails every request
                   (keras-team/keras#19274); tf.saved_model.load answers.
  module_table     tf.Module: StaticHashTable from a TextFileInitializer over an asset
                   vocabulary, a variable, signature strings -> ids + float score.
  transform_layer  tf.Transform-style preprocessing: serialized tf.Example -> VarLenFeature
                   strings densified to [batch, 1] -> two vocabulary tables (one a
                   StaticVocabularyTable with OOV buckets) + a scaled FixedLenFeature float.
  keras3_subclassed  keras3's layers in a subclassed keras.Model, model.export.
  keras3_subclassed_saved_model_save  the same through tf.saved_model.save (unservable by
                   the session loader, like keras3_saved_model_save).
  keras3_module_wrapped  the keras3 model held by a tf.Module whose own tf.function is the
                   signature, tf.saved_model.save (tensorflow/tensorflow#72963's recipe).
  keras3_string_lookup  string input: StringLookup (a vocabulary table) -> Embedding ->
                   pooling -> Dense, model.export.
  keras3_export_endpoints  keras.export.ExportArchive with two endpoints (scores, hidden
                   activations) over one model's variables.
  keras2_subclassed  Keras 2's subclassed model, tf.saved_model.save.
  keras2_module_wrapped  a Keras 2 functional model held by a tf.Module, tf.saved_model.save.
  ragged_module    tf.Module whose signature takes a tf.RaggedTensorSpec (flattened by the
                   writer into two inputs: flat values `ids`, row splits `ids_1`).
  multi_signature  tf.Module, three signatures (two float, one string through a
                   KeyValueTensorInitializer table) over one set of variables.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SEED = 29
COLORS = ["red", "green", "blue"]
CITIES = ["paris", "tokyo", "lima", "oslo"]
WORDS = ["the", "quick", "brown", "fox", "jumps"]


def tf_minor():
    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def write_vocab(directory, name, words):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("".join(w + "\n" for w in words))
    return path


def rng(offset=0):
    return np.random.RandomState(SEED + offset)


# --------------------------------------------------------------------------- estimator_tf1


def estimator_tf1(path, tmp):
    """An Estimator-shaped TF1 export, without tf.estimator (gone from TF 2.16).

    Mirrors what canned DNNClassifier + build_parsing_serving_input_receiver_fn export:
    placeholder `input_example_tensor` of serialized examples, parse_example, feature
    columns through input_layer, `dnn/hiddenlayer_0`, `dnn/logits`, a binary head, and the
    signatures classification/serving_default (classify), regression (regress), predict.
    """
    v1 = tf.compat.v1
    r = rng(1)
    vocab = write_vocab(tmp, "color_vocab.txt", COLORS)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(SEED)
        global_step = v1.train.get_or_create_global_step()
        serialized = v1.placeholder(tf.string, [None], name="input_example_tensor")
        fc = v1.feature_column
        color = fc.categorical_column_with_vocabulary_file(
            "color", vocab, vocabulary_size=len(COLORS), num_oov_buckets=1)
        color_emb = fc.embedding_column(
            color, dimension=4,
            initializer=v1.constant_initializer(r.uniform(-1, 1, (len(COLORS) + 1, 4))))
        x = fc.numeric_column("x", shape=(1,))
        columns = [color_emb, x]
        spec = fc.make_parse_example_spec(columns)
        features = tf.io.parse_example(serialized, spec)
        with v1.variable_scope("dnn"):
            with v1.variable_scope("input_from_feature_columns"):
                net = fc.input_layer(features, columns)
            with v1.variable_scope("hiddenlayer_0"):
                k0 = v1.get_variable(
                    "kernel", initializer=r.normal(0, 0.5, (5, 8)).astype(np.float32))
                b0 = v1.get_variable("bias", initializer=r.normal(0, 0.1, (8,)).astype(np.float32))
                hidden = tf.nn.relu(tf.matmul(net, k0) + b0)
            with v1.variable_scope("logits"):
                k1 = v1.get_variable(
                    "kernel", initializer=r.normal(0, 0.5, (8, 1)).astype(np.float32))
                b1 = v1.get_variable("bias", initializer=np.array([0.1], np.float32))
                logits = tf.matmul(hidden, k1) + b1
        with v1.name_scope("head"):
            logistic = tf.sigmoid(logits, name="logistic")
            probabilities = tf.concat([1.0 - logistic, logistic], axis=1, name="probabilities")
            class_ids = tf.expand_dims(tf.argmax(probabilities, axis=1), -1, name="class_ids")
            classes = tf.strings.as_string(class_ids, name="str_classes")
            batch = tf.shape(probabilities)[0]
            all_class_ids = tf.tile(
                tf.constant([[0, 1]], tf.int32), [batch, 1], name="all_class_ids")
            all_classes = tf.tile(tf.constant([["0", "1"]]), [batch, 1], name="all_classes")
        sig = v1.saved_model.signature_def_utils
        classify = sig.classification_signature_def(serialized, all_classes, probabilities)
        signatures = {
            "serving_default": classify,
            "classification": classify,
            "regression": sig.regression_signature_def(serialized, logistic),
            "predict": sig.predict_signature_def(
                {"examples": serialized},
                {"logits": logits, "logistic": logistic, "probabilities": probabilities,
                 "class_ids": class_ids, "classes": classes,
                 "all_class_ids": all_class_ids, "all_classes": all_classes}),
        }
        del global_step
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(v1.tables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, [v1.saved_model.tag_constants.SERVING],
                signature_def_map=signatures,
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer(),
                strip_default_attrs=True)
            builder.save()
    return "tf.compat.v1.saved_model.Builder (Estimator-shaped TF1 graph, feature columns)"


# --------------------------------------------------------------------------- Keras 2 / 3


def keras2_module():
    """(module, name, version) of Keras 2: tf.keras up to TF 2.15, tf_keras from 2.16."""
    from importlib import metadata
    major, minor = tf_minor()
    if (major, minor) <= (2, 15):
        # tf.keras is a lazy loader over the `keras` 2.x package (no __version__ on 2.13).
        version = getattr(tf.keras, "__version__", None) or metadata.version("keras")
        return tf.keras, "tf.keras", version
    import tf_keras  # noqa: F401  (Keras 2 beside Keras 3 from TF 2.16 on)
    return tf_keras, "tf_keras", tf_keras.__version__


def set_weights(model, offset):
    r = rng(offset)
    weights = []
    for w in model.weights:
        shape = tuple(w.shape)
        name = w.name
        if "moving_variance" in name:
            weights.append(r.uniform(0.5, 2.0, shape).astype(np.float32))
        elif "moving_mean" in name or "bias" in name or "beta" in name:
            weights.append(r.normal(0, 0.2, shape).astype(np.float32))
        elif "gamma" in name:
            weights.append(r.uniform(0.8, 1.2, shape).astype(np.float32))
        else:
            weights.append(r.normal(0, 0.4, shape).astype(np.float32))
    model.set_weights(weights)


def dense_bn_model(k):
    inputs = k.Input(shape=(4,), name="features")
    x = k.layers.Dense(8, activation="relu", name="dense")(inputs)
    x = k.layers.BatchNormalization(name="bn")(x)
    outputs = k.layers.Dense(3, activation="softmax", name="probabilities")(x)
    return k.Model(inputs, outputs, name="dense_bn")


def keras2(path, tmp):
    k, name, version = keras2_module()
    if not version.startswith("2."):
        raise RuntimeError(f"{name} is Keras {version}, not Keras 2")
    k.utils.set_random_seed(SEED)
    model = dense_bn_model(k)
    set_weights(model, 2)
    tf.saved_model.save(model, path)
    return f"{name} {version} functional model, tf.saved_model.save"


def keras2_model_save(path, tmp):
    k, name, version = keras2_module()
    if not version.startswith("2."):
        raise RuntimeError(f"{name} is Keras {version}, not Keras 2")
    k.utils.set_random_seed(SEED)
    model = dense_bn_model(k)
    set_weights(model, 2)
    model.save(path, save_format="tf")
    return f"{name} {version} functional model, model.save(path, save_format='tf')"


def keras3(path, tmp):
    import keras
    if not keras.__version__.startswith("3."):
        raise RuntimeError(
            f"keras is {keras.__version__}, not Keras 3 (Keras 3 ships with TF >= 2.16)")
    keras.utils.set_random_seed(SEED)
    model = dense_bn_model(keras)
    set_weights(model, 3)
    model.export(path)
    return f"keras {keras.__version__} functional model, model.export"


def keras3_saved_model_save(path, tmp):
    import keras
    if not keras.__version__.startswith("3."):
        raise RuntimeError(
            f"keras is {keras.__version__}, not Keras 3 (Keras 3 ships with TF >= 2.16)")
    keras.utils.set_random_seed(SEED)
    model = dense_bn_model(keras)
    set_weights(model, 3)
    tf.saved_model.save(model, path)
    return f"keras {keras.__version__} functional model, tf.saved_model.save"


def subclassed_model(k):
    """dense_bn_model's layers in a subclassed Model (built, so it has its weights)."""
    class DenseBN(k.Model):
        def __init__(self):
            super().__init__(name="dense_bn_subclassed")
            self.dense = k.layers.Dense(8, activation="relu", name="dense")
            self.bn = k.layers.BatchNormalization(name="bn")
            self.out = k.layers.Dense(3, activation="softmax", name="probabilities")

        def call(self, x, training=False):
            return self.out(self.bn(self.dense(x), training=training))

    model = DenseBN()
    model(np.zeros((1, 4), np.float32))  # builds the weights
    return model


def keras3_module(what):
    import keras
    if not keras.__version__.startswith("3."):
        raise RuntimeError(
            f"keras is {keras.__version__}, not Keras 3 (Keras 3 ships with TF >= 2.16)")
    keras.utils.set_random_seed(SEED)
    return keras, f"keras {keras.__version__} {what}"


def keras3_subclassed(path, tmp):
    keras, writer = keras3_module("subclassed model, model.export")
    model = subclassed_model(keras)
    set_weights(model, 3)
    model.export(path)
    return writer


def keras3_subclassed_saved_model_save(path, tmp):
    keras, writer = keras3_module("subclassed model, tf.saved_model.save")
    model = subclassed_model(keras)
    set_weights(model, 3)
    tf.saved_model.save(model, path)
    return writer


class KerasWrapper(tf.Module):
    """A Keras model held by a tf.Module with its own serving function (the recipe of
    tensorflow/tensorflow#72963 and of users who add pre/post-processing)."""

    def __init__(self, model):
        super().__init__(name="wrapper")
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
    def serve(self, features):
        probabilities = self.model(features)
        return {"probabilities": probabilities,
                "class_id": tf.argmax(probabilities, axis=-1)}


def keras3_module_wrapped(path, tmp):
    keras, writer = keras3_module("functional model held by a tf.Module, tf.saved_model.save")
    model = dense_bn_model(keras)
    set_weights(model, 3)
    module = KerasWrapper(model)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return writer


def keras3_string_lookup(path, tmp):
    """String input: StringLookup (a table initialized from the vocabulary) -> Embedding."""
    keras, writer = keras3_module("functional StringLookup + Embedding on string input, "
                                  "model.export")
    inputs = keras.Input(shape=(2,), dtype="string", name="words")
    ids = keras.layers.StringLookup(vocabulary=WORDS, num_oov_indices=1, name="lookup")(inputs)
    x = keras.layers.Embedding(len(WORDS) + 1, 3, name="embedding")(ids)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = keras.layers.Dense(2, name="logits")(x)
    model = keras.Model(inputs, outputs, name="words_model")
    r = rng(5)
    model.set_weights([r.normal(0, 0.5, tuple(w.shape)).astype(np.float32)
                       for w in model.weights])
    model.export(path)
    return writer


def keras3_export_endpoints(path, tmp):
    """keras.export.ExportArchive: two endpoints over one model's variables (the scores and
    the hidden layer's activations)."""
    keras, writer = keras3_module("ExportArchive with two endpoints sharing the variables")
    model = dense_bn_model(keras)
    set_weights(model, 3)
    hidden = keras.Model(model.inputs, model.get_layer("bn").output, name="hidden")
    archive = keras.export.ExportArchive()
    archive.track(model)
    spec = [tf.TensorSpec([None, 4], tf.float32, name="features")]
    archive.add_endpoint("serving_default", model.__call__, input_signature=spec)
    archive.add_endpoint("embed", hidden.__call__, input_signature=spec)
    archive.write_out(path)
    return writer


def keras2_checked():
    k, name, version = keras2_module()
    if not version.startswith("2."):
        raise RuntimeError(f"{name} is Keras {version}, not Keras 2")
    k.utils.set_random_seed(SEED)
    return k, f"{name} {version}"


def keras2_subclassed(path, tmp):
    k, who = keras2_checked()
    model = subclassed_model(k)
    set_weights(model, 2)
    tf.saved_model.save(model, path)
    return f"{who} subclassed model, tf.saved_model.save"


def keras2_module_wrapped(path, tmp):
    k, who = keras2_checked()
    model = dense_bn_model(k)
    set_weights(model, 2)
    module = KerasWrapper(model)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return f"{who} functional model held by a tf.Module, tf.saved_model.save"


# --------------------------------------------------------------------------- tf.Module, other


class RaggedModule(tf.Module):
    """A RaggedTensorSpec input: the SignatureDef takes it as two tensors, the flat values
    (`ids`) and the row splits (`ids_1`), which TF Serving's clients must send."""

    def __init__(self):
        super().__init__(name="ragged")
        self.table = tf.Variable(rng(6).normal(0, 1, (len(WORDS), 3)).astype(np.float32),
                                 name="embeddings")

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
    def serve(self, ids):
        vectors = tf.gather(self.table, tf.clip_by_value(ids, 0, len(WORDS) - 1))
        # Reducing the ragged axis leaves a dense [batch, 3].
        return {"mean": tf.reduce_mean(vectors, axis=1), "lengths": vectors.row_lengths()}


def ragged_module(path, tmp):
    module = RaggedModule()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return "tf.Module, a tf.RaggedTensorSpec input (values + row_splits), tf.saved_model.save"


class SharedVariables(tf.Module):
    """Three signatures over one set of variables: a score, the hidden features, and a
    string-keyed score through a table built in the constructor."""

    def __init__(self):
        super().__init__(name="shared")
        r = rng(7)
        self.kernel = tf.Variable(r.normal(0, 0.5, (4, 6)).astype(np.float32), name="kernel")
        self.bias = tf.Variable(r.normal(0, 0.1, (6,)).astype(np.float32), name="bias")
        self.head = tf.Variable(r.normal(0, 0.5, (6, 1)).astype(np.float32), name="head")
        self.rows = tf.Variable(r.normal(0, 1, (len(CITIES) + 1, 4)).astype(np.float32),
                                name="city_features")
        self.cities = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(CITIES), tf.range(len(CITIES), dtype=tf.int64)),
            default_value=len(CITIES))

    def _hidden(self, x):
        return tf.nn.relu(tf.matmul(x, self.kernel) + self.bias)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def score(self, x):
        return {"score": tf.matmul(self._hidden(x), self.head)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def embed(self, x):
        return {"hidden": self._hidden(x)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="city")])
    def score_city(self, city):
        x = tf.gather(self.rows, self.cities.lookup(city))
        return {"score": tf.matmul(self._hidden(x), self.head)}


def multi_signature(path, tmp):
    module = SharedVariables()
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.score, "embed": module.embed,
        "score_city": module.score_city})
    return ("tf.Module, three signatures (float and string inputs) over shared variables "
            "and a KeyValueTensorInitializer table, tf.saved_model.save")


# --------------------------------------------------------------------------- tf.Module tables


class TableModule(tf.Module):
    def __init__(self, vocab_path):
        super().__init__(name="table_module")
        # TextFileInitializer tracks the file as a tf.saved_model.Asset when saved.
        init = tf.lookup.TextFileInitializer(
            vocab_path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
        self.table = tf.lookup.StaticHashTable(init, default_value=-1)
        self.weights = tf.Variable(
            rng(4).normal(0, 1, (len(WORDS) + 1,)).astype(np.float32), name="weights")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def serve(self, words):
        ids = self.table.lookup(words)
        slot = tf.where(ids < 0, tf.constant(len(WORDS), tf.int64), ids)
        score = tf.gather(self.weights, slot) * 2.0 + 0.5
        return {"ids": ids, "score": score}


def module_table(path, tmp):
    vocab = write_vocab(tmp, "words.txt", WORDS)
    module = TableModule(vocab)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return "tf.Module + StaticHashTable(TextFileInitializer over an asset), tf.saved_model.save"


# --------------------------------------------------------------------------- tf.Transform-like


class TransformModule(tf.Module):
    """What a tf.Transform TFT layer exports: parsing, vocabularies, baked statistics."""

    def __init__(self, city_vocab, color_vocab):
        super().__init__(name="transform")
        self.city_table = tf.lookup.StaticVocabularyTable(
            tf.lookup.TextFileInitializer(
                city_vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            num_oov_buckets=2)
        self.color_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                color_vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1)
        self.spec = {
            "city": tf.io.VarLenFeature(tf.string),
            "color": tf.io.VarLenFeature(tf.string),
            "x": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(self, examples):
        features = tf.io.parse_example(examples, self.spec)
        out = {}
        for key, table in (("city", self.city_table), ("color", self.color_table)):
            dense = tf.sparse.to_dense(features[key], default_value="")
            dense = tf.reshape(dense[:, :1], [-1, 1])  # tft: one value per row -> [batch, 1]
            out[key + "_id"] = table.lookup(dense)
        # tft.scale_to_z_score: mean and stddev baked in as constants by the analyzer.
        out["x_scaled"] = (features["x"] - tf.constant(3.25)) / tf.constant(1.5)
        return out


def transform_layer(path, tmp):
    city = write_vocab(tmp, "vocab_city", CITIES)
    color = write_vocab(tmp, "vocab_color", COLORS)
    module = TransformModule(city, color)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return ("tf.Module (tf.Transform-style): parse_example + VarLenFeature densified to "
            "[batch,1] + "
            "StaticVocabularyTable(num_oov_buckets=2) + StaticHashTable, tf.saved_model.save")


KINDS = {
    "estimator_tf1": estimator_tf1,
    "keras2": keras2,
    "keras2_model_save": keras2_model_save,
    "keras3": keras3,
    "keras3_saved_model_save": keras3_saved_model_save,
    "module_table": module_table,
    "transform_layer": transform_layer,
    "keras3_subclassed": keras3_subclassed,
    "keras3_subclassed_saved_model_save": keras3_subclassed_saved_model_save,
    "keras3_module_wrapped": keras3_module_wrapped,
    "keras3_string_lookup": keras3_string_lookup,
    "keras3_export_endpoints": keras3_export_endpoints,
    "keras2_subclassed": keras2_subclassed,
    "keras2_module_wrapped": keras2_module_wrapped,
    "ragged_module": ragged_module,
    "multi_signature": multi_signature,
}


# Kinds written by a few releases only, to keep the corpus small: Keras 3's by the first
# release with it (2.16, where the unservable tf.saved_model.save reports start) and the
# newest; the others by the last with Keras 2 built in (2.15) and the newest.
ONLY_IN = {
    **dict.fromkeys(("keras3_subclassed", "keras3_subclassed_saved_model_save",
                     "keras3_module_wrapped", "keras3_string_lookup",
                     "keras3_export_endpoints", "keras3_saved_model_save"),
                    ((2, 16), (2, 21))),
    **dict.fromkeys(("keras2_subclassed", "keras2_module_wrapped", "ragged_module",
                     "multi_signature"), ((2, 15), (2, 21))),
}


def default_kinds():
    """Every kind this release writes (ONLY_IN's kinds in their releases only)."""
    return [k for k in KINDS if k not in ONLY_IN or tf_minor() in ONLY_IN[k]]


def versions():
    out = {"tensorflow": tf.__version__, "python": sys.version.split()[0], "numpy": np.__version__}
    from importlib import metadata
    for name, dist in (("keras", "keras"), ("tf_keras", "tf-keras")):
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # absent in this venv
            pass
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", default=",".join(default_kinds()))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    record_path = os.path.join(args.out, "WRITER.json")
    record = {"models": {}, "skipped": {}}
    if os.path.exists(record_path):  # --kinds rewrites some kinds: keep the others' records
        with open(record_path) as f:
            record = json.load(f)
    record["versions"] = versions()
    for kind in args.kinds.split(","):
        record["models"].pop(kind, None)
        record["skipped"].pop(kind, None)
        path = os.path.join(args.out, kind)
        shutil.rmtree(path, ignore_errors=True)
        np.random.seed(SEED)
        tf.random.set_seed(SEED)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                writer = KINDS[kind](path, tmp)
            except Exception as e:  # noqa: BLE001  (recorded; the other kinds still run)
                shutil.rmtree(path, ignore_errors=True)
                reason = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
                record["skipped"][kind] = reason
                print(f"[{tf.__version__}] skipped {kind}: {reason}", flush=True)
                traceback.print_exc(limit=3)
                continue
        record["models"][kind] = {"writer": writer}
        print(f"[{tf.__version__}] wrote {kind} -> {path}", flush=True)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
