"""The lossy gate stops drawing rows as soon as its outcome is decided, either way.

A candidate whose probabilities already moved past ``--max_probability_error`` is
refused whatever more rows say about its top-1 agreement, so an agreement interval
that straddles the threshold must not draw 4x, 16x, 64x the rows for the same
refusal; the report names the criterion that decided it. An agreement left undecided
with nothing else failed still draws, as before.
"""

from __future__ import annotations

import numpy as np
from gate_runs import gate_run

from serving_opt.core import gates
from serving_opt.core.gates import LossyGate
from serving_opt.pipeline import proving
from serving_opt.stages.parity import OutputParity, ParityReport

CLASSES = 5
ROWS_PER_BATCH = 64


def confident_rows(rows: int, seed: int) -> np.ndarray:
    """Probability rows whose top-1 margin is at least 0.3 (no near-ties)."""
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0.0, 0.1, size=(rows, CLASSES))
    probs[np.arange(rows), rng.integers(0, CLASSES, rows)] += 0.8
    return (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)


def candidate(probs: np.ndarray, flips: int, moved: float = 0.0) -> np.ndarray:
    """``probs`` with small noise, ``flips`` rows whose class changes and, if ``moved``,
    the last row's top value lowered by ``moved`` (its class kept). ``probs``' first
    ``flips`` rows are made close calls (margin 0.03, far above what the noise moves a
    margin, so not near-ties) that the candidate decides the other way, each value
    moved by 0.03: within the default probability bound, so only the agreement counts."""
    close = np.array([0.365, 0.335] + [0.1] * (CLASSES - 2), np.float32)
    probs[:flips] = close
    out = probs + np.random.default_rng(1).normal(0.0, 0.002, probs.shape).astype(np.float32)
    out[:flips, 0], out[:flips, 1] = close[1], close[0]
    if moved:
        out[-1, int(probs[-1].argmax())] -= moved
    return out


def output_parity(signature: str, check: gates.OutputCheck) -> OutputParity:
    """The parity report's line for a check (as ``stages.parity`` writes it)."""
    count = check.count
    return OutputParity(
        signature, check.output, check.dtype, check.shape, check.elements, check.differing,
        check.max_abs_diff, check.max_rel_diff, check.verdict.ok, check.verdict.reason,
        check.agreement, count.interval if count else None, count.rows if count else None,
        count.near_ties if count else None, check.verdict.undecided)


def gate_on_factory(per_signature, gate=None):
    """A ``gate_on(batches)`` judging each signature's rows with the real lossy gate;
    ``per_signature`` maps a signature to ``rows -> (probs, candidate)``. Records the
    batches of every round."""
    gate = gate or LossyGate()
    rounds = []

    def gate_on(batches: int) -> ParityReport:
        rounds.append(batches)
        outputs = []
        for signature, make in per_signature.items():
            probs, cand = make(ROWS_PER_BATCH * batches)
            checks = gates.check_signature(signature, {"probabilities": [(probs, cand)]}, gate)
            outputs += [output_parity(signature, c) for c in checks.values()]
        return ParityReport(all(o.ok for o in outputs), 0.0, 0.0, tuple(outputs),
                            dict.fromkeys(per_signature, "synthesized"), batches)

    return gate_on, rounds


def straddling(rows: int):
    """3 flips per 512 rows (0.9941): its interval straddles 0.995 up to 8192 rows."""
    probs = confident_rows(rows, seed=rows)
    return probs, candidate(probs, flips=3 * rows // 512)


def test_a_probability_past_its_bound_decides_the_refusal_with_no_more_rows():
    def moved(rows):
        probs, cand = straddling(rows)
        probs[-1] = [0.9, 0.025, 0.025, 0.025, 0.025]
        cand[-1] = [0.7, 0.075, 0.075, 0.075, 0.075]  # same class, moved by 0.2
        return probs, cand

    gate_on, rounds = gate_on_factory({"predict": moved})
    first = gate_on(8)
    (only,) = first.outputs
    assert not only.ok and not only.undecided  # decided, though its interval straddles
    lo, hi = only.interval
    assert lo < 0.995 < hi
    assert only.detail.startswith("max abs diff 0.2 > 0.05 decides the refusal")
    assert "top-1 agreement left undecided" in only.detail

    run = gate_run()
    final = proving._until_decided(run, first, gate_on, 8)
    assert rounds == [8]  # no round beyond the first
    assert final.outputs[0].rows == 512 and not final.ok
    assert not any("drawing" in line for line in run.said)


def test_a_refused_signature_stops_the_draw_for_an_undecided_one():
    def refused(rows):  # another signature: 40 flips in 512, wholly below 0.995
        probs = confident_rows(rows, seed=rows + 1)
        return probs, candidate(probs, flips=40 * rows // 512)

    gate_on, rounds = gate_on_factory({"predict": straddling, "other": refused})
    run = gate_run()
    final = proving._until_decided(run, gate_on(8), gate_on, 8)
    assert rounds == [8]
    assert [(o.signature, o.rows) for o in final.outputs] == [("predict", 512), ("other", 512)]
    predict, other = final.outputs
    assert predict.undecided and not other.ok and not other.undecided
    assert not final.ok
    (warning,) = run.warnings
    assert "refused for certain by other/probabilities (top-1 agreement 0.9219 < 0.995" \
        in warning
    assert "predict/probabilities straddles 0.995" in warning and "no more were drawn" in warning


def test_an_undecided_agreement_with_nothing_else_failed_still_draws():
    gate_on, rounds = gate_on_factory({"predict": straddling})
    run = gate_run()
    first = gate_on(8)
    assert first.undecided() and not proving.decided_refusals(first)
    final = proving._until_decided(run, first, gate_on, 8)
    growth = proving.UNDECIDED_GROWTH
    assert rounds[:2] == [8, 8 * growth]  # it drew 4x the rows
    assert final.outputs[0].rows > 512
    assert any("drawing" in line for line in run.said)


def test_the_bound_also_decides_when_the_agreement_point_estimate_passes():
    # Unchanged: agreement passing (here decided) and a value past the bound: refused by
    # the bound, with the reason it always had.
    probs = confident_rows(2048, seed=3)  # 2048 of 2048 agree: [0.9981, 1]
    cand = candidate(probs, flips=0, moved=0.2)
    check = gates.check_output("predict", "probabilities", [(probs, cand)], LossyGate())
    assert check.count.interval[0] >= 0.995
    assert check.verdict == gates.Verdict(False, f"max abs diff {check.max_abs_diff:.3g} > 0.05")
    assert 0.19 < check.max_abs_diff < 0.21
