"""``--batching_parameters_file``: read and validate TF Serving's BatchingParameters.

What the local server does with batching: it PARSES AND VALIDATES the file (the text
``tensorflow.serving.BatchingParameters`` of session_bundle_config.proto, with the checks
batching_session.cc makes on ``allowed_batch_sizes``), so a file the real server would
refuse is refused here too. It does NOT batch: requests still run one session call each,
and ``serve --enable_batching`` says so in a one-line warning. Answers are the same either
way; only throughput under concurrent load differs from the real server.

The proto is not shipped in the ``tensorflow-serving-api`` wheel, so its message type is
built here from the field list of session_bundle_config.proto.

Example:
    >>> read_batching_parameters("/etc/batching.config")["max_batch_size"]
    32
"""

from __future__ import annotations

from serving_opt.serving.model_server.status import invalid_argument, not_found

_INT64_WRAPPED = (
    ("max_batch_size", 1),
    ("batch_timeout_micros", 2),
    ("max_enqueued_batches", 3),
    ("num_batch_threads", 4),
    ("max_execution_batch_size", 9),
)
_MESSAGE = None


def _message_class():
    global _MESSAGE
    if _MESSAGE is not None:
        return _MESSAGE
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="serving_opt_batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = proto.message_type.add(name="BatchingParameters")
    f = descriptor_pb2.FieldDescriptorProto
    for name, number in _INT64_WRAPPED:
        message.field.add(name=name, number=number, type=f.TYPE_MESSAGE,
                          type_name=".google.protobuf.Int64Value", label=f.LABEL_OPTIONAL)
    message.field.add(name="thread_pool_name", number=5, type=f.TYPE_MESSAGE,
                      type_name=".google.protobuf.StringValue", label=f.LABEL_OPTIONAL)
    message.field.add(name="enable_large_batch_splitting", number=8, type=f.TYPE_MESSAGE,
                      type_name=".google.protobuf.BoolValue", label=f.LABEL_OPTIONAL)
    message.field.add(name="allowed_batch_sizes", number=6, type=f.TYPE_INT64,
                      label=f.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=f.TYPE_BOOL,
                      label=f.LABEL_OPTIONAL)
    pool.Add(proto)
    _MESSAGE = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    )
    return _MESSAGE


def parse_batching_parameters(text: str, source: str = "<batching parameters>") -> dict:
    """Parses and validates a text BatchingParameters; returns the values that were set.

    Example:
        >>> parse_batching_parameters("max_batch_size { value: 8 } allowed_batch_sizes: 4 "
        ...                           "allowed_batch_sizes: 8")
        {'max_batch_size': 8, 'allowed_batch_sizes': [4, 8]}
    """
    from google.protobuf import text_format

    params = _message_class()()
    try:
        text_format.Parse(text, params)
    except text_format.ParseError as e:
        raise invalid_argument(f"Can't parse {source} as text proto: {e}") from None
    values: dict = {}
    for name, _ in _INT64_WRAPPED:
        if params.HasField(name):
            values[name] = getattr(params, name).value
    for name in ("thread_pool_name", "enable_large_batch_splitting"):
        if params.HasField(name):
            values[name] = getattr(params, name).value
    if params.allowed_batch_sizes:
        values["allowed_batch_sizes"] = list(params.allowed_batch_sizes)
    if params.pad_variable_length_inputs:
        values["pad_variable_length_inputs"] = True
    _validate(values)
    return values


def _validate(values: dict) -> None:
    for name in ("max_batch_size", "num_batch_threads", "max_enqueued_batches"):
        if name in values and values[name] <= 0:
            raise invalid_argument(f"{name} must be positive; was {values[name]}")
    if values.get("batch_timeout_micros", 0) < 0:
        raise invalid_argument(
            f"batch_timeout_micros must be non-negative; was {values['batch_timeout_micros']}"
        )
    allowed = values.get("allowed_batch_sizes")
    if not allowed:
        return
    for previous, size in zip(allowed, allowed[1:]):
        if size <= previous:
            raise invalid_argument(
                "allowed_batch_sizes entries must be monotonically increasing"
            )
    max_batch_size = values.get("max_batch_size", 1000)  # BasicBatchScheduler's default
    if values.get("enable_large_batch_splitting"):
        if allowed[-1] > max_batch_size:
            raise invalid_argument(
                "Last entry in allowed_batch_sizes must be less than or equal to "
                f"max_batch_size; last entry was {allowed[-1]}; expected {max_batch_size}"
            )
        execution = values.get("max_execution_batch_size", max_batch_size)
        if allowed[-1] != execution:
            raise invalid_argument(
                "Last entry in allowed_batch_sizes must be equal to max_execution_batch_size; "
                f"last entry was {allowed[-1]}; expected {execution}"
            )
    elif allowed[-1] != max_batch_size:
        raise invalid_argument(
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{allowed[-1]}; expected {max_batch_size}"
        )


def read_batching_parameters(path: str) -> dict:
    """Reads ``--batching_parameters_file``; raises ServingStatusError like the server."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise not_found(f"{path}; No such file or directory") from None
    except OSError as e:
        raise invalid_argument(f"Could not read {path}: {e.strerror or e}") from None
    return parse_batching_parameters(text, path)
