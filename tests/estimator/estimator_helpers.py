"""Tiny in-memory data, feature columns and canned Estimators for the Estimator suite.

Everything is small enough that an Estimator trains, evaluates and exports in about
a second, yet has what real exports have: a vocabulary-file lookup table (an asset
and a table initializer), embeddings, tf.Example parsing receivers and the
classify / regress / predict signatures canned heads export.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from serving_opt.options import GateOptions, MeasureOptions

REPO = Path(__file__).resolve().parents[2]
WORDS = ("apple", "banana", "cherry", "date", "elderberry", "fig")
OOV_WORD = "kiwi"  # not in the vocabulary: exercises the OOV bucket
SERVE = frozenset({"serve"})
# Small parity, no cold start and no benchmark: the suite checks behaviour, not speed
# (test_one_off_export measures one export's cold start under this TF).
FAST = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False),
            gate=GateOptions(parity_batch_size=8, parity_batches=1))

CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"


def write_vocabulary(directory: str, size: int = len(WORDS)) -> str:
    """The vocabulary file: WORDS first, then filler words up to ``size`` lines."""
    path = os.path.join(directory, "words.txt" if size == len(WORDS) else f"words{size}.txt")
    filler = [f"word{i:05d}" for i in range(size - len(WORDS))]
    with open(path, "w") as f:
        f.write("\n".join(WORDS + tuple(filler)) + "\n")
    return path


def data(n: int = 96, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    """Features, a 3-class label that depends on both features, and a regression target."""
    rng = np.random.default_rng(seed)
    words = rng.choice(np.array(WORDS + (OOV_WORD,)), n)
    age = rng.uniform(18, 80, n).astype(np.float32)
    index = np.array([WORDS.index(w) if w in WORDS else len(WORDS) for w in words])
    classes = ((index + (age > 45)) % 3).astype(np.int64)
    target = (age / 10.0 + index).astype(np.float32)
    return {"word": words, "age": age}, classes, target


def input_fn(label: str, repeat: bool):
    """An Estimator input_fn over the in-memory data; label is "class" or "target"."""

    def fn():
        features, classes, target = data()
        labels = classes if label == "class" else target
        ds = tf.data.Dataset.from_tensor_slices((features, labels))
        return (ds.repeat() if repeat else ds).batch(32)

    return fn


def _word_column(vocab_path: str):
    return tf.feature_column.categorical_column_with_vocabulary_file(
        "word", vocab_path, num_oov_buckets=1)


def _age_column():
    return tf.feature_column.numeric_column("age", normalizer_fn=lambda x: (x - 45.0) / 15.0)


def receiver_fn(columns):
    """A parsing receiver (serialized tf.Examples in, like TF Serving's classify/regress)."""
    spec = tf.feature_column.make_parse_example_spec(columns)
    return tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)


def run_config(model_dir: str, checkpoint_every: int) -> tf.estimator.RunConfig:
    return tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=0,
                                  save_checkpoints_steps=checkpoint_every,
                                  log_step_count_steps=10_000)


def dnn_classifier(model_dir: str, vocab_path: str, checkpoint_every: int = 10, *,
                   dimension: int = 4, hidden_units: tuple[int, ...] = (8, 4),
                   batch_norm: bool = False):
    """DNNClassifier over a vocabulary-file embedding column; returns (estimator, receiver)."""
    columns = [tf.feature_column.embedding_column(_word_column(vocab_path), dimension=dimension),
               _age_column()]
    estimator = tf.estimator.DNNClassifier(
        hidden_units=list(hidden_units), feature_columns=columns, n_classes=3,
        batch_norm=batch_norm, config=run_config(model_dir, checkpoint_every))
    return estimator, receiver_fn(columns)


def linear_regressor(model_dir: str, vocab_path: str, checkpoint_every: int = 10):
    columns = [_word_column(vocab_path), _age_column()]
    estimator = tf.estimator.LinearRegressor(
        feature_columns=columns, config=run_config(model_dir, checkpoint_every))
    return estimator, receiver_fn(columns)


def dnn_linear_classifier(model_dir: str, vocab_path: str, checkpoint_every: int = 10):
    linear = [_word_column(vocab_path), _age_column()]
    dnn = [tf.feature_column.embedding_column(_word_column(vocab_path), dimension=4),
           _age_column()]
    estimator = tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=linear, dnn_feature_columns=dnn, dnn_hidden_units=[8],
        n_classes=3, config=run_config(model_dir, checkpoint_every))
    return estimator, receiver_fn(linear + dnn)


def train_and_evaluate(estimator, exporters, label: str, max_steps: int):
    """Local train_and_evaluate, evaluating (and exporting) after every checkpoint."""
    return tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(input_fn(label, repeat=True), max_steps=max_steps),
        tf.estimator.EvalSpec(input_fn(label, repeat=False), steps=None, exporters=exporters,
                              start_delay_secs=0, throttle_secs=0),
    )


def entries(base: str) -> list[str]:
    """Everything in a directory, sorted (hidden staging leftovers included)."""
    return sorted(os.listdir(base)) if os.path.isdir(base) else []


def versions(base: str) -> list[str]:
    return [n for n in entries(base) if n.isdigit()]


def signatures(export_dir: str) -> dict:
    """SignatureDefs of the serve MetaGraph, without the init-op pseudo signature."""
    from serving_opt.savedmodel import loader

    meta_graph = loader.find_meta_graph(loader.read_saved_model(export_dir), SERVE, export_dir)
    return dict(loader.serving_signatures(meta_graph))


def method_names(export_dir: str) -> dict[str, str]:
    return {k: s.method_name for k, s in signatures(export_dir).items()}


def examples(words=WORDS + (OOV_WORD,), ages=(20.0, 45.0, 70.0)) -> list[bytes]:
    out = []
    for i, word in enumerate(words):
        example = tf.train.Example()
        example.features.feature["word"].bytes_list.value.append(word.encode())
        example.features.feature["age"].float_list.value.append(ages[i % len(ages)])
        out.append(example.SerializeToString())
    return out


def assert_answers_like_the_plain_export(published: str, raw: str, *, rtol: float = 1e-4,
                                         atol: float = 1e-5) -> None:
    """Every signature of the plain export, on known and out-of-vocabulary words, answers
    the same from the published one: both run by plain TensorFlow, as TF Serving loads
    them (tests/independent_check.py), not by the optimizer's parity gate."""
    from independent_check import assert_outputs_match, example_feeds

    assert_outputs_match(published, raw, example_feeds(raw, examples()), rtol=rtol, atol=atol)


def saved_model_pb(export_dir: str):
    """The SavedModel proto of ``export_dir``, parsed."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model


def op_histogram(export_dir: str) -> dict[str, int]:
    """Op type -> count over every MetaGraph's nodes, library functions included."""
    from collections import Counter

    from serving_opt.savedmodel.graph import all_node_defs

    counts: Counter = Counter()
    for meta_graph in saved_model_pb(export_dir).meta_graphs:
        counts.update(n.op for n in all_node_defs(meta_graph.graph_def))
    return dict(sorted(counts.items()))


VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "_VarHandlesOp"})


def variable_nodes(export_dir: str) -> set[str]:
    """Names of the variable nodes of every MetaGraph (what a checkpoint restores into)."""
    from serving_opt.savedmodel.graph import all_node_defs

    return {n.name for mg in saved_model_pb(export_dir).meta_graphs
            for n in all_node_defs(mg.graph_def) if n.op in VARIABLE_OPS}


def checkpoint_variables(export_dir: str) -> dict[str, list[int]]:
    """Name -> shape of what the export's checkpoint holds ({} without a checkpoint)."""
    prefix = os.path.join(export_dir, "variables", "variables")
    if not os.path.exists(prefix + ".index"):
        return {}
    return dict(tf.train.list_variables(prefix))


def tree(path: str) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out
