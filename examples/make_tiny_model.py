"""Writes examples/tiny_model: the checked-in SavedModel the Bazel example optimizes.

A TF1 graph as Estimator-era exports look, kept to a few KB: a vocabulary-file
lookup table (an asset, initialized by the main op), an embedding, a dense layer
with an inference-mode batch norm, and two signatures (``serving_default``
predict on words, ``scores_only``). Deterministic for a given TensorFlow release;
regenerate (and commit) it only when the example should change:

    .venv/bin/python examples/make_tiny_model.py            # -> examples/tiny_model
    .venv/bin/python examples/make_tiny_model.py --output_dir=/tmp/tiny --overwrite
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from serving_opt import samples

HERE = os.path.dirname(os.path.abspath(__file__))
EMBEDDING_DIM = 4
CLASSES = 3


def build(export_dir: str, seed: int = 0) -> str:
    """Builds the tiny model into ``export_dir`` (which must not exist yet).

    Example:
        >>> build("/tmp/tiny_model")
        '/tmp/tiny_model'
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, tempfile.TemporaryDirectory() as scratch:
        v1.set_random_seed(seed)
        vocab_path = os.path.join(scratch, "vocab.txt")
        with open(vocab_path, "w") as f:
            f.write("\n".join(samples.VOCABULARY) + "\n")
        words = v1.placeholder(tf.string, [None], name="words")
        # One out-of-vocabulary bucket: unknown words get an id too, as in feature columns.
        table = v1.lookup.StaticVocabularyTable(
            v1.lookup.TextFileInitializer(
                vocab_path, tf.string, v1.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, v1.lookup.TextFileIndex.LINE_NUMBER),
            num_oov_buckets=1)
        ids = table.lookup(words)
        init = v1.random_normal_initializer(stddev=0.5, seed=seed)
        embeddings = v1.get_variable(
            "embeddings", [len(samples.VOCABULARY) + 1, EMBEDDING_DIM], initializer=init)
        kernel = v1.get_variable("kernel", [EMBEDDING_DIM, CLASSES], initializer=init)
        bias = v1.get_variable("bias", [CLASSES], initializer=v1.zeros_initializer())
        mean = v1.get_variable("bn_mean", [CLASSES], initializer=init)
        variance = v1.get_variable("bn_variance", [CLASSES],
                                   initializer=v1.constant_initializer(1.5))
        net = tf.nn.embedding_lookup(embeddings, ids)
        net = tf.nn.bias_add(tf.matmul(net, kernel), bias)
        # What the optimizer folds away: inference batch norm, an Identity.
        net = tf.nn.batch_normalization(net, mean, variance, None, None, 1e-3)
        scores = tf.identity(tf.nn.softmax(net), name="scores")
        class_id = tf.argmax(scores, axis=1, name="class_id")
        predict = sigs.predict_signature_def(
            {"words": words}, {"scores": scores, "class_id": class_id})
        scores_only = sigs.predict_signature_def({"words": words}, {"scores": scores})
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess, [v1.saved_model.tag_constants.SERVING],
                signature_def_map={"serving_default": predict, "scores_only": scores_only},
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer(),
                strip_default_attrs=True,
            )
            builder.save()
    return export_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=os.path.join(HERE, "tiny_model"))
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing model at --output_dir")
    args = parser.parse_args(argv)
    if os.path.exists(args.output_dir):
        if not args.overwrite:
            print(f"{args.output_dir} exists; pass --overwrite to replace it", file=sys.stderr)
            return 1
        shutil.rmtree(args.output_dir)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    build(args.output_dir)
    print(f"wrote {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
