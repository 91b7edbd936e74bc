"""--quantize stores a vocabulary file table as a fingerprint hash table (stages.vocabulary):
the same ids for every word of the file and for unknown keys, no hash table built at
load, and small vocabularies left as they are."""

from __future__ import annotations

import collections
import os
import shutil

import numpy as np
import pytest
import repo_paths
import tensorflow as tf
from independent_check import assert_outputs_match, example

from serving_opt.options import BuildOptions, MeasureOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.samples.tf1 import save_with_tables
from serving_opt.savedmodel import loader

pytestmark = pytest.mark.in_process  # our own models, stages in this process

FAST = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
WORDS = [f"w{i}" for i in range(3000)] + ["ünïcode", "two words", "x" * 40, "日本語"]


@pytest.fixture(scope="module")
def vocabulary_model(tmp_path_factory) -> str:
    """A TF1 SavedModel: string keys of any shape to their line in a vocabulary file
    (``TextFileInitializer``, as ``index_table_from_file``; unknown keys -1), and the
    table's size."""
    base = tmp_path_factory.mktemp("vocabulary")
    vocab = base / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    export_dir = str(base / "model" / "1")
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        words = v1.placeholder(tf.string, [None, None], name="words")
        table = v1.lookup.StaticHashTable(v1.lookup.TextFileInitializer(
            str(vocab), tf.string, v1.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
            v1.lookup.TextFileIndex.LINE_NUMBER), default_value=-1)
        signature = v1.saved_model.signature_def_utils.predict_signature_def(
            {"words": words}, {"ids": table.lookup(words), "size": table.size()})
        save_with_tables(graph, export_dir, {"serving_default": signature})
    return export_dir


def _ops(model_dir: str) -> collections.Counter:
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), {"serve"})
    return collections.Counter(n.op for n in meta_graph.graph_def.node)


def _lookup(model_dir: str, words: np.ndarray) -> tuple[np.ndarray, int]:
    sess, meta_graph = loader.load_session(model_dir)
    try:
        sig = meta_graph.signature_def["serving_default"]
        got = sess.run({k: v.name for k, v in sig.outputs.items()},
                       {sig.inputs["words"].name: words})
        return got["ids"], int(got["size"])
    finally:
        sess.close()


def test_a_vocabulary_becomes_a_fingerprint_table_with_the_same_ids(vocabulary_model,
                                                                     tmp_path):
    report = optimize(vocabulary_model, str(tmp_path / "out"),
                      OptimizeOptions(
                          build=BuildOptions(quantize="int8", quantize_min_elements=1000), **FAST))
    ops = _ops(report.output_dir)
    assert ops["HashTableV2"] == 0 and ops["InitializeTableFromTextFileV2"] == 0
    assert ops["MutableDenseHashTableV2"] == 1 and ops["LookupTableImportV2"] == 1
    unknown = ["", "w3000", "W1", "w1 ", "oov", "two", "x" * 39]
    keys = np.array(WORDS + unknown, dtype=object).reshape(1, -1)
    want_ids, want_size = _lookup(vocabulary_model, keys)
    got_ids, got_size = _lookup(report.output_dir, keys)
    np.testing.assert_array_equal(got_ids, want_ids)
    assert (got_ids[0, :len(WORDS)] == np.arange(len(WORDS))).all()
    assert (got_ids[0, len(WORDS):] == -1).all()
    assert got_size == want_size == len(WORDS)
    # Any shape of keys, an empty batch included.
    square = np.array(WORDS[:6], dtype=object).reshape(2, 3)
    np.testing.assert_array_equal(_lookup(report.output_dir, square)[0],
                                  _lookup(vocabulary_model, square)[0])
    empty = np.zeros((0, 4), dtype=object)
    assert _lookup(report.output_dir, empty)[0].shape == (0, 4)


def test_a_vocabulary_under_the_minimum_stays_a_hash_table(vocabulary_model, tmp_path):
    report = optimize(vocabulary_model, str(tmp_path / "out"),
                      OptimizeOptions(
                          build=BuildOptions(quantize="int8",
                                             quantize_min_elements=len(WORDS) + 1),
                          **FAST))
    ops = _ops(report.output_dir)
    assert ops["HashTableV2"] == 1 and ops["MutableDenseHashTableV2"] == 0


def test_lossless_optimization_keeps_the_hash_table(vocabulary_model, tmp_path):
    """Not exact for every key (a fingerprint collision): only with --quantize."""
    report = optimize(vocabulary_model, str(tmp_path / "out"),
                      OptimizeOptions(build=BuildOptions(quantize_min_elements=1000), **FAST))
    assert _ops(report.output_dir)["HashTableV2"] == 1


def test_only_the_models_own_asset_files_are_read(tmp_path):
    """The words go into the published checkpoint: never a host file's lines."""
    from serving_opt.stages.vocabulary import _asset_path

    model = tmp_path / "model"
    (model / "assets").mkdir(parents=True)
    (model / "assets" / "vocab.txt").write_text("a\nb\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("host data\n")
    (model / "assets" / "link.txt").symlink_to(secret)
    (model / "assets" / "dir").mkdir()
    assert _asset_path(str(model), "vocab.txt") == str(model / "assets" / "vocab.txt")
    for name in ("link.txt", "../secret.txt", "dir", str(secret), "", None, ".."):
        assert _asset_path(str(model), name) is None, name


@pytest.mark.parametrize("version", ["2.12", "2.21"])
def test_real_estimator_exports_vocabularies_are_compacted_and_pass_the_gate(version,
                                                                             tmp_path):
    """The corpus's Estimator exports (a vocabulary-file feature column) written by the
    oldest and the newest TensorFlow here: compacted, and the default lossy gate (on
    inputs synthesized from the vocabulary) passes them."""
    corpus = os.path.join(repo_paths.TESTS, "corpus", "models", f"tf-{version}",
                          "estimator_tf1")
    # A copy: under Bazel, the corpus's files are symlinks out of the model directory,
    # which the optimizer refuses to follow.
    source = shutil.copytree(corpus, str(tmp_path / "model"))
    report = optimize(source, str(tmp_path / "out"),
                      OptimizeOptions(
                          build=BuildOptions(quantize="int8", quantize_min_elements=1), **FAST))
    ops = _ops(report.output_dir)
    assert ops["HashTableV2"] == 0 and ops["MutableDenseHashTableV2"] >= 1
    # Every color of the vocabulary file, an unknown one and none; the ages spread.
    colors = ["red", "green", "blue", "mauve", ""]
    examples = np.array([example(color=colors[i % len(colors)], x=float(i - 6) / 2)
                         for i in range(15)], dtype=object)
    feeds = {key: {"examples" if key == "predict" else "inputs": examples}
             for key in ("classification", "predict", "regression", "serving_default")}
    # Measured exact on these exports; a color given another id moves a logit by 0.1 or
    # more, far outside the tolerance int8 weights get here.
    assert_outputs_match(report.output_dir, source, feeds, rtol=1e-3, atol=1e-4)


def _run_lookup(words: list[str], keys: np.ndarray, default: int = -1,
                offset: int = 0, flat: bool = False) -> np.ndarray:
    """The stage's table, load and lookup nodes alone, in plain TensorFlow: ``words``'
    fingerprints to their line numbers (+ ``offset``), fed ``keys`` (``flat``: the
    lookup without reshapes, for vectors)."""
    from tensorflow.core.framework import graph_pb2, tensor_shape_pb2, types_pb2

    from serving_opt.savedmodel.graph import attr, make_node, var_handle
    from serving_opt.stages import vocabulary

    fingerprints = tf.strings.to_hash_bucket_fast(words, (1 << 63) - 1).numpy()
    lines = np.arange(len(words), dtype=np.int64) + offset
    keys_array, values_array = vocabulary.buckets(fingerprints, lines)
    values = {"keys_var": keys_array, "values_var": values_array}
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend([
        make_node("keys", "Placeholder", dtype=attr(type=types_pb2.DT_STRING)),
        make_node("default", "Const", dtype=attr(type=types_pb2.DT_INT64),
                  value=attr(tensor=tf.make_tensor_proto(default, tf.int64)))])
    graph_def.node.extend(var_handle(name, types_pb2.DT_INT64,
                                     tensor_shape_pb2.TensorShapeProto(unknown_rank=True))
                          for name in values)
    graph_def.node.extend(vocabulary._table_nodes("table"))
    load = vocabulary._load("table", "keys_var", "values_var")
    find = make_node("find", "LookupTableFindV2", ["old_table", "keys", "default"])
    nodes, answer = vocabulary._lookup(find, "table", flat)
    graph_def.node.extend(load + nodes + [answer])
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            for name, v in values.items():
                sess.run(tf.raw_ops.AssignVariableOp(
                    resource=g.get_tensor_by_name(f"{name}:0"), value=v))
            sess.run(load[-1].name)
            # The variables were emptied: the table holds the only copy.
            assert sess.run(tf.raw_ops.ReadVariableOp(
                resource=g.get_tensor_by_name("keys_var:0"), dtype=tf.int64)).size == 0
            return sess.run("find:0", {"keys:0": keys})


@pytest.mark.parametrize("count", [1, 2, 300, 3000])
def test_the_lookup_finds_every_word_and_only_them(count):
    words = [f"word{i}" for i in range(count)]
    unknown = [f"other{i}" for i in range(200)] + [""]
    keys = np.array(words + unknown, dtype=object)
    want = np.array([words.index(k) if k in words else -7 for k in keys.tolist()])
    np.testing.assert_array_equal(_run_lookup(words, keys, default=-7), want)
    np.testing.assert_array_equal(_run_lookup(words, keys, default=-7, flat=True), want)
    # Any shape of keys, an empty one included; line numbers past int32.
    square = keys[-6:].reshape(2, 3)
    np.testing.assert_array_equal(_run_lookup(words, square, default=-7),
                                  want[-6:].reshape(2, 3))
    assert _run_lookup(words, np.zeros((0, 4), dtype=object)).shape == (0, 4)
    wide = _run_lookup(words, keys, offset=1 << 40)
    np.testing.assert_array_equal(wide, np.where(want >= 0, want + (1 << 40), -1))


def test_the_table_is_at_most_96_percent_full_and_the_same_for_any_word_order():
    from serving_opt.stages import vocabulary

    fingerprints = np.random.default_rng(2).integers(0, (1 << 63) - 1, 1000)
    lines = np.arange(1000, dtype=np.int64)
    keys, values = vocabulary.buckets(fingerprints, lines)
    assert keys.shape == values.shape == (2048, 1)  # 1000 > 0.96 * 1024
    stored = keys[keys[:, 0] >= 0, 0]
    assert sorted(stored.tolist()) == sorted(fingerprints.tolist())
    assert dict(zip(keys[:, 0].tolist(), values[:, 0].tolist()))[fingerprints[4]] == 4
    # The same words in another order (the string table's export order varies with its
    # hash seed) give the same bytes.
    shuffled = np.random.default_rng(1).permutation(1000)
    again = vocabulary.buckets(fingerprints[shuffled], lines[shuffled])
    np.testing.assert_array_equal(again[0], keys)
    np.testing.assert_array_equal(again[1], values)
