"""The model name a serialized TF Serving request names, read from protobuf's wire
format without its classes: ``model_spec`` is field 1 of Predict/Classify/Regress/
GetModelMetadata/GetModelStatus requests and of each MultiInference task (field 1 of
MultiInferenceRequest), and ``name`` is field 1 of ModelSpec.
"""

from __future__ import annotations

# Fields looked at per message: past this many the request is not one a client makes,
# and the name seen so far routes it (the sandbox it reaches parses it for real).
MAX_FIELDS = 100_000
_LENGTH_DELIMITED = 2


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated or overlong varint")


def _field_1(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """The (start, end) of each length-delimited field 1 of the message in data[start:end]."""
    found = []
    pos = start
    for _ in range(MAX_FIELDS):
        if pos >= end:
            break
        key, pos = _varint(data, pos, end)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, pos = _varint(data, pos, end)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        elif kind == _LENGTH_DELIMITED:
            length, pos = _varint(data, pos, end)
            if number == 1:
                found.append((pos, pos + length))
            pos += length
        else:  # groups: no TF Serving request has one
            raise ValueError(f"wire type {kind}")
        if pos > end:
            raise ValueError("field past the end of its message")
    return found


def _spec_name(data: bytes, spans: list[tuple[int, int]]) -> str:
    # Repeated occurrences of a message field merge, and the last name wins, as a parse.
    name = b""
    for start, end in spans:
        for name_start, name_end in _field_1(data, start, end):
            name = data[name_start:name_end]
    return name.decode("utf-8")


def model_name(request: bytes, multi_inference: bool = False) -> str | None:
    """The model the request names; None when it names none, is malformed, or (a
    MultiInference request) its tasks name different models."""
    try:
        spans = _field_1(request, 0, len(request))
        if not multi_inference:
            return _spec_name(request, spans) or None
        names = {_spec_name(request, _field_1(request, start, end)) for start, end in spans}
    except (ValueError, UnicodeDecodeError):
        return None
    return names.pop() or None if len(names) == 1 else None
