"""Classify and regress over REST: JSON examples in, JSON results out (json_tensor.cc).

A request body holds ``examples``, a non-empty list of feature objects, and optionally a
``context`` example merged into each. A feature is one value or a list of them: a JSON
float goes to a ``float_list``, an integer or bool to an ``int64_list``, a string or
``{"b64": ...}`` object to a ``bytes_list``; one feature's values must agree on the
list. Answers are ``{"results": ...}``: per example a one-line list of
``[label, score]`` pairs (classify), or one value per example (regress).
"""

from __future__ import annotations

from serving_opt.model_server.json_dtypes import decode_b64, is_b64
from serving_opt.model_server.json_read import (
    INT64,
    check_object_tree,
    json_type,
    parse_json,
    signature_name,
)
from serving_opt.model_server.json_write import SingleLine, debug_string, decimal, dumps
from serving_opt.model_server.request_options import DEFAULT_MAX_REQUEST_BYTES
from serving_opt.model_server.status import invalid_argument

# A feature list's field -> the type name upstream's errors give it.
_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def parse_classify_regress_request(request, body: bytes,
                                   max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """``FillClassificationRequestFromJson`` / ``FillRegressionRequestFromJson``."""
    check_object_tree(body, max_bytes)
    doc = parse_json(body)
    signature = signature_name(doc)
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


def classify_response_json(result) -> bytes:
    """``MakeJsonFromClassificationResult``: ``{"results": [[[label, score], ...], ...]}``.
    """
    if not result.classifications:
        raise invalid_argument("Cannot convert empty ClassificationResults to JSON")
    results = [
        SingleLine(SingleLine([c.label, decimal(c.score)]) for c in item.classes)
        for item in result.classifications
    ]
    return dumps({"results": results})


def regress_response_json(result) -> bytes:
    """``MakeJsonFromRegressionResult``: ``{"results": [v, ...]}``.
    """
    if not result.regressions:
        raise invalid_argument("Cannot convert empty RegressionResults to JSON")
    return dumps({"results": SingleLine(decimal(r.value) for r in result.regressions)})


def _example(value, example) -> None:
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        feature.Clear()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(item, name, feature)


def _add_feature_value(value, name: str, feature) -> None:
    kind = _feature_kind(value, name)
    current = feature.WhichOneof("kind")
    if current not in (None, kind):
        raise invalid_argument(
            f"Unexpected element type in feature: {name} expecting type: "
            f"{_KIND_NAMES.get(current, 'UNKNOWN')}"
        )
    getattr(feature, kind).value.append(_feature_element(value, name))


def _feature_kind(value, name: str) -> str:
    """The feature list a JSON value goes to (bool before int: a bool is an int here)."""
    if value is None or isinstance(value, list) or (isinstance(value, dict)
                                                     and not is_b64(value)):
        raise invalid_argument(
            f"Feature: {name} has element with unexpected JSON type: {json_type(value)}"
        )
    if isinstance(value, bool):
        return "int64_list"
    if isinstance(value, (dict, str)):
        return "bytes_list"
    if isinstance(value, float):
        return "float_list"
    return "int64_list"


def _feature_element(value, name: str):
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, dict):
        return decode_b64(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, int) and value > INT64[1]:
        raise invalid_argument(
            f"Feature: {name} has uint64_t element. Only int64_t is supported."
        )
    return value
