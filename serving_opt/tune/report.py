"""``TuneReport``: everything a tuning run measured and recommends; and its table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from serving_opt.core import rendering as report_lib
from serving_opt.tune.decide import Decision
from serving_opt.tune.grid import Objective
from serving_opt.tune.hardware import Hardware
from serving_opt.tune.profile import ModelProfile
from serving_opt.tune.prove import ProvenPoint
from serving_opt.tune.settings import ServingSettings, ThreadSettings

# The configurations every tune run measures, by the names the report and chart use.
DEFAULT_LABEL = "TF Serving default (no batching)"
UPSTREAM_LABEL = "upstream batching defaults"
CURRENT_LABEL = "your parameters file"
AGAIN_LABEL = "upstream batching defaults, again"
GRID_LABEL = "grid"  # the grid's settings are "grid #1", "grid #2", ...


@dataclass(frozen=True)
class Recommendation:
    """The settings to deploy, as TF Serving reads them.

    ``parameters_text`` is the batching_parameters.txt content ('' for no batching);
    ``flags`` the ``tensorflow_model_server`` flags for a model at ``/models/<name>``
    with that file at ``/config/batching_parameters.txt``; ``basis`` says why these.
    """

    settings: ServingSettings
    parameters_text: str
    flags: tuple[str, ...]
    basis: str

    @property
    def command(self) -> str:
        return " ".join(("tensorflow_model_server", *self.flags))


@dataclass(frozen=True)
class TuneReport:
    """One tuning run: the profile, the grid read off it, the proof, the verdict.

    ``grid`` says how the grid was read off each curve; ``findings`` are the sentences a
    reader needs (comparisons, ceiling, drift); ``notes`` say how it was measured.
    """

    model_base: str
    model_dir: str
    model_name: str
    version: int
    signature: str
    objective: Objective
    backend: str
    backend_note: str
    server: str
    tensorflow_version: str  # the server's TensorFlow (local: the --serving_version runtime's)
    cores: int
    profile: ModelProfile
    grid: tuple[str, ...]
    proven: tuple[ProvenPoint, ...]
    recommendation: Recommendation | None
    ceiling_rows_per_second: float
    ceiling_batch_size: int
    ceiling_how: str = ""  # e.g. "2 runs of batch 16 at once, threads intra 1, ..."
    ceiling_threads: ThreadSettings | None = None
    findings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    sandbox: str = ""
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)
    hardware: Hardware | None = None  # the machine the measurements hold for
    decision: Decision | None = None  # upstream's defaults against the best, interleaved

    @property
    def ok(self) -> bool:
        return self.recommendation is not None

    @property
    def recommended_label(self) -> str:
        """The label of the proven point tune recommends ('' for none)."""
        if self.recommendation is None:
            return ""
        return next((p.label for p in self.proven
                     if p.settings == self.recommendation.settings
                     and p.label != AGAIN_LABEL), "")

    def to_dict(self) -> dict:
        """JSON-ready: derived figures of each point included, infinities as null."""
        out = report_lib.to_jsonable(self)
        out["proven"] = [_finite(report_lib.to_jsonable(p.to_dict())) for p in self.proven]
        out["ok"] = self.ok
        if self.decision is not None:
            out["decision"] = self.decision.to_dict()
        out["headline"] = list(headline(self))
        if self.recommendation is not None:
            out["recommendation"]["command"] = self.recommendation.command
            out["recommendation"]["describe"] = self.recommendation.settings.describe()
        return _finite(out)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.1f}"


GENERATOR_SHARE_LIMIT = 0.10  # of the cores: more, and the generator competes with the server


def headline(report: TuneReport) -> tuple[str, ...]:
    """What a reader must see first: whether tuning beat upstream's defaults (or found
    nothing better on this hardware), whether the batching file alone is worse than
    upstream's defaults, whether the load generator took too much of the machine.
    """
    decision, rec = report.decision, report.recommendation
    out = []
    if decision is not None and rec is not None:
        interval = decision.vs_upstream.describe()
        if rec.settings.batching is not None and rec.basis.startswith("upstream's batching"):
            out.append("VERDICT: tuning found nothing better than upstream's batching "
                       f"defaults on this hardware ({decision.tuned_label}: {interval} "
                       "upstream's); recommended: upstream's defaults")
        elif decision.tuned_wins:
            out.append(f"VERDICT: {decision.tuned_label} beats upstream's batching defaults: "
                       f"{interval}")
        alone = decision.alone_vs_upstream
        if decision.alone_worse and alone is not None and rec.settings.threads.flags():
            out.append(
                "WARNING: the batching file alone (without "
                f"{' '.join(rec.settings.threads.flags())}) measured {alone.describe()} "
                "upstream's batching defaults: deploy it only with every flag of "
                "tensorflow_model_server.flags")
    share = generator_share(report)
    if share > GENERATOR_SHARE_LIMIT:
        out.append(f"WARNING: the load generator took {share:.0%} of the cores (over 10%): "
                   "it competed with the server, and the ranking may hold for this "
                   "generator only")
    return tuple(out)


def generator_share(report: TuneReport) -> float:
    """The most of the machine's cores the load generator's own processor time took, over
    every proven point and the decision's rounds.
    """
    cores = max(1, report.cores)
    shares = [p.measured.client_cpu_per_request * p.measured.requests_per_second / cores
              for p in report.proven]
    if report.decision is not None:
        shares.append(report.decision.generator_cpu_share)
    return max(shares, default=0.0)


def format_report(report: TuneReport) -> str:
    """The human table: profile, grid, proof, decision, verdict."""
    objective = report.objective
    load = []
    if objective.clients:
        load.append(f"{objective.clients} closed-loop clients")
    if objective.rate:
        load.append(f"{objective.rate:g} requests/s open loop")
    lines = [
        f"serving-opt tune: {report.model_name} version {report.version} "
        f"({report.signature}), {' and '.join(load)}, {objective.rows_per_request} "
        f"row(s) per request, p99 SLO {objective.slo_p99_ms:g} ms",
        f"  server   {report.server} ({report.backend_note})",
        # The release the proof ran (--serving_version): what the figures hold for.
        f"  tensorflow {report.tensorflow_version or 'unknown'} (the server's)",
        f"  sandbox  {report.sandbox or '-'}",
    ]
    lines[1:1] = [f"  {line}" for line in headline(report)]
    if report.hardware is not None:
        lines += [f"  hardware {report.hardware.describe()}",
                  f"  warning  {report.hardware.warning()}"]
    lines += [
        "",
        "session alone (profile; rows/s at each batch size"
        + (f", {report.profile.kernels} kernels" if report.profile.kernels else "") + "):",
    ]
    curves = report.profile.curves
    sizes = curves[0].batch_sizes if curves else ()
    rows = []
    for curve in curves:
        rows.append([curve.threads.describe(),
                     *[f"{curve.rows_per_second(n):,.0f}" if n in curve.batch_sizes else "-"
                       for n in sizes]])
    lines.append(report_lib.table(["threads", *[f"b{n}" for n in sizes]], rows, indent="  "))
    lines += [f"  grid: {line}" for line in report.grid]
    lines.append("")
    lines.append("proven (each on a server of its own, under the load):")
    rows = []
    for point in report.proven:
        m = point.measured
        rows.append([point.label, f"{point.workload}/{point.protocol}",
                     f"{m.rows_per_second:,.0f}", _ms(m.p50_ms), _ms(m.p99_ms),
                     f"{m.rejected}" if m.rejected else ""])
    lines.append(report_lib.table(["settings", "load", "rows/s", "p50 ms", "p99 ms",
                                   "rejected"], rows, indent="  "))
    lines.append("")
    decision = report.decision
    if decision is not None:
        lines.append(f"decision ({len(next(iter(decision.rows.values())))} interleaved "
                     f"rounds, {decision.workload}/{decision.protocol}; the measured best "
                     "started from the files written for it):")
        rows = [[label, *[f"{r:,.0f}" for r in values],
                 f"{max(decision.p99_ms[label]):.1f}"]
                for label, values in decision.rows.items()]
        rounds = len(rows[0]) - 2 if rows else 0
        lines.append(report_lib.table(
            ["settings", *[f"round {i + 1} rows/s" for i in range(rounds)], "worst p99"],
            rows, indent="  "))
        lines.append(f"  {decision.tuned_label} / {decision.upstream_label}: "
                     f"{decision.vs_upstream.describe()}")
    lines.append(f"load generator: at most {generator_share(report):.0%} of the cores "
                 f"(its own processor time; over {GENERATOR_SHARE_LIMIT:.0%} is flagged)")
    lines.append("")
    labels = {}
    for point in report.proven:
        labels.setdefault(point.label, point.settings)
    lines.append("settings:")
    for label, settings in labels.items():
        lines.append(f"  {label}: {settings.describe()}")
    if report.findings:
        lines.append("")
        lines.append("findings:")
        lines.extend(f"  - {finding}" for finding in report.findings)
    if report.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in report.notes)
    lines.append("")
    if report.recommendation is None:
        lines.append("recommendation: none meets the objective (see findings)")
    else:
        rec = report.recommendation
        lines.append(f"recommendation ({rec.basis}): {rec.settings.describe()}")
        lines.append(f"  {rec.command}")
        if rec.parameters_text:
            lines.extend("  | " + line for line in rec.parameters_text.rstrip().splitlines())
    if report.outputs:
        lines.append("")
        lines.append("written:")
        lines.extend(f"  {name:<24} {path}" for name, path in report.outputs.items())
    return "\n".join(lines)
