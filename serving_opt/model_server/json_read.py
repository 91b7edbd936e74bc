"""A REST request as TF Serving reads it: the URL's model spec and the body's JSON document.

The body is parsed like rapidjson with ``kParseStopWhenDoneFlag``: parsing stops after
the first JSON value (trailing bytes are ignored), ``NaN`` and ``Infinity`` are accepted,
integers beyond uint64 become doubles and numbers beyond the double range are refused;
an error is rapidjson's ``GetParseError_En`` text with its offset ("JSON Parse error:
The document is empty"). The value must be an object.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

from serving_opt.model_server.json_write import debug_string
from serving_opt.model_server.status import ServingStatusError, invalid_argument

INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)

# Python's json messages -> rapidjson's GetParseError_En texts.
_PARSE_ERRORS = (
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
)
# uint64's 20 digits; JSON forbids leading zeros, so a longer integer is beyond it.
_UINT64_DIGITS = 20
# Only a number with 309+ digits or a 3-digit exponent can be beyond the double range;
# only a body holding one pays for a Python call per float.
_MAYBE_TOO_BIG = re.compile(r"[0-9]{309}|[eE][-+]?[0-9]{3}")
_NUMBER_CHARS = "0123456789.eE+-"


class _NumberTooBig(Exception):
    """A JSON number beyond the double range (rapidjson kParseErrorNumberTooBig)."""

    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


# What one JSON value decoded as Python objects costs while a request is served: its list
# slot and object (~50 bytes), its proto element (~40) and its decoded tensor element
# (up to 72 for a string): a body's values times this must fit --max_request_bytes.
JSON_VALUE_BYTES = 160
# The Python-object path's own ceiling, whatever the budget.
MAX_OBJECT_TREE_VALUES = 1 << 22


def check_object_tree(body: bytes, max_bytes: int, max_values: int = MAX_OBJECT_TREE_VALUES,
                      name: str = "json_read.MAX_OBJECT_TREE_VALUES") -> None:
    """Refuses, before decoding, a body whose values (about its commas and colons: an
    object member costs a value more) would cost more than ``max_bytes`` as Python
    objects, or number more than ``max_values``."""
    if len(body) * JSON_VALUE_BYTES // 2 <= max_bytes and len(body) <= max_values:
        return  # a value takes at least 2 bytes ("0,"): nothing to count
    values = body.count(b",") + body.count(b":") + 1
    if values > max_values:
        raise invalid_argument(
            f"JSON body has about {values} values, over the {max_values} ({name}) this "
            "server decodes as Python objects; only tensors sent as plain nested lists of "
            "numbers are decoded without it, up to --max_request_bytes"
        )
    if values * JSON_VALUE_BYTES > max_bytes:
        raise invalid_argument(
            f"JSON body has about {values} values, ~{JSON_VALUE_BYTES} bytes each once "
            f"decoded: over the {max_bytes}-byte limit (--max_request_bytes); send fewer "
            "values, tensors of numbers as plain nested lists, or raise the limit"
        )


def parse_json(body: bytes) -> dict:
    """``ParseJson``: the body's first JSON value, which must be an object."""
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_argument(
            f"JSON Parse error: Invalid encoding in string. at offset: {e.start}"
        ) from None
    start = len(text) - len(text.lstrip(" \t\r\n"))
    if start == len(text):
        raise invalid_argument(f"JSON Parse error: The document is empty. at offset: {start}")
    if _MAYBE_TOO_BIG.search(text):
        decoder = json.JSONDecoder(parse_int=_int_or_double, parse_float=_double)
    else:
        decoder = json.JSONDecoder(parse_int=_int_or_double)
    try:
        doc, _ = decoder.raw_decode(text, start)  # kParseStopWhenDoneFlag
    except json.JSONDecodeError as e:
        raise _parse_error(e, text) from None
    except _NumberTooBig as e:
        offset = _number_offset(text, start, e.literal)
        raise invalid_argument(
            f"JSON Parse error: Number too big to be stored in double. at offset: {offset}"
        ) from None
    except RecursionError:
        raise invalid_argument("JSON Parse error: Terminate parsing due to Handler error. "
                               "at offset: 0") from None
    if not isinstance(doc, dict):
        raise invalid_argument(f"JSON Value: {debug_string(doc)} Is not object")
    return doc


def json_type(value) -> str:
    """rapidjson's type name of a parsed value, as error messages print it."""
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def signature_name(doc: dict) -> str | None:
    """The document's ``signature_name``, None when it has none; it must be a string."""
    if "signature_name" not in doc:
        return None
    if not isinstance(doc["signature_name"], str):
        raise invalid_argument(
            f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' key "
            "must be a string value."
        )
    return doc["signature_name"]


def fill_model_spec(spec, name: str, version: int | None, label: str | None) -> None:
    """``FillModelSpecWithNameVersionAndLabel``: the URL's model, version or label."""
    spec.name = name
    if version is not None and label is not None:
        raise invalid_argument(
            f"Both model version ({version}) and model version label ({label}) cannot be "
            "supplied."
        )
    if version is not None:
        spec.version.value = version
    if label is not None:
        spec.version_label = label


# ------------------------------------------------------------------ rapidjson's numbers


def _int_or_double(text: str):
    # rapidjson stores integers beyond uint64 as doubles, and refuses those beyond the
    # double range. The digit count is checked first: int() of a 5000-digit literal
    # raises Python's own ValueError (the 4300-digit limit).
    if len(text) - text.startswith("-") <= _UINT64_DIGITS:
        value = int(text)
        if INT64[0] <= value <= UINT64[1]:
            return value
    return _double(text)


def _double(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NumberTooBig(text)
    return value


# ------------------------------------------------------------------ rapidjson's errors


def _parse_error(error: json.JSONDecodeError, text: str) -> ServingStatusError:
    message = "Invalid value."
    for prefix, rapid in _PARSE_ERRORS:
        if error.msg.startswith(prefix):
            message = rapid
            break
    else:
        if error.msg.startswith("Expecting ',' delimiter"):
            # Which bracket is open decides rapidjson's wording.
            opener = _innermost_open(text[: error.pos])
            message = (
                "Missing a comma or '}' after an object member."
                if opener == "{"
                else "Missing a comma or ']' after an array element."
            )
    return invalid_argument(f"JSON Parse error: {message} at offset: {error.pos}")


def _outside_strings(text: str, start: int = 0) -> Iterator[int]:
    """The positions from ``start`` on of the characters outside JSON strings (quotes
    excluded), read as a JSON scanner reads them (``\\"`` does not end a string)."""
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        else:
            yield i


def _innermost_open(prefix: str) -> str:
    stack: list[str] = []
    for i in _outside_strings(prefix):
        ch = prefix[i]
        if ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _number_offset(text: str, start: int, literal: str) -> int:
    """Where ``literal`` first stands as a number token (outside strings) after ``start``."""
    end = len(literal)
    for i in _outside_strings(text, start):
        if (
            text.startswith(literal, i)
            and (i == 0 or text[i - 1] not in _NUMBER_CHARS)
            and (text[i + end: i + end + 1] or " ") not in _NUMBER_CHARS
        ):
            return i
    return start
