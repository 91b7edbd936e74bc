"""``--input_shapes``: pinning a signature input's unknown dimensions, like the Graph
Transform Tool's ``strip_unused_nodes(shape=...)``.

    pins = parse("image_tensor:1,480,640,3")
    pinned = resolve(meta_graph, ["serving_default"], pins)
    # {"serving_default": {"inputs": (1, 480, 640, 3)}}
    graph = pin_graph(graph, pinned)      # the placeholders and the signatures say so

A pinned placeholder lets the transforms and Grappler fold what only depended on the
input's shape (Shape, the resize's size, the anchors' grid), which is what the user of a
detection model asks ``strip_unused_nodes(shape=...)`` for. The price is that the served
signature accepts only that shape, so :mod:`serving_opt.pipeline.pinning` keeps the pinned graph
only where it measures faster.

A name is a signature's input key (``inputs``) or its tensor (``image_tensor`` or
``image_tensor:0``); ``-1`` (or ``?``) leaves a dimension as the model has it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from serving_opt.errors import UsageError

# {signature key: {input alias: the full shape, -1 where left free}}
Pinned = Mapping[str, Mapping[str, tuple[int, ...]]]

_ENTRY = re.compile(r"^([^:\s]+(?::\d+)?):((?:-1|\?|\d+)(?:,(?:-1|\?|\d+))*)$")
_FLAG = "--input_shapes"
_EXAMPLE = "e.g. --input_shapes=image_tensor:1,480,640,3 (several: name:dims;name:dims)"


@dataclass(frozen=True)
class PinnedShape:
    """One ``name:dims`` of the flag; -1 leaves a dimension free."""

    name: str
    dims: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.name}:{format_dims(self.dims)}"


def format_dims(dims: Sequence[int]) -> str:
    """``1,480,640,3``; a free dimension is ``-1``."""
    return ",".join(str(d) for d in dims)


def parse(spec: str | None) -> tuple[PinnedShape, ...]:
    """The flag's entries, checked for syntax only (the names are the model's to resolve)."""
    if spec is None or not spec.strip():
        return ()
    pins: list[PinnedShape] = []
    for entry in re.split(r"[;\s]+", spec.strip()):
        if not entry:
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise UsageError(f"{_FLAG}: {entry!r} is not name:dims (dims comma separated "
                             "integers, -1 for one left free)", _EXAMPLE)
        dims = tuple(-1 if d == "?" else int(d) for d in match.group(2).split(","))
        if 0 in dims:
            raise UsageError(f"{_FLAG}: {entry!r} pins a dimension to 0 (an empty tensor)",
                             _EXAMPLE)
        name = match.group(1)
        if any(_same_name(name, p.name) for p in pins):
            raise UsageError(f"{_FLAG} names {name} twice", "give each input once")
        pins.append(PinnedShape(name, dims))
    return tuple(pins)


def _same_name(a: str, b: str) -> bool:
    return _tensor(a) == _tensor(b)


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def resolve(meta_graph, keys: Sequence[str], pins: Sequence[PinnedShape]) -> dict:
    """Each pin matched to the inputs of the kept signatures ``keys`` that it names (by
    key or by tensor), merged with the dimensions the model already knows.

    UsageError when a name matches no input, the rank differs, a pinned dimension
    contradicts one the model fixes, or the input is not a placeholder (nothing to pin).
    """
    from serving_opt.savedmodel.inputs import tensor_info_shape

    nodes = {n.name: n for n in meta_graph.graph_def.node}
    pinned: dict[str, dict[str, tuple[int, ...]]] = {}
    for pin in pins:
        matched = False
        for key in keys:
            for alias, info in sorted(meta_graph.signature_def[key].inputs.items()):
                if not info.name or (pin.name != alias
                                     and _tensor(pin.name) != _tensor(info.name)):
                    continue
                matched = True
                what = f"{pin.name} ({key}'s input {alias}, {info.name})"
                node = nodes.get(info.name.split(":")[0])
                if node is None or node.op not in ("Placeholder", "PlaceholderWithDefault"):
                    raise UsageError(
                        f"{_FLAG}: {what} is made by a {node.op if node else 'missing'} op, "
                        "not a placeholder: there is no shape to pin",
                        f"drop {pin.name} from {_FLAG}")
                known = tensor_info_shape(info)
                pinned.setdefault(key, {})[alias] = _merge(what, known, pin.dims)
        if not matched:
            inputs = "; ".join(
                f"{k}: " + ", ".join(f"{a} ({i.name})" for a, i in
                                     sorted(meta_graph.signature_def[k].inputs.items()))
                for k in keys)
            raise UsageError(f"{_FLAG}: {pin.name} is no input of the signatures kept "
                             f"({inputs})", "name an input by its key or its tensor")
    return pinned


def _merge(what: str, known: tuple[int, ...] | None, dims: tuple[int, ...]) -> tuple:
    if known is None:
        return dims
    if len(known) != len(dims):
        raise UsageError(f"{_FLAG}: {what} has rank {len(known)} "
                         f"({format_dims(known)}), and {format_dims(dims)} has {len(dims)}",
                         f"give {len(known)} dimensions, -1 where it may vary")
    merged = []
    for i, (k, d) in enumerate(zip(known, dims)):
        if k >= 0 and d >= 0 and k != d:
            raise UsageError(f"{_FLAG}: {what} has dimension {i} fixed at {k}, and "
                             f"{format_dims(dims)} pins it to {d}",
                             f"give {k} there (or -1)")
        merged.append(k if d < 0 else d)
    return tuple(merged)


def pins_unknown(meta_graph, pinned: Pinned) -> bool:
    """Whether a pin fixes a dimension the model leaves unknown (else pinning changes
    nothing: the pins only repeat the model's own shapes, or leave everything free).
    """
    from serving_opt.savedmodel.inputs import tensor_info_shape

    for key, by_alias in pinned.items():
        for alias, dims in by_alias.items():
            known = tensor_info_shape(meta_graph.signature_def[key].inputs[alias])
            if any(d >= 0 and (known is None or known[i] < 0) for i, d in enumerate(dims)):
                return True
    return False


def describe(pinned: Pinned) -> str:
    """``serving_default.inputs=1,480,640,3``: every pinned input, as the report names it."""
    return ", ".join(f"{key}.{alias}={format_dims(dims)}"
                     for key, by_alias in sorted(pinned.items())
                     for alias, dims in sorted(by_alias.items()))


def batch_size(pinned: Pinned) -> int | None:
    """The batch dimension the pins fix (the first of a pinned input's shape), or None
    when no pin fixes one; UsageError when two pins fix different ones.
    """
    fixed = {s[0] for shapes in pinned.values() for s in shapes.values() if s and s[0] >= 0}
    if len(fixed) > 1:
        raise UsageError(f"{_FLAG} pins the batch dimension to {sorted(fixed)}: one "
                         "measurement cannot feed both", "pin one batch size (or -1)")
    return fixed.pop() if fixed else None


def check_requests(pinned: Pinned, signature_defs: Mapping, user) -> None:
    """UsageError when a JSON request of ``--examples`` for a pinned signature has another
    shape than the pin (a batch of 2 against a pinned 1): the pinned model would refuse
    the user's own inputs.
    """
    if user is None or not user.requests:
        return
    import numpy as np

    for key, shapes in pinned.items():
        aliases = set(signature_defs[key].inputs)
        for number, request in enumerate(user.requests, 1):
            if not request or not set(request) <= aliases:
                continue  # a request of another signature
            for alias, dims in shapes.items():
                if alias not in request:
                    continue
                shape = np.shape(request[alias])
                if len(shape) != len(dims) or any(d >= 0 and d != s
                                                  for d, s in zip(dims, shape)):
                    raise UsageError(
                        f"{_FLAG} pins {alias} of {key} to {format_dims(dims)}, and request "
                        f"{number} of --examples {user.path} has shape "
                        f"{format_dims(shape)}: the pinned model would refuse it",
                        "pin the shape your requests have (-1 where they vary), or drop "
                        f"{_FLAG}")


def pin_graph(graph, pinned: Pinned):
    """The serving graph with the pinned inputs' placeholders and signature entries set
    to their pinned shapes (a new graph; ``graph`` is not changed).
    """
    import dataclasses

    from tensorflow.core.framework import graph_pb2, tensor_shape_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    nodes = {n.name: n for n in graph_def.node}
    signature_defs = {}
    for key, signature in graph.signature_defs.items():
        copy = meta_graph_pb2.SignatureDef()
        copy.CopyFrom(signature)
        for alias, dims in pinned.get(key, {}).items():
            info = copy.inputs[alias]
            shape = tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
            info.tensor_shape.CopyFrom(shape)
            node = nodes[info.name.split(":")[0]]
            node.attr["shape"].shape.CopyFrom(shape)
            if "_output_shapes" in node.attr:
                del node.attr["_output_shapes"]  # stale; shape inference recomputes it
        signature_defs[key] = copy
    return dataclasses.replace(graph, graph_def=graph_def, signature_defs=signature_defs)
