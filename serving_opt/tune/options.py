"""``TuneOptions``: what ``serving-opt tune`` (and ``tune()``) is asked, checked up front.

A tree of small frozen groups, like ``OptimizeOptions``: the load and its objective
(``WorkloadOptions``), the model and how it is called (``ModelOptions``), the settings
the grid is read from (``SearchOptions``), the time spent measuring (``BudgetOptions``), the server
the proof runs on (``ServerOptions``, the group ``serving``) and what the model is trusted with
(``TrustOptions``, optimize's own group). Each option has one spelling, its group's
(``TuneOptions(workload=WorkloadOptions(clients=16))``, ``options.workload.clients``).
Each field with ``help`` is a flag of
``serving-opt tune`` (``serving_opt.cli.option_flags`` makes them).

Every bad value is a UsageError naming the flag and the fix, raised by
:func:`check_options` before anything is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from serving_opt.errors import UsageError
from serving_opt.options import (
    DOCKER_NETWORK_HELP,
    OptionTree,
    TrustOptions,
    check_docker_network,
    check_version,
)
from serving_opt.serving import backends
from serving_opt.serving import runtime as runtime_lib

PROTOCOLS = ("grpc", "rest")
MAX_CLIENTS = 4096
MAX_ROWS = 1 << 20
MAX_THREADS = 1024
MAX_SECONDS = 24 * 3600


def parse_int_list(text: str, flag: str) -> tuple[int, ...] | None:
    """``"auto"`` -> None; ``"0,1,2"`` -> (0, 1, 2); anything else a UsageError.
    """
    if text.strip().lower() == "auto":
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"{flag}={text} is not 'auto' or a list of thread counts",
                         f"e.g. {flag}=0,1 (0: TensorFlow's default)")
    values = tuple(dict.fromkeys(int(p) for p in parts))
    if any(v > MAX_THREADS for v in values):
        raise UsageError(f"{flag}={text}: at most {MAX_THREADS} threads",
                         f"e.g. {flag}=0,1")
    return values


def check_padding(text: str) -> str:
    """``none``, ``pow2`` or an increasing list of row counts."""
    if text in ("none", "pow2"):
        return text
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"--allowed_batch_sizes={text} is not none, pow2 or a list of sizes",
                         "e.g. --allowed_batch_sizes=pow2 or --allowed_batch_sizes=8,16,32")
    values = [int(p) for p in parts]
    if any(b <= a for a, b in zip(values, values[1:])):
        raise UsageError(f"--allowed_batch_sizes={text} must increase",
                         "e.g. --allowed_batch_sizes=8,16,32")
    return ",".join(map(str, values))


def _protocols(given: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    # The flag is a list; "GRPC, rest" means grpc and rest. Checked by ServerOptions.
    return tuple(p.strip().lower() for p in given)


def _opt(default: Any, help: str = "", **flag: Any) -> Any:  # noqa: A002 - absl's word
    """A field and its flag (see ``serving_opt.cli.option_flags`` for the metadata)."""
    return field(default=default, metadata={"help": help, **flag})


def _within(name: str, value: float, low: float, high: float, example: str) -> None:
    if not low <= value <= high:
        raise UsageError(f"--{name}={value} must be within [{low:g}, {high:g}] seconds",
                         f"e.g. --{name}={example}")


@dataclass(frozen=True)
class WorkloadOptions:
    """The load tune is asked to serve, and its objective (``optimize --tune`` shares it)."""

    # The flag has no default: an objective is the user's to give (a required flag).
    slo_p99_ms: float = _opt(250.0, "The p99 latency objective, in milliseconds.",
                             flag_default=None)
    clients: int = _opt(0, "Closed-loop clients: each sends its next request when its answer "
                        "arrives (0: none).")
    rate: float = _opt(0.0, "Open-loop Poisson arrivals, requests/s (0: none).")
    rows_per_request: int = _opt(1, "Rows (examples, images) in each request.")

    def check(self) -> None:
        """UsageError for the first bad value."""
        if not self.clients and not self.rate:
            raise UsageError("nothing to tune for: give --clients=N (closed loop) and/or "
                             "--rate=R (open loop, requests/s)",
                             "e.g. --clients=16, the concurrent requests your callers make")
        if not 0 <= self.clients <= MAX_CLIENTS:
            raise UsageError(f"--clients={self.clients} must be within [1, {MAX_CLIENTS}]",
                             "e.g. --clients=16")
        if not (self.rate == 0 or 0 < self.rate < 1e6):
            raise UsageError(f"--rate={self.rate} must be a positive number of requests/s",
                             "e.g. --rate=200")
        if not 1 <= self.rows_per_request <= MAX_ROWS:
            raise UsageError(f"--rows_per_request={self.rows_per_request} must be >= 1",
                             "e.g. --rows_per_request=1 (one image per request)")
        if not 0 < self.slo_p99_ms < math.inf:
            raise UsageError(f"--slo_p99_ms={self.slo_p99_ms} must be a positive number of "
                             "milliseconds", "e.g. --slo_p99_ms=250")


@dataclass(frozen=True)
class ModelOptions:
    """Which model, which version, and how its clients call it."""

    model_name: str | None = _opt(None, "Model name (default: the base's directory name).")
    version: int | None = _opt(None, "Version to tune (default: the highest).")
    signature_name: str = _opt("serving_default", "Signature the clients call.")
    saved_model_tags: str = _opt("serve", "MetaGraph tag set.")
    examples: str | None = _opt(
        None, "Request inputs: TFRecord of tf.Example or JSON lines (default: synthesized "
        "from the signature).")

    def check(self) -> None:
        """UsageError for the first bad value."""
        if self.version is not None and self.version < 0:
            raise UsageError(f"--version={self.version} is not a version",
                             "pass --version=N, or leave it out for the highest")
        if not self.signature_name:
            raise UsageError("--signature_name is empty",
                             "e.g. --signature_name=serving_default")


@dataclass(frozen=True)
class SearchOptions:
    """The settings the grid is read from.

    ``intra_op`` / ``inter_op``: the ``--tensorflow_*_op_parallelism`` values to measure
    (every pair of them; 0 is TensorFlow's default, one per core); None: intra {default,
    1} and inter {default}. ``max_batch_size_bound``: the largest batch measured (0:
    enough for the workload, at least 32 rows, at most 512). ``padding``: none, pow2 or
    a list of ``allowed_batch_sizes``.
    """

    intra_op: tuple[int, ...] | None = _opt(
        None, "Values of TF Serving's flag to measure, e.g. 0,1,2 (0: TensorFlow's default); "
        "auto: 0 and 1.", flag="tensorflow_intra_op_parallelism", flag_type="str",
        flag_default="auto", parse=parse_int_list)
    inter_op: tuple[int, ...] | None = _opt(
        None, "Values of TF Serving's flag to measure (every pair with the intra values); "
        "auto: 0.", flag="tensorflow_inter_op_parallelism", flag_type="str",
        flag_default="auto", parse=parse_int_list)
    max_batch_size_bound: int = _opt(
        0, "Largest batch measured and tried (0: twice the clients' rows, at least 32).")
    padding: str = _opt(
        "none", "none, pow2 (pad to powers of two up to max_batch_size), or a list of sizes; "
        "the cost of padding is reported either way.", flag="allowed_batch_sizes",
        parse=lambda text, flag: check_padding(text))
    max_reject_fraction: float = _opt(
        0.001, "Requests a setting may reject (UNAVAILABLE, max_enqueued_batches).")

    def check(self, rows_per_request: int = 1) -> None:
        """UsageError for the first bad value."""
        if not 0 <= self.max_reject_fraction < 1:
            raise UsageError(f"--max_reject_fraction={self.max_reject_fraction} must be in "
                             "[0, 1)", "e.g. --max_reject_fraction=0.001")
        bound = self.max_batch_size_bound
        if bound and not 1 <= bound <= MAX_ROWS:
            raise UsageError(f"--max_batch_size_bound={bound} must be >= 1",
                             "e.g. --max_batch_size_bound=64, or 0 for automatic")
        if bound and bound < rows_per_request:
            raise UsageError(f"--max_batch_size_bound={bound} is below "
                             f"--rows_per_request={rows_per_request}",
                             "a batch holds at least one request; raise the bound")
        check_padding(self.padding)
        for values, flag in ((self.intra_op, "--tensorflow_intra_op_parallelism"),
                             (self.inter_op, "--tensorflow_inter_op_parallelism")):
            if values is not None and (not values or any(v < 0 for v in values)):
                raise UsageError(f"{flag} needs thread counts >= 0", f"e.g. {flag}=0,1")


@dataclass(frozen=True)
class BudgetOptions:
    """How long each thing is measured, and how many times.

    ``rounds``: the interleaved repetitions of upstream's defaults against the measured
    best that decide whether tuning beat them by more than the noise.
    """

    profile_seconds: float = _opt(1.0, "Seconds per measured batch size.")
    duration: float = _opt(15.0, "Seconds of each proven load point.")
    warmup: float = _opt(2.0, "Seconds of load before each point is measured.")
    rounds: int = _opt(
        3, "Interleaved rounds of upstream's batching defaults against the measured best "
        "(each --duration long): tuning must beat upstream by more than their spread, "
        "else upstream's defaults are recommended.")
    recheck: bool = _opt(True, "Measure upstream's batching defaults again at the end: how "
                         "far the machine itself drifted during the run.")
    request_timeout: float = 30.0
    seed: int = 0

    def check(self) -> None:
        """UsageError for the first bad value."""
        defaults = BudgetOptions()
        for name, low in (("profile_seconds", 0.01), ("duration", 0.1),
                          ("request_timeout", 0.1)):
            _within(name, getattr(self, name), low, MAX_SECONDS, f"{getattr(defaults, name):g}")
        _within("warmup", self.warmup, 0, 3600, "2")
        if not 1 <= self.rounds <= 100:
            raise UsageError(f"--rounds={self.rounds} must be within [1, 100]",
                             "e.g. --rounds=3 (1: no interval, upstream's defaults win ties)")


@dataclass(frozen=True)
class ServerOptions:
    """The server the proof runs on, and what it is compared with.

    ``current_parameters_file``: a BatchingParameters file in use today, proven next to
    the tuned one.
    """

    protocols: tuple[str, ...] = _opt(PROTOCOLS, "Load over grpc, rest or both.",
                                      parse=lambda given, flag: _protocols(given))
    server: str = _opt("auto", "docker, binary (tensorflow_model_server on PATH), local "
                       "(serving-opt serve --enable_batching), or auto: the first that can "
                       "run here.", choices=backends.BACKENDS)
    image: str = _opt(backends.DEFAULT_IMAGE, "Docker image for --server=docker.")
    docker_network: str = _opt("bridge", DOCKER_NETWORK_HELP, choices=backends.DOCKER_NETWORKS)
    current_parameters_file: str | None = _opt(
        None, "A batching parameters file in use today: proven beside the tuned settings.")
    load_deadline: float = _opt(300.0, "Seconds to wait for the model to load.")
    # validate's flags (TargetOptions), same words: tune proves on the production's release.
    serving_version: str | None = _opt(
        None, "TensorFlow release of the TF Serving production runs (e.g. 2.15.1): the local "
        "server and the session profile run under it (installed once into "
        "~/.cache/serving-opt if missing), and --server=docker runs tensorflow/serving:<it> "
        "unless --image names another image. Default: the current TF Serving release, used "
        "only if its runtime is already here (the report says so).")
    serving_runtime_python: str | None = _opt(
        None, "A python whose TensorFlow is --serving_version's (instead of a cached venv; "
        "also $SERVING_OPT_RUNTIME_<X>_<Y>).")

    def docker_image(self) -> str:
        """The image ``--server=docker`` runs: ``--image`` when given, else the
        ``--serving_version`` release's (``tensorflow/serving:<version>``).
        """
        if self.serving_version is None or self.image != backends.DEFAULT_IMAGE:
            return self.image
        return f"tensorflow/serving:{self.serving_version.strip()}"

    def check(self) -> None:
        """UsageError for the first bad value."""
        _within("load_deadline", self.load_deadline, 1.0, MAX_SECONDS, "300")
        if self.serving_version is not None:
            version = check_version(self.serving_version)
            tagged = runtime_lib.image_version(self.image)
            if (self.image != backends.DEFAULT_IMAGE and tagged is not None
                    and runtime_lib.major_minor(tagged) != runtime_lib.major_minor(version)):
                # TF Serving 2.N runs TensorFlow 2.N: the proof would run another release.
                raise UsageError(f"--image={self.image} runs TF Serving {tagged}, not "
                                 f"--serving_version={version}",
                                 f"drop --image (tensorflow/serving:{version} is used) or make "
                                 "the two agree")
        names = [p for p in self.protocols if p]
        if not names or any(p not in PROTOCOLS for p in names):
            raise UsageError(f"--protocols={','.join(self.protocols)} must name grpc, rest "
                             "or both", "e.g. --protocols=grpc,rest")
        if self.server not in backends.BACKENDS:
            raise UsageError(f"--server={self.server} is not one of "
                             f"{', '.join(backends.BACKENDS)}", "e.g. --server=auto")
        check_docker_network(self.docker_network)


# TrustOptions' flags tune has not: its sandbox takes the wall-clock limit, not memory.
TRUST_FLAGS_SKIPPED = ("sandbox_memory_bytes",)


@dataclass(frozen=True, init=False)
class TuneOptions(OptionTree):
    """Options of ``serving-opt tune``: one group per concern."""

    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    search: SearchOptions = field(default_factory=SearchOptions)
    budget: BudgetOptions = field(default_factory=BudgetOptions)
    serving: ServerOptions = field(default_factory=ServerOptions)
    trust: TrustOptions = field(default_factory=TrustOptions)

    GROUPS: ClassVar[dict[str, type]] = {
        "workload": WorkloadOptions, "model": ModelOptions, "search": SearchOptions,
        "budget": BudgetOptions, "serving": ServerOptions, "trust": TrustOptions}

    def __init__(self, **options: Any) -> None:
        self._assign_keywords(options)

    def check(self) -> None:
        """UsageError for the first bad option, before any work."""
        self.workload.check()
        self.budget.check()
        self.search.check(self.workload.rows_per_request)
        self.serving.check()
        self.model.check()


def check_options(options: TuneOptions) -> None:
    """Raises UsageError for the first bad option (before any work)."""
    if not isinstance(options, TuneOptions):
        raise UsageError(f"tune options are a {type(options).__name__}, not TuneOptions",
                         "pass serving_opt.tune.TuneOptions(...)")
    options.check()


__all__ = ["BudgetOptions", "ModelOptions", "SearchOptions", "ServerOptions", "TuneOptions",
           "WorkloadOptions", "check_options"]
