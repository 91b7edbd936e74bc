"""The lossy gate decides on an interval, not on one noisy count (issue 29, item 7).

3 flips in 512 rows is 0.9941, and its 95% interval [0.983, 0.998] cannot tell 99.4%
from 99.8%: such a count is undecided, and the optimizer draws more rows. A flip where
the original's top-1 margin is within what the quantization moves a margin is a near-tie
decided the other way, not a changed answer, and is reported, not counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gate_runs import gate_run

from serving_opt.core import gates
from serving_opt.core.gates import Kind, LossyGate
from serving_opt.pipeline import proving
from serving_opt.stages.parity import OutputParity, ParityReport

CLASSES = 5


def confident_rows(rows: int, seed: int = 0) -> np.ndarray:
    """Probability rows whose top-1 margin is at least 0.3 (no near-ties)."""
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0.0, 0.1, size=(rows, CLASSES))
    probs[np.arange(rows), rng.integers(0, CLASSES, rows)] += 0.8
    return (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)


def quantized(probs: np.ndarray, flips: int, seed: int = 1) -> np.ndarray:
    """``probs`` moved by a small noise (as int8 does), with ``flips`` rows whose top-1
    class really changes (by far more than the noise)."""
    rng = np.random.default_rng(seed)
    out = probs + rng.normal(0.0, 0.002, size=probs.shape).astype(np.float32)
    for row in range(flips):
        top = int(probs[row].argmax())
        out[row, top] -= 0.04
        out[row, (top + 1) % CLASSES] = out[row, top] + 0.01
    return out


# The probability bound is a separate guard (its own tests): here only agreement counts.
AGREEMENT_ONLY = LossyGate(max_probability_error=1.0)


def judge(probs, cand, gate=AGREEMENT_ONLY) -> gates.OutputCheck:
    return gates.check_output("predict", "probabilities", [(probs, cand)], gate)


def test_the_wilson_interval_matches_a_direct_computation():
    # Wilson's score interval, solved from its defining quadratic independently.
    agreeing, rows, z = 509, 512, 1.96
    p = agreeing / rows
    roots = np.roots([1 + z * z / rows, -(2 * p + z * z / rows), p * p])
    lo, hi = gates.wilson_interval(agreeing, rows)
    assert (lo, hi) == pytest.approx(tuple(sorted(roots)), abs=1e-9)


def test_three_flips_in_512_rows_are_undecided_not_a_refusal():
    probs = confident_rows(512)
    check = judge(probs, quantized(probs, flips=3))
    assert check.count.rows == 512 and check.count.agreeing == 509
    lo, hi = check.count.interval
    assert lo < 0.995 < hi
    assert check.verdict.undecided
    assert not check.verdict.ok  # the point estimate, 0.9941, is below
    assert "straddles 0.995" in check.verdict.reason


def test_the_same_share_on_many_more_rows_is_decided():
    probs = confident_rows(8192)
    check = judge(probs, quantized(probs, flips=2))
    assert not check.verdict.undecided and check.verdict.ok
    assert check.count.interval[0] >= 0.995
    assert "95% [" in check.verdict.reason


def test_a_real_loss_is_refused_without_more_rows():
    probs = confident_rows(512)
    check = judge(probs, quantized(probs, flips=40))
    assert not check.verdict.ok and not check.verdict.undecided
    assert check.verdict.reason.startswith("top-1 agreement 0.9219 < 0.995")


def test_flips_at_near_ties_are_reported_not_counted():
    probs = confident_rows(4096)
    # 30 rows the original barely decides (margin 0.001), flipped by the same small
    # noise that moves every other row.
    probs[:30, :] = 0.1
    probs[:30, 0], probs[:30, 1] = 0.3005, 0.2995
    cand = quantized(probs, flips=0)
    cand[:30, 0], cand[:30, 1] = 0.2995, 0.3005
    check = judge(probs, cand)
    assert check.count.near_ties >= 30 and check.count.near_tie_flips == 30
    assert check.count.agreeing == check.count.rows  # no decisive row flipped
    assert check.verdict.ok and "near-tie rows not counted" in check.verdict.reason


def test_one_broken_row_does_not_widen_the_tie_margin_for_the_others():
    probs = confident_rows(2048)
    cand = quantized(probs, flips=0)
    cand[0] = probs[0][::-1]  # a row moved far: it must not excuse anything
    check = judge(probs, cand)
    assert check.count.tie_margin < 0.05
    assert check.count.agreeing == check.count.rows - 1


def test_near_ties_everywhere_say_to_pass_examples():
    rows = 1024
    probs = np.full((rows, 2), 0.5, np.float32)
    probs[:, 0] += 0.0005
    probs[:, 1] -= 0.0005
    cand = probs + np.random.default_rng(0).normal(0, 0.002, probs.shape).astype(np.float32)
    verdict = judge(probs, cand).verdict
    assert "pass --examples" in verdict.reason


def test_class_ids_are_counted_on_the_probabilities_decisive_rows():
    probs = confident_rows(4096)
    probs[:30, :] = 0.1
    probs[:30, 0], probs[:30, 1] = 0.3005, 0.2995
    cand = quantized(probs, flips=0)
    cand[:30, 0], cand[:30, 1] = 0.2995, 0.3005
    ids = probs.argmax(axis=1)[:, None]
    cand_ids = cand.argmax(axis=1)[:, None]
    checks = gates.check_signature(
        "predict", {"probabilities": [(probs, cand)], "class_ids": [(ids, cand_ids)]},
        LossyGate())
    assert checks["class_ids"].kind is Kind.DISCRETE
    assert checks["class_ids"].count.near_tie_flips == 30
    assert checks["class_ids"].verdict.ok
    # Alone, the same class ids would count every near-tie as a flip.
    alone = gates.check_output("predict", "class_ids", [(ids, cand_ids)], LossyGate())
    assert alone.count.agreeing == 4096 - 30


# --- the optimizer draws more rows while undecided -------------------------------------------

def _report(rows: int, flips_per_512: float) -> ParityReport:
    """A parity report of ``rows`` synthesized rows at a fixed flip rate."""
    probs = confident_rows(rows, seed=rows)
    check = judge(probs, quantized(probs, flips=int(rows * flips_per_512 / 512)))
    output = OutputParity(
        "predict", "probabilities", "float32", check.shape, check.elements, check.differing,
        check.max_abs_diff, check.max_rel_diff, check.verdict.ok, check.verdict.reason,
        check.agreement, check.count.interval, check.count.rows, check.count.near_ties,
        check.verdict.undecided)
    return ParityReport(output.ok, 0.0, 0.0, (output,), {"predict": "synthesized"}, 1)


def test_undecided_rows_are_drawn_again_until_the_interval_decides():
    batches_seen = []

    def gate_on(batches):
        batches_seen.append(batches)
        return _report(64 * batches, flips_per_512=0.5)

    run = gate_run(measure_seconds=180)
    first = gate_on(8)
    assert first.undecided()  # 1 flip in 512 rows: [0.989, 0.9997]
    final = proving._until_decided(run, first, gate_on, 8)
    assert not final.undecided() and final.ok
    assert batches_seen[1:] and batches_seen[1] == 8 * proving.UNDECIDED_GROWTH
    assert any("drawing" in line for line in run.said)
    assert not run.warnings


def test_the_users_examples_are_not_drawn_again_and_the_interval_is_reported():
    calls = []

    def gate_on(batches):
        calls.append(batches)
        return _report(64 * batches, flips_per_512=3)

    run = gate_run(measure_seconds=180, user_inputs=object())
    final = proving._until_decided(run, gate_on(8), gate_on, 8)
    assert calls == [8]
    assert final.undecided()
    assert "95% interval" in run.warnings[0] and "every --examples row used" in run.warnings[0]


def test_drawing_stops_at_its_share_of_the_measure_budget():
    calls = []

    def gate_on(batches):
        calls.append(batches)
        return _report(512, flips_per_512=3)  # never decides

    run = gate_run(measure_seconds=0)
    proving._until_decided(run, gate_on(8), gate_on, 8)
    assert calls == [8]
    assert "ran out" in run.warnings[0]


def test_synthesized_inputs_are_named_with_their_near_tie_share():
    report = _report(2048, flips_per_512=0)
    run = gate_run(measure_seconds=180)
    proving._warn_synthesized(run, report)
    assert "synthesized inputs" in run.warnings[0] and "--examples" in run.warnings[0]
    user = dataclasses.replace(report, input_sources={"predict": "examples:x.tfrecord"})
    run = gate_run(measure_seconds=180)
    proving._warn_synthesized(run, user)
    assert run.warnings == []
