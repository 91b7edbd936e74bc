"""int8 / int4 / fp16 weights that TF Serving runs at full speed.

The Graph Transform Tool's ``quantize_weights`` stores weights as 8 bits and puts the
dequantization in the request path: every request turns the *whole* table back into
float (a batch-32 lookup into a 500,000 x 64 table went from 0.16 ms to 3.5 ms). Here
the dequantization is placed where it costs nothing:

* **embedding tables** (variables read only through ``ResourceGather`` or
  ``ReadVariableOp`` + ``GatherV2`` on axis 0) are stored as int8 with a float scale per
  column (per row when the rows' sizes differ too much for that; fp16: as half); the
  graph gathers the int8 rows first and dequantizes only those, so a request costs what
  it did and the serving process holds a quarter of the table; int4: two 4-bit values a
  byte (an eighth of the table, plus a scale per row), the gathered bytes unpacked by
  integer ops before the cast;
* **other weights** (what the convolutions, matmuls and bias adds read) are stored as
  int8 with a scale per output channel (fp16: as half) and turned back into float
  once, at load, by the init op, which TF Serving runs right after restoring the
  checkpoint; requests read the same float variables as before. int4 leaves them
  float32: dequantized at load they would shrink the files, never the server, and at
  4 bits they would cost agreement for it.

It works on the variables of the checkpoint this tool writes (large tables kept from
freezing, large folded constants stored as variables), so it runs after
``checkpoint.externalize_constants``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from serving_opt.savedmodel import checkpoint
from serving_opt.savedmodel.checkpoint import SAVER_SCOPE, KeptVariable
from serving_opt.savedmodel.graph import attr, data_consumers, make_node, var_handle

MODES = ("none", "int8", "int4", "fp16", "bf16")  # bf16: stages.bf16, not the weights
DEFAULT_MIN_ELEMENTS = 16384
_SCOPE = "serving_opt_quantized"
_CHUNK_ROWS = 65536  # rows quantized at a time: bounded memory for a 1 GB table
# int4: a value q in [-7, 7] is stored as the nibble q + 8 (1..15; 8 is zero, the padding
# of an odd-width row), symmetric around zero so a row needs one scale and no offset.
_INT4_LEVELS = 7
_INT4_ZERO = 8
# Each int4 row's step is the one of these fractions of peak / 7 that rounds the row with
# the least squared error: clipping its few largest values makes every other step finer
# (11% less rms error on the 1 GB text classifier's table than the peak alone).
_INT4_CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)
# An int8 table takes a scale per column (one Mul by a constant after the gather) rather
# than one per row (a second gather, a reshape and a Mul: a tenth of a small request's
# time, docs/int8.md) unless that makes its rounding error this many times larger.
_COLUMN_ERROR = 3.0


@dataclass(frozen=True)
class QuantizedTensor:
    """One weight stored quantized, for the report."""

    name: str
    mode: str  # int8 | int4 | fp16
    dequantized: str  # "at load (init op)" | "per request, gathered rows only"
    bytes_before: int
    bytes_after: int
    column_scales: bool = False  # an int8 table with a scale per column (not per row)


def _gather_consumers(graph_def, var: str):
    """The gathers reading ``var`` if a gather is all that reads it, else None.

    Returns ``[(node, kind)]``, kind "resource" (ResourceGather on the handle) or
    "read" (GatherV2 on axis 0 of a ReadVariableOp of it).
    """
    from tensorflow.python.framework import tensor_util

    nodes = {n.name: n for n in graph_def.node}
    consumers = data_consumers(graph_def.node)
    found = []
    for node, index in consumers.get(var, []):
        if node.name.startswith(SAVER_SCOPE):
            continue
        if node.op == "ResourceGather" and index == 0 and node.attr["batch_dims"].i == 0:
            found.append((node, "resource"))
        elif node.op == "ReadVariableOp":
            for reader, j in consumers.get(node.name, []):
                axis = nodes.get(reader.input[2].split(":")[0]) if reader.op == "GatherV2" \
                    and len(reader.input) > 2 else None
                if reader.op != "GatherV2" or j != 0 or axis is None or axis.op != "Const" \
                        or int(tensor_util.MakeNdarray(axis.attr["value"].tensor)) != 0 \
                        or reader.attr["batch_dims"].i != 0:
                    return None
                found.append((reader, "read"))
        else:
            return None
    return found or None


def _quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and their float32 scales (symmetric: row = q * scale)."""
    rows = table.shape[0]
    flat = table.reshape(rows, -1)
    q = np.empty(flat.shape, np.int8)
    scales = np.empty((rows,), np.float32)
    for start in range(0, rows, _CHUNK_ROWS):
        chunk = flat[start:start + _CHUNK_ROWS].astype(np.float32)
        peak = np.abs(chunk).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q[start:start + _CHUNK_ROWS] = np.clip(np.rint(chunk / scale[:, None]), -127, 127)
        scales[start:start + _CHUNK_ROWS] = scale
    return q.reshape(table.shape), scales


def _column_scales(table: np.ndarray) -> np.ndarray | None:
    """A float32 scale per column (``table.shape[1:]``) for an int8 table, or None when
    that would cost more than :data:`_COLUMN_ERROR` times the rounding error of a scale
    per row (rows of very different sizes): rounding to a step ``s`` costs ``s^2 / 12``
    on average, so the two are compared by their mean squared steps."""
    rows = table.shape[0]
    flat = table.reshape(rows, -1)
    column_peak = np.zeros(flat.shape[1], np.float32)
    row_squares = 0.0
    for start in range(0, rows, _CHUNK_ROWS):
        chunk = np.abs(flat[start:start + _CHUNK_ROWS].astype(np.float32))
        column_peak = np.maximum(column_peak, chunk.max(axis=0))
        row_squares += float(np.square(chunk.max(axis=1).astype(np.float64)).sum())
    if float(np.square(column_peak.astype(np.float64)).mean()) > \
            _COLUMN_ERROR ** 2 * row_squares / max(rows, 1):
        return None
    return np.where(column_peak > 0, column_peak / 127.0, 1.0).astype(np.float32).reshape(
        table.shape[1:])


def _quantize_columns(table: np.ndarray, scales: np.ndarray) -> np.ndarray:
    q = np.empty(table.shape, np.int8)
    for start in range(0, table.shape[0], _CHUNK_ROWS):
        chunk = table[start:start + _CHUNK_ROWS].astype(np.float32)
        q[start:start + _CHUNK_ROWS] = np.clip(np.rint(chunk / scales), -127, 127)
    return q


def quantize_rows_int4(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 2-D table as packed 4-bit rows (uint8, ``ceil(dim / 2)`` bytes a row) and a
    float32 scale per row; symmetric: ``row = (nibble - 8) * scale``, nibbles in [1, 15].
    Each row's scale is the one of :data:`_INT4_CLIPS` that rounds it best.

    Byte ``j`` of a row holds column ``j`` in its low nibble and column ``j + half`` in
    its high one (``half = ceil(dim / 2)``; an odd row's last high nibble is padding, 8):
    unpacking a gathered row is then two integer ops and a concat along its last axis, no
    interleaving reshape. Quantized ``_CHUNK_ROWS`` rows at a time, so a 1 GB table never
    needs a float temporary of its own size.
    """
    rows, dim = table.shape
    half = (dim + 1) // 2
    packed = np.empty((rows, half), np.uint8)
    scales = np.empty((rows,), np.float32)
    for start in range(0, rows, _CHUNK_ROWS):
        chunk = table[start:start + _CHUNK_ROWS].astype(np.float32)
        peak = np.abs(chunk).max(axis=1)
        # Two buffers for every clip's arrays: half the time of fresh ones on a 1 GB table.
        q, miss = np.empty_like(chunk), np.empty_like(chunk)
        scale = levels = error = None
        for clip in _INT4_CLIPS:
            step = np.where(peak > 0, clip * peak / _INT4_LEVELS, 1.0).astype(np.float32)
            np.divide(chunk, step[:, None], out=q)
            np.clip(np.rint(q, out=q), -_INT4_LEVELS, _INT4_LEVELS, out=q)
            np.subtract(np.multiply(q, step[:, None], out=miss), chunk, out=miss)
            err = np.einsum("ij,ij->i", miss, miss)
            if scale is None:
                scale, levels, error = step, q.astype(np.int8), err
                continue
            better = err < error
            scale, error = np.where(better, step, scale), np.where(better, err, error)
            levels[better] = q[better]
        nibbles = np.full((chunk.shape[0], 2 * half), _INT4_ZERO, np.uint8)
        nibbles[:, :dim] = levels + _INT4_ZERO
        packed[start:start + _CHUNK_ROWS] = nibbles[:, :half] | (nibbles[:, half:] << 4)
        scales[start:start + _CHUNK_ROWS] = scale
    return packed, scales


def dequantize_rows_int4(packed: np.ndarray, scales: np.ndarray, dim: int) -> np.ndarray:
    """The float32 rows :func:`quantize_rows_int4` stored (numpy; what the graph computes
    for the rows it gathers).
    """
    nibbles = np.concatenate([packed & 15, packed >> 4], axis=-1)[..., :dim]
    return (nibbles.astype(np.float32) - _INT4_ZERO) * scales[..., None]


def _quantize_channels(weight: np.ndarray, depthwise: bool) -> tuple[np.ndarray, np.ndarray]:
    """int8 weight and a float32 scale per output channel (broadcastable to the weight)."""
    if weight.ndim <= 1:
        axes = tuple(range(weight.ndim))
    else:
        axes = tuple(range(weight.ndim - (2 if depthwise else 1)))
    peak = np.abs(weight).max(axis=axes, keepdims=True)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def _store(name: str, value: np.ndarray, mode: str, scales: str, saved: dict, kept: list,
           new_nodes: list, column_scales: np.ndarray | None = None
           ) -> tuple[str, str | None, int]:
    """Adds the quantized copy of ``name`` (and its scales, int8 and int4) as new checkpoint
    variables.

    ``scales``: "rows" (a scale per table row), "channels" (per output channel, the last
    axis) or "depthwise" (per input channel x multiplier); ``column_scales`` (int8): these
    scales per column instead, kept by the graph as a constant, not stored here. Returns
    the copy's name, the scales' name (None: no scales variable) and the copy's DataType.
    """
    from tensorflow.core.framework import types_pb2

    qname, sname = f"{name}/{_SCOPE}_{mode}", f"{name}/{_SCOPE}_scale"
    if mode == "fp16":
        stored, scale, dtype = value.astype(np.float16), None, types_pb2.DT_HALF
        what = f"fp16 copy of {name}"
    elif mode == "int4":  # tables only (rows): two values a byte, a scale per row
        (stored, scale), dtype = quantize_rows_int4(value), types_pb2.DT_UINT8
        what = f"int4 copy of {name} (two values a byte)"
    elif column_scales is not None:
        stored, scale, dtype = _quantize_columns(value, column_scales), None, types_pb2.DT_INT8
        what = f"int8 copy of {name} (a scale per column, in the graph)"
    else:
        stored, scale = _quantize_rows(value) if scales == "rows" \
            else _quantize_channels(value, scales == "depthwise")
        dtype, what = types_pb2.DT_INT8, f"int8 copy of {name}"
    saved[qname] = stored
    kept.append(KeptVariable(qname, "VarHandleOp", dtype, stored.nbytes, what))
    new_nodes.append(var_handle(qname, dtype, stored.shape))
    if scale is not None:
        saved[sname] = scale
        kept.append(KeptVariable(sname, "VarHandleOp", types_pb2.DT_FLOAT, scale.nbytes,
                                 f"{'row' if scales == 'rows' else 'channel'} scales of {name}"))
        new_nodes.append(var_handle(sname, types_pb2.DT_FLOAT, scale.shape))
    return qname, sname if scale is not None else None, dtype


def _gather_rows(gather, nodes: dict, qname: str, sname: str | None, stored_dtype: int,
                 new_nodes: list, packed_width: int = 0,
                 column_scales: np.ndarray | None = None,
                 outputs: frozenset = frozenset()) -> None:
    """Rewrites one gather of a float table into a gather of its quantized rows.

    The gather node keeps its name (its consumers are untouched) and becomes
    ``Cast(gather(q)) * expand_dims(gather(scales), -1)`` (int8, a scale per row),
    ``Cast(gather(q)) * column_scales`` (int8, a constant scale per column) or
    ``Cast(gather(q))`` (fp16): only the rows asked for are turned back into float.
    int4 (``packed_width``: the table's row width, its bytes holding two values each)
    unpacks the gathered bytes first, ``concat([b & 15, b >> 4], -1)[..., :width]``, and
    centers them (``- 8``) before the scale.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import tensor_util

    # Who reads the rows: the node objects themselves, so still right after
    # _ids_in_request_order rewrites them in place.
    readers = data_consumers(nodes.values()).get(gather.name, [])
    ids, base = _ids_in_request_order(nodes, gather, readers, outputs), gather.name
    float_type = attr(type=types_pb2.DT_FLOAT)

    def gather_from(handle: str, dtype: int, name: str) -> str:
        new_nodes.append(make_node(name, "ResourceGather", [handle, ids], dtype=attr(type=dtype),
                                   Tindices=gather.attr["Tindices"], batch_dims=attr(i=0),
                                   validate_indices=attr(b=True)))
        return name

    rows = gather_from(qname, stored_dtype, f"{base}/{_SCOPE}/rows")
    if packed_width:
        rows = _unpack_int4(rows, packed_width, f"{base}/{_SCOPE}", new_nodes)
    cast = f"{base}/{_SCOPE}/cast"
    new_nodes.append(make_node(cast, "Cast", [rows], SrcT=attr(type=stored_dtype),
                               DstT=float_type, Truncate=attr(b=False)))
    controls = [i for i in gather.input if i.startswith("^")]
    if column_scales is not None:
        scales = f"{base}/{_SCOPE}/column_scales"
        new_nodes.append(make_node(scales, "Const", dtype=float_type, value=attr(
            tensor=tensor_util.make_tensor_proto(column_scales))))
        reductions = _segment_reductions_of(readers, base)
        if not reductions:
            nodes[base].CopyFrom(make_node(base, "Mul", [cast, scales] + controls,
                                           T=float_type))
            return
        # A scale per column commutes with a sum or mean of rows: applied to the few
        # rows they give rather than to every row gathered (a batch of 32 texts: 30 us
        # of a 0.7 ms request less, docs/int8.md).
        nodes[base].CopyFrom(make_node(base, "Identity", [cast] + controls, T=float_type))
        for reduction in reductions:
            unscaled = nodes[reduction].__class__()
            unscaled.CopyFrom(nodes[reduction])
            unscaled.name = f"{reduction}/{_SCOPE}/unscaled"
            new_nodes.append(unscaled)
            scaled = make_node(reduction, "Mul", [unscaled.name, scales], T=float_type)
            scaled.device = unscaled.device
            nodes[reduction].CopyFrom(scaled)
        return
    if sname is None:
        nodes[base].CopyFrom(make_node(base, "Identity", [cast] + controls, T=float_type))
        return
    if packed_width:
        centered = f"{base}/{_SCOPE}/centered"
        new_nodes.append(make_node(f"{centered}/zero", "Const", dtype=float_type,
                                   value=attr(tensor=tensor_util.make_tensor_proto(
                                       np.float32(_INT4_ZERO)))))
        new_nodes.append(make_node(centered, "Sub", [cast, f"{centered}/zero"], T=float_type))
        cast = centered
    scales = gather_from(sname, types_pb2.DT_FLOAT, f"{base}/{_SCOPE}/scales")
    last = f"{base}/{_SCOPE}/last_axis"
    new_nodes.append(make_node(last, "Const", dtype=attr(type=types_pb2.DT_INT32),
                               value=attr(tensor=tensor_util.make_tensor_proto(-1))))
    expand = f"{base}/{_SCOPE}/expand"
    new_nodes.append(make_node(expand, "ExpandDims", [scales, last], T=float_type,
                               Tdim=attr(type=types_pb2.DT_INT32)))
    nodes[base].CopyFrom(make_node(base, "Mul", [cast, expand] + controls, T=float_type))


# Sums and means of rows: linear in each column of their data (input 0).
_SEGMENT_REDUCTIONS = frozenset(
    f"SparseSegment{kind}{suffix}" for kind in ("Sum", "Mean", "SqrtN")
    for suffix in ("", "WithNumSegments")) | {"SegmentSum", "SegmentMean"}
# The same reductions of rows already in request order (no indices to read them through).
_IN_ORDER = {"SparseSegmentSum": "SegmentSum", "SparseSegmentMean": "SegmentMean"}


def _ids_in_request_order(nodes: dict, gather, readers: list,
                          outputs: frozenset = frozenset()) -> str:
    """The ids to gather: ``gather``'s own, or, when they are ``Unique``'s and every reader
    of the rows is a segment sum or mean reading them back through Unique's idx
    (``embedding_lookup_sparse``), the ids before ``Unique``; those readers then become
    ``SegmentSum``/``SegmentMean`` of the rows in request order. ``readers``: the rows'
    ``[(node, input index)]``. Rows that are one of the signatures' ``outputs`` stay as
    they were.

    The same numbers (row ``j`` is ``table[ids[j]]`` either way) for one op less a
    request (1-3% of the 1 GB text classifier's, docs/int8.md).
    """
    from tensorflow.core.framework import types_pb2

    ids = gather.input[1]
    unique = nodes.get(ids.split(":")[0])
    if unique is None or unique.op != "Unique" or ids.endswith(":1") or gather.name in outputs:
        return ids
    if not readers or any(n.op not in _IN_ORDER or i != 0 or len(n.input) < 3
                          or n.input[1] != f"{unique.name}:1" for n, i in readers):
        return ids
    for reader, _ in readers:
        # Segment ids were int32 only before SparseSegment* took Tsegmentids (TF 2.6).
        segment_type = reader.attr["Tsegmentids"] if "Tsegmentids" in reader.attr \
            else attr(type=types_pb2.DT_INT32)
        rewritten = make_node(reader.name, _IN_ORDER[reader.op],
                              [reader.input[0], reader.input[2], *reader.input[3:]],
                              T=reader.attr["T"], Tindices=segment_type)
        rewritten.device = reader.device
        reader.CopyFrom(rewritten)
    return unique.input[0]


def _segment_reductions_of(readers: list, gather: str) -> list[str]:
    """The names of ``gather``'s ``readers`` if every one is a segment reduction of its
    rows (and nothing else reads them), else []."""
    if any(n.op not in _SEGMENT_REDUCTIONS or i != 0 or n.input[0] not in (gather, f"{gather}:0")
           for n, i in readers):
        return []
    return [n.name for n, _ in readers]


def _unpack_int4(rows: str, width: int, prefix: str, new_nodes: list) -> str:
    """Nodes turning gathered packed rows (uint8 ``[..., ceil(width / 2)]``) into their
    nibbles (uint8 ``[..., width]``, still offset by 8); returns the last one.

    Pure integer math on the gathered bytes only (BitwiseAnd, RightShift, ConcatV2,
    StridedSlice): the table itself is never unpacked.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import tensor_util

    byte = attr(type=types_pb2.DT_UINT8)
    int32 = attr(type=types_pb2.DT_INT32)

    def const(name: str, value, dtype: int) -> str:
        new_nodes.append(make_node(name, "Const", dtype=attr(type=dtype),
                                   value=attr(tensor=tensor_util.make_tensor_proto(
                                       value, dtype=dtype))))
        return name

    low, high, both = f"{prefix}/low", f"{prefix}/high", f"{prefix}/unpacked"
    new_nodes.append(make_node(low, "BitwiseAnd", [rows, const(
        f"{low}/mask", np.uint8(15), types_pb2.DT_UINT8)], T=byte))
    new_nodes.append(make_node(high, "RightShift", [rows, const(
        f"{high}/bits", np.uint8(4), types_pb2.DT_UINT8)], T=byte))
    # Low nibbles are the first half of the row, high ones the second (quantize_rows_int4).
    new_nodes.append(make_node(both, "ConcatV2", [low, high, const(
        f"{both}/axis", np.int32(-1), types_pb2.DT_INT32)], N=attr(i=2), T=byte, Tidx=int32))
    if width % 2 == 0:
        return both
    # An odd width: drop the padding nibble, ``[..., :width]`` (the ellipsis keeps this
    # independent of the ids' rank).
    trimmed = f"{prefix}/trimmed"
    new_nodes.append(make_node(
        trimmed, "StridedSlice",
        [both, const(f"{trimmed}/begin", np.array([0, 0], np.int32), types_pb2.DT_INT32),
         const(f"{trimmed}/end", np.array([0, width], np.int32), types_pb2.DT_INT32),
         const(f"{trimmed}/strides", np.array([1, 1], np.int32), types_pb2.DT_INT32)],
        T=byte, Index=int32, begin_mask=attr(i=0), end_mask=attr(i=0),
        ellipsis_mask=attr(i=1), new_axis_mask=attr(i=0), shrink_axis_mask=attr(i=0)))
    return trimmed


def _dequantize_at_load(name: str, qname: str, sname: str | None, stored_dtype: int,
                        new_nodes: list, after: str | None = None) -> str:
    """Nodes assigning ``name = Cast(qname) [* sname]``, then emptying ``qname`` and
    ``sname``; returns the node that runs them all, for the init op.

    ``after``: the previous weight's node of this kind; this one starts once it is done.
    One weight at a time, not all at once: TF's oneDNN allocator (the x86 default) keeps
    what is freed in its pool, so the float temporaries of weights dequantized together
    stay held for the server's life (a 256 MiB MLP held 1.10x the original's memory
    dequantized together, 1.06x one at a time)."""
    from tensorflow.core.framework import types_pb2

    prefix = f"{name}/{_SCOPE}/dequantize"
    float_type = attr(type=types_pb2.DT_FLOAT)
    new_nodes.append(make_node(f"{prefix}/read", "ReadVariableOp",
                               [qname] + ([f"^{after}"] if after else []),
                               dtype=attr(type=stored_dtype)))
    value = f"{prefix}/cast"
    new_nodes.append(make_node(value, "Cast", [f"{prefix}/read"], SrcT=attr(type=stored_dtype),
                               DstT=float_type, Truncate=attr(b=False)))
    if sname is not None:
        new_nodes.append(make_node(f"{prefix}/scale", "ReadVariableOp", [sname],
                                   dtype=float_type))
        new_nodes.append(make_node(f"{prefix}/mul", "Mul", [value, f"{prefix}/scale"],
                                   T=float_type))
        value = f"{prefix}/mul"
    new_nodes.append(make_node(f"{prefix}/assign", "AssignVariableOp", [name, value],
                               dtype=float_type))
    # The quantized copy (and its scales) are read once, here: emptied right after the
    # float variable holds the weight, or the serving process would keep both for its
    # whole life (1.25x the float weight instead of 1x).
    frees = []
    for source, dtype in ((qname, stored_dtype), (sname, types_pb2.DT_FLOAT)):
        if source is None:
            continue
        new_nodes.extend(checkpoint.emptied(source, dtype, f"{prefix}/assign",
                                            f"{source}/{_SCOPE}"))
        frees.append(new_nodes[-1].name)
    new_nodes.append(make_node(f"{prefix}/done", "NoOp", [f"^{f}" for f in frees]
                               + [f"^{prefix}/assign"]))
    return f"{prefix}/done"


def quantize(graph, mode: str, min_elements: int, work_dir: str,
             tables_only: bool = False, skipped: list | None = None,
             row_scales: bool = False) -> tuple:
    """Stores the graph's large float weights quantized; returns ``(graph, quantized)``.

    ``tables_only`` leaves the weights dequantized at load as they are (float): they
    only make the files smaller, while the tables also make the server smaller, and
    when the lossy gate refuses everything quantized it is usually the dense weights.
    int4 is always tables only (2-D tables: the packed rows unpack along their last
    axis). ``skipped`` (if given) receives ``(name, bytes)`` of every large float
    weight left float that way, for the warning. ``row_scales``: int8 tables take a
    scale per row even where one per column would do (finer, a little slower).
    """
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    if mode in ("none", "bf16") or not graph.kept_variables:
        return graph, []
    # int4 dense weights would be dequantized at load: a smaller file, the same server.
    tables_only = tables_only or mode == "int4"
    skipped = [] if skipped is None else skipped
    reader = tf.train.load_checkpoint(os.path.join(graph.variables_dir, "variables"))
    graph_def = type(graph.graph_def)()
    graph_def.CopyFrom(graph.graph_def)
    nodes = {n.name: n for n in graph_def.node}
    depthwise_reads = {i.split(":")[0] for n in graph_def.node
                       if n.op == "DepthwiseConv2dNative" for i in n.input[1:2]}
    kept: list[KeptVariable] = []
    done: list[QuantizedTensor] = []
    dequantize_assigns: list[str] = []
    new_nodes = []
    saved: dict[str, np.ndarray] = {}
    replaced: set[str] = set()
    dedup_sources: set[str] = set()  # what the gathers read their ids from
    # Not must_keep(): that holds every gather (stateful), which keeps its name here.
    outputs = frozenset(graph.signature_output_nodes())
    part = os.path.join(work_dir, "quantized", "variables")
    for var in graph.kept_variables:
        value = reader.get_tensor(var.name)
        if var.dtype != types_pb2.DT_FLOAT or value.size < min_elements:
            kept.append(var)
            saved[var.name] = value
            continue
        gathers = _gather_consumers(graph_def, var.name) \
            if value.ndim == 2 or (value.ndim > 2 and mode != "int4") else None
        if gathers is not None:
            columns = _column_scales(value) if mode == "int8" and not row_scales else None
            qname, sname, stored_dtype = _store(var.name, value, mode, "rows", saved, kept,
                                                new_nodes, column_scales=columns)
            for gather, _kind in gathers:
                dedup_sources.add(gather.input[1].split(":")[0])
                _gather_rows(gather, nodes, qname, sname, stored_dtype, new_nodes,
                             packed_width=value.shape[1] if mode == "int4" else 0,
                             column_scales=columns, outputs=outputs)
            replaced.add(var.name)  # the float table: nothing reads it any more
            # Its reads: those feeding the gathers, and any a folded Shape left unused.
            replaced.update(n.name for n in graph_def.node if n.op == "ReadVariableOp"
                            and n.input and n.input[0].split(":")[0] == var.name)
            done.append(QuantizedTensor(var.name, mode, "per request, gathered rows only",
                                        value.nbytes, sum(saved[k].nbytes for k in saved
                                                          if k.startswith(var.name + "/")),
                                        column_scales=columns is not None))
            continue
        if tables_only:
            kept.append(var)
            saved[var.name] = value
            skipped.append((var.name, value.nbytes))
            continue
        # Dequantized once at load: the float variable stays, restored no more but
        # assigned by the init op from its quantized copy.
        reads = [n.name for n in graph_def.node if n.op == "ReadVariableOp"
                 and n.input and n.input[0] == var.name]
        depthwise = any(r in depthwise_reads for r in reads)
        qname, sname, src = _store(var.name, value, mode,
                                   "depthwise" if depthwise else "channels", saved, kept,
                                   new_nodes)
        dequantize_assigns.append(_dequantize_at_load(
            var.name, qname, sname, src, new_nodes,
            dequantize_assigns[-1] if dequantize_assigns else None))
        done.append(QuantizedTensor(var.name, mode, "at load (init op)", value.nbytes,
                                    saved[qname].nbytes + (saved[sname].nbytes if sname else 0)))
    del reader
    if not done:
        return graph, []
    graph_def.node.extend(new_nodes)
    # A Unique the gathers no longer read (_ids_in_request_order) would never run.
    read = {i.lstrip("^").split(":")[0] for n in graph_def.node for i in n.input}
    replaced.update(n for n in dedup_sources - read - set(graph.must_keep())
                    if nodes[n].op == "Unique")
    # The new checkpoint: the quantized entries plus every untouched kept variable.
    checkpoint.save_arrays(part, saved)
    del saved
    init_op, init_source = graph.init_op, graph.init_op_source
    protect = []
    if dequantize_assigns:
        # Right after the restore, TF Serving runs the init op: dequantize there, once.
        new_init = f"{_SCOPE}/init"
        graph_def.node.append(make_node(new_init, "NoOp",
                                        ([f"^{init_op}"] if init_op else [])
                                        + [f"^{a}" for a in dequantize_assigns]))
        init_op, init_source = new_init, init_source or "main_op"
        protect.append(new_init)
    return checkpoint.replace_saver(graph, graph_def, kept, os.path.dirname(part),
                                    removed=frozenset(replaced), protect=tuple(protect),
                                    init_op=init_op, init_op_source=init_source), done
