"""JSON text as TF Serving's REST API writes it: rapidjson's PrettyWriter and WriteDecimal.

Answers are pretty-printed with a 4-space indent and ``": "``; a :class:`SingleLine` list
(rapidjson ``kFormatSingleLineArray``, used for a row of a row-format prediction or a
classification) is written on one line, nested lists too. Floats are written by
:func:`decimal` (six significant digits when that round-trips, else ``max_digits10``;
whole numbers with ``.0``; ``NaN`` / ``Infinity`` / ``-Infinity`` as bare tokens, not
strict JSON, like upstream). Bytes that are not valid UTF-8 pass through unescaped.
Errors are ``{"error": "<message>"}``; model status and metadata are protobuf's JSON.
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


class Array:
    """A dense array of numbers already formatted: ``texts`` (flat, row-major) written as
    the nested lists of ``shape`` would be (one line each if ``single``). A float output of
    thousands of values is written with string joins, not a Python object per value."""

    __slots__ = ("texts", "shape", "single")

    def __init__(self, texts: list[str], shape: tuple[int, ...], single: bool = False) -> None:
        self.texts = texts
        self.shape = tuple(shape)
        self.single = single


def _array_text(array: Array, depth: int, single: bool) -> str:
    # Innermost dimension first: each pass joins groups of `size` items into lists.
    items = array.texts
    groups = 1
    for size in array.shape[:-1]:
        groups *= size
    for level in range(len(array.shape) - 1, -1, -1):
        size = array.shape[level]
        if single:
            opener, separator, closer = "[", ", ", "]"
        else:
            indent = "\n" + "    " * (depth + level + 1)
            opener, separator = "[" + indent, "," + indent
            closer = "\n" + "    " * (depth + level) + "]"
        if size == 0:
            items = ["[]"] * groups
        else:
            items = [opener + separator.join(items[i:i + size]) + closer
                     for i in range(0, groups * size, size)]
        if level:
            groups //= array.shape[level - 1]
    return items[0]


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
        elif isinstance(v, Array):
            out.extend(_array_text(v, depth, single or v.single).encode())
        else:
            out.extend(_scalar(v))

    write(value, 0, False)
    return bytes(out)


def single_lines(value, depth: int = 0):
    """``value`` with every list a :class:`SingleLine` (a JSON value written on one line)."""
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
    """``JsonValueToDebugString``: one-line arrays, cut at 256 bytes (errors only)."""
    return dumps(single_lines(value), MAX_DEBUG_BYTES).decode("utf-8", "replace")


def decimal(value, double: bool = False) -> Raw:
    """``WriteDecimal``: %g with 6 digits if it round-trips, else max_digits10; ``.0`` added."""
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


def decimals(values: np.ndarray, double: bool = False) -> list[str]:
    """:func:`decimal`'s text of every value of ``values`` (float32, or float64 if
    ``double``), in bulk: the 6-digit form is checked for a round trip as one array."""
    exact = np.asarray(values, dtype=np.float64 if double else np.float32).ravel()
    if not exact.size:
        return []
    wide = exact.astype(np.float64).tolist()
    # One %-format of them all is ~2x a format call per value.
    texts = ("%.6g\n" * len(wide) % tuple(wide)).split("\n")[:-1]
    back = np.array(texts, dtype=np.float64)
    if not double:
        with np.errstate(over="ignore"):
            back = back.astype(np.float32)
    finite = np.isfinite(exact)
    for i in np.flatnonzero(finite & (back != exact)).tolist():
        texts[i] = ("%.17g" if double else "%.9g") % wide[i]
    for i in np.flatnonzero(~finite).tolist():
        texts[i] = decimal(wide[i]).text
    return [t if ("." in t or "e" in t or "N" in t or "I" in t) else t + ".0" for t in texts]


def error_json(message: str) -> bytes:
    """``MakeJsonFromStatus``: ``{"error": "<message>"}``.
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
    """GetModelStatusResponse as JSON (``ToJsonString``: fields with defaults printed)."""
    return _message_to_json(response, indent=1, ensure_ascii=False).encode("utf-8")


def metadata_response_json(response) -> bytes:
    """GetModelMetadataResponse as JSON: model_spec and the unpacked SignatureDefMap."""
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
