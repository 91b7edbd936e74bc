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

import asyncio
import functools
import threading
from collections.abc import Sequence

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
    def __init__(self, channels: dict[str, grpc.aio.Channel], default: grpc.aio.Channel) -> None:
        self._channels = channels
        self._default = default

    def service(self, details):
        method = details.method
        if method == _RELOAD:
            return grpc.unary_unary_rpc_method_handler(_refuse_reload)
        if method in _STREAMING:
            # partial, not a lambda: grpc.aio runs what looks like a coroutine function.
            return grpc.unary_stream_rpc_method_handler(functools.partial(self._stream, method))
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._unary, method))

    def _channel(self, method: str, request: bytes) -> grpc.aio.Channel:
        if method in _ROUTED or method == _MULTI_INFERENCE:
            name = wire.model_name(request, multi_inference=method == _MULTI_INFERENCE)
            return self._channels.get(name, self._default)
        return self._default

    async def _unary(self, method: str, request: bytes, context) -> bytes:
        call = self._channel(method, request).unary_unary(method)(
            request, timeout=context.time_remaining(), metadata=_metadata(context))
        try:
            reply = await call
        except grpc.aio.AioRpcError as e:
            await _fail(context, e)
        context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))
        return reply

    async def _stream(self, method: str, request: bytes, context):
        replies = self._channel(method, request).unary_stream(method)(
            request, timeout=context.time_remaining(), metadata=_metadata(context))
        try:
            async for reply in replies:
                yield reply
        except grpc.aio.AioRpcError as e:
            await _fail(context, e)


def _channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """"k=v,k=v" as the sandboxed servers read it (they refused a malformed one before
    this runs): ints where they parse."""
    options: list[tuple[str, int | str]] = []
    for key, _, value in (item.partition("=") for item in text.split(",") if item):
        try:
            number = int(value)
        except ValueError:
            number = None
        fits = number is not None and -2**31 <= number < 2**31
        options.append((key, number if fits else value))
    return options


def _metadata(context) -> list[tuple[str, str | bytes]]:
    return [(k, v) for k, v in context.invocation_metadata() or ()
            if not k.startswith(_DROPPED_METADATA) and k != "user-agent"]


async def _fail(context, error: grpc.aio.AioRpcError):
    context.set_trailing_metadata(tuple(error.trailing_metadata() or ()))
    await context.abort(error.code(), error.details() or "")


async def _refuse_reload(_request: bytes, context):
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, RELOAD_REFUSED)


class Router:
    """The host's gRPC server on an event loop of its own (no thread hand-off per call):
    routes to the sandboxes' unix sockets ``paths`` by model name; a request naming no
    model in ``paths`` goes to ``paths[order[0]]``."""

    def __init__(self, paths: dict[str | None, str], order: Sequence[str | None],
                 max_request_bytes: int, max_concurrent_rpcs: int,
                 max_connections: int = MAX_CONNECTIONS, channel_arguments: str = "") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="serving-opt-route")
        self._thread.start()
        self._server = self._run(self._make(paths, order, max_request_bytes,
                                            max(1, max_concurrent_rpcs), max_connections,
                                            _channel_arguments(channel_arguments)))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _make(self, paths, order, max_request_bytes, max_concurrent_rpcs,
                    max_connections, user_options) -> grpc.aio.Server:
        self._channels = {name: grpc.aio.insecure_channel(f"unix:{path}", options=[
            ("grpc.max_receive_message_length", _UNLIMITED),
            ("grpc.max_send_message_length", _UNLIMITED),
        ]) for name, path in paths.items()}
        return grpc.aio.server(
            handlers=[_Router(self._channels, self._channels[order[0]])],
            options=[
                # --grpc_channel_arguments: this is the server clients reach. First: where
                # a key repeats, gRPC takes its first value.
                *user_options,
                ("grpc.max_receive_message_length", min(max_request_bytes, 2**31 - 1)),
                ("grpc.max_send_message_length", _UNLIMITED),
                ("grpc.max_allowed_incoming_connections", max_connections),
                *SERVER_OPTIONS,
            ],
            # Calls past this are RESOURCE_EXHAUSTED at once instead of queueing without end.
            maximum_concurrent_rpcs=max_concurrent_rpcs,
        )

    def add_insecure_port(self, address: str) -> int:
        async def add() -> int:
            return self._server.add_insecure_port(address)

        return self._run(add())

    def start(self) -> None:
        self._run(self._server.start())

    def stop(self, grace: float) -> None:
        async def stop() -> None:
            await self._server.stop(grace)
            for channel in self._channels.values():
                await channel.close()

        try:
            self._run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=grace + 5)
