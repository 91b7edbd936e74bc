"""The gRPC client: TF Serving's ModelService and PredictionService (``GrpcClient``).

One implementation of ``clients.ModelServerClient`` (TFX's ``model_server_clients``):

  * ``wait_until_available``: poll GetModelStatus until the version is AVAILABLE,
    failing early, with the server log's reason, when the load fails;
  * ``check_metadata``: GetModelMetadata's SignatureDefMap against the SavedModel's;
  * ``call``/``request``: send one probe (``requests.Probe``) by its method name; every
    probe kind has a gRPC method, so ``prepare`` sends them all.

Starting and stopping the server is the runners' job (``backends``); which checks run
and what they mean is the executor's (``validate``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from serving_opt.errors import ServingOptError
from serving_opt.serving.api import STATE_AVAILABLE, STATE_END, serving_api
from serving_opt.serving.clients import (
    ModelServerClient,
    compare_signature_maps,
    last_line,
    load_failure,
)

if TYPE_CHECKING:
    from serving_opt.serving.process import ServerProcess
    from serving_opt.serving.requests import Probe

_MAX_MESSAGE_BYTES = 2**31 - 1  # TF Serving's own limit (INT32_MAX); gRPC's default is 4 MiB


def rpc_error(e) -> str:
    """A failed call as ``CODE: details``."""
    return f"{e.code().name}: {e.details()}"


class GrpcClient(ModelServerClient):
    """TF Serving's gRPC API on one address.

    Its PredictionService channel allows TF Serving's message limit (INT32_MAX) both ways,
    not gRPC's 4 MiB, so a large probe is judged by the server, not by the client library.
    The channel is opened here and closed by :meth:`close` (or ``with``); gRPC connects
    it on the first call, after the version is AVAILABLE.
    """

    protocol = "grpc"
    available_check = "model AVAILABLE"
    metadata_check = "GetModelMetadata signature_def"

    def __init__(self, address: str, model_name: str, version: int, timeout: float) -> None:
        super().__init__(address, model_name, version, timeout)
        self._api = serving_api()
        self.errors = (self._api.grpc.RpcError,)
        self._channel = self._api.grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES)])
        self._stub = self._api.prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

    def wait_until_available(self, server: ServerProcess | None, deadline_s: float) -> None:
        """Polls GetModelStatus until the version is AVAILABLE; raises on END/exit/deadline."""
        api, model_name, version = self._api, self.model_name, self.version
        # Polled from before the server listens: a channel of its own, closed when the
        # wait ends.
        channel = api.grpc.insecure_channel(self.address)
        stub = api.model_service_pb2_grpc.ModelServiceStub(channel)
        deadline = time.monotonic() + deadline_s
        last = "no answer yet"
        try:
            while time.monotonic() < deadline:
                if server is not None and server.exit_code() is not None:
                    log = server.log_tail(200)
                    failure = load_failure(log)
                    if failure:
                        raise ServingOptError(
                            f"the server failed to load {model_name} version {version}: "
                            f"{failure}",
                            "fix the model; the server log's last lines are in the validation "
                            "report",
                        )
                    raise ServingOptError(
                        f"the {server.backend} server exited with code {server.exit_code()} "
                        f"before version {version} became AVAILABLE: {last_line(log)}",
                        "its log's last lines are in the validation report",
                    )
                request = api.get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = model_name
                try:
                    response = stub.GetModelStatus(request, timeout=5)
                except api.grpc.RpcError as e:
                    # Not listening yet, or the model not known yet: keep polling.
                    last = rpc_error(e)
                    time.sleep(0.5)
                    continue
                for status in response.model_version_status:
                    if status.version != version:
                        continue
                    if status.state == STATE_AVAILABLE:
                        return
                    if status.state == STATE_END:
                        message = status.status.error_message or "unloaded"
                        raise ServingOptError(
                            f"the server failed to load {model_name} version {version}: "
                            f"{message}",
                            "fix the model; the server log has details"
                            + (" (its last lines are in the validation report)" if server
                               else ""),
                        )
                    last = f"version {version} state {status.state}"
                time.sleep(0.5)
        finally:
            channel.close()
        raise ServingOptError(
            f"{model_name} version {version} was not AVAILABLE within {deadline_s:.0f} s "
            f"({last})",
            "raise --load_deadline, or check the server log"
            + (" (its last lines are in the validation report)" if server else ""),
        )

    def check_metadata(self, served: dict) -> tuple[bool, str]:
        """GetModelMetadata's SignatureDefMap vs ``served``: (ok, detail)."""
        md = self._api.get_model_metadata_pb2
        request = md.GetModelMetadataRequest()
        request.model_spec.name = self.model_name
        request.model_spec.version.value = self.version
        request.metadata_field.append("signature_def")
        response = self._stub.GetModelMetadata(request, timeout=self.timeout)
        signature_map = md.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return compare_signature_maps(signature_map, served)

    def prepare(self, probes: Sequence[Probe], served: dict) -> list[Probe]:
        return list(probes)

    def request(self, probe: Probe):
        """Sends ``probe`` with the PredictionService method it names; returns the reply."""
        return getattr(self._stub, probe.method)(probe.request, timeout=self.timeout)

    def describe(self, error: BaseException) -> str:
        return rpc_error(error)

    def close(self) -> None:
        self._channel.close()
