"""Freezing: variables become constants, tables and assets keep working.

The classic recipe (``freeze_graph``, ``saved_model_cli freeze_model``, TF-TRT)
keeps only the signature outputs, so the init op and the table initializers it
runs are pruned and the first lookup fails with "Table not initialized". Here the
freeze keeps, as extra outputs, everything TF Serving's loader touches: the init
op, the table initializers, and the asset tensors it feeds with file paths.

The init op itself is rewritten: variable initializers are dropped from it (the
variables are constants now, and an ``Assign`` into a constant cannot run) and
everything else it ran, table initialization above all, is kept.

TF2 SavedModels (Keras ``model.export``, ``tf.saved_model.save``) load the same
way, through the session loader, and freeze the same way, with three differences
handled here: the variables live behind function arguments (TF's converter rewrites
the function bodies; ``ResourceGather`` inside a function is first spelled as a read
plus ``GatherV2``, which the converter can freeze), each asset path is held in a
string variable the init op assigns from the fed asset tensor (kept a variable, so
it follows the model's own ``assets/``), and only what the signatures and the init
op reach is converted (a TF2 graph holds each variable up to three times).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel import checkpoint, loader, unbound_variables
from serving_opt.savedmodel.graph import (
    PROTOBUF_LIMIT_BYTES,
    ServingGraph,
    node_name,
    reachable_nodes,
    reachable_subgraph,
    stateful_nodes,
    tensor_info_nodes,
)

# Frozen constants must leave room under PROTOBUF_LIMIT_BYTES for the non-constant
# nodes and the rest of the MetaGraphDef.
_GRAPH_MARGIN_BYTES = 64 * 2**20

# Variables above this stay variables (see docs/big-models.md for the measurements).
# TF's load-time constant folding will not materialize a constant above 10 MiB
# (common_runtime's max_constant_size_in_bytes) and Grappler's above 100 KiB
# (kMaxConstantSize), so freezing a larger weight buys no folding at load, while every
# byte of constant in the GraphDef is parsed, copied into the Graph and handed to
# Grappler at load: a 1 GB frozen table loads 12x slower and needs 9x the memory.
# 10 MiB keeps every weight of ResNet50/MobileNetV2 (<= 9.4 MB) foldable into its
# batch norm, and keeps embedding tables of any real size as variables.
DEFAULT_FREEZE_MAX_BYTES = 10 * 2**20

_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "_VarHandlesOp"})
_VARIABLE_WRITE_OPS = frozenset({
    "Assign", "AssignVariableOp", "AssignAdd", "AssignSub",
    "AssignAddVariableOp", "AssignSubVariableOp",
})


@dataclass(frozen=True)
class FreezeInfo:
    """What freezing did, for the report."""

    variables_frozen: int
    variable_bytes: int
    init_op: str | None
    dropped_variable_initializers: tuple[str, ...]
    kept_init_ops: tuple[str, ...]
    # Variables deliberately left variables (TF2 asset paths, assigned by the init op).
    variables_kept: tuple[str, ...] = ()
    # Large variables left variables, in a new checkpoint (checkpoint.KeptVariable).
    large_variables_kept: tuple = ()
    # Variables the signatures read but the session loader never restored, whose values
    # came from the checkpoint (unbound_variables): the original was not servable.
    rebound: tuple[str, ...] = ()


def variable_sizes(graph_def) -> dict[str, int]:
    """Bytes each variable will take as a constant, from its declared shape and dtype."""
    from tensorflow.python.framework import dtypes, tensor_shape

    sizes = {}
    for node in graph_def.node:
        if node.op not in _VARIABLE_OPS:
            continue
        dtype = dtypes.as_dtype(node.attr["dtype"].type)
        shape = tensor_shape.TensorShape(node.attr["shape"].shape)
        if shape.is_fully_defined():
            elements = shape.num_elements() or 0
        else:
            elements = 0
        itemsize = dtype.size if dtype != dtypes.string else 0
        sizes[node.name] = elements * itemsize
    return sizes


_PASS_THROUGH = frozenset({"Identity", "IdentityN", "ReadVariableOp"})


def asset_variables(graph_def, asset_nodes) -> frozenset[str]:
    """Variables assigned from an asset tensor: TF2's way of holding an asset's path.

    ``tf.saved_model.save`` stores each asset path in a string variable that the init
    op assigns from the asset placeholder the loader feeds. Frozen, it would hold the
    path the *source* was loaded from; kept, it keeps following the model's own assets.
    """
    nodes = {n.name: n for n in graph_def.node}
    assets = set(asset_nodes)
    out = set()
    for node in graph_def.node:
        if node.op not in _VARIABLE_WRITE_OPS or len(node.input) < 2:
            continue
        target = nodes.get(node_name(node.input[0]))
        source = nodes.get(node_name(node.input[1]))
        while source is not None and source.op in _PASS_THROUGH and source.name not in assets:
            source = nodes.get(node_name(source.input[0])) if source.input else None
        if target is not None and target.op in _VARIABLE_OPS and source is not None \
                and source.name in assets:
            out.add(target.name)
    return frozenset(out)


def check_protobuf_limit(sizes: dict[str, int], limit_bytes: int = PROTOBUF_LIMIT_BYTES) -> None:
    """Refuses to freeze what cannot be serialized: a GraphDef above 2 GiB."""
    budget = limit_bytes - min(_GRAPH_MARGIN_BYTES, limit_bytes // 32)
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        if size > budget:
            raise ServingOptError(
                f"variable {name} is {size / 2**30:.2f} GiB as a constant, over the "
                f"{limit_bytes / 2**30:.0f} GiB protobuf limit of a frozen GraphDef",
                "keep variables for this model (--freeze=never) or shard/shrink that variable",
            )
    total = sum(sizes.values())
    if total > budget:
        largest = ", ".join(n for n, _ in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        raise ServingOptError(
            f"frozen variables would total {total / 2**30:.2f} GiB, over the "
            f"{limit_bytes / 2**30:.0f} GiB protobuf limit (largest: {largest})",
            "keep variables for this model (--freeze=never) or shrink the largest ones",
        )


def choose_kept(sizes: dict[str, int], max_bytes: int,
                limit_bytes: int = PROTOBUF_LIMIT_BYTES) -> dict[str, str]:
    """Which variables stay variables, and why: those above ``max_bytes``, then the
    largest remaining ones until what is frozen fits under the protobuf limit.
    """
    from serving_opt.core.rendering import human_bytes

    kept = {name: f"{human_bytes(size)}, above --freeze_max_bytes ({human_bytes(max_bytes)})"
            for name, size in sizes.items() if size > max_bytes}
    budget = limit_bytes - min(_GRAPH_MARGIN_BYTES, limit_bytes // 32)
    frozen = {n: s for n, s in sizes.items() if n not in kept}
    for name, size in sorted(frozen.items(), key=lambda kv: -kv[1]):
        if sum(frozen.values()) <= budget:
            break
        kept[name] = f"{human_bytes(size)}; freezing it would pass the " \
                     f"{limit_bytes / 2**30:.0f} GiB protobuf limit"
        del frozen[name]
    return kept


def _control_leaves(nodes: dict, root: str) -> list[str]:
    """The non-NoOp ops a (possibly nested) ``tf.group`` runs."""
    leaves: list[str] = []
    seen: set[str] = set()
    stack = [root]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        if node.op == "NoOp":
            stack.extend(node_name(i) for i in reversed(node.input))
        else:
            leaves.append(name)
    return leaves


def _writes_variable(node, nodes: dict, keep: frozenset[str] = frozenset()) -> bool:
    if node.op not in _VARIABLE_WRITE_OPS or not node.input:
        return False
    target = nodes.get(node_name(node.input[0]))
    return target is not None and target.op in _VARIABLE_OPS and target.name not in keep


def rewrite_init_op(graph_def, init_op: str,
                    keep_variables: frozenset[str] = frozenset()) -> tuple[object, list[str],
                                                                           list[str]]:
    """Drops variable initializers from the init op; keeps the rest (tables, ...).

    Writes to ``keep_variables`` (variables that stay variables, such as the TF2
    asset-path variables the init op assigns from the fed asset tensor) are kept.
    Returns ``(graph_def, kept_ops, dropped_ops)``; the init op keeps its name so
    the SavedModel's main_op / ``__saved_model_init_op`` still point at it.
    """
    from tensorflow.core.framework import graph_pb2

    nodes = {n.name: n for n in graph_def.node}
    if init_op not in nodes:
        raise ServingOptError(
            f"the init op {init_op} named by the SavedModel is not in its graph",
            "re-export the model; its main_op/init op is broken",
        )
    root = nodes[init_op]
    if root.op != "NoOp":
        if _writes_variable(root, nodes, keep_variables):
            root_copy = graph_pb2.GraphDef()
            root_copy.CopyFrom(graph_def)
            for node in root_copy.node:
                if node.name == init_op:
                    node.Clear()
                    node.name = init_op
                    node.op = "NoOp"
            return root_copy, [], [init_op]
        return graph_def, [init_op], []
    leaves = _control_leaves(nodes, init_op)
    kept = [n for n in leaves if not _writes_variable(nodes[n], nodes, keep_variables)]
    dropped = [n for n in leaves if n not in kept]
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name == init_op:
            del node.input[:]
            node.input.extend("^" + k for k in kept)
            node.device = ""
    return out, kept, dropped


def restore_control_inputs(original, frozen) -> int:
    """Puts back the control inputs TF's converter dropped; returns how many.

    ``convert_variables_to_constants`` rewrites a variable read into an ``Identity`` of
    the new constant and loses the read's control inputs. Under
    ``tf.control_dependencies([tf.debugging.assert_*(x)])`` the read is what carries the
    assertion: dropped, the original rejects a bad input and the frozen model answers it.
    A control input is put back where its node is still in the frozen graph and is no
    variable write (those cannot run on a constant). Changes ``frozen`` in place.
    """
    wanted = {n.name: [i for i in n.input if i.startswith("^")] for n in original.node}
    frozen_nodes = {n.name: n for n in frozen.node}
    count = 0
    for node in frozen.node:
        have = set(node.input)
        for control in wanted.get(node.name, ()):
            source = frozen_nodes.get(node_name(control))
            if control in have or source is None or source.op in _VARIABLE_WRITE_OPS:
                continue
            node.input.append(control)
            count += 1
    return count


def _asset_defs(meta_graph, saved_model_dir: str) -> tuple:
    from tensorflow.core.protobuf import meta_graph_pb2

    defs = list(meta_graph.asset_file_def)
    if not defs:
        col = meta_graph.collection_def.get(loader.SAVED_MODEL_ASSETS_COLLECTION)
        if col is not None:
            for any_value in col.any_list.value:
                asset = meta_graph_pb2.AssetFileDef()
                any_value.Unpack(asset)
                defs.append(asset)
    return tuple(defs)


def _init_op_source(meta_graph) -> str | None:
    sig = meta_graph.signature_def.get(loader.INIT_OP_SIGNATURE_KEY)
    if sig is not None and sig.outputs:
        return "signature"
    for key, source in ((loader.MAIN_OP_COLLECTION, "main_op"),
                        (loader.LEGACY_INIT_OP_COLLECTION, "legacy_init_op")):
        col = meta_graph.collection_def.get(key)
        if col is not None and col.node_list.value:
            return source
    return None


def _drop_dangling_colocation(graph_def) -> None:
    """``_class: loc:@x`` naming a pruned node makes the graph unimportable."""
    names = {n.name for n in graph_def.node}
    for node in graph_def.node:
        node.device = ""
        if "_class" not in node.attr:
            continue
        locs = [s for s in node.attr["_class"].list.s
                if s.decode().removeprefix("loc:@") in names]
        if locs:
            del node.attr["_class"].list.s[:]
            node.attr["_class"].list.s.extend(locs)
        else:
            del node.attr["_class"]


def rewrite_resource_reads_in_functions(graph_def) -> int:
    """Spells ``ResourceGather``/``VariableShape`` inside functions as a read plus the op.

    TF's converter turns ``ReadVariableOp`` of a frozen variable into ``Identity``
    everywhere, but leaves a ``ResourceGather`` (an embedding lookup) inside a function
    untouched while its argument becomes a float tensor: the frozen graph is invalid
    (tensorflow#53569, the embedding-model freezing failure). ``ReadVariableOp`` +
    ``GatherV2`` computes the same, and freezes. Changes ``graph_def`` in place and
    returns the number of nodes rewritten.
    """
    from tensorflow.core.framework import node_def_pb2, types_pb2

    count = 0
    for function in graph_def.library.function:
        names = {n.name for n in function.node_def}
        added = []
        for node in function.node_def:
            if node.op == "ResourceGather" and node.attr["batch_dims"].i == 0:
                read, axis = f"{node.name}/serving_opt_read", f"{node.name}/serving_opt_axis"
                if read in names or axis in names:
                    continue
                data = [i for i in node.input if not i.startswith("^")]
                control = [i for i in node.input if i.startswith("^")]
                dtype, tindices = node.attr["dtype"].type, node.attr["Tindices"].type
                read_node = node_def_pb2.NodeDef(name=read, op="ReadVariableOp")
                read_node.input.extend([data[0]] + control)
                read_node.attr["dtype"].type = dtype
                axis_node = node_def_pb2.NodeDef(name=axis, op="Const")
                axis_node.attr["dtype"].type = types_pb2.DT_INT32
                axis_node.attr["value"].tensor.dtype = types_pb2.DT_INT32
                axis_node.attr["value"].tensor.int_val.append(0)
                node.ClearField("attr")
                node.op = "GatherV2"
                del node.input[:]
                # Function-body tensor names: node:output_arg:index.
                node.input.extend([f"{read}:value:0", data[1], f"{axis}:output:0"] + control)
                node.attr["Tparams"].type = dtype
                node.attr["Tindices"].type = tindices
                node.attr["Taxis"].type = types_pb2.DT_INT32
                added.extend([read_node, axis_node])
                count += 1
            elif node.op == "VariableShape":
                read = f"{node.name}/serving_opt_read"
                if read in names:
                    continue
                # VariableShape's out_type defaults to int32 when unset.
                out_type = node.attr["out_type"].type or types_pb2.DT_INT32
                read_node = node_def_pb2.NodeDef(name=read, op="ReadVariableOp")
                read_node.input.append(node.input[0])
                read_node.attr["dtype"].type = _resource_dtype(function, node.input[0])
                if not read_node.attr["dtype"].type:
                    continue
                node.ClearField("attr")
                node.op = "Shape"
                node.input[0] = f"{read}:value:0"
                node.attr["T"].type = read_node.attr["dtype"].type
                node.attr["out_type"].type = out_type
                added.append(read_node)
                count += 1
        function.node_def.extend(added)
    return count


def _resource_dtype(function, resource_input: str) -> int:
    """The value dtype of a resource argument/tensor, from the function's own reads."""
    arg = resource_input.split(":")[0]
    for node in function.node_def:
        if node.op == "ReadVariableOp" and node.input and node.input[0].split(":")[0] == arg:
            return node.attr["dtype"].type
    return 0


def freeze_session_model(
    saved_model_dir: str,
    tags: frozenset[str],
    signature_keys: Sequence[str],
    *,
    limit_bytes: int = PROTOBUF_LIMIT_BYTES,
    max_bytes: int | None = None,
    variables_dir: str | None = None,
) -> tuple[ServingGraph, FreezeInfo]:
    """Loads a TF1-graph SavedModel like TF Serving does and freezes its variables.

    With ``variables_dir``, variables above ``max_bytes`` (and, past the protobuf
    limit, the largest others) stay variables: their values are saved there as a new
    checkpoint and a saver restoring them is added to the graph. Without it every
    variable is frozen, and one that cannot be is an error.
    """
    import tensorflow as tf

    sess, meta_graph = loader.load_session(saved_model_dir, tags)
    try:
        unbound = unbound_variables.find(meta_graph, saved_model_dir)
        if unbound:
            unbound_variables.restore(sess, unbound, saved_model_dir)
        graph_def = sess.graph.as_graph_def()
        signatures = {k: meta_graph.signature_def[k] for k in signature_keys}
        init_op = loader.init_op_name(meta_graph)
        assets = _asset_defs(meta_graph, saved_model_dir)
        asset_nodes = [node_name(a.tensor_info.name) for a in assets]
        keep_variables = asset_variables(graph_def, asset_nodes)
        kept_init: list[str] = []
        dropped_init: list[str] = []
        if init_op:
            graph_def, kept_init, dropped_init = rewrite_init_op(graph_def, init_op,
                                                                 keep_variables)
        rewrite_resource_reads_in_functions(graph_def)
        present = {n.name for n in graph_def.node}
        table_init = [
            node_name(n) for n in meta_graph.collection_def[
                loader.TABLE_INITIALIZER_COLLECTION].node_list.value
            if node_name(n) in present
        ] if loader.TABLE_INITIALIZER_COLLECTION in meta_graph.collection_def else []
        sig_nodes: list[str] = []
        for sig in signatures.values():
            for info in list(sig.inputs.values()) + list(sig.outputs.values()):
                sig_nodes.extend(tensor_info_nodes(info))
        missing = sorted({n for n in sig_nodes if n not in present})
        if missing:
            raise ServingOptError(
                f"signature tensors refer to nodes missing from the graph: {', '.join(missing)}",
                "re-export the model; its SignatureDefs are broken",
            )
        outputs = list(dict.fromkeys(
            sig_nodes + ([init_op] if init_op else []) + asset_nodes + table_init
        ))
        reached = reachable_nodes(graph_def, outputs)
        sizes = {name: size for name, size in variable_sizes(graph_def).items()
                 if name in reached and name not in keep_variables}
        large: list[checkpoint.KeptVariable] = []
        if variables_dir is not None:
            by_name = {n.name: n for n in graph_def.node}
            for name, reason in sorted(choose_kept(
                    sizes, DEFAULT_FREEZE_MAX_BYTES if max_bytes is None else max_bytes,
                    limit_bytes).items()):
                node = by_name[name]
                large.append(checkpoint.KeptVariable(
                    name, node.op, node.attr["dtype"].type, sizes.pop(name), reason))
        check_protobuf_limit(sizes, limit_bytes)
        # The converter walks every node of every library function; a TF2 model's save
        # and restore functions are most of them (2-4x the serving functions).
        graph_def = reachable_subgraph(graph_def, reached)
        try:
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                sess, graph_def, outputs,
                variable_names_blacklist=sorted(keep_variables | {v.name for v in large})
                or None,
            )
        except Exception as e:  # TF raises many types here; name the cause in one line
            first = first_line(e)
            raise ServingOptError(
                f"could not freeze the variables of {saved_model_dir}: {first}",
                "rerun with --freeze=never to optimize without freezing",
            ) from e
        restore_control_inputs(graph_def, frozen)
        if large:
            checkpoint.save_values(sess, large, variables_dir)
    finally:
        sess.close()
        del sess
        gc.collect()  # the loaded model's memory, before the next stage loads anything

    saver_def = None
    if large:
        nodes, saver_def = checkpoint.saver_nodes(large)
        frozen.node.extend(nodes)
    _drop_dangling_colocation(frozen)
    frozen_names = {n.name for n in frozen.node}
    collections = {}
    if table_init:
        collections[loader.TABLE_INITIALIZER_COLLECTION] = [
            n for n in table_init if n in frozen_names
        ]
    protected = list(dict.fromkeys(
        ([init_op] if init_op else []) + asset_nodes + table_init + kept_init
        + stateful_nodes(frozen)
        + ([node_name(saver_def.restore_op_name), node_name(saver_def.save_tensor_name)]
           if saver_def else [])
    ))
    init_source = _init_op_source(meta_graph)
    if init_source == "signature" and init_op in frozen_names and \
            meta_graph.collection_def.get(loader.MAIN_OP_COLLECTION) is not None:
        # tf.saved_model.save declares the init op twice (signature for TF2 loaders,
        # main_op collection for older ones); keep both declarations.
        collections[loader.MAIN_OP_COLLECTION] = [init_op]
    serving_graph = ServingGraph(
        graph_def=frozen,
        signature_defs=signatures,
        tags=frozenset(tags),
        init_op=init_op,
        init_op_source=init_source,
        init_op_signature=meta_graph.signature_def.get(loader.INIT_OP_SIGNATURE_KEY),
        asset_file_defs=assets,
        collections=collections,
        protected_nodes=tuple(n for n in protected if n in {n.name for n in frozen.node}),
        source_dir=saved_model_dir,
        saver_def=saver_def,
        variables_dir=variables_dir if large else None,
        kept_variables=tuple(large),
    )
    info = FreezeInfo(
        variables_frozen=len(sizes),
        variable_bytes=sum(sizes.values()),
        init_op=init_op,
        dropped_variable_initializers=tuple(dropped_init),
        kept_init_ops=tuple(kept_init),
        variables_kept=tuple(sorted(keep_variables)),
        large_variables_kept=tuple(large),
        rebound=tuple(v.node for v in unbound),
    )
    return serving_graph, info


def load_unfrozen(
    saved_model_dir: str, tags: frozenset[str], signature_keys: Sequence[str]
) -> ServingGraph:
    """The serving graph with its variables kept (``--freeze=never`` or a fallback).

    Transforms and Grappler still run, but cannot fold through weights; the saver
    and the checkpoint are carried over unchanged.
    """
    import os

    saved_model = loader.read_saved_model(saved_model_dir)
    meta_graph = loader.find_meta_graph(saved_model, tags, saved_model_dir)
    prefix = os.path.join(saved_model_dir, "variables", "variables")
    if os.path.isfile(prefix) and not os.path.exists(prefix + ".index"):
        # TF Serving restores only V2 checkpoints; carried over, this one would be
        # skipped at load. Freezing (or a V2 checkpoint of the large ones) rewrites it.
        raise ServingOptError(
            f"{prefix} is a V1-format checkpoint, which TF Serving does not restore, and "
            "keeping the variables would carry it over as it is",
            "let optimize freeze the variables (--freeze=auto or always): it rewrites "
            "them as constants and a V2 checkpoint")
    # Load once, so a model that cannot load fails here with the loader's message.
    sess, _ = loader.load_session(saved_model_dir, tags)
    sess.close()
    unbound = unbound_variables.find(meta_graph, saved_model_dir)
    if unbound:
        # Carried over, the graph keeps reading variables nothing restores.
        unbound_variables.check_repairable(unbound, saved_model_dir)
        raise ServingOptError(
            f"{saved_model_dir} is not servable as it is: {unbound_variables.problem(unbound)}",
            "let optimize freeze the variables (--freeze=auto or always): it takes their "
            "values from the checkpoint")
    graph_def = meta_graph.graph_def
    signatures = {k: meta_graph.signature_def[k] for k in signature_keys}
    init_op = loader.init_op_name(meta_graph)
    assets = _asset_defs(meta_graph, saved_model_dir)
    saver_nodes = []
    if meta_graph.HasField("saver_def"):
        saver = meta_graph.saver_def
        saver_nodes = [node_name(n) for n in (saver.restore_op_name, saver.filename_tensor_name,
                                              saver.save_tensor_name) if n]
    collection_defs = {}
    for key, col in meta_graph.collection_def.items():
        if key in (loader.MAIN_OP_COLLECTION, loader.LEGACY_INIT_OP_COLLECTION,
                   loader.ASSET_FILEPATHS_COLLECTION, loader.SAVED_MODEL_ASSETS_COLLECTION):
            continue  # the writer recreates these from the fields above
        collection_defs[key] = col
    names = {n.name for n in graph_def.node}
    protected = list(dict.fromkeys(
        ([init_op] if init_op else []) + [node_name(a.tensor_info.name) for a in assets]
        + saver_nodes + stateful_nodes(graph_def)
        + _collection_nodes(meta_graph)
    ))
    variables_dir = os.path.join(saved_model_dir, "variables")
    return ServingGraph(
        graph_def=graph_def,
        signature_defs=signatures,
        tags=frozenset(tags),
        init_op=init_op,
        init_op_source=_init_op_source(meta_graph),
        init_op_signature=meta_graph.signature_def.get(loader.INIT_OP_SIGNATURE_KEY),
        asset_file_defs=assets,
        protected_nodes=tuple(n for n in protected if n in names),
        source_dir=saved_model_dir,
        saver_def=meta_graph.saver_def if meta_graph.HasField("saver_def") else None,
        variables_dir=variables_dir if os.path.isdir(variables_dir) else None,
        collection_defs=collection_defs,
    )


def _collection_nodes(meta_graph) -> list[str]:
    """Nodes named by node_list collections and VariableDefs: kept when variables are."""
    from tensorflow.core.framework import variable_pb2

    out = []
    for col in meta_graph.collection_def.values():
        out.extend(node_name(v) for v in col.node_list.value)
        for raw in col.bytes_list.value:
            var = variable_pb2.VariableDef()
            try:
                var.ParseFromString(raw)
            except Exception:  # not a VariableDef collection
                break
            out.extend(node_name(n) for n in (var.variable_name, var.initializer_name,
                                              var.snapshot_name, var.initial_value_name) if n)
    return out
