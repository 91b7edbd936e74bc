"""json_numeric' fast decode against the Python-object path: same tensors, same errors."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
from tensorflow.core.framework import types_pb2

from serving_opt.model_server import json_numeric, json_predict, json_simd
from serving_opt.model_server.status import ServingStatusError
from serving_opt.model_server.tensors import from_proto

DTYPES = [types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_INT32, types_pb2.DT_INT64,
          types_pb2.DT_UINT8, types_pb2.DT_INT8, types_pb2.DT_UINT64]


def _infos(names, dtype):
    return lambda sig: {n: SimpleNamespace(dtype=dtype) for n in names}


PATHS = {
    "object": lambda body, infos: None,
    "fast": lambda body, infos: json_numeric.fast_predict_tensors(body, infos, min_bytes=0),
    "numpy": json_numeric.numpy_predict_tensors,
    "simd": json_simd.simd_predict_tensors,
}


def _decode(body, infos, path: str):
    """parse_predict_request's answer with ``path`` as its fast decoder ("object": none):
    the request's tensors as comparable bytes, or the error."""
    orig = json_predict.fast_predict_tensors
    try:
        json_predict.fast_predict_tensors = PATHS[path]
        request, fmt = json_predict.parse_predict_request(body, "m", None, None, infos)
    except ServingStatusError as e:
        return ("error", e.code, e.message)
    finally:
        json_predict.fast_predict_tensors = orig
    out = {}
    for alias, tensor in request.inputs.items():
        value = from_proto(tensor)
        out[alias] = (tensor.dtype, value.shape, value.dtype.str, value.tobytes())
    return (fmt, request.model_spec.signature_name, out)


def _same_as_object_path(body, infos, paths=("fast", "numpy", "simd")) -> None:
    expected = _decode(body, infos, "object")
    for path in paths:
        assert _decode(body, infos, path) == expected, (path, body[:300])


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


def _random_bodies_match(seed, paths):
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
        _same_as_object_path(body, _infos(names, dtype), paths)


@pytest.mark.parametrize("seed", range(60))
def test_fast_decode_matches_object_path(seed):
    _random_bodies_match(seed, ("fast", "numpy", "simd"))


def test_image_is_decoded_fast_path():
    image = np.random.RandomState(0).rand(1, 16, 16, 3).astype(np.float32)
    body = json.dumps({"instances": image.tolist()}).encode()
    infos = _infos(["x"], types_pb2.DT_FLOAT)
    assert json_simd.simd_predict_tensors(body, infos) is not None
    assert json_numeric.fast_predict_tensors(body, infos) is not None
    request, fmt = json_predict.parse_predict_request(body, "m", None, None, infos)
    assert fmt == "row"
    np.testing.assert_array_equal(from_proto(request.inputs["x"]), image)


def test_exact_float32_rounding_of_long_decimals():
    _long_decimals_match(("fast", "numpy", "simd"))


def _long_decimals_match(paths):
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
        assert json_simd.simd_predict_tensors(body, infos) is not None
        assert json_numeric.numpy_predict_tensors(body, infos) is not None
        _same_as_object_path(body, infos, paths)


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
    assert json_simd.simd_predict_tensors(body, infos) is not None
    assert json_numeric.numpy_predict_tensors(body, infos) is not None
    _same_as_object_path(body, infos)


@pytest.mark.parametrize("seed", range(60, 75))
def test_fast_decode_matches_in_small_chunks(seed, monkeypatch):
    # chunk boundaries everywhere: the chunked loops must not change a value
    monkeypatch.setattr(json_numeric, "_GROUP_ROWS", 7)
    monkeypatch.setattr(json_numeric, "_GROUP_CHARS", 50)
    _random_bodies_match(seed, ("numpy",))
    _long_decimals_match(("numpy",))


# Numbers at the edges of doubles, float32 and the integer dtypes, in every JSON spelling.
_EDGE_FLOATS = ["1e308", "-1.7976931348623157e308", "5e-324", "-5e-324", "2.2250738585072014e-308",
                "-0", "-0.0", "0", "0.0", "0.1", "-0.1", "0.30000000000000004",
                "12345678901234567", "1.2345678901234567", "9007199254740993",
                "0.99999999999999994", "3.4028234663852886e38", "3.4028235677973366e38",
                "1.401298464324817e-45", "7.006492321624085e-46", "1e-400", "-1e-400",
                "1E5", "1e+5", "1e-5", "1.5E-7", "-2.5e+30", "1e23", "8.589973e9",
                "18446744073709551615", "-9223372036854775808", "9223372036854775807",
                "9223372036854775808", "4503599627370497.5"]
_EDGE_INTS = ["0", "-0", "1", "-1", "127", "-128", "255", "32767", "-32768", "2147483647",
              "-2147483648", "2147483648", "-2147483649", "4294967295", "9007199254740993",
              "-9007199254740993", "9223372036854775807", "-9223372036854775808"]


def _edge_array(rng, shape, pool) -> str:
    if not shape:
        return rng.choice(pool)
    sep = rng.choice([",", ", ", " ,\n\t", "\r\n,  "])
    return "[" + sep.join(_edge_array(rng, shape[1:], pool) for _ in range(shape[0])) + "]"


@pytest.mark.parametrize("seed", range(12))
def test_edge_numbers_decoded_by_simdjson_as_by_the_object_path(seed):
    rng = random.Random(1000 + seed)
    accepted = 0
    for dtype in DTYPES + [types_pb2.DT_INT16, types_pb2.DT_UINT32]:
        integer = dtype not in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
        pool = _EDGE_INTS if integer else _EDGE_FLOATS
        for _ in range(8):
            shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
            key = rng.choice(["instances", "inputs"])
            array = _edge_array(rng, shape, pool)
            body = f'{rng.choice(["", " ", chr(10)])}{{"{key}" :{array} }}'.encode()
            infos = _infos(["x"], dtype)
            _same_as_object_path(body, infos, ("simd", "fast"))
            accepted += json_simd.simd_predict_tensors(body, infos) is not None
    assert accepted > 0  # not all of them fell back


def test_every_float_edge_number_takes_simdjson():
    # one tensor of them all (but 1e400-like ones, none here): decoded, not fallen back
    body = ('{"inputs": [' + ", ".join(_EDGE_FLOATS) + "]}").encode()
    for dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        infos = _infos(["x"], dtype)
        assert json_simd.simd_predict_tensors(body, infos) is not None
        _same_as_object_path(body, infos, ("simd",))


@pytest.mark.parametrize("body, dtype", [
    (b'{"instances": [[1, 2], [3], [4, 5, 6]]}', types_pb2.DT_FLOAT),  # ragged, same count
    (b'{"instances": [[1, 2], 3, [4]]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [[1, 2], [3, [4]]]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [[1, 2], [3, 4, 5]]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [[1, 2], []]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [[]]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, "2"]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, true]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, null]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, {"b64": "AA=="}]}', types_pb2.DT_FLOAT),
    (b'{"instances": [{"b64": [1, 2]}]}', types_pb2.DT_FLOAT),
    (b'{"inputs": {"b64": [1, 2]}}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, 2.5]}', types_pb2.DT_INT32),  # a float for an integer dtype
    (b'{"inputs": [1, 2.0]}', types_pb2.DT_INT64),
    (b'{"inputs": [1, 2147483648]}', types_pb2.DT_INT32),
    (b'{"inputs": [1, 256]}', types_pb2.DT_UINT8),
    (b'{"inputs": [-1, 2]}', types_pb2.DT_UINT32),
    (b'{"inputs": [1, 9223372036854775808]}', types_pb2.DT_UINT64),
    (b'{"inputs": [1, 123456789012345678901]}', types_pb2.DT_FLOAT),  # beyond 64 bits
    (b'{"inputs": [1, 1e400]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, NaN]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, Infinity]}', types_pb2.DT_DOUBLE),
    (b'{"inputs": [1, 2]} trailing', types_pb2.DT_FLOAT),
    (b'\xef\xbb\xbf{"inputs": [1, 2]}', types_pb2.DT_FLOAT),  # a BOM
    (b'{"inputs": [1, 2], "inputs": [3, 4]}', types_pb2.DT_FLOAT),  # duplicate keys
    (b'{"instances": [1, 2], "inputs": [3, 4]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, 2], "extra": [[[1]]]}', types_pb2.DT_FLOAT),
    (b'{"signature_name": 3, "inputs": [1, 2]}', types_pb2.DT_FLOAT),
    (b'{"inputs": 1.5}', types_pb2.DT_FLOAT),
    (b'{"instances": []}', types_pb2.DT_FLOAT),
    (b'[1, 2]', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, 2]}', types_pb2.DT_STRING),
    (b'{"inputs": [1, 2]}', types_pb2.DT_BOOL),
    (b'{"inputs": [1, 2]}', types_pb2.DT_HALF),
    (b'{"inputs": [1, 2}', types_pb2.DT_FLOAT),
    (b'{"inputs": [01, 2]}', types_pb2.DT_FLOAT),
    (b'{"inputs": [1, \xff]}', types_pb2.DT_FLOAT),
    (b'{"inputs": ' + b"[" * 300 + b"1" + b"]" * 300 + b"}", types_pb2.DT_FLOAT),
])
def test_simdjson_falls_back_where_it_cannot_promise_the_same(body, dtype):
    infos = _infos(["x"], dtype)
    assert json_simd.simd_predict_tensors(body, infos) is None
    _same_as_object_path(body, infos)


@pytest.mark.parametrize("body, names", [
    (b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4], "b": [5]}]}', ["a", "b"]),  # ragged
    (b'{"instances": [{"a": [1], "b": [3]}, {"a": [4]}]}', ["a", "b"]),  # a name missing
    (b'{"instances": [{"a": [1], "b": [3]}, {"a": [4], "b": [5], "c": [6]}]}', ["a", "b"]),
    (b'{"instances": [{"a": [1], "b": [3]}, {"a": [4], "a": [5]}]}', ["a", "b"]),
    (b'{"instances": [{"a": [1], "b": [3]}, [4]]}', ["a", "b"]),
    (b'{"instances": [[1], [2]]}', ["a", "b"]),
    (b'{"inputs": {"a": [1, 2]}}', ["a", "b"]),
    (b'{"inputs": {"a": [1, 2], "b": "x"}}', ["a", "b"]),
    (b'{"inputs": {"a": [1, 2], "b": [3], "c": {"d": 1}}}', ["a", "b"]),
])
def test_simdjson_falls_back_on_named_inputs_it_cannot_decode(body, names):
    infos = _infos(names, types_pb2.DT_FLOAT)
    assert json_simd.simd_predict_tensors(body, infos) is None
    _same_as_object_path(body, infos)


def test_simdjson_decodes_named_inputs_and_ignores_what_the_object_path_ignores():
    body = (b'{"signature_name": "s\\"[,]", "other": 1e5, "inputs": '
            b'{"b": [[1, -0], [2.5, 3]], "a": [7], "c": "x", "d": null, "e": false, "f": -1}}')
    infos = _infos(["a", "b"], types_pb2.DT_FLOAT)
    decoded = json_simd.simd_predict_tensors(body, infos)
    assert decoded is not None and decoded[0] == 's"[,]' and decoded[2] == "columnar"
    assert decoded[1]["b"][1] == [2, 2] and not np.signbit(decoded[1]["b"][0][1])
    _same_as_object_path(body, infos)
    rows = b'{"instances": [{"b": [1, 2], "a": 3e0}, {"a": 4, "b": [5, 6]}]}'
    assert json_simd.simd_predict_tensors(rows, infos) is None  # a scalar per row: old path
    rows = b'{"instances": [{"b": [1, 2], "a": [3]}, {"a": [4], "b": [5, 6]}]}'
    decoded = json_simd.simd_predict_tensors(rows, infos)
    assert decoded is not None and decoded[1]["b"][1] == [2, 2]
    _same_as_object_path(rows, infos)


def test_dense_short_numbers_use_the_numpy_reader(monkeypatch):
    # simdjson's tape would take ~10 bytes a body byte: past SIMD_ANY_BYTES, numpy reads
    monkeypatch.setattr(json_numeric, "SIMD_ANY_BYTES", 0)
    calls = []
    monkeypatch.setattr(json_numeric, "simd_predict_tensors",
                        lambda *a: calls.append(a) or json_simd.simd_predict_tensors(*a))
    infos = _infos(["x"], types_pb2.DT_UINT8)
    dense = ('{"inputs": [' + ",".join(["1"] * 5000) + "]}").encode()
    assert json_numeric.fast_predict_tensors(dense, infos, min_bytes=0) is not None
    assert not calls
    floats = ('{"inputs": [' + ", ".join(["0.123456789012345"] * 500) + "]}").encode()
    assert json_numeric.fast_predict_tensors(floats, _infos(["x"], types_pb2.DT_FLOAT),
                                             min_bytes=0) is not None
    assert len(calls) == 1


def test_without_simdjson_the_numpy_reader_decodes_alone():
    # A --serving_version runtime venv made before serving-opt needed pysimdjson runs the
    # server from this checkout: the import must not fail, and the answer is the same.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        sys.modules["simdjson"] = None
        from types import SimpleNamespace
        import json
        import numpy as np
        from tensorflow.core.framework import types_pb2
        from serving_opt.model_server import json_simd, json_numeric
        image = np.random.default_rng(0).random((1, 40, 40, 3)).tolist()
        body = json.dumps({"instances": image}).encode()
        infos = {"x": SimpleNamespace(dtype=types_pb2.DT_FLOAT)}
        _, tensors, fmt = json_numeric.fast_predict_tensors(body, lambda s: infos)
        values, shape, _ = tensors["x"]
        expected = np.asarray(image, np.float32).ravel()
        print(json_simd.simdjson, fmt, shape, bool((values == expected).all()))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "row", "[1,", "40,", "40,", "3]", "True"]
