"""Proto messages the local server needs that no installed Python package ships.

``tensorflow.serving.MonitoringConfig`` (tensorflow_serving/config/monitoring_config.proto,
not in the tensorflow-serving-api wheel), the profiler's ``tensorflow.ProfileRequest`` /
``ProfileResponse`` (tsl/profiler/protobuf/profiler_service.proto, compiled into
TensorFlow's C++ only) and gRPC's ``grpc.health.v1`` messages. Each is declared here with
upstream's package, names and field numbers (only the fields the server reads or writes;
others in a request are kept as unknown fields), in a pool of its own so it can never
clash with a generated module that a user's environment may have.
"""

from __future__ import annotations

import functools

_OPTIONAL, _REPEATED = 1, 3
_TYPES = {"bool": 8, "string": 9, "bytes": 12, "uint64": 4, "enum": 14, "message": 11}

# file name -> (package, {message: [(field, number, type, label, type_name)]}, enums)
_FILES = {
    "tensorflow_serving/config/monitoring_config.proto": (
        "tensorflow.serving",
        {
            "PrometheusConfig": [("enable", 1, "bool", _OPTIONAL, None),
                                 ("path", 2, "string", _OPTIONAL, None)],
            "MonitoringConfig": [("prometheus_config", 1, "message", _OPTIONAL,
                                  ".tensorflow.serving.PrometheusConfig")],
        },
        {},
    ),
    "tsl/profiler/protobuf/profiler_service.proto": (
        "tensorflow",
        {
            "ProfileRequest": [("duration_ms", 1, "uint64", _OPTIONAL, None),
                               ("repository_root", 5, "string", _OPTIONAL, None),
                               ("session_id", 6, "string", _OPTIONAL, None),
                               ("host_name", 7, "string", _OPTIONAL, None),
                               ("emit_xspace", 9, "bool", _OPTIONAL, None)],
            "ProfileToolData": [("name", 1, "string", _OPTIONAL, None),
                                ("data", 2, "bytes", _OPTIONAL, None)],
            # xspace (8) is a tensorflow.profiler.XSpace; declared as bytes, which has the
            # same wire encoding as the embedded message.
            "ProfileResponse": [("tool_data", 6, "message", _REPEATED,
                                 ".tensorflow.ProfileToolData"),
                                ("empty_trace", 7, "bool", _OPTIONAL, None),
                                ("xspace", 8, "bytes", _OPTIONAL, None)],
        },
        {},
    ),
    "grpc/health/v1/health.proto": (
        "grpc.health.v1",
        {
            "HealthCheckRequest": [("service", 1, "string", _OPTIONAL, None)],
            "HealthCheckResponse": [("status", 1, "enum", _OPTIONAL,
                                     ".grpc.health.v1.HealthCheckResponse.ServingStatus")],
        },
        {"HealthCheckResponse": ("ServingStatus", ["UNKNOWN", "SERVING", "NOT_SERVING",
                                                   "SERVICE_UNKNOWN"])},
    ),
}


@functools.lru_cache(maxsize=1)
def _pool():
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for file_name, (package, messages, enums) in _FILES.items():
        proto = descriptor_pb2.FileDescriptorProto(name=file_name, package=package,
                                                   syntax="proto3")
        for name, fields in messages.items():
            message = proto.message_type.add(name=name)
            for field_name, number, kind, label, type_name in fields:
                field = message.field.add(name=field_name, number=number,
                                          type=_TYPES[kind], label=label)
                if type_name:
                    field.type_name = type_name
            if name in enums:
                enum_name, values = enums[name]
                enum = message.enum_type.add(name=enum_name)
                for i, value in enumerate(values):
                    enum.value.add(name=value, number=i)
        pool.Add(proto)
    return pool


@functools.cache
def message_class(full_name: str):
    """The message class of ``full_name`` (e.g. "tensorflow.ProfileResponse").
    """
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))
