"""Per-request settings every inference path needs (one place, not loose arguments)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from serving_opt.model_server.status import invalid_argument

DEFAULT_SIGNATURE = "serving_default"
METHOD_PREDICT = "tensorflow/serving/predict"
METHOD_CLASSIFY = "tensorflow/serving/classify"
METHOD_REGRESS = "tensorflow/serving/regress"
# TF Serving's gRPC message limit (std::numeric_limits<int32_t>::max()): by default a
# request may make the server hold as much as the biggest message it could have sent.
DEFAULT_MAX_REQUEST_BYTES = 2**31 - 1


@dataclass(frozen=True)
class RequestOptions:
    """``signature_method_name_check`` is ``--enable_signature_method_name_check`` (off in
    TF Serving, so Predict runs classify/regress signatures); ``timeout_ms`` is the session
    run timeout derived from the client's gRPC deadline (None: no timeout);
    ``max_request_bytes`` (``--max_request_bytes``, not a TF Serving flag) bounds, each
    checked before it is allocated: the message or REST body as received; its parsed form
    (gRPC: request_cost.parse_cost from the wire; REST JSON decoded as Python objects:
    ~160 bytes a value); and the decoded input tensors together (a short typed field is
    padded to its declared shape, so a few bytes can declare gigabytes; a string costs
    tensors.STRING_ELEMENT_BYTES plus its characters twice; an example batch likewise).
    So a request holds at most about 4x ``max_request_bytes`` (the session's copy of
    numeric feeds included), beside what the model itself allocates.
    """

    signature_method_name_check: bool = False
    timeout_ms: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # --enable_serialization_as_tensor_content: Predict outputs in tensor_content.
    tensor_content: bool = False

    def with_timeout(self, timeout_ms: int | None) -> RequestOptions:
        """A copy with another run timeout (one per request)."""
        return dataclasses.replace(self, timeout_ms=timeout_ms)


@dataclass(frozen=True)
class RestLimits:
    """How many REST connections may be open and how long each may wait (seconds).

    ``max_connections`` 0 picks ``min(1024, RLIMIT_NOFILE / 4)``: each connection holds a
    thread and a descriptor, and the sandbox's threads and descriptors must stay enough
    for gRPC and the model. Timeouts: ``idle`` for a keep-alive connection's next request
    to start, ``header`` for a whole request head once started, ``body`` for each read of
    a body; all three default to libevent's HTTP timeout (50 s), which upstream's
    evhttp front end applies to its reads and idle connections.
    """

    max_connections: int = 0
    idle_timeout_seconds: float = 50.0
    header_timeout_seconds: float = 50.0
    body_timeout_seconds: float = 50.0

    def connection_limit(self) -> int:
        if self.max_connections > 0:
            return self.max_connections
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return 1024
        return max(16, min(1024, soft // 4))


DEFAULT_REST_LIMITS = RestLimits()


def resolve_signature_name(name: str) -> str:
    """Empty means ``serving_default``, as in every TF Serving API."""
    return name or DEFAULT_SIGNATURE


def method_name_error(signature, method: str, kind: str):
    """The error for a signature of the wrong method (``kind``: classification, regression)."""
    return invalid_argument(f"Expected {kind} signature method_name to be {method}. "
                            f"Was: {signature.method_name}")


def find_method_signature(signature_defs, signature_name: str, options: RequestOptions,
                          method: str, kind: str, check_structure: Callable):
    """C++ ``GetClassificationSignatureDef`` / ``GetRegressionSignatureDef``: the named
    signature, checked for its method name when that check is on, else for the structure
    (``check_structure(signature, options)``) the API needs.
    """
    name = resolve_signature_name(signature_name)
    signature = signature_defs.get(name)
    if signature is None:
        raise invalid_argument(f"No signature was found with the name: {name}")
    if options.signature_method_name_check:
        if signature.method_name != method:
            raise method_name_error(signature, method, kind)
    else:
        check_structure(signature, options)
    return signature


def fill_model_spec(spec, name: str, signature_name: str | None, version: int | None) -> None:
    """C++ ``MakeModelSpec``: name, resolved signature (if given) and the version served."""
    spec.Clear()
    spec.name = name
    if signature_name is not None:
        spec.signature_name = resolve_signature_name(signature_name)
    if version is not None:
        spec.version.value = version
