"""A tune report made by the real functions (grid, recommend, findings) on a synthetic
profile and given measurements: no model runs. Shared by the tune output tests; a module
of its own so that each test file's Bazel py_test has it (test files are not each
other's data).
"""

from __future__ import annotations

import dataclasses

from serving_opt.serving import backends
from serving_opt.tune import findings, grid, tuner
from serving_opt.tune.load import LoadResult
from serving_opt.tune.profile import LatencyCurve, ModelProfile
from serving_opt.tune.prove import ProvenPoint
from serving_opt.tune.report import TuneReport
from serving_opt.tune.settings import ThreadSettings, tf_serving_default, upstream_batching

SIZES = (1, 2, 4, 8, 16, 32)
MS = (6.0, 8.0, 12.0, 19.0, 30.0, 45.0)


def profile() -> ModelProfile:
    return ModelProfile("serving_default", (
        LatencyCurve(ThreadSettings(), SIZES, tuple(m / 1000 for m in MS)),
        LatencyCurve(ThreadSettings(1, 0), SIZES, tuple(2 * m / 1000 for m in MS))))


def measured(rows_per_second: float, p99_ms: float, workload: str = "closed",
             protocol: str = "grpc", rejected: int = 0) -> LoadResult:
    return LoadResult(protocol, workload, 8, 0.0, 1, 10.0, 100, 100 - rejected,
                      rejected=rejected, rows_per_second=rows_per_second,
                      requests_per_second=rows_per_second, p50_ms=p99_ms / 2, p99_ms=p99_ms)


def synthetic_report() -> TuneReport:
    """Upstream's defaults, TF Serving's default and the grid, with the grid's first
    batching setting measured best (the figures are given, not predicted)."""
    model = profile()
    objective = grid.Objective(slo_p99_ms=250, clients=8)
    candidates, notes = grid.candidates(model, objective, cpus=2)
    points = [ProvenPoint(tuner.DEFAULT_LABEL, tf_serving_default(), "closed", "grpc",
                          measured(300.0, 60.0)),
              ProvenPoint(tuner.UPSTREAM_LABEL, upstream_batching(), "closed", "grpc",
                          measured(400.0, 50.0))]
    best = next(i for i, s in enumerate(candidates) if s.batching is not None
                and s.threads == ThreadSettings())
    for i, settings in enumerate(candidates):
        rows = 520.0 if i == best else 350.0 - i
        points.append(ProvenPoint(f"{tuner.GRID_LABEL} #{i + 1}", settings, "closed", "grpc",
                                  measured(rows, 45.0)))
    recommendation = tuner.recommend(points, objective, "grpc", "mnv2")
    made = TuneReport(
        model_base="/models/mnv2", model_dir="/models/mnv2/1", model_name="mnv2", version=1,
        signature="serving_default", objective=objective, backend="local",
        backend_note=backends.BACKEND_NOTES["local"], server="local:test", tensorflow_version="x",
        cores=2, profile=model, grid=tuple(notes), proven=tuple(points),
        recommendation=recommendation, ceiling_rows_per_second=711.0, ceiling_batch_size=32)
    return dataclasses.replace(made, findings=findings.findings(made),
                               notes=findings.notes(made))
