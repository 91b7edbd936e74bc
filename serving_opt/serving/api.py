"""TF Serving's client API (grpc and the ``tensorflow_serving.apis`` protos), on first use.

grpc and tensorflow_serving are heavy and only validation needs them, so nothing here
is imported at ``import serving_opt``. The request builder (``requests``) and both
clients (``client``, ``rest_client``) take the protos from here, none from another.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

# ModelVersionStatus.State values (tensorflow_serving/apis/get_model_status.proto).
STATE_AVAILABLE = 30
STATE_END = 50
STATE_NAMES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING",
               50: "END"}


@dataclass(frozen=True)
class ServingApi:
    """The grpc module and the TF Serving API modules validation uses, by name."""

    grpc: ModuleType
    classification_pb2: ModuleType
    get_model_metadata_pb2: ModuleType
    get_model_status_pb2: ModuleType
    inference_pb2: ModuleType
    model_service_pb2_grpc: ModuleType
    predict_pb2: ModuleType
    prediction_service_pb2_grpc: ModuleType
    regression_pb2: ModuleType


@functools.cache
def serving_api() -> ServingApi:
    """Imports grpc and the TF Serving API on first use (not at ``import serving_opt``)."""
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    return ServingApi(
        grpc=grpc,
        classification_pb2=classification_pb2,
        get_model_metadata_pb2=get_model_metadata_pb2,
        get_model_status_pb2=get_model_status_pb2,
        inference_pb2=inference_pb2,
        model_service_pb2_grpc=model_service_pb2_grpc,
        predict_pb2=predict_pb2,
        prediction_service_pb2_grpc=prediction_service_pb2_grpc,
        regression_pb2=regression_pb2,
    )
