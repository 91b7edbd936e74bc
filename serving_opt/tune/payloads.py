"""The requests the load generator sends: Predict over gRPC, ``:predict`` over REST.

Built once, serialized once, from the same inputs the profile measured (``--examples``
when given, else synthesized from the signature): several distinct requests of
``rows_per_request`` rows each, cycled by the clients. gRPC carries numbers as
``tensor_content`` (what ``tf.make_tensor_proto`` writes, as production clients do);
REST carries the columnar ``inputs`` form, strings as ``{"b64": ...}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import numpy as np

from serving_opt.tune.load import PREDICT_METHOD, Target
from serving_opt.tune.profile import feeds_for

DISTINCT_REQUESTS = 8


def build(model_dir: str, model_name: str, version: int, signature: str,
          rows_per_request: int, tags: Sequence[str] = ("serve",),
          examples: str | None = None, seed: int = 0) -> tuple[tuple[bytes, ...],
                                                               tuple[bytes, ...]]:
    """(serialized PredictRequests, REST JSON bodies), DISTINCT_REQUESTS of each."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    feed, _ = feeds_for(model_dir, signature, rows_per_request * DISTINCT_REQUESTS, tags,
                        examples, seed)
    grpc_out, rest_out = [], []
    for i in range(DISTINCT_REQUESTS):
        part = {alias: value[i * rows_per_request:(i + 1) * rows_per_request]
                if np.ndim(value) else value for alias, value in feed.items()}
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.version.value = version
        request.model_spec.signature_name = signature
        for alias, value in part.items():
            request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
        grpc_out.append(request.SerializeToString())
        body = {"signature_name": signature,
                "inputs": {alias: _json_value(value) for alias, value in part.items()}}
        rest_out.append(json.dumps(body, separators=(",", ":")).encode())
    return tuple(grpc_out), tuple(rest_out)


def _json_value(value):
    value = np.asarray(value)
    if value.dtype == object or value.dtype.kind in "SU":
        flat = [{"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode())
                 .decode()} for v in value.ravel()]
        return np.array(flat, dtype=object).reshape(value.shape).tolist()
    if value.dtype.kind == "f":
        # Seven significant digits: a float32 survives the round trip closely enough for
        # load (answers are not compared here), at half the JSON of full precision.
        return np.vectorize(lambda x: float(f"{x:.7g}"), otypes=[object])(value).tolist() \
            if value.size <= 4096 else np.round(value.astype(np.float64), 6).tolist()
    if value.dtype.kind == "b":
        return value.tolist()
    return value.astype(np.int64).tolist()


def targets(address: str, rest_address: str | None, model_name: str, version: int,
            payloads: tuple[tuple[bytes, ...], tuple[bytes, ...]],
            rows_per_request: int) -> dict[str, Target]:
    """The load generator's targets for a running server, by protocol."""
    out = {"grpc": Target("grpc", address, PREDICT_METHOD, payloads[0], rows_per_request)}
    if rest_address:
        out["rest"] = Target("rest", rest_address,
                             f"/v1/models/{model_name}/versions/{version}:predict",
                             payloads[1], rows_per_request)
    return out
