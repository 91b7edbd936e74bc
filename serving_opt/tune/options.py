"""``TuneOptions``: what ``serving-opt tune`` (and ``tune()``) is asked, checked up front.

Every bad value is a UsageError naming the flag and the fix, raised by
:func:`check_options` before anything is measured.

Example:
    >>> check_options(TuneOptions(clients=16, slo_p99_ms=250))
    >>> check_options(TuneOptions(slo_p99_ms=250))
    Traceback (most recent call last):
    UsageError: nothing to tune for: give --clients=N (closed loop) and/or --rate=R ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving_opt.errors import UsageError
from serving_opt.serving import backends

PROTOCOLS = ("grpc", "rest")
MAX_CLIENTS = 4096
MAX_ROWS = 1 << 20
MAX_THREADS = 1024


@dataclass(frozen=True)
class TuneOptions:
    """Options of ``serving-opt tune``.

    ``intra_op`` / ``inter_op``: the ``--tensorflow_*_op_parallelism`` values to measure
    (every pair of them; 0 is TensorFlow's default, one per core); None: intra {default,
    1} and inter {default}. ``max_batch_size_bound``: the largest batch measured (0:
    enough for the workload, at least 32 rows, at most 512). ``prove``: tuned candidates
    proven besides the best (from the front). ``current_parameters_file``: a
    BatchingParameters file in use today, proven next to the tuned one.

    Example:
        >>> TuneOptions(clients=16, slo_p99_ms=250, duration=15.0)
    """

    slo_p99_ms: float = 250.0
    clients: int = 0
    rate: float = 0.0
    rows_per_request: int = 1
    model_name: str | None = None
    version: int | None = None
    signature_name: str = "serving_default"
    saved_model_tags: str = "serve"
    examples: str | None = None
    intra_op: tuple[int, ...] | None = None
    inter_op: tuple[int, ...] | None = None
    max_batch_size_bound: int = 0
    padding: str = "none"
    max_reject_fraction: float = 0.001
    profile_seconds: float = 1.0
    duration: float = 15.0
    warmup: float = 2.0
    calibration_seconds: float = 5.0
    prove: int = 2
    recheck: bool = True  # measure the calibration point again at the end (drift)
    protocols: tuple[str, ...] = PROTOCOLS
    server: str = "auto"
    image: str = backends.DEFAULT_IMAGE
    current_parameters_file: str | None = None
    load_deadline: float = 300.0
    request_timeout: float = 30.0
    allow_file_ops: bool = False
    allow_unsandboxed: bool = False
    seed: int = 0


def parse_int_list(text: str, flag: str) -> tuple[int, ...] | None:
    """``"auto"`` -> None; ``"0,1,2"`` -> (0, 1, 2); anything else a UsageError.

    Example:
        >>> parse_int_list("1,2", "--tensorflow_intra_op_parallelism")
        (1, 2)
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


def check_options(options: TuneOptions) -> None:
    """Raises UsageError for the first bad option (before any work).

    Example:
        >>> check_options(TuneOptions(clients=0, rate=0))
        Traceback (most recent call last):
        UsageError: nothing to tune for: ...
    """
    if not options.clients and not options.rate:
        raise UsageError("nothing to tune for: give --clients=N (closed loop) and/or "
                         "--rate=R (open loop, requests/s)",
                         "e.g. --clients=16, the concurrent requests your callers make")
    if not 0 <= options.clients <= MAX_CLIENTS:
        raise UsageError(f"--clients={options.clients} must be within [1, {MAX_CLIENTS}]",
                         "e.g. --clients=16")
    if not (options.rate == 0 or 0 < options.rate < 1e6):
        raise UsageError(f"--rate={options.rate} must be a positive number of requests/s",
                         "e.g. --rate=200")
    if not 1 <= options.rows_per_request <= MAX_ROWS:
        raise UsageError(f"--rows_per_request={options.rows_per_request} must be >= 1",
                         "e.g. --rows_per_request=1 (one image per request)")
    if not 0 < options.slo_p99_ms < math.inf:
        raise UsageError(f"--slo_p99_ms={options.slo_p99_ms} must be a positive number of "
                         "milliseconds", "e.g. --slo_p99_ms=250")
    for name, low in (("profile_seconds", 0.01), ("duration", 0.1), ("calibration_seconds", 0.1),
                      ("load_deadline", 1.0), ("request_timeout", 0.1)):
        value = getattr(options, name)
        if not low <= value <= 24 * 3600:
            raise UsageError(f"--{name}={value} must be within [{low:g}, 86400] seconds",
                             f"e.g. --{name}={TuneOptions.__dataclass_fields__[name].default:g}")
    if not 0 <= options.warmup <= 3600:
        raise UsageError(f"--warmup={options.warmup} must be within [0, 3600] seconds",
                         "e.g. --warmup=2")
    if not 0 <= options.prove <= 16:
        raise UsageError(f"--prove={options.prove} must be within [0, 16]", "e.g. --prove=2")
    if not 0 <= options.max_reject_fraction < 1:
        raise UsageError(f"--max_reject_fraction={options.max_reject_fraction} must be in "
                         "[0, 1)", "e.g. --max_reject_fraction=0.001")
    if options.max_batch_size_bound and not 1 <= options.max_batch_size_bound <= MAX_ROWS:
        raise UsageError(f"--max_batch_size_bound={options.max_batch_size_bound} must be >= 1",
                         "e.g. --max_batch_size_bound=64, or 0 for automatic")
    if (options.max_batch_size_bound
            and options.max_batch_size_bound < options.rows_per_request):
        raise UsageError(f"--max_batch_size_bound={options.max_batch_size_bound} is below "
                         f"--rows_per_request={options.rows_per_request}",
                         "a batch holds at least one request; raise the bound")
    check_padding(options.padding)
    names = [p for p in options.protocols if p]
    if not names or any(p not in PROTOCOLS for p in names):
        raise UsageError(f"--protocols={','.join(options.protocols)} must name grpc, rest or "
                         "both", "e.g. --protocols=grpc,rest")
    if options.server not in backends.BACKENDS:
        raise UsageError(f"--server={options.server} is not one of "
                         f"{', '.join(backends.BACKENDS)}", "e.g. --server=auto")
    if options.version is not None and options.version < 0:
        raise UsageError(f"--version={options.version} is not a version",
                         "pass --version=N, or leave it out for the highest")
    for values, flag in ((options.intra_op, "--tensorflow_intra_op_parallelism"),
                         (options.inter_op, "--tensorflow_inter_op_parallelism")):
        if values is not None and (not values or any(v < 0 for v in values)):
            raise UsageError(f"{flag} needs thread counts >= 0", f"e.g. {flag}=0,1")
    if not options.signature_name:
        raise UsageError("--signature_name is empty", "e.g. --signature_name=serving_default")
