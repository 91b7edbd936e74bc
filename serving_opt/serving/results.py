"""What validation found, as data: a check, the load phase's numbers, the report.

The report types live apart from the executor that fills them (``validate``) and the
code that reads them (``markers``, ``report``), so that neither imports the other. They
travel out of the sandbox as JSON of an explicit schema (``serving_opt.sandbox.results``
lists them), so they hold data only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Check:
    """One validation check and its outcome."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class LoadTest:
    """The load phase's numbers."""

    concurrency: int
    seconds: float
    requests: int
    errors: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    first_error: str = ""


@dataclass(frozen=True)
class ValidationReport:
    """The validation verdict; ``to_dict()`` is the JSON report."""

    ok: bool
    backend: str
    backend_note: str
    address: str
    model_name: str
    model_base: str
    version: int
    reference_dir: str
    checks: tuple[Check, ...]
    load_test: LoadTest | None
    warmup_file: str | None = None
    server_log_tail: str = ""
    failures: tuple[str, ...] = field(default_factory=tuple)
    # What answered: "docker:<image>", "binary:<path> <version>", or
    # "local:serving-opt serve (stand-in) on TensorFlow X"; and that TensorFlow's version.
    server: str = ""
    tensorflow_version: str = ""
    runtime_note: str = ""  # why the stand-in runs this TensorFlow, when not the target
    protocols: tuple[str, ...] = ("grpc",)
    rest_address: str | None = None
    rest_load_test: LoadTest | None = None
    # Other versions in the base: not served, not run (a specific version policy).
    ignored_versions: tuple[int, ...] = ()
    sandbox: str = ""  # how the reference model and the server were isolated
    # Serialized PredictionLogs of the matched probes, for validate() to write (bytes).
    warmup_records: tuple[bytes, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)
