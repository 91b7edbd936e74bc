"""The ``Input`` message of Classify/Regress/MultiInference as a batch of serialized Examples.

TF Serving (util.cc ``InputToSerializedExampleTensor``) feeds the signature's one input a
DT_STRING vector: each ``example_list`` entry as is, or for ``example_list_with_context``
the serialized context followed by the serialized example - a byte concatenation that
parses as the merge of the two protos.

Example:
    >>> from tensorflow_serving.apis import input_pb2
    >>> batch = serialized_examples(input_pb2.Input(example_list={"examples": [{}, {}]}))
    >>> batch.shape
    (2,)
"""

from __future__ import annotations

import numpy as np

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
