"""Predict's numeric tensors decoded by simdjson: the body's numbers straight to numpy.

simdjson (``pysimdjson``) validates the whole body and parses every number into its
C++ "tape" (correctly rounded doubles, 64-bit integers); ``Array.as_buffer`` then copies
a nested numeric array into one flat buffer without a Python object per number. What
``as_buffer`` does not check, this module does:

* rectangularity: ``as_buffer`` flattens ragged arrays silently, so the body's
  bracket/comma skeleton (its bytes without number characters, whitespace and string
  contents) must equal the skeleton the decoded shapes imply, for the whole document;
  that also proves every element of a tensor is a number (a string, ``true`` or an object
  would leave a trace in the skeleton);
* the old path's types and ranges: integer dtypes take JSON integers only (``as_buffer``
  with ``of_type='i'`` refuses doubles) within :data:`INT_TYPES`' range; a JSON integer
  ``-0`` is simdjson's integer 0, so ``+0.0`` for floats, as in the old path.

Anything else (not an object, duplicate keys, a BOM, trailing bytes, ``NaN``, integers
beyond 64 bits, an unknown key holding an array or object, empty or ragged arrays, b64
objects, other dtypes) returns None: the caller decodes the body another way, and the
Python-object path writes every error text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from tensorflow.core.framework import types_pb2

try:
    import simdjson
except ImportError:  # a --serving_version runtime venv made before serving-opt needed it
    simdjson = None  # the numpy reader (json_numeric.py) decodes alone, as fast as it can

from serving_opt.model_server.status import ServingStatusError
from serving_opt.model_server.tensors import MAX_DIMENSIONS

FLOAT_TYPES = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64}
# integer dtypes: numpy type, and the range the old path accepts *and* stores unchanged
# (narrow ints are checked against int32 upstream, then truncated: outside their own
# range the old path is used; uint64 beyond int64 is left to it too)
INT_TYPES = {
    types_pb2.DT_INT32: (np.int32, -(2**31), 2**31 - 1),
    types_pb2.DT_INT64: (np.int64, -(2**63), 2**63 - 1),
    types_pb2.DT_INT16: (np.int16, -(2**15), 2**15 - 1),
    types_pb2.DT_INT8: (np.int8, -(2**7), 2**7 - 1),
    types_pb2.DT_UINT8: (np.uint8, 0, 2**8 - 1),
    types_pb2.DT_UINT32: (np.uint32, 0, 2**32 - 1),
    types_pb2.DT_UINT64: (np.uint64, 0, 2**63 - 1),
}

# simdjson's memory while it decodes, in bytes: a padded copy of the body, 16 tape bytes
# a number (8 per bracket), 4 per structural character (number, comma, bracket), the
# 8-byte flat buffer and the skeletons. Measured (benchmarks/rest_decode.py) it stays
# under body + 40 a number.
BYTES_PER_NUMBER = 40

# Whitespace and the characters of JSON numbers: what the skeleton leaves out. A string
# keeps its quotes and backslashes (no JSON escape letter is a number character), so
# _STRING still finds every string in it.
_NOT_SKELETON = b"0123456789.eE+- \t\r\n"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPENS_OBJECT = re.compile(rb"[ \t\r\n]*\{")  # simdjson would skip a BOM; rapidjson not
_SIMDJSON_ERRORS = (ValueError, RuntimeError, TypeError, KeyError, IndexError)
_COMMA = ord(",")
_COUNT_SLICE = 1 << 20


class _NotSimd(Exception):
    """The body is not one this module decodes exactly: use another path."""


def simd_memory(body: bytes) -> int:
    """Roughly the most memory, in bytes, :func:`simd_predict_tensors` takes for ``body``
    besides the body itself (one number per comma).
    """
    return len(body) + BYTES_PER_NUMBER * (_commas(body) + 1)


def _commas(body: bytes) -> int:
    # Vectorised, ~10x bytes.count's one-byte search; in slices, so the temporary mask
    # stays small whatever the body's size.
    data = np.frombuffer(body, dtype=np.uint8)
    return sum(int(np.count_nonzero(data[i:i + _COUNT_SLICE] == _COMMA))
               for i in range(0, data.size, _COUNT_SLICE))


def simd_predict_tensors(body: bytes, input_infos: Callable[[str], object]):
    """``(signature_name or None, {alias: (values, shape, dtype)}, "row" | "columnar")``
    decoded with simdjson, or None where this module cannot promise the old path's
    arrays (the caller then decodes ``body`` another way).
    """
    if simdjson is None or not _OPENS_OBJECT.match(body):
        return None
    try:
        return _decode(body, input_infos)
    except (_NotSimd, ServingStatusError, *_SIMDJSON_ERRORS):
        return None


def _decode(body: bytes, input_infos):
    # A parser per body: its buffers (several times the body) are freed on return, and
    # no two requests share one (a parser is not thread-safe).
    parser = simdjson.Parser()
    doc = parser.parse(body)
    try:
        signature, tensors, fmt, skeleton = _tensors(doc, input_infos)
    finally:
        del doc, parser  # every proxy holds the parser's document
    actual = _STRING.sub(b'""', body.translate(None, _NOT_SKELETON))
    if actual != skeleton:
        raise _NotSimd  # ragged, or not numbers only, somewhere
    return signature, tensors, fmt


def _tensors(doc, input_infos):
    if not isinstance(doc, simdjson.Object):
        raise _NotSimd
    # keys, then values one by one: items() and values() build Python objects of it all
    keys = list(doc)
    if len(set(keys)) != len(keys):
        raise _NotSimd  # duplicate keys: Python's json keeps the last, simdjson the first
    values = {key: doc[key] for key in keys}
    signature = values.get("signature_name")
    if signature is not None and not isinstance(signature, str):
        raise _NotSimd
    if ("instances" in values) == ("inputs" in values):
        raise _NotSimd
    infos = dict(input_infos(signature or ""))
    names = sorted(infos)
    if not names:
        raise _NotSimd
    tensors: dict = {}
    skeletons: dict[str, bytes] = {}
    if "instances" in values:
        fmt = "row"
        skeletons["instances"] = _instances(values["instances"], infos, names, tensors)
    else:
        fmt = "columnar"
        skeletons["inputs"] = _inputs(values["inputs"], infos, names, tensors)
    skeleton = b"{" + b",".join(
        b'"":' + (skeletons[key] if key in skeletons else _scalar(values[key]))
        for key in keys
    ) + b"}"
    return signature, tensors, fmt, skeleton


def _instances(instances, infos, names: list[str], tensors: dict) -> bytes:
    if not isinstance(instances, simdjson.Array) or len(instances) == 0:
        raise _NotSimd
    if not isinstance(instances[0], simdjson.Object):
        if len(names) != 1:
            raise _NotSimd
        values, shape, skeleton = _array(instances, infos[names[0]].dtype)
        tensors[names[0]] = (values, shape, infos[names[0]].dtype)
        return skeleton
    parts: dict[str, list] = {name: [] for name in names}
    shapes: dict[str, list[int]] = {}
    skeletons = []
    for element in instances:
        if not isinstance(element, simdjson.Object):
            raise _NotSimd
        keys = list(element.keys())
        if sorted(keys) != names or (len(keys) == 1 and keys[0] == "b64"):
            raise _NotSimd  # missing, extra or duplicate names, or a b64 object
        inner = []
        for key in keys:
            values, shape, skeleton = _array(element[key], infos[key].dtype)
            if shapes.setdefault(key, shape) != shape or len(shape) + 1 > MAX_DIMENSIONS:
                raise _NotSimd
            parts[key].append(values)
            inner.append(b'"":' + skeleton)
        skeletons.append(b"{" + b",".join(inner) + b"}")
    for name in names:
        values = parts[name][0] if len(parts[name]) == 1 else np.concatenate(parts[name])
        tensors[name] = (values, [len(instances), *shapes[name]], infos[name].dtype)
    return b"[" + b",".join(skeletons) + b"]"


def _inputs(value, infos, names: list[str], tensors: dict) -> bytes:
    if isinstance(value, simdjson.Array):
        if len(names) != 1:
            raise _NotSimd
        values, shape, skeleton = _array(value, infos[names[0]].dtype)
        tensors[names[0]] = (values, shape, infos[names[0]].dtype)
        return skeleton
    if not isinstance(value, simdjson.Object):
        raise _NotSimd
    keys = list(value)
    if len(set(keys)) != len(keys) or keys == ["b64"] or not set(names) <= set(keys):
        raise _NotSimd
    inner = []
    for key in keys:
        item = value[key]
        if key in infos:
            values, shape, skeleton = _array(item, infos[key].dtype)
            tensors[key] = (values, shape, infos[key].dtype)
            inner.append(b'"":' + skeleton)
        else:
            inner.append(b'"":' + _scalar(item))  # ignored by the old path, as here
    return b"{" + b",".join(inner) + b"}"


def _scalar(value) -> bytes:
    """The skeleton of a value no tensor is read from: a string, number or literal (an
    array or object there is left to the old path, which must parse it too)."""
    if isinstance(value, str):
        return b'""'
    if value is True:
        return b"tru"
    if value is False:
        return b"fals"
    if value is None:
        return b"null"
    if isinstance(value, (int, float)):
        return b""
    raise _NotSimd


def _array(array, dtype: int) -> tuple[np.ndarray, list[int], bytes]:
    """A rectangular numeric JSON array as (flat values, shape, expected skeleton); the
    shape is read from the first elements, the skeleton check proves the rest."""
    if not isinstance(array, simdjson.Array):
        raise _NotSimd
    shape = []
    item = array
    while isinstance(item, simdjson.Array):
        if len(item) == 0 or len(shape) == MAX_DIMENSIONS:
            raise _NotSimd  # empty lists, or deeper than a tensor: the old path's business
        shape.append(len(item))
        item = item[0]
    count = int(np.prod(shape, dtype=np.int64))
    if dtype in FLOAT_TYPES:
        values = np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)
        if FLOAT_TYPES[dtype] is np.float32:
            with np.errstate(over="ignore"):  # beyond float32: inf, as the proto field
                values = values.astype(np.float32)
    elif dtype in INT_TYPES:
        numpy_type, low, high = INT_TYPES[dtype]
        values = np.frombuffer(array.as_buffer(of_type="i"), dtype=np.int64)
        if values.size and (values.min() < low or values.max() > high):
            raise _NotSimd
        if numpy_type is not np.int64:
            values = values.astype(numpy_type)
    else:
        raise _NotSimd
    if values.size != count:
        raise _NotSimd  # ragged (the skeleton check would say so too)
    skeleton = b"[" + b"," * (shape[-1] - 1) + b"]"
    for size in reversed(shape[:-1]):
        skeleton = b"[" + b",".join([skeleton] * size) + b"]"
    return values, shape, skeleton
