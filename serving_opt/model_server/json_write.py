"""JSON text as TF Serving's REST API writes it: rapidjson's PrettyWriter and WriteDecimal.

Answers are pretty-printed with a 4-space indent and ``": "``; a :class:`SingleLine` list
(rapidjson ``kFormatSingleLineArray``, used for a row of a row-format prediction or a
classification) is written on one line, nested lists too. Floats are written by
:func:`decimal` (six significant digits when that round-trips, else ``max_digits10``;
whole numbers with ``.0``; ``NaN`` / ``Infinity`` / ``-Infinity`` as bare tokens, not
strict JSON, like upstream). Bytes that are not valid UTF-8 pass through unescaped.
Errors are ``{"error": "<message>"}``; model status and metadata are protobuf's JSON.

Example:
    >>> dumps({"predictions": [SingleLine([decimal(0.25), decimal(0.75)])]})
    b'{\\n    "predictions": [\\n        [0.25, 0.75]\\n    ]\\n}'
"""

from __future__ import annotations

import math

import numpy as np

from serving_opt.model_server.status import internal

# JsonValueToDebugString's cut: errors quote at most this many bytes of a request.
MAX_DEBUG_BYTES = 256
_CONTROL_ESCAPES = {8: b"\\b", 9: b"\\t", 10: b"\\n", 12: b"\\f", 13: b"\\r"}


class Raw:
    """A number already formatted (written unquoted, as rapidjson's RawValue)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class SingleLine(list):
    """A list written on one line (rapidjson ``kFormatSingleLineArray``), nested lists too."""


def _escape(value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
    out = bytearray(b'"')
    for byte in raw:
        if byte == 0x22:
            out += b'\\"'
        elif byte == 0x5C:
            out += b"\\\\"
        elif byte < 0x20:
            out += _CONTROL_ESCAPES.get(byte, b"\\u%04X" % byte)
        else:
            out.append(byte)  # like rapidjson: other bytes (UTF-8 or not) pass through
    out += b'"'
    return bytes(out)


def _scalar(value) -> bytes:
    if value is None:
        return b"null"
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, Raw):
        return value.text.encode()
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        if math.isnan(value):
            return b"NaN"
        if math.isinf(value):
            return b"Infinity" if value > 0 else b"-Infinity"
        return repr(value).encode()
    return _escape(value)


def dumps(value, limit: int | None = None) -> bytes:
    """Pretty JSON as rapidjson's PrettyWriter writes it (4 spaces, ``": "``).

    ``limit`` stops writing once that many bytes are out (JsonValueToDebugString).

    Example:
        >>> dumps({"a": SingleLine([1, 2])})
        b'{\\n    "a": [1, 2]\\n}'
    """
    out = bytearray()

    def full() -> bool:
        return limit is not None and len(out) >= limit

    def write(v, depth: int, single: bool) -> None:
        if full():
            return
        if isinstance(v, dict):
            if not v:
                out.extend(b"{}")
                return
            out.extend(b"{")
            for i, (key, item) in enumerate(v.items()):
                if full():
                    return
                out.extend(b"," if i else b"")
                out.extend(b"\n" + b"    " * (depth + 1))
                out.extend(_escape(key) + b": ")
                write(item, depth + 1, single)
            if not full():
                out.extend(b"\n" + b"    " * depth + b"}")
        elif isinstance(v, list):
            single = single or isinstance(v, SingleLine)
            if not v:
                out.extend(b"[]")
                return
            out.extend(b"[")
            for i, item in enumerate(v):
                if full():
                    return
                if single:
                    out.extend(b", " if i else b"")
                else:
                    out.extend(b"," if i else b"")
                    out.extend(b"\n" + b"    " * (depth + 1))
                write(item, depth + 1, single)
            if not full():
                out.extend(b"]" if single else b"\n" + b"    " * depth + b"]")
        else:
            out.extend(_scalar(v))

    write(value, 0, False)
    return bytes(out)


def single_lines(value, depth: int = 0):
    """``value`` with every list a :class:`SingleLine` (a JSON value written on one line).

    Example:
        >>> dumps(single_lines([[1], [2]]))
        b'[[1], [2]]'
    """
    # Below MAX_DEBUG_BYTES levels nothing is printed (every level writes a byte): not
    # descending further keeps a deeply nested request from overflowing the stack.
    if depth > MAX_DEBUG_BYTES:
        return SingleLine()
    if isinstance(value, dict):
        return {k: single_lines(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return SingleLine(single_lines(v, depth + 1) for v in value)
    return value


def debug_string(value) -> str:
    """``JsonValueToDebugString``: one-line arrays, cut at 256 bytes (errors only).

    Example:
        >>> debug_string({"instances": [[1, 2]]})
        '{\\n    "instances": [[1, 2]]\\n}'
    """
    return dumps(single_lines(value), MAX_DEBUG_BYTES).decode("utf-8", "replace")


def decimal(value, double: bool = False) -> Raw:
    """``WriteDecimal``: %g with 6 digits if it round-trips, else max_digits10; ``.0`` added.

    Example:
        >>> decimal(np.float32(0.1)).text, decimal(3.0).text, decimal(float("nan")).text
        ('0.1', '3.0', 'NaN')
    """
    value = float(value)
    if math.isnan(value):
        return Raw("NaN")
    if math.isinf(value):
        return Raw("-Infinity" if value < 0 else "Infinity")
    text = f"{value:.6g}"
    if double:
        if float(text) != value:
            text = f"{value:.17g}"
    elif np.float32(float(text)) != np.float32(value):
        text = f"{value:.9g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return Raw(text)


def error_json(message: str) -> bytes:
    """``MakeJsonFromStatus``: ``{"error": "<message>"}``.

    Example:
        >>> error_json("Missing 'inputs' or 'instances' key")
        b'{\\n    "error": "Missing \\'inputs\\' or \\'instances\\' key"\\n}'
    """
    return dumps({"error": message})


def _message_to_json(message, **kwargs) -> str:
    """``MessageToJson`` printing fields with default values, on protobuf 4 (TF 2.15's
    runtime) and 5+ alike: the keyword was renamed in protobuf 5."""
    from google.protobuf import json_format

    try:
        return json_format.MessageToJson(
            message, always_print_fields_with_no_presence=True, **kwargs)
    except TypeError:
        return json_format.MessageToJson(message, including_default_value_fields=True,
                                         **kwargs)


def status_response_json(response) -> bytes:
    """GetModelStatusResponse as JSON (``ToJsonString``: fields with defaults printed).

    Example:
        >>> status_response_json(response)[:2]
        b'{\\n'
    """
    return _message_to_json(response, indent=1, ensure_ascii=False).encode("utf-8")


def metadata_response_json(response) -> bytes:
    """GetModelMetadataResponse as JSON: model_spec and the unpacked SignatureDefMap.

    Example:
        >>> metadata_response_json(response).startswith(b'{\\n"model_spec":')
        True
    """
    from tensorflow_serving.apis import get_model_metadata_pb2

    def to_json(message) -> str:
        return _message_to_json(message, indent=1, preserving_proto_field_name=True,
                                ensure_ascii=False)

    if "signature_def" not in response.metadata:
        raise internal(
            "Failed to find 'signature_def' key in the GetModelMetadataResponse metadata map."
        )
    signatures = get_model_metadata_pb2.SignatureDefMap()
    if not response.metadata["signature_def"].Unpack(signatures):
        raise internal("Failed to unpack 'Any' object to 'SignatureDefMap'.")
    return (
        "{\n"
        f'"model_spec":{to_json(response.model_spec)},\n'
        f'"metadata": {{"signature_def": {to_json(signatures)}}}\n'
        "}\n"
    ).encode()
