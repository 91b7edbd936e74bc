"""JSON <-> TF Serving requests and responses, as tensorflow_serving/util/json_tensor.cc does it.

The REST API turns a JSON body into the same proto request the gRPC API receives
(``PredictRequest``, ``ClassificationRequest``, ``RegressionRequest``) and the proto
response back into JSON, so both protocols run the same code and give the same answers.
This module is the API rest.py uses; the work is done, one idea a module, by:

* :mod:`.json_read`: the body's JSON document as rapidjson parses it (the first value
  only, ``NaN``/``Infinity`` accepted, rapidjson's error texts; an empty body is "JSON
  Parse error: The document is empty") and the URL's model spec;
* :mod:`.json_write`: JSON text as rapidjson's PrettyWriter writes it (4-space indent,
  one-line rows, ``WriteDecimal``'s floats) and the error, status and metadata answers;
* :mod:`.json_dtypes`: one codec per dtype between JSON values and TensorProto values
  (integers must be JSON integers for integer dtypes, any number is accepted for floats,
  ``{"b64": ...}`` for strings; ``_bytes`` outputs written as b64);
* :mod:`.json_predict`: Predict's row (``instances`` / ``predictions``) and columnar
  (``inputs`` / ``outputs``) formats;
* :mod:`.json_examples`: classify and regress (``examples``, ``context``, ``results``).

Errors are ``{"error": "<message>"}``.
"""

from __future__ import annotations

from serving_opt.model_server.json_dtypes import (
    BYTES_SUFFIX,
    decode_b64,
    dtype_string,
    is_b64,
)
from serving_opt.model_server.json_examples import (
    classify_response_json,
    parse_classify_regress_request,
    regress_response_json,
)
from serving_opt.model_server.json_predict import (
    COLUMNAR,
    ROW,
    parse_predict_request,
    predict_response_json,
)
from serving_opt.model_server.json_read import fill_model_spec, parse_json
from serving_opt.model_server.json_write import (
    Raw,
    SingleLine,
    debug_string,
    decimal,
    dumps,
    error_json,
    metadata_response_json,
    status_response_json,
)

__all__ = [
    "BYTES_SUFFIX",
    "COLUMNAR",
    "ROW",
    "Raw",
    "SingleLine",
    "classify_response_json",
    "debug_string",
    "decimal",
    "decode_b64",
    "dtype_string",
    "dumps",
    "error_json",
    "fill_model_spec",
    "is_b64",
    "metadata_response_json",
    "parse_classify_regress_request",
    "parse_json",
    "parse_predict_request",
    "predict_response_json",
    "regress_response_json",
    "status_response_json",
]
