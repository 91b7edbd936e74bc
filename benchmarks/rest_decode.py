"""REST predict decoding: the Python-object path, the numpy reader and simdjson.

Decodes each body with ``parse_predict_request`` (JSON text to a PredictRequest) three
ways, side by side in one run: ``object`` (json.loads and Python lists, the fast paths
off), ``numpy`` (json_numeric.numpy_predict_tensors, the regex + vectorised numpy reader
that was the fast path before simdjson) and ``simd`` (json_simd.simd_predict_tensors).
Times are medians (and minima) of interleaved rounds, so a busy machine slows all three
alike. Peak memory is the rise of the resident set (VmHWM over VmRSS before, which sees
simdjson's C++ buffers, tracemalloc would not) while decoding once, in a fresh
subprocess per body and path, per body byte.

    .venv/bin/python benchmarks/rest_decode.py [--rounds 9] [--no-batch]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
from tensorflow.core.framework import types_pb2

from serving_opt.model_server import json_predict
from serving_opt.model_server.json_numeric import numpy_predict_tensors
from serving_opt.model_server.json_simd import simd_predict_tensors
from serving_opt.tune.hardware import here

PATHS = {
    "object": lambda body, infos: None,
    "numpy": numpy_predict_tensors,
    "simd": simd_predict_tensors,
}
BODIES = ("image row", "image columnar", "uint8 image row", "batch 32 row")


def body(name: str) -> tuple[bytes, int]:
    """The body ``name`` (json.dumps of float32 values, as a Python client sends them) and
    its input's dtype.

    Example:
        >>> len(body("image row")[0]) > 10**6
        True
    """
    rng = np.random.RandomState(0)
    if name == "batch 32 row":
        images = rng.rand(32, 160, 160, 3).astype(np.float32)
        return json.dumps({"instances": images.tolist()}).encode(), types_pb2.DT_FLOAT
    image = rng.rand(1, 160, 160, 3).astype(np.float32)
    if name == "uint8 image row":
        pixels = (image * 255).astype(np.uint8)
        return json.dumps({"instances": pixels.tolist()}).encode(), body_dtype(name)
    key = "inputs" if name == "image columnar" else "instances"
    return json.dumps({key: image.tolist()}).encode(), body_dtype(name)


def body_dtype(name: str) -> int:
    """The input dtype of body ``name``.

    Example:
        >>> body_dtype("uint8 image row") == types_pb2.DT_UINT8
        True
    """
    return types_pb2.DT_UINT8 if name.startswith("uint8") else types_pb2.DT_FLOAT


def decode(data: bytes, dtype: int, path: str):
    """``parse_predict_request`` with ``path``'s fast decoder; checks it was used.

    Example:
        >>> request, fmt = decode(*body("image row"), "simd")
    """
    infos = {"x": SimpleNamespace(dtype=dtype)}
    fast = PATHS[path]
    used = []
    json_predict.fast_predict_tensors = lambda b, i: used.append(fast(b, i)) or used[0]
    result = json_predict.parse_predict_request(data, "m", None, None, lambda sig: infos)
    if path != "object" and used[0] is None:
        raise SystemExit(f"{path} fell back to the object path")
    return result


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _child(name: str, path: str, file: str) -> None:
    # the body from a file: building it here would leave freed Python objects' memory
    # in the process for the decode to reuse unseen
    dtype = body_dtype(name)
    with open(file, "rb") as f:
        data = f.read()
    decode(b'{"instances": [[1.0, 2.0]]}', types_pb2.DT_FLOAT, path)  # lazy imports
    gc.collect()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    result = decode(data, dtype, path)
    peak = _status("VmHWM")
    del result
    print(json.dumps({"peak": peak - before, "bytes": len(data)}))


def _peak_per_byte(name: str, path: str, file: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", name, path, file],
                         capture_output=True, text=True, check=True).stdout
    measured = json.loads(out.strip().splitlines()[-1])
    return measured["peak"] / measured["bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-batch", action="store_true", help="skip the 32-image batch")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    hardware = here()
    print(f"CPU: {hardware.cpu_model}, {hardware.cores} of {hardware.cpus} cores, "
          f"{' '.join(hardware.extensions)}")
    print(f"{'body':16} {'bytes':>10} | " + " | ".join(
        f"{p + ': median/min ms, B/byte':>25}" for p in PATHS))
    for name in BODIES:
        if args.no_batch and name.startswith("batch"):
            continue
        data, dtype = body(name)
        file = tempfile.NamedTemporaryFile(suffix=".json")
        file.write(data)
        file.flush()
        rounds = max(3, args.rounds // 3) if name.startswith("batch") else args.rounds
        times: dict[str, list[float]] = {p: [] for p in PATHS}
        for _ in range(rounds):
            for path in PATHS:  # interleaved: a busy moment slows every path alike
                start = time.perf_counter()
                decode(data, dtype, path)
                times[path].append(time.perf_counter() - start)
        cells = []
        for path in PATHS:
            median = statistics.median(times[path]) * 1e3
            cells.append(f"{median:9.1f} {min(times[path]) * 1e3:7.1f} "
                         f"{_peak_per_byte(name, path, file.name):7.2f}")
        file.close()
        print(f"{name:16} {len(data):10} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
