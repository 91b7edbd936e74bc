"""Shared fixtures: real SavedModels built once per test session, in seconds.

Builders are session-scoped and return a *model base* holding version 1, so tests
that need a version directory use ``<base>/1`` and tests that serve use the base.
Tests must never write into these directories: copy them first (``model_copy``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The model-server tests check TensorFlow's own error texts for wrongly shaped requests,
# which Eigen's kernels give; with oneDNN's (TF's default on AVX-512 VNNI CPUs) the server
# refuses a wrongly ranked feed itself (servable.py), since oneDNN would abort.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import sys  # noqa: E402

# The shared helpers (hostile_models, local_server, ...) live here; the test files, one
# directory per package of serving_opt, import them by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402

from serving_opt import samples  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before `-m golden` selects
def pytest_collection_modifyitems(items):
    """``@pytest.mark.golden(param="x")``: of a parametrized test, only the ``x`` case is
    the golden run; the others stay in the suite, run once. A golden run crosses the
    sandbox: it cannot be ``in_process``."""
    for item in items:
        mark = item.get_closest_marker("golden")
        param = mark.kwargs.get("param") if mark else None
        if param is not None and param not in item.callspec.params.values():
            item.own_markers[:] = [m for m in item.own_markers if m.name != "golden"]
        if item.get_closest_marker("golden") and item.get_closest_marker("in_process"):
            raise pytest.UsageError(f"{item.nodeid}: a golden run cannot be in_process")


@contextlib.contextmanager
def in_process():
    """optimize() runs its pipeline in this process (and whatever else would sandbox runs
    unsandboxed), as where bubblewrap cannot start and the user allows it: the same
    stages, without a worker's TensorFlow import.
    For tests of what the stages do to our own models; the sandbox's own tests and the
    golden runs keep the worker. ``@pytest.mark.in_process`` on a test or a module (its
    fixtures too) does the same."""
    from serving_opt import sandbox

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox, "require", lambda allow_unsandboxed, what: False)
        yield


def _in_process_if_marked(request):
    return in_process() if request.node.get_closest_marker("in_process") \
        else contextlib.nullcontext()


@pytest.fixture(autouse=True, scope="module")
def _in_process_module(request):
    with _in_process_if_marked(request):
        yield


@pytest.fixture(autouse=True)
def _in_process_test(request):
    with _in_process_if_marked(request):
        yield


TEXT_CLASSIFIER_VOCAB = 5000
TEXT_CLASSIFIER_DIM = 32


def _builders_digest() -> str:
    """What the shared models are built from: the samples' and this file's source."""
    digest = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    sources = [os.path.join(here, "conftest.py")] + sorted(
        os.path.join(samples.__path__[0], n) for n in os.listdir(samples.__path__[0])
        if n.endswith(".py"))
    for path in sources:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def model_base(tmp_path_factory, name: str, build_version) -> str:
    """A model base holding version 1, built by ``build_version(<base>/1)``.

    With SERVING_OPT_MODEL_CACHE set (`make bazel-test` sets it), the base is built once
    for the whole suite, under a lock, and every shard shares it; otherwise once per
    pytest session.
    """
    cache = os.environ.get("SERVING_OPT_MODEL_CACHE")
    if not cache:
        base = str(tmp_path_factory.mktemp(name))
        build_version(os.path.join(base, "1"))
        return base
    directory = os.path.join(cache, _builders_digest())
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    with open(base + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(base):
            building = tempfile.mkdtemp(prefix=f".{name}-", dir=directory)
            build_version(os.path.join(building, "1"))
            os.rename(building, base)  # complete or absent: a failed build leaves no base
    return base


def _build(tmp_path_factory, kind: str) -> str:
    return model_base(tmp_path_factory, kind, lambda path: samples.build(kind, path))


@pytest.fixture(scope="session")
def classifier_base(tmp_path_factory) -> str:
    """TF1 DNN classifier: vocab-file + hashed embeddings, batch norm, classify/predict."""
    return _build(tmp_path_factory, "classifier")


@pytest.fixture(scope="session")
def classifier_dir(classifier_base) -> str:
    return os.path.join(classifier_base, "1")


@pytest.fixture(scope="session")
def multihead_base(tmp_path_factory) -> str:
    """The classifier plus a regress signature: classify + regress in one model."""
    return _build(tmp_path_factory, "multihead")


@pytest.fixture(scope="session")
def regressor_base(tmp_path_factory) -> str:
    """TF1 linear regressor: regress + predict signatures over tf.Examples."""
    return _build(tmp_path_factory, "regressor")


@pytest.fixture(scope="session")
def regressor_dir(regressor_base) -> str:
    return os.path.join(regressor_base, "1")


@pytest.fixture(scope="session")
def convnet_base(tmp_path_factory) -> str:
    """TF1 conv net with fused batch norm in inference mode, float image input."""
    return _build(tmp_path_factory, "convnet")


@pytest.fixture(scope="session")
def convnet_dir(convnet_base) -> str:
    return os.path.join(convnet_base, "1")


@pytest.fixture(scope="session")
def keras_base(tmp_path_factory) -> str:
    """Keras 3 ``model.export()``: a TF2 object-graph SavedModel."""
    return _build(tmp_path_factory, "keras")


@pytest.fixture(scope="session")
def keras_dir(keras_base) -> str:
    return os.path.join(keras_base, "1")


@pytest.fixture(scope="session")
def text_classifier_base(tmp_path_factory) -> str:
    """TF1 DNN text classifier, mostly one embedding table (vocab 5000, dim 32 here):
    raw text split in-graph, vocab-file table, Adagrad slots and global_step saved too."""
    def build(path):
        samples.build_text_classifier(path, vocab_size=TEXT_CLASSIFIER_VOCAB,
                                      embedding_dim=TEXT_CLASSIFIER_DIM)

    return model_base(tmp_path_factory, "text_classifier", build)


@pytest.fixture
def unsandboxed(monkeypatch):
    """No sandbox, as on a machine without bubblewrap (the user consents to that with the
    TrustOptions this returns, for ``trust=``): for tests that patch the pipeline in this
    process, which a sandboxed worker would never see. tests/sandbox/test_sandbox.py covers the
    sandboxed runs."""
    from serving_opt import sandbox
    from serving_opt.options import TrustOptions

    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "switched off by the test")
    return TrustOptions(allow_unsandboxed=True)


@pytest.fixture
def model_copy(tmp_path):
    """Copies a model directory into this test's tmp dir so the test may break it."""

    def copy(src: str, name: str = "model") -> str:
        dst = os.path.join(str(tmp_path), name)
        shutil.copytree(src, dst)
        return dst

    return copy


def tree_snapshot(path: str) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes, to prove a run left the input untouched."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


# --- TF2 / Keras 3 models (tests/pipeline/test_tf2_models.py) ---------------------------------

TEXT_VOCABULARY = ("the", "cat", "dog", "sat", "on", "mat", "a", "bird", "flew", "away")
HOURS = (0, 6, 12, 18)
FRUITS = ("apple", "banana", "cherry", "date", "fig")
COLORS = ("red", "green", "blue")
KERAS_APPLICATIONS = samples.KERAS_APPLICATIONS
build_keras_application = samples.build_keras_application


def build_text_lstm(export_dir: str, seed: int = 0) -> str:
    """Keras 3: TextVectorization + Embedding + LSTM over text, IntegerLookup + Embedding
    over an int feature, two inputs, one Dense head; exported with model.export."""
    import keras

    keras.utils.set_random_seed(seed)
    text = keras.Input(shape=(), dtype="string", name="text")
    hour = keras.Input(shape=(), dtype="int64", name="hour")
    tokens = keras.layers.TextVectorization(
        max_tokens=20, output_sequence_length=6, vocabulary=list(TEXT_VOCABULARY))(text)
    words = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    sequence = keras.layers.LSTM(6)(words)
    hour_ids = keras.layers.IntegerLookup(vocabulary=list(HOURS))(hour)
    hours = keras.layers.Flatten()(keras.layers.Embedding(len(HOURS) + 1, 3)(hour_ids))
    merged = keras.layers.Concatenate()([sequence, hours])
    scores = keras.layers.Dense(3, name="scores")(merged)
    keras.Model({"text": text, "hour": hour}, scores).export(export_dir, verbose=False)
    return export_dir


def build_tf_module(export_dir: str, seed: int = 0) -> str:
    """``tf.saved_model.save`` of a tf.Module with two signatures sharing its weights.

    ``serving_default`` takes serialized tf.Examples (word, color, age), ``predict_raw``
    the same features as tensors. ``word`` goes through a StaticHashTable over a
    vocabulary *file* (an asset), ``color`` through a StaticVocabularyTable with OOV
    buckets; a tf.cond and a tf.while_loop follow. Outputs are named (scores, class_ids,
    word_ids).
    """
    import tempfile

    import numpy as np
    import tensorflow as tf

    scratch = tempfile.mkdtemp()
    vocab_path = os.path.join(scratch, "fruits.txt")
    with open(vocab_path, "w") as f:
        f.write("\n".join(FRUITS) + "\n")
    rng = np.random.default_rng(seed)

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.words = tf.lookup.StaticHashTable(
                tf.lookup.TextFileInitializer(
                    vocab_path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                    tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), default_value=-1)
            self.colors = tf.lookup.StaticVocabularyTable(
                tf.lookup.KeyValueTensorInitializer(list(COLORS), tf.range(3, dtype=tf.int64)),
                num_oov_buckets=2)
            self.word_embedding = tf.Variable(rng.normal(size=(6, 4)).astype("float32"))
            self.color_embedding = tf.Variable(rng.normal(size=(5, 4)).astype("float32"))
            self.kernel = tf.Variable(rng.normal(size=(5, 3)).astype("float32"))
            self.bias = tf.Variable(rng.normal(size=(3,)).astype("float32"))

        def _predict(self, word, color, age):
            word_ids = self.words.lookup(word)
            in_vocab = tf.where(word_ids < 0, tf.constant(len(FRUITS), tf.int64), word_ids)
            features = tf.concat([
                tf.nn.embedding_lookup(self.word_embedding, in_vocab)
                + tf.nn.embedding_lookup(self.color_embedding, self.colors.lookup(color)),
                age[:, None]], axis=1)
            logits = tf.matmul(features, self.kernel) + self.bias
            logits = tf.cond(tf.reduce_mean(age) > 0.0, lambda: logits * 2.0,
                             lambda: logits - 1.0)
            _, logits = tf.while_loop(lambda i, x: i < 3,
                                      lambda i, x: (i + 1, x + 0.1 * tf.nn.relu(x)),
                                      (tf.constant(0), logits))
            return {"scores": tf.nn.softmax(logits), "class_ids": tf.argmax(logits, axis=1),
                    "word_ids": word_ids}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def parse_and_predict(self, serialized):
            features = tf.io.parse_example(serialized, {
                "word": tf.io.FixedLenFeature([], tf.string, default_value=""),
                "color": tf.io.FixedLenFeature([], tf.string, default_value="red"),
                "age": tf.io.FixedLenFeature([], tf.float32),
            })
            return self._predict(features["word"], features["color"], features["age"])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="word"),
                                      tf.TensorSpec([None], tf.string, name="color"),
                                      tf.TensorSpec([None], tf.float32, name="age")])
        def predict(self, word, color, age):
            return self._predict(word, color, age)

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={
        "serving_default": model.parse_and_predict, "predict_raw": model.predict})
    shutil.rmtree(scratch)  # the model must work from its own assets/ copy
    return export_dir


def fruit_examples(count: int, seed: int = 0) -> list[bytes]:
    """Serialized tf.Examples for build_tf_module's serving_default, OOV values included."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        feature = {
            "word": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[rng.choice(list(FRUITS) + ["kiwi"]).encode()])),
            "color": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[rng.choice(list(COLORS) + ["mauve"]).encode()])),
            "age": tf.train.Feature(float_list=tf.train.FloatList(
                value=[float(rng.normal())])),
        }
        out.append(tf.train.Example(features=tf.train.Features(feature=feature))
                   .SerializeToString())
    return out


def _build_tf2(tmp_path_factory, name: str, builder, *args) -> str:
    return model_base(tmp_path_factory, name, lambda path: builder(*args, path))


@pytest.fixture(scope="session")
def mobilenet_v2_dir(tmp_path_factory) -> str:
    """Keras 3 MobileNetV2 (96x96, 10 classes, logits), model.export: serve + serving_default."""
    return os.path.join(_build_tf2(tmp_path_factory, "mobilenet_v2", build_keras_application,
                                   "mobilenet_v2"), "1")


@pytest.fixture(scope="session")
def text_lstm_dir(tmp_path_factory) -> str:
    """Keras 3 TextVectorization + Embedding + LSTM and IntegerLookup, model.export."""
    return os.path.join(_build_tf2(tmp_path_factory, "text_lstm", build_text_lstm), "1")


@pytest.fixture(scope="session")
def tf_module_dir(tmp_path_factory) -> str:
    """tf.Module: tf.Example and tensor signatures, vocabulary-file table, cond, while."""
    return os.path.join(_build_tf2(tmp_path_factory, "tf_module", build_tf_module), "1")


@pytest.fixture(scope="session")
def detection_model(tmp_path_factory):
    """The OD-API-shaped detection sample (its frozen_inference_graph.pb and SavedModel),
    read only: shared by every detection test file."""
    from serving_opt.detection import sample as detection_sample

    return detection_sample.build(str(tmp_path_factory.mktemp("detection") / "model"))


@pytest.fixture(scope="session")
def detection_graph_def(detection_model):
    from serving_opt.savedmodel import frozen_graph

    return frozen_graph.read_graph_def(detection_model.frozen_graph)
