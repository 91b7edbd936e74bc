"""Regress: TF Serving's regressor.cc behaviour on one loaded servable.

A regression signature has exactly one input "inputs" and one output "outputs", a
DT_FLOAT tensor of shape [batch] or [batch, 1]; each example yields one ``Regression``.
An unknown signature is INVALID_ARGUMENT.
"""

from __future__ import annotations

from serving_opt.model_server import tensors
from serving_opt.model_server.example_input import ExampleApi
from serving_opt.model_server.request_options import (
    METHOD_REGRESS,
    RequestOptions,
    find_method_signature,
    method_name_error,
)
from serving_opt.model_server.servable import Servable
from serving_opt.model_server.status import failed_precondition, invalid_argument

INPUTS = "inputs"
OUTPUTS = "outputs"


def find_signature(signature_defs, signature_name: str, options: RequestOptions):
    """Looks up and structure-checks a regression signature (``GetRegressionSignatureDef``)."""
    return find_method_signature(signature_defs, signature_name, options, METHOD_REGRESS,
                                 "regression", tensor_names)


def tensor_names(signature, options: RequestOptions) -> tuple[str, list[str]]:
    """(input tensor, [output tensor]) after the structure checks."""
    if options.signature_method_name_check and signature.method_name != METHOD_REGRESS:
        raise method_name_error(signature, METHOD_REGRESS, "regression")
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise invalid_argument("Expected one output Tensor.")
    if INPUTS not in signature.inputs:
        raise invalid_argument(f"No regression inputs found in SignatureDef: {signature}")
    if OUTPUTS not in signature.outputs:
        raise invalid_argument(f"No regression outputs found in SignatureDef: {signature}")
    return signature.inputs[INPUTS].name, [signature.outputs[OUTPUTS].name]


def fill_result(signature, num_examples: int, output_names, fetched, result) -> None:
    """Validates the output tensor and fills a ``RegressionResult`` (C++ post-processing)."""
    from tensorflow.core.framework import types_pb2

    if len(fetched) != len(output_names):
        raise invalid_argument(
            "Expected output_tensors and output_tensor_names to have the same size."
        )
    if OUTPUTS not in signature.outputs:
        raise failed_precondition(f"No regression outputs found in SignatureDef: {signature}")
    output_name = signature.outputs[OUTPUTS].name
    output = next((f for n, f in zip(output_names, fetched) if n == output_name), None)
    if output is None:
        raise invalid_argument(f"Could not find output tensor '{output_name}'")
    shape = output.value.shape
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise invalid_argument(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but "
            f"got {tensors.shape_string(shape)}"
        )
    if num_examples != shape[0]:
        raise invalid_argument(
            "Input batch size did not match output batch size: "
            f"{num_examples} vs. {shape[0]}"
        )
    if output.dtype != types_pb2.DT_FLOAT:
        raise invalid_argument(
            f"Expected output Tensor of DT_FLOAT.  Got: {tensors.dtype_name(output.dtype)}"
        )
    if output.value.size != num_examples:
        raise invalid_argument(
            f"Expected output batch size to be {num_examples}.  Got: {output.value.size}"
        )
    for value in output.value.reshape(-1).tolist():
        result.regressions.add().value = value


def run_regress(servable: Servable, request, options: RequestOptions, version: int | None):
    """Runs a ``RegressionRequest``; returns the ``RegressionResponse``."""
    from tensorflow_serving.apis import regression_pb2

    return REGRESS.run(servable, request, regression_pb2.RegressionResponse(), options, version)


REGRESS = ExampleApi(find_signature, tensor_names, fill_result)
