"""The tf.Example parsing spec a signature's graph declares, read from the graph alone.

ParseExample / ParseExampleV2 / ParseSingleExample give the keys, dtypes, dense shapes
and which features are required; the parsing op is found from the signature's input,
through pass-through ops and into the functions of a TF2 graph. Synthesized tf.Examples
(:mod:`serving_opt.savedmodel.inputs`) follow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from serving_opt.savedmodel.graph import CALL_OPS, node_name

_PARSE_OPS = frozenset({"ParseExample", "ParseExampleV2", "ParseSingleExample"})
_PASS_THROUGH_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "IdentityN"})


@dataclass(frozen=True)
class FeatureSpec:
    """One feature of a tf.Example parsing spec."""

    key: str
    dtype: str  # "string" | "int64" | "float"
    kind: str  # "dense" | "sparse" | "ragged"
    shape: tuple[int, ...] = ()
    required: bool = False


@dataclass(frozen=True)
class ExampleSpec:
    """The features a model's parsing op reads from each serialized tf.Example."""

    features: tuple[FeatureSpec, ...] = field(default_factory=tuple)


def _const_value(nodes: dict, name: str):
    from tensorflow.python.framework import tensor_util

    node = nodes.get(node_name(name))
    # tf.io.parse_example inside a tf.function reshapes its defaults; same values.
    while node is not None and node.op in ("Identity", "Reshape"):
        node = nodes.get(node_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def _dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    dtype = dtypes.as_dtype(enum)
    return {"string": "string", "int64": "int64", "float32": "float"}.get(dtype.name, dtype.name)


def _shape_tuple(shape_proto) -> tuple[int, ...]:
    if shape_proto.unknown_rank:
        return (-1,)
    return tuple(d.size for d in shape_proto.dim)


def _as_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _spec_from_parse_node(node, nodes: dict) -> ExampleSpec | None:
    attr = node.attr
    features: list[FeatureSpec] = []
    if node.op == "ParseExampleV2":
        # inputs: serialized, names, sparse_keys, dense_keys, ragged_keys, dense_defaults...
        sparse_keys = _const_value(nodes, node.input[2])
        dense_keys = _const_value(nodes, node.input[3])
        ragged_keys = _const_value(nodes, node.input[4])
        if sparse_keys is None or dense_keys is None or ragged_keys is None:
            return None
        dense_defaults = [_const_value(nodes, i) for i in node.input[5:5 + len(dense_keys)]]
        sparse_keys, dense_keys = list(sparse_keys.ravel()), list(dense_keys.ravel())
        ragged_keys = list(ragged_keys.ravel())
        ragged_types = list(attr["ragged_value_types"].list.type)
    elif node.op == "ParseExample":
        n_sparse, n_dense = attr["Nsparse"].i, attr["Ndense"].i
        sparse_keys = [_const_value(nodes, i) for i in node.input[2:2 + n_sparse]]
        dense_inputs = node.input[2 + n_sparse:2 + n_sparse + n_dense]
        dense_keys = [_const_value(nodes, i) for i in dense_inputs]
        if any(k is None for k in sparse_keys + dense_keys):
            return None
        sparse_keys = [k.item() for k in sparse_keys]
        dense_keys = [k.item() for k in dense_keys]
        dense_defaults = [
            _const_value(nodes, i) for i in node.input[2 + n_sparse + n_dense:]
        ]
        ragged_keys, ragged_types = [], []
    else:  # ParseSingleExample keeps its keys in attributes
        sparse_keys = list(attr["sparse_keys"].list.s)
        dense_keys = list(attr["dense_keys"].list.s)
        dense_defaults = [_const_value(nodes, i) for i in node.input[1:]]
        ragged_keys, ragged_types = [], []
    sparse_types = list(attr["sparse_types"].list.type)
    dense_types = list(attr["Tdense"].list.type)
    dense_shapes = [_shape_tuple(s) for s in attr["dense_shapes"].list.shape]
    for key, dtype in zip(sparse_keys, sparse_types):
        features.append(FeatureSpec(_as_str(key), _dtype_name(dtype), "sparse"))
    for key, dtype in zip(ragged_keys, ragged_types):
        features.append(FeatureSpec(_as_str(key), _dtype_name(dtype), "ragged"))
    for i, (key, dtype) in enumerate(zip(dense_keys, dense_types)):
        default = dense_defaults[i] if i < len(dense_defaults) else None
        required = default is None or np.size(default) == 0
        shape = dense_shapes[i] if i < len(dense_shapes) else ()
        features.append(FeatureSpec(_as_str(key), _dtype_name(dtype), "dense", shape, required))
    return ExampleSpec(tuple(features))


def find_example_spec(graph_def, input_tensor_name: str) -> ExampleSpec | None:
    """The tf.Example parsing spec of the parse op fed by ``input_tensor_name``, if any.

    Follows the tensor through pass-through ops and into the functions it is passed
    to (TF2 models parse inside the serving function), so each signature gets the
    spec of its own parse op.
    """
    functions = {f.signature.name: f for f in graph_def.library.function}
    spec = _trace_to_parse(graph_def.node, node_name(input_tensor_name), functions, set())
    if spec is None and functions and _feeds_a_call(graph_def.node,
                                                    node_name(input_tensor_name)):
        # A call the trace could not follow (no "f" attribute, say): any parse op.
        spec = _any_spec_in_functions(graph_def)
    return spec


def _feeds_a_call(node_defs, name: str) -> bool:
    return any(n.op in CALL_OPS and any(node_name(i) == name for i in n.input)
               for n in node_defs)


def _trace_to_parse(node_defs, start: str, functions: dict,
                    visited: set) -> ExampleSpec | None:
    """Follows ``start`` through pass-through ops and into called functions (TF2 models
    parse inside the serving function, by argument position) to the parse op it feeds."""
    nodes = {n.name: n for n in node_defs}
    consumers: dict[str, list] = {}
    for node in node_defs:
        for inp in node.input:
            consumers.setdefault(node_name(inp), []).append(node)
    frontier, seen = [start], set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for consumer in consumers.get(name, []):
            if consumer.op in _PARSE_OPS and node_name(consumer.input[0]) == name:
                spec = _spec_from_parse_node(consumer, nodes)
                if spec is not None:
                    return spec
            elif consumer.op in _PASS_THROUGH_OPS:
                frontier.append(consumer.name)
            elif consumer.op in CALL_OPS and "f" in consumer.attr:
                function = functions.get(consumer.attr["f"].func.name)
                data = [i for i in consumer.input if not i.startswith("^")]
                for index, inp in enumerate(data):
                    if node_name(inp) != name or function is None or \
                            index >= len(function.signature.input_arg):
                        continue
                    key = (function.signature.name, index)
                    if key in visited:
                        continue
                    visited.add(key)
                    spec = _trace_to_parse(function.node_def,
                                           function.signature.input_arg[index].name,
                                           functions, visited)
                    if spec is not None:
                        return spec
    return None


def _any_spec_in_functions(graph_def) -> ExampleSpec | None:
    for function in graph_def.library.function:
        nodes = {n.name: n for n in function.node_def}
        for node in function.node_def:
            if node.op in _PARSE_OPS:
                spec = _spec_from_parse_node(node, nodes)
                if spec is not None:
                    return spec
    return None


def example_input_alias(graph_def, signature_def) -> tuple[str, ExampleSpec] | None:
    """(alias, spec) when the signature takes one batch of serialized tf.Examples."""
    from tensorflow.python.framework import dtypes

    if len(signature_def.inputs) != 1:
        return None
    alias, info = next(iter(signature_def.inputs.items()))
    if not info.name:
        return None
    string = dtypes.string.as_datatype_enum
    # TF 1.0's exporter could declare the wrong dtype (TF Serving's half_plus_three: a
    # regress input declared DT_FLOAT on a string placeholder). TF Serving's
    # Classify/Regress feed serialized tf.Examples whatever it says: the graph decides.
    placeholder = next((n for n in graph_def.node if n.name == node_name(info.name)), None)
    actual = placeholder.attr["dtype"].type if placeholder is not None and \
        placeholder.op == "Placeholder" and "dtype" in placeholder.attr else info.dtype
    if actual != string:
        return None
    spec = find_example_spec(graph_def, info.name)
    return (alias, spec) if spec is not None else None
