"""Predict's float outputs written in bulk: each number is upstream's text (WriteDecimal:
six significant digits where they round-trip, else max_digits10), laid out as the
pretty writer lays out nested lists, in the row and columnar formats."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

from serving_opt.model_server import json_predict, json_write

SPECIALS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, 3.4028235e38, 0.1, 1 / 3, 100.0,
            1e6, 123456.0, 1234567.0, 1e-5, 2.0**24, 16777217.0, 9000000.0, -2.5e-7]


def _upstream_text(value: float, double: bool) -> str:
    """WriteDecimal's rule, written out here from its definition."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    cast = float if double else (lambda v: float(np.float32(v)))
    text = f"{value:.6g}"
    if cast(float(text)) != cast(value):
        text = f"{value:.17g}" if double else f"{value:.9g}"
    return text if ("." in text or "e" in text) else text + ".0"


def _values(dtype, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-30, 30, size)
    values = np.concatenate([SPECIALS, rng.standard_normal(size) * scale,
                             rng.integers(-1000, 1000, size)])
    with np.errstate(over="ignore"):
        return values.astype(dtype)


@pytest.mark.parametrize("double", [False, True])
def test_each_float_is_written_as_upstream_writes_it(double):
    values = _values(np.float64 if double else np.float32, 3000, seed=1)
    texts = json_write.decimals(values, double)
    expected = [_upstream_text(float(v), double) for v in values]
    assert texts == expected
    # Control: the values need both forms, and the special tokens.
    assert any(len(t.replace("-", "").replace(".", "")) > 7 for t in texts)
    assert {"NaN", "Infinity", "-Infinity", "-0.0", "1.0"} <= set(texts)


def _response(shape, names, dtype=types_pb2.DT_FLOAT, seed=0):
    response = predict_pb2.PredictResponse()
    field, np_type = (("float_val", np.float32) if dtype == types_pb2.DT_FLOAT
                      else ("double_val", np.float64))
    arrays = {}
    for i, name in enumerate(names):
        count = int(np.prod(shape))
        array = _values(np_type, count, seed + i)[:count].reshape(shape)
        tensor = tensor_pb2.TensorProto(dtype=dtype)
        getattr(tensor, field).extend(array.ravel().tolist())
        for size in shape:
            tensor.tensor_shape.dim.add().size = size
        response.outputs[name].CopyFrom(tensor)
        arrays[name] = array
    return response.outputs, arrays


def _nested_lists(array: np.ndarray, double: bool, single: bool = False):
    """The array as nested lists of formatted numbers, for the general pretty writer."""
    if array.ndim == 0:
        return json_write.Raw(_upstream_text(float(array), double))
    items = [_nested_lists(a, double, single) for a in array]
    return json_write.SingleLine(items) if single else items


def _same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("shape", [[1, 1000], [2, 3, 4], [3], [2, 0], [1], [2, 1, 1, 3]])
@pytest.mark.parametrize("names", [["scores"], ["a", "b"]])
@pytest.mark.parametrize("dtype", [types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE])
def test_float_outputs_are_laid_out_as_the_pretty_writer_lays_out_lists(shape, names, dtype):
    outputs, arrays = _response(shape, names, dtype)
    double = dtype == types_pb2.DT_DOUBLE
    columnar = {n: _nested_lists(arrays[n], double) for n in names}
    expected_columnar = json_write.dumps(
        {"outputs": columnar if len(names) > 1 else columnar[names[0]]})
    rows = []
    for i in range(shape[0]):
        row = {n: _nested_lists(arrays[n][i], double, single=True) for n in names}
        rows.append(row if len(names) > 1 else row[names[0]])
    expected_row = json_write.dumps({"predictions": rows})

    assert json_predict.predict_response_json(outputs, json_predict.COLUMNAR) == \
        expected_columnar
    assert json_predict.predict_response_json(outputs, json_predict.ROW) == expected_row
    # The numbers read back are the outputs' own (NaN and Infinity as upstream writes them).
    parsed = json.loads(json_predict.predict_response_json(outputs, json_predict.COLUMNAR))
    outputs_json = parsed["outputs"] if len(names) > 1 else {names[0]: parsed["outputs"]}
    for name in names:
        cast = np.float64 if double else np.float32
        assert _same(np.asarray(outputs_json[name], dtype=np.float64).astype(cast).tolist(),
                     arrays[name].tolist())


def test_float_outputs_take_the_bulk_path_and_other_dtypes_do_not():
    outputs, _ = _response([2, 3], ["scores"])
    assert isinstance(json_predict._nest("scores", outputs["scores"], 0), json_write.Array)
    ids = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, int64_val=[1, 2])
    ids.tensor_shape.dim.add().size = 2
    assert json_predict._nest("ids", ids, 0) == [1, 2]  # control: the general path


def test_a_float_output_with_fewer_values_than_its_shape_is_refused():
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0])
    tensor.tensor_shape.dim.add().size = 2
    response = predict_pb2.PredictResponse()
    response.outputs["x"].CopyFrom(tensor)
    with pytest.raises(Exception, match="Failed to write JSON value for tensor type: float"):
        json_predict.predict_response_json(response.outputs, json_predict.COLUMNAR)
