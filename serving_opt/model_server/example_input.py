"""The ``Input`` message of Classify/Regress/MultiInference as a batch of serialized Examples.

TF Serving (util.cc ``InputToSerializedExampleTensor``) feeds the signature's one input a
DT_STRING vector: each ``example_list`` entry as is, or for ``example_list_with_context``
the serialized context followed by the serialized example - a byte concatenation that
parses as the merge of the two protos. :class:`ExampleApi` runs Classify or Regress on
such a batch (upstream's ``RunClassify`` / ``RunRegress``, which differ only in the
signature they look for and the result they fill).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving_opt.model_server.request_options import (
    DEFAULT_MAX_REQUEST_BYTES,
    RequestOptions,
    fill_model_spec,
)
from serving_opt.model_server.status import invalid_argument
from serving_opt.model_server.tensors import STRING_CHARACTER_COPIES, STRING_ELEMENT_BYTES


def serialized_examples(input_proto, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> np.ndarray:
    """The [N] object array of serialized examples; INVALID_ARGUMENT "Input is empty." if N=0.

    Refused first (INVALID_ARGUMENT) where the batch would hold more than ``max_bytes``:
    each example costs a string element (tensors.STRING_ELEMENT_BYTES) and its serialized
    bytes twice, with the context copied into every one.
    """
    kind = input_proto.WhichOneof("kind")
    _check_batch_size(input_proto, kind, max_bytes)
    if kind == "example_list":
        values = [e.SerializeToString() for e in input_proto.example_list.examples]
    elif kind == "example_list_with_context":
        with_context = input_proto.example_list_with_context
        context = with_context.context.SerializeToString()
        values = [context + e.SerializeToString() for e in with_context.examples]
    else:
        values = []
    if not values:
        raise invalid_argument("Input is empty.")
    batch = np.empty(len(values), dtype=object)
    batch[:] = values
    return batch


def _check_batch_size(input_proto, kind: str | None, max_bytes: int) -> None:
    if kind == "example_list":
        examples = input_proto.example_list.examples
        context = 0
    elif kind == "example_list_with_context":
        examples = input_proto.example_list_with_context.examples
        context = input_proto.example_list_with_context.context.ByteSize()
    else:
        return
    count = len(examples)
    # ByteSize (computed in C) bounds the examples' serialized bytes from above.
    size = count * (STRING_ELEMENT_BYTES + STRING_CHARACTER_COPIES * context) + \
        STRING_CHARACTER_COPIES * input_proto.ByteSize()
    if size > max_bytes:
        raise invalid_argument(
            f"{count} examples would hold about {size} bytes once serialized for the model, "
            f"over the {max_bytes}-byte limit (--max_request_bytes); send fewer examples "
            "or raise the limit"
        )


@dataclass(frozen=True)
class ExampleApi:
    """An inference API over serialized Examples (classify, regress): how it finds and
    checks its signature (``find_signature(defs, name, options)``), names the tensors to
    feed and fetch (``tensor_names(signature, options)``) and fills its result
    (``fill_result(signature, num_examples, output_names, fetched, result)``).
    """

    find_signature: Callable
    tensor_names: Callable
    fill_result: Callable

    def run(self, servable, request, response, options: RequestOptions, version: int | None):
        """Runs ``request`` on ``servable`` and fills ``response`` (returned)."""
        signature = self.find_signature(
            servable.signature_defs, request.model_spec.signature_name, options
        )
        fill_model_spec(
            response.model_spec, request.model_spec.name, request.model_spec.signature_name,
            version,
        )
        input_name, output_names = self.tensor_names(signature, options)
        examples = serialized_examples(request.input, options.max_request_bytes)
        fetched = servable.run({input_name: examples}, output_names, options.timeout_ms)
        self.fill_result(signature, len(examples), output_names, fetched, response.result)
        return response
