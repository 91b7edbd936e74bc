"""Turning ServingStatusError into gRPC statuses, and client deadlines into run timeouts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import grpc

from serving_opt.model_server import request_cost
from serving_opt.model_server.status import ServingStatusError

log = logging.getLogger("serving_opt.model_server")

T = TypeVar("T")

# Larger than any real deadline: grpc reports "no deadline" as None or a huge number.
_NO_DEADLINE_SECONDS = 1e8


def answer(context: grpc.ServicerContext, compute: Callable[[], T]) -> T:
    """Runs ``compute`` and aborts the RPC with its status code and message if it fails.

    Anything that is not a ServingStatusError is a bug here: it becomes INTERNAL with the
    exception text, and is logged with its traceback.
    """
    try:
        return compute()
    except ServingStatusError as e:
        context.abort(e.code, truncate_message(e.message))
    except Exception as e:  # noqa: BLE001 - a server must answer, not die
        log.exception("request failed unexpectedly")
        context.abort(grpc.StatusCode.INTERNAL, truncate_message(f"{type(e).__name__}: {e}"))
    raise AssertionError("unreachable: context.abort raises")


ERROR_MESSAGE_LIMIT = 1024  # grpc_status_util.cc kErrorMessageLimit (bytes)


def truncate_message(message: str) -> str:
    """``ToGRPCStatus``: a message over 1024 bytes keeps its first 1024 + "...TRUNCATED".

    Only gRPC answers are cut; REST error bodies carry the whole message, as upstream.
    """
    raw = message.encode("utf-8", "surrogatepass")
    if len(raw) <= ERROR_MESSAGE_LIMIT:
        return message
    return raw[:ERROR_MESSAGE_LIMIT].decode("utf-8", "ignore") + "...TRUNCATED"


def deadline_to_timeout_ms(context: grpc.ServicerContext) -> int | None:
    """The client's remaining deadline in ms (at least 1), or None without a deadline.

    TF Serving sets ``RunOptions.timeout_in_ms`` from it, so a slow run stops when the
    client has given up instead of burning CPU.
    """
    remaining = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE_SECONDS:
        return None
    return max(1, int(remaining * 1000))


class _Refused:
    """What a bounded deserializer returns for a request too costly to parse."""

    def __init__(self, message: str) -> None:
        self.message = message


def _bounded_method(handler, budget: int):
    deserializer = handler.request_deserializer
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    kind = "unary_unary" if handler.unary_unary is not None else "unary_stream"
    behaviour = getattr(handler, kind)
    if descriptor is None or behaviour is None:
        return handler

    def deserialize(data: bytes):
        try:
            request_cost.parse_cost(data, descriptor, budget)
        except request_cost.RequestTooCostly as e:
            return _Refused(
                f"a {len(data)}-byte {descriptor.name} would hold more than {e.budget} bytes "
                f"once parsed (at least {e.cost}: many small elements cost ~40 bytes each); "
                "the limit is --max_request_bytes: send fewer, larger elements or raise it"
            )
        return deserializer(data)

    def bounded(request, context):
        if isinstance(request, _Refused):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, request.message)
        try:
            return behaviour(request, context)
        finally:
            request_cost.release_memory_soon(request.ByteSize())

    return handler._replace(request_deserializer=deserialize, **{kind: bounded})


class _BoundedHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, budget: int) -> None:
        self._inner = inner
        self._budget = budget
        self._methods: dict[str, object] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method not in self._methods:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            self._methods[method] = _bounded_method(handler, self._budget)
        return self._methods[method]


class BoundedServer:
    """A gRPC server as the generated ``add_*Servicer_to_server`` functions see it: every
    unary method parses its request only once :func:`request_cost.parse_cost` says it fits
    ``budget`` bytes parsed; a costlier one is RESOURCE_EXHAUSTED, unparsed."""

    def __init__(self, server: grpc.Server, budget: int) -> None:
        self._server = server
        self._budget = budget

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_BoundedHandler(h, self._budget) for h in handlers))
