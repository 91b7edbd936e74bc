"""The REST client side of validation: TF Serving's HTTP API on port 8501 (urllib only).

Many production clients speak only REST, and REST has failures of its own (row format
with outputs of different batch sizes, binary strings without ``_bytes``, int64 and
float precision in JSON, error bodies). The same probes gRPC sends (``requests.Probe``)
go over REST too, translated here:

  * Predict -> ``POST /v1/models/NAME/versions/V:predict`` with the columnar format
    (``{"signature_name": k, "inputs": {alias: nested lists}}``; strings always as
    ``{"b64": ...}``); the answer ``{"outputs": ...}`` is turned back into a
    PredictResponse whose tensors have the signature's dtypes, and the probe's own check
    runs on it. Floats: the server writes a float32 with as many digits as it needs to
    round-trip (JSON -> Python float64 -> float32 gives the same bits), so the answer is
    cast to the signature's dtype and compared with the same tolerances as gRPC.
  * Classify / Regress -> ``:classify`` / ``:regress`` with ``examples`` (each
    tf.Example as a feature dict: floats, integers, ``{"b64": ...}`` bytes); the
    ``results`` become a ClassificationResponse / RegressionResponse for the check.
  * MultiInference has no REST endpoint: not sent (``RestClient.prepare`` leaves it out).
  * ``wait_until_available``: ``GET /v1/models/NAME/versions/V`` until AVAILABLE;
    ``check_metadata``: ``GET .../metadata``'s SignatureDefMap against the SavedModel's.

``RestClient`` is the REST implementation of ``clients.ModelServerClient``.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from serving_opt.errors import ServingOptError
from serving_opt.serving.api import STATE_AVAILABLE, STATE_END, STATE_NAMES, serving_api
from serving_opt.serving.clients import ModelServerClient, compare_signature_maps, load_failure

if TYPE_CHECKING:
    from serving_opt.serving.process import ServerProcess
    from serving_opt.serving.requests import Probe


class RestError(Exception):
    """A REST call that did not answer 200: ``HTTP 400: <error body>`` (``code`` 400) or a
    connection failure (``code`` None)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RestProbe:
    """A probe as a REST call: path after ``/v1/models/``, JSON body, and the check."""

    name: str
    path: str
    body: bytes
    to_response: Callable[[dict], object]  # the JSON answer -> the gRPC response proto
    check: Callable[[object], str]


def _url(address: str, path: str) -> str:
    return f"http://{address}/v1/models/{path}"


def request_json(address: str, path: str, body: bytes | None, timeout: float) -> dict:
    """GET (body None) or POST ``/v1/models/<path>``; the JSON answer, or RestError."""
    request = urllib.request.Request(
        _url(address, path), data=body, method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read().decode("utf-8", errors="surrogateescape")
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", errors="replace")
        try:
            detail = json.loads(detail).get("error", detail)
        except (ValueError, AttributeError):
            pass
        raise RestError(f"HTTP {e.code}: {_one_line(str(detail))}", e.code) from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RestError(f"no answer: {reason}") from e
    try:
        return json.loads(text)  # NaN and Infinity as upstream writes them are accepted
    except ValueError as e:
        raise RestError(f"answer is not JSON ({e}): {_one_line(text)[:200]}") from e


def _one_line(text: str) -> str:
    return " ".join(text.split())


def version_state(address: str, model_name: str, version: int, timeout: float) -> tuple:
    """(state number, error message) of ``version`` from the REST model status."""
    from google.protobuf import json_format

    answer = request_json(address, f"{model_name}/versions/{version}", None, timeout)
    response = serving_api().get_model_status_pb2.GetModelStatusResponse()
    json_format.ParseDict(answer, response, ignore_unknown_fields=True)
    for status in response.model_version_status:
        if status.version == version:
            return status.state, status.status.error_message
    return None, ""


class RestClient(ModelServerClient):
    """TF Serving's REST API on one address (``/v1/models/...``, urllib: no connection
    is kept). MultiInference has no REST endpoint: :meth:`prepare` leaves it out.
    """

    protocol = "rest"
    available_check = "REST model AVAILABLE"
    metadata_check = "REST metadata signature_def"
    errors = (RestError,)

    def wait_until_available(self, server: ServerProcess | None, deadline_s: float) -> None:
        """Polls the REST model status until the version is AVAILABLE; raises on END, a
        dead server or the deadline (as ``GrpcClient.wait_until_available`` does).
        """
        model_name, version = self.model_name, self.version
        deadline = time.monotonic() + deadline_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if server is not None and server.exit_code() is not None:
                failure = load_failure(server.log_tail(200))
                raise ServingOptError(
                    f"the {server.backend} server exited with code {server.exit_code()} "
                    f"before version {version} was AVAILABLE over REST"
                    + (f": {failure}" if failure else ""),
                    "its log's last lines are in the validation report")
            try:
                state, message = version_state(self.address, model_name, version, 5)
            except RestError as e:
                # Not listening yet (no code), or the model not loaded yet (404, like
                # gRPC's NOT_FOUND): keep polling. Any other answer is the REST API failing.
                if e.code is not None and e.code not in (404, 503):
                    raise ServingOptError(f"the REST model status fails: {e}",
                                          "the server's REST API is broken; see its log") from e
                last = str(e)
                time.sleep(0.5)
                continue
            if state == STATE_AVAILABLE:
                return
            if state == STATE_END:
                raise ServingOptError(
                    f"the server failed to load {model_name} version {version} (REST "
                    f"status): {message or 'unloaded'}",
                    "fix the model; the server log has details")
            last = f"version {version} state {STATE_NAMES.get(state, state)}"
            time.sleep(0.5)
        raise ServingOptError(
            f"{model_name} version {version} was not AVAILABLE over REST within "
            f"{deadline_s:.0f} s ({last})", "raise --load_deadline, or check the server log")

    def check_metadata(self, served: dict) -> tuple[bool, str]:
        """The REST metadata's SignatureDefMap vs ``served``: (ok, detail)."""
        from google.protobuf import json_format

        answer = request_json(self.address,
                              f"{self.model_name}/versions/{self.version}/metadata", None,
                              self.timeout)
        signature_json = dict((answer.get("metadata") or {}).get("signature_def") or {})
        signature_json.pop("@type", None)
        signature_map = serving_api().get_model_metadata_pb2.SignatureDefMap()
        try:
            json_format.ParseDict(signature_json, signature_map)
        except json_format.ParseError as e:
            return False, f"metadata is not a SignatureDefMap: {_one_line(str(e))[:200]}"
        return compare_signature_maps(signature_map, served)

    def prepare(self, probes: Sequence[Probe], served: dict) -> list[RestProbe]:
        """The probes REST can send (all but MultiInference), as REST calls."""
        return [r for r in (to_rest(p, served) for p in probes) if r]

    def request(self, probe: RestProbe) -> dict:
        """POSTs ``probe``; the JSON answer (the load phase does not decode it)."""
        return request_json(self.address, probe.path, probe.body, self.timeout)

    def call(self, probe: RestProbe):
        """POSTs ``probe``; the answer as the gRPC response proto its check reads."""
        return probe.to_response(self.request(probe))

    def describe(self, error: BaseException) -> str:
        return str(error)


def to_rest(probe: Probe, served: dict) -> RestProbe | None:
    """The REST form of a probe, or None (MultiInference has no REST endpoint)."""
    request = probe.request
    if probe.method == "MultiInference":
        return None
    spec = request.model_spec
    path = f"{spec.name}/versions/{spec.version.value}:{probe.method.lower()}"
    if probe.method == "Predict":
        body = {"signature_name": spec.signature_name,
                "inputs": {alias: _tensor_json(tensor) for alias, tensor in
                           sorted(request.inputs.items())}}
        signature = served.get(spec.signature_name or "serving_default")
        to_response = _predict_response(signature, spec.signature_name)
    else:
        body = {"signature_name": spec.signature_name,
                "examples": [_example_json(e) for e in request.input.example_list.examples]}
        to_response = _classify_response if probe.method == "Classify" else _regress_response
    return RestProbe(f"REST {probe.name}", path, json.dumps(body).encode("utf-8"),
                     to_response, probe.check)


def _tensor_json(tensor_proto):
    import tensorflow as tf

    value = tf.make_ndarray(tensor_proto)
    if value.dtype == object or value.dtype.kind in "SU":
        return _b64_nested(value.tolist())
    if value.dtype == np.float16 or value.dtype.name == "bfloat16":
        value = value.astype(np.float32)
    return value.tolist()


def _b64_nested(value):
    if isinstance(value, list):
        return [_b64_nested(v) for v in value]
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return {"b64": base64.b64encode(raw).decode("ascii")}


def _example_json(example) -> dict:
    features = {}
    for name, feature in sorted(example.features.feature.items()):
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list" and feature.bytes_list.value:
            features[name] = [{"b64": base64.b64encode(v).decode("ascii")}
                              for v in feature.bytes_list.value]
        elif kind == "float_list" and feature.float_list.value:
            # float() of a float32 is exact; json writes it with a '.', so the server
            # reads a float_list, not an int64_list.
            features[name] = [float(v) for v in feature.float_list.value]
        elif kind == "int64_list" and feature.int64_list.value:
            features[name] = [int(v) for v in feature.int64_list.value]
    return features


def _from_json(value, dtype: int) -> np.ndarray:
    """A JSON tensor (nested lists; ``{"b64": ...}`` or raw strings) as an ndarray of the
    signature's dtype. Floats: float64 from JSON, cast back to float32 exactly."""
    import tensorflow as tf

    tf_dtype = tf.dtypes.as_dtype(dtype)
    if tf_dtype == tf.string:
        return np.array(_strings(value), dtype=object)
    return np.array(value, dtype=np.float64 if tf_dtype.is_floating else None).astype(
        tf_dtype.as_numpy_dtype)


def _strings(value):
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogateescape")
    return value


def _predict_response(signature, key: str):
    import tensorflow as tf

    def to_response(answer: dict):
        response = serving_api().predict_pb2.PredictResponse()
        response.model_spec.signature_name = key  # REST answers do not echo it
        if "outputs" not in answer:
            raise RestError(f"no 'outputs' in the answer (keys {sorted(answer)})")
        outputs = answer["outputs"]
        aliases = sorted(signature.outputs) if signature is not None else []
        if not (isinstance(outputs, dict) and not (len(outputs) == 1 and "b64" in outputs)):
            # One output: upstream writes its value without the alias.
            outputs = {aliases[0] if aliases else "output": outputs}
        for alias, value in outputs.items():
            dtype = signature.outputs[alias].dtype if signature is not None and \
                alias in signature.outputs else tf.float32.as_datatype_enum
            try:
                array = _from_json(value, dtype)
            except (ValueError, TypeError) as e:
                raise RestError(f"output {alias} is not a {tf.dtypes.as_dtype(dtype).name} "
                                f"tensor: {e}") from e
            response.outputs[alias].CopyFrom(tf.make_tensor_proto(array))
        return response

    return to_response


def _classify_response(answer: dict):
    response = serving_api().classification_pb2.ClassificationResponse()
    for row in answer.get("results", []):
        classifications = response.result.classifications.add()
        for label, score in row:
            cls = classifications.classes.add()
            cls.label = label
            cls.score = float(score)
    return response


def _regress_response(answer: dict):
    response = serving_api().regression_pb2.RegressionResponse()
    for value in answer.get("results", []):
        response.result.regressions.add().value = float(value)
    return response
