"""How tune proves and decides: each setting on a server of its own, the measured best
recommended, then kept only if it beats upstream's defaults in interleaved rounds.

In-process: the run's servers and load generator are fakes (as TFX's infra_validator
tests fake ``_ValidateOnce``) whose figures each test gives, so the logic is checked
without a model, a sandbox or a clock. ``test_tune_cli`` runs the real thing once.
"""

from __future__ import annotations

import contextlib

from tune_reports import measured

from serving_opt.tune import decide, grid, tuner
from serving_opt.tune.options import BudgetOptions, TuneOptions, WorkloadOptions
from serving_opt.tune.settings import (
    BatchingSettings,
    ServingSettings,
    ThreadSettings,
    tf_serving_default,
    upstream_batching,
)

FAST = ServingSettings(BatchingSettings(8, 0, 2, 1), ThreadSettings())
SLOW = ServingSettings(BatchingSettings(8, 1000, 2, 2), ThreadSettings())
THREADED = ServingSettings(BatchingSettings(8, 0, 2, 2), ThreadSettings(1, 0))


class FakeServer:
    description, tf_version = "fake server", "x"

    def __init__(self, settings, deployed=None):
        self.settings, self.deployed, self.stopped = settings, deployed, False

    def stop(self):
        self.stopped = True


class FakeRun:
    """What ``tuner.prove_all`` and ``tuner.decide_rounds`` use of a run; ``figures``
    maps settings to (rows/s, p99 ms), or to a list of them: the proof's, then one per
    interleaved round."""

    def __init__(self, options, figures, protocols=("grpc", "rest")):
        self.options, self.figures, self.protocols = options, figures, protocols
        self.servers, self.launched, self.measured = [], [], []
        self.say = lambda message: None

    @contextlib.contextmanager
    def serve(self, settings, started=None, deployed=None):
        server = started or FakeServer(settings, deployed)
        self.servers.append(server)
        try:
            yield server
        finally:
            server.stop()

    def launch(self, settings, deployed=None):
        server = FakeServer(settings, deployed)
        self.launched.append(server)
        return server

    def targets(self, server):
        return {protocol: (server, protocol) for protocol in self.protocols}

    def load_for(self, workload):
        return workload

    def measure(self, target, workload, label):
        server, protocol = target
        in_rounds = any(server is s for s in self.launched)
        self.measured.append((label, server.settings, workload, protocol, in_rounds))
        figures = self.figures.get(server.settings, (100.0, 50.0))
        if isinstance(figures, list):
            figures = figures[sum(1 for m in self.measured if m[0] == label and m[4])
                              if in_rounds else 0]
        return measured(*figures, workload=workload, protocol=protocol)


def _options(workload: dict | None = None, budget: dict | None = None):
    return TuneOptions(
        workload=WorkloadOptions(**{"slo_p99_ms": 100, "clients": 8, **(workload or {})}),
        budget=BudgetOptions(**{"rounds": 3, **(budget or {})}))


def test_every_setting_gets_a_server_of_its_own_and_the_references_every_protocol():
    objective = grid.Objective(100, clients=8, rate=50)
    run = FakeRun(_options(workload=dict(rate=50)), {})
    current = BatchingSettings(4, 500, 3, 1)
    points, answered = tuner.prove_all(run, [FAST, SLOW], objective, current)
    assert answered == ("fake server", "x")
    served = [s.settings for s in run.servers]
    assert served == [tf_serving_default(), upstream_batching(), FAST, SLOW,
                      ServingSettings(current, ThreadSettings()), upstream_batching()]
    assert all(s.stopped for s in run.servers)
    by_label = {}
    for p in points:
        by_label.setdefault(p.label, set()).add((p.workload, p.protocol))
    every = {(w, p) for w in ("closed", "open") for p in ("grpc", "rest")}
    assert by_label[tuner.DEFAULT_LABEL] == every == by_label[tuner.UPSTREAM_LABEL]
    assert by_label[tuner.CURRENT_LABEL] == every
    # The grid on the primary protocol; upstream's defaults again, last (the drift).
    assert by_label["grid #1"] == by_label["grid #2"] == {("closed", "grpc"), ("open", "grpc")}
    assert points[-1].label == tuner.AGAIN_LABEL
    assert tuner.AGAIN_LABEL not in {p.label for p in tuner.prove_all(
        FakeRun(_options(budget=dict(recheck=False)), {}), [FAST], objective)[0]}


def test_the_measured_best_within_the_slo_on_every_workload_is_recommended():
    objective = grid.Objective(100, clients=8)
    run = FakeRun(_options(), {FAST: (500.0, 40.0), SLOW: (900.0, 150.0)})
    points, _ = tuner.prove_all(run, [FAST, SLOW], objective)
    best = tuner.recommend(points, objective, "grpc", "m")
    # SLOW did more rows/s but missed the 100 ms p99: FAST is the best within the SLO.
    assert best.settings == FAST and best.basis.startswith("measured best of 4 proven")
    # Control: with SLOW within the SLO it is the one recommended.
    run = FakeRun(_options(), {FAST: (500.0, 40.0), SLOW: (900.0, 90.0)})
    assert tuner.recommend(tuner.prove_all(run, [FAST, SLOW], objective)[0], objective,
                           "grpc", "m").settings == SLOW
    # Nothing within the SLO: no recommendation.
    run = FakeRun(_options(), {s: (900.0, 150.0) for s in (FAST, SLOW, tf_serving_default(),
                                                          upstream_batching())})
    assert tuner.recommend(tuner.prove_all(run, [FAST, SLOW], objective)[0], objective,
                           "grpc", "m") is None


def test_an_open_loop_alone_recommends_the_lowest_p99_that_keeps_up():
    objective = grid.Objective(100, rate=50)
    figures = {FAST: (50.0, 30.0), SLOW: (50.0, 20.0), THREADED: (50.0, 10.0)}
    run = FakeRun(_options(workload=dict(clients=0, rate=50)), figures)
    points, _ = tuner.prove_all(run, [FAST, SLOW, THREADED], objective)
    assert {p.workload for p in points} == {"open"}
    assert tuner.recommend(points, objective, "grpc", "m").settings == THREADED
    # One that rejects more than --max_reject_fraction does not keep up, however fast.
    rejecting = [p if p.settings != THREADED else
                 tuner.ProvenPoint(p.label, p.settings, p.workload, p.protocol,
                                   measured(50.0, 10.0, "open", rejected=5))
                 for p in points]
    assert tuner.recommend(rejecting, objective, "grpc", "m").settings == SLOW


def _decided(figures, candidates, rounds=3):
    objective = grid.Objective(100, clients=8)
    run = FakeRun(_options(budget=dict(rounds=rounds)), figures)
    points, _ = tuner.prove_all(run, candidates, objective)
    best = tuner.recommend(points, objective, "grpc", "m")
    run.servers.clear()
    decision = tuner.decide_rounds(run, best, points, objective, cpus=2)
    return run, best, decision, tuner.final_recommendation(best, decision, points, objective,
                                                           "m")


def test_the_best_is_kept_only_when_it_beats_upstream_beyond_the_noise_of_the_rounds():
    upstream = upstream_batching()
    # FAST clears upstream's defaults in every round: kept.
    clear = {FAST: [(500.0, 40.0), (140.0, 40.0), (139.0, 40.0), (141.0, 40.0)],
             upstream: [(100.0, 40.0), (100.0, 40.0), (101.0, 40.0), (99.0, 40.0)]}
    run, best, decision, final = _decided(clear, [FAST])
    assert decision.tuned_wins and final.settings == FAST
    # The rounds interleave, forwards then backwards, on the primary workload.
    labels = [m[0] for m in run.measured if m[4]]
    assert labels == [tuner.DEFAULT_LABEL, tuner.UPSTREAM_LABEL, "grid #1",
                      "grid #1", tuner.UPSTREAM_LABEL, tuner.DEFAULT_LABEL,
                      tuner.DEFAULT_LABEL, tuner.UPSTREAM_LABEL, "grid #1"]
    # The best ran from its deployment set exactly: the flags and file tune writes.
    (written,) = [s for s in run.launched if s.settings == FAST]
    assert written.deployed.flags == best.flags
    assert written.deployed.parameters_text == best.parameters_text
    assert all(s.stopped for s in run.launched)
    # Within the noise (one round better, one worse): upstream's defaults recommended.
    noisy = {FAST: [(500.0, 40.0), (112.0, 40.0), (91.0, 40.0), (104.0, 40.0)],
             upstream: [(100.0, 40.0)] * 4}
    _, _, decision, final = _decided(noisy, [FAST])
    assert not decision.tuned_wins and final.settings == upstream
    assert final.parameters_text == tuner.upstream_parameters_text()


def test_a_best_that_needs_thread_flags_is_also_measured_without_them():
    upstream = upstream_batching()
    figures = {THREADED: [(500.0, 40.0), (150.0, 40.0), (152.0, 40.0), (149.0, 40.0)],
               upstream: [(100.0, 40.0)] * 4}
    run, best, decision, _ = _decided(figures, [FAST, THREADED])
    assert best.settings == THREADED
    assert decision.alone_label == tuner.ALONE_LABEL
    (alone,) = [s for s in run.launched if s.settings.threads == ThreadSettings()
                and s.settings.batching == THREADED.batching]
    assert not any(f.startswith("--tensorflow_") for f in alone.deployed.flags)
    assert "--enable_batching=true" in alone.deployed.flags
    assert len(decision.rows[tuner.ALONE_LABEL]) == 3


def test_nothing_is_decided_when_upstream_measured_best_or_nothing_met_the_slo():
    upstream = upstream_batching()
    run, best, decision, final = _decided({upstream: (900.0, 40.0)}, [FAST])
    assert best.settings == upstream and decision is None and run.launched == []
    assert final.parameters_text == tuner.upstream_parameters_text()
    over = {s: (900.0, 150.0) for s in (FAST, upstream, tf_serving_default())}
    run, best, decision, final = _decided(over, [FAST])
    assert best is None and decision is None and final is None


def test_one_round_is_no_evidence():
    interval = decide.ratio_interval([200.0], [100.0])
    assert interval.low == float("-inf")
