"""The host's gRPC server: each call goes, as bytes, to the sandbox serving the model the
request names (:mod:`.wire`), with its deadline and metadata, and the sandbox's answer,
status, details and trailing metadata come back unchanged.

A request that names no model served here goes to the first sandbox, which answers it as
upstream does (NOT_FOUND "Servable not found for request: Latest(x)", the MultiInference
"same model name" error, a parse error...) and knows nothing of the other models. The
health and profiler services go there too. A config reload cannot be honoured: each
sandbox was made for the models of the config given at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc

from serving_opt.serving.front import wire

_ROUTED = frozenset({
    "/tensorflow.serving.PredictionService/Predict",
    "/tensorflow.serving.PredictionService/Classify",
    "/tensorflow.serving.PredictionService/Regress",
    "/tensorflow.serving.PredictionService/GetModelMetadata",
    "/tensorflow.serving.ModelService/GetModelStatus",
})
_MULTI_INFERENCE = "/tensorflow.serving.PredictionService/MultiInference"
_RELOAD = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"
_STREAMING = frozenset({"/grpc.health.v1.Health/Watch"})
RELOAD_REFUSED = (
    "HandleReloadConfigRequest is not available from the sandboxed serving-opt serve: each "
    "model runs in a sandbox of its own, made for the config given at start; restart serve "
    "with the new config, or pass --allow_unsandboxed for models you trust")
# Bounds of what idle or half-open clients may hold: a connection past the limit is
# closed at once; one that never completes the HTTP/2 handshake, or carries no call for
# this long, is closed; keepalive pings find peers that vanished. grpc core's accept loop
# outlives EMFILE (it retries), which the old relay's did not.
MAX_CONNECTIONS = 1024
SERVER_OPTIONS = (
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 300_000),
    ("grpc.keepalive_time_ms", 120_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.so_reuseport", 0),
)
_UNLIMITED = -1
_DROPPED_METADATA = ("grpc-", ":")


class _Router(grpc.GenericRpcHandler):
    def __init__(self, channels: dict[str, grpc.Channel], default: grpc.Channel) -> None:
        self._channels = channels
        self._default = default

    def service(self, details):
        method = details.method
        if method == _RELOAD:
            return grpc.unary_unary_rpc_method_handler(_refuse_reload)
        if method in _STREAMING:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: self._stream(method, request, context))
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._unary(method, request, context))

    def _channel(self, method: str, request: bytes) -> grpc.Channel:
        if method in _ROUTED or method == _MULTI_INFERENCE:
            name = wire.model_name(request, multi_inference=method == _MULTI_INFERENCE)
            return self._channels.get(name, self._default)
        return self._default

    def _unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        call = self._channel(method, request).unary_unary(method).future(
            request, timeout=context.time_remaining(), metadata=_metadata(context))
        context.add_callback(call.cancel)  # the client left: so does the sandbox's call
        try:
            reply = call.result()
        except grpc.RpcError as e:
            _fail(context, e)
        except grpc.FutureCancelledError:
            context.abort(grpc.StatusCode.CANCELLED, "Cancelled")
        context.set_trailing_metadata(call.trailing_metadata() or ())
        return reply

    def _stream(self, method: str, request: bytes, context: grpc.ServicerContext):
        replies = self._channel(method, request).unary_stream(method)(
            request, timeout=context.time_remaining(), metadata=_metadata(context))
        context.add_callback(replies.cancel)
        try:
            yield from replies
        except grpc.RpcError as e:
            _fail(context, e)


def _metadata(context: grpc.ServicerContext) -> list[tuple[str, str | bytes]]:
    return [(k, v) for k, v in context.invocation_metadata()
            if not k.startswith(_DROPPED_METADATA) and k != "user-agent"]


def _fail(context: grpc.ServicerContext, error: grpc.RpcError):
    context.set_trailing_metadata(error.trailing_metadata() or ())
    context.abort(error.code(), error.details() or "")


def _refuse_reload(_request: bytes, context: grpc.ServicerContext):
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, RELOAD_REFUSED)


def child_channel(socket_path: str) -> grpc.Channel:
    """A channel to a sandbox's gRPC unix socket; the sandbox bounds its own messages."""
    return grpc.insecure_channel(f"unix:{socket_path}", options=[
        ("grpc.max_receive_message_length", _UNLIMITED),
        ("grpc.max_send_message_length", _UNLIMITED),
    ])


def router_server(channels: dict[str, grpc.Channel], order: Sequence[str],
                  max_request_bytes: int, threads: int,
                  max_connections: int = MAX_CONNECTIONS) -> grpc.Server:
    """A gRPC server (no port yet) routing to ``channels`` by model name; requests naming
    no model in ``channels`` go to ``channels[order[0]]``."""
    threads = max(1, threads)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="serving-opt-route"),
        handlers=[_Router(channels, channels[order[0]])],
        options=[
            ("grpc.max_receive_message_length", min(max_request_bytes, 2**31 - 1)),
            ("grpc.max_send_message_length", _UNLIMITED),
            ("grpc.max_allowed_incoming_connections", max_connections),
            *SERVER_OPTIONS,
        ],
        # Calls past this are RESOURCE_EXHAUSTED at once instead of queueing without end.
        maximum_concurrent_rpcs=4 * threads,
    )
    return server
