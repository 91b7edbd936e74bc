"""What one node does to the host: its op type, the attr an op of
``CONDITIONAL_HOST_OPS`` holds (attr placeholders resolved through the calls), and the
graph an op of ``EMBEDDED_GRAPH_OPS`` runs (see :mod:`serving_opt.savedmodel.untrusted`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from serving_opt.savedmodel.host_ops import (
    CONDITIONAL_HOST_OPS,
    EMBEDDED_GRAPH_OPS,
    RUNS_GRAPH,
    conditional_kind,
    host_op_kind,
)
from serving_opt.savedmodel.untrusted.reach import _data_inputs, _follow_identity, _Graph

# How many graphs deep an embedded graph (a GraphDef in a DatasetFromGraph constant,
# holding another) is read; deeper ones are refused.
_MAX_EMBEDDING_DEPTH = 4
# How many calls up an attr placeholder is followed to the value that binds it.
_MAX_BINDING_DEPTH = 8
# How many (call site, bound value) steps resolving every attr placeholder of a graph
# may take: memoized, a graph needs about (references x distinct values x depth);
# past this the placeholder counts as unresolved (refused), never guessed.
_MAX_BINDING_WORK = 200_000




@dataclass(frozen=True)
class _Finding:
    """What one node does to the host: ``op`` and ``kind``, ``reason`` when it needs
    saying, ``inside``/``inside_label`` when the op is in a graph the node embeds."""

    op: str
    kind: str
    reason: str = ""
    inside: str = ""
    inside_label: str = ""


def _show(value) -> str:
    """An AttrValue, briefly, for a finding."""
    if value.list.s:
        return repr([v.decode("utf-8", "replace") for v in value.list.s][:3])
    text = value.s.decode("utf-8", "replace")
    return repr(text if len(text) <= 80 else text[:77] + "...")


class _TooMuchWork(Exception):
    """Resolving attr placeholders took more than :data:`_MAX_BINDING_WORK` steps."""


def _bindings(graph: _Graph, fname: str, placeholder: str,
              depth: int = 0) -> list[tuple[object, str]]:
    """(the AttrValue, the call site binding it) for attr placeholder ``placeholder`` of
    function ``fname``: every distinct value some chain of references binds it to, each
    with the first such chain (in reference order); the value is None where nothing
    binds it: a reference that binds no such attr (a ``library.gradient`` entry binds
    none), a function nothing references (a loader instantiating it by name binds
    nothing), a binding to a placeholder of the caller that no caller of the caller
    binds (followed :data:`_MAX_BINDING_DEPTH` calls up).

    Distinct values, not every chain: k call sites over d levels are k**d chains but
    at most as many values as the graph writes, and the first chain of each value is
    the first chain a judge of values can stop at. Memoized per (function,
    placeholder, depth) on ``graph``; raises :class:`_TooMuchWork` past
    :data:`_MAX_BINDING_WORK` steps for the whole graph.
    """
    key = (fname, placeholder, depth)
    if key in graph.binding_memo:
        return graph.binding_memo[key]
    out: dict[bytes | None, tuple[object, str]] = {}

    def add(value, site: str) -> None:
        graph.binding_work += 1
        if graph.binding_work > _MAX_BINDING_WORK:
            raise _TooMuchWork
        out.setdefault(None if value is None else value.SerializeToString(deterministic=True),
                       (value, site))

    refs = graph.refs.get(fname, [])
    if not refs:
        add(None, f"no node references function {fname}, so nothing binds it")
    for ref in refs:
        site = f"{ref.how} in function {ref.function}" if ref.function else ref.how
        if ref.binds is None or placeholder not in ref.binds:
            add(None, f"{site} does not bind it")
            continue
        value = ref.binds[placeholder]
        if not value.placeholder:
            add(value, site)
        elif ref.function is None:
            add(None, f"{site} binds it to placeholder {value.placeholder!r}, "
                      "which nothing binds at the top level")
        elif depth + 1 >= _MAX_BINDING_DEPTH:
            add(None, f"{site} binds it to placeholder {value.placeholder!r}, "
                      f"more than {_MAX_BINDING_DEPTH} calls up")
        else:
            for v, w in _bindings(graph, ref.function, value.placeholder, depth + 1):
                add(v, f"{site} via placeholder {value.placeholder!r}, bound by {w}"
                    if v is not None else
                    f"{site} binds it to placeholder {value.placeholder!r}, and {w}")
    graph.binding_memo[key] = list(out.values())
    return graph.binding_memo[key]


def _conditional(graph: _Graph, function: str | None, node) -> tuple[str | None, str]:
    """(kind, reason) of an op of host_ops.CONDITIONAL_HOST_OPS: its attr judged as
    written, or, when it is an attr placeholder, as every call site binds it."""
    attr, kind = CONDITIONAL_HOST_OPS[node.op]
    if attr not in node.attr:
        return None, ""
    value = node.attr[attr]
    if not value.placeholder:
        return conditional_kind(node.op, value), ""
    what = f"its {attr} is attr placeholder {value.placeholder!r}"
    if function is None:
        return kind, f"{what}, which nothing binds at the top level"
    try:
        bindings = _bindings(graph, function, value.placeholder)
    except _TooMuchWork:
        return kind, (f"{what}, and resolving what the calls bind it to takes more than "
                      f"{_MAX_BINDING_WORK} steps (the check's limit): refused unresolved")
    for bound, site in bindings:
        if bound is None:
            return kind, (f"{what}, and {site}: an unresolved {attr} may name any file "
                          "or stream")
        bound_kind = conditional_kind(node.op, bound)
        if bound_kind is not None:
            return bound_kind, f"{what}, bound to {_show(bound)} by {site}"
    return None, ""


def _const_bytes(node) -> bytes | None:
    """The one string of a scalar (or one-element) string Const, else None."""
    from tensorflow.core.framework import types_pb2

    if node is None or node.op != "Const" or _data_inputs(node) or "value" not in node.attr:
        return None
    tensor = node.attr["value"].tensor
    if tensor.dtype != types_pb2.DT_STRING or len(tensor.string_val) != 1:
        return None
    return tensor.string_val[0]


def _embedded(graph: _Graph, function: str | None, node, depth: int) -> list[_Finding]:
    """The findings of the graph an op of host_ops.EMBEDDED_GRAPH_OPS runs: parsed from
    the Const (through Identity) feeding its GraphDef input and checked like the
    model's graph (every node and library function, embedded graphs in turn, no
    loader exception: nothing feeds it asset or checkpoint paths); the op itself when
    the graph cannot be read."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import graph_pb2

    body = graph.nodes if function is None else {
        n.name: n for n in graph.library[function].node_def}
    data = _data_inputs(node)
    index = EMBEDDED_GRAPH_OPS[node.op]
    if index >= len(data):
        return [_Finding(node.op, RUNS_GRAPH, "it is given no graph")]
    name = _follow_identity(body, data[index])
    source = body.get(name)
    serialized = _const_bytes(source)
    if serialized is None:
        what = f"{source.op} {name!r}" if source is not None else f"{name!r}, no node"
        if source is None and function is not None:
            what = f"{name!r}, an argument of function {function}"
        return [_Finding(node.op, RUNS_GRAPH,
                         f"its serialized graph comes from {what}, not a constant string "
                         "the check can read: it runs a graph nothing checked")]
    if depth + 1 > _MAX_EMBEDDING_DEPTH:
        return [_Finding(node.op, RUNS_GRAPH,
                         f"its graph is embedded more than {_MAX_EMBEDDING_DEPTH} deep")]
    key = (hashlib.sha256(serialized).digest(), depth)
    if key not in graph.embedded_cache:
        inner_def = graph_pb2.GraphDef()
        try:
            inner_def.ParseFromString(serialized)
        except DecodeError:
            return [_Finding(node.op, RUNS_GRAPH,
                             f"its graph constant {name!r} is no GraphDef the check can parse")]
        inner = _Graph(inner_def, graph.embedded_cache)
        graph.embedded_cache[key] = [
            (inner_function, inner_node.name, finding)
            for inner_function, inner_node in inner.all_nodes()
            for finding in _node_findings(inner, inner_function, inner_node, depth + 1)]
    found = []
    for inner_function, inner_name, finding in graph.embedded_cache[key]:
        where = f"node {inner_name!r}"
        label = inner_name
        if inner_function:
            where += f" in function {inner_function}"
            label = f"{inner_function}/{label}"
        where += f" inside the graph_def of {node.op}"
        if finding.inside:
            where = f"{finding.inside} {where}"
            label = f"{label}/graph_def:{finding.inside_label}"
        found.append(_Finding(finding.op, finding.kind, finding.reason, where, label))
    return found


def _node_findings(graph: _Graph, function: str | None, node, depth: int = 0) -> list[_Finding]:
    """What ``node`` (of ``function``, None at the top level) does to the host."""
    if node.op in EMBEDDED_GRAPH_OPS:
        return _embedded(graph, function, node, depth)
    if node.op in CONDITIONAL_HOST_OPS:
        kind, reason = _conditional(graph, function, node)
        return [_Finding(node.op, kind, reason)] if kind else []
    kind = host_op_kind(node)
    return [_Finding(node.op, kind)] if kind else []


