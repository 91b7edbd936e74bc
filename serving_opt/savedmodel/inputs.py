"""Inputs to run a signature on: read from the user's files, or synthesized from the graph.

Synthesized tf.Examples follow the parsing spec found in the graph itself
(:mod:`~serving_opt.savedmodel.parse_spec`), and string features are drawn from the
model's vocabulary (:mod:`~serving_opt.savedmodel.vocabulary_words`) so lookups hit real
table entries, plus out-of-vocabulary words so the OOV path is exercised too.

The user's ``--examples`` (TFRecords of tf.Example, JSON lines of requests) are read by
:mod:`serving_opt.savedmodel.examples`; here they are fed to the signatures they fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.savedmodel import composite_inputs
from serving_opt.savedmodel.examples import UserInputs
from serving_opt.savedmodel.graph import node_name
from serving_opt.savedmodel.parse_spec import ExampleSpec, FeatureSpec, example_input_alias
from serving_opt.savedmodel.vocabulary_words import model_vocabulary


class InputSynthesizer:
    """Deterministic random inputs shaped like a signature wants them."""

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
    """The fallback a source names (``synthesized (batch 1)`` -> ``batch 1``), else None."""
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
