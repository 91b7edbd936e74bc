"""A real load generator for TF Serving's gRPC and REST APIs: closed and open loop.

Two ways users load a server, and the two the tuner predicts:

* **closed loop**: N clients, each sending its next request as soon as the previous
  answer arrives (a pool of application threads calling the model). Throughput is
  what the server sustains at that concurrency;
* **open loop**: requests arrive as a Poisson process at a fixed rate whatever the
  server does (independent users). Latency is measured from each request's scheduled
  arrival, so a server that falls behind shows it (no coordinated omission).

The generator runs in a process of its own (``python -m serving_opt.tune.load``), so
its CPU time and its GIL are not the caller's, and it uses asyncio: one event loop
holds every client, gRPC through ``grpc.aio`` with pre-serialized requests (bytes in,
bytes out: the client does not parse what it sends or receives), REST through
HTTP/1.1 keep-alive connections of its own. Every run is bounded: ``warmup`` seconds
not counted, then ``duration`` seconds measured, then requests still in flight are
given ``timeout`` seconds and cancelled.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from serving_opt.errors import ServingOptError

MODES = ("closed", "open")
PROTOCOLS = ("grpc", "rest")
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
_MAX_MESSAGE_BYTES = 2**31 - 1
# Open loop: requests in flight beyond this are not sent but counted as shed by the
# client, so a server that stops answering cannot make the generator eat the machine.
MAX_IN_FLIGHT = 4096
# Latency percentiles every result carries (its distribution, for the model's jitter).
QUANTILES = (0, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)


@dataclass(frozen=True)
class Target:
    """Where and what to send: one protocol, its address, and the requests (cycled).

    ``payloads`` are serialized PredictRequests (gRPC) or JSON bodies (REST); ``path``
    is the gRPC method or the REST path (``/v1/models/m:predict``).
    """

    protocol: str
    address: str
    path: str
    payloads: tuple[bytes, ...]
    rows_per_request: int = 1


@dataclass(frozen=True)
class Load:
    """One load point: closed loop with ``clients``, or open loop at ``rate`` requests/s."""

    mode: str = "closed"
    clients: int = 1
    rate: float = 0.0
    duration: float = 10.0
    warmup: float = 1.0
    timeout: float = 30.0
    seed: int = 0
    channels: int = 0  # gRPC channels (connections); 0: one per client, at most 16


@dataclass(frozen=True)
class LoadResult:
    """What a load point measured, client side.

    ``requests`` counts those sent in the measured window, ``ok`` those answered
    without error; ``errors`` is by status (gRPC code name, or ``HTTP <code>``);
    ``rejected`` is what the batcher refused (UNAVAILABLE, HTTP 503) and ``shed`` what the
    open-loop client did not send (MAX_IN_FLIGHT reached). Latencies are of answered
    requests, in milliseconds.
    """

    protocol: str
    mode: str
    clients: int
    rate: float
    rows_per_request: int
    seconds: float
    requests: int
    ok: int
    errors: dict = field(default_factory=dict)
    rejected: int = 0
    shed: int = 0
    requests_per_second: float = 0.0
    rows_per_second: float = 0.0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    first_error: str = ""
    client_cpu_seconds: float = 0.0  # the generator's own CPU time over the whole run
    client_cpu_per_request: float = 0.0  # that over every request answered, in seconds
    quantiles_ms: tuple = ()  # latency at QUANTILES (answered requests)

    def to_dict(self) -> dict:
        return asdict(self)


def check_load(load: Load) -> None:
    """Raises ServingOptError naming what is wrong with ``load``."""
    if load.mode not in MODES:
        raise ServingOptError(f"load mode {load.mode!r} is not closed or open",
                              "use Load('closed', clients=N) or Load('open', rate=R)")
    if load.mode == "closed" and load.clients < 1:
        raise ServingOptError("a closed-loop load needs at least one client",
                              "e.g. Load('closed', clients=16)")
    if load.mode == "open" and not (0 < load.rate < math.inf):
        raise ServingOptError("an open-loop load needs a rate > 0 requests/s",
                              "e.g. Load('open', rate=200)")
    if not (0 < load.duration < math.inf and 0 <= load.warmup < math.inf
            and 0 < load.timeout < math.inf):
        raise ServingOptError("a load needs a positive duration and timeout",
                              "e.g. Load(duration=10, timeout=30)")


def run(target: Target, load: Load, timeout: float | None = None) -> LoadResult:
    """Runs one load point in a fresh generator process; returns what it measured."""
    with Generator() as generator:
        return generator.run(target, load, timeout)


class Generator:
    """A generator process kept for many load points (Python and grpc start once)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self._stderr = None

    def _start(self) -> subprocess.Popen:
        import tempfile

        env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
        self._stderr = tempfile.TemporaryFile()
        return subprocess.Popen([sys.executable, "-m", "serving_opt.tune.load"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self._stderr, env=env)

    def run(self, target: Target, load: Load, timeout: float | None = None) -> LoadResult:
        """One load point; raises ServingOptError when the generator fails or hangs."""
        import select
        import struct

        check_load(load)
        if target.protocol not in PROTOCOLS or not target.payloads:
            raise ServingOptError(f"cannot load {target.protocol!r} without requests",
                                  "give a grpc or rest Target with at least one payload")
        if self.process is None or self.process.poll() is not None:
            self.close()
            self.process = self._start()
        budget = timeout or (load.warmup + load.duration + load.timeout + 60.0)
        job = pickle.dumps((target, load))
        try:
            self.process.stdin.write(struct.pack("<Q", len(job)) + job)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died; the read below says so
        deadline = time.monotonic() + budget
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready = select.select([self.process.stdout], [], [], max(0.0, left))[0]
            if not ready:
                self.close()
                raise ServingOptError(f"the load generator did not finish within {budget:.0f} s",
                                      "shorten --duration, or check that the server answers")
            chunk = self.process.stdout.readline()
            if not chunk:
                break
            line += chunk
        if not line.startswith(b"{"):
            tail = self._stderr_tail()
            self.close()
            raise ServingOptError(f"the load generator failed: {tail}",
                                  "rerun with --verbosity=1 and report this")
        values = json.loads(line)
        values["quantiles_ms"] = tuple(values.get("quantiles_ms") or ())
        return LoadResult(**values)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return "no output"
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------- in the generator


class _Recorder:
    """Latencies and outcomes of the requests sent inside the measured window."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.first_error = ""
        self.sent = 0
        self.shed = 0
        self.answered = 0  # every answer, warmup and drain included (for the CPU figure)

    def counts(self, sent_at: float) -> bool:
        return self.start <= sent_at < self.end

    def done(self, sent_at: float, finished: float, error: str | None,
             detail: str = "") -> None:
        self.answered += 1
        if not self.counts(sent_at):
            return
        self.sent += 1
        if error is None:
            self.latencies.append((finished - sent_at) * 1000.0)
        else:
            self.errors[error] += 1
            if not self.first_error:
                self.first_error = f"{error}: {detail}"[:300]


class _GrpcSender:
    def __init__(self, target: Target, connections: int) -> None:
        import grpc

        self._grpc = grpc
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                   # Separate connections, as separate client processes would have.
                   ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.aio.insecure_channel(target.address, options=options)
                         for _ in range(max(1, connections))]
        self.calls = [c.unary_unary(target.path) for c in self.channels]

    async def send(self, lane: int, payload: bytes, timeout: float) -> tuple[str | None, str]:
        try:
            await self.calls[lane % len(self.calls)](payload, timeout=timeout)
        except self._grpc.aio.AioRpcError as e:
            return e.code().name, e.details() or ""
        return None, ""

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


class _RestConnection:
    """One HTTP/1.1 keep-alive connection (the server answers with Content-Length)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        code = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "connection" and value.strip().lower() == "close":
                close = True
        if length:
            await self.reader.readexactly(length)
        if close:
            self.close()
        return code

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class _RestSender:
    def __init__(self, target: Target) -> None:
        host, _, port = target.address.rpartition(":")
        self.host, self.port, self.path = host, int(port), target.path
        self.idle: list[_RestConnection] = []

    async def send(self, lane: int, payload: bytes, timeout: float) -> tuple[str | None, str]:
        connection = self.idle.pop() if self.idle else _RestConnection(self.host, self.port)
        try:
            code = await asyncio.wait_for(connection.post(self.path, payload), timeout)
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            connection.close()
            return "connection", str(e) or type(e).__name__
        except asyncio.TimeoutError:
            connection.close()
            return "timeout", f"no answer within {timeout:g} s"
        self.idle.append(connection)
        if code != 200:
            return f"HTTP {code}", ""
        return None, ""

    async def close(self) -> None:
        for connection in self.idle:
            connection.close()


async def _generate(target: Target, load: Load) -> LoadResult:
    loop = asyncio.get_running_loop()
    lanes = load.clients if load.mode == "closed" else 16
    connections = load.channels or min(16, lanes)
    sender = (_GrpcSender(target, connections) if target.protocol == "grpc"
              else _RestSender(target))
    payloads = target.payloads
    begin = loop.time()
    recorder = _Recorder(begin + load.warmup, begin + load.warmup + load.duration)
    stop_sending = recorder.end
    cpu_start = time.process_time()

    async def one(lane: int, index: int, sent_at: float) -> None:
        error, detail = await sender.send(lane, payloads[index % len(payloads)], load.timeout)
        recorder.done(sent_at, loop.time(), error, detail)

    if load.mode == "closed":
        async def client(lane: int) -> None:
            index = lane
            while loop.time() < stop_sending:
                await one(lane, index, loop.time())
                index += load.clients

        tasks = [asyncio.ensure_future(client(i)) for i in range(load.clients)]
    else:
        rng = np.random.default_rng(load.seed)
        tasks = []
        in_flight: set = set()

        async def arrivals() -> None:
            at = begin
            index = 0
            while True:
                at += float(rng.exponential(1.0 / load.rate))
                if at >= stop_sending:
                    return
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(in_flight) >= MAX_IN_FLIGHT:
                    if recorder.counts(at):
                        recorder.shed += 1
                    continue
                # Latency from the scheduled arrival: a late send is the server's delay.
                task = asyncio.ensure_future(one(index, index, at))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                index += 1

        await arrivals()
        tasks = list(in_flight)
    if tasks:
        remaining = stop_sending + load.timeout + 5.0 - loop.time()
        _, pending = await asyncio.wait(tasks, timeout=max(1.0, remaining))
        for task in pending:
            task.cancel()
    await sender.close()
    return _summarize(target, load, recorder, time.process_time() - cpu_start)


def _summarize(target: Target, load: Load, recorder: _Recorder, cpu: float) -> LoadResult:
    latencies = np.asarray(recorder.latencies, dtype=np.float64)
    ok = len(latencies)
    rejected = sum(n for code, n in recorder.errors.items()
                   if code in ("UNAVAILABLE", "HTTP 503"))

    def pct(q: float) -> float:
        return float(np.percentile(latencies, q)) if ok else 0.0

    seconds = load.duration
    return LoadResult(
        protocol=target.protocol, mode=load.mode,
        clients=load.clients if load.mode == "closed" else 0,
        rate=load.rate if load.mode == "open" else 0.0,
        rows_per_request=target.rows_per_request, seconds=seconds,
        requests=recorder.sent, ok=ok, errors=dict(recorder.errors), rejected=rejected,
        shed=recorder.shed, requests_per_second=ok / seconds,
        rows_per_second=ok * target.rows_per_request / seconds,
        mean_ms=float(latencies.mean()) if ok else 0.0, p50_ms=pct(50), p90_ms=pct(90),
        p99_ms=pct(99), max_ms=float(latencies.max()) if ok else 0.0,
        first_error=recorder.first_error, client_cpu_seconds=round(cpu, 3),
        client_cpu_per_request=cpu / recorder.answered if recorder.answered else 0.0,
        quantiles_ms=tuple(pct(q) for q in QUANTILES) if ok else ())


def _main() -> int:
    """Load points sent on stdin (length, pickle; from our own caller: trusted), one JSON
    line each on stdout, on one event loop, until stdin closes."""
    import struct

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stdin = sys.stdin.buffer
    try:
        while True:
            head = stdin.read(8)
            if len(head) < 8:
                return 0
            target, load = pickle.loads(stdin.read(struct.unpack("<Q", head)[0]))
            result = loop.run_until_complete(_generate(target, load))
            print(json.dumps(result.to_dict()), flush=True)
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(_main())
