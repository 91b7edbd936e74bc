"""Real exports go in (issue 29): every model of tests/corpus (written by TF 2.12-2.21's
own writers, TF Serving's test exports, hand-built graphs in older writers' shapes).

* ``serving-opt inspect`` exits 0 on each, and the static check finds no host op in a
  benign model (a refusal of a benign model as untrusted is never true);
* ``optimize`` with defaults (measuring off) publishes each with parity, checked again
  independently (tests/corpus_check.py builds its own inputs from the graph's parse op
  and shapes, and loads both models with TensorFlow's own loader), or refuses it with
  the one-line reason the manifest names as true (``"expect": "refuse"``). The suite
  optimizes one model per distinct structure (``corpus_check.representatives``: 26
  shapes of 77 models, each stage's code paths depend on the structure, not on the
  values); ``make corpus`` optimizes all of them. One shape per writer crosses the
  sandbox, the others run in this process.
"""

from __future__ import annotations

import contextlib
import os

import corpus_check
import pytest
from conftest import in_process

ENTRIES = corpus_check.corpus_entries()
IDS = [e["id"] for e in ENTRIES]
SHAPES = corpus_check.representatives(ENTRIES)
# The first shape of each writer crosses the sandbox (its static check, its read-only view
# of the export's files); the writer's other shapes run the same stages in this process.
SANDBOXED = {e["id"] for e in {e["kind"]: e for e in reversed(SHAPES)}.values()}


def test_the_corpus_holds_every_writer_the_issue_names():
    kinds = {e["kind"] for e in ENTRIES}
    assert {"estimator_tf1", "keras2", "keras2_model_save", "keras3", "module_table",
            "transform_layer", "handbuilt"} <= kinds
    # Keras 3 and Keras 2 models as users write them (subclassed, held by a tf.Module,
    # string and ragged inputs, several signatures over one set of variables).
    assert {"keras3_saved_model_save", "keras3_subclassed",
            "keras3_subclassed_saved_model_save", "keras3_module_wrapped",
            "keras3_string_lookup", "keras3_export_endpoints", "keras2_subclassed",
            "keras2_module_wrapped", "ragged_module", "multi_signature"} <= kinds
    versions = {e["tf_version"][:4] for e in ENTRIES if e["kind"] == "keras2"}
    assert len(versions) >= 10, versions  # every TF from 2.12 to 2.21
    for entry in ENTRIES:
        assert os.path.isfile(os.path.join(entry["abs_path"], "saved_model.pb")), entry["id"]


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_inspect_exits_0_unless_its_error_is_true(entry):
    expected = corpus_check.EXPECTED_INSPECT_ERRORS.get(entry["id"])
    assert corpus_check.inspect_exit(entry["abs_path"]) == (1 if expected else 0)
    if expected:
        from serving_opt import inspection

        codes = {r.code for r in inspection.inspect_saved_model(
            entry["abs_path"], frozenset(corpus_check.tags(entry))).risks
            if r.severity == inspection.SEVERITY_ERROR}
        assert codes == {expected}


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_the_static_check_finds_no_host_op(entry):
    from serving_opt.savedmodel import loader
    from serving_opt.savedmodel.untrusted import host_op_uses

    saved_model = loader.read_saved_model(entry["abs_path"])
    meta_graph = loader.find_meta_graph(saved_model, corpus_check.tags(entry),
                                        entry["abs_path"])
    assert [u.describe() for u in host_op_uses(meta_graph)] == []


def test_the_structures_tell_releases_apart():
    # TF 2.12, 2.13-2.14 and 2.15 on write different Estimator graphs: a key that
    # collapsed them (or split every model) would optimize the wrong set.
    estimators = {corpus_check.structural_key(e["abs_path"]) for e in ENTRIES
                  if e["kind"] == "estimator_tf1"}
    assert 2 <= len(estimators) < sum(e["kind"] == "estimator_tf1" for e in ENTRIES)
    assert 10 <= len(SHAPES) < len(ENTRIES)


@pytest.mark.parametrize("entry", SHAPES, ids=[e["id"] for e in SHAPES])
def test_optimize_publishes_with_independent_parity_or_refuses_truly(entry, tmp_path):
    with contextlib.nullcontext() if entry["id"] in SANDBOXED else in_process():
        result = corpus_check.check_model(entry, str(tmp_path))
    if entry.get("expect") == "refuse":
        assert result.verdict == "refused", result.line()
        assert entry["refuse_reason"] in result.reason, result.line()
        return
    assert result.verdict == "published", result.line()
    assert "FAILED" not in result.reason and "no independent input" not in result.reason, \
        result.line()
