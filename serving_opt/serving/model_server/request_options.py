"""Per-request settings every inference path needs (one place, not loose arguments).

Example:
    >>> RequestOptions(timeout_ms=250).with_timeout(None).timeout_ms is None
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_SIGNATURE = "serving_default"
METHOD_PREDICT = "tensorflow/serving/predict"
METHOD_CLASSIFY = "tensorflow/serving/classify"
METHOD_REGRESS = "tensorflow/serving/regress"


@dataclass(frozen=True)
class RequestOptions:
    """``signature_method_name_check`` is ``--enable_signature_method_name_check`` (off in
    TF Serving, so Predict runs classify/regress signatures); ``timeout_ms`` is the session
    run timeout derived from the client's gRPC deadline (None: no timeout).

    Example:
        >>> RequestOptions(signature_method_name_check=True).signature_method_name_check
        True
    """

    signature_method_name_check: bool = False
    timeout_ms: int | None = None

    def with_timeout(self, timeout_ms: int | None) -> RequestOptions:
        """A copy with another run timeout (one per request)."""
        return dataclasses.replace(self, timeout_ms=timeout_ms)


def resolve_signature_name(name: str) -> str:
    """Empty means ``serving_default``, as in every TF Serving API.

    Example:
        >>> resolve_signature_name("")
        'serving_default'
    """
    return name or DEFAULT_SIGNATURE


def fill_model_spec(spec, name: str, signature_name: str | None, version: int | None) -> None:
    """C++ ``MakeModelSpec``: name, resolved signature (if given) and the version served.

    Example:
        >>> from tensorflow_serving.apis import model_pb2
        >>> spec = model_pb2.ModelSpec()
        >>> fill_model_spec(spec, "m", "", 3)
        >>> (spec.signature_name, spec.version.value)
        ('serving_default', 3)
    """
    spec.Clear()
    spec.name = name
    if signature_name is not None:
        spec.signature_name = resolve_signature_name(signature_name)
    if version is not None:
        spec.version.value = version
