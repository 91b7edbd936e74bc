"""What the server costs per request outside the session run, fitted to the real server.

The profile measures the session alone; a server also receives, decodes, encodes and
answers every request. Two measurements of the server without batching (TF Serving's
default) tell the model how much, and of what kind:

* **one client**: each request's latency is the session run plus the server's and the
  client's own time; the difference is the overhead per request;
* **N clients** (the user's, or 2 per core): if all of that overhead were spent in
  parallel, N clients would get what the session gives N overlapping runs; a server
  that gets less spends part of it one request at a time (a Python server's interpreter
  lock). The serial part is the one that makes the model's throughput match the
  measured one (bisection; the model's throughput falls as the serial part grows).

The N-client measurement is therefore not a prediction but the model's calibration,
and the report says so; every other point is predicted before it is measured.

Example:
    >>> calibration = fit(curve, 1, one_client_result, sixteen_clients_result)
    >>> calibration.service.serial_s < calibration.overhead_s
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from serving_opt.tune.curve import LatencyCurve
from serving_opt.tune.load import LoadResult
from serving_opt.tune.scheduler import ServiceModel, Workload, simulate

STEPS = 14


@dataclass(frozen=True)
class Calibration:
    """The fitted ServiceModel of one protocol and what it was fitted to.

    Example:
        >>> calibration.service.parallel_s * 1000
        2.1
    """

    protocol: str
    service: ServiceModel
    run_s: float  # the session run alone at rows_per_request (profile)
    overhead_s: float  # one client's mean latency minus run_s
    one_client: LoadResult | None = None
    many_clients: LoadResult | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def fit(curve: LatencyCurve, rows: int, one_client: LoadResult,
        many_clients: LoadResult | None, protocol: str = "grpc",
        merge_s_per_row: float = 0.0, seed: int = 0) -> Calibration:
    """Fits the per-request overhead (and its serial part) to the two measurements.

    Example:
        >>> fit(curve, 1, one, many).note
        'overhead 9.6 ms per request, 1.3 ms of it one request at a time'
    """
    run_s = curve.seconds(rows)  # the median run
    if not one_client.ok:
        raise ValueError(f"the one-client calibration got no answer ({one_client.first_error})")
    # Medians on both sides: a shared machine's stalls move means, not medians.
    latency = one_client.p50_ms / 1000.0
    overhead = max(0.0, latency - run_s)
    scale = 1.0
    note = f"overhead {overhead * 1000:.2f} ms per request"
    if latency < run_s:
        # The server answered faster than the session alone ran in the profile: the
        # machine (shared) was faster now. Its overhead cannot be told apart; every run
        # is scaled to what the server showed.
        scale = latency / run_s
        note = (f"the server answered one client in {latency * 1000:.2f} ms, under the "
                f"profile's {run_s * 1000:.2f} ms session run (a shared machine ran faster): "
                f"runs scaled by {scale:.2f}, overhead taken as 0")
    service = ServiceModel(parallel_s=overhead, serial_s=0.0, merge_s_per_row=merge_s_per_row,
                           run_scale=scale)
    if overhead <= 0:
        return Calibration(protocol, service, run_s, overhead, one_client, many_clients, note)
    if many_clients is None or not many_clients.ok:
        return Calibration(protocol, service, run_s, overhead, one_client, many_clients,
                           note + " (no concurrent measurement: all of it in parallel)")
    workload = Workload("closed", clients=many_clients.clients, rows_per_request=rows,
                        max_requests=2000, seed=seed, warmup=0.0,
                        warmup_answers=2 * many_clients.clients + 20)
    target = many_clients.rows_per_second

    def throughput(serial: float) -> float:
        model = replace(service, parallel_s=overhead - serial, serial_s=serial)
        return simulate(curve, None, workload, model).rows_per_second

    if throughput(0.0) <= target:
        return Calibration(protocol, service, run_s, overhead, one_client, many_clients,
                           note + ", all of it in parallel")
    lo, hi = 0.0, overhead
    if throughput(hi) > target:
        serial = hi
        extra = ("; the server is slower under concurrency than even a fully serial "
                 "overhead explains")
    else:
        for _ in range(STEPS):
            mid = (lo + hi) / 2
            if throughput(mid) > target:
                lo = mid
            else:
                hi = mid
        serial, extra = (lo + hi) / 2, ""
    service = replace(service, parallel_s=overhead - serial, serial_s=serial)
    return Calibration(protocol, service, run_s, overhead, one_client, many_clients,
                       f"{note}, {serial * 1000:.2f} ms of it one request at a time{extra}")
