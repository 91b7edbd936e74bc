"""Hostile SavedModels, one builder per route a model can take to touch the host.

Shared by the static-check tests (tests/savedmodel/test_static_check.py) and the sandbox tests:
every builder takes a target directory and a *canary*, the host path the model writes
or reads when something runs it, and returns the SavedModel directory it wrote
(``<target_dir>/<route>/1``, so ``<target_dir>/<route>`` is a model base for servers).

Building never runs the hostile part: nothing here writes or reads the canary (TF's
builders save the variables, which runs the saver's save op, never a signature, the
init op or the restore op). Running the model does, with TensorFlow's own loaders:

==========================  =======================================================
route (builder)             what a run does to the canary
==========================  =======================================================
restore_hook                loading writes ``canary`` (WriteFile on save/restore_all)
saver_save_in_signature     every request writes ``canary.index`` and
                            ``canary.data-*`` holding the request's input
gradient_host_op            every request writes ``canary`` (a WriteFile in the
                            gradient function of a SymbolicGradient)
table_path_argument         loading reads ``canary`` into a lookup table (TF2: the
                            initializer function's argument is a captured constant)
table_asset_in_signature    every request reads ``canary`` into a lookup table (the
                            asset node is a Const the loader feeds only for the
                            init op; a signature runs the initializer unfed)
register_dataset            every request registers a dataset with a tf.data
                            service dispatcher at ``address`` (network; the canary
                            is not used). Never run it in the test process:
                            its client retries for ever.
init_op_write               loading writes ``canary`` (WriteFile in the main op)
==========================  =======================================================

Example:
    >>> model_dir = build_restore_hook(str(tmp_path), str(tmp_path / "canary"))
    >>> HOSTILE["restore_hook"].effect
    'writes'
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf
from saved_model_io import edit_saved_model, save_tf1, serving_default

v1 = tf.compat.v1

REQUEST = [[1.0, 2.0, 3.0]]  # a valid input of every float model here (x: [None, 3])


def _export_dir(target_dir: str, route: str) -> str:
    return os.path.join(target_dir, route, "1")


def _weights():
    # A resource variable, so every model has a real saver and checkpoint.
    return v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]), use_resource=True)


# ------------------------------------------------------------------------------ routes


def build_restore_hook(target_dir: str, canary: str) -> str:
    """A WriteFile as a control input of the saver's restore op: runs at every load."""
    export_dir = _export_dir(target_dir, "restore_hook")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.identity(x * _weights(), name="y")
        saver = v1.train.Saver()
        hook = tf.io.write_file(canary, "written when the model is loaded", name="restore_hook")
        graph.get_operation_by_name(saver.saver_def.restore_op_name)._add_control_input(hook)
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}), saver=saver)


def build_saver_save_in_signature(target_dir: str, canary: str) -> str:
    """saver_def.save_tensor_name names a SaveV2 of the request's input, and the signature
    output waits for it: the published model writes every request to ``canary``.*"""
    export_dir = _export_dir(target_dir, "saver_save_in_signature")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = _weights()
        # The saver's file name defaults to the canary when nobody feeds it (a request).
        saver = v1.train.Saver(filename=canary)
        prefix = graph.get_tensor_by_name(saver.saver_def.filename_tensor_name)
        dump = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["request"],
                                 shape_and_slices=[""], tensors=[x], name="dump")
        with tf.control_dependencies([dump]):
            done = tf.identity(prefix, name="dump_done")
        with tf.control_dependencies([done]):
            y = tf.identity(x * w, name="y")
        save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}), saver=saver)

    def point_the_saver_at_the_dump(meta_graph):
        # After the builder saved the variables with the real save op.
        meta_graph.saver_def.save_tensor_name = "dump_done:0"

    edit_saved_model(export_dir, point_the_saver_at_the_dump)
    return export_dir


def build_gradient_host_op(target_dir: str, canary: str) -> str:
    """A WriteFile in a function reached only through ``library.gradient``: the signature
    outputs a SymbolicGradient of a harmless function whose registered gradient writes."""
    from tensorflow.python.framework import function

    export_dir = _export_dir(target_dir, "gradient_host_op")
    with tf.Graph().as_default() as graph:
        @function.Defun(tf.float32, tf.float32)
        def HostGrad(x, dy):  # noqa: N802 - the function's name in the library
            write = tf.raw_ops.WriteFile(filename=canary, contents="written by a gradient")
            with tf.control_dependencies([write]):
                return tf.identity(dy * 2.0)

        @function.Defun(tf.float32, grad_func=HostGrad)
        def Double(x):  # noqa: N802
            return x * 2.0

        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = _weights()
        doubled = Double(x)
        doubled.set_shape([None, 3])
        (dx,) = tf.gradients(doubled, x)
        y = tf.identity(dx * w, name="y")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))


class _HostPathTable(tf.saved_model.experimental.TrackableResource):
    """A hash table filled from ``path``, a plain string tensor rather than an Asset."""

    def __init__(self, path: str):
        super().__init__()
        # Captured by the exported initializer function: it becomes a function argument
        # bound to a `constant` of the object graph and a Const of the graph.
        self._path = tf.constant(path)

    def _create_resource(self):
        return tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)

    def _initialize(self):
        # Never called here: tf.saved_model.save only traces it for the loaders.
        return tf.raw_ops.InitializeTableFromTextFileV2(
            table_handle=self.resource_handle, filename=self._path, key_index=-2,
            value_index=-1)


def build_table_path_argument(target_dir: str, canary: str) -> str:
    """TF2: a lookup-table initializer function reading ``canary``, passed to it as an
    argument (a captured constant, not an asset): both loaders read it at load."""
    export_dir = _export_dir(target_dir, "table_path_argument")

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = _HostPathTable(canary)
            # Created now (eagerly, empty), so the signature captures this very table
            # instead of creating its own inside the function.
            self.table.resource_handle  # noqa: B018
            self.w = tf.Variable([1.0, 2.0, 3.0])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, words):
            ids = tf.raw_ops.LookupTableFindV2(
                table_handle=self.table.resource_handle, keys=words,
                default_value=tf.constant(-1, tf.int64))
            return {"y": tf.gather(self.w, tf.maximum(ids, 0))}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


def build_table_asset_in_signature(target_dir: str, canary: str) -> str:
    """TF1: a table initializer reading a node declared as an asset, run by the signature.

    The loader feeds asset nodes only when it runs the init op; a request runs the
    initializer with the asset Const unfed, so it reads the Const's value: ``canary``.
    """
    export_dir = _export_dir(target_dir, "table_asset_in_signature")
    # The builder copies the asset into the model from the Const's path: a harmless
    # vocabulary first, the Const's value is pointed at the canary afterwards.
    os.makedirs(os.path.dirname(export_dir), exist_ok=True)
    vocabulary = os.path.join(os.path.dirname(export_dir), "vocab.txt")
    with open(vocabulary, "w") as f:
        f.write("a\nb\nc\n")
    with tf.Graph().as_default() as graph:
        words = v1.placeholder(tf.string, [None], name="words")
        w = _weights()
        asset = tf.constant(vocabulary, name="vocab_asset")
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset)
        table = tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64,
                                       name="vocab_table")
        init = tf.raw_ops.InitializeTableFromTextFileV2(
            table_handle=table, filename=asset, key_index=-2, value_index=-1,
            name="vocab_init")
        with tf.control_dependencies([init]):  # every request (re)initializes the table
            ids = tf.raw_ops.LookupTableFindV2(table_handle=table, keys=words,
                                               default_value=tf.constant(-1, tf.int64))
        y = tf.identity(tf.gather(w, tf.maximum(ids, 0)), name="y")
        save_tf1(graph, export_dir, serving_default({"words": words}, {"y": y}),
                 assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS))

    def point_the_asset_at_the_canary(meta_graph):
        node = next(n for n in meta_graph.graph_def.node if n.name == "vocab_asset")
        node.attr["value"].tensor.string_val[:] = [canary.encode()]

    edit_saved_model(export_dir, point_the_asset_at_the_canary)
    return export_dir


def build_register_dataset(target_dir: str, canary: str,
                           address: str = "localhost:5050") -> str:
    """A RegisterDataset (tf.data service, gRPC to ``address``) on the signature's path.

    Built with raw ops in a graph and never run. ``canary`` is unused (a network op
    touches no file); it is accepted so every builder has the same signature.
    """
    del canary
    export_dir = _export_dir(target_dir, "register_dataset")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = _weights()
        dataset = tf.raw_ops.RangeDataset(start=0, stop=1, step=1, output_types=[tf.int64],
                                          output_shapes=[[]])
        dataset_id = tf.raw_ops.RegisterDataset(dataset=dataset, address=address,
                                                protocol="grpc", external_state_policy=2,
                                                name="register")
        y = tf.identity(x * w + tf.cast(dataset_id, tf.float32) * 0.0, name="y")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))


def build_init_op_write(target_dir: str, canary: str) -> str:
    """A WriteFile in the main op, which every loader runs after restoring."""
    export_dir = _export_dir(target_dir, "init_op_write")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.identity(x * _weights(), name="y")
        write = tf.io.write_file(canary, "written by the init op", name="init_write")
        main_op = tf.group(write, name="main_op")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}), main_op=main_op)


@dataclass(frozen=True)
class Hostile:
    """A route: its builder, the op that acts, and what a run does to the canary
    (``writes``: creates a file named ``canary``*, ``reads``, or ``network``)."""

    build: Callable[..., str]
    op: str
    effect: str
    runs_at: str  # "load" (restore or init op) or "request" (a signature)


HOSTILE: dict[str, Hostile] = {
    "restore_hook": Hostile(build_restore_hook, "WriteFile", "writes", "load"),
    "saver_save_in_signature": Hostile(build_saver_save_in_signature, "SaveV2", "writes",
                                       "request"),
    "gradient_host_op": Hostile(build_gradient_host_op, "WriteFile", "writes", "request"),
    "table_path_argument": Hostile(build_table_path_argument,
                                   "InitializeTableFromTextFileV2", "reads", "load"),
    "table_asset_in_signature": Hostile(build_table_asset_in_signature,
                                        "InitializeTableFromTextFileV2", "reads", "request"),
    "register_dataset": Hostile(build_register_dataset, "RegisterDataset", "network",
                                "request"),
    "init_op_write": Hostile(build_init_op_write, "WriteFile", "writes", "load"),
}


def host_listener() -> tuple[socket.socket, str]:
    """A non-blocking listener on the host's loopback and its ``host:port``: what a
    network route (``register_dataset``) is pointed at. ``accept()`` raising
    BlockingIOError afterwards means nothing reached it.

    Example:
        >>> listener, address = host_listener()
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def run_in_plain_tensorflow(export_dir: str, words: list[str] | None = None) -> dict:
    """Load ``export_dir`` with TF's own loader and answer one request (``REQUEST``, or
    ``words`` for a string input), in this process and outside any sandbox: the control
    that shows what a route does to the host when nothing stands in the way."""
    with tf.Graph().as_default(), v1.Session() as session:
        meta_graph = v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta_graph.signature_def["serving_default"]
        feed = {info.name: (words if info.dtype == tf.string.as_datatype_enum else REQUEST)
                for info in signature.inputs.values()}
        return session.run({k: v.name for k, v in signature.outputs.items()}, feed)


def canary_files(canary: str) -> list[str]:
    """Files a run created for ``canary`` (a checkpoint writes ``canary.index``, ...)."""
    directory, base = os.path.split(canary)
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n == base or n.startswith(base + "."))


__all__ = ["HOSTILE", "REQUEST", "Hostile", "canary_files", "host_listener",
           "build_gradient_host_op", "run_in_plain_tensorflow",
           "build_init_op_write", "build_register_dataset", "build_restore_hook",
           "build_saver_save_in_signature", "build_table_asset_in_signature",
           "build_table_path_argument"]
