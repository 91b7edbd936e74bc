"""Synthesized inputs for signature inputs that are parts of one ragged or sparse tensor.

``tf.saved_model.save`` flattens a ``tf.RaggedTensorSpec`` argument into several
signature inputs (``ids``: the flat values, ``ids_1``...: the row splits of each ragged
dimension) and a ``tf.SparseTensorSpec`` one into three (indices, values, dense shape),
which TF Serving's clients send side by side. Drawn one by one, the parts do not make a
tensor (the original fails and optimize would refuse a benign model), so the parts of
one argument are synthesized together.

Which inputs belong together is read from the protos alone, never by running the
model: the signature's placeholder feeds the signature wrapper's call, whose argument
feeds the traced function's call, whose ``canonicalized_input_signature`` (the object
graph) says which flattened component of which spec that position is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from serving_opt.savedmodel.graph import CALL_OPS, node_name

RAGGED = "RAGGED_TENSOR_SPEC"
SPARSE = "SPARSE_TENSOR_SPEC"
# Parts per argument: ragged, 1 + its ragged rank; sparse, indices + values + shape.
_SPARSE_PARTS = 3


@dataclass(frozen=True)
class CompositePart:
    """One signature input that is component ``index`` of argument ``group``, a ragged
    tensor (0 the flat values, k >= 1 the row splits of ragged dimension k) or a sparse
    one (0 the indices, 1 the values, 2 the dense shape)."""

    kind: str  # RAGGED | SPARSE
    group: str
    index: int
    parts: int  # how many inputs the argument is
    dtype: int  # the signature's DataType enum
    shape: tuple[int, ...] | None  # the spec's (sparse: its dense shape; -1 unknown)


def _shape(value) -> tuple[int, ...] | None:
    shape = value.tensor_shape_value
    return None if shape.unknown_rank else tuple(d.size for d in shape.dim)


def _components(value) -> Iterator[tuple[str, int, int, tuple[int, ...] | None]]:
    """(spec class, index in the spec, the spec's component count, shape) for each
    flattened tensor of a StructuredValue, in ``tf.nest.flatten(...,
    expand_composites=True)``'s order."""
    kind = value.WhichOneof("kind")
    if kind in ("tuple_value", "list_value"):
        for item in getattr(value, kind).values:
            yield from _components(item)
    elif kind == "dict_value":
        for key in sorted(value.dict_value.fields):
            yield from _components(value.dict_value.fields[key])
    elif kind == "named_tuple_value":
        for pair in value.named_tuple_value.values:
            yield from _components(pair.value)
    elif kind in ("tensor_spec_value", "bounded_tensor_spec_value"):
        yield "TENSOR", 0, 1, None
    elif kind == "type_spec_value":
        spec = value.type_spec_value
        cls = type(spec).TypeSpecClass.Name(spec.type_spec_class)
        state = spec.type_state.tuple_value.values
        # Both specs' states start with the shape; ragged's then dtype, ragged_rank.
        shape = _shape(state[0]) if state else None
        for index in range(spec.num_flat_components):
            yield cls, index, spec.num_flat_components, shape


def _call_into(body, name: str) -> tuple[str, int] | None:
    """(called function, argument position) of the call node ``name`` feeds, if one."""
    for node in body:
        if node.op in CALL_OPS:
            data = [i for i in node.input if not i.startswith("^")]
            for position, tensor in enumerate(data):
                if node_name(tensor) == name:
                    return node.attr["f"].func.name, position
    return None


def composite_parts(meta_graph, key: str) -> dict[str, CompositePart]:
    """The inputs of signature ``key`` that are parts of a ragged or sparse argument,
    by alias; only arguments all of whose parts are signature inputs."""
    signatures = meta_graph.object_graph_def.concrete_functions
    if not signatures:
        return {}
    functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    parts: dict[str, CompositePart] = {}
    for alias, info in meta_graph.signature_def[key].inputs.items():
        if info.WhichOneof("encoding") != "name":
            continue
        wrapper_call = _call_into(meta_graph.graph_def.node, node_name(info.name))
        wrapper = functions.get(wrapper_call[0]) if wrapper_call else None
        if wrapper is None or wrapper_call[1] >= len(wrapper.signature.input_arg):
            continue
        arg = wrapper.signature.input_arg[wrapper_call[1]].name
        traced_call = _call_into(wrapper.node_def, arg)
        if traced_call is None or traced_call[0] not in signatures:
            continue
        traced, position = traced_call
        flat = list(_components(signatures[traced].canonicalized_input_signature))
        if position >= len(flat) or flat[position][0] not in (RAGGED, SPARSE):
            continue
        kind, index, count, shape = flat[position]
        if kind == SPARSE and count != _SPARSE_PARTS:
            continue
        parts[alias] = CompositePart(kind, f"{traced}:{position - index}", index, count,
                                     info.dtype, shape)
    return {alias: p for alias, p in parts.items()
            if sorted(q.index for q in parts.values() if q.group == p.group)
            == list(range(p.parts))}


def _ragged(feed: dict, members: list[str], parts: dict, synthesizer) -> dict:
    values = np.asarray(feed[members[0]])
    if values.ndim == 0 or any(np.asarray(feed[a]).ndim != 1 for a in members[1:]):
        return {}  # scalars mode: nothing ragged to build
    out = {}
    rows = len(feed[members[1]])
    for alias in members[1:]:  # outermost first
        splits = np.concatenate([[0], np.cumsum(synthesizer.rng.integers(0, 4, size=rows))])
        out[alias] = splits.astype(np.asarray(feed[alias]).dtype)
        rows = int(splits[-1])
    out[members[0]] = synthesizer.tensor(parts[members[0]].dtype, (-1, *values.shape[1:]),
                                         rows)
    return out


def _sparse(feed: dict, members: list[str], parts: dict, synthesizer) -> dict:
    indices, values, dense_shape = members
    declared = np.asarray(feed[dense_shape])
    if declared.ndim != 1 or np.asarray(feed[indices]).ndim != 2:
        return {}
    rank = len(declared)
    spec = parts[indices].shape
    rows = len(feed[indices])
    dims = [rows] + [spec[i] if spec and len(spec) == rank and spec[i] > 0 else 3
                     for i in range(1, rank)]
    # Row-major order, as TF's sparse ops expect.
    cells = np.argwhere(synthesizer.rng.random(dims) < 0.4)
    return {indices: cells.astype(np.asarray(feed[indices]).dtype),
            values: synthesizer.tensor(parts[values].dtype, (-1,), len(cells)),
            dense_shape: np.array(dims, dtype=declared.dtype)}


def complete(feed: dict, parts: dict[str, CompositePart], synthesizer) -> dict:
    """``feed`` with each argument's parts replaced by one valid tensor: a ragged one of
    as many rows as the synthesized outer row splits had entries, 0 to 3 values each; a
    sparse one of the batch's rows, 40% of its cells set. Values are drawn by
    ``synthesizer`` (an InputSynthesizer) like any input of their dtype."""
    out = dict(feed)
    for group in sorted({p.group for p in parts.values()}):
        members = [a for _, a in sorted((p.index, a) for a, p in parts.items()
                                        if p.group == group)]
        build = _ragged if parts[members[0]].kind == RAGGED else _sparse
        out.update(build(feed, members, parts, synthesizer))
    return out
