"""REST predict decoding: the Python-object path (json.loads) against json_tensors.

Prints, for each body, the time (min/median of several runs) and the peak traced memory
(tracemalloc sees numpy's allocations) per body byte of ``parse_predict_request`` with
the fast path off (old) and on (new), side by side in one run.

    .venv/bin/python benchmarks/rest_decode.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from types import SimpleNamespace

import numpy as np
from tensorflow.core.framework import types_pb2

from serving_opt.serving.model_server import json_predict
from serving_opt.serving.model_server.json_tensors import fast_predict_tensors


def _bodies():
    rng = np.random.RandomState(0)
    image = rng.rand(1, 160, 160, 3).astype(np.float32)
    yield "160x160x3 float image (json.dumps)", json.dumps({"instances": image.tolist()})
    pixels = (image * 255).astype(np.uint8)
    yield "160x160x3 uint8 image (json.dumps)", json.dumps({"instances": pixels.tolist()})
    def pixel(values) -> str:
        return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"

    rows = ", ".join("[" + ", ".join(pixel(p) for p in row) + "]" for row in image[0])
    yield "160x160x3 float image (%.6g)", '{"instances": [[' + rows + "]]}"
    rows = []
    size = 0
    while size < 2 * 1024 * 1024:  # a 2 MiB body: 256-float embeddings, row format
        row = json.dumps(rng.randn(256).astype(np.float32).tolist())
        rows.append(row)
        size += len(row) + 2
    yield f"2 MiB body ({len(rows)}x256 floats)", '{"instances": [' + ", ".join(rows) + "]}"


def _run(body: bytes, fast: bool, dtype: int):
    infos = {"x": SimpleNamespace(dtype=dtype)}
    json_predict.fast_predict_tensors = fast_predict_tensors if fast else (lambda b, i: None)
    return json_predict.parse_predict_request(body, "m", None, None, lambda sig: infos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'body':40} {'bytes':>9} | {'path':4} {'min ms':>8} {'median ms':>9} "
          f"{'peak B/byte':>11}")
    for label, text in _bodies():
        body = text.encode()
        dtype = types_pb2.DT_UINT8 if "uint8" in label else types_pb2.DT_FLOAT
        for name, fast in (("old", False), ("new", True)):
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                _run(body, fast, dtype)
                times.append(time.perf_counter() - start)
            peaks = []
            for _ in range(3):
                tracemalloc.start()
                _run(body, fast, dtype)
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
            print(f"{label:40} {len(body):9} | {name:4} {min(times) * 1e3:8.1f} "
                  f"{statistics.median(times) * 1e3:9.1f} {min(peaks) / len(body):11.2f}")
    json_predict.fast_predict_tensors = fast_predict_tensors


if __name__ == "__main__":
    main()
