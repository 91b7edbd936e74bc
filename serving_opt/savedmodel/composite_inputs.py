"""Synthesized inputs for signature inputs that are parts of one ragged tensor.

``tf.saved_model.save`` flattens a ``tf.RaggedTensorSpec`` argument into several
signature inputs (``ids``: the flat values, ``ids_1``...: the row splits of each ragged
dimension), which TF Serving's clients send side by side. Drawn one by one, the row
splits are not row splits (the original fails and optimize would refuse a benign
model), so the parts of one ragged argument are synthesized together.

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

_RAGGED = "RAGGED_TENSOR_SPEC"


@dataclass(frozen=True)
class RaggedPart:
    """One signature input that is component ``index`` of ragged argument ``group``:
    0 the flat values, k >= 1 the row splits of ragged dimension k."""

    group: str
    index: int
    ragged_rank: int
    dtype: int  # the signature's DataType enum


def _components(value) -> Iterator[tuple[str, int, int]]:
    """(spec class, index in the spec, ragged rank) for each flattened tensor of a
    StructuredValue, in ``tf.nest.flatten(..., expand_composites=True)``'s order."""
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
        yield "TENSOR", 0, 0
    elif kind == "type_spec_value":
        spec = value.type_spec_value
        cls = type(spec).TypeSpecClass.Name(spec.type_spec_class)
        state = spec.type_state.tuple_value.values
        # RaggedTensorSpec's state: (shape, dtype, ragged_rank, row_splits_dtype, ...).
        rank = state[2].int64_value if cls == _RAGGED and len(state) > 2 else 0
        for index in range(spec.num_flat_components):
            yield cls, index, rank


def _call_into(body, name: str) -> tuple[str, int] | None:
    """(called function, argument position) of the call node ``name`` feeds, if one."""
    for node in body:
        if node.op in CALL_OPS:
            data = [i for i in node.input if not i.startswith("^")]
            for position, tensor in enumerate(data):
                if node_name(tensor) == name:
                    return node.attr["f"].func.name, position
    return None


def ragged_parts(meta_graph, key: str) -> dict[str, RaggedPart]:
    """The inputs of signature ``key`` that are parts of a ragged argument, by alias."""
    signatures = meta_graph.object_graph_def.concrete_functions
    if not signatures:
        return {}
    functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    parts: dict[str, RaggedPart] = {}
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
        if position >= len(flat) or flat[position][0] != _RAGGED:
            continue
        _, index, rank = flat[position]
        parts[alias] = RaggedPart(f"{traced}:{position - index}", index, int(rank),
                                  info.dtype)
    # A ragged argument with a part that is not a signature input cannot be completed.
    groups = {p.group: p.ragged_rank for p in parts.values()}
    return {alias: p for alias, p in parts.items()
            if sum(q.group == p.group for q in parts.values()) == groups[p.group] + 1}


def complete(feed: dict, parts: dict[str, RaggedPart], synthesizer) -> dict:
    """``feed`` with each ragged argument's parts replaced by a valid ragged tensor: as
    many rows as the synthesized outer row splits had entries, 0 to 3 values each, the
    flat values drawn by ``synthesizer`` (an InputSynthesizer) like any input."""
    out = dict(feed)
    for group in sorted({p.group for p in parts.values()}):
        members = sorted((p.index, alias) for alias, p in parts.items() if p.group == group)
        values_alias = members[0][1]
        values = np.asarray(feed[values_alias])
        if values.ndim == 0 or any(np.asarray(feed[a]).ndim != 1 for _, a in members[1:]):
            continue  # scalars mode: nothing ragged to build
        rows = len(feed[members[1][1]])
        for _, alias in members[1:]:
            lengths = synthesizer.rng.integers(0, 4, size=rows)
            splits = np.concatenate([[0], np.cumsum(lengths)])
            out[alias] = splits.astype(np.asarray(feed[alias]).dtype)
            rows = int(splits[-1])
        out[values_alias] = synthesizer.tensor(parts[values_alias].dtype,
                                               (-1, *values.shape[1:]), rows)
    return out
