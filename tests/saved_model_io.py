"""SavedModels the tests make by hand: TF1 graphs saved with TensorFlow's own builder, and
saved_model.pb read and rewritten as a proto (what an attacker, or a broken exporter,
does freely).

Example:
    >>> with tf.Graph().as_default() as graph:
    ...     x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
    ...     y = tf.identity(x * 2.0, name="y")
    ...     save_tf1(graph, "/tmp/m/1", serving_default({"x": x}, {"y": y}))
    '/tmp/m/1'
    >>> edit_saved_model("/tmp/m/1", lambda meta_graph: meta_graph.signature_def.clear())
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

v1 = tf.compat.v1


def save_tf1(graph, export_dir: str, signature_def_map: dict, **builder_kwargs) -> str:
    """Saves ``graph`` under the ``serve`` tag with ``signature_def_map``, its variables
    (if it has any) initialized first; ``builder_kwargs`` go to
    ``add_meta_graph_and_variables`` (``saver``, ``main_op``, ``assets_collection``).

    Example:
        >>> save_tf1(graph, "/tmp/m/1", serving_default({"x": x}, {"y": y}), main_op=init)
        '/tmp/m/1'
    """
    with graph.as_default(), v1.Session(graph=graph) as sess:
        if v1.global_variables():
            sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess, ["serve"], signature_def_map=signature_def_map, **builder_kwargs)
        builder.save()
    return export_dir


def serving_default(inputs: dict, outputs: dict) -> dict:
    """A signature_def_map of one predict signature, ``serving_default``.

    Example:
        >>> sorted(serving_default({"x": x}, {"y": y}))
        ['serving_default']
    """
    return {"serving_default": v1.saved_model.predict_signature_def(inputs, outputs)}


def read_saved_model(model_dir: str) -> saved_model_pb2.SavedModel:
    """``model_dir``/saved_model.pb as a proto.

    Example:
        >>> read_saved_model("/tmp/m/1").meta_graphs[0].meta_info_def.tags
        ['serve']
    """
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(model_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model


def edit_saved_model(model_dir: str, edit: Callable) -> None:
    """Rewrites ``model_dir``/saved_model.pb after ``edit(meta_graph)`` changed its first
    MetaGraph.

    Example:
        >>> edit_saved_model("/tmp/m/1", lambda mg: mg.graph_def.node.add(name="n", op="NoOp"))
    """
    saved_model = read_saved_model(model_dir)
    edit(saved_model.meta_graphs[0])
    with open(os.path.join(model_dir, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())


def write_vocabulary(directory) -> str:
    """A three-word vocabulary file in ``directory``; returns its path."""
    path = os.path.join(str(directory), "vocab.txt")
    with open(path, "w") as f:
        f.write("a\nb\nc\n")
    return path


def save_tf2_asset_table(export_dir: str, vocabulary: str) -> str:
    """How tf.saved_model.save writes a vocabulary table: StaticHashTable(TextFileInitializer
    (Asset)) held by a tf.Module, looked up by ``serving_default``."""
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.vocab = tf.saved_model.Asset(vocabulary)
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                self.vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER), -1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, words):
            return {"y": self.table.lookup(words)}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir
