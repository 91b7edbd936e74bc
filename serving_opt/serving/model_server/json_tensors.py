"""Predict's numeric tensors straight from the JSON text to numpy, no Python object tree.

A REST body is mostly one thing: nested lists of numbers (images, embeddings, features).
Parsing those with ``json.loads`` costs ~48 bytes of memory per body byte and a Python
object per number. This module finds each bracketed run of number characters in the
body, checks it as a JSON array (rectangular, valid JSON numbers) with byte-string
operations, and parses the numbers with vectorised numpy (a per-token Python ``float``
only where exactness needs it). The rest of the body, a small "skeleton" in which each
run is a placeholder string, goes through the same :func:`~.json_read.parse_json`.

Fast or not, the answer is the old path's: :func:`fast_predict_tensors` returns None
(and the caller runs the Python-object path, which also produces every error text)
unless the body is one the old path accepts *and* decodes to the same arrays: same
values bit for bit (a float is the correctly rounded double of its text, then cast as
the proto's float field does; a JSON integer ``-0`` is ``+0.0``), dtypes and shapes.

Example:
    >>> infos = {"x": TensorInfo(dtype=DT_FLOAT)}
    >>> signature, tensors, fmt = fast_predict_tensors(b'{"instances": [[1, 2.5]]}', lambda s: infos,
    ...                                     min_bytes=0)
    >>> values, shape, dtype = tensors["x"]
    >>> fmt, values.tolist(), shape
    ('row', [1.0, 2.5], [1, 2])
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from tensorflow.core.framework import types_pb2

from serving_opt.serving.model_server.json_read import parse_json
from serving_opt.serving.model_server.status import ServingStatusError
from serving_opt.serving.model_server.tensors import MAX_DIMENSIONS

# Below this a body is parsed the ordinary way: the fast path's fixed costs win nothing.
MIN_FAST_BYTES = 2048

# A '[' ... ']' run of the characters a numeric JSON array can hold.
_BLOCK = re.compile(rb"\[[-0-9eE.+,\[\] \t\r\n]*\]")
_PLACEHOLDER = "\x00"
_NUMBER_CHARS = b"0123456789.eE+-"
_WHITESPACE = b" \t\r\n"
# number chars -> 'd', whitespace -> ' ', the rest as they are
_CLASSES = bytes(
    ord("d") if c in _NUMBER_CHARS else ord(" ") if c in _WHITESPACE else c for c in range(256)
)
_TOKEN = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_INTEGER_TOKEN = re.compile(rb"-?(?:0|[1-9][0-9]*)")
_P10_INT = np.array([10**i for i in range(20)], dtype=np.uint64)
_P10_FLOAT = np.array([10.0**i for i in range(23)])  # exact doubles
_TWO_53 = np.uint64(2**53)
_CHUNK_CHARS = 1 << 17  # bounds the per-character temporaries (~20 bytes a character)

_FLOATS = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64}
# integer dtypes: numpy type, and the range the old path accepts *and* stores unchanged
# (narrow ints are checked against int32 upstream, then truncated: outside their own
# range the old path is used)
_INTS = {
    types_pb2.DT_INT32: (np.int32, -(2**31), 2**31 - 1),
    types_pb2.DT_INT64: (np.int64, -(2**63), 2**63 - 1),
    types_pb2.DT_INT16: (np.int16, -(2**15), 2**15 - 1),
    types_pb2.DT_INT8: (np.int8, -(2**7), 2**7 - 1),
    types_pb2.DT_UINT8: (np.uint8, 0, 2**8 - 1),
    types_pb2.DT_UINT32: (np.uint32, 0, 2**32 - 1),
    types_pb2.DT_UINT64: (np.uint64, 0, 2**63 - 1),
}


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
    if len(body) < min_bytes or b"\\u0000" in body:
        return None
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
            tensors[name] = _tensor(blocks[block(instances)], infos[name].dtype, 0)
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
                tensors[name] = _stacked(
                    [blocks[i] for i in columns[name]], infos[name].dtype
                )
        else:
            raise _NotFast
    elif "inputs" in doc and "instances" not in doc:
        fmt = "columnar"
        value = doc["inputs"]
        if isinstance(value, str):
            if len(names) != 1:
                raise _NotFast
            tensors[names[0]] = _tensor(blocks[block(value)], infos[names[0]].dtype, None)
        elif isinstance(value, dict) and not (len(value) == 1 and "b64" in value):
            for name in names:
                if name not in value:
                    raise _NotFast
                tensors[name] = _tensor(blocks[block(value[name])], infos[name].dtype, None)
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


def _tensor(text: bytes, dtype: int, outer: int | None):
    """One block as a TensorProto. ``outer`` 0: row format (``instances``, at least one
    row); None: columnar."""
    values, dims = decode_block(text, dtype)
    if outer is not None and dims[0] == 0:
        raise _NotFast
    return _proto(values, dims, dtype)


def _stacked(texts: list[bytes], dtype: int):
    parts = []
    shape = None
    for text in texts:
        values, dims = decode_block(text, dtype)
        if shape is None:
            shape = dims
        elif dims != shape:
            raise _NotFast
        parts.append(values)
    if len(shape) + 1 > MAX_DIMENSIONS:
        raise _NotFast
    return _proto(np.concatenate(parts), [len(texts), *shape], dtype)


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


def decode_block(text: bytes, dtype: int) -> tuple[np.ndarray, list[int]]:
    """A ``[...]`` run of number characters as (flat values, shape); raises _NotFast
    where it is not a rectangular JSON array of numbers the old path reads the same."""
    if dtype not in _FLOATS and dtype not in _INTS:
        raise _NotFast
    classes = text.translate(_CLASSES)
    if b" " in classes:
        view = np.frombuffer(classes, dtype=np.uint8)
        spaces = np.flatnonzero(view[1:] == 32)  # a space right after a number char?
        if np.any(view[spaces] == 100) and re.search(rb"d +d", classes):
            raise _NotFast  # whitespace inside a number: not JSON
        del view, spaces
        text = text.translate(None, _WHITESPACE)
        classes = classes.translate(None, b" ")
    # a '[' only after '[' or ',', a ']' only before ']' or ',' (empty elements are
    # found by parse_numbers, empty lists by _dims)
    view = np.frombuffer(classes, dtype=np.uint8)
    opens = np.flatnonzero(view[1:] == 91)
    before = view[opens]
    if not np.all((before == 91) | (before == 44)):
        raise _NotFast
    closes = np.flatnonzero(view[:-1] == 93)
    after = view[closes + 1]
    if not np.all((after == 93) | (after == 44)):
        raise _NotFast
    del view, opens, before, closes, after
    dims = _dims(classes.translate(None, b"d"))
    count = 1
    for d in dims:
        count *= d
    values = parse_numbers(text.translate(None, b"[]"), dtype)
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
    ``dtype``'s type, exactly as the old path would store them; raises _NotFast."""
    data = np.frombuffer(text, dtype=np.uint8)
    commas = np.flatnonzero(data == 44)
    starts = np.empty(commas.size + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = commas + 1
    del commas
    integer = dtype in _INTS
    out = np.empty(starts.size, dtype=_INTS[dtype][0] if integer else _FLOATS[dtype])
    first = 0
    while first < starts.size:
        last = int(np.searchsorted(starts, starts[first] + _CHUNK_CHARS, "right"))
        last = max(last, first + 1)
        begin = int(starts[first])
        stop = int(starts[last]) - 1 if last < starts.size else data.size
        _parse_chunk(text, data[begin:stop], starts[first:last] - begin, begin, dtype,
                     out[first:last])
        first = last
    return out


def _parse_chunk(text: bytes, chars: np.ndarray, starts: np.ndarray, offset: int,
                 dtype: int, out: np.ndarray) -> None:
    n = chars.size
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    ends[-1] = n
    if np.any(ends <= starts):
        raise _NotFast  # empty element
    digit = (chars - np.uint8(48)) < 10
    dot = chars == 46
    negative = chars[starts] == 45
    # the first digit of each number, the only '-' that is not an exponent's
    first = starts + negative
    if np.any(first >= ends):
        raise _NotFast
    if not np.all(digit[first]):
        raise _NotFast
    after_first = np.minimum(first + 1, n - 1)
    if np.any((chars[first] == 48) & (first + 1 < ends) & digit[after_first]):
        raise _NotFast  # a leading zero
    other = ~(digit | dot | (chars == 44))
    other[starts[negative]] = False
    # e, E, + and inner '-': an exponent; those numbers are checked and read one by one
    exponent = np.logical_or.reduceat(other, starts)
    del other
    dots = np.flatnonzero(dot)
    del dot
    if dots.size:
        if dots[0] == 0 or dots[-1] == n - 1:
            raise _NotFast
        if not (np.all(digit[dots - 1]) and np.all(digit[dots + 1])):
            raise _NotFast
    token_of_dot = np.searchsorted(starts, dots, "right") - 1
    if token_of_dot.size > 1 and np.any(token_of_dot[1:] == token_of_dot[:-1]):
        raise _NotFast  # two dots in one number
    fraction = np.zeros(starts.size, dtype=np.int64)
    fraction[token_of_dot] = ends[token_of_dot] - dots - 1
    has_dot = np.zeros(starts.size, dtype=bool)
    has_dot[token_of_dot] = True
    del dots, token_of_dot

    # the digits' values, weighted by their place in their number (exponent excluded:
    # those numbers are read below)
    cumulative = np.cumsum(digit, dtype=np.int32)
    digits = cumulative[ends - 1] - cumulative[starts] + digit[starts]
    first_digit = cumulative[starts] - digit[starts]  # index among all digits
    positions = np.flatnonzero(digit)
    del digit
    last_of_token = np.repeat(cumulative[ends - 1], digits)
    place = last_of_token - cumulative[positions]
    del cumulative, last_of_token
    slow = exponent | (digits > 19)
    np.minimum(place, 19, out=place)
    terms = (chars[positions] - np.uint8(48)).astype(np.uint64)
    terms *= _P10_INT[place]
    del place, positions
    mantissa = np.add.reduceat(terms, first_digit)
    del terms

    if dtype in _INTS:
        _, low, high = _INTS[dtype]
        if np.any(has_dot) or np.any(exponent) or np.any(digits > 18):
            raise _NotFast  # a non-integer (an error) or near int64's edges
        values = mantissa.astype(np.int64)
        np.negative(values, out=values, where=negative)
        if values.size and (values.min() < low or values.max() > high):
            raise _NotFast
        out[...] = values
        return
    small = fraction <= 22
    slow |= ~small
    exact = mantissa <= _TWO_53
    values = mantissa.astype(np.float64)
    values /= _P10_FLOAT[np.where(small, fraction, 0)]
    np.negative(values, out=values, where=negative & (has_dot | (mantissa != 0)))
    if dtype == types_pb2.DT_DOUBLE:
        slow |= ~exact
        out[...] = values
    else:
        # Beyond 2**53 the double is within ~2 ulp of the correctly rounded one; the
        # float32 cast agrees unless a float32 rounding midpoint is that close.
        low_bits = values.view(np.uint64) & np.uint64((1 << 29) - 1)
        near = np.abs(low_bits.astype(np.int64) - (1 << 28)) <= 64
        slow |= ~exact & near
        out[...] = values.astype(np.float32)
    for index in np.flatnonzero(slow):
        token = text[offset + int(starts[index]): offset + int(ends[index])]
        if not _TOKEN.fullmatch(token):
            raise _NotFast
        if _INTEGER_TOKEN.fullmatch(token) and len(token) <= 21:
            value = float(int(token))  # the old path's JSON integer, then float
        else:
            value = float(token)
        if np.isinf(value):
            raise _NotFast  # beyond the double range: the old path's error
        with np.errstate(over="ignore"):
            out[index] = value  # beyond float32: inf, as the proto field stores it
