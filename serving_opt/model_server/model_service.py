"""The ``tensorflow.serving.ModelService`` gRPC servicer: GetModelStatus and config reloads."""

from __future__ import annotations

from tensorflow_serving.apis import model_service_pb2_grpc

from serving_opt.model_server.core import ServerCore
from serving_opt.model_server.grpc_util import answer
from serving_opt.model_server.status import (
    ServingStatusError,
    invalid_argument,
    not_found,
    status_proto,
)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """Version states from the core's monitor; config reloads through ServerCore."""

    def __init__(self, core: ServerCore) -> None:
        self._core = core

    def GetModelStatus(self, request, context):  # noqa: N802 - gRPC method names
        return answer(context, lambda: self._status(request))

    def _status(self, request):
        from tensorflow_serving.apis import get_model_status_pb2

        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        name = request.model_spec.name
        statuses = self._core.version_statuses(name)
        # Like get_model_status_impl.cc, only an explicit version narrows the answer; a
        # version_label is ignored here.
        if request.model_spec.HasField("version"):
            wanted = request.model_spec.version.value
            statuses = [s for s in statuses if s.version == wanted]
            if not statuses:
                raise not_found(f"Could not find version {wanted} of model {name}")
        elif not statuses:
            raise not_found(f"Could not find any versions of model {name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for status in statuses:
            entry = response.model_version_status.add()
            entry.version = status.version
            entry.state = int(status.state)
            entry.status.CopyFrom(status_proto(status.error))
        return response

    def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        return answer(context, lambda: self._reload(request))

    def _reload(self, request):
        from tensorflow_serving.apis import model_management_pb2

        if request.config.WhichOneof("config") != "model_config_list":
            raise invalid_argument(
                "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                "ModelConfigList is currently supported"
            )
        response = model_management_pb2.ReloadConfigResponse()
        try:
            self._core.reload_config(request.config)
        except ServingStatusError as e:
            response.status.CopyFrom(status_proto(e))
            raise
        response.status.CopyFrom(status_proto(None))
        return response
