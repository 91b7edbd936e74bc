"""A tune report made by the real functions (scheduler model, search, recommend,
findings) on a synthetic profile: no model runs. Shared by the tune output tests; a
module of its own so that each test file's Bazel py_test has it (test files are not
each other's data).
"""

from __future__ import annotations

from serving_opt.serving import backends
from serving_opt.tune import tuner
from serving_opt.tune.calibrate import Calibration
from serving_opt.tune.curve import ConcurrencyPoint, LatencyCurve
from serving_opt.tune.load import LoadResult
from serving_opt.tune.profile import ModelProfile
from serving_opt.tune.prove import ProvenPoint
from serving_opt.tune.report import TuneReport
from serving_opt.tune.scheduler import ServiceModel
from serving_opt.tune.search import Objective, evaluate, search
from serving_opt.tune.settings import ThreadSettings, tf_serving_default, upstream_batching


def _profile() -> ModelProfile:
    sizes = (1, 2, 4, 8, 16, 32)
    ms = (6.0, 8.0, 12.0, 19.0, 30.0, 45.0)
    curve = LatencyCurve(ThreadSettings(), sizes, tuple(m / 1000 for m in ms),
                         concurrency=(ConcurrencyPoint(1, 4, 0.022), ConcurrencyPoint(1, 8, 0.045),
                                      ConcurrencyPoint(16, 2, 0.055)))
    single = LatencyCurve(ThreadSettings(1, 0), sizes, tuple(2 * m / 1000 for m in ms),
                          concurrency=(ConcurrencyPoint(16, 2, 0.061),))
    return ModelProfile("serving_default", (curve, single))


def _measured(prediction, factor: float) -> LoadResult:
    return LoadResult("grpc", "closed", 8, 0.0, 1, 10.0, 100, 100,
                      rows_per_second=prediction.rows_per_second * factor,
                      requests_per_second=prediction.rows_per_second * factor,
                      p50_ms=prediction.p50_ms * factor, p99_ms=prediction.p99_ms * factor)


def synthetic_report() -> TuneReport:
    """A report made by the real functions on a synthetic profile (no model runs)."""
    profile = _profile()
    objective = Objective(slo_p99_ms=250, clients=8)
    service = ServiceModel(parallel_s=0.002, serial_s=0.0003)
    result = search(profile, objective, service, cpus=2, screen_requests=200,
                    final_requests=600)
    points = []
    for label, settings, factor in ((tuner.DEFAULT_LABEL, tf_serving_default(), 0.6),
                                    (tuner.UPSTREAM_LABEL, upstream_batching(), 0.9),
                                    (tuner.TUNED_LABEL, result.best.settings, 1.3)):
        predicted = evaluate(profile, settings, objective, service, 600).predictions["closed"]
        points.append(ProvenPoint(label, settings, "closed", "grpc", _measured(predicted, factor),
                                  predicted, calibration=label == tuner.DEFAULT_LABEL))
    recommendation = tuner.recommend(points, objective, "grpc", "mnv2", result)
    calibration = Calibration("grpc", service, 0.006, 0.0023, note="overhead 2.30 ms")
    made = TuneReport(
        model_base="/models/mnv2", model_dir="/models/mnv2/1", model_name="mnv2", version=1,
        signature="serving_default", objective=objective, backend="local",
        backend_note=backends.BACKEND_NOTES["local"], server="local:test", tensorflow_version="x",
        cores=2, profile=profile, calibrations=(calibration,), search=result,
        proven=tuple(points), recommendation=recommendation, ceiling_rows_per_second=711.0,
        ceiling_batch_size=32)
    import dataclasses

    from serving_opt.tune import findings

    return dataclasses.replace(made, findings=findings.findings(made),
                               notes=findings.notes(made))
