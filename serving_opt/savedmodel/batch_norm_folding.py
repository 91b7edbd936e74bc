"""Batch-norm folding the Graph Transform Tool gets wrong or misses, done before it runs.

* :func:`fold_batch_norm_scales` folds per-channel scales into the weights before them
  (where the tool's ``fold_batch_norms`` would miss or break them);
* :func:`downgrade_foldable_batch_norms` spells inference FusedBatchNormV2/V3 as V1,
  the only version the tool's ``fold_old_batch_norms`` matches.

Both change how a frozen GraphDef is spelled, never what it computes.
:mod:`serving_opt.stages.transforms` calls them where it prepares a graph for the tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Optional

from serving_opt.savedmodel.conv_channels import (
    CONV_OPS,
    add_float_const,
    channel_vector,
    remove_unused,
    retype,
    weight_columns,
)
from serving_opt.savedmodel.graph import node_name

if TYPE_CHECKING:
    import numpy as np
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef

_BIAS_OPS = frozenset({"Add", "AddV2", "BiasAdd"})
_FUSED_BN_V2_V3 = frozenset({"FusedBatchNormV2", "FusedBatchNormV3"})


@dataclass(frozen=True)
class FoldReport:
    """What :func:`fold_batch_norm_scales` changed, for the report and the tests."""

    folded: int = 0  # per-channel Muls folded into the weights before them
    hoisted: int = 0  # of those, Muls first moved in front of a bias add
    shared: int = 0  # folds that reused weights another copy of the model folded
    disabled: int = 0  # Muls the tool would fold wrongly or fail on, left alone


# ----------------------------------------------------------- batch-norm scale folding


class _FoldGraph:
    """A GraphDef being folded in place, with the name, consumer and constant lookups
    the fold needs, kept current as nodes are added."""

    def __init__(self, graph_def: GraphDef, protected: set[str]) -> None:
        self.graph_def = graph_def
        self.protected = protected
        self.nodes = {n.name: n for n in graph_def.node}
        self.consumers: dict[str, list[str]] = {}
        for node in graph_def.node:
            for inp in node.input:
                self.consumers.setdefault(node_name(inp), []).append(node.name)
        self.names = set(self.nodes)

    def unique(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2``, ... when taken; reserved from now on."""
        candidate, i = name, 1
        while candidate in self.names:
            candidate, i = f"{name}_{i}", i + 1
        self.names.add(candidate)
        return candidate

    def const(self, ref: str) -> Optional[np.ndarray]:
        """The value of the Const output ``ref`` reads, or None when it reads no Const."""
        from tensorflow.python.framework import tensor_util

        node = self.nodes.get(node_name(ref))
        if node is None or node.op != "Const" or ref.startswith("^") or \
                ref.partition(":")[2] not in ("", "0"):
            return None
        return tensor_util.MakeNdarray(node.attr["value"].tensor)

    def add_const(self, name: str, value: np.ndarray) -> str:
        """Adds a float32 Const under a unique ``name``; returns the name it got."""
        node = add_float_const(self.graph_def, self.unique(name), value)
        self.nodes[node.name] = node
        return node.name

    def sole_consumer(self, name: str, consumer: str) -> bool:
        """Whether ``consumer`` is all that reads ``name``, and ``name`` is not protected."""
        return self.consumers.get(name, []) == [consumer] and name not in self.protected

    def target_of(self, ref: str) -> Optional[NodeDef]:
        """The Conv2D/MatMul/DepthwiseConv2dNative ``ref`` reads as data, or None."""
        node = self.nodes.get(node_name(ref))
        if node is None or node.op not in CONV_OPS or ref.startswith("^") \
                or len(node.input) < 2:
            return None
        return node


def _drop_constant_control_edges(graph_def: GraphDef) -> None:
    # A control edge from a constant without inputs orders nothing, but the tool counts
    # it as a use of the weights and refuses the fold. Inlined TF2 functions leave such
    # edges behind (their control outputs were variable reads, now constants).
    roots = {n.name for n in graph_def.node if n.op == "Const" and not n.input}
    for node in graph_def.node:
        if any(i.startswith("^") and i[1:] in roots for i in node.input):
            kept = [i for i in node.input if not (i.startswith("^") and i[1:] in roots)]
            del node.input[:]
            node.input.extend(kept)


def _scale_muls(graph_def: GraphDef, protected: set[str]) -> list[NodeDef]:
    """The Muls that could be a per-channel scale: two data inputs, not protected."""
    return [n for n in graph_def.node if n.op == "Mul" and len(n.input) == 2
            and not any(i.startswith("^") for i in n.input) and n.name not in protected]


class _ScaledBiasAdd(NamedTuple):
    """``mul = (conv + bias) * scale``, with bias and scale per output channel."""

    add: NodeDef
    conv: NodeDef
    conv_ref: str  # the add's input that reads the conv
    scale: np.ndarray  # float32 [C]
    bias: np.ndarray  # float32 [C]


def _scaled_bias_add(g: _FoldGraph, mul: NodeDef, add_index: int) -> Optional[_ScaledBiasAdd]:
    """``mul`` as ``(conv + bias) * scale`` with its add at input ``add_index``, when the
    add and the conv feed nothing else; None otherwise."""
    add = g.nodes.get(node_name(mul.input[add_index]))
    scale = g.const(mul.input[1 - add_index])
    if add is None or add.op not in _BIAS_OPS or scale is None \
            or not g.sole_consumer(add.name, mul.name) or len(add.input) != 2:
        return None
    if add.op == "BiasAdd" and add.attr["data_format"].s not in (b"", b"NHWC"):
        return None
    c_index = 0 if g.target_of(add.input[0]) is not None else 1
    conv = g.target_of(add.input[c_index])
    bias = g.const(add.input[1 - c_index])
    if conv is None or bias is None or not g.sole_consumer(conv.name, add.name):
        return None
    shape = weight_columns(conv.op, conv, g.const(conv.input[1]))
    if shape is None:
        return None
    s_vec = channel_vector(scale, *shape)
    b_vec = channel_vector(bias, *shape)
    if s_vec is None or b_vec is None:
        return None
    return _ScaledBiasAdd(add, conv, add.input[c_index], s_vec, b_vec)


def _hoist_scale(g: _FoldGraph, mul: NodeDef, found: _ScaledBiasAdd) -> NodeDef:
    """``(conv + b) * s`` -> ``conv * s + b * s``, so the scale meets the conv.

    The Mul keeps its name (its consumers read it) and becomes the AddV2; the bias add
    goes. Returns the new Mul of the conv, ``<mul>/scaled``.
    """
    scaled = g.graph_def.node.add()
    scaled.name, scaled.op = g.unique(f"{mul.name}/scaled"), "Mul"
    scaled.attr["T"].CopyFrom(mul.attr["T"])
    scale_name = g.add_const(f"{mul.name}/scale", found.scale)
    scaled.input.extend([found.conv_ref, scale_name])
    g.nodes[scaled.name] = scaled
    shift = g.add_const(f"{mul.name}/shift", found.bias * found.scale)
    g.consumers[scale_name], g.consumers[shift] = [scaled.name], [mul.name]
    retype(mul, "AddV2", [scaled.name, shift])
    g.consumers[found.conv.name] = [scaled.name]
    g.consumers[scaled.name] = [mul.name]
    g.graph_def.node.remove(found.add)
    del g.nodes[found.add.name]
    return scaled


def _hoist_scales(g: _FoldGraph, muls: list[NodeDef]) -> list[NodeDef]:
    """Moves each scale that follows a conv's bias add in front of the add; returns the
    new conv Muls, in order."""
    hoisted = []
    for mul in muls:
        for add_index in (0, 1):
            found = _scaled_bias_add(g, mul, add_index)
            if found is not None:
                hoisted.append(_hoist_scale(g, mul, found))
                break
    return hoisted


class _ScaledConv(NamedTuple):
    """``mul = conv * scale`` (inputs in either order)."""

    mul: NodeDef
    conv: NodeDef
    conv_index: int  # the Mul's input that reads the conv
    weights_name: str
    weights: Optional[np.ndarray]  # None when the weights are no Const
    scale: Optional[np.ndarray]  # float32 [C]; None when not one scale per output channel


def _scaled_conv(g: _FoldGraph, mul: NodeDef) -> Optional[_ScaledConv]:
    """``mul`` as a scale of a Conv2D/MatMul/DepthwiseConv2dNative, or None."""
    c_index = 0 if g.target_of(mul.input[0]) is not None else 1
    conv = g.target_of(mul.input[c_index])
    if conv is None:
        return None
    scale_ref = mul.input[1 - c_index]
    weights = g.const(conv.input[1])
    scale = g.const(scale_ref)
    shape = weight_columns(conv.op, conv, weights) if scale is not None else None
    s_vec = channel_vector(scale, *shape) if shape is not None else None
    return _ScaledConv(mul, conv, c_index, node_name(conv.input[1]), weights, s_vec)


def _foldable(g: _FoldGraph, found: _ScaledConv) -> bool:
    """Whether folding ``found`` into the weights computes the same: one scale per output
    channel, the conv's output 0 read by the Mul alone, nothing involved protected."""
    conv_ref = found.mul.input[found.conv_index]
    scale_ref = found.mul.input[1 - found.conv_index]
    return (found.scale is not None and g.sole_consumer(found.conv.name, found.mul.name)
            and found.weights_name not in g.protected
            and node_name(scale_ref) not in g.protected
            and conv_ref.partition(":")[2] in ("", "0"))


def _disarm(found: _ScaledConv) -> bool:
    """Swaps the Mul's inputs when the conv comes first, the tool's pattern, so its
    fold_batch_norms leaves the Mul alone. Returns whether it swapped."""
    if found.conv_index != 0:
        return False
    mul = found.mul
    mul.input[0], mul.input[1] = mul.input[1], mul.input[0]
    return True


def _fold_into_weights(g: _FoldGraph, found: _ScaledConv,
                       folded_weights: dict[tuple[str, bytes], str]) -> bool:
    """Folds the scale into the conv's weights and gives the conv the Mul's name (as the
    tool does), so the Mul's consumers read the conv. Returns whether the folded weights
    were shared with an earlier fold.

    The fold itself is the tool's (weights * scale per output channel), but done once
    per (weights, scale) in ``folded_weights``: the copies of an inlined model share the
    result instead of each needing a private copy of the weights to fold into.
    """
    mul, conv, weights = found.mul, found.conv, found.weights
    key = (found.weights_name, found.scale.tobytes())
    shared = key in folded_weights
    if not shared:
        columns = found.scale.reshape(weights.shape[2:]) \
            if conv.op == "DepthwiseConv2dNative" else found.scale
        folded_weights[key] = g.add_const(f"{mul.name}/folded_weights",
                                          (weights * columns).astype(weights.dtype))
    conv.input[1] = folded_weights[key]
    g.graph_def.node.remove(mul)
    del g.nodes[mul.name]
    conv.name = mul.name
    g.nodes[conv.name] = conv
    return shared


def fold_batch_norm_scales(graph_def: GraphDef, protected: set[str]) -> FoldReport:
    """Folds per-channel scales into the weights before them; disarms what the tool
    would fold wrongly. Runs where the spec says ``fold_batch_norms``.

    The tool folds ``Mul(Conv2D|MatMul|DepthwiseConv2dNative(x, W), s)`` into ``W``
    when ``s`` is a float32 [C] constant and nothing else uses ``W`` or ``s``. Keras 3
    lowers batch norm to exactly that Mul (``tf.nn.batch_normalization``), but the
    tool misses most of it and breaks on some of the rest:

    * inlined TF2 signatures share one weight constant between the copies of the
      model (``serve`` and ``serving_default``), so the tool skips every fold; here
      each (weights, scale) pair is folded once and the copies share the result;
    * a conv with a bias (ResNet's) puts an Add between the conv and the Mul:
      ``(conv + b) * s`` becomes ``conv * s + b * s`` first;
    * a scalar or [1, 1, 1, C] scale is the same as its [C] broadcast;
    * a Mul the tool would fold wrongly (``transpose_b``, NCHW, non-float32: it reads
      the weights as float32 and aborts the process on doubles) or fail on (a scale
      of another shape) gets its inputs swapped, which the tool's pattern does not
      match: the Mul stays as it was.

    Like the tool, the conv takes the Mul's name. Changes ``graph_def`` in place.
    """
    _drop_constant_control_edges(graph_def)
    g = _FoldGraph(graph_def, protected)
    muls = _scale_muls(graph_def, protected)
    hoisted = _hoist_scales(g, muls)
    folded = shared = disabled = 0
    folded_weights: dict[tuple[str, bytes], str] = {}
    replaced: set[str] = set()
    for mul in muls + hoisted:
        if mul.op != "Mul":  # hoisted: now the AddV2 after its conv's new Mul
            continue
        found = _scaled_conv(g, mul)
        if found is None:
            continue
        if not _foldable(g, found):
            disabled += _disarm(found)
            continue
        shared += _fold_into_weights(g, found, folded_weights)
        replaced.add(found.weights_name)
        folded += 1
    remove_unused(graph_def, replaced, protected)
    return FoldReport(folded, len(hoisted), shared, disabled)


# ------------------------------------------------------------- batch-norm V3 -> V1


def _used_outputs(graph_def: GraphDef) -> dict[str, set[int]]:
    """Node name -> the indices of its outputs some node reads as data."""
    used: dict[str, set[int]] = {}
    for node in graph_def.node:
        for inp in node.input:
            if inp.startswith("^"):
                continue
            name, _, index = inp.partition(":")
            used.setdefault(name, set()).add(int(index or 0))
    return used


def downgrade_foldable_batch_norms(graph_def: GraphDef, protected: set[str]) -> int:
    """Rewrites inference FusedBatchNormV2/V3 after a Conv2D as FusedBatchNorm (V1).

    The tool's ``fold_old_batch_norms`` only matches the V1 op, while Keras and
    ``tf.compat.v1.nn.fused_batch_norm`` have emitted V3 since TF 1.15; for inference
    (``is_training=false``, float, only the normalized output used) the three ops
    compute the same thing, so the rename lets the fold happen. Changes ``graph_def``
    in place and returns the count.
    """
    from tensorflow.core.framework import types_pb2

    nodes = {n.name: n for n in graph_def.node}
    used_outputs = _used_outputs(graph_def)
    count = 0
    for node in graph_def.node:
        if node.op not in _FUSED_BN_V2_V3 or node.name in protected:
            continue
        producer = nodes.get(node.input[0].split(":")[0])
        if producer is None or producer.op != "Conv2D":
            continue
        if node.attr["is_training"].b or used_outputs.get(node.name, {0}) - {0}:
            continue
        if node.attr["T"].type != types_pb2.DT_FLOAT:
            continue
        node.op = "FusedBatchNorm"
        node.attr.pop("U", None)
        node.attr.pop("exponential_avg_factor", None)
        count += 1
    return count
