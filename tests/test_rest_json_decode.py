"""json_tensors' fast decode against the Python-object path: same tensors, same errors."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
from tensorflow.core.framework import types_pb2

from serving_opt.serving.model_server import json_predict, json_tensors
from serving_opt.serving.model_server.status import ServingStatusError
from serving_opt.serving.model_server.tensors import from_proto

DTYPES = [types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_INT32, types_pb2.DT_INT64,
          types_pb2.DT_UINT8, types_pb2.DT_INT8, types_pb2.DT_UINT64]


def _infos(names, dtype):
    return lambda sig: {n: SimpleNamespace(dtype=dtype) for n in names}


def _decode(body, infos, fast: bool):
    old = json_tensors.MIN_FAST_BYTES
    try:
        json_tensors.MIN_FAST_BYTES = 0 if fast else 1 << 62
        # the default argument was bound at definition: patch through a wrapper
        orig = json_tensors.fast_predict_tensors
        if fast:
            json_predict.fast_predict_tensors = lambda b, i: orig(b, i, min_bytes=0)
        else:
            json_predict.fast_predict_tensors = lambda b, i: None
        request, fmt = json_predict.parse_predict_request(body, "m", None, None, infos)
    except ServingStatusError as e:
        return ("error", e.code, e.message)
    finally:
        json_predict.fast_predict_tensors = orig
        json_tensors.MIN_FAST_BYTES = old
    out = {}
    for alias, tensor in request.inputs.items():
        value = from_proto(tensor)
        out[alias] = (tensor.dtype, value.shape, value.dtype.str, value.tobytes())
    return (fmt, request.model_spec.signature_name, out)


def _number(rng: random.Random, integer: bool) -> str:
    kind = rng.random()
    if integer or kind < 0.2:
        return str(rng.choice([0, -0, 1, -1, 255, 256, -129, 2**31, 2**63 - 1, 2**63,
                               2**64, rng.randint(-1000, 1000)]))
    if kind < 0.5:
        return repr(float(np.float32(rng.uniform(-2, 2))))
    if kind < 0.6:
        return rng.choice(["-0", "-0.0", "0.0", "1e5", "1E-5", "2.5e+3", "1e400", "-1e-400",
                           "123456789012345678901", "0.1", "3.4028235677973366e38",
                           "1.00000005960464477539", "7.00000006e-45", "1.5e-45"])
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 22)))
    text = digits.lstrip("0") or "0"
    if rng.random() < 0.7:
        text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))
    if rng.random() < 0.2:
        text += rng.choice(["e", "E"]) + rng.choice(["", "+", "-"]) + str(rng.randint(0, 40))
    return ("-" if rng.random() < 0.3 else "") + text


def _array(rng, shape, integer):
    if not shape:
        return _number(rng, integer)
    sep = rng.choice([",", ", ", " ,\n "])
    return "[" + sep.join(_array(rng, shape[1:], integer) for _ in range(shape[0])) + "]"


_CORRUPTIONS = ["", ",", "[", "]", "01", "-", ".", "+1", "1.", ".5", "1e", "--1", "NaN",
                "Infinity", " 1 2", "1 2", "]]", "[]", "1.2.3", "1e5e5", "\"x\"", "true"]


def _corrupt(rng, text):
    if rng.random() < 0.5:
        return text
    i = rng.randrange(len(text))
    j = min(len(text), i + rng.randint(0, 3))
    return text[:i] + rng.choice(_CORRUPTIONS) + text[j:]


@pytest.mark.parametrize("seed", range(60))
def test_fast_decode_matches_object_path(seed):
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    integer = dtype != types_pb2.DT_FLOAT and dtype != types_pb2.DT_DOUBLE
    for _ in range(25):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:
            names = ["a", "b"]
            rows = ", ".join(
                "{" + ", ".join(f'"{n}": {_array(rng, shape[1:] or [2], integer)}'
                                for n in names) + "}"
                for _ in range(shape[0])
            )
            body = '{"instances": [' + rows + "]}"
            if rng.random() < 0.5:
                body = ('{"inputs": {"a": ' + _array(rng, shape, integer) + ', "b": '
                        + _array(rng, shape, integer) + "}}")
        else:
            names = ["x"]
            key = rng.choice(["instances", "inputs"])
            body = "{" + f'"{key}": ' + _array(rng, shape, integer) + "}"
            if rng.random() < 0.2:
                body = '{"signature_name": "s", ' + body[1:]
        body = _corrupt(rng, body).encode()
        infos = _infos(names, dtype)
        assert _decode(body, infos, True) == _decode(body, infos, False), body


def test_image_is_decoded_fast_path():
    image = np.random.RandomState(0).rand(1, 16, 16, 3).astype(np.float32)
    body = json.dumps({"instances": image.tolist()}).encode()
    infos = _infos(["x"], types_pb2.DT_FLOAT)
    assert json_tensors.fast_predict_tensors(body, infos) is not None
    request, fmt = json_predict.parse_predict_request(body, "m", None, None, infos)
    assert fmt == "row"
    np.testing.assert_array_equal(from_proto(request.inputs["x"]), image)


def test_exact_float32_rounding_of_long_decimals():
    rng = np.random.RandomState(1)
    values = rng.randint(0, 2**63, size=4000, dtype=np.int64)
    texts = [f"0.{v:019d}{rng.randint(10**5)}" for v in values]
    # past 19 digits with leading zeros (json.dumps of small floats): read by columns
    texts += [f"{rng.choice(['', '-'])}0.{'0' * rng.randint(1, 5)}{v:d}"[:rng.randint(3, 26)]
              for v in values]
    texts = [t if t[-1] != "." else t + "5" for t in texts]
    body = ('{"inputs": [' + ",".join(texts) + "]}").encode()
    for dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        infos = _infos(["x"], dtype)
        assert _decode(body, infos, True) == _decode(body, infos, False)


def test_object_tree_limit_names_itself(monkeypatch):
    monkeypatch.setattr(json_predict, "MAX_OBJECT_TREE_VALUES", 100)
    body = ('{"instances": [' + ",".join('"s"' for _ in range(200)) + "]}").encode()
    with pytest.raises(ServingStatusError) as e:
        json_predict.parse_predict_request(body, "m", None, None,
                                           _infos(["x"], types_pb2.DT_STRING))
    assert "MAX_OBJECT_TREE_VALUES" in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["row", "columnar", "row_objects", "columnar_named"])
def test_typical_bodies_take_the_fast_path(dtype, layout):
    rng = np.random.RandomState(2)
    integer = dtype not in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)

    def value(shape):
        if integer:
            return rng.randint(0, 100, size=shape).tolist()
        return rng.uniform(-3, 3, size=shape).astype(np.float32).tolist()

    if layout == "row":
        names, doc = ["x"], {"instances": value((3, 8, 8))}
    elif layout == "columnar":
        names, doc = ["x"], {"signature_name": "s", "inputs": value((3, 8, 8))}
    elif layout == "row_objects":
        names = ["a", "b"]
        doc = {"instances": [{"a": value((8, 8)), "b": value((4,))} for _ in range(3)]}
    else:
        names, doc = ["a", "b"], {"inputs": {"a": value((3, 8, 8)), "b": value((2, 5))}}
    body = json.dumps(doc, indent=rng.choice([0, 2])).encode()
    infos = _infos(names, dtype)
    assert json_tensors.fast_predict_tensors(body, infos, min_bytes=0) is not None
    assert _decode(body, infos, True) == _decode(body, infos, False)


@pytest.mark.parametrize("seed", range(60, 75))
def test_fast_decode_matches_in_small_chunks(seed, monkeypatch):
    # chunk boundaries everywhere: the chunked loops must not change a value
    monkeypatch.setattr(json_tensors, "_GROUP_ROWS", 7)
    monkeypatch.setattr(json_tensors, "_GROUP_CHARS", 50)
    test_fast_decode_matches_object_path(seed)
    test_exact_float32_rounding_of_long_decimals()
