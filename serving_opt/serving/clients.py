"""The client interface: how validation talks to a model server, whatever the protocol.

TFX's ``infra_validator/model_server_clients/base_client``. A client is made for one
endpoint of a running server (``runner.endpoints[protocol]``) and one model version;
``grpc_grpc_client.GrpcClient`` and ``rest_client.RestClient`` implement it, and the executor
(``validate``) holds a list of them and never asks which protocol one speaks. What a
protocol cannot do is the client's to say: :meth:`ModelServerClient.prepare` returns the
probes it can send, in the form it sends them (REST has no MultiInference endpoint).
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from serving_opt.serving.results import LoadTest

if TYPE_CHECKING:
    from serving_opt.serving.process import ServerProcess
    from serving_opt.serving.requests import Probe


class ModelServerClient(abc.ABC):
    """One protocol's view of a served model version (TFX's ``BaseModelServerClient``).

    A subclass names its checks (``available_check``, ``metadata_check``), the errors a
    failed call raises (``errors``: they fail that call's check, not the run) and
    implements the abstract methods; the load test is the same for all.
    """

    protocol: ClassVar[str]  # "grpc" | "rest": the key of runner.endpoints
    available_check: ClassVar[str]  # the name of the "version is AVAILABLE" check
    metadata_check: ClassVar[str]  # the name of the SignatureDefMap check
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, address: str, model_name: str, version: int, timeout: float) -> None:
        self.address = address
        self.model_name = model_name
        self.version = version
        self.timeout = timeout  # seconds per request

    @abc.abstractmethod
    def wait_until_available(self, server: ServerProcess | None, deadline_s: float) -> None:
        """Polls the model status until the version is AVAILABLE; raises ServingOptError
        (the reason, with the server log's when it died) on END, exit or deadline."""

    @abc.abstractmethod
    def check_metadata(self, served: dict) -> tuple[bool, str]:
        """The served SignatureDefMap vs ``served`` (key -> SignatureDef): (ok, detail)."""

    @abc.abstractmethod
    def prepare(self, probes: Sequence[Probe], served: dict) -> list:
        """The probes this protocol can send, as it sends them (each has ``name`` and
        ``check``)."""

    @abc.abstractmethod
    def request(self, probe) -> object:
        """Sends a prepared probe; the answer as the protocol gives it (the load phase)."""

    def call(self, probe) -> object:
        """Sends a prepared probe; the answer as the response proto its check reads."""
        return self.request(probe)

    @abc.abstractmethod
    def describe(self, error: BaseException) -> str:
        """One of ``errors`` as one line for a check's detail."""

    def run_load_test(self, probes: Sequence, concurrency: int, seconds: float) -> LoadTest:
        """``concurrency`` threads send the prepared probes round robin for ``seconds``;
        a call raising one of ``errors`` counts as a failed request.
        """
        return load_test(self.request, probes, concurrency, seconds, self.timeout,
                         self.errors, self.describe)

    def close(self) -> None:
        """Releases the connection, if the protocol keeps one (a REST client keeps none)."""
        return None

    def __enter__(self) -> ModelServerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def compare_signature_maps(signature_map, served: dict) -> tuple[bool, str]:
    """A server's SignatureDefMap vs ``served`` (key -> SignatureDef): (ok, detail).

    Compared serialized (deterministically), so any field that differs counts.
    """
    got = {k: v.SerializeToString(deterministic=True)
           for k, v in signature_map.signature_def.items()}
    want = {k: v.SerializeToString(deterministic=True) for k, v in served.items()}
    if got == want:
        return True, f"{len(got)} signatures match"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return False, f"missing {missing}, extra {extra}, different {differ}"


def load_failure(log: str) -> str | None:
    """The load error in a TF Serving log ("Loading servable: {...} failed: ..."), one line.
    """
    lines = log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if "Loading servable" in line and "failed:" in line:
            head = line.split("failed:", 1)[1].strip()
            # The root cause is the last line of the error TF prints after it; graph
            # context lines ("[[node]]", "Detected at", "Node:") are noise.
            tail = [ln.strip() for ln in lines[i + 1:i + 12]
                    if ln.strip() and not ln.strip().startswith(("[[", "Detected at", "Node:"))
                    and "serving-opt serve:" not in ln]
            cause = tail[-1] if tail else ""
            return f"{head} {cause}".strip() if cause and cause not in head else head
    return None


def last_line(text: str) -> str:
    """The last non-empty line of ``text``, or "(no output)"."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def load_test(send: Callable[[object], object], probes: Sequence, concurrency: int,
              seconds: float, timeout: float, errors_caught: tuple,
              describe: Callable[[BaseException], str]) -> LoadTest:
    """``concurrency`` threads call ``send(probe)`` round robin for ``seconds``; the same
    load phase for every protocol (``errors_caught`` count as failed requests)."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    first_error: list[str] = []
    stop_at = time.monotonic() + seconds

    def client(i: int) -> None:
        # Each client starts at a different probe so all of them are in flight.
        n = i
        while time.monotonic() < stop_at:
            probe = probes[n % len(probes)]
            n += 1
            start = time.perf_counter()
            try:
                send(probe)
            except errors_caught as e:
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{probe.name}: {describe(e)}")
                continue
            latencies[i].append((time.perf_counter() - start) * 1000.0)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    elapsed = time.monotonic() - start
    flat = [x for lat in latencies for x in lat]
    total = len(flat) + sum(errors)
    return LoadTest(
        concurrency=concurrency,
        seconds=round(elapsed, 3),
        requests=total,
        errors=sum(errors),
        requests_per_second=total / elapsed if elapsed > 0 else 0.0,
        p50_ms=float(np.percentile(flat, 50)) if flat else 0.0,
        p99_ms=float(np.percentile(flat, 99)) if flat else 0.0,
        first_error=first_error[0] if first_error else "",
    )
