"""Hostile SavedModels for the static check's hidden routes (graphs in data, attr
placeholders, an escaping asset), each written for real with TensorFlow, then (for the
placeholder and asset routes) edited the way a crafted model would be: a SavedModel is
a proto anyone can write.
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.protobuf import saved_model_pb2


def _read(export_dir: str):
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model


def _write(export_dir: str, saved_model) -> None:
    with open(os.path.join(export_dir, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())


# ------------------------------------------------------------------- embedded graphs


def build_dataset_from_graph(export_dir: str, dataset_fn) -> str:
    """A serving function that runs ``DatasetFromGraph`` over the graph of
    ``dataset_fn()`` (serialized with ``_as_serialized_graph``, held in a Const of the
    function) and returns its one element through ``DatasetToSingleElement``."""
    dataset = dataset_fn()
    serialized = dataset._as_serialized_graph().numpy()
    spec = dataset.element_spec

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def serve(self, x):
            handle = tf.raw_ops.DatasetFromGraph(graph_def=tf.constant(serialized))
            (element,) = tf.raw_ops.DatasetToSingleElement(
                dataset=handle, output_types=[spec.dtype], output_shapes=[spec.shape])
            return {"y": x, "element": element}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


def reading_dataset(path: str):
    return lambda: tf.data.TextLineDataset(path).take(1)


def in_memory_dataset():
    return tf.data.Dataset.from_tensor_slices(["a", "b"]).take(1)


def build_dataset_from_computed_graph(export_dir: str) -> str:
    """DatasetFromGraph whose GraphDef is computed (a StringJoin of two constants): a
    graph the check cannot read."""
    serialized = in_memory_dataset()._as_serialized_graph().numpy()
    half = len(serialized) // 2

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def serve(self, x):
            graph = tf.strings.join([tf.constant(serialized[:half]),
                                     tf.constant(serialized[half:])])
            handle = tf.raw_ops.DatasetFromGraph(graph_def=graph)
            (element,) = tf.raw_ops.DatasetToSingleElement(
                dataset=handle, output_types=[tf.string], output_shapes=[[]])
            return {"y": x, "element": element}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


# -------------------------------------------------------------- attribute placeholders


def build_print_placeholder(export_dir: str, bound: str | None,
                            placeholder: str = "stream") -> str:
    """A serving function calling a library function whose ``PrintV2`` prints to
    stderr; then edited: the PrintV2's ``output_stream`` becomes attr placeholder
    ``placeholder`` of that function, and every call of it binds the placeholder to
    ``bound`` in its ``f`` attr (no binding when ``bound`` is None)."""

    @tf.function
    def printer(x):
        tf.print(x)
        return x + 1.0

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def serve(self, x):
            return {"y": printer(x)}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    saved_model = _read(export_dir)
    graph_def = saved_model.meta_graphs[0].graph_def
    printing = []
    for function in graph_def.library.function:
        for node in function.node_def:
            if node.op == "PrintV2":
                node.attr["output_stream"].CopyFrom(
                    attr_value_pb2.AttrValue(placeholder=placeholder))
                printing.append(function.signature.name)
                function.signature.attr.add(name=placeholder, type="string")
    assert printing, "tf.print made no PrintV2"
    calls = 0
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        if node.op in ("StatefulPartitionedCall", "PartitionedCall") and \
                node.attr["f"].func.name in printing:
            calls += 1
            if bound is not None:
                node.attr["f"].func.attr[placeholder].s = bound.encode()
    assert calls, "nothing calls the printing function"
    _write(export_dir, saved_model)
    return export_dir


def build_sampler_placeholder(export_dir: str, vocab_file: str) -> str:
    """A ``FixedUnigramCandidateSampler`` in a library function whose ``vocab_file`` is
    an attr placeholder, bound by the calling function's call (itself through a
    placeholder of the caller, bound at the top-level call): two levels of binding."""

    @tf.function
    def sample(classes):
        sampled, _, _ = tf.random.fixed_unigram_candidate_sampler(
            classes, num_true=1, num_sampled=2, unique=True, range_max=3,
            unigrams=[1.0, 1.0, 1.0])
        return sampled

    @tf.function
    def middle(classes):
        return sample(classes)

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 1], tf.int64)])
        def serve(self, classes):
            return {"y": middle(classes)}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    saved_model = _read(export_dir)
    graph_def = saved_model.meta_graphs[0].graph_def
    library = {f.signature.name: f for f in graph_def.library.function}
    sampler_fn = next(name for name, f in library.items()
                      if any(n.op == "FixedUnigramCandidateSampler" for n in f.node_def))
    for node in library[sampler_fn].node_def:
        if node.op == "FixedUnigramCandidateSampler":
            node.attr["vocab_file"].CopyFrom(attr_value_pb2.AttrValue(placeholder="vocab"))
            node.attr.pop("unigrams")
    library[sampler_fn].signature.attr.add(name="vocab", type="string")
    # The function calling the sampler's function binds "vocab" to its own "outer".
    middle_fn = next(name for name, f in library.items()
                     if any(n.attr["f"].func.name == sampler_fn for n in f.node_def
                            if "f" in n.attr))
    for node in library[middle_fn].node_def:
        if "f" in node.attr and node.attr["f"].func.name == sampler_fn:
            node.attr["f"].func.attr["vocab"].CopyFrom(
                attr_value_pb2.AttrValue(placeholder="outer"))
    library[middle_fn].signature.attr.add(name="outer", type="string")
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        if "f" in node.attr and node.attr["f"].func.name == middle_fn:
            node.attr["f"].func.attr["outer"].s = vocab_file.encode()
    _write(export_dir, saved_model)
    return export_dir


# ------------------------------------------------------------------ escaping assets


def build_escaping_asset(export_dir: str, filename: str, tf1_collection: bool = False) -> str:
    """A TF2 export reading a vocabulary asset in its table initializer, its
    asset_file_def filename then rewritten to ``filename`` (``../../etc/passwd``); with
    ``tf1_collection`` the declaration moves to TF1's ``saved_model_assets``
    collection instead."""
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    vocab = os.path.join(parent, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("a\nb\n")

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.TextFileInitializer(
                    vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                    tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), -1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, words):
            return {"ids": self.table.lookup(words)}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    saved_model = _read(export_dir)
    meta_graph = saved_model.meta_graphs[0]
    assert meta_graph.asset_file_def, "the export declares no asset"
    meta_graph.asset_file_def[0].filename = filename
    if tf1_collection:
        collection = meta_graph.collection_def["saved_model_assets"]
        for asset in meta_graph.asset_file_def:
            collection.any_list.value.add().Pack(asset)
        del meta_graph.asset_file_def[:]
    _write(export_dir, saved_model)
    return export_dir


def writing_dataset(path: str):
    """A dataset whose map function writes ``path`` (the write is in the embedded
    graph's library, not its nodes)."""
    def write(text):
        with tf.control_dependencies([tf.io.write_file(path, text)]):
            return tf.identity(text)
    return lambda: tf.data.Dataset.from_tensors(tf.constant("planted")).map(write)


def build_tf1_init_op_dataset_from_graph(export_dir: str, dataset_fn) -> str:
    """Issue 30's shape: a TF1 export whose main op assigns a variable the element of
    ``DatasetFromGraph`` over the serialized graph of ``dataset_fn()``
    (``DatasetToSingleElement``): it runs at every load."""
    v1 = tf.compat.v1
    serialized = dataset_fn()._as_serialized_graph().numpy()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None], name="x")
        y = tf.identity(x * 2.0, name="y")
        leaked = v1.get_variable("leaked", initializer="", use_resource=True)
        handle = tf.raw_ops.DatasetFromGraph(
            graph_def=tf.constant(serialized, name="embedded_graph"), name="from_graph")
        (element,) = tf.raw_ops.DatasetToSingleElement(
            dataset=handle, output_types=[tf.string], output_shapes=[[]])
        main_op = tf.group(leaked.assign(element), name="main_op")
        with v1.Session(graph=graph) as sess:
            sess.run(leaked.initializer)
            builder = v1.saved_model.Builder(export_dir)
            signature = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature},
                main_op=main_op)
            builder.save()
    return export_dir


def nest_in_dataset_from_graph(meta_graph, node_name: str) -> None:
    """Wraps the GraphDef a DatasetFromGraph Const holds in another graph, whose own
    DatasetFromGraph runs the first: an embedding two graphs deep."""
    from tensorflow.core.framework import graph_pb2

    const = next(n for n in meta_graph.graph_def.node if n.name == node_name)
    inner = const.attr["value"].tensor.string_val[0]
    outer = graph_pb2.GraphDef()
    held = outer.node.add(name="held_graph", op="Const")
    held.attr["dtype"].type = tf.string.as_datatype_enum
    held.attr["value"].tensor.dtype = tf.string.as_datatype_enum
    held.attr["value"].tensor.string_val.append(inner)
    outer.node.add(name="nested", op="DatasetFromGraph", input=["held_graph"])
    const.attr["value"].tensor.string_val[0] = outer.SerializeToString()
