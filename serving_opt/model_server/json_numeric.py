"""Predict's numeric tensors straight from the JSON text to numpy, no Python object tree.

A REST body is mostly one thing: nested lists of numbers (images, embeddings, features).
Parsing those with ``json.loads`` costs ~48 bytes of memory per body byte and a Python
object per number. :func:`fast_predict_tensors` decodes them one of two ways:

* :mod:`.json_simd` (simdjson, compiled): the fastest (a 160x160x3 float image in ~4 ms
  where this module's numpy reader takes ~30), but its tape costs ~40 bytes a number, so
  it is used where that stays within :data:`MAX_SIMD_BYTES_PER_BODY_BYTE` (numbers of
  10+ characters, as ``json.dumps`` writes floats) or the body is small;
* :func:`numpy_predict_tensors`, for dense short numbers (``0, 255, 3, ...``) where the
  tape would take ~10 bytes a body byte, or a body simdjson refused: it finds each
  bracketed run of number characters in the body, checks it as a JSON array
  (rectangular, valid JSON numbers) with byte-string operations, and parses the numbers
  with vectorised numpy (a per-token Python ``float`` only where exactness needs it), at
  ~3 bytes a body byte. The rest of the body, a small "skeleton" in which each run is a
  placeholder string, goes through the same :func:`~.json_read.parse_json`.

Fast or not, the answer is the old path's: :func:`fast_predict_tensors` returns None
(and the caller runs the Python-object path, which also produces every error text)
unless the body is one the old path accepts *and* decodes to the same arrays: same
values bit for bit (a float is the correctly rounded double of its text, then cast as
the proto's float field does; a JSON integer ``-0`` is ``+0.0``), dtypes and shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tensorflow.core.framework import types_pb2

from serving_opt.model_server.json_read import parse_json
from serving_opt.model_server.json_simd import (
    FLOAT_TYPES,
    INT_TYPES,
    simd_memory,
    simd_predict_tensors,
)
from serving_opt.model_server.status import ServingStatusError
from serving_opt.model_server.tensors import MAX_DIMENSIONS

# Below this a body is parsed the ordinary way: the fast path's fixed costs win nothing.
MIN_FAST_BYTES = 2048
# simdjson is used while its memory (json_simd.simd_memory) stays within this many bytes
# a body byte, or within SIMD_ANY_BYTES whatever the body (a transient few MiB matter
# less than its ~5x speed over the numpy reader).
MAX_SIMD_BYTES_PER_BODY_BYTE = 4
SIMD_ANY_BYTES = 16 << 20

# A '[' ... ']' run of the characters a numeric JSON array can hold.
_BLOCK = re.compile(rb"\[[-0-9eE.+,\[\] \t\r\n]*\]")
_PLACEHOLDER = "\x00"
_NUMBER_CHARS = b"0123456789.eE+-"
_WHITESPACE = b" \t\r\n"
_IS_NUMBER = np.array([c in _NUMBER_CHARS for c in range(256)])
_TOKEN = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_INTEGER_TOKEN = re.compile(rb"-?(?:0|[1-9][0-9]*)")
_P10_INT = np.array([10**i for i in range(20)], dtype=np.uint64)
_P10_FLOAT = np.array([10.0**i for i in range(23)])  # exact doubles
_TWO_53 = np.uint64(2**53)

class _NotFast(Exception):
    """The body is not one this module decodes exactly: use the Python-object path."""


def fast_predict_tensors(
    body: bytes, input_infos: Callable[[str], object], min_bytes: int = MIN_FAST_BYTES
):
    """``(signature_name or None, {alias: (values, shape, dtype)}, "row" | "columnar")``,
    or None.

    None means: decode ``body`` the ordinary way (it may be fine, or an error whose text
    that path writes).
    """
    if len(body) < min_bytes:
        return None
    memory = simd_memory(body)
    if memory <= max(MAX_SIMD_BYTES_PER_BODY_BYTE * len(body), SIMD_ANY_BYTES):
        fast = simd_predict_tensors(body, input_infos)
        if fast is not None:
            return fast
    return numpy_predict_tensors(body, input_infos)


def numpy_predict_tensors(body: bytes, input_infos: Callable[[str], object]):
    """:func:`fast_predict_tensors` with the numpy reader alone (no simdjson, no size
    threshold).
    """
    if b"\\u0000" in body:
        return None  # the placeholders' marker
    blocks: list[bytes] = []

    def placeholder(match: re.Match) -> bytes:
        blocks.append(match.group())
        return b'"\\u0000%d"' % (len(blocks) - 1)

    skeleton = _BLOCK.sub(placeholder, body)
    if not blocks:
        return None
    try:
        doc = parse_json(skeleton)
        return _tensors(doc, blocks, input_infos)
    except (_NotFast, ServingStatusError):
        return None


def _tensors(doc: dict, blocks: list[bytes], input_infos):
    signature = doc.get("signature_name")
    if signature is not None and not isinstance(signature, str):
        raise _NotFast
    if signature is not None and _PLACEHOLDER in signature:
        raise _NotFast
    infos = dict(input_infos(signature or ""))
    names = sorted(infos)
    if not names:
        raise _NotFast
    used: list[int] = []

    def block(value) -> int:
        if not isinstance(value, str) or not value.startswith(_PLACEHOLDER):
            raise _NotFast
        index = int(value[1:])
        used.append(index)
        return index

    tensors = {}
    if "instances" in doc and "inputs" not in doc:
        fmt = "row"
        instances = doc["instances"]
        if isinstance(instances, str):
            if len(names) != 1:
                raise _NotFast
            name = names[0]
            tensors[name] = _tensor(blocks, block(instances), infos[name].dtype, 0)
        elif isinstance(instances, list) and instances:
            columns: dict[str, list[int]] = {n: [] for n in names}
            for element in instances:
                if not isinstance(element, dict) or set(element) != set(names):
                    raise _NotFast
                if len(element) == 1 and "b64" in element:
                    raise _NotFast
                for name in names:
                    columns[name].append(block(element[name]))
            for name in names:
                tensors[name] = _stacked(blocks, columns[name], infos[name].dtype)
        else:
            raise _NotFast
    elif "inputs" in doc and "instances" not in doc:
        fmt = "columnar"
        value = doc["inputs"]
        if isinstance(value, str):
            if len(names) != 1:
                raise _NotFast
            tensors[names[0]] = _tensor(blocks, block(value), infos[names[0]].dtype, None)
        elif isinstance(value, dict) and not (len(value) == 1 and "b64" in value):
            for name in names:
                if name not in value:
                    raise _NotFast
                tensors[name] = _tensor(blocks, block(value[name]), infos[name].dtype, None)
        else:
            raise _NotFast
    else:
        raise _NotFast
    # every placeholder the document holds must be one decoded above, exactly once
    found: list[int] = []
    _placeholders(doc, found)
    if sorted(found) != sorted(used) or len(set(used)) != len(used):
        raise _NotFast
    return signature, tensors, fmt


def _placeholders(value, found: list[int]) -> None:
    if isinstance(value, str):
        if _PLACEHOLDER in value:
            if not value.startswith(_PLACEHOLDER) or not value[1:].isdigit():
                raise _NotFast
            found.append(int(value[1:]))
    elif isinstance(value, list):
        for item in value:
            _placeholders(item, found)
    elif isinstance(value, dict):
        for key, item in value.items():
            if _PLACEHOLDER in key:
                raise _NotFast
            _placeholders(item, found)


def _tensor(blocks: list, index: int, dtype: int, outer: int | None):
    """One block as (values, shape, dtype). ``outer`` 0: row format (``instances``, at
    least one row); None: columnar."""
    if blocks[index] is None:
        raise _NotFast  # the same placeholder twice
    values, dims = decode_block(blocks, index, dtype)
    if outer is not None and dims[0] == 0:
        raise _NotFast
    return _proto(values, dims, dtype)


def _stacked(blocks: list, indices: list[int], dtype: int):
    parts = []
    shape = None
    for index in indices:
        if blocks[index] is None:
            raise _NotFast  # the same placeholder twice
        values, dims = decode_block(blocks, index, dtype)
        if shape is None:
            shape = dims
        elif dims != shape:
            raise _NotFast
        parts.append(values)
    if len(shape) + 1 > MAX_DIMENSIONS:
        raise _NotFast
    return _proto(np.concatenate(parts), [len(indices), *shape], dtype)


def _proto(values: np.ndarray, dims: list[int], dtype: int):
    return values, dims, dtype


def fill_tensor(tensor, values: np.ndarray, dims: list[int], dtype: int) -> None:
    """Writes a decoded block into a request's TensorProto (``tensor_content``, which
    :func:`~.tensors.from_proto` reads as the typed fields' values)."""
    tensor.dtype = dtype
    for size in dims:
        tensor.tensor_shape.dim.add(size=size)
    tensor.tensor_content = values.tobytes()


# ----------------------------------------------------------------------------- blocks


def decode_block(blocks: list, index: int, dtype: int) -> tuple[np.ndarray, list[int]]:
    """Block ``index`` (a ``[...]`` run of number characters) as (flat values, shape);
    raises _NotFast where it is not a rectangular JSON array of numbers the old path
    reads the same. The block is dropped from ``blocks`` to free its bytes early."""
    text = blocks[index]
    blocks[index] = None
    if dtype not in FLOAT_TYPES and dtype not in INT_TYPES:
        raise _NotFast
    spaces = [c for c in _WHITESPACE if bytes((c,)) in text]
    if spaces:
        view = np.frombuffer(text, dtype=np.uint8)
        for c in spaces:  # what stands before each whitespace character
            if np.any(_IS_NUMBER[view[np.flatnonzero(view[1:] == c)]]) and re.search(
                rb"[-0-9.eE+][ \t\r\n]+[-0-9.eE+]", text
            ):
                raise _NotFast  # whitespace inside a number: not JSON
        del view
        text = text.translate(None, _WHITESPACE)
    # a '[' only after '[' or ',', a ']' only before ']' or ',' (empty elements are
    # found by parse_numbers, empty lists by _dims)
    view = np.frombuffer(text, dtype=np.uint8)
    before = view[np.flatnonzero(view[1:] == 91)]
    after = view[np.flatnonzero(view[:-1] == 93) + 1]
    if not (np.all((before == 91) | (before == 44)) and np.all((after == 93) | (after == 44))):
        raise _NotFast
    del view, before, after
    dims = _dims(text.translate(None, _NUMBER_CHARS))
    count = 1
    for d in dims:
        count *= d
    numbers = text.translate(None, b"[]")
    del text
    values = parse_numbers(numbers, dtype)
    if values.size != count:
        raise _NotFast
    return values, dims


def _dims(structure: bytes) -> list[int]:
    """The shape of a bracket/comma skeleton such as ``[[,],[,]]`` (-> [2, 2]); raises
    _NotFast unless it is exactly the skeleton of a rectangular array."""
    if b"[]" in structure:
        raise _NotFast  # an empty list somewhere: the old path's business
    depth = len(structure) - len(structure.lstrip(b"["))
    if depth == 0 or depth > MAX_DIMENSIONS:
        raise _NotFast
    dims = []
    for level in range(depth):
        end = structure.find(b"]" * (depth - level), level)
        if end < 0:
            raise _NotFast
        inner = depth - level - 1
        dims.append(structure.count(b"]" * inner + b"," + b"[" * inner, level, end) + 1)
    expected = b"[" + b"," * (dims[-1] - 1) + b"]"
    for size in reversed(dims[:-1]):
        expected = b"[" + b",".join([expected] * size) + b"]"
    if expected != structure:
        raise _NotFast
    return dims


def parse_numbers(text: bytes, dtype: int) -> np.ndarray:
    """Comma-separated JSON numbers (no whitespace, no brackets) as a numpy array of
    ``dtype``'s type, exactly as the old path would store them; raises _NotFast.

    Numbers are grouped by their layout (length, digits after the dot, sign): within a
    group every character sits in the same column, so a group is one 2-D gather and a
    few column operations. A number with an exponent, or one whose double the
    vectorised arithmetic cannot promise exact, is read by Python's ``float``.
    """
    data = np.frombuffer(text, dtype=np.uint8)
    size = data.size
    if size == 0:
        raise _NotFast
    commas = np.flatnonzero(data == 44)
    count = commas.size + 1
    index_type = np.int32 if size < 2**31 - 1 else np.int64  # 4 bytes a number, not 8
    starts = np.empty(count, dtype=index_type)
    starts[0] = 0
    starts[1:] = commas + 1
    del commas
    lengths = np.empty(count, dtype=index_type)  # then: the grouping key
    lengths[:-1] = starts[1:]
    lengths[-1] = size + 1
    lengths -= starts
    lengths -= 1
    if lengths.min() <= 0:
        raise _NotFast  # an empty element
    integer = dtype in INT_TYPES
    fraction = None  # digits after the dot (0: no dot)
    dots = np.flatnonzero(data == 46)
    if dots.size:
        if integer:
            raise _NotFast  # a non-integer for an integer input: the old path's error
        fraction = np.zeros(count, dtype=index_type)
        owner = np.searchsorted(starts, dots, "right") - 1  # the number each is in
        if np.any(owner[1:] == owner[:-1]):
            raise _NotFast  # two dots in one number
        fraction[owner] = starts[owner] + lengths[owner] - dots - 1
        if np.any(fraction[owner] == 0):
            raise _NotFast  # "1."
        del owner
    del dots
    slow = lengths > _MAX_GROUPED_LENGTH
    np.minimum(lengths, _MAX_GROUPED_LENGTH, out=lengths)
    key = lengths
    key *= 128
    if fraction is not None:
        np.minimum(fraction, 63, out=fraction)
        fraction *= 2
        key += fraction
        del fraction
    key += data[starts] == 45  # negative
    key[slow] = 0
    key = key.astype(np.uint16)
    out = np.empty(count, dtype=INT_TYPES[dtype][0] if integer else FLOAT_TYPES[dtype])
    for base in range(0, count, _GROUP_ROWS):  # bounds the row indices (8 bytes each)
        keys = key[base: base + _GROUP_ROWS]
        for group_key in np.flatnonzero(np.bincount(keys)).tolist():
            if group_key == 0:
                continue  # too long: read one by one below
            rows = np.flatnonzero(keys == group_key)
            rows += base
            _parse_group(data, starts, rows, group_key, dtype, out, slow)
    del key
    with np.errstate(over="ignore"):  # beyond float32: inf, as the proto field stores it
        _parse_slow(text, starts, np.flatnonzero(slow).tolist(), integer, out)
    return out


def _parse_slow(text, starts, indices, integer: bool, out) -> None:
    for index in indices:
        end = int(starts[index + 1]) - 1 if index + 1 < starts.size else len(text)
        if integer:
            raise _NotFast
        token = text[int(starts[index]): end]
        if not _TOKEN.fullmatch(token):
            raise _NotFast
        if _INTEGER_TOKEN.fullmatch(token) and len(token) <= 21:
            value = float(int(token))  # the old path's JSON integer, then float
        else:
            value = float(token)
        if np.isinf(value):
            raise _NotFast  # beyond the double range: the old path's error
        out[index] = value


_MAX_GROUPED_LENGTH = 40
_GROUP_ROWS = 1 << 15
_GROUP_CHARS = 1 << 17  # bounds a group's gathered block (~10 bytes a character)


def _parse_group(data, starts, rows, key: int, dtype: int, out, slow) -> None:
    length, fraction, negative = key >> 7, (key >> 1) & 63, key & 1
    dot = length - 1 - fraction if fraction else -1
    integer_digits = (dot if fraction else length) - negative
    if integer_digits < 1:
        raise _NotFast  # "-", ".5", "-.5"
    is_digit = np.ones(length, dtype=bool)
    is_digit[:negative] = False
    if fraction:
        is_digit[dot] = False
    digits = int(is_digit.sum())
    integer = dtype in INT_TYPES
    if integer and digits > 18:
        raise _NotFast  # near int64's edges: the old path's business
    if fraction > 22:
        slow[rows] = True
        return
    # 10**k on the digits, 0 on '-' and '.'; past 19 digits the leading ones must be 0
    # ("0.0038603513967245817": 23 digits, 17 significant), or Python reads the number
    columns = np.flatnonzero(is_digit)
    lead = columns[: max(0, digits - 19)]
    weights = np.zeros(length, dtype=np.uint64)
    weights[columns[lead.size:]] = _P10_INT[: digits - lead.size][::-1]
    windows = sliding_window_view(data, length)  # row i: the characters from i on
    step = max(1, _GROUP_CHARS // length)
    for first in range(0, rows.size, step):
        part = rows[first: first + step]
        block = windows[starts[part]] - np.uint8(48)  # (n, length): digit values
        bad = (block >= 10) & is_digit
        plain = ~np.any(bad, axis=1) if bad.any() else None  # None: all of them
        del bad
        if integer_digits > 1:
            zero = block[:, negative] == 0
            if np.any(zero if plain is None else zero & plain):
                raise _NotFast  # a leading zero
        if lead.size:
            too_long = np.any(block[:, lead] != 0, axis=1)
            plain = ~too_long if plain is None else plain & ~too_long
        mantissa = block @ weights
        del block
        if integer:
            _, low, high = INT_TYPES[dtype]
            if plain is not None:
                raise _NotFast  # an exponent or not JSON: the old path's business
            values = mantissa.astype(np.int64)
            if negative:
                np.negative(values, out=values)
            if values.min() < low or values.max() > high:
                raise _NotFast
            out[part] = values
            continue
        values = mantissa.astype(np.float64)
        if fraction:
            values /= _P10_FLOAT[fraction]  # exact operands: correctly rounded
            if negative:
                np.negative(values, out=values)
        elif negative:
            np.negative(values, out=values, where=mantissa != 0)  # JSON -0 is int 0
        inexact = mantissa > _TWO_53
        if dtype == types_pb2.DT_FLOAT:
            # Beyond 2**53 the double is within ~2 ulp of the correctly rounded one; the
            # float32 cast agrees unless a float32 rounding midpoint is that close.
            low_bits = (values.view(np.uint64) & np.uint64((1 << 29) - 1)).astype(np.int64)
            inexact &= np.abs(low_bits - (1 << 28)) <= 64
        out[part] = values
        if plain is not None:
            inexact |= ~plain
        slow[part[inexact]] = True
