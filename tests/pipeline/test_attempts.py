"""The attempt loop: which candidates are tried, in which order, after which verdict, and
the report listing every attempt and why it was left.

The rules are checked on their own first; then real models go through the loop. Only
the regression gate's judgement is replaced in one test: timings cannot be asserted."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from independent_check import assert_outputs_match, example

from serving_opt import samples
from serving_opt.core.rendering import to_jsonable
from serving_opt.errors import DiskFullError, ParityError, ServingOptError, UsageError
from serving_opt.options import BuildOptions, GateOptions, MeasureOptions
from serving_opt.pipeline import attempts
from serving_opt.pipeline.attempts import (
    LOSSY_GATE_FAILED,
    OK,
    PARITY_FAILED,
    REGRESSION,
    UNUSABLE,
    Candidate,
    Verdict,
    candidates,
    judge_failure,
    next_candidate,
)
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.pipeline.report import format_optimize_report
from serving_opt.stages import freeze as freeze_lib
from serving_opt.stages import regression as regression_lib
from serving_opt.stages.quantize import QuantizedTensor

pytestmark = pytest.mark.in_process  # our own models, stages in this process

NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def _described(freeze: str, quantize: str) -> list[str]:
    return [c.describe() for c in candidates(freeze, quantize)]


def test_the_candidates_follow_freeze_and_quantize():
    assert _described("auto", "none") == ["frozen", "variables kept"]
    assert _described("always", "none") == ["frozen"]
    assert _described("never", "none") == ["variables kept"]
    assert _described("auto", "int8") == [
        "frozen, int8: all large weights", "frozen, int8: tables only",
        "variables kept, int8: all large weights", "variables kept, int8: tables only"]
    assert _described("always", "fp16") == ["frozen, fp16: all large weights",
                                            "frozen, fp16: tables only"]
    assert _described("never", "int8") == ["variables kept, int8: all large weights"]


def test_what_follows_each_verdict():
    listed = candidates("auto", "int8")
    everything, tables, kept, kept_tables = listed
    lossy_dense = Verdict(LOSSY_GATE_FAILED, "p", dense_quantized=True)
    assert next_candidate(listed, everything, lossy_dense) == tables
    assert next_candidate(listed, everything, Verdict(LOSSY_GATE_FAILED, "p")) is None
    assert next_candidate(listed, tables, lossy_dense) is None  # tables alone failed too
    for outcome in (PARITY_FAILED, UNUSABLE, REGRESSION):
        # Variables kept, quantizing what the last frozen candidate quantized.
        assert next_candidate(listed, everything, Verdict(outcome, "x")) == kept
        assert next_candidate(listed, tables, Verdict(outcome, "x")) == kept_tables
        assert next_candidate(listed, kept, Verdict(outcome, "x")) is None
    always = candidates("always", "none")
    assert next_candidate(always, always[0], Verdict(UNUSABLE, "x")) is None
    assert next_candidate(listed, everything, Verdict(OK)) is None


def test_tables_too_coarse_with_a_scale_per_column_are_retried_with_one_per_row():
    from dataclasses import replace

    listed = candidates("auto", "int8")
    everything, tables, kept, kept_tables = listed
    rows = {c: replace(c, row_scales=True) for c in listed}
    coarse = Verdict(LOSSY_GATE_FAILED, "p", column_scales=True)
    coarse_dense = Verdict(LOSSY_GATE_FAILED, "p", dense_quantized=True, column_scales=True)
    # Dense weights quantized: dropped first (they shrink only the files), then the rows.
    assert next_candidate(listed, everything, coarse_dense) == tables
    assert next_candidate(listed, tables, coarse_dense) == rows[tables]
    assert next_candidate(listed, everything, coarse) == rows[everything]
    assert next_candidate(listed, rows[tables], coarse_dense) is None  # finest: refused
    assert next_candidate(listed, rows[everything], coarse_dense) == rows[tables]
    # A later candidate keeps the row scales its predecessor needed.
    assert next_candidate(listed, rows[tables], Verdict(UNUSABLE, "x")) == rows[kept_tables]
    assert rows[tables].describe() == "frozen, int8: tables only, a scale per table row"


def test_failures_are_judged_by_their_type():
    frozen, int8 = Candidate(True), Candidate(True, "int8")
    dense = QuantizedTensor("w", "int8", "at load (init op)", 4096, 1024)
    table = QuantizedTensor("emb", "int8", "per request, gathered rows only", 4096, 1024)
    parity = ParityError("parity failed: y differs; nothing was published")
    parity.difference = "parity failed: y differs"
    assert judge_failure(parity, frozen, False) == Verdict(PARITY_FAILED,
                                                           "parity failed: y differs")
    assert judge_failure(parity, frozen, True).outcome == LOSSY_GATE_FAILED  # lossy transforms
    assert judge_failure(parity, int8, False, [table, dense]).dense_quantized
    assert not judge_failure(parity, int8, False, [table]).dense_quantized
    assert judge_failure(RuntimeError("inliner exploded\ndetails"), frozen, False) \
        == Verdict(UNUSABLE, "inliner exploded")
    for error in (UsageError("bad"), DiskFullError("full")):
        assert judge_failure(error, frozen, False).outcome == attempts.ERROR


def _broken_freeze(*args, **kwargs):
    raise RuntimeError("freezer exploded")


def test_a_frozen_candidate_that_cannot_be_built_falls_back_and_the_report_says_so(
        classifier_dir, tmp_path, monkeypatch, unsandboxed):
    monkeypatch.setattr(freeze_lib, "freeze_session_model", _broken_freeze)
    report = optimize(classifier_dir, str(tmp_path / "out"),
                      OptimizeOptions(**NOT_MEASURED, trust=unsandboxed))
    assert report.published and not report.frozen
    examples = np.array([example(word=word, city=f"city-{i}", age=20.0 + 7 * i, clicks=i)
                         for i, word in enumerate([*samples.VOCABULARY, "not-a-word"])],
                        dtype=object)
    feeds = {key: {"examples" if key == "predict" else "inputs": examples}
             for key in ("classification", "predict", "serving_default")}
    assert_outputs_match(report.output_dir, classifier_dir, feeds, rtol=1e-4, atol=1e-5)
    assert [(a.candidate.describe(), a.outcome, a.then) for a in report.attempts] == [
        ("frozen", UNUSABLE, "retried: variables kept"),
        ("variables kept", OK, "taken")]
    assert report.attempts[0].reason == "freezer exploded"
    assert any(w.startswith("variables kept: freezing failed (freezer exploded)")
               for w in report.warnings)
    assert [s.name for s in report.stages].count("freeze") == 1  # the abandoned one is gone
    rows = [line.split() for line in format_optimize_report(report).splitlines()]
    assert ["1", "frozen", "unusable", "retried:", "variables", "kept", "freezer",
            "exploded"] in rows
    assert ["2", "variables", "kept", "ok", "taken"] in rows
    data = json.loads(json.dumps(to_jsonable(report)))
    assert data["attempts"][0]["candidate"] == {"frozen": True, "quantize": "none",
                                                "tables_only": False, "row_scales": False}
    assert data["attempts"][1]["outcome"] == "ok"


def test_always_ends_with_the_first_attempt_and_reports_it(classifier_dir, tmp_path,
                                                           monkeypatch, unsandboxed):
    monkeypatch.setattr(freeze_lib, "freeze_session_model", _broken_freeze)
    with pytest.raises(ServingOptError, match="could not freeze the variables") as failure:
        optimize(classifier_dir, str(tmp_path / "out"),
                 OptimizeOptions(
                     build=BuildOptions(freeze="always"), **NOT_MEASURED, trust=unsandboxed))
    (attempt,) = failure.value.report.attempts
    assert (attempt.outcome, attempt.then) == (UNUSABLE, "refused: nothing was published")
    assert os.listdir(tmp_path / "out") == []


def _worse_while_frozen(monkeypatch):
    """The regression gate's judgement, scripted: the frozen candidate is worse on its
    first measurement and its confirmation; every later measurement is fine."""
    verdicts = [["load time 2.00x the original (1.00 s -> 2.00 s)"]] * 2

    def regressions(cold=None, bench=None, tolerance=None, **kwargs):
        return verdicts.pop(0) if verdicts else []

    monkeypatch.setattr(regression_lib, "regressions", regressions)


def test_a_frozen_candidate_measured_worse_is_left_for_variables_kept(
        classifier_dir, tmp_path, monkeypatch, unsandboxed):
    _worse_while_frozen(monkeypatch)
    report = optimize(classifier_dir, str(tmp_path / "out"),
                      OptimizeOptions(**NOT_MEASURED, trust=unsandboxed))
    assert report.published and not report.frozen
    assert "the frozen candidate was worse (load time 2.00x" in report.freeze_note
    assert [(a.outcome, a.then) for a in report.attempts] == [
        (REGRESSION, "retried: variables kept"), (OK, "taken")]
    assert report.attempts[0].reason.startswith("load time 2.00x")
    # The frozen candidate left is discarded: the base holds the version published only.
    assert os.listdir(tmp_path / "out") == ["1"]


def test_a_regression_with_nothing_to_fall_back_to_is_refused_or_allowed(
        classifier_dir, tmp_path, monkeypatch, unsandboxed):
    _worse_while_frozen(monkeypatch)
    with pytest.raises(ServingOptError, match="worse than the original: load time") as failure:
        optimize(classifier_dir, str(tmp_path / "refused"),
                 OptimizeOptions(
                     build=BuildOptions(freeze="always"), **NOT_MEASURED, trust=unsandboxed))
    assert [(a.outcome, a.then) for a in failure.value.report.attempts] == [
        (REGRESSION, "refused: nothing was published")]
    assert os.listdir(tmp_path / "refused") == []
    _worse_while_frozen(monkeypatch)
    report = optimize(classifier_dir, str(tmp_path / "allowed"),
                      OptimizeOptions(
                          build=BuildOptions(freeze="always"),
                          gate=GateOptions(allow_regression=True), **NOT_MEASURED,
                          trust=unsandboxed))
    assert report.published and report.frozen
    assert report.attempts[0].then == "taken despite the regression (--allow_regression)"
    assert any(w.startswith("published despite a regression") for w in report.warnings)


# The lossy gate's two attempts (everything quantized, then the tables alone, then refused)
# on a real model, sandboxed: tests/stages/test_quantize.py::
# test_a_lossy_gate_too_tight_tries_the_tables_alone_then_refuses, which builds that model.
