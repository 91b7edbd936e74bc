"""An independent check of what ``serving-opt tune`` wrote: its files, served as a user
serves them, under a load generator that is not the project's.

For one tune output directory, ``serving-opt serve`` (a subprocess each, as
``tensorflow_model_server`` would be started) runs:

* TF Serving's default: no batching;
* upstream's batching defaults: ``--enable_batching`` without a file;
* the deployment set: every flag of ``tensorflow_model_server.flags`` with
  ``batching_parameters.txt`` as written;
* the batching file alone (``--enable_batching --batching_parameters_file``, no thread
  flags), when the set has thread flags.

All servers are up at once; closed-loop gRPC clients (threads, each request serialized
once up front and sent as bytes, so no protobuf work per request) measure them in
interleaved rounds. The generator's own processor time is measured: over 10% of the
cores, its figures are flagged.

    .venv/bin/python benchmarks/independent_load.py --model_base_path=build/bench/models/mnv2 \\
        --tune_dir=build/bench/tune/mnv2 --clients=16 --seconds=20 --rounds=3
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time

PREDICT = "/tensorflow.serving.PredictionService/Predict"
_OWN = ("--port", "--rest_api_port", "--model_name", "--model_base_path",
        "--batching_parameters_file")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_from_tune_dir(tune_dir: str) -> dict[str, list[str]]:
    """{label: serve flags} for the three (or four) settings, from what tune wrote.

    Example:
        >>> list(settings_from_tune_dir("build/bench/tune/mnv2"))
        ['no batching', "upstream's defaults", 'deployment set', 'batching file alone']
    """
    with open(os.path.join(tune_dir, "tensorflow_model_server.flags")) as f:
        written = shlex.split(f.read())[1:]
    parameters = os.path.join(tune_dir, "batching_parameters.txt")
    kept = [flag for flag in written if flag.split("=", 1)[0] not in _OWN]
    if any(flag.startswith("--batching_parameters_file=") for flag in written):
        kept.append(f"--batching_parameters_file={os.path.abspath(parameters)}")
    out = {"no batching": [], "upstream's defaults": ["--enable_batching=true"],
           "deployment set": kept}
    threads = [flag for flag in kept if flag.startswith("--tensorflow_")]
    if threads and os.path.exists(parameters):
        out["batching file alone"] = [flag for flag in kept if flag not in threads]
    return out


class Server:
    """``serving-opt serve`` in a subprocess, on a port of its own."""

    def __init__(self, model_base: str, model_name: str, flags: list[str]):
        self.port = free_port()
        model_base = os.path.abspath(model_base)  # TF Serving refuses a relative base path
        command = [sys.executable, "-m", "serving_opt.cli", "serve", f"--port={self.port}",
                   f"--model_name={model_name}", f"--model_base_path={model_base}", *flags]
        self.command = command
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)

    def wait(self, request: bytes, deadline: float = 600.0) -> None:
        import grpc

        end = time.monotonic() + deadline
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            call = channel.unary_unary(PREDICT, request_serializer=None,
                                       response_deserializer=None)
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{shlex.join(self.command)} exited: "
                                       f"{self.process.stderr.read().decode()[-2000:]}")
                try:
                    call(request, timeout=30)
                    return
                except grpc.RpcError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def closed_loop(port: int, requests: list[bytes], clients: int, seconds: float,
                warmup: float = 2.0) -> dict:
    """``clients`` threads, each sending its next request when its answer arrives."""
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.monotonic() + warmup
    end = start + seconds

    def client(i: int) -> None:
        k = i
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                return
            try:
                call(requests[k % len(requests)], timeout=60)
                ok = True
            except grpc.RpcError:
                ok = False
            t1 = time.monotonic()
            k += 1
            if t0 >= start:  # sent inside the measured window
                with lock:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors[0] += 1

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    channel.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0
    cores = len(os.sched_getaffinity(0))
    return {"requests_per_second": len(latencies) / seconds, "p99_ms": p99 * 1000,
            "errors": errors[0],
            "generator_share": cpu / ((seconds + warmup) * cores)}


def compare(model_base: str, model_name: str, tune_dir: str, requests: list[bytes],
            rows_per_request: int = 1, clients: int = 16, seconds: float = 20.0,
            rounds: int = 3) -> dict[str, list[dict]]:
    """{label: one figure dict per round}, servers up at once, rounds interleaved."""
    settings = settings_from_tune_dir(tune_dir)
    servers = {label: Server(model_base, model_name, flags) for label, flags in settings.items()}
    try:
        for server in servers.values():
            server.wait(requests[0])
        results: dict[str, list[dict]] = {label: [] for label in servers}
        labels = list(servers)
        for r in range(rounds):
            for label in (labels if r % 2 == 0 else labels[::-1]):
                figures = closed_loop(servers[label].port, requests, clients, seconds)
                figures["rows_per_second"] = figures["requests_per_second"] * rows_per_request
                results[label].append(figures)
                print(f"  round {r + 1} {label}: {figures['rows_per_second']:,.0f} rows/s, "
                      f"p99 {figures['p99_ms']:.0f} ms, generator "
                      f"{figures['generator_share']:.0%} of the cores", file=sys.stderr)
        return results
    finally:
        for server in servers.values():
            server.stop()


def summary_lines(results: dict[str, list[dict]], slo_p99_ms: float) -> tuple[list[str], bool]:
    """Markdown: the settings side by side, their ratios, and the issue's bar."""
    def mean(label: str, key: str) -> float:
        return statistics.fmean(r[key] for r in results[label])

    lines = ["| setting (independent generator) | rows/s (mean) | worst p99 ms | generator |",
             "|---|---|---|---|"]
    for label in results:
        lines.append(f"| {label} | {mean(label, 'rows_per_second'):,.0f} | "
                     f"{max(r['p99_ms'] for r in results[label]):.0f} | "
                     f"{max(r['generator_share'] for r in results[label]):.0%} |")
    none = mean("no batching", "rows_per_second")
    upstream = mean("upstream's defaults", "rows_per_second")
    deployed = mean("deployment set", "rows_per_second")
    worst_p99 = max(r["p99_ms"] for r in results["deployment set"])
    x_none, x_upstream = deployed / max(none, 1e-9), deployed / max(upstream, 1e-9)
    lines += ["", f"deployment set: {x_none:.2f}x no batching, {x_upstream:.2f}x upstream's "
              f"defaults, worst p99 {worst_p99:.0f} ms (SLO {slo_p99_ms:g})"]
    ok = worst_p99 <= slo_p99_ms and x_none >= 1.6 and x_upstream >= 1.1
    if "batching file alone" in results:
        alone = mean("batching file alone", "rows_per_second") / max(upstream, 1e-9)
        lines.append(f"batching file alone: {alone:.2f}x upstream's defaults")
    if any(r["generator_share"] > 0.10 for rs in results.values() for r in rs):
        lines.append("FLAG: the generator took over 10% of the cores")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_base_path", required=True)
    parser.add_argument("--tune_dir", required=True)
    parser.add_argument("--model_name", default=None)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slo_p99_ms", type=float, default=250.0)
    args = parser.parse_args(argv)
    from serving_opt.serving import validate
    from serving_opt.tune import payloads

    name = args.model_name or os.path.basename(os.path.normpath(args.model_base_path))
    version = validate.resolve_version(args.model_base_path, None)
    requests, _ = payloads.build(validate.version_dir(args.model_base_path, version), name,
                                 version, "serving_default", 1)
    results = compare(args.model_base_path, name, args.tune_dir, list(requests),
                      clients=args.clients, seconds=args.seconds, rounds=args.rounds)
    lines, ok = summary_lines(results, args.slo_p99_ms)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
