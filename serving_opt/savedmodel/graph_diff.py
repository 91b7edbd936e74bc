"""What one transform pass did to a graph, in the user's terms.

"What does fold_batch_norms do?" is answered for the user's own graph: given the
GraphDef before and after a pass, :func:`diff_pass` counts the ops removed and added by
type and recognises what they mean: batch norms folded into the convolution before them
(fused ``FusedBatchNorm*`` ops, and old-style unfused Rsqrt/Mul/Sub/Add chains), constant
subgraphs folded, ``CheckNumerics`` removed (with the note that NaN and Inf inputs then
no longer raise), identities removed. Patterns are counted, never matched by name: the
Graph Transform Tool gives a folded convolution the name of the op it replaced.

Pure functions on GraphDef protos; TensorFlow's op registry is consulted (lazily) only
to tell stateful ops from foldable ones.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from serving_opt.savedmodel.graph import all_node_defs, node_name

# Ops whose value is the request's: anything computed from them cannot be folded.
INPUT_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
# Stateful ops whose value is the model's own (weights): not request inputs.
_VARIABLE_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
                           "VarIsInitializedOp", "HashTableV2", "HashTable"})
FUSED_BATCH_NORM_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
                                  "BatchNormWithGlobalNormalization"})
# What a batch norm is folded into: the op before it, whose weights absorb the scale.
WEIGHTED_OPS = frozenset({"Conv2D", "DepthwiseConv2dNative", "MatMul", "Conv3D"})
_ADD_OPS = frozenset({"Add", "AddV2", "BiasAdd", "Sub"})
_PASS_THROUGH = frozenset({"Identity", "BiasAdd"})
CHECK_NUMERICS_OPS = frozenset({"CheckNumerics", "CheckNumericsV2"})


def _data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _is_stateful(op: str) -> bool:
    try:
        from tensorflow.python.framework import op_def_registry
    except ImportError:  # no TensorFlow: only the known input ops count
        return False
    op_def = op_def_registry.get(op)
    return op_def is None or op_def.is_stateful  # unknown ops: not foldable


def request_dependent(graph_def) -> set[str]:
    """Top-level nodes whose value depends on a request: fed inputs (Placeholder*), any
    other stateful op but a variable, and everything computed from them (data edges).
    The rest is constant for a given model: weights and what is computed from them.
    """
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    seeds = []
    for node in graph_def.node:
        for i in _data_inputs(node):
            consumers[node_name(i)].append(node.name)
        if node.op in INPUT_OPS or (node.op not in _VARIABLE_OPS and node.op != "Const"
                                    and _is_stateful(node.op)):
            seeds.append(node.name)
    seen: set[str] = set()
    stack = seeds
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(consumers.get(name, ()))
    return seen


def constant_nodes(graph_def) -> set[str]:
    """Top-level nodes a request does not change (complement of :func:`request_dependent`):
    what constant folding may replace by a ``Const``.
    """
    dependent = request_dependent(graph_def)
    return {n.name for n in graph_def.node if n.name not in dependent}


def op_histogram(graph_def) -> collections.Counter:
    """Op type -> count over the graph and its library functions."""
    return collections.Counter(n.op for n in all_node_defs(graph_def))


@dataclass(frozen=True)
class GraphPatterns:
    """What a graph holds that passes change, counted."""

    fused_batch_norms: dict  # op type -> count of FusedBatchNorm* (any producer)
    fused_after_weights: dict  # op type of the producer -> fused batch norms after one
    unfused_batch_norms: dict  # op type of the producer -> unfused chains after one
    unfused_with_rsqrt: int  # unfused chains whose scale still computes an Rsqrt
    scale_muls: dict  # producer op type -> Muls by a constant right after a weighted op
    check_numerics: tuple[str, ...]  # messages of the CheckNumerics ops
    # Request-independent ops other than Const, Identity and NoOp (constant subgraphs;
    # the other two compute nothing, and removing one is not folding).
    foldable: int
    foldable_ops: dict  # their op types
    nodes: int


def _producer(nodes: dict, tensor: str):
    """The op behind ``tensor``, looking through Identity (and BiasAdd for scale Muls)."""
    node = nodes.get(node_name(tensor))
    seen = 0
    while node is not None and node.op == "Identity" and seen < 8:
        inputs = _data_inputs(node)
        node = nodes.get(node_name(inputs[0])) if inputs else None
        seen += 1
    return node


def _weighted_producer(nodes: dict, tensor: str):
    node = _producer(nodes, tensor)
    if node is not None and node.op == "BiasAdd":
        inputs = _data_inputs(node)
        node = _producer(nodes, inputs[0]) if inputs else None
    return node if node is not None and node.op in WEIGHTED_OPS else None


def _has_rsqrt(nodes: dict, name: str, limit: int = 12) -> bool:
    """Whether the constant subgraph computing ``name`` contains an Rsqrt (or Sqrt)."""
    stack, seen = [node_name(name)], set()
    while stack and len(seen) < 64:
        current = stack.pop()
        if current in seen or current not in nodes:
            continue
        seen.add(current)
        node = nodes[current]
        if node.op in ("Rsqrt", "Sqrt"):
            return True
        if len(seen) < limit * 4:
            stack.extend(node_name(i) for i in _data_inputs(node))
    return False


def find_patterns(graph_def) -> GraphPatterns:
    """Counts batch norms (fused and unfused), scale Muls, CheckNumerics and constant
    subgraphs in the top-level graph.

    An unfused batch norm is ``x * scale + shift`` with ``x`` from a Conv2D,
    DepthwiseConv2dNative or MatMul (possibly through a BiasAdd) and ``scale`` and
    ``shift`` request-independent: what ``tf.nn.batch_normalization`` and
    ``tf.compat.v1.layers.batch_normalization(fused=False)`` build (Rsqrt/Mul/Sub/Add),
    whether or not its constant part has been folded yet.
    """
    nodes = {n.name: n for n in graph_def.node}
    dependent = request_dependent(graph_def)
    consumers: dict[str, list] = collections.defaultdict(list)
    for node in graph_def.node:
        for i in _data_inputs(node):
            consumers[node_name(i)].append(node)
    fused: collections.Counter = collections.Counter()
    fused_after: collections.Counter = collections.Counter()
    unfused: collections.Counter = collections.Counter()
    scale_muls: collections.Counter = collections.Counter()
    with_rsqrt = 0
    checks = []
    foldable_ops: collections.Counter = collections.Counter()
    for node in graph_def.node:
        if node.name not in dependent and node.op not in ("Const", "Identity", "NoOp"):
            foldable_ops[node.op] += 1
        if node.op in CHECK_NUMERICS_OPS:
            checks.append(node.attr["message"].s.decode("utf-8", "replace")
                          if "message" in node.attr else "")
        if node.op in FUSED_BATCH_NORM_OPS:
            fused[node.op] += 1
            inputs = _data_inputs(node)
            producer = _producer(nodes, inputs[0]) if inputs else None
            if producer is not None and producer.op in WEIGHTED_OPS:
                fused_after[producer.op] += 1
            continue
        if node.op != "Mul" or node.name not in dependent:
            continue
        inputs = _data_inputs(node)
        if len(inputs) != 2:
            continue
        data = [i for i in inputs if node_name(i) in dependent]
        const = [i for i in inputs if node_name(i) not in dependent]
        if len(data) != 1 or len(const) != 1:
            continue
        producer = _weighted_producer(nodes, data[0])
        if producer is None:
            continue
        scale_muls[producer.op] += 1
        # The shift: one consumer adding (or subtracting) a request-independent tensor.
        users = consumers.get(node.name, [])
        if len(users) == 1 and users[0].op in _ADD_OPS and any(
                node_name(i) not in dependent for i in _data_inputs(users[0])):
            unfused[producer.op] += 1
            with_rsqrt += _has_rsqrt(nodes, const[0])
    return GraphPatterns(dict(fused), dict(fused_after), dict(unfused), with_rsqrt,
                         dict(scale_muls), tuple(checks), sum(foldable_ops.values()),
                         dict(foldable_ops), len(graph_def.node))


@dataclass(frozen=True)
class PassDiff:
    """What one pass changed: ops removed and added (net, by type), what that means
    (``changes``) and what the user must know (``notes``)."""

    name: str
    removed: tuple[tuple[str, int], ...]  # op type -> net decrease, largest first
    added: tuple[tuple[str, int], ...]  # op type -> net increase
    changes: tuple[str, ...]  # "3 Rsqrt/Mul/Sub/Add batch norm chains folded into Conv2D"
    notes: tuple[str, ...]  # "NaN and Inf inputs no longer raise: ..."
    nodes_before: int
    nodes_after: int

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)

    def ops_text(self) -> str:
        """E.g. "-3 Mul, -3 Const, +2 BiasAdd"."""
        parts = [f"-{count} {op}" for op, count in self.removed]
        parts += [f"+{count} {op}" for op, count in self.added]
        return ", ".join(parts)

    def line(self) -> str:
        """One line for the report's transform section."""
        if not self.changed:
            left = f"; {'; '.join(self.notes)}" if self.notes else ""
            return f"{self.name}: no change{left}"
        what = "; ".join(self.changes) if self.changes else \
            f"{self.nodes_before} -> {self.nodes_after} nodes"
        text = f"{self.name}: {what} ({self.ops_text()})"
        if self.notes:
            text += "; " + "; ".join(self.notes)
        return text


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else (plural or singular + 's')}"


def _into(kinds: dict) -> str:
    return "/".join(sorted(kinds)) or "the op before them"


def diff_pass(name: str, before, after) -> PassDiff:
    """Describes what the pass ``name`` did, from the GraphDef before and after it."""
    hist_before, hist_after = op_histogram(before), op_histogram(after)
    removed = sorted(((op, hist_before[op] - hist_after[op]) for op in hist_before
                      if hist_before[op] > hist_after[op]), key=lambda t: (-t[1], t[0]))
    added = sorted(((op, hist_after[op] - hist_before[op]) for op in hist_after
                    if hist_after[op] > hist_before[op]), key=lambda t: (-t[1], t[0]))
    p_before, p_after = find_patterns(before), find_patterns(after)
    changes: list[str] = []
    notes: list[str] = []

    fused_gone = sum(p_before.fused_batch_norms.values()) - sum(p_after.fused_batch_norms.values())
    if fused_gone > 0:
        kinds = {op: c - p_after.fused_batch_norms.get(op, 0)
                 for op, c in p_before.fused_batch_norms.items()
                 if c > p_after.fused_batch_norms.get(op, 0)}
        label = "/".join(sorted(kinds))
        changes.append(f"{fused_gone} {label} folded into "
                       f"{_into(p_before.fused_after_weights)}")
    elif p_before.fused_batch_norms != p_after.fused_batch_norms:
        old = "/".join(sorted(set(p_before.fused_batch_norms) - set(p_after.fused_batch_norms)))
        new = "/".join(sorted(set(p_after.fused_batch_norms) - set(p_before.fused_batch_norms)))
        if old and new:
            changes.append(f"{sum(p_before.fused_batch_norms.values())} fused batch norms "
                           f"rewritten from {old} to {new}")

    chains_gone = sum(p_before.unfused_batch_norms.values()) - \
        sum(p_after.unfused_batch_norms.values())
    if chains_gone > 0:
        into = _into(p_before.unfused_batch_norms)
        what = "Rsqrt/Mul/Sub/Add batch norm chain" if p_before.unfused_with_rsqrt \
            else f"unfused batch norm (Mul/Add after {into})"
        plural = "Rsqrt/Mul/Sub/Add batch norm chains" if p_before.unfused_with_rsqrt \
            else f"unfused batch norms (Mul/Add after {into})"
        changes.append(f"{_plural(chains_gone, what, plural)} folded into {into}")
    muls_gone = sum(p_before.scale_muls.values()) - sum(p_after.scale_muls.values()) \
        - max(chains_gone, 0)
    if muls_gone > 0:
        changes.append(f"{_plural(muls_gone, 'scale Mul')} folded into "
                       f"{_into(p_before.scale_muls)} weights")
    rsqrt_folded = p_before.unfused_with_rsqrt - p_after.unfused_with_rsqrt - max(chains_gone, 0)
    if rsqrt_folded > 0 and p_after.foldable < p_before.foldable:
        changes.append(f"the constant part (Rsqrt) of {_plural(rsqrt_folded, 'batch norm')} "
                       "computed once")

    folded = p_before.foldable - p_after.foldable
    if folded > 0:
        kinds = collections.Counter(p_before.foldable_ops)
        kinds.subtract(p_after.foldable_ops)
        top = ", ".join(f"{op} {c}" for op, c in kinds.most_common(4) if c > 0)
        changes.append(f"{_plural(folded, 'constant op')} folded ({top})")

    checks_gone = len(p_before.check_numerics) - len(p_after.check_numerics)
    if checks_gone > 0:
        changes.append(f"{checks_gone} CheckNumerics removed")
        left = collections.Counter(p_after.check_numerics)
        messages = []
        for message in p_before.check_numerics:
            if left[message]:
                left[message] -= 1
            elif message:
                messages.append(message)
        about = f" ({', '.join(repr(m) for m in messages[:3])})" if messages else ""
        notes.append("NaN and Inf no longer raise an error where CheckNumerics stood"
                     f"{about}: they flow into the outputs")

    if not removed and not added:
        notes.extend(_left_alone(name, p_before))
    identities = dict(removed).get("Identity", 0)
    if identities:
        changes.append(f"{_plural(identities, 'Identity', 'Identities')} removed")
    return PassDiff(name, tuple(removed), tuple(added), tuple(changes), tuple(notes),
                    len(before.node), len(after.node))


def _left_alone(name: str, patterns: GraphPatterns) -> list[str]:
    """Why a batch-norm fold changed nothing although the graph has batch norms."""
    base = name.split("(")[0]
    notes = []
    if base == "fold_batch_norms" and patterns.unfused_batch_norms:
        count = sum(patterns.unfused_batch_norms.values())
        why = " (their scale is still computed, not a constant: fold_constants first)" \
            if patterns.unfused_with_rsqrt else ""
        notes.append(f"{_plural(count, 'unfused batch norm')} after "
                     f"{_into(patterns.unfused_batch_norms)} left{why}")
    if base == "fold_old_batch_norms" and patterns.fused_after_weights:
        count = sum(patterns.fused_after_weights.values())
        kinds = "/".join(sorted(patterns.fused_batch_norms))
        notes.append(f"{count} {kinds} after {_into(patterns.fused_after_weights)} left "
                     "(the tool folds FusedBatchNorm V1 with constant inputs only)")
    return notes


def diff_passes(steps: Iterable[tuple[str, object]], start) -> list[PassDiff]:
    """One :class:`PassDiff` per pass: ``start`` is the GraphDef before the first,
    ``steps`` (name, GraphDef after it) in order.
    """
    out = []
    before = start
    for name, after in steps:
        out.append(diff_pass(name, before, after))
        before = after
    return out


def report_lines(diffs: Sequence[PassDiff]) -> list[str]:
    """The report's transform section: one line per pass."""
    return [d.line() for d in diffs]
