"""Predict: TF Serving's predict_util.cc behaviour on one loaded servable.

Order of checks and their texts follow the C++ server: signature lookup
(FAILED_PRECONDITION), optional method-name check, input count, alias-to-tensor mapping
with SignatureDef.defaults, output_filter, then one session run whose errors (wrong dtype,
bad shape) come from TensorFlow itself.
"""

from __future__ import annotations

from serving_opt.model_server import tensors
from serving_opt.model_server.request_options import (
    DEFAULT_MAX_REQUEST_BYTES,
    METHOD_CLASSIFY,
    METHOD_PREDICT,
    METHOD_REGRESS,
    RequestOptions,
    fill_model_spec,
    resolve_signature_name,
)
from serving_opt.model_server.servable import Servable
from serving_opt.model_server.status import (
    failed_precondition,
    internal,
    invalid_argument,
)


def _keys(mapping) -> list[str]:
    # C++ prints std::set<string> contents: sorted, comma-joined.
    return sorted(mapping.keys())


def verify_signature(signature, options: RequestOptions) -> None:
    """The optional method_name check (``--enable_signature_method_name_check``)."""
    if options.signature_method_name_check and signature.method_name not in (
        METHOD_PREDICT,
        METHOD_CLASSIFY,
        METHOD_REGRESS,
    ):
        raise internal(
            "Expected prediction signature method_name to be one of {"
            f"{METHOD_PREDICT}, {METHOD_CLASSIFY}, {METHOD_REGRESS}}}. "
            f"Was: {signature.method_name}"
        )


def verify_inputs_size(signature, request) -> None:
    """More inputs than the signature, or fewer without defaults, is INVALID_ARGUMENT."""
    sent, expected = len(request.inputs), len(signature.inputs)
    if sent > expected or (sent < expected and not signature.defaults):
        request_keys = set(request.inputs.keys())
        signature_keys = set(signature.inputs.keys())
        raise invalid_argument(
            f"input size does not match signature: {sent}!={expected} "
            f"len({{{','.join(sorted(request_keys))}}}) != "
            f"len({{{','.join(sorted(signature_keys))}}}). "
            f"Sent extra: {{{','.join(sorted(request_keys - signature_keys))}}}. "
            f"Missing but required: {{{','.join(sorted(signature_keys - request_keys))}}}."
        )


def input_feeds(
    signature, request_inputs, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> dict:
    """Maps each signature alias to its tensor name and decoded value (TF ``GetInputValues``).

    A missing alias takes its SignatureDef.defaults entry; every request alias must be
    used. Every tensor is checked, and their decoded sizes summed against ``max_bytes``,
    before any is decoded: a refused request allocates nothing.
    """
    protos = {}
    used = set()
    total = 0
    # Proto maps have no order in C++; sorted keeps our first-reported alias stable.
    for alias in sorted(signature.inputs.keys()):
        feed_name = signature.inputs[alias].name
        if alias in request_inputs:
            proto = request_inputs[alias]
            used.add(alias)
        elif alias in signature.defaults:
            proto = signature.defaults[alias]
        else:
            raise invalid_argument(
                f"Signature input alias: {alias}(feed name: {feed_name}) not found in request "
                "and no default value provided. Inputs expected to be in the request "
                f"{{{','.join(_keys(request_inputs))}}}, or default input alias set: "
                f"{','.join(_keys(signature.defaults))}"
            )
        # Checked where C++ decodes (so parsing errors come before "invalid name", as
        # upstream), decoded only once every input has passed.
        try:
            size = tensors.decoded_bytes(proto)
        except tensors.TensorProtoError as e:
            raise invalid_argument(f"tensor parsing error: {alias}: {e}") from None
        total += size
        if total > max_bytes:
            others = "" if total == size else f" ({total} with the inputs before it)"
            raise invalid_argument(
                f"tensor parsing error: {alias}: {tensors.describe_size(proto, size)}"
                f"{others}; a request's inputs may hold at most {max_bytes} bytes "
                "(--max_request_bytes)"
            )
        protos[alias] = (feed_name, proto)
    if len(request_inputs) and len(used) != len(request_inputs):
        raise invalid_argument(
            f"Inputs contains invalid name. Used request inputs: {','.join(sorted(used))}, "
            f"request input: {','.join(_keys(request_inputs))}"
        )
    feeds = {}
    for alias, (feed_name, proto) in protos.items():
        try:
            feeds[feed_name] = tensors.from_proto(proto)
        except tensors.TensorProtoError as e:
            raise invalid_argument(f"tensor parsing error: {alias}: {e}") from None
    return feeds


def output_selection(signature, output_filter) -> list[tuple[str, str]]:
    """(alias, tensor name) pairs to fetch: the filter in order, or every output."""
    selected = []
    seen = set()
    for alias in output_filter:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{','.join(_keys(signature.outputs))}}}."
            )
        if alias in seen:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
        selected.append((alias, signature.outputs[alias].name))
    if not selected:
        selected = [(alias, info.name) for alias, info in signature.outputs.items()]
    return selected


def run_predict(
    servable: Servable,
    request,
    options: RequestOptions,
    version: int | None,
):
    """Runs a ``PredictRequest`` on ``servable``; returns the ``PredictResponse``.

    ``version`` is echoed in the reply's model_spec (None for warmup replays, like C++).
    """
    from tensorflow_serving.apis import predict_pb2

    signature_name = resolve_signature_name(request.model_spec.signature_name)
    signature = servable.signature_defs.get(signature_name)
    if signature is None:
        raise failed_precondition(f'Serving signature key "{signature_name}" not found.')
    response = predict_pb2.PredictResponse()
    fill_model_spec(response.model_spec, request.model_spec.name, signature_name, version)

    verify_signature(signature, options)
    verify_inputs_size(signature, request)
    feeds = input_feeds(signature, request.inputs, options.max_request_bytes)
    selected = output_selection(signature, request.output_filter)
    fetched = servable.run(feeds, [name for _, name in selected], options.timeout_ms)
    for (alias, _), result in zip(selected, fetched):
        try:
            encode = tensors.to_proto_content if options.tensor_content else tensors.to_proto_field
            response.outputs[alias].CopyFrom(encode(result.value, result.dtype))
        except ValueError as e:
            raise internal(str(e)) from None
    return response
