"""What a sandboxed process hands back to the host: JSON of an explicit schema.

The result file lies in a directory the sandbox can write, so a model can forge it.
Pickle cannot be read safely (a "restricted" unpickler still imports the modules a file
names, and importing one runs it); this format imports nothing but the modules of the
report types listed in :data:`SCHEMA`, and the protobuf modules of :data:`PROTOS`.

Every value but a JSON scalar is an object with one key saying what it is:
``{"tuple": [...]}``, ``{"list": [...]}``, ``{"dict": [[key, value], ...]}``,
``{"set": [...]}``, ``{"frozenset": [...]}``, ``{"bytes": base64}``,
``{"ndarray": [dtype, shape, base64]}`` (numeric, bool and string dtypes only),
``{"dataclass": [name, {field: value}]}`` (a name of :data:`SCHEMA`) and
``{"proto": [full name, base64]}`` (a name of :data:`PROTOS`).
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import re

from serving_opt.errors import ServingOptError

# The report dataclasses a sandboxed call returns (or an error carries), and every
# dataclass they hold: nothing else is built on the way out.
SCHEMA = frozenset({
    "serving_opt.pipeline.attempts:AttemptReport", "serving_opt.pipeline.attempts:Candidate",
    "serving_opt.pipeline.attempts:Verdict",
    "serving_opt.compare.report:CompareReport", "serving_opt.compare.report:OutputComparison",
    "serving_opt.pipeline.run:OptimizeReport", "serving_opt.pipeline.run:SizeReport",
    "serving_opt.pipeline.run:StageReport",
    "serving_opt.savedmodel.checkpoint:KeptVariable",
    "serving_opt.serving.results:Check", "serving_opt.serving.results:LoadTest",
    "serving_opt.serving.results:ValidationReport",
    "serving_opt.stages.benchmark:BenchmarkReport", "serving_opt.stages.benchmark:Calibration",
    "serving_opt.stages.benchmark:Latency", "serving_opt.stages.benchmark:Ratio",
    "serving_opt.stages.benchmark:Skipped",
    "serving_opt.stages.coldstart:ColdStart", "serving_opt.stages.coldstart:ColdStartReport",
    "serving_opt.stages.parity:OutputParity", "serving_opt.stages.parity:ParityReport",
    "serving_opt.stages.quantize:QuantizedTensor",
    "serving_opt.tune.decide:Decision", "serving_opt.tune.grid:Objective",
    "serving_opt.tune.hardware:Hardware", "serving_opt.tune.load:LoadResult",
    "serving_opt.tune.profile:LatencyCurve", "serving_opt.tune.profile:ModelProfile",
    "serving_opt.tune.prove:ProvenPoint",
    "serving_opt.tune.report:Recommendation", "serving_opt.tune.report:TuneReport",
    "serving_opt.tune.settings:BatchingSettings",
    "serving_opt.tune.settings:ServingSettings", "serving_opt.tune.settings:ThreadSettings",
})
# Protobuf messages by full name: the module that defines each.
PROTOS = {
    "tensorflow.TensorProto": "tensorflow.core.framework.tensor_pb2",
    "tensorflow.serving.PredictionLog": "tensorflow_serving.apis.prediction_log_pb2",
}
# Byte order, kind (bool, signed, unsigned, float, complex, bytes, str), item size: never
# an object, void or structured dtype.
_DTYPE = re.compile(r"[<>|=][biufcSU]\d{1,4}")
_MAX_DIMS = 32
# Values in one result: each becomes a Python object of up to ~100 bytes whatever its
# few bytes of JSON, so a forged file of small values would cost the host many times its
# size. Arrays and bytes travel as base64, one value each; a real report has thousands.
MAX_VALUES = 1 << 21


def dumps(value) -> bytes:
    """``value`` as the boundary's JSON; TypeError for anything outside the schema."""
    return json.dumps(_encode(value), separators=(",", ":")).encode()


def _encode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return {"list": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {type(value).__name__: [_encode(v) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": base64.b64encode(value).decode()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = f"{type(value).__module__}:{type(value).__qualname__}"
        if name not in SCHEMA:
            raise TypeError(f"{name} is not in the sandbox's result schema")
        return {"dataclass": [name, {f.name: _encode(getattr(value, f.name))
                                     for f in dataclasses.fields(value) if f.init}]}
    module = type(value).__module__
    if module == "numpy":
        import numpy as np

        array = np.asarray(value)
        if not _DTYPE.fullmatch(array.dtype.str):
            raise TypeError(f"a numpy array of dtype {array.dtype} is not a result")
        if array.ndim == 0 and isinstance(value, np.generic):
            return _encode(value.item())
        return {"ndarray": [array.dtype.str, list(array.shape),
                            base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()]}
    descriptor = getattr(value, "DESCRIPTOR", None)
    if getattr(descriptor, "full_name", None) in PROTOS and hasattr(value, "SerializeToString"):
        return {"proto": [descriptor.full_name,
                          base64.b64encode(value.SerializeToString()).decode()]}
    raise TypeError(f"{type(value).__qualname__} is not in the sandbox's result schema")


def loads(data: bytes):
    """A result written by :func:`dumps`: builds only the schema's types, imports nothing
    else; ServingOptError for anything else (a forged or damaged file)."""
    # Every value but the first of an array or object follows a comma; each array or
    # object opens with a bracket: together, a bound on the values before any is built.
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if values > MAX_VALUES:
        raise _not_a_result(f"over {MAX_VALUES} values")
    try:
        return _decode(json.loads(data))
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
        raise _not_a_result(str(e)[:200]) from None


def _not_a_result(why: str) -> ServingOptError:
    return ServingOptError(f"the sandboxed process returned something that is not a result "
                           f"({why}); nothing of it was used",
                           "a model that writes files can forge its run's result: rerun "
                           "without --allow_file_ops")


def _decode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError("a value without its kind")
    (kind, body), = value.items()
    if kind in ("tuple", "list", "set", "frozenset"):
        items = [_decode(v) for v in _list(body)]
        return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[kind](items)
    if kind == "dict":
        return {_decode(k): _decode(v) for k, v in (_pair(item) for item in _list(body))}
    if kind == "bytes":
        return _b64(body)
    if kind == "dataclass":
        name, fields = _pair(body)
        return _dataclass(name, fields)
    if kind == "ndarray":
        return _ndarray(*_list(body))
    if kind == "proto":
        name, payload = _pair(body)
        if name not in PROTOS:
            raise ValueError(f"{str(name)[:80]!r} is not a message a sandbox may return")
        message = getattr(importlib.import_module(PROTOS[name]), name.rsplit(".", 1)[-1])()
        message.ParseFromString(_b64(payload))
        return message
    raise ValueError(f"{str(kind)[:40]!r} is not a kind of value a sandbox may return")


def _list(body) -> list:
    if not isinstance(body, list):
        raise ValueError("a list was expected")
    return body


def _pair(body) -> list:
    if not isinstance(body, list) or len(body) != 2:
        raise ValueError("a pair was expected")
    return body


def _b64(text) -> bytes:
    if not isinstance(text, str):
        raise ValueError("base64 text was expected")
    return base64.b64decode(text, validate=True)


def _dataclass(name, fields):
    # The name is checked against the schema before anything is imported.
    if not isinstance(name, str) or name not in SCHEMA:
        raise ValueError(f"{str(name)[:80]!r} is not a type a sandbox may return")
    if not isinstance(fields, dict):
        raise ValueError(f"{name} without its fields")
    module, _, qualname = name.partition(":")
    cls = getattr(importlib.import_module(module), qualname)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"{name} has no field {sorted(unknown)[0][:80]!r}")
    return cls(**{k: _decode(v) for k, v in fields.items()})


def _ndarray(dtype, shape, payload):
    import numpy as np

    if not isinstance(dtype, str) or not _DTYPE.fullmatch(dtype):
        raise ValueError(f"{str(dtype)[:40]!r} is not a dtype a sandbox may return")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError("an array's shape is not a list of sizes")
    data = _b64(payload)
    dt = np.dtype(dtype)
    count = 1
    for d in shape:
        count *= d
    if count * dt.itemsize != len(data):
        raise ValueError("an array's bytes do not match its shape")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()
