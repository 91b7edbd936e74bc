"""JSON <-> TF Serving requests and responses, as tensorflow_serving/util/json_tensor.cc does it.

The REST API turns a JSON body into the same proto request the gRPC API receives
(``PredictRequest``, ``ClassificationRequest``, ``RegressionRequest``) and the proto
response back into JSON, so both protocols run the same code and give the same answers.
Behaviour kept from upstream (what clients notice):

* parsing stops after the first JSON value (trailing bytes are ignored), ``NaN`` and
  ``Infinity`` are accepted; an empty body is "JSON Parse error: The document is empty";
* ``instances`` (row format: one entry per example, batched along a new first dimension,
  every entry the same shape) or ``inputs`` (columnar: whole tensors); a string input may be
  ``{"b64": "..."}``; integers must be JSON integers for integer dtypes, any number is
  accepted for floats;
* row-format answers need every output to have the same batch size ("Tensor name: x has
  inconsistent batch size: 2 expecting: 3"); outputs of dtype string whose name ends in
  ``_bytes`` are written as ``{"b64": ...}``, other strings raw; int64 as JSON integers;
  floats with six significant digits when that round-trips, else ``max_digits10``
  (9 for float, 17 for double), whole numbers with ``.0``, ``NaN`` / ``Infinity`` /
  ``-Infinity`` as bare tokens (not strict JSON, like upstream);
* classify/regress bodies: ``examples`` (a list of feature dicts; a JSON float becomes a
  float_list, an integer or bool an int64_list, a string or b64 object a bytes_list) and an
  optional ``context`` example; answers ``{"results": ...}``;
* errors are ``{"error": "<message>"}``.

Output is pretty-printed like rapidjson's PrettyWriter (4-space indent; arrays inside a
row-format prediction or classification on one line). Where C++ iterates a protobuf map
(whose order is unspecified) this module uses sorted names.

Example:
    >>> request, fmt = parse_predict_request(b'{"instances": [[1.0, 2.0]]}', "m", None,
    ...                                      None, lambda sig: signature.inputs)
    >>> predict_response_json(response.outputs, fmt)
    b'{\\n    "predictions": [\\n        [0.25, 0.75]\\n    ]\\n}'
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable

import numpy as np

from serving_opt.serving.model_server.status import (
    ServingStatusError,
    internal,
    invalid_argument,
    unimplemented,
)

ROW = "row"
COLUMNAR = "columnar"
BYTES_SUFFIX = "_bytes"
_MAX_DEBUG_BYTES = 256
_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)


class Raw:
    """A number already formatted (written unquoted, as rapidjson's RawValue)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def dtype_string(dtype: int) -> str:
    """TF ``DataTypeString``: ``float``, ``int64``, ``string``, ``half``...

    Example:
        >>> dtype_string(1)
        'float'
    """
    from tensorflow.core.framework import types_pb2

    try:
        name = types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"unknown dtype enum ({dtype})"
    return name[3:].lower() if name.startswith("DT_") else name


# ----------------------------------------------------------------------------- writing


def _escape(value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
    out = bytearray(b'"')
    for byte in raw:
        if byte == 0x22:
            out += b'\\"'
        elif byte == 0x5C:
            out += b"\\\\"
        elif byte < 0x20:
            out += {8: b"\\b", 9: b"\\t", 10: b"\\n", 12: b"\\f", 13: b"\\r"}.get(
                byte, b"\\u%04X" % byte
            )
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


class SingleLine(list):
    """A list written on one line (rapidjson ``kFormatSingleLineArray``), nested lists too."""


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


def debug_string(value) -> str:
    """``JsonValueToDebugString``: one-line arrays, cut at 256 bytes (errors only)."""
    return dumps(_single_lines(value), _MAX_DEBUG_BYTES).decode("utf-8", "replace")


def _single_lines(value, depth: int = 0):
    # Below _MAX_DEBUG_BYTES levels nothing is printed (every level writes a byte): not
    # descending further keeps a deeply nested request from overflowing the stack.
    if depth > _MAX_DEBUG_BYTES:
        return SingleLine()
    if isinstance(value, dict):
        return {k: _single_lines(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return SingleLine(_single_lines(v, depth + 1) for v in value)
    return value


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


# ----------------------------------------------------------------------------- parsing

# Python's json messages -> rapidjson's GetParseError_En texts.
_PARSE_ERRORS = (
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
)


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


def _innermost_open(prefix: str) -> str:
    stack: list[str] = []
    in_string = escaped = False
    for ch in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


class _NumberTooBig(Exception):
    """A JSON number beyond the double range (rapidjson kParseErrorNumberTooBig)."""

    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


# uint64's 20 digits; JSON forbids leading zeros, so a longer integer is beyond it.
_UINT64_DIGITS = 20
# Only a number with 309+ digits or a 3-digit exponent can be beyond the double range;
# only a body holding one pays for a Python call per float.
_MAYBE_TOO_BIG = re.compile(r"[0-9]{309}|[eE][-+]?[0-9]{3}")


def _int_or_double(text: str):
    # rapidjson stores integers beyond uint64 as doubles, and refuses those beyond the
    # double range. The digit count is checked first: int() of a 5000-digit literal
    # raises Python's own ValueError (the 4300-digit limit).
    if len(text) - text.startswith("-") <= _UINT64_DIGITS:
        value = int(text)
        if _INT64[0] <= value <= _UINT64[1]:
            return value
    return _double(text)


def _double(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NumberTooBig(text)
    return value


def _number_offset(text: str, start: int, literal: str) -> int:
    """Where ``literal`` first stands as a number token (outside strings) after ``start``."""
    in_string = escaped = False
    number_chars = "0123456789.eE+-"
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
        elif (
            text.startswith(literal, i)
            and (i == 0 or text[i - 1] not in number_chars)
            and (text[i + len(literal): i + len(literal) + 1] or " ") not in number_chars
        ):
            return i
    return start


def parse_json(body: bytes) -> dict:
    """``ParseJson``: the body's first JSON value, which must be an object.

    Example:
        >>> parse_json(b'{"instances": [1]} trailing bytes are ignored')
        {'instances': [1]}
    """
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


def _json_type(value) -> str:
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


def _type_error(value, dtype: int) -> ServingStatusError:
    return invalid_argument(
        f"JSON Value: {debug_string(value)} Type: {_json_type(value)} is not of expected "
        f"type: {dtype_string(dtype)}"
    )


def _is_int(value, bounds) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and bounds[0] <= value <= bounds[1]
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_b64(value) -> bool:
    """``{"b64": "<string>"}`` and nothing else."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def decode_b64(value) -> bytes:
    if not is_b64(value):
        raise invalid_argument(
            f"JSON Value: {debug_string(value)} not formatted correctly for base64 data"
        )
    text = value["b64"]
    try:
        # absl::Base64Unescape accepts standard and URL-safe alphabets, padding optional.
        cleaned = text.replace("-", "+").replace("_", "/").rstrip("=")
        return base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_argument("Unable to base64 decode") from None


def _add_value(value, dtype: int, tensor) -> None:
    from tensorflow.core.framework import types_pb2 as t

    if dtype in (t.DT_FLOAT, t.DT_DOUBLE):
        if not _is_number(value):
            raise _type_error(value, dtype)
        (tensor.float_val if dtype == t.DT_FLOAT else tensor.double_val).append(float(value))
    elif dtype in (t.DT_INT32, t.DT_INT16, t.DT_INT8, t.DT_UINT8):
        if not _is_int(value, _INT32):
            raise _type_error(value, dtype)
        tensor.int_val.append(value)
    elif dtype == t.DT_STRING:
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        tensor.string_val.append(value.encode("utf-8", "surrogatepass"))
    elif dtype == t.DT_INT64:
        if not _is_int(value, _INT64):
            raise _type_error(value, dtype)
        tensor.int64_val.append(value)
    elif dtype == t.DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        tensor.bool_val.append(value)
    elif dtype == t.DT_UINT32:
        if not _is_int(value, _UINT32):
            raise _type_error(value, dtype)
        tensor.uint32_val.append(value)
    elif dtype == t.DT_UINT64:
        if not _is_int(value, _UINT64):
            raise _type_error(value, dtype)
        tensor.uint64_val.append(value)
    else:
        raise unimplemented(
            f"Conversion of JSON Value: {debug_string(value)} to type: {dtype_string(dtype)}"
        )


def _dense_shape(value, outer_dims: int = 0) -> list[int]:
    """The shape the first elements describe; lists nested deeper than a tensor's 254
    dimensions (counting ``outer_dims`` around them) are INVALID_ARGUMENT, before the
    recursive fill could overflow the stack on them."""
    from serving_opt.serving.model_server.tensors import MAX_DIMENSIONS

    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if len(shape) + outer_dims > MAX_DIMENSIONS:
            raise invalid_argument(
                f"JSON lists nested more than {MAX_DIMENSIONS - outer_dims} deep; a tensor has "
                f"at most {MAX_DIMENSIONS} dimensions"
            )
        if not value:
            break
        value = value[0]
    return shape


def _fill(value, level: int, dtype: int, tensor, shape: list[int]) -> int:
    """``FillTensorProto``: appends the values; returns how many."""
    from tensorflow.core.framework import types_pb2 as t

    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(
                f"JSON Value: {debug_string(value)} found at incorrect level: {level + 1} in "
                f"the JSON DOM. Expected at level: {rank}"
            )
        if isinstance(value, dict):
            if dtype != t.DT_STRING:
                raise _type_error(value, dtype)
            tensor.string_val.append(decode_b64(value))
        else:
            _add_value(value, dtype, tensor)
        return 1
    if level >= rank:
        raise invalid_argument(
            f"Encountered list at unexpected level: {level} expected < {rank}"
        )
    if len(value) != shape[level]:
        raise invalid_argument(
            f"Encountered list at unexpected size: {len(value)} at level: {level} expected "
            f"size: {shape[level]}"
        )
    return sum(_fill(v, level + 1, dtype, tensor, shape) for v in value)


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _tensors_from_instances(instances: list, infos) -> dict:
    from tensorflow.core.framework import tensor_pb2

    names = sorted(infos)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )

    def is_object(v) -> bool:
        return isinstance(v, dict) and not is_b64(v)

    objects = is_object(instances[0])
    tensors: dict = {}
    sizes: dict[str, int] = {}
    shapes: dict[str, list[int]] = {}

    def add(item, name: str) -> None:
        if name not in infos:
            raise invalid_argument(f"JSON object: does not have named input: {name}")
        tensor = tensors.setdefault(name, tensor_pb2.TensorProto())
        shape = _dense_shape(item, outer_dims=1)  # instances add the batch dimension
        size = _fill(item, 0, infos[name].dtype, tensor, shape)
        if name not in sizes:
            sizes[name], shapes[name] = size, shape
        elif sizes[name] != size:
            raise invalid_argument(f"Expecting tensor size: {sizes[name]} but got: {size}")
        elif shapes[name] != shape:
            raise invalid_argument(
                f"Expecting shape {_shape_text(shapes[name])} but got: {_shape_text(shape)}"
            )

    for index, element in enumerate(instances):
        if objects:
            if not is_object(element):
                raise invalid_argument(
                    f"Expecting object but got list at item {index} of input list"
                )
            for name, item in element.items():
                try:
                    add(item, name)
                except ServingStatusError as e:
                    raise invalid_argument(
                        f"Failed to process element: {index} key: {name} of 'instances' "
                        f"list. Error: {e.to_text()}"
                    ) from None
            if set(element) != set(names):
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{debug_string(element)} keys must be equal to: {','.join(names)}"
                )
        else:
            if is_object(element):
                raise invalid_argument(
                    f"Expecting value/list but got object at item {index} of input list"
                )
            try:
                add(element, names[0])
            except ServingStatusError as e:
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. Error: "
                    f"{e.to_text()}"
                ) from None
    for name, tensor in tensors.items():
        tensor.dtype = infos[name].dtype
        tensor.tensor_shape.Clear()
        for size in [len(instances), *shapes[name]]:
            tensor.tensor_shape.dim.add(size=size)
    return tensors


def _tensor(value, dtype: int):
    from tensorflow.core.framework import tensor_pb2

    tensor = tensor_pb2.TensorProto(dtype=dtype)
    shape = _dense_shape(value)
    for size in shape:
        tensor.tensor_shape.dim.add(size=size)
    _fill(value, 0, dtype, tensor, shape)
    return tensor


def _tensors_from_inputs(value, infos) -> dict:
    names = sorted(infos)
    if not isinstance(value, dict) or is_b64(value):
        if len(names) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: _tensor(value, infos[names[0]].dtype)}
    tensors = {}
    for name in names:
        if name not in value:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        tensors[name] = _tensor(value[name], infos[name].dtype)
    return tensors


def _signature_name(doc: dict) -> str | None:
    if "signature_name" not in doc:
        return None
    if not isinstance(doc["signature_name"], str):
        raise invalid_argument(
            f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' key "
            "must be a string value."
        )
    return doc["signature_name"]


def fill_model_spec(spec, name: str, version: int | None, label: str | None) -> None:
    """``FillModelSpecWithNameVersionAndLabel``."""
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


def parse_predict_request(
    body: bytes,
    name: str,
    version: int | None,
    label: str | None,
    input_infos: Callable[[str], object],
):
    """``FillPredictRequestFromJson``: (PredictRequest, ROW or COLUMNAR).

    ``input_infos(signature_name)`` returns the signature's inputs map (it raises for an
    unknown model or signature, like the C++ ``GetInfoMap``).
    """
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    fill_model_spec(request.model_spec, name, version, label)
    doc = parse_json(body)
    signature = _signature_name(doc)
    if signature is not None:
        request.model_spec.signature_name = signature
    infos = dict(input_infos(request.model_spec.signature_name))
    if not infos:
        raise invalid_argument(
            "Failed to get input map for signature: "
            f"{request.model_spec.signature_name or 'DEFAULT'}"
        )
    if "instances" in doc:
        if "inputs" in doc:
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only one "
                "of 'inputs' or 'instances' keys to exist "
            )
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} Expecting 'instances' to be an list/array"
            )
        if not instances:
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} No values in 'instances' array"
            )
        tensors, fmt = _tensors_from_instances(instances, infos), ROW
    elif "inputs" in doc:
        tensors, fmt = _tensors_from_inputs(doc["inputs"], infos), COLUMNAR
    else:
        raise invalid_argument("Missing 'inputs' or 'instances' key")
    for alias, tensor in tensors.items():
        request.inputs[alias].CopyFrom(tensor)
    return request, fmt


def _feature_kind_error(name: str, feature) -> ServingStatusError:
    kind = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}.get(
        feature.WhichOneof("kind"), "UNKNOWN"
    )
    return invalid_argument(f"Unexpected element type in feature: {name} expecting type: {kind}")


def _add_feature_value(value, name: str, feature) -> None:
    kind = feature.WhichOneof("kind")

    def need(wanted: str) -> None:
        if kind not in (None, wanted):
            raise _feature_kind_error(name, feature)

    def unexpected() -> ServingStatusError:
        return invalid_argument(
            f"Feature: {name} has element with unexpected JSON type: {_json_type(value)}"
        )

    if value is None or isinstance(value, list):
        raise unexpected()
    if isinstance(value, bool):
        need("int64_list")
        feature.int64_list.value.append(1 if value else 0)
    elif isinstance(value, dict):
        if not is_b64(value):
            raise unexpected()
        need("bytes_list")
        feature.bytes_list.value.append(decode_b64(value))
    elif isinstance(value, str):
        need("bytes_list")
        feature.bytes_list.value.append(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, float):
        need("float_list")
        feature.float_list.value.append(value)
    else:
        need("int64_list")
        if value > _INT64[1]:
            raise invalid_argument(
                f"Feature: {name} has uint64_t element. Only int64_t is supported."
            )
        feature.int64_list.value.append(value)


def _example(value, example) -> None:
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        feature.Clear()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(item, name, feature)


def parse_classify_regress_request(request, body: bytes) -> None:
    """``FillClassificationRequestFromJson`` / ``FillRegressionRequestFromJson``."""
    doc = parse_json(body)
    signature = _signature_name(doc)
    if signature is not None:
        request.model_spec.signature_name = signature
    has_context = "context" in doc
    if has_context:
        _example(doc["context"], request.input.example_list_with_context.context)
    examples = doc.get("examples")
    if "examples" not in doc:
        raise invalid_argument(
            f"JSON Value: {debug_string(doc)} When method is classify, key 'examples' is "
            "expected and was not found"
        )
    if not isinstance(examples, list):
        raise invalid_argument(
            f"JSON Value: {debug_string(doc)} Expecting 'examples' value to be an list/array"
        )
    if not examples:
        raise invalid_argument(
            f"JSON Value: {debug_string(doc)} 'examples' value is an empty array"
        )
    target = (
        request.input.example_list_with_context.examples
        if has_context
        else request.input.example_list.examples
    )
    for value in examples:
        _example(value, target.add())


# ----------------------------------------------------------------------------- answers


def _values(tensor) -> tuple[list, int]:
    """The flat values of a response TensorProto as JSON-ready items."""
    from tensorflow.core.framework import types_pb2 as t

    dtype = tensor.dtype
    if dtype == t.DT_FLOAT:
        return [decimal(v) for v in tensor.float_val], dtype
    if dtype == t.DT_DOUBLE:
        return [decimal(v, double=True) for v in tensor.double_val], dtype
    if dtype in (t.DT_INT32, t.DT_INT16, t.DT_INT8, t.DT_UINT8):
        return list(tensor.int_val), dtype
    if dtype == t.DT_INT64:
        return list(tensor.int64_val), dtype
    if dtype == t.DT_BOOL:
        return list(tensor.bool_val), dtype
    if dtype == t.DT_UINT32:
        return list(tensor.uint32_val), dtype
    if dtype == t.DT_UINT64:
        return list(tensor.uint64_val), dtype
    if dtype == t.DT_STRING:
        return list(tensor.string_val), dtype
    raise invalid_argument(f"Failed to write JSON value for tensor type: {dtype_string(dtype)}")


def _nest(name: str, tensor, first_dim: int):
    """The tensor as nested lists from dimension ``first_dim`` on, one item per leading row."""
    from tensorflow.core.framework import types_pb2 as t

    values, dtype = _values(tensor)
    if dtype == t.DT_STRING:
        as_bytes = name.endswith(BYTES_SUFFIX)
        values = [
            {"b64": base64.b64encode(v).decode("ascii")} if as_bytes else v for v in values
        ]
    shape = [d.size for d in tensor.tensor_shape.dim]
    if int(np.prod(shape, dtype=np.int64)) > len(values):
        raise invalid_argument(
            f"Failed to write JSON value for tensor type: {dtype_string(dtype)}"
        )
    position = 0

    def build(dim: int):
        nonlocal position
        if dim >= len(shape):
            position += 1
            return values[position - 1]
        return [build(dim + 1) for _ in range(shape[dim])]

    if first_dim == 0:
        return build(0)
    return [build(1) for _ in range(shape[0])]


def predict_response_json(outputs, fmt: str) -> bytes:
    """``MakeJsonFromTensors``: ``{"predictions": [...]}`` (row) or ``{"outputs": ...}``."""
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    multiple = len(names) > 1
    if fmt == COLUMNAR:
        if multiple:
            return dumps({"outputs": {n: _nest(n, outputs[n], 0) for n in names}})
        return dumps({"outputs": _nest(names[0], outputs[names[0]], 0)})
    if fmt != ROW:
        raise invalid_argument("Invalid request format")
    batch = -1
    for name in names:
        dims = outputs[name].tensor_shape.dim
        if not dims:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and dims[0].size != batch:
            raise invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {dims[0].size} expecting: "
                f"{batch}"
            )
        batch = dims[0].size
    rows = {n: _nest(n, outputs[n], 1) for n in names}
    predictions = []
    for i in range(max(batch, 0)):
        if multiple:
            predictions.append({n: _one_line(rows[n][i]) for n in names})
        else:
            predictions.append(_one_line(rows[names[0]][i]))
    return dumps({"predictions": predictions})


def _one_line(value):
    return SingleLine(_single_lines(value)) if isinstance(value, list) else value


def classify_response_json(result) -> bytes:
    """``MakeJsonFromClassificationResult``: ``{"results": [[[label, score], ...], ...]}``."""
    if not result.classifications:
        raise invalid_argument("Cannot convert empty ClassificationResults to JSON")
    results = [
        SingleLine(SingleLine([c.label, decimal(c.score)]) for c in item.classes)
        for item in result.classifications
    ]
    return dumps({"results": results})


def regress_response_json(result) -> bytes:
    """``MakeJsonFromRegressionResult``: ``{"results": [v, ...]}``."""
    if not result.regressions:
        raise invalid_argument("Cannot convert empty RegressionResults to JSON")
    return dumps({"results": SingleLine(decimal(r.value) for r in result.regressions)})


def error_json(message: str) -> bytes:
    """``MakeJsonFromStatus``: ``{"error": "<message>"}``."""
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
