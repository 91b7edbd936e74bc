"""A conv's per-output-channel constants, and the in-place GraphDef edits that move them.

Batch-norm folding (``serving_opt.savedmodel.batch_norm_folding``, before the Graph Transform Tool)
and the BiasAdd rewrite (``stages.rewrites``, after Grappler) both read a Conv2D, MatMul
or DepthwiseConv2dNative as weights with output channels on their last dimension, and a
constant after it as one value per channel; both then add constants, retype ops and drop
the constants nothing reads any more. Those readings and edits are here, once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from serving_opt.savedmodel.graph import node_name

if TYPE_CHECKING:
    import numpy as np
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

# Ops whose weights (input 1, a Const) hold the output channels on their last dimension:
# what the tool's fold_batch_norms folds a following per-channel Mul into.
CONV_OPS = frozenset({"Conv2D", "MatMul", "DepthwiseConv2dNative"})


def channel_vector(value: Optional[np.ndarray], channels: int,
                    rank: int) -> Optional[np.ndarray]:
    """``value`` as a float32 [channels] vector when it scales/shifts per output channel.

    Broadcasting a scalar, a [C] or a [1, ..., 1, C] constant over an output whose last
    dimension is C is the same as broadcasting the [C] vector; anything else is not.
    """
    import numpy as np

    if value is None or value.dtype != np.float32 or value.ndim > rank:
        return None
    if any(d != 1 for d in value.shape[:-1]):
        return None
    if value.ndim and value.shape[-1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float32)


def weight_columns(op: str, node: NodeDef,
                    weights: Optional[np.ndarray]) -> Optional[tuple[int, int]]:
    """(output channels, output rank) of ``node`` with these weights, as the Graph
    Transform Tool reads them, or None when its reading (and so its fold) is wrong.
    """
    if weights is None or weights.dtype.name != "float32":
        return None
    if op == "MatMul":
        # The tool scales weight columns; with transpose_b the columns are inputs.
        if node.attr["transpose_b"].b or weights.ndim != 2:
            return None
        return weights.shape[1], 2
    if node.attr["data_format"].s not in (b"", b"NHWC") or weights.ndim != 4:
        return None  # NCHW: channels are not the last dimension
    if op == "Conv2D":
        return weights.shape[3], 4
    return weights.shape[2] * weights.shape[3], 4


def add_float_const(graph_def: GraphDef, name: str, value: np.ndarray) -> NodeDef:
    """Appends a float32 Const ``name`` holding ``value`` to ``graph_def``."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import tensor_util

    node = graph_def.node.add()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = types_pb2.DT_FLOAT
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    return node


def retype(node: NodeDef, op: str, inputs: list[str]) -> None:
    """Turns the binary op ``node`` into ``op(*inputs)`` in place, keeping its name and
    its ``T``: the other attrs belong to the old op (BiasAdd's ``data_format``, ...).
    """
    dtype = node.attr["T"].type
    node.op = op
    del node.input[:]
    node.input.extend(inputs)
    node.ClearField("attr")
    node.attr["T"].type = dtype


def remove_unused(graph_def: GraphDef, names: set[str], protected: set[str]) -> None:
    """Removes the nodes among ``names`` that no input reads any more and no one protects
    (constants a rewrite replaced), so the written model does not carry them.
    """
    used = {node_name(i) for n in graph_def.node for i in n.input}
    orphans = names - used - protected
    if orphans:
        kept = [n for n in graph_def.node if n.name not in orphans]
        del graph_def.node[:]
        graph_def.node.extend(kept)
