"""The gates' rules (serving_opt.core.gates) on hand-made arrays: one behaviour per test."""

from __future__ import annotations

import numpy as np

from serving_opt.core import gates
from serving_opt.core.gates import Kind, LossyGate, OutputCheck, ToleranceGate

PROBS = np.array([[0.90, 0.10], [0.20, 0.80], [0.60, 0.40], [0.30, 0.70]], np.float32)


# --- the tolerance rule, element by element ------------------------------------------------

def test_floats_within_tolerance_do_not_differ():
    assert gates.compare_arrays(PROBS, PROBS + 1e-7, 1e-5, 1e-4).differing == 0


def test_floats_beyond_tolerance_are_counted_with_their_diffs():
    diff = gates.compare_arrays(np.array([1.0, 2.0]), np.array([1.0, 2.5]), 1e-5, 1e-4)
    assert (diff.differing, diff.max_abs_diff, diff.max_rel_diff, diff.broken) == \
        (1, 0.5, 0.25, "")


def test_relative_tolerance_scales_with_the_reference():
    ref, cand = np.array([1000.0]), np.array([1000.05])
    assert gates.compare_arrays(ref, cand, 1e-5, 1e-4).differing == 0
    assert gates.compare_arrays(ref, cand, 1e-5, 0.0).differing == 1


def test_nan_matches_nan_only():
    assert gates.compare_arrays(np.array([np.nan]), np.array([np.nan]), 1e-5, 1e-4).differing == 0
    assert gates.compare_arrays(np.array([np.nan]), np.array([1.0]), 1e-5, 1e-4).differing == 1


def test_integers_must_be_equal_whatever_the_tolerance():
    diff = gates.compare_arrays(np.array([1, 2, 3]), np.array([1, 2, 4]), 10.0, 10.0)
    assert diff.differing == 1 and diff.max_abs_diff == 0.0


def test_strings_must_be_equal():
    ref = np.array([b"cat", b"dog"], dtype=object)
    assert gates.compare_arrays(ref, np.array([b"cat", b"cow"], dtype=object), 0, 0).differing == 1


def test_a_shape_break_counts_every_element():
    diff = gates.compare_arrays(np.zeros(3), np.zeros(2), 1e-5, 1e-4)
    assert (diff.differing, diff.broken) == (3, "shape (2,) != (3,)")


def test_a_dtype_break_is_named():
    diff = gates.compare_arrays(np.zeros(2, np.float32), np.zeros(2, np.float64), 1e-5, 1e-4)
    assert diff.broken == "dtype float64 != float32"


# --- which outputs are what ------------------------------------------------------------------

def test_probabilities_are_named_floats_with_class_rows():
    assert gates.output_kind("Scores", "float32", class_rows=True) is Kind.PROBABILITIES


def test_a_probability_name_without_class_rows_is_plain_values():
    assert gates.output_kind("predictions", "float32", class_rows=False) is Kind.VALUES


def test_logits_are_values():
    assert gates.output_kind("logits", "float32", class_rows=True) is Kind.VALUES


def test_integers_and_strings_are_discrete():
    assert gates.output_kind("class_ids", "int64", class_rows=False) is Kind.DISCRETE
    assert gates.output_kind("classes", "object", class_rows=True) is Kind.DISCRETE


def test_top1_classes_read_the_last_axis_as_classes():
    assert gates.top1_classes(PROBS).tolist() == [0, 1, 0, 1]
    assert gates.top1_classes(np.array([1, 0])) is None  # integers: no classes to rank


# --- the tolerance gate ----------------------------------------------------------------------

def test_tolerance_gate_passes_identical_answers():
    check = gates.check_output("predict", "probabilities", [(PROBS, PROBS.copy())],
                               ToleranceGate())
    assert check.verdict == gates.Verdict(True, "") and check.differing == 0


def test_tolerance_gate_fails_one_differing_element_and_leaves_the_counts_to_say_it():
    moved = PROBS.copy()
    moved[0, 0] += 0.01
    check = gates.check_output("predict", "probabilities", [(PROBS, moved)], ToleranceGate())
    assert check.verdict == gates.Verdict(False, "") and check.differing == 1


def test_tolerance_gate_sums_over_batches():
    moved = PROBS.copy()
    moved[0, 0] += 0.01
    check = gates.check_output("p", "y", [(PROBS, moved), (PROBS, moved)], ToleranceGate())
    assert (check.elements, check.differing) == (16, 2)


def test_tolerance_gate_does_not_score_agreement():
    assert gates.check_output("p", "probabilities", [(PROBS, PROBS)],
                              ToleranceGate()).agreement is None


def test_a_missing_output_fails_every_gate():
    for gate in (ToleranceGate(), LossyGate()):
        check = gates.check_output("p", "probabilities", [(PROBS, None)], gate)
        assert check.verdict == gates.Verdict(False, "output missing"), gate


# --- the lossy gate --------------------------------------------------------------------------

def test_lossy_gate_fails_a_flipped_top1_class():
    flipped = PROBS.copy()
    flipped[2] = [0.40, 0.60]  # row 2 changes class: 3 of 4 rows agree
    check = gates.check_output("p", "probabilities", [(PROBS, flipped)], LossyGate())
    assert check.agreement == 0.75
    assert not check.verdict.ok and not check.verdict.undecided
    assert check.verdict.reason.startswith("top-1 agreement 0.7500 < 0.995: 3 of 4 rows agree")


def test_lossy_gate_passes_small_moves_that_keep_every_class():
    moved = PROBS + np.float32(0.01)
    check = gates.check_output("p", "probabilities", [(PROBS, moved)], LossyGate())
    assert check.verdict.ok and check.agreement == 1.0


def test_lossy_gate_counts_differences_exactly():
    moved = PROBS + np.float32(1e-6)  # well within the tolerance rule's defaults
    assert gates.check_output("p", "probabilities", [(PROBS, moved)],
                              LossyGate()).differing == PROBS.size


def test_lossy_gate_bounds_the_probability_error():
    moved = PROBS.copy()
    moved[0] = [0.80, 0.20]  # same class, moved by 0.1
    check = gates.check_output("p", "probabilities", [(PROBS, moved)], LossyGate())
    assert not check.verdict.ok and check.verdict.reason.startswith("max abs diff 0.1 > 0.05")


def test_lossy_gate_reports_logits_without_gating_them():
    check = gates.check_output("p", "logits", [(PROBS, PROBS[:, ::-1].copy())], LossyGate())
    assert check.verdict == gates.Verdict(True, gates.NOT_GATED)
    assert check.agreement == 0.0  # scored all the same


def test_lossy_gate_does_not_gate_probabilities_without_class_rows():
    ref = np.array([0.1, 0.9], np.float32)
    check = gates.check_output("probabilities", "probabilities", [(ref, ref + 0.5)],
                               LossyGate())
    assert check.kind is Kind.VALUES and check.verdict.ok


def test_lossy_gate_leaves_class_ids_at_the_threshold_undecided_on_1000_rows():
    ref = np.arange(1000) % 7
    cand = ref.copy()
    cand[:5] += 1  # 995 of 1000 agree: the interval [0.988, 0.998] straddles 0.995
    verdict = gates.check_output("p", "class_ids", [(ref, cand)], LossyGate()).verdict
    assert verdict.ok and verdict.undecided  # the point estimate's word, flagged


def test_lossy_gate_fails_class_ids_far_below_the_threshold():
    ref = np.arange(1000) % 7
    cand = ref.copy()
    cand[:30] += 1  # 970 of 1000 agree: the interval lies below 0.995
    check = gates.check_output("p", "class_ids", [(ref, cand)], LossyGate())
    assert not check.verdict.ok and not check.verdict.undecided
    assert check.verdict.reason.startswith("agreement 0.9700 < 0.995")


def test_lossy_gate_threshold_is_the_callers():
    flipped = PROBS.copy()
    flipped[2] = [0.40, 0.60]
    loose = LossyGate(min_top1_agreement=0.7, max_probability_error=1.0)
    assert gates.check_output("p", "probabilities", [(PROBS, flipped)], loose).verdict.ok


def test_lossy_gate_fails_a_shape_break_with_the_break_as_reason():
    check = gates.check_output("p", "probabilities", [(PROBS, PROBS[:2])], LossyGate())
    assert check.verdict == gates.Verdict(False, "shape (2, 2) != (4, 2)")
    assert check.agreement is None


def test_a_gate_judges_a_check_measured_elsewhere():
    # compare measures by streaming; the gate reads only the typed fields.
    check = OutputCheck("predict", "classes", Kind.DISCRETE, agreement=0.99)
    assert LossyGate().judge(check) == gates.Verdict(False, "agreement 0.9900 < 0.995")
    assert gates.judged(check, ToleranceGate()).verdict.ok
