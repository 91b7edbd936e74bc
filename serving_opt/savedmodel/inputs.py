"""Inputs to run a signature on: read from the user's files, or synthesized from the graph.

Synthesized tf.Examples follow the parsing spec found in the graph itself
(ParseExample / ParseExampleV2 / ParseSingleExample: keys, dtypes, dense shapes,
which features are required), and string features are drawn from the model's
vocabulary assets so lookups hit real table entries, plus out-of-vocabulary words
so the OOV path is exercised too.

The user's ``--examples`` (TFRecords of tf.Example, JSON lines of requests) are read by
:mod:`serving_opt.savedmodel.examples`; here they are fed to the signatures they fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.savedmodel import composite_inputs
from serving_opt.savedmodel.examples import UserInputs
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

    Example:
        >>> [f.key for f in find_example_spec(graph_def, "input_example_tensor:0").features]
        ['city', 'word', 'age', 'clicks']
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


def vocabulary_words(asset_paths: Sequence[str], limit: int = 2000) -> list[str]:
    """Words from text assets (first column of each line), to make lookups hit.

    Example:
        >>> vocabulary_words(["build/sample/1/assets/vocab.txt"])[:2]
        ['apple', 'banana']
    """
    words: list[str] = []
    for path in asset_paths:
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    token = line.rstrip("\n").split("\t")[0].strip()
                    if token:
                        words.append(token)
                    if len(words) >= limit:
                        return words
        except (OSError, UnicodeDecodeError):
            continue  # binary assets are not vocabularies
    return words


_TABLE_FILL_OPS = frozenset({"LookupTableImportV2", "LookupTableImport", "InitializeTableV2",
                             "InitializeTable", "LookupTableInsertV2", "LookupTableInsert"})


def graph_vocabulary_words(graph_def, limit: int = 2000) -> list[str]:
    """String keys of lookup tables filled from constants in the graph.

    Keras ``StringLookup``/``TextVectorization`` and ``KeyValueTensorInitializer``
    tables keep their vocabulary in the graph, not in an asset file; drawing inputs
    from it makes lookups hit, not only the out-of-vocabulary path. In TF2 models the
    keys reach the initializer function as an argument, so arguments are followed to
    the constant their caller passes.

    Example:
        >>> graph_vocabulary_words(keras_text_model_graph_def)[:2]
        ['the', 'cat']
    """
    from tensorflow.python.framework import tensor_util

    top = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    scopes = {"": top} | {name: {n.name: n for n in f.node_def}
                          for name, f in functions.items()}
    callers: dict[str, list[tuple[str, object]]] = {}
    for scope_name, nodes in scopes.items():
        for node in nodes.values():
            attr = node.attr.get("f")
            if attr is not None and attr.HasField("func") and attr.func.name in functions:
                callers.setdefault(attr.func.name, []).append((scope_name, node))

    def resolve(scope_name: str, tensor: str, depth: int = 0):
        if depth > 8:
            return None
        nodes = scopes[scope_name]
        node = nodes.get(node_name(tensor))
        while node is not None and node.op == "Identity" and node.input:
            node = nodes.get(node_name(node.input[0]))
        if node is not None:
            return node if node.op == "Const" else None
        if scope_name:  # a function argument: follow it to what the callers pass
            args = [a.name for a in functions[scope_name].signature.input_arg]
            if node_name(tensor) in args:
                index = args.index(node_name(tensor))
                for caller_scope, caller in callers.get(scope_name, []):
                    data_inputs = [i for i in caller.input if not i.startswith("^")]
                    if index < len(data_inputs):
                        found = resolve(caller_scope, data_inputs[index], depth + 1)
                        if found is not None:
                            return found
        return None

    words: list[str] = []
    for scope_name, nodes in scopes.items():
        for node in nodes.values():
            if node.op not in _TABLE_FILL_OPS or len(node.input) < 2:
                continue
            keys = resolve(scope_name, node.input[1])
            if keys is None:
                continue
            value = tensor_util.MakeNdarray(keys.attr["value"].tensor)
            if value.dtype != object:
                continue
            for key in value.ravel():
                token = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                if token:
                    words.append(token)
                if len(words) >= limit:
                    return words
    return words


def model_vocabulary(meta_graph, saved_model_dir: str, limit: int = 2000) -> list[str]:
    """Words the model knows: vocabulary assets first, then in-graph table keys.

    Example:
        >>> model_vocabulary(meta_graph, "build/sample/1")[:2]
        ['apple', 'banana']
    """
    from serving_opt.savedmodel import loader

    assets = [a.path for a in loader.asset_files(meta_graph, saved_model_dir) if a.path]
    words = vocabulary_words(assets, limit)
    if len(words) < limit:
        words += graph_vocabulary_words(meta_graph.graph_def, limit - len(words))
    return list(dict.fromkeys(words))


class InputSynthesizer:
    """Deterministic random inputs shaped like a signature wants them.

    Example:
        >>> synth = InputSynthesizer(vocabulary=["apple"], seed=0)
        >>> len(synth.examples(spec, 4))
        4
    """

    def __init__(self, vocabulary: Sequence[str] = (), seed: int = 0) -> None:
        self.vocabulary = list(vocabulary)
        self.rng = np.random.default_rng(seed)

    def _words(self, count: int) -> list[bytes]:
        out = []
        for _ in range(count):
            if self.vocabulary and self.rng.random() < 0.8:
                out.append(self.vocabulary[self.rng.integers(len(self.vocabulary))].encode())
            else:
                out.append(f"oov-{self.rng.integers(1000)}".encode())
        return out

    def _feature(self, spec: FeatureSpec, one_value: bool = False):
        import tensorflow as tf

        if spec.kind == "dense":
            count = int(np.prod([d for d in spec.shape if d > 0])) if spec.shape else 1
            if any(d < 0 for d in spec.shape) and not one_value:
                count *= int(self.rng.integers(1, 4))
        else:
            count = 1 if one_value else int(self.rng.integers(0, 4))
        if spec.dtype == "string":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=self._words(count)))
        if spec.dtype == "int64":
            values = self.rng.integers(0, 10, size=count).tolist()
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        values = self.rng.normal(size=count).astype(np.float32).tolist()
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    def examples(self, spec: ExampleSpec, count: int, one_value: bool = False) -> list[bytes]:
        """``count`` serialized tf.Examples; ``one_value``: every feature present, with one
        value (a variable-length feature tf.Transform densifies to ``[batch, 1]`` takes no
        other), or the fixed number its dense shape has."""
        import tensorflow as tf

        out = []
        for _ in range(count):
            feature = {}
            for f in spec.features:
                if not one_value and not f.required and self.rng.random() < 0.15:
                    continue  # exercise defaults and empty sparse features
                feature[f.key] = self._feature(f, one_value)
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            out.append(example.SerializeToString())
        return out

    def tensor(self, dtype_enum: int, shape: tuple[int, ...] | None, batch: int) -> np.ndarray:
        from tensorflow.python.framework import dtypes

        dtype = dtypes.as_dtype(dtype_enum)
        if shape is None:
            dims = [batch]
        else:
            dims = [batch if (i == 0 and d < 0) else (3 if d < 0 else d)
                    for i, d in enumerate(shape)]
        size = int(np.prod(dims)) if dims else 1
        if dtype == dtypes.string:
            return np.array(self._words(size), dtype=object).reshape(dims)
        if dtype == dtypes.bool:
            return (self.rng.random(size) < 0.5).reshape(dims)
        if dtype.is_integer:
            return self.rng.integers(0, 10, size=size).astype(dtype.as_numpy_dtype).reshape(dims)
        if dtype.is_floating:
            return self.rng.normal(size=size).astype(dtype.as_numpy_dtype).reshape(dims)
        raise ServingOptError(
            f"cannot synthesize inputs of dtype {dtype.name}",
            "pass real inputs with --examples",
        )


def tensor_info_shape(info) -> tuple[int, ...] | None:
    """The shape a signature declares, None when unknown: TF 1.0's signatures wrote no
    ``tensor_shape`` at all, which reads as a scalar unless its absence is checked."""
    if not info.HasField("tensor_shape") or info.tensor_shape.unknown_rank:
        return None
    return tuple(d.size for d in info.tensor_shape.dim)


def graph_tensor_shape(graph_def, tensor_name: str) -> tuple[int, ...] | None:
    """The shape the graph gives a signature's input tensor: its Placeholder's ``shape``
    attr, else the ``_output_shapes`` recorded at export; None when neither has a rank.

    A TF 1.0 signature may declare no shape (unknown rank) for a placeholder built as
    ``[None, 1]``; TF refuses a feed of another rank. A rank-0 ``shape`` attr is taken as
    unknown (graphs before TF 1.0 wrote unknown shapes that way): the scalar fallback
    tries it.

    Example:
        >>> graph_tensor_shape(graph_def, "x:0")
        (-1, 1)
    """
    name = node_name(tensor_name)
    index = int(tensor_name.split(":")[1]) if ":" in tensor_name else 0
    node = next((n for n in graph_def.node if n.name == name), None)
    if node is None:
        return None
    candidates = []
    if node.op in ("Placeholder", "PlaceholderV2", "PlaceholderWithDefault") \
            and "shape" in node.attr:
        candidates.append(node.attr["shape"].shape)
    shapes = node.attr["_output_shapes"].list.shape if "_output_shapes" in node.attr else ()
    if index < len(shapes):
        candidates.append(shapes[index])
    for shape in candidates:
        if not shape.unknown_rank and len(shape.dim) > 0:
            return tuple(d.size for d in shape.dim)
    return None


def declared_shape(graph_def, info) -> tuple[tuple[int, ...] | None, bool]:
    """(shape, whether the graph's shape added to it): the signature's shape of an input,
    completed from the graph's (:func:`graph_tensor_shape`) where the signature leaves
    the rank or a dimension unknown.

    Example:
        >>> declared_shape(graph_def, sig.inputs["x"])    # signature: unknown rank
        ((-1, 1), True)
    """
    declared = tensor_info_shape(info)
    graph = graph_tensor_shape(graph_def, info.name) if info.name else None
    if graph is None:
        return declared, False
    if declared is None:
        return graph, True
    if len(declared) != len(graph):
        return declared, False
    merged = tuple(g if d < 0 and g >= 0 else d for d, g in zip(declared, graph))
    return merged, merged != declared


# What synthesis tries when the original model fails on the inputs synthesized as the
# signature declares them (issue 29): in this order, the first the original runs is used.
# The graph's shapes are not among them: they complete the declared shape at once (TF
# refuses a feed that contradicts its placeholder), and the source then says so.
GRAPH_SHAPES = "graph shapes"
SCALARS = "scalars"
BATCH_1 = "batch 1"
ONE_VALUE = "one value per feature"
FALLBACKS = (SCALARS, BATCH_1, ONE_VALUE)
# Fallbacks that make one row per request whatever the batch size: measured at batch 1.
SINGLE_ROW_MODES = frozenset({SCALARS, BATCH_1})
SYNTHESIZED = "synthesized"
# Single rows (batch 1, scalars) are run this many at most, instead of the batches' rows.
MAX_SINGLE_ROWS = 32


def synthesized_source(mode: str | None) -> str:
    """``synthesized`` or ``synthesized (batch 1)``: how the report names the inputs."""
    return f"{SYNTHESIZED} ({mode})" if mode else SYNTHESIZED


def mode_of(source: str | None) -> str | None:
    """The fallback a source names (``synthesized (batch 1)`` -> ``batch 1``), else None.

    Example:
        >>> mode_of("synthesized (scalars)"), mode_of("synthesized"), mode_of("json:x")
        ('scalars', None, None)
    """
    prefix = SYNTHESIZED + " ("
    if source and source.startswith(prefix) and source.endswith(")"):
        mode = source[len(prefix):-1]
        return mode if mode in FALLBACKS else None
    return None


def is_synthesized(source: str) -> bool:
    return source == SYNTHESIZED or source.startswith(SYNTHESIZED + " (")


def fallback_modes(graph_def, signature_def, batch_size: int,
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[str, ...]:
    """The fallbacks (of :data:`FALLBACKS`, in order) that could make a difference for a
    signature whose synthesized inputs the original refuses: scalars when an input's rank
    is unknown (or the one serialized-example input is declared a scalar), batch 1 when
    the batch is larger, one value per feature when the parse spec has a feature that
    may have more or fewer.

    Example:
        >>> fallback_modes(graph_def, sig, 16)
        ('scalars', 'batch 1')
    """
    modes = []
    example_input = example_input_alias(graph_def, signature_def)
    if example_input is not None:
        alias, spec = example_input
        shape = (shapes or {}).get(alias) or declared_shape(
            graph_def, signature_def.inputs[alias])[0]
        if shape is None or shape == ():
            modes.append(SCALARS)
    elif any(info.WhichOneof("encoding") == "name"
             and not (shapes or {}).get(alias) and declared_shape(graph_def, info)[0] is None
             for alias, info in signature_def.inputs.items()):
        modes.append(SCALARS)
    if batch_size > 1:
        modes.append(BATCH_1)
    if example_input is not None and any(
            f.kind != "dense" or not f.required or any(d < 0 for d in f.shape)
            for f in example_input[1].features):
        modes.append(ONE_VALUE)
    return tuple(modes)


def example_input_alias(graph_def, signature_def) -> tuple[str, ExampleSpec] | None:
    """(alias, spec) when the signature takes one batch of serialized tf.Examples.

    Example:
        >>> example_input_alias(graph_def, signature_defs["predict"])[0]
        'examples'
    """
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


@dataclass(frozen=True)
class SignatureInputs:
    """The batches (feeds keyed by alias) to run one signature on, and where they came from."""

    signature: str
    batches: tuple[dict, ...]
    source: str  # "synthesized" | "examples:<path>" | "json:<path>"


def inputs_for_signature(
    graph_def,
    key: str,
    signature_def,
    synthesizer: InputSynthesizer,
    user: UserInputs | None = None,
    batch_size: int = 16,
    num_batches: int = 2,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    mode: str | None = None,
) -> SignatureInputs:
    """Feeds for a signature: the user's where they fit, synthesized otherwise.

    ``mode`` (one of :data:`FALLBACKS`) synthesizes them another way, for a model that
    refuses the inputs its signature declares: scalars for the inputs of unknown rank,
    batches of 1, or one value per tf.Example feature. Single rows (scalars of every
    input, batch 1) come as up to ``batch_size * num_batches`` batches, at most
    :data:`MAX_SINGLE_ROWS`. The source names the mode, and the graph's shapes when they
    completed what the signature declares.

    Example:
        >>> inputs_for_signature(graph_def, "predict", sig, InputSynthesizer()).source
        'synthesized'
        >>> inputs_for_signature(graph_def, "predict", sig, synth, mode="batch 1").source
        'synthesized (batch 1)'
    """
    from tensorflow.python.framework import dtypes

    if mode is not None and mode not in FALLBACKS:
        raise ValueError(f"unknown synthesis mode {mode!r}")
    single_rows = min(batch_size * num_batches, MAX_SINGLE_ROWS)
    example_input = example_input_alias(graph_def, signature_def)
    if example_input is not None:
        alias, spec = example_input
        if user is not None and user.examples:
            records = list(user.examples)
            batches = tuple(
                {alias: np.array(records[i:i + batch_size], dtype=object)}
                for i in range(0, len(records), batch_size)
            )
            return SignatureInputs(key, batches, f"examples:{user.path}")
        if mode == SCALARS:  # one serialized tf.Example (ParseSingleExample)
            batches = tuple({alias: np.array(synthesizer.examples(spec, 1)[0], dtype=object)}
                            for _ in range(single_rows))
        else:
            rows, count = (1, single_rows) if mode == BATCH_1 else (batch_size, num_batches)
            batches = tuple(
                {alias: np.array(synthesizer.examples(spec, rows, mode == ONE_VALUE),
                                 dtype=object)}
                for _ in range(count))
        return SignatureInputs(key, batches, synthesized_source(mode))

    aliases = set(signature_def.inputs)
    if user is not None and user.requests:
        matching = [r for r in user.requests if set(r) <= aliases and r]
        if matching:
            batches = []
            for request in matching:
                feed = {}
                for alias, value in request.items():
                    info = signature_def.inputs[alias]
                    np_dtype = dtypes.as_dtype(info.dtype).as_numpy_dtype
                    feed[alias] = np.array(value, dtype=object if np_dtype is object else np_dtype)
                batches.append(feed)
            return SignatureInputs(key, tuple(batches), f"json:{user.path}")
    input_shapes: dict[str, tuple[int, ...] | None] = {}
    from_graph = False
    for alias, info in sorted(signature_def.inputs.items()):
        if info.WhichOneof("encoding") != "name":
            raise ServingOptError(
                f"signature {key} input {alias} is sparse/composite; cannot synthesize it",
                "pass real inputs with --examples (JSON lines)",
            )
        # A pinned input (--input_shapes) is synthesized at its pinned shape: the shape
        # the user serves, and the only one a pinned candidate accepts. Otherwise the
        # signature's, completed by the graph's (a TF 1.0 signature declares none).
        shape = (shapes or {}).get(alias)
        if not shape:
            shape, added = declared_shape(graph_def, info)
            from_graph = from_graph or added
            if shape is None and mode == SCALARS:
                shape = ()
        input_shapes[alias] = shape
    rows, count = batch_size, num_batches
    if mode == BATCH_1 or (mode == SCALARS and all(s == () for s in input_shapes.values())):
        rows, count = 1, single_rows
    batches = [{alias: synthesizer.tensor(signature_def.inputs[alias].dtype, shape, rows)
                for alias, shape in input_shapes.items()}
               for _ in range(count)]
    return SignatureInputs(key, tuple(batches),
                           synthesized_source(mode or (GRAPH_SHAPES if from_graph else None)))


def check_user_inputs_fit(meta_graph, keys: Sequence[str], user: UserInputs | None) -> None:
    """UsageError when ``--examples`` fits none of the signatures ``keys``: its tf.Examples
    feed no signature that parses them, or no JSON request's keys are a signature's
    inputs. Otherwise every measurement would quietly run on synthesized inputs.

    Example:
        >>> check_user_inputs_fit(meta_graph, ["serving_default"], json_with_key_logits)
        Traceback (most recent call last):
        UsageError: --examples x.jsonl fits no signature: its requests have keys logits; ...
    """
    if user is None or (not user.examples and not user.requests):
        return
    takes_examples = any(example_input_alias(meta_graph.graph_def,
                                             meta_graph.signature_def[k]) is not None
                         for k in keys)
    if user.examples and takes_examples:
        return
    aliases = {k: set(meta_graph.signature_def[k].inputs) for k in keys}
    if user.requests and any(r and set(r) <= a for r in user.requests
                             for a in aliases.values()):
        return
    given = "tf.Examples" if user.examples and not user.requests else \
        "requests with keys " + ", ".join(sorted({k for r in user.requests for k in r}))
    wanted = "; ".join(f"{k} takes {', '.join(sorted(a)) or 'nothing'}"
                       for k, a in sorted(aliases.items()))
    raise UsageError(f"--examples {user.path} fits no signature: it has {given}, and {wanted}",
                     "give each JSON line the signature's input keys (or tf.Examples for a "
                     "signature that parses them)")


def resize_batch(batches: Sequence[dict], batch_size: int) -> dict:
    """One feed of ``batch_size`` rows, made of the rows of ``batches`` in order (cycled
    when there are fewer). Inputs without a batch dimension (scalars) are taken as they
    are from the first batch.

    Example:
        >>> resize_batch([{"x": np.zeros((3, 2))}], 5)["x"].shape
        (5, 2)
    """
    first = batches[0]
    sizes = {len(v) for b in batches for v in b.values() if np.ndim(v) >= 1}
    if not sizes or any(np.ndim(v) == 0 for v in first.values()):
        return first
    rows: dict[str, list] = {alias: [] for alias in first}
    total = 0
    while total < batch_size:
        for feed in batches:
            lengths = {len(v) for v in feed.values()}
            if len(lengths) != 1 or 0 in lengths:  # no single, non-empty batch dimension
                return first
            for alias, value in feed.items():
                rows[alias].append(np.asarray(value))
            total += lengths.pop()
            if total >= batch_size:
                break
    return {alias: np.concatenate(parts)[:batch_size] for alias, parts in rows.items()}


class SignatureFeeds(Protocol):
    """What ``signature_feeds`` returns: ``feeds(key, batch_size, num_batches=1, mode=None)``."""

    def __call__(self, key: str, batch_size: int, num_batches: int = 1,
                 mode: str | None = None) -> SignatureInputs: ...


def signature_feeds(meta_graph, saved_model_dir: str, *, user: UserInputs | None = None,
                    seed: int = 0, shapes: Mapping | None = None) -> SignatureFeeds:
    """The feed builder parity, benchmark and validate all use: ``feeds(key, batch_size, n)``.

    The returned ``feeds(key, batch_size, num_batches=1)`` gives the
    SignatureInputs of signature ``key`` of ``meta_graph``: the user's inputs where
    they fit, synthesized otherwise. One synthesizer serves every call: the
    vocabulary is read once, and successive calls continue one seeded random stream,
    so a run's inputs are reproducible and differ between signatures and batch sizes.
    ``shapes`` ({key: {alias: shape}}, from ``--input_shapes``) sets the shape an input
    is synthesized at; ``mode`` (a fallback of :data:`FALLBACKS`, from the parity gate's
    source: :func:`mode_of`) synthesizes the way the original model was found to run.

    Example:
        >>> feeds = signature_feeds(meta_graph, "build/sample/1", seed=0)
        >>> len(feeds("predict", 16, 2).batches)
        2
    """
    synthesizer = InputSynthesizer(model_vocabulary(meta_graph, saved_model_dir), seed)

    def feeds(key: str, batch_size: int, num_batches: int = 1,
              mode: str | None = None) -> SignatureInputs:
        made = inputs_for_signature(meta_graph.graph_def, key, meta_graph.signature_def[key],
                                    synthesizer, user, batch_size, num_batches,
                                    (shapes or {}).get(key), mode)
        parts = composite_inputs.composite_parts(meta_graph, key) \
            if is_synthesized(made.source) else {}
        if not parts:
            return made
        return SignatureInputs(key, tuple(composite_inputs.complete(b, parts, synthesizer)
                                          for b in made.batches), made.source)

    return feeds
