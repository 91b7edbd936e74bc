"""Predict over REST: the JSON request as a PredictRequest and the response as JSON.

Two request shapes, as TF Serving's REST API takes them (json_tensor.cc):

* row format, ``{"instances": [...]}``: one entry per example, batched along a new first
  dimension; every entry has the same shape; with several inputs each entry is an object
  of them all. The answer is ``{"predictions": [...]}``, one entry per example, which
  needs every output to have the same batch size ("Tensor name: x has inconsistent batch
  size: 2 expecting: 3");
* columnar format, ``{"inputs": ...}``: whole tensors, one value or an object of them.
  The answer is ``{"outputs": ...}``, whole tensors.

Values go through :mod:`.json_dtypes`. Where C++ iterates a protobuf map (whose order is
unspecified) this module uses sorted names.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

from serving_opt.model_server.json_dtypes import (
    add_value,
    dtype_string,
    is_b64,
    json_values,
)
from serving_opt.model_server.json_numeric import fast_predict_tensors, fill_tensor
from serving_opt.model_server.json_read import (
    check_object_tree,
    fill_model_spec,
    parse_json,
    signature_name,
)
from serving_opt.model_server.json_write import (
    Array,
    Raw,
    SingleLine,
    debug_string,
    decimals,
    dumps,
    single_lines,
)
from serving_opt.model_server.request_options import DEFAULT_MAX_REQUEST_BYTES
from serving_opt.model_server.status import ServingStatusError, invalid_argument
from serving_opt.model_server.tensors import MAX_DIMENSIONS

ROW = "row"
COLUMNAR = "columnar"
# Outputs written by json_write.decimals in bulk: dtype -> (TensorProto field, double).
_DECIMAL_FIELDS = {types_pb2.DT_FLOAT: ("float_val", False),
                   types_pb2.DT_DOUBLE: ("double_val", True)}

# The Python-object path (json.loads and lists of Python numbers) takes ~50 bytes of
# memory per value: a body it must decode is refused past this many values (commas),
# about 200 MiB of objects. Nested lists of numbers do not count: json_numeric decodes
# them straight to numpy at a few bytes per body byte.
MAX_OBJECT_TREE_VALUES = 1 << 22


def parse_predict_request(
    body: bytes,
    name: str,
    version: int | None,
    label: str | None,
    input_infos: Callable[[str], object],
    max_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
):
    """``FillPredictRequestFromJson``: (PredictRequest, ROW or COLUMNAR).

    ``input_infos(signature_name)`` returns the signature's inputs map (it raises for an
    unknown model or signature, like the C++ ``GetInfoMap``). A body decoded as Python
    objects is refused first where its values would cost more than ``max_bytes``.
    """
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    fill_model_spec(request.model_spec, name, version, label)
    fast = fast_predict_tensors(body, input_infos)
    if fast is not None:
        signature, tensors, fmt = fast
        if signature is not None:
            request.model_spec.signature_name = signature
        for alias, (values, dims, dtype) in tensors.items():
            fill_tensor(request.inputs[alias], values, dims, dtype)
        return request, fmt
    _check_object_tree_size(body, max_bytes)
    doc = parse_json(body)
    signature = signature_name(doc)
    if signature is not None:
        request.model_spec.signature_name = signature
    infos = dict(input_infos(request.model_spec.signature_name))
    if not infos:
        raise invalid_argument(
            "Failed to get input map for signature: "
            f"{request.model_spec.signature_name or 'DEFAULT'}"
        )
    if "instances" in doc:
        if "inputs" in doc:
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only one "
                "of 'inputs' or 'instances' keys to exist "
            )
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} Expecting 'instances' to be an list/array"
            )
        if not instances:
            raise invalid_argument(
                f"JSON Value: {debug_string(doc)} No values in 'instances' array"
            )
        tensors, fmt = _tensors_from_instances(instances, infos), ROW
    elif "inputs" in doc:
        tensors, fmt = _tensors_from_inputs(doc["inputs"], infos), COLUMNAR
    else:
        raise invalid_argument("Missing 'inputs' or 'instances' key")
    for alias, tensor in tensors.items():
        request.inputs[alias].CopyFrom(tensor)
    return request, fmt


def _check_object_tree_size(body: bytes, max_bytes: int) -> None:
    check_object_tree(body, max_bytes, MAX_OBJECT_TREE_VALUES,
                      "json_predict.MAX_OBJECT_TREE_VALUES")


def predict_response_json(outputs, fmt: str) -> bytes:
    """``MakeJsonFromTensors``: ``{"predictions": [...]}`` (row) or ``{"outputs": ...}``.
    """
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    multiple = len(names) > 1
    if fmt == COLUMNAR:
        if multiple:
            return dumps({"outputs": {n: _nest(n, outputs[n], 0) for n in names}})
        return dumps({"outputs": _nest(names[0], outputs[names[0]], 0)})
    if fmt != ROW:
        raise invalid_argument("Invalid request format")
    batch = -1
    for name in names:
        dims = outputs[name].tensor_shape.dim
        if not dims:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and dims[0].size != batch:
            raise invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {dims[0].size} expecting: "
                f"{batch}"
            )
        batch = dims[0].size
    rows = {n: _nest(n, outputs[n], 1) for n in names}
    predictions = []
    for i in range(max(batch, 0)):
        if multiple:
            predictions.append({n: _one_line(rows[n][i]) for n in names})
        else:
            predictions.append(_one_line(rows[names[0]][i]))
    return dumps({"predictions": predictions})


# ----------------------------------------------------------------------------- requests


def _tensors_from_instances(instances: list, infos) -> dict:
    names = sorted(infos)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )

    def is_object(v) -> bool:
        return isinstance(v, dict) and not is_b64(v)

    objects = is_object(instances[0])
    tensors: dict = {}
    sizes: dict[str, int] = {}
    shapes: dict[str, list[int]] = {}

    def add(item, name: str) -> None:
        if name not in infos:
            raise invalid_argument(f"JSON object: does not have named input: {name}")
        tensor = tensors.setdefault(name, tensor_pb2.TensorProto())
        shape = _dense_shape(item, outer_dims=1)  # instances add the batch dimension
        size = _fill(item, 0, infos[name].dtype, tensor, shape)
        if name not in sizes:
            sizes[name], shapes[name] = size, shape
        elif sizes[name] != size:
            raise invalid_argument(f"Expecting tensor size: {sizes[name]} but got: {size}")
        elif shapes[name] != shape:
            raise invalid_argument(
                f"Expecting shape {_shape_text(shapes[name])} but got: {_shape_text(shape)}"
            )

    for index, element in enumerate(instances):
        if objects:
            if not is_object(element):
                raise invalid_argument(
                    f"Expecting object but got list at item {index} of input list"
                )
            for name, item in element.items():
                try:
                    add(item, name)
                except ServingStatusError as e:
                    raise invalid_argument(
                        f"Failed to process element: {index} key: {name} of 'instances' "
                        f"list. Error: {e.to_text()}"
                    ) from None
            if set(element) != set(names):
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{debug_string(element)} keys must be equal to: {','.join(names)}"
                )
        else:
            if is_object(element):
                raise invalid_argument(
                    f"Expecting value/list but got object at item {index} of input list"
                )
            try:
                add(element, names[0])
            except ServingStatusError as e:
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. Error: "
                    f"{e.to_text()}"
                ) from None
    for name, tensor in tensors.items():
        tensor.dtype = infos[name].dtype
        tensor.tensor_shape.Clear()
        for size in [len(instances), *shapes[name]]:
            tensor.tensor_shape.dim.add(size=size)
    return tensors


def _tensors_from_inputs(value, infos) -> dict:
    names = sorted(infos)
    if not isinstance(value, dict) or is_b64(value):
        if len(names) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: _tensor(value, infos[names[0]].dtype)}
    tensors = {}
    for name in names:
        if name not in value:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        tensors[name] = _tensor(value[name], infos[name].dtype)
    return tensors


def _tensor(value, dtype: int):
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    shape = _dense_shape(value)
    for size in shape:
        tensor.tensor_shape.dim.add(size=size)
    _fill(value, 0, dtype, tensor, shape)
    return tensor


def _dense_shape(value, outer_dims: int = 0) -> list[int]:
    """The shape the first elements describe; lists nested deeper than a tensor's 254
    dimensions (counting ``outer_dims`` around them) are INVALID_ARGUMENT, before the
    recursive fill could overflow the stack on them."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if len(shape) + outer_dims > MAX_DIMENSIONS:
            raise invalid_argument(
                f"JSON lists nested more than {MAX_DIMENSIONS - outer_dims} deep; a tensor has "
                f"at most {MAX_DIMENSIONS} dimensions"
            )
        if not value:
            break
        value = value[0]
    return shape


def _fill(value, level: int, dtype: int, tensor, shape: list[int]) -> int:
    """``FillTensorProto``: appends the values; returns how many."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(
                f"JSON Value: {debug_string(value)} found at incorrect level: {level + 1} in "
                f"the JSON DOM. Expected at level: {rank}"
            )
        add_value(value, dtype, tensor)
        return 1
    if level >= rank:
        raise invalid_argument(
            f"Encountered list at unexpected level: {level} expected < {rank}"
        )
    if len(value) != shape[level]:
        raise invalid_argument(
            f"Encountered list at unexpected size: {len(value)} at level: {level} expected "
            f"size: {shape[level]}"
        )
    return sum(_fill(v, level + 1, dtype, tensor, shape) for v in value)


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# ---------------------------------------------------------------------------- responses


def _nest(name: str, tensor, first_dim: int):
    """The tensor as nested lists from dimension ``first_dim`` on, one item per leading row."""
    shape = [d.size for d in tensor.tensor_shape.dim]
    if tensor.dtype in _DECIMAL_FIELDS and shape:
        return _float_rows(tensor, shape, first_dim)
    values = json_values(tensor, name)
    if int(np.prod(shape, dtype=np.int64)) > len(values):
        raise invalid_argument(
            f"Failed to write JSON value for tensor type: {dtype_string(tensor.dtype)}"
        )
    position = 0

    def build(dim: int):
        nonlocal position
        if dim >= len(shape):
            position += 1
            return values[position - 1]
        return [build(dim + 1) for _ in range(shape[dim])]

    if first_dim == 0:
        return build(0)
    return [build(1) for _ in range(shape[0])]


def _float_rows(tensor, shape: list[int], first_dim: int):
    """:func:`_nest` of a float or double tensor, as :class:`~.json_write.Array` blocks."""
    field, double = _DECIMAL_FIELDS[tensor.dtype]
    values = getattr(tensor, field)
    count = int(np.prod(shape, dtype=np.int64))
    if count > len(values):
        raise invalid_argument(
            f"Failed to write JSON value for tensor type: {dtype_string(tensor.dtype)}"
        )
    texts = decimals(np.array(values[:count] if count < len(values) else values,
                              dtype=np.float64 if double else np.float32), double)
    if first_dim == 0:
        return Array(texts, shape)
    row = count // shape[0] if shape[0] else 0
    if len(shape) == 1:
        return [Raw(text) for text in texts]
    return [Array(texts[i * row:(i + 1) * row], shape[1:]) for i in range(shape[0])]


def _one_line(value):
    if isinstance(value, Array):
        return Array(value.texts, value.shape, single=True)
    return SingleLine(single_lines(value)) if isinstance(value, list) else value
