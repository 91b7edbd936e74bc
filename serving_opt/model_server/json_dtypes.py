"""JSON values <-> TensorProto values, one codec per dtype (json_tensor.cc's type switches).

A request value is checked against its input's dtype and appended to the TensorProto
field TF Serving fills (``AddValueToTensor``): floats and doubles take any JSON number,
integer dtypes only JSON integers within their range (bool is not an integer), bool only
``true``/``false``, strings a JSON string or ``{"b64": "..."}``. A response tensor's
values are written back (``WriteValue``): floats with :func:`~.json_write.decimal`,
integers and bools as they are, strings raw or, for an output whose name ends in
``_bytes``, as ``{"b64": ...}``. Other dtypes are UNIMPLEMENTED in a request and
INVALID_ARGUMENT in a response, as upstream.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass

from tensorflow.core.framework import types_pb2

from serving_opt.model_server.json_read import INT64, UINT64, json_type
from serving_opt.model_server.json_write import debug_string, decimal
from serving_opt.model_server.status import (
    ServingStatusError,
    invalid_argument,
    unimplemented,
)

BYTES_SUFFIX = "_bytes"
INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(bounds: tuple[int, int]) -> Callable[[object], bool]:
    def accepts(value) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and bounds[0] <= value <= bounds[1]
        )

    return accepts


def _boolean(value) -> bool:
    return isinstance(value, bool)


def _string(value) -> bool:
    return isinstance(value, str)


def _utf8(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def _decimal_double(value) -> object:
    return decimal(value, double=True)


@dataclass(frozen=True)
class Codec:
    """How one dtype's values travel between JSON and a TensorProto.

    ``field``: the TensorProto repeated field holding the values; ``accepts``: whether a
    parsed JSON value may become one; ``read``: the JSON value as the field's element
    (None: as it is); ``write``: an element as a JSON value (None: as it is); ``b64``:
    ``{"b64": ...}`` objects stand for values (strings only).
    """

    field: str
    accepts: Callable[[object], bool]
    read: Callable[[object], object] | None = None
    write: Callable[[object], object] | None = None
    b64: bool = False


_INT32_CODEC = Codec("int_val", _integer(INT32))
CODECS: dict[int, Codec] = {
    types_pb2.DT_FLOAT: Codec("float_val", _number, read=float, write=decimal),
    types_pb2.DT_DOUBLE: Codec("double_val", _number, read=float, write=_decimal_double),
    types_pb2.DT_INT32: _INT32_CODEC,
    types_pb2.DT_INT16: _INT32_CODEC,  # narrow ints are checked against int32, as upstream
    types_pb2.DT_INT8: _INT32_CODEC,
    types_pb2.DT_UINT8: _INT32_CODEC,
    types_pb2.DT_INT64: Codec("int64_val", _integer(INT64)),
    types_pb2.DT_UINT32: Codec("uint32_val", _integer(UINT32)),
    types_pb2.DT_UINT64: Codec("uint64_val", _integer(UINT64)),
    types_pb2.DT_BOOL: Codec("bool_val", _boolean),
    types_pb2.DT_STRING: Codec("string_val", _string, read=_utf8, b64=True),
}


def dtype_string(dtype: int) -> str:
    """TF ``DataTypeString``: ``float``, ``int64``, ``string``, ``half``..."""
    try:
        name = types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"unknown dtype enum ({dtype})"
    return name[3:].lower() if name.startswith("DT_") else name


def is_b64(value) -> bool:
    """``{"b64": "<string>"}`` and nothing else.
    """
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def decode_b64(value) -> bytes:
    """The bytes of a ``{"b64": ...}`` object (standard or URL-safe alphabet, padding
    optional, as ``absl::Base64Unescape``).
    """
    if not is_b64(value):
        raise invalid_argument(
            f"JSON Value: {debug_string(value)} not formatted correctly for base64 data"
        )
    text = value["b64"]
    try:
        cleaned = text.replace("-", "+").replace("_", "/").rstrip("=")
        return base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_argument("Unable to base64 decode") from None


def type_error(value, dtype: int) -> ServingStatusError:
    """A JSON value of the wrong type for ``dtype``."""
    return invalid_argument(
        f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected "
        f"type: {dtype_string(dtype)}"
    )


def add_value(value, dtype: int, tensor) -> None:
    """Appends one JSON scalar (or b64 object) to ``tensor`` as a ``dtype`` element."""
    codec = CODECS.get(dtype)
    if isinstance(value, dict):
        if codec is None or not codec.b64:
            raise type_error(value, dtype)
        getattr(tensor, codec.field).append(decode_b64(value))
        return
    if codec is None:
        raise unimplemented(
            f"Conversion of JSON Value: {debug_string(value)} to type: {dtype_string(dtype)}"
        )
    if not codec.accepts(value):
        raise type_error(value, dtype)
    getattr(tensor, codec.field).append(value if codec.read is None else codec.read(value))


def json_values(tensor, name: str) -> list:
    """The flat values of response tensor ``name`` as JSON-ready items."""
    codec = CODECS.get(tensor.dtype)
    if codec is None:
        raise invalid_argument(
            f"Failed to write JSON value for tensor type: {dtype_string(tensor.dtype)}"
        )
    values = getattr(tensor, codec.field)
    if codec.b64 and name.endswith(BYTES_SUFFIX):
        return [{"b64": base64.b64encode(v).decode("ascii")} for v in values]
    if codec.write is None:
        return list(values)
    return [codec.write(v) for v in values]
