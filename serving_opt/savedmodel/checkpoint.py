"""Large variables kept as variables: a new checkpoint holding only what serving reads.

Freezing a 1 GB embedding into a constant makes TF Serving load 12x slower, stall the
first request for a minute and need 9x the memory (the GraphDef is copied and folded at
load), and gains nothing: a gather from a constant is no faster than from a variable.
So variables above ``--freeze_max_bytes`` stay variables. Their values are saved here,
straight from the loaded session (one ``SaveV2``, no copy through Python), into the new
version's ``variables/``, and a small saver (``RestoreV2`` + one assign per variable)
is added to the graph for the loader to run. Optimizer slots, ``global_step`` and
anything else the serving graph does not read are left behind.

    nodes, saver_def = saver_nodes(kept)
    save_values(sess, kept, "/models/clf/.staging-x/variables")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving_opt.savedmodel.graph import attr, make_node, var_handle

SAVER_SCOPE = "serving_opt_saver"
DEFAULT_MAX_CONSTANT_BYTES = 64 * 1024
_RESOURCE_VARIABLE_OPS = frozenset({"VarHandleOp"})


@dataclass(frozen=True)
class KeptVariable:
    """A variable left a variable, and why (for the report)."""

    name: str  # node name, also its key in the new checkpoint
    op: str  # VariableV2 | VarHandleOp
    dtype: int  # DataType enum of its value
    nbytes: int
    reason: str


def save_values(sess, kept: list[KeptVariable], variables_dir: str) -> str:
    """Saves the kept variables' current values from ``sess`` as ``variables_dir/variables``."""
    import tensorflow as tf

    os.makedirs(variables_dir, exist_ok=True)
    prefix = os.path.join(variables_dir, "variables")
    graph = sess.graph
    with graph.as_default(), tf.name_scope(f"{SAVER_SCOPE}_export"):
        tensors = []
        for var in kept:
            op = graph.get_operation_by_name(var.name)
            if var.op in _RESOURCE_VARIABLE_OPS:
                tensors.append(tf.raw_ops.ReadVariableOp(resource=op.outputs[0],
                                                         dtype=tf.as_dtype(var.dtype)))
            else:
                tensors.append(op.outputs[0])
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=[v.name for v in kept],
                                 shape_and_slices=[""] * len(kept), tensors=tensors)
    sess.run(save)
    return prefix


def saver_nodes(kept: list[KeptVariable]) -> tuple[list, object]:
    """NodeDefs of a saver restoring (and saving) ``kept``, and its SaverDef.

    Written as nodes rather than through ``tf.compat.v1.train.Saver`` so the (possibly
    huge) graph never has to be imported just to add a dozen small ops.
    """
    from tensorflow.core.framework import attr_value_pb2, types_pb2
    from tensorflow.core.protobuf import saver_pb2
    from tensorflow.python.framework import tensor_util

    def node(name: str, op: str, inputs=(), **attrs):
        return make_node(f"{SAVER_SCOPE}/{name}", op, inputs, **attrs)

    def const(name: str, value):
        return node(name, "Const", dtype=attr(type=types_pb2.DT_STRING),
                    value=attr(tensor=tensor_util.make_tensor_proto(value)))

    dtypes = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
        type=[v.dtype for v in kept]))
    scope = SAVER_SCOPE
    nodes = [
        const("filename", "model"),  # the loader feeds the checkpoint path here
        const("tensor_names", [v.name for v in kept]),
        const("shape_and_slices", [""] * len(kept)),
        node("RestoreV2", "RestoreV2",
             [f"{scope}/filename", f"{scope}/tensor_names", f"{scope}/shape_and_slices"],
             dtypes=dtypes),
    ]
    assigns, saved = [], []
    for i, var in enumerate(kept):
        value = f"{scope}/RestoreV2:{i}" if i else f"{scope}/RestoreV2"
        dtype = attr(type=var.dtype)
        if var.op in _RESOURCE_VARIABLE_OPS:
            nodes.append(node(f"assign_{i}", "AssignVariableOp", [var.name, value], dtype=dtype))
            nodes.append(node(f"read_{i}", "ReadVariableOp", [var.name], dtype=dtype))
            saved.append(f"{scope}/read_{i}")
        else:
            nodes.append(node(f"assign_{i}", "Assign", [var.name, value], T=dtype,
                              validate_shape=attr(b=True), use_locking=attr(b=True)))
            saved.append(var.name)
        assigns.append(f"^{scope}/assign_{i}")
    nodes.append(node("restore_all", "NoOp", assigns))
    nodes.append(node("SaveV2", "SaveV2",
                      [f"{scope}/filename", f"{scope}/tensor_names",
                       f"{scope}/shape_and_slices"] + saved, dtypes=dtypes))
    nodes.append(node("control_dependency", "Identity",
                      [f"{scope}/filename", f"^{scope}/SaveV2"],
                      T=attr(type=types_pb2.DT_STRING)))
    saver_def = saver_pb2.SaverDef(
        filename_tensor_name=f"{scope}/filename:0",
        save_tensor_name=f"{scope}/control_dependency:0",
        restore_op_name=f"{scope}/restore_all",
        max_to_keep=5,
        keep_checkpoint_every_n_hours=10000.0,
        version=saver_pb2.SaverDef.V2,
    )
    return nodes, saver_def


def run_in_own_graph(build: Callable[[], object], feeds: dict | None = None):
    """Builds ops with ``build()`` in a new graph and runs what it returns in a session.

    Never the caller's default graph: inside ``train_and_evaluate`` that is the training
    graph, finalized by its MonitoredSession ("Graph is finalized and cannot be
    modified."), and in graph mode an op built there would not even run. ``feeds`` maps
    names of placeholders ``build`` made to values, so large arrays are fed, not copied
    into a GraphDef (which a 2 GiB table would not fit).
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        fetches = build()
    graph.finalize()  # everything is built: nothing later slips into this graph either
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(fetches, {graph.get_tensor_by_name(f"{name}:0"): value
                                  for name, value in (feeds or {}).items()})


def save_arrays(prefix: str, arrays: dict) -> str:
    """Writes ``{name: ndarray}`` as a V2 checkpoint at ``prefix`` (on the CPU)."""
    import tensorflow as tf

    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    values = [np.asarray(v) for v in arrays.values()]
    feeds = {f"value_{i}": v for i, v in enumerate(values)}

    def dtype(value: np.ndarray):
        # Strings come back from a checkpoint reader as object arrays of bytes.
        return tf.string if value.dtype.kind in "OSU" else tf.as_dtype(value.dtype)

    def build():
        return tf.raw_ops.SaveV2(
            prefix=prefix, tensor_names=list(arrays), shape_and_slices=[""] * len(arrays),
            tensors=[tf.compat.v1.placeholder(dtype(v), v.shape, name=name)
                     for name, v in zip(feeds, values)])

    run_in_own_graph(build, feeds)
    return prefix


def linked_copy(prefix: str, directory: str) -> str:
    """The V2 checkpoint at ``prefix`` (its index and data shards) hard-linked into
    ``directory`` (copied where a link cannot be made); returns the new prefix.
    """
    import shutil

    os.makedirs(directory, exist_ok=True)
    stem = os.path.basename(prefix)
    parent = os.path.dirname(prefix)
    for name in os.listdir(parent):
        if name == f"{stem}.index" or name.startswith(f"{stem}.data-"):
            src, dst = os.path.join(parent, name), os.path.join(directory, name)
            try:
                os.link(src, dst)
            except OSError:  # another filesystem, or no hard links there
                shutil.copyfile(src, dst)
    return os.path.join(directory, stem)


def merge_checkpoints(prefixes: list[str], destination_prefix: str) -> str:
    """Merges V2 checkpoints into one at ``destination_prefix``, deleting the parts."""
    import tensorflow as tf

    run_in_own_graph(lambda: tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=prefixes, destination_prefix=destination_prefix,
        delete_old_dirs=True))
    return destination_prefix


def emptied(var: str, dtype: int, after: str, prefix: str) -> list:
    """Init-op nodes that assign ``var`` an empty value once ``after`` has run; the last
    one is the assign. For a variable the init op reads once and nothing reads again
    (a quantized copy, a table's source): emptied, the serving process does not hold it
    for its whole life. An empty value of another shape is allowed (validate_shape
    false)."""
    from tensorflow.core.framework import tensor_shape_pb2
    from tensorflow.python.framework import tensor_util

    empty = f"{prefix}_empty"
    return [
        make_node(f"{empty}/value", "Const", dtype=attr(type=dtype),
                  value=attr(tensor=tensor_util.make_tensor_proto([], dtype=dtype))),
        # Of unknown shape to the graph: the assign's shape function merges the value's
        # static shape with the variable's (whatever validate_shape says), the kernel
        # does not.
        make_node(empty, "PlaceholderWithDefault", [f"{empty}/value"], dtype=attr(type=dtype),
                  shape=attr(shape=tensor_shape_pb2.TensorShapeProto(unknown_rank=True))),
        make_node(f"{prefix}_free", "AssignVariableOp", [var, empty, f"^{after}"],
                  dtype=attr(type=dtype), validate_shape=attr(b=False))]


def replace_saver(graph, graph_def, kept: list[KeptVariable], variables_dir: str,
                  removed: frozenset = frozenset(), protect: tuple = (), **changes):
    """``graph`` with ``graph_def``, its saver rebuilt for ``kept`` over ``variables_dir``.

    The saver this tool wrote before (for ``graph.kept_variables``) is taken out, and
    so are the ``removed`` nodes with the control edges onto them; ``protect`` and the
    new saver's ops join the protected nodes; ``changes`` are further ServingGraph
    fields (the init op, for one).
    """
    old = {n.name for n in saver_nodes(list(graph.kept_variables))[0]} \
        if graph.kept_variables else set()
    old |= set(removed)
    survivors = [n for n in graph_def.node if n.name not in old]
    for n in survivors:
        # Control edges onto a removed node (inlining leaves some on variables) go with it.
        inputs = [i for i in n.input if not (i.startswith("^") and i[1:] in old)]
        if len(inputs) != len(n.input):
            del n.input[:]
            n.input.extend(inputs)
    del graph_def.node[:]
    graph_def.node.extend(survivors)
    nodes, saver_def = saver_nodes(kept)
    graph_def.node.extend(nodes)
    protected = tuple(dict.fromkeys(
        [n for n in graph.protected_nodes if n not in old] + list(protect)
        + [f"{SAVER_SCOPE}/restore_all", f"{SAVER_SCOPE}/control_dependency"]))
    return graph.replace(graph_def=graph_def, saver_def=saver_def, variables_dir=variables_dir,
                         kept_variables=tuple(kept), protected_nodes=protected, **changes)


def externalize_constants(graph, min_bytes: int, work_dir: str) -> tuple:
    """Large constants left after optimization become variables of the new checkpoint.

    Freezing is what lets the transforms fold batch norms into convolution weights; once
    folded, those weights need not stay constants. As constants, TF Serving parses them,
    copies them into its Graph and hands them to its load-time Grappler on the first
    request (a frozen ResNet50 answered its first request 2.7x slower than the original).
    As variables they are restored from the checkpoint in one read. Constants inside
    functions, strings and protected nodes are left alone.

    Returns ``(graph, externalized)``, ``externalized`` a list of KeptVariable.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import tensor_util

    if graph.variables_dir is not None and not graph.kept_variables:
        return graph, []  # the source's own saver and checkpoint: not ours to extend
    keep = set(graph.must_keep())
    graph_def = type(graph.graph_def)()
    graph_def.CopyFrom(graph.graph_def)
    moved: list[KeptVariable] = []
    values = []
    new_nodes = []
    for node in graph_def.node:
        if node.op != "Const" or node.name in keep or node.name.startswith(SAVER_SCOPE):
            continue
        dtype = node.attr["dtype"].type
        tensor = node.attr["value"].tensor
        if dtype in (types_pb2.DT_STRING, types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT) or \
                tensor.ByteSize() < min_bytes:
            continue
        value = tensor_util.MakeNdarray(tensor)
        if value.nbytes < min_bytes:
            continue  # a broadcast constant: tiny in the graph, big as a variable
        handle = f"{node.name}/serving_opt_variable"
        new_nodes.append(var_handle(handle, dtype, tensor.tensor_shape))
        controls = [i for i in node.input if i.startswith("^")]
        node.op = "ReadVariableOp"
        del node.input[:]
        node.input.extend([handle] + controls)
        node.attr.clear()
        node.attr["dtype"].type = dtype
        moved.append(KeptVariable(handle, "VarHandleOp", dtype, value.nbytes,
                                  f"folded constant of {value.nbytes} bytes, restored at load"))
        values.append(value)
    if not moved:
        return graph, []
    graph_def.node.extend(new_nodes)
    # Save the new values next to (then merged with) a checkpoint freezing already wrote.
    part = save_arrays(os.path.join(work_dir, "externalized", "variables"),
                       {v.name: value for v, value in zip(moved, values)})
    del values
    prefixes = [part]
    if graph.variables_dir is not None:
        # Merging deletes its parts: merge links to the earlier checkpoint, so ``graph``
        # stays whole (another candidate may be built from it: --input_shapes).
        prefixes.insert(0, linked_copy(os.path.join(graph.variables_dir, "variables"),
                                       os.path.join(work_dir, "earlier")))
    merged_dir = os.path.join(work_dir, "merged")
    merge_checkpoints(prefixes, os.path.join(merged_dir, "variables"))
    return replace_saver(graph, graph_def, list(graph.kept_variables) + moved, merged_dir,
                         protect=tuple(v.name for v in moved)), moved
