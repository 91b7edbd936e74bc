"""The gRPC client side of validation: TF Serving's ModelService and PredictionService.

TFX's InfraValidator keeps this in ``model_server_clients``. Here it is:

  * ``serving_api()``: the TF Serving API protos and stubs, imported on first use
    (grpc and tensorflow_serving are heavy, and only validation needs them);
  * ``wait_until_available``: poll GetModelStatus until the version is AVAILABLE,
    failing early, with the server log's reason, when the load fails;
  * ``check_metadata``: GetModelMetadata's SignatureDefMap against the SavedModel's;
  * ``call``: send one probe (``requests.Probe``) by its method name;
  * ``run_load_test``: N concurrent clients sending the probes for S seconds.

Starting and stopping the server is ``backends``' job; which checks run and what
they mean is ``validate``'s.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from serving_opt.errors import ServingOptError
from serving_opt.serving import backends

if TYPE_CHECKING:
    from serving_opt.serving.requests import Probe

# ModelVersionStatus.State values (tensorflow_serving/apis/get_model_status.proto).
STATE_AVAILABLE = 30
STATE_END = 50

_MAX_MESSAGE_BYTES = 2**31 - 1  # TF Serving's own limit (INT32_MAX); gRPC's default is 4 MiB


@dataclass(frozen=True)
class ServingApi:
    """The grpc module and the TF Serving API modules validation uses, by name.

    Example:
        >>> api = serving_api()
        >>> api.predict_pb2.PredictRequest().model_spec.name
        ''
    """

    grpc: ModuleType
    classification_pb2: ModuleType
    get_model_metadata_pb2: ModuleType
    get_model_status_pb2: ModuleType
    inference_pb2: ModuleType
    model_service_pb2_grpc: ModuleType
    predict_pb2: ModuleType
    prediction_service_pb2_grpc: ModuleType
    regression_pb2: ModuleType


@functools.cache
def serving_api() -> ServingApi:
    """Imports grpc and the TF Serving API on first use (not at ``import serving_opt``).

    Example:
        >>> serving_api().grpc.StatusCode.OK.name
        'OK'
    """
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    return ServingApi(
        grpc=grpc,
        classification_pb2=classification_pb2,
        get_model_metadata_pb2=get_model_metadata_pb2,
        get_model_status_pb2=get_model_status_pb2,
        inference_pb2=inference_pb2,
        model_service_pb2_grpc=model_service_pb2_grpc,
        predict_pb2=predict_pb2,
        prediction_service_pb2_grpc=prediction_service_pb2_grpc,
        regression_pb2=regression_pb2,
    )


@dataclass(frozen=True)
class LoadTest:
    """The load phase's numbers.

    Example:
        >>> load_test.errors, load_test.p99_ms < 100
        (0, True)
    """

    concurrency: int
    seconds: float
    requests: int
    errors: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    first_error: str = ""


def rpc_error(e) -> str:
    """A failed call as ``CODE: details``.

    Example:
        >>> rpc_error(e)
        'UNAVAILABLE: failed to connect to all addresses'
    """
    return f"{e.code().name}: {e.details()}"


def wait_until_available(address: str, model_name: str, version: int,
                         server: backends.ServerProcess | None, deadline_s: float,
                         say: Callable[[str], None] = lambda m: None) -> None:
    """Polls GetModelStatus until ``version`` is AVAILABLE; raises on END/exit/deadline.

    Example:
        >>> wait_until_available("127.0.0.1:8500", "clf", 1, None, 60)
    """
    api = serving_api()
    channel = api.grpc.insecure_channel(address)
    stub = api.model_service_pb2_grpc.ModelServiceStub(channel)
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    try:
        while time.monotonic() < deadline:
            if server is not None and server.exit_code() is not None:
                log = server.log_tail(200)
                failure = load_failure(log)
                if failure:
                    raise ServingOptError(
                        f"the server failed to load {model_name} version {version}: {failure}",
                        "fix the model; the server log's last lines are in the validation report",
                    )
                raise ServingOptError(
                    f"the {server.backend} server exited with code {server.exit_code()} "
                    f"before version {version} became AVAILABLE: {_last_line(log)}",
                    "its log's last lines are in the validation report",
                )
            request = api.get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = model_name
            try:
                response = stub.GetModelStatus(request, timeout=5)
            except api.grpc.RpcError as e:
                # Not listening yet, or the model not known yet: keep polling.
                last = rpc_error(e)
                time.sleep(0.5)
                continue
            for status in response.model_version_status:
                if status.version != version:
                    continue
                if status.state == STATE_AVAILABLE:
                    return
                if status.state == STATE_END:
                    message = status.status.error_message or "unloaded"
                    raise ServingOptError(
                        f"the server failed to load {model_name} version {version}: {message}",
                        "fix the model; the server log has details"
                        + (" (its last lines are in the validation report)" if server else ""),
                    )
                last = f"version {version} state {status.state}"
            time.sleep(0.5)
    finally:
        channel.close()
    raise ServingOptError(
        f"{model_name} version {version} was not AVAILABLE within {deadline_s:.0f} s ({last})",
        "raise --load_deadline, or check the server log"
        + (" (its last lines are in the validation report)" if server else ""),
    )


def load_failure(log: str) -> str | None:
    """The load error in a TF Serving log ("Loading servable: {...} failed: ..."), one line.

    Example:
        >>> load_failure("E Loading servable: {name: m version: 1} failed: NOT_FOUND: x")
        'NOT_FOUND: x'
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


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


@contextmanager
def prediction_service(address: str) -> Iterator[object]:
    """A PredictionService stub on its own channel, closed on exit.

    The channel allows TF Serving's message limit (INT32_MAX) both ways, not gRPC's
    4 MiB, so a large probe is judged by the server, not by the client library.

    Example:
        >>> with prediction_service("127.0.0.1:8500") as stub:
        ...     call(stub, probe, 30).model_spec.name
        'clf'
    """
    api = serving_api()
    channel = api.grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES)])
    try:
        yield api.prediction_service_pb2_grpc.PredictionServiceStub(channel)
    finally:
        channel.close()


def call(stub, probe: Probe, timeout: float):
    """Sends ``probe`` with the PredictionService method it names; returns the reply.

    Example:
        >>> call(stub, probe, 30).model_spec.signature_name
        'serving_default'
    """
    return getattr(stub, probe.method)(probe.request, timeout=timeout)


def check_metadata(stub, model_name: str, version: int, served: dict,
                   timeout: float) -> tuple[bool, str]:
    """GetModelMetadata's SignatureDefMap vs ``served`` (key -> SignatureDef): (ok, detail).

    Compared serialized (deterministically), so any field that differs counts.

    Example:
        >>> check_metadata(stub, "clf", 1, served, 30)
        (True, '3 signatures match')
    """
    md = serving_api().get_model_metadata_pb2
    request = md.GetModelMetadataRequest()
    request.model_spec.name = model_name
    request.model_spec.version.value = version
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=timeout)
    signature_map = md.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    return compare_signature_maps(signature_map, served)


def compare_signature_maps(signature_map, served: dict) -> tuple[bool, str]:
    """A server's SignatureDefMap vs ``served`` (key -> SignatureDef): (ok, detail)."""
    got = {k: v.SerializeToString(deterministic=True)
           for k, v in signature_map.signature_def.items()}
    want = {k: v.SerializeToString(deterministic=True) for k, v in served.items()}
    if got == want:
        return True, f"{len(got)} signatures match"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return False, f"missing {missing}, extra {extra}, different {differ}"


def run_load_test(address: str, probes: Sequence[Probe], concurrency: int, seconds: float,
                  timeout: float) -> LoadTest:
    """``concurrency`` clients send the probes round robin for ``seconds``.

    Example:
        >>> run_load_test("127.0.0.1:8500", probes, 8, 2.0, 30).errors
        0
    """
    grpc = serving_api().grpc
    with prediction_service(address) as stub:
        return load_test(lambda probe: call(stub, probe, timeout), probes, concurrency,
                         seconds, timeout, (grpc.RpcError,), rpc_error)


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
