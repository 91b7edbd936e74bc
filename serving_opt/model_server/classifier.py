"""Classify: TF Serving's classifier.cc behaviour on one loaded servable.

The signature must look like a classification signature (one input "inputs"; outputs
"classes" DT_STRING and/or "scores" DT_FLOAT, both [batch, k]); an unknown signature is
INVALID_ARGUMENT here, unlike Predict. Examples are fed as one DT_STRING batch and each
row becomes one ``Classifications`` (label empty without a classes output).
"""

from __future__ import annotations

from serving_opt.model_server import tensors
from serving_opt.model_server.example_input import ExampleApi
from serving_opt.model_server.request_options import (
    METHOD_CLASSIFY,
    RequestOptions,
    find_method_signature,
    method_name_error,
)
from serving_opt.model_server.servable import Fetched, Servable
from serving_opt.model_server.status import invalid_argument

INPUTS = "inputs"
CLASSES = "classes"
SCORES = "scores"


def find_signature(signature_defs, signature_name: str, options: RequestOptions):
    """Looks up and structure-checks a classification signature (``GetClassificationSignatureDef``).
    """
    return find_method_signature(signature_defs, signature_name, options, METHOD_CLASSIFY,
                                 "classification", tensor_names)


def tensor_names(signature, options: RequestOptions) -> tuple[str, list[str]]:
    """(input tensor, [classes tensor?, scores tensor?]) after the structure checks."""
    if options.signature_method_name_check and signature.method_name != METHOD_CLASSIFY:
        raise method_name_error(signature, METHOD_CLASSIFY, "classification")
    if len(signature.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise invalid_argument(
            f"Expected one or two output Tensors, found {len(signature.outputs)}"
        )
    if INPUTS not in signature.inputs:
        raise invalid_argument(
            f"No classification inputs found in SignatureDef: {signature}"
        )
    if CLASSES not in signature.outputs and SCORES not in signature.outputs:
        raise invalid_argument(
            'Expected classification signature outputs to contain at least one of "classes" '
            f'or "scores". Signature was: {signature}'
        )
    outputs = [signature.outputs[k].name for k in (CLASSES, SCORES) if k in signature.outputs]
    return signature.inputs[INPUTS].name, outputs


def _check_matrix(kind: str, fetched: Fetched, dtype: int, num_examples: int) -> None:
    shape = fetched.value.shape
    if len(shape) != 2:
        raise invalid_argument(
            "Expected Tensor shape: [batch_size num_classes] but got "
            f"{tensors.shape_string(shape)}"
        )
    if fetched.dtype != dtype:
        raise invalid_argument(
            f"Expected {kind} Tensor of {tensors.dtype_name(dtype)}. Got: "
            f"{tensors.dtype_name(fetched.dtype)}"
        )
    if shape[0] != num_examples:
        raise invalid_argument(
            f"Expected {kind} output batch size of {num_examples}. Got: {shape[0]}"
        )


def fill_result(signature, num_examples: int, output_names, fetched, result) -> None:
    """Validates the fetched tensors and fills a ``ClassificationResult`` (C++ post-processing)."""
    from tensorflow.core.framework import types_pb2

    if len(fetched) != len(output_names):
        raise invalid_argument(
            f"Expected {len(output_names)} output tensor(s).  Got: {len(fetched)}"
        )
    classes_name = signature.outputs[CLASSES].name if CLASSES in signature.outputs else None
    scores_name = signature.outputs[SCORES].name if SCORES in signature.outputs else None
    classes = scores = None
    for name, value in zip(output_names, fetched):
        if name == classes_name:
            classes = value
        elif name == scores_name:
            scores = value
    if classes is not None:
        _check_matrix("classes", classes, types_pb2.DT_STRING, num_examples)
    if scores is not None:
        _check_matrix("scores", scores, types_pb2.DT_FLOAT, num_examples)
    if classes is not None and scores is not None:
        if classes.value.shape[1] != scores.value.shape[1]:
            raise invalid_argument(
                "Tensors class and score should match in dim_size(1). Got "
                f"{classes.value.shape[1]} vs. {scores.value.shape[1]}"
            )
    reference = classes if classes is not None else scores
    num_classes = reference.value.shape[1] if reference is not None else 0
    labels = classes.value.tolist() if classes is not None else None
    values = scores.value.tolist() if scores is not None else None
    for i in range(num_examples):
        classifications = result.classifications.add()
        for c in range(num_classes):
            cls = classifications.classes.add()
            if labels is not None:
                # proto3 strings must be UTF-8 in Python; C++ would pass raw bytes through.
                cls.label = labels[i][c].decode("utf-8", errors="replace")
            if values is not None:
                cls.score = values[i][c]


def run_classify(servable: Servable, request, options: RequestOptions, version: int | None):
    """Runs a ``ClassificationRequest``; returns the ``ClassificationResponse``."""
    from tensorflow_serving.apis import classification_pb2

    response = classification_pb2.ClassificationResponse()
    return CLASSIFY.run(servable, request, response, options, version)


CLASSIFY = ExampleApi(find_signature, tensor_names, fill_result)
