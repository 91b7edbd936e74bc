"""gRPC services of tensorflow_model_server beside the serving APIs.

* ``tensorflow.ProfilerService/Profile`` (``--enable_profiler``, on by default upstream):
  traces this process with TensorFlow's profiler for the requested ``duration_ms`` and
  answers with the trace. Upstream's server writes the XSpace to ``repository_root`` on
  its own file system; this one returns it in the reply instead (``tool_data``
  "<host>.xplane.pb", or ``xspace`` when the request sets ``emit_xspace``), which the
  profiler client saves under its own log directory - so it works through serve's
  sandbox, which has no writable view of the client's directories. Only ``Profile`` is
  implemented (upstream also has Monitor and continuous profiling).
* ``grpc.health.v1.Health`` (``--enable_grpc_healthcheck_service``): gRPC's default health
  service, as upstream enables it: SERVING for "" and the server's services, NOT_FOUND for
  other names.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc

from serving_opt.model_server.extra_protos import message_class

PROFILER_SERVICE = "tensorflow.ProfilerService"
HEALTH_SERVICE = "grpc.health.v1.Health"
_SERVING = 1
_profiling = threading.Lock()  # one profiler session per process, as TensorFlow's


def _trace(duration_ms: int, context) -> bytes:
    from tensorflow.python.profiler.internal import _pywrap_profiler

    session = _pywrap_profiler.ProfilerSession()
    session.start("", {"host_tracer_level": 2, "python_tracer_level": 0,
                       "device_tracer_level": 1})
    deadline = time.monotonic() + duration_ms / 1000
    while context.is_active() and time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return session.stop()


def _profile(request, context):
    response_class = message_class("tensorflow.ProfileResponse")
    if not _profiling.acquire(blocking=False):
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      "Another profiling session is active. Please try again later.")
    try:
        xspace = _trace(max(1, request.duration_ms or 1000), context)
    except Exception as e:  # noqa: BLE001 - answer the client, keep serving
        context.abort(grpc.StatusCode.INTERNAL, f"profiling failed: {e}")
    finally:
        _profiling.release()
    response = response_class(empty_trace=not xspace)
    if request.emit_xspace:
        response.xspace = xspace
    else:
        host = request.host_name or socket.gethostname()
        response.tool_data.add(name=f"{host}.xplane.pb", data=xspace)
    return response


def profiler_handler() -> grpc.GenericRpcHandler:
    """``tensorflow.ProfilerService`` with its Profile method."""
    request_class = message_class("tensorflow.ProfileRequest")
    response_class = message_class("tensorflow.ProfileResponse")
    return grpc.method_handlers_generic_handler(PROFILER_SERVICE, {
        "Profile": grpc.unary_unary_rpc_method_handler(
            _profile, request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString),
    })


def health_handler(services: list[str]) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health`` Check and Watch: SERVING for "" and ``services``."""
    request_class = message_class("grpc.health.v1.HealthCheckRequest")
    response_class = message_class("grpc.health.v1.HealthCheckResponse")
    known = {"", *services}

    def check(request, context):
        if request.service not in known:
            context.abort(grpc.StatusCode.NOT_FOUND, "service name unknown")
        return response_class(status=_SERVING)

    def watch(request, context):
        # SERVICE_UNKNOWN (3) for names not served; the status never changes while up.
        yield response_class(status=_SERVING if request.service in known else 3)
        while context.is_active():
            time.sleep(0.5)

    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {
        "Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString),
        "Watch": grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString),
    })
