"""MultiInference: several classify/regress tasks over one batch, in one session run.

Mirrors multi_inference.cc: every task names the same model, signatures are distinct,
methods are classify or regress only (anything else UNIMPLEMENTED); the union of the
tasks' inputs is fed the same examples and the union of their outputs is fetched once;
results come back in task order.
"""

from __future__ import annotations

from serving_opt.model_server import classifier, regressor
from serving_opt.model_server.example_input import serialized_examples
from serving_opt.model_server.request_options import (
    METHOD_CLASSIFY,
    METHOD_REGRESS,
    RequestOptions,
    fill_model_spec,
    resolve_signature_name,
)
from serving_opt.model_server.servable import Servable
from serving_opt.model_server.status import invalid_argument, unimplemented


def run_multi_inference(
    servable: Servable, request, options: RequestOptions, version: int | None
):
    """Runs a ``MultiInferenceRequest``; returns the ``MultiInferenceResponse``."""
    from tensorflow_serving.apis import inference_pb2

    model_name = ""
    seen_signatures = set()
    input_names: set[str] = set()
    output_names: set[str] = set()
    for task in request.tasks:
        if not task.model_spec.name:
            raise invalid_argument("Found ModelSpec with an empty model name.")
        if not model_name:
            model_name = task.model_spec.name
        elif model_name != task.model_spec.name:
            raise invalid_argument(
                "All ModelSpecs in a MultiInferenceRequest must access the same model name."
            )
        signature_name = resolve_signature_name(task.model_spec.signature_name)
        if signature_name in seen_signatures:
            raise invalid_argument(f"Duplicate evaluation of signature: {signature_name}")
        seen_signatures.add(signature_name)
        signature = servable.signature_defs.get(signature_name)
        if signature is None:
            raise invalid_argument(
                f"Requested signature not found in model graph: {signature_name}"
            )
        if task.method_name == METHOD_CLASSIFY:
            input_name, names = classifier.tensor_names(signature, options)
        elif task.method_name == METHOD_REGRESS:
            input_name, names = regressor.tensor_names(signature, options)
        else:
            raise unimplemented(f"Unsupported signature method_name: {task.method_name}")
        input_names.add(input_name)
        output_names.update(names)

    # C++ keeps the names in std::set: sorted, deduplicated.
    fetch_names = sorted(output_names)
    examples = serialized_examples(request.input, options.max_request_bytes)
    fetched = servable.run(
        {name: examples for name in sorted(input_names)}, fetch_names, options.timeout_ms
    )
    response = inference_pb2.MultiInferenceResponse()
    for task in request.tasks:
        signature = servable.signature_defs[resolve_signature_name(task.model_spec.signature_name)]
        result = response.results.add()
        if task.method_name == METHOD_CLASSIFY:
            classifier.fill_result(
                signature, len(examples), fetch_names, fetched, result.classification_result
            )
        else:
            regressor.fill_result(
                signature, len(examples), fetch_names, fetched, result.regression_result
            )
        fill_model_spec(
            result.model_spec, task.model_spec.name, task.model_spec.signature_name, version
        )
    return response
