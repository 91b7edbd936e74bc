"""The ``tensorflow.serving.PredictionService`` gRPC servicer.

Each RPC checks for a model_spec ("Missing ModelSpec"), takes a handle on the version the
spec resolves to (NOT_FOUND "Servable not found for request: ..."), and runs the request
with the client's deadline as the session timeout, as prediction_service_impl.cc does.
"""

from __future__ import annotations

import time

from tensorflow_serving.apis import prediction_service_pb2_grpc

from serving_opt.model_server.classifier import run_classify
from serving_opt.model_server.core import ServerCore
from serving_opt.model_server.grpc_util import answer, deadline_to_timeout_ms
from serving_opt.model_server.monitoring import METRICS
from serving_opt.model_server.multi_inference import run_multi_inference
from serving_opt.model_server.predict import run_predict
from serving_opt.model_server.regressor import run_regress
from serving_opt.model_server.request_options import RequestOptions
from serving_opt.model_server.status import ServingStatusError, invalid_argument

SIGNATURE_DEF_FIELD = "signature_def"


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """Predict, Classify, Regress, MultiInference and GetModelMetadata over a ServerCore.

    ``enforce_session_run_timeout`` mirrors the C++ option (on by default).
    """

    def __init__(
        self,
        core: ServerCore,
        options: RequestOptions,
        enforce_session_run_timeout: bool = True,
    ) -> None:
        self._core = core
        self._options = options
        self._enforce_timeout = enforce_session_run_timeout

    def _request_options(self, context) -> RequestOptions:
        if not self._enforce_timeout:
            return self._options
        return self._options.with_timeout(deadline_to_timeout_ms(context))

    def _run(self, request, context, runner, model_spec=None, api: str | None = None):
        start = time.monotonic()
        status = ["OK"]

        def compute():
            try:
                spec = model_spec if model_spec is not None else request.model_spec
                if model_spec is None and not request.HasField("model_spec"):
                    raise invalid_argument("Missing ModelSpec")
                with self._core.servable_handle(spec) as handle:
                    return runner(
                        handle.servable, request, self._request_options(context),
                        handle.id.version
                    )
            except ServingStatusError as e:
                status[0] = e.code.name
                raise
            except Exception:
                status[0] = "INTERNAL"
                raise

        try:
            return answer(context, compute)
        finally:
            if api is not None:  # prediction_service_impl.cc records these three APIs
                METRICS.record(request.model_spec.name, api, "GRPC", status[0],
                               int((time.monotonic() - start) * 1_000_000))

    def Predict(self, request, context):  # noqa: N802 - gRPC method names
        return self._run(request, context, run_predict, api="Predict")

    def Classify(self, request, context):  # noqa: N802
        return self._run(request, context, run_classify, api="Classify")

    def Regress(self, request, context):  # noqa: N802
        return self._run(request, context, run_regress, api="Regress")

    def MultiInference(self, request, context):  # noqa: N802
        from tensorflow_serving.apis import model_pb2

        # C++ resolves the servable from the first task's spec (an empty spec without
        # tasks, which then fails with "ModelSpec has no name specified.").
        spec = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
        return self._run(request, context, run_multi_inference, model_spec=spec)

    def GetModelMetadata(self, request, context):  # noqa: N802
        return answer(context, lambda: self._metadata(request))

    def _metadata(self, request):
        from tensorflow_serving.apis import get_model_metadata_pb2

        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        if not request.metadata_field:
            raise invalid_argument(
                "GetModelMetadataRequest must specify at least one metadata_field"
            )
        for name in request.metadata_field:
            if name != SIGNATURE_DEF_FIELD:
                raise invalid_argument(f"Metadata field {name} is not supported")
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        with self._core.servable_handle(request.model_spec) as handle:
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature in handle.servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(signature)
            response.model_spec.name = handle.id.name
            response.model_spec.version.value = handle.id.version
            response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
        return response
