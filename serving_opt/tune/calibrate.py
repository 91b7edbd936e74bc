"""What the server costs per request outside the session run, fitted to the real server.

The profile measures the session alone; a server also receives, decodes, encodes and
answers every request. Two measurements of the server with upstream's batching
defaults (timeout 0, a batch thread per core: a few sessions at once, as the profile
ran them) tell the model how much, and of what kind:

* **one client**: each request's latency is the session run plus the server's and the
  client's own time; the difference is the overhead per request;
* **N clients** (the user's, or 2 per core): if requests cost nothing but that delay,
  N clients would get what the runs alone allow; on a machine whose cores the runs
  share with the server's own work (decoding, answering, a Python server's threads)
  and the load generator's, they get less. The processor time per request that makes
  the model's throughput match the measured one is that work (bisection; the model's
  throughput falls as it grows). Measured on this 2-core machine with a model whose
  run costs nothing, the local server and the generator spend about 2 ms of processor
  time on each 300 KB image request, all of it taken from the runs. The generator
  measures its own share; the rest is the server's, which the local (Python) server
  spends holding its interpreter lock, one request at a time: a batch waiting for its
  requests waits for them in line (TF Serving's C++ server has no such line).

* **the N clients' p99**: a Python server hands requests out of one completion queue in
  order, but its interpreter lock goes to whichever thread the system wakes; the share
  of the one-at-a-time picks taken out of arrival order is fitted so that the model's
  p99 at that point is the measured one (order moves the tail, not the throughput).

The N-client measurement is therefore not a prediction but the model's calibration,
and the report says so; every other point is predicted before it is measured.

Example:
    >>> calibration = fit(curve, 1, one_client_result, sixteen_clients_result)
    >>> calibration.service.cpu_s > 0
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from serving_opt.tune.curve import LatencyCurve
from serving_opt.tune.load import LoadResult
from serving_opt.tune.scheduler import ServiceModel, Workload, simulate
from serving_opt.tune.settings import BatchingSettings, ThreadSettings
from serving_opt.tune.settings import cores as cores_here

STEPS = 10


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


def _fit_order(curve: LatencyCurve, batching: BatchingSettings | None, workload: Workload,
               service: ServiceModel, p99_ms: float) -> tuple[ServiceModel, str]:
    """The share of the one-at-a-time part's picks that are random, not oldest first,
    that makes the model's p99 at the N-client point the measured one (bisection; the
    order moves the tail, not the throughput). A Python server hands the requests'
    events out of one completion queue in order, but its interpreter lock goes to
    whichever thread the system wakes.

    Example:
        >>> _fit_order(curve, upstream, workload, service, 47.5)[1]
        '; 35% of the one-at-a-time picks out of arrival order (fitted to the p99)'
    """
    if service.serial_s <= 0 or not math.isfinite(p99_ms) or p99_ms <= 0:
        return service, ""

    def p99(share: float) -> float:
        return simulate(curve, batching, workload,
                        replace(service, serial_out_of_order=share)).p99_ms

    if p99(0.0) >= p99_ms:
        return service, ""
    if p99(1.0) <= p99_ms:
        return (replace(service, serial_out_of_order=1.0),
                "; every one-at-a-time pick random and the p99 still short of the measured")
    lo, hi = 0.0, 1.0
    for _ in range(STEPS // 2 + 2):
        mid = (lo + hi) / 2
        if p99(mid) < p99_ms:
            lo = mid
        else:
            hi = mid
    share = (lo + hi) / 2
    return (replace(service, serial_out_of_order=share),
            f"; {share:.0%} of the one-at-a-time picks out of arrival order (fitted to the "
            "p99)")


@dataclass(frozen=True)
class FitSetting:
    """What the two calibration measurements ran under, besides the load itself.

    ``batching``: the server's batching during them (upstream's defaults); ``cores``:
    the machine's (0: this one's); ``python_server``: the local server, whose own
    processor time holds its interpreter lock (TF Serving's C++ server has none);
    ``merge_s_per_row``: the batch merge cost the profile measured.

    Example:
        >>> FitSetting("rest", batching=BatchingSettings(max_batch_size=1000), cores=2)
    """

    protocol: str = "grpc"
    merge_s_per_row: float = 0.0
    seed: int = 0
    batching: BatchingSettings | None = None
    cores: int = 0
    python_server: bool = True


def fit(curve: LatencyCurve, rows: int, one_client: LoadResult,
        many_clients: LoadResult | None, setting: FitSetting = FitSetting()) -> Calibration:
    """Fits the server's cost per request to the two measurements: the delay each
    request spends outside its run, and the processor time it takes from the runs.

    One client's median latency is the session run (the profile's median) plus the
    delay. N clients on a busy machine get less than the runs alone allow when each
    request also costs processor time on the cores the runs use (the server decoding
    and answering it, the load generator sending it): that time ``cpu_s`` is what
    makes the model's throughput match (bisection; the model's throughput falls as it
    grows). When the one client answered faster than the profile's run, or N clients
    got more than the runs allow (a shared machine that got faster), the runs are
    scaled to fit instead.

    Example:
        >>> fit(curve, 1, one, many, FitSetting(batching=upstream, cores=2)).note
        'one client 10.26 ms against a 8.48 ms session run: 1.78 ms outside the run ...'
    """
    protocol, merge_s_per_row, seed = setting.protocol, setting.merge_s_per_row, setting.seed
    batching, cores, python_server = setting.batching, setting.cores, setting.python_server
    run_s = curve.seconds(rows)  # the median run
    if not one_client.ok:
        raise ValueError(f"the one-client calibration got no answer ({one_client.first_error})")
    # Medians on both sides: a shared machine's stalls move means, not medians.
    latency = one_client.p50_ms / 1000.0
    overhead = max(0.0, latency - run_s)
    jitter = spread(one_client)
    # Of the processor time a request takes, the load generator's own is measured; the
    # rest is the server's, and a Python server spends it holding its interpreter lock:
    # one request at a time (what delays a batch that waits for its requests to arrive).
    # TF Serving's C++ server (python_server False) has no such lock.
    generator = many_clients.client_cpu_per_request if many_clients is not None else 0.0

    def model(cpu: float) -> ServiceModel:
        serial = max(0.0, cpu - generator) if python_server else 0.0
        rest = latency - serial
        if rest >= run_s:
            return ServiceModel(parallel_s=rest - run_s, serial_s=serial,
                                merge_s_per_row=merge_s_per_row, serial_jitter=jitter,
                                cpu_s=cpu, cores=cores)
        return ServiceModel(serial_s=serial, merge_s_per_row=merge_s_per_row,
                            run_scale=max(rest, 1e-6) / run_s, serial_jitter=jitter,
                            cpu_s=cpu, cores=cores)

    base = model(0.0)
    service, extra = base, ""
    if many_clients is not None and many_clients.ok:
        workload = Workload("closed", clients=many_clients.clients, rows_per_request=rows,
                            max_requests=2000, seed=seed, warmup=0.0,
                            warmup_answers=2 * many_clients.clients + 20)
        target = many_clients.rows_per_second

        def throughput(model: ServiceModel) -> float:
            return simulate(curve, batching, workload, model).rows_per_second

        if throughput(base) > target:
            # Every core spent on the requests themselves at the measured rate: the most
            # processor time per request that can explain it.
            top = (cores or cores_here()) * rows / max(target, 1e-9)
            if throughput(model(top)) > target:
                service = model(top)
                extra = ("; the server is slower under concurrency than even its requests "
                         "taking every core explains")
            else:
                lo, hi = 0.0, top
                for _ in range(STEPS):
                    mid = (lo + hi) / 2
                    if throughput(model(mid)) > target:
                        lo = mid
                    else:
                        hi = mid
                service = model((lo + hi) / 2)
        else:
            # N clients got more than the profile's runs allow: the session ran faster
            # now. Runs are scaled down (one client's latency kept: the rest is delay)
            # until the model gets what N clients got.
            def faster(k: float) -> ServiceModel:
                return replace(base, parallel_s=max(0.0, latency - k * run_s), run_scale=k)

            lo, hi = 0.05 * base.run_scale, base.run_scale
            if throughput(faster(lo)) < target:
                service = faster(lo)
                extra = "; N clients got more than even 20x faster runs explain"
            else:
                for _ in range(STEPS):
                    mid = (lo + hi) / 2
                    if throughput(faster(mid)) < target:
                        hi = mid
                    else:
                        lo = mid
                service = faster((lo + hi) / 2)
        if python_server:
            service, order = _fit_order(curve, batching, workload, service,
                                        many_clients.p99_ms)
            extra += order
    else:
        extra = " (no concurrent measurement: no processor time taken from the runs)"
    note = (f"one client {latency * 1000:.2f} ms against a {run_s * 1000:.2f} ms session run: "
            f"{service.parallel_s * 1000:.2f} ms outside the run")
    if many_clients is not None and many_clients.ok:
        note += (f", and {service.cpu_s * 1000:.2f} ms of processor time per request taken "
                 f"from the runs ({generator * 1000:.2f} ms of it the load generator's; the "
                 f"server's {service.serial_s * 1000:.2f} ms one request at a time)")
    if service.run_scale != 1.0:
        note += (f"; session runs scaled by {service.run_scale:.2f} to fit (the machine ran "
                 "them at another speed than during the profile)")
    return Calibration(protocol, service, run_s, overhead, one_client, many_clients,
                       note + extra, curve.threads)
