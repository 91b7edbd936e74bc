"""The ``Input`` message of Classify/Regress/MultiInference as a batch of serialized Examples.

TF Serving (util.cc ``InputToSerializedExampleTensor``) feeds the signature's one input a
DT_STRING vector: each ``example_list`` entry as is, or for ``example_list_with_context``
the serialized context followed by the serialized example - a byte concatenation that
parses as the merge of the two protos. :class:`ExampleApi` runs Classify or Regress on
such a batch (upstream's ``RunClassify`` / ``RunRegress``, which differ only in the
signature they look for and the result they fill).

Example:
    >>> from tensorflow_serving.apis import input_pb2
    >>> batch = serialized_examples(input_pb2.Input(example_list={"examples": [{}, {}]}))
    >>> batch.shape
    (2,)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving_opt.serving.model_server.request_options import RequestOptions, fill_model_spec
from serving_opt.serving.model_server.status import invalid_argument


def serialized_examples(input_proto) -> np.ndarray:
    """The [N] object array of serialized examples; INVALID_ARGUMENT "Input is empty." if N=0.

    Example:
        >>> serialized_examples(input_pb2.Input())
        Traceback (most recent call last):
        ServingStatusError: INVALID_ARGUMENT: Input is empty.
    """
    kind = input_proto.WhichOneof("kind")
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


@dataclass(frozen=True)
class ExampleApi:
    """An inference API over serialized Examples (classify, regress): how it finds and
    checks its signature (``find_signature(defs, name, options)``), names the tensors to
    feed and fetch (``tensor_names(signature, options)``) and fills its result
    (``fill_result(signature, num_examples, output_names, fetched, result)``).

    Example:
        >>> CLASSIFY = ExampleApi(find_signature, tensor_names, fill_result)
    """

    find_signature: Callable
    tensor_names: Callable
    fill_result: Callable

    def run(self, servable, request, response, options: RequestOptions, version: int | None):
        """Runs ``request`` on ``servable`` and fills ``response`` (returned).

        Example:
            >>> CLASSIFY.run(servable, request, ClassificationResponse(), RequestOptions(), 1)
        """
        signature = self.find_signature(
            servable.signature_defs, request.model_spec.signature_name, options
        )
        fill_model_spec(
            response.model_spec, request.model_spec.name, request.model_spec.signature_name,
            version,
        )
        input_name, output_names = self.tensor_names(signature, options)
        examples = serialized_examples(request.input)
        fetched = servable.run({input_name: examples}, output_names, options.timeout_ms)
        self.fill_result(signature, len(examples), output_names, fetched, response.result)
        return response
