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

``--rest_vs_grpc``: REST against gRPC on one ``serving-opt serve`` (sandboxed, as users
run it), MobileNetV2 160x160x3 unless a model is given, in interleaved rounds: one
request at a time on a new connection each (a fresh gRPC channel, a fresh TCP
connection), REST's time over gRPC's; then one closed-loop client per protocol, this
module's against ``serving_opt.tune.load``'s, to show that tune measures what an
outside client does (docs/rest_latency.md).

    .venv/bin/python benchmarks/independent_load.py --model_base_path=build/bench/models/mnv2 \\
        --tune_dir=build/bench/tune/mnv2 --clients=16 --seconds=20 --rounds=3
    .venv/bin/python benchmarks/independent_load.py --rest_vs_grpc --rounds=5
"""

from __future__ import annotations

import argparse
import http.client
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
    """``serving-opt serve`` in a subprocess, on a port of its own (and a REST port if
    ``rest``)."""

    def __init__(self, model_base: str, model_name: str, flags: list[str], rest: bool = False):
        self.port = free_port()
        self.rest_port = free_port() if rest else 0
        model_base = os.path.abspath(model_base)  # TF Serving refuses a relative base path
        command = [sys.executable, "-m", "serving_opt.cli", "serve", f"--port={self.port}",
                   f"--rest_api_port={self.rest_port}" if rest else "--rest_api_port=-1",
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
    return _figures(latencies, errors[0], cpu, seconds, warmup)


def _figures(latencies: list[float], errors: int, cpu: float, seconds: float,
             warmup: float) -> dict:
    latencies = sorted(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0
    cores = len(os.sched_getaffinity(0))
    return {"requests_per_second": len(latencies) / seconds, "p99_ms": p99 * 1000,
            "p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
            "errors": errors, "generator_share": cpu / ((seconds + warmup) * cores)}


def rest_connection(port: int) -> http.client.HTTPConnection:
    """An http.client connection with TCP_NODELAY, as urllib3 (requests) makes them:
    http.client sends a large body apart from its head, and with Nagle's algorithm its
    last segment can wait for the server's delayed ACK."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def rest_post(port: int, path: str, body: bytes,
              connection: http.client.HTTPConnection | None = None) -> bytes:
    """POSTs ``body`` with http.client (a new connection unless one is given, then
    closed); the answer's body. Raises on a status other than 200."""
    own = connection is None
    connection = connection or rest_connection(port)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {data[:200]!r}")
        return data
    finally:
        if own:
            connection.close()


def rest_closed_loop(port: int, path: str, bodies: list[bytes], clients: int,
                     seconds: float, warmup: float = 2.0) -> dict:
    """closed_loop's figures for REST: ``clients`` threads, each on its own kept-alive
    http.client connection (as serving_opt.tune.load keeps its own)."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = time.monotonic() + warmup
    end = start + seconds

    def client(i: int) -> None:
        connection = rest_connection(port)
        k = i
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                break
            try:
                rest_post(port, path, bodies[k % len(bodies)], connection)
                ok = True
            except (OSError, RuntimeError, http.client.HTTPException):
                connection.close()
                connection = rest_connection(port)
                ok = False
            t1 = time.monotonic()
            k += 1
            if t0 >= start:
                with lock:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors[0] += 1
        connection.close()

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return _figures(latencies, errors[0], cpu, seconds, warmup)


def one_at_a_time(server: Server, request: bytes, path: str, body: bytes,
                  count: int) -> dict[str, list[float]]:
    """``count`` single requests per protocol, alternating, each on a new connection (a
    fresh gRPC channel; a fresh TCP connection for REST): seconds each."""
    import grpc

    times: dict[str, list[float]] = {"grpc": [], "rest": []}
    for _ in range(count):
        t0 = time.perf_counter()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            channel.unary_unary(PREDICT, request_serializer=None,
                                response_deserializer=None)(request, timeout=60)
        t1 = time.perf_counter()
        rest_post(server.rest_port, path, body)
        t2 = time.perf_counter()
        times["grpc"].append(t1 - t0)
        times["rest"].append(t2 - t1)
    return times


def rest_vs_grpc(model_base: str, model_name: str, rounds: int, count: int,
                 seconds: float) -> list[str]:
    """Markdown: REST against gRPC, one request at a time, and tune's load generator
    against this module's, one closed-loop client per protocol, rounds interleaved."""
    from serving_opt.serving import validate
    from serving_opt.tune import load, payloads
    from serving_opt.tune.hardware import here

    version = validate.resolve_version(model_base, None)
    built = payloads.build(validate.version_dir(model_base, version), model_name, version,
                           "serving_default", 1)
    requests, bodies = list(built[0]), list(built[1])
    path = f"/v1/models/{model_name}:predict"
    server = Server(model_base, model_name, [], rest=True)
    single: dict[str, list[float]] = {"grpc": [], "rest": []}
    loads: dict[str, list[float]] = {}
    try:
        server.wait(requests[0])
        targets = payloads.targets(f"127.0.0.1:{server.port}",
                                   f"127.0.0.1:{server.rest_port}", model_name, version,
                                   built, 1)
        one_at_a_time(server, requests[0], path, bodies[0], 3)  # warm both paths
        with load.Generator() as generator:
            for r in range(rounds):
                times = one_at_a_time(server, requests[0], path, bodies[0], count)
                for protocol in times:
                    single[protocol] += times[protocol]
                order = ("grpc", "rest") if r % 2 == 0 else ("rest", "grpc")
                for protocol in order:
                    ours = generator.run(targets[protocol], load.Load(
                        "closed", clients=1, duration=seconds, warmup=0.5))
                    if protocol == "grpc":
                        theirs = closed_loop(server.port, requests, 1, seconds, warmup=0.5)
                    else:
                        theirs = rest_closed_loop(server.rest_port, path, bodies, 1,
                                                  seconds, warmup=0.5)
                    loads.setdefault(f"{protocol} tune", []).append(ours.p50_ms)
                    loads.setdefault(f"{protocol} independent", []).append(theirs["p50_ms"])
                    loads.setdefault(f"{protocol} tune req/s", []).append(
                        ours.requests_per_second)
                    loads.setdefault(f"{protocol} independent req/s", []).append(
                        theirs["requests_per_second"])
                g, t = (statistics.median(single[p][-count:]) * 1e3 for p in ("grpc", "rest"))
                print(f"  round {r + 1}: one at a time gRPC {g:.1f} ms, REST {t:.1f} ms "
                      f"({t / g:.2f}x)", file=sys.stderr)
    finally:
        server.stop()
    grpc_ms = statistics.median(single["grpc"]) * 1e3
    rest_ms = statistics.median(single["rest"]) * 1e3
    # Ratios per round, then their median: a busy moment slows both protocols alike.
    per_round = [statistics.median(single["rest"][i:i + count]) /
                 statistics.median(single["grpc"][i:i + count])
                 for i in range(0, len(single["grpc"]), count)]
    lines = [f"CPU: {here().describe()}", "",
             f"One request at a time, a new connection each, {len(single['grpc'])} per "
             f"protocol over {rounds} interleaved rounds ({model_name}, body "
             f"{len(bodies[0]):,} bytes of JSON, {len(requests[0]):,} of protobuf):", "",
             "| protocol | p50 ms | p90 ms |", "|---|---|---|"]
    for protocol, values in single.items():
        deciles = statistics.quantiles(values, n=10)
        lines.append(f"| {protocol} | {statistics.median(values) * 1e3:.1f} | "
                     f"{deciles[8] * 1e3:.1f} |")
    lines += ["", f"REST / gRPC: {rest_ms / grpc_ms:.2f}x (per round: "
              f"{', '.join(f'{x:.2f}' for x in per_round)}; the bar is 1.5x)", "",
              "One closed-loop client, kept-alive connection, tune's generator against this "
              "module's (p50 ms, requests/s; medians of the rounds):", "",
              "| protocol | tune p50 | independent p50 | ratio | tune req/s | "
              "independent req/s | ratio |", "|---|---|---|---|---|---|---|"]
    for protocol in ("grpc", "rest"):
        ours = statistics.median(loads[f"{protocol} tune"])
        theirs = statistics.median(loads[f"{protocol} independent"])
        ours_rate = statistics.median(loads[f"{protocol} tune req/s"])
        theirs_rate = statistics.median(loads[f"{protocol} independent req/s"])
        lines.append(f"| {protocol} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} | "
                     f"{ours_rate:.1f} | {theirs_rate:.1f} | {ours_rate / theirs_rate:.2f} |")
    return lines


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
    parser.add_argument("--model_base_path", default=None,
                        help="default with --rest_vs_grpc: MobileNetV2 160x160 (built once "
                        "under build/bench/models)")
    parser.add_argument("--tune_dir", default=None)
    parser.add_argument("--rest_vs_grpc", action="store_true")
    parser.add_argument("--requests", type=int, default=20,
                        help="--rest_vs_grpc: single requests per protocol per round")
    parser.add_argument("--model_name", default=None)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slo_p99_ms", type=float, default=250.0)
    args = parser.parse_args(argv)
    if args.rest_vs_grpc:
        base = args.model_base_path
        if base is None:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import tune

            _, base, _ = tune.build("mobilenet_v2", os.path.join("build", "bench", "models"),
                                    full=False)
        name = args.model_name or os.path.basename(os.path.normpath(base))
        print("\n".join(rest_vs_grpc(base, name, args.rounds, args.requests,
                                     min(args.seconds, 5.0))))
        return 0
    if args.model_base_path is None or args.tune_dir is None:
        parser.error("--model_base_path and --tune_dir are needed (or --rest_vs_grpc)")
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
