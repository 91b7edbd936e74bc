"""What the server costs per request outside the session run, fitted to the real server.

The profile measures the session alone; a server also receives, decodes, encodes and
answers every request. Two measurements of the server with upstream's batching
defaults (timeout 0, a batch thread per core: a few sessions at once, as the profile
ran them) tell the model how much, and of what kind:

* **one client**: each request's latency is the session run plus the server's and the
  client's own time; the difference is the overhead per request;
* **N clients** (the user's, or 2 per core): if all of that overhead were spent in
  parallel, N clients would get what batches of their requests give; a server that
  gets less spends part of it one request at a time (a Python server's interpreter
  lock, or the cores of a shared machine). The serial part is the one that makes the
  model's throughput match the measured one (bisection; the model's throughput falls
  as the serial part grows).

The N-client measurement is therefore not a prediction but the model's calibration,
and the report says so; every other point is predicted before it is measured.

Example:
    >>> calibration = fit(curve, 1, one_client_result, sixteen_clients_result)
    >>> calibration.service.serial_s < calibration.overhead_s
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from serving_opt.tune.curve import LatencyCurve
from serving_opt.tune.load import LoadResult
from serving_opt.tune.scheduler import ServiceModel, Workload, simulate
from serving_opt.tune.settings import BatchingSettings, ThreadSettings

STEPS = 14


@dataclass(frozen=True)
class Calibration:
    """The fitted ServiceModel of one protocol and thread setting, and what it was
    fitted to. Each thread setting is fitted on its own: how much slower a session runs
    inside a busy server than alone depends on its thread pools (TensorFlow's default
    intra-op pool, one thread per core, competes with the server's own threads).

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
    threads: ThreadSettings = ThreadSettings()

    def to_dict(self) -> dict:
        return asdict(self)


def spread(result: LoadResult) -> tuple[tuple[float, float], ...]:
    """(quantile, latency over median) points of a load result: how the server's time
    per request varies (stalls of a shared machine, the interpreter lock, ...)."""
    from serving_opt.tune.load import QUANTILES

    values = result.quantiles_ms
    if len(values) != len(QUANTILES) or not result.p50_ms:
        return ()
    return tuple((q / 100.0, v / result.p50_ms) for q, v in zip(QUANTILES, values))


def fit(curve: LatencyCurve, rows: int, one_client: LoadResult,
        many_clients: LoadResult | None, protocol: str = "grpc",
        merge_s_per_row: float = 0.0, seed: int = 0,
        batching: BatchingSettings | None = None) -> Calibration:
    """Fits the server's cost per request, and the part of it spent one request at a
    time, to the two measurements.

    One client's median latency is the session run (the profile's median) plus the
    cost; the serial part s is what makes N clients' throughput match. When the one
    client answered faster than the profile's run (a shared machine that got faster),
    or the serial part needs more than the cost leaves, the runs are scaled to fit:
    one client's latency = run x scale + s.

    Example:
        >>> fit(curve, 1, one, many).note
        'overhead 9.60 ms per request, 1.30 ms of it one request at a time'
    """
    run_s = curve.seconds(rows)  # the median run
    if not one_client.ok:
        raise ValueError(f"the one-client calibration got no answer ({one_client.first_error})")
    # Medians on both sides: a shared machine's stalls move means, not medians.
    latency = one_client.p50_ms / 1000.0
    overhead = max(0.0, latency - run_s)

    jitter = spread(one_client)

    def model(serial: float) -> ServiceModel:
        rest = latency - serial
        if rest >= run_s:
            return ServiceModel(rest - run_s, serial, merge_s_per_row, 1.0, jitter)
        return ServiceModel(0.0, serial, merge_s_per_row, max(rest, 1e-6) / run_s, jitter)

    serial, extra, scaled = 0.0, "", None
    if many_clients is not None and many_clients.ok:
        workload = Workload("closed", clients=many_clients.clients, rows_per_request=rows,
                            max_requests=2000, seed=seed, warmup=0.0,
                            warmup_answers=2 * many_clients.clients + 20)
        target = many_clients.rows_per_second

        def throughput(s: float) -> float:
            return simulate(curve, batching, workload, model(s)).rows_per_second

        top = 0.98 * latency
        if throughput(0.0) > target:
            if throughput(top) > target:
                serial = top
                extra = ("; the server is slower under concurrency than even a fully serial "
                         "cost explains")
            else:
                lo, hi = 0.0, top
                for _ in range(STEPS):
                    mid = (lo + hi) / 2
                    if throughput(mid) > target:
                        lo = mid
                    else:
                        hi = mid
                serial = (lo + hi) / 2
        else:
            # N clients got more than the profile's runs allow: the session ran faster
            # now. Runs are scaled down (one client's latency kept: the rest is overhead)
            # until the model gets what N clients got.
            base = model(0.0)

            def faster(k: float) -> ServiceModel:
                return ServiceModel(max(0.0, latency - k * run_s), 0.0, merge_s_per_row, k,
                                    jitter)

            def rows(k: float) -> float:
                return simulate(curve, batching, workload, faster(k)).rows_per_second

            lo, hi = 0.05 * base.run_scale, base.run_scale
            if rows(lo) < target:
                scaled = faster(lo)
                extra = "; N clients got more than even 20x faster runs explain"
            else:
                for _ in range(STEPS):
                    mid = (lo + hi) / 2
                    if rows(mid) < target:
                        hi = mid
                    else:
                        lo = mid
                scaled = faster((lo + hi) / 2)
    else:
        extra = " (no concurrent measurement: all of it taken as parallel)"
    service = scaled if scaled is not None else model(serial)
    note = (f"one client {latency * 1000:.2f} ms against a {run_s * 1000:.2f} ms session run: "
            f"overhead {service.parallel_s * 1000 + serial * 1000:.2f} ms per request")
    if many_clients is not None and many_clients.ok:
        note += f", {serial * 1000:.2f} ms of the server's time one request at a time"
    if service.run_scale != 1.0:
        note += (f"; session runs scaled by {service.run_scale:.2f} to fit (the machine ran "
                 "them at another speed than during the profile)")
    return Calibration(protocol, service, run_s, overhead, one_client, many_clients,
                       note + extra, curve.threads)
