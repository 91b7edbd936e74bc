"""Variables a TF2 SavedModel's signatures read that the session loader never restores.

``tf.saved_model.save`` on a Keras 3 model (keras-team/keras#19274, #20095, #20096,
tensorflow/tensorflow#72963) writes the signature functions' captured variables as
one set of ``VarHandleOp`` nodes, and the restore function as another: the session
loader (TF Serving's) restores the second set and every request then fails with
"Could not find variable ...". ``tf.saved_model.load`` rebinds the functions' captures
through the object graph, so it answers. The values are in the checkpoint, under the
keys the object graph gives the captured variables: :func:`restore` puts them there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader
from serving_opt.savedmodel.graph import node_name, reachable_nodes

_CALLS = ("StatefulPartitionedCall", "PartitionedCall")
_HANDLES = ("VarHandleOp",)
_VALUE = "VARIABLE_VALUE"
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass(frozen=True)
class UnboundVariable:
    """A handle the signatures read; ``checkpoint_key`` holds its value (None: nowhere)."""

    node: str
    shared_name: str
    container: str
    checkpoint_key: str | None


def _shared_name(node) -> str:
    # An empty shared_name makes the kernel use the node's name.
    return node.attr["shared_name"].s.decode("utf-8", "replace") or node.name


def find(meta_graph, saved_model_dir: str) -> list[UnboundVariable]:
    """The variables the serving signatures read that neither the restore op nor the
    init op reaches (by shared name, as the session's resource manager matches them).
    Empty for TF1 graphs, whose variables are all behind the saver.
    """
    if not loader.is_tf2(meta_graph):
        return []
    nodes = {n.name: n for n in meta_graph.graph_def.node}
    outputs = [t.name for key, sig in loader.serving_signatures(meta_graph).items()
               for t in sig.outputs.values()]
    read = [nodes[n] for n in sorted(reachable_nodes(meta_graph.graph_def, outputs))
            if nodes[n].op in _HANDLES]
    if not read:
        return []
    restored = {_shared_name(nodes[n]) for n in restored_handles(meta_graph)}
    unbound = [n for n in read if _shared_name(n) not in restored]
    if not unbound:
        return []
    keys = _checkpoint_keys(meta_graph, nodes, saved_model_dir)
    return [UnboundVariable(n.name, _shared_name(n),
                            n.attr["container"].s.decode("utf-8", "replace"),
                            keys.get(n.name)) for n in unbound]


def restored_handles(meta_graph) -> list[str]:
    """The variable handles the session loader initializes: the restore op's and the
    init op's."""
    nodes = {n.name: n for n in meta_graph.graph_def.node}
    starts = [loader.init_op_name(meta_graph) or ""]
    if meta_graph.HasField("saver_def"):
        starts.append(meta_graph.saver_def.restore_op_name)
    return sorted(n for n in reachable_nodes(meta_graph.graph_def, starts)
                  if nodes[n].op in _HANDLES)


def _checkpoint_keys(meta_graph, nodes: dict, saved_model_dir: str) -> dict[str, str]:
    """{handle node: checkpoint key}: a call's trailing inputs are its function's
    ``bound_inputs`` (object-graph node ids, the checkpoint's object graph's too)."""
    concrete = meta_graph.object_graph_def.concrete_functions
    node_ids: dict[str, int] = {}
    for node in nodes.values():
        if node.op not in _CALLS or node.attr["f"].func.name not in concrete:
            continue
        bound = list(concrete[node.attr["f"].func.name].bound_inputs)
        data = [i for i in node.input if not i.startswith("^")]
        if not bound or len(bound) > len(data):
            continue
        for ref, node_id in zip(data[len(data) - len(bound):], bound):
            node_ids.setdefault(node_name(ref), node_id)
    if not node_ids:
        return {}
    reader, graph = _checkpoint(saved_model_dir)
    if graph is None:
        return {}
    keys = {}
    for handle, node_id in node_ids.items():
        if node_id >= len(graph.nodes):
            continue
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == _VALUE and reader.has_tensor(attribute.checkpoint_key):
                keys[handle] = attribute.checkpoint_key
    return keys


def _checkpoint(saved_model_dir: str):
    """(reader, TrackableObjectGraph) of the model's checkpoint, or (None, None)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = os.path.join(saved_model_dir, "variables", "variables")
    if not os.path.isfile(prefix + ".index"):
        return None, None
    try:
        reader = tf.train.load_checkpoint(prefix)
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    except Exception:  # noqa: BLE001 - no readable object graph: no key is known
        return None, None
    return reader, graph


def describe(unbound: list[UnboundVariable], limit: int = 3) -> str:
    """``sequential/dense/kernel, sequential/dense/bias``: the first few, and how many."""
    names = [v.node for v in unbound[:limit]]
    more = f" and {len(unbound) - limit} more" if len(unbound) > limit else ""
    return ", ".join(names) + more


def problem(unbound: list[UnboundVariable]) -> str:
    """One clause: what the session loader (TF Serving) will do with this model."""
    return (f"its signatures read {len(unbound)} variable(s) ({describe(unbound)}) that its "
            "restore op and init op never initialize (Keras 3 tf.saved_model.save export): "
            "TF Serving loads it but fails every request with \"Could not find variable "
            f"{unbound[0].node}\"")


def check_repairable(unbound: list[UnboundVariable], saved_model_dir: str) -> None:
    """Raises (problem and fix) when a value is missing from the checkpoint."""
    lost = [v for v in unbound if v.checkpoint_key is None]
    if lost:
        raise ServingOptError(
            f"{saved_model_dir} cannot be repaired: {problem(unbound)}, and the values of "
            f"{describe(lost)} are not in its checkpoint",
            "re-export it with model.export() (Keras 3) or a tf.Module that tracks the "
            "variables its functions use")


def restore(session, unbound: list[UnboundVariable], saved_model_dir: str) -> None:
    """Assigns each unbound handle its value from the checkpoint, in ``session``'s graph
    (new nodes nothing else reaches), so the session answers like ``tf.saved_model.load``.
    """
    import tensorflow as tf

    check_repairable(unbound, saved_model_dir)
    reader, _ = _checkpoint(saved_model_dir)
    assigns, feeds = [], {}
    with session.graph.as_default():
        for i, var in enumerate(unbound):
            value = reader.get_tensor(var.checkpoint_key)
            ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape,
                                          name=f"serving_opt_rebind/value_{i}")
            handle = tf.raw_ops.VarHandleOp(
                dtype=ph.dtype, shape=value.shape, shared_name=var.shared_name,
                container=var.container, name=f"serving_opt_rebind/handle_{i}")
            assigns.append(tf.raw_ops.AssignVariableOp(resource=handle, value=ph))
            feeds[ph] = value
    session.run(assigns, feeds)
