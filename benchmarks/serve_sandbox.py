"""What serving from the sandbox costs per request, against the in-process server.

    python benchmarks/serve_sandbox.py WORK_DIR [--rounds=3] [--requests=300]

Builds a model whose run is nearly free (the mean of a 160x160x3 image: the request's
own cost is all there is to see), then starts ``serving-opt serve`` twice per round,
alternating: sandboxed (the default: REST on the handed-in socket, gRPC relayed through
a unix socket) and in-process (bubblewrap treated as unavailable, ``--allow_unsandboxed``),
so the only difference is the sandbox. Each server answers ``--requests`` gRPC Predicts
and as many REST predicts, one at a time (latency), then 8 concurrent gRPC clients for
3 s (throughput). It prints medians over rounds, the sandboxed/in-process ratios, and the
processor time of the whole serving process tree per request (the relay included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # process_tree beside it
from process_tree import tree_stats  # noqa: E402

IMAGE = (1, 160, 160, 3)


def build_model(base: str) -> str:
    import tensorflow as tf

    class Mean(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 160, 160, 3], tf.float32)])
        def serve(self, image):
            return {"mean": tf.reduce_mean(image, axis=[1, 2, 3])}

    module = Mean()
    export = os.path.join(base, "1")
    if not os.path.exists(export):
        tf.saved_model.save(module, export, signatures={"serving_default": module.serve})
    return base


def _tree_cpu_seconds(root: int) -> float:
    """user+system seconds of ``root`` and its live descendants (children's exited
    time included through their parents' cumulative fields)."""
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(sum(int(v) for v in stat[11:15]) / ticks
               for stat in tree_stats(root).values() if len(stat) > 14)


def start(base: str, sandboxed: bool) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    flags = [f"--model_base_path={base}", "--model_name=m", "--port=0", "--rest_api_port=-1"]
    if not sandboxed:
        # serving_opt's own marker for "already in a sandbox": serve runs in-process.
        env["SERVING_OPT_SANDBOXED"] = "1"
    process = subprocess.Popen([sys.executable, "-m", "serving_opt.cli", "serve", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=env)
    line = process.stdout.readline()
    if " AVAILABLE on " not in line:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    grpc_address = line.split(" AVAILABLE on ")[1].split(",")[0].split(" ")[0]
    rest_address = line.split("REST on ")[1].split(" ")[0].rstrip(",")
    return process, grpc_address, rest_address


def measure(base: str, sandboxed: bool, requests: int) -> dict:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    process, grpc_address, rest_address = start(base, sandboxed)
    try:
        image = np.random.default_rng(0).random(IMAGE, dtype=np.float32)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(image))
        body = json.dumps({"instances": image.tolist()}).encode()
        channel = grpc.insecure_channel(grpc_address)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(20):
            stub.Predict(request, timeout=60)  # warm-up
        cpu_before = _tree_cpu_seconds(process.pid)
        grpc_ms = []
        for _ in range(requests):
            t = time.perf_counter()
            stub.Predict(request, timeout=60)
            grpc_ms.append((time.perf_counter() - t) * 1000)
        cpu_grpc = (_tree_cpu_seconds(process.pid) - cpu_before) / requests
        rest_ms = []
        url = f"http://{rest_address}/v1/models/m:predict"
        for _ in range(max(1, requests // 3)):
            t = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(url, data=body),
                                        timeout=60) as reply:
                reply.read()
            rest_ms.append((time.perf_counter() - t) * 1000)
        done = [0] * 8
        stop = time.perf_counter() + 3.0

        def client(i: int) -> None:
            while time.perf_counter() < stop:
                stub.Predict(request, timeout=60)
                done[i] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        channel.close()
        return {"grpc_p50_ms": statistics.median(grpc_ms),
                "grpc_p99_ms": float(np.percentile(grpc_ms, 99)),
                "rest_p50_ms": statistics.median(rest_ms),
                "grpc_rps_8_clients": sum(done) / 3.0,
                "cpu_ms_per_grpc_request": cpu_grpc * 1000}
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("work_dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    base = build_model(os.path.join(os.path.abspath(args.work_dir), "mean_image"))
    results: dict[str, list[dict]] = {"sandboxed": [], "in-process": []}
    for round_index in range(args.rounds):
        order = ("sandboxed", "in-process") if round_index % 2 == 0 else \
            ("in-process", "sandboxed")
        for mode in order:
            results[mode].append(measure(base, mode == "sandboxed", args.requests))
            print(f"round {round_index + 1} {mode}: {results[mode][-1]}", flush=True)
    keys = list(results["sandboxed"][0])
    medians = {mode: {k: statistics.median(r[k] for r in runs) for k in keys}
               for mode, runs in results.items()}
    print(f"\n{'measure':28} {'in-process':>11} {'sandboxed':>10} {'ratio':>7}")
    for key in keys:
        a, b = medians["in-process"][key], medians["sandboxed"][key]
        print(f"{key:28} {a:11.3f} {b:10.3f} {b / a if a else float('nan'):7.2f}x")
    print(json.dumps({"medians": medians, "rounds": args.rounds, "cpu": _cpu_name(),
                      "cores": os.cpu_count()}))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
