"""Inside train_and_evaluate the hook freezes exactly as ``serving-opt optimize`` does.

An exporter runs inside the training loop, while a MonitoredSession holds the
training graph as the default graph, finalized. Anything in the optimizer that built
an op in the default graph then failed with "Graph is finalized and cannot be
modified.", and ``--freeze=auto`` quietly published every export with all its
variables kept, ``global_step`` and the batch norm statistics included. These tests
look at what was published, on disk: which variables the graph still has, what its
checkpoint holds, and whether it is the same model ``serving-opt optimize`` makes
from the same plain export outside any training loop.

The model is the case from the issue: a DNNClassifier over a 3,000-word
vocabulary-file embedding (3,001 x 32 floats, 384,128 bytes) with batch norm.
Two exporters see the same exports:

* ``clf``, default options: every variable is frozen; the embedding, still above
  ``--max_constant_bytes`` (64 KiB) as a constant, is stored in a new checkpoint;
* ``clf_kept``, ``freeze_max_bytes`` below the embedding: it stays a variable, saved
  from the loaded session into a new checkpoint; everything else is frozen.

Each is run two ways: ``in_process``, as on a machine where bubblewrap cannot start
(training containers often have no user namespaces) with ``allow_unsandboxed``, so
the pipeline runs in the exporter's own process, inside the training loop (the case
that failed); and ``sandboxed``, the default where bubblewrap runs (freeze .. parity
in a sandboxed worker process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator

import pytest
import tensorflow as tf

from serving_opt import OptimizeOptions, optimize, sandbox
from serving_opt.integrations.estimator import (
    OptimizingExporter,
    export_optimized_saved_model,
    raw_export_base,
)
from serving_opt.options import TrustOptions

from .estimator_helpers import (
    FAST,
    assert_answers_like_the_plain_export,
    checkpoint_variables,
    dnn_classifier,
    op_histogram,
    train_and_evaluate,
    variable_nodes,
    versions,
    write_vocabulary,
)

VOCAB_SIZE = 3000
DIMENSION = 32
EMBEDDING = "dnn/input_from_feature_columns/input_layer/word_embedding/embedding_weights"
EMBEDDING_SHAPE = [VOCAB_SIZE + 1, DIMENSION]  # + the OOV bucket
EMBEDDING_BYTES = (VOCAB_SIZE + 1) * DIMENSION * 4
# FAST has the cold start off: on this shared 2-core machine a slow fresh process could
# make the regression gate fall back to kept variables, which is not what these tests are about.
OPTIONS = OptimizeOptions(**FAST)
KEPT_OPTIONS = dataclasses.replace(OPTIONS, build=dataclasses.replace(
    OPTIONS.build, freeze_max_bytes=EMBEDDING_BYTES // 2))
# What each exporter's checkpoint must hold, and nothing else (name -> shape).
EXPECTED_CHECKPOINT = {
    "clf": {f"{EMBEDDING}/serving_opt_variable": EMBEDDING_SHAPE},
    "clf_kept": {EMBEDDING: EMBEDDING_SHAPE},
}
EXPECTED_OPTIONS = {"clf": OPTIONS, "clf_kept": KEPT_OPTIONS}
MODES = ("in_process", "sandboxed")


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    """The pipeline in this process (no bubblewrap here, as in many training containers;
    the user allowed running unsandboxed), or in its sandboxed worker (the default)."""
    if mode == "sandboxed":
        if sandbox.unavailable_reason() is not None:
            pytest.skip(f"no sandbox here: {sandbox.unavailable_reason()}")
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox, "unavailable_reason", lambda: "switched off by the test")
        yield


def _options(name: str, mode: str) -> OptimizeOptions:
    options = EXPECTED_OPTIONS[name]
    return dataclasses.replace(options, trust=dataclasses.replace(
        options.trust, allow_unsandboxed=mode == "in_process"))


@dataclasses.dataclass(frozen=True)
class Trained:
    mode: str
    export: str  # <model_dir>/export
    exporters: dict  # name -> OptimizingExporter


@pytest.fixture(scope="module", params=MODES)
def trained(request, tmp_path_factory) -> Trained:
    """One real train_and_evaluate, both exporters exporting from inside the loop."""
    mode = request.param
    root = tmp_path_factory.mktemp(f"frozen_in_training_{mode}")
    vocab = write_vocabulary(str(root), VOCAB_SIZE)
    estimator, receiver = dnn_classifier(str(root / "model"), vocab, dimension=DIMENSION,
                                         hidden_units=(16, 8), batch_norm=True)
    exporters = {name: OptimizingExporter(name, receiver, _options(name, mode),
                                          exports_to_keep=None)
                 for name in EXPECTED_CHECKPOINT}
    # A checkpoint (and so an evaluation and an export) at step 10, while the training
    # MonitoredSession is open, and the final one at step 20.
    with _mode(mode):
        metrics, _ = train_and_evaluate(estimator, list(exporters.values()), "class",
                                        max_steps=20)
    assert metrics["global_step"] == 20
    return Trained(mode, str(root / "model" / "export"), exporters)


def _published(trained: Trained, name: str) -> list[tuple[str, str]]:
    """(published, raw) version directories of one exporter, oldest first."""
    base = os.path.join(trained.export, name)
    found = versions(base)
    assert len(found) == 2, found  # one export per checkpoint: steps 10 and 20
    assert versions(raw_export_base(base)) == found
    return [(os.path.join(base, v), os.path.join(raw_export_base(base), v)) for v in found]


@pytest.mark.parametrize("name", sorted(EXPECTED_CHECKPOINT))
def test_exports_made_inside_train_and_evaluate_are_frozen(trained, name):
    result = trained.exporters[name].last_export
    assert result.optimized
    assert result.report.frozen, result.report.freeze_note
    assert not any("variables kept" in w for w in result.report.warnings), \
        result.report.warnings
    for published, raw in _published(trained, name):
        # The plain export has what training left: global_step, the batch norm
        # statistics, the layers' weights, all of them variables.
        raw_variables = variable_nodes(raw)
        assert "global_step" in raw_variables and EMBEDDING in raw_variables
        assert any(v.endswith("/moving_mean") for v in raw_variables)

        # Published: the small variables are constants now, the only variables left
        # are the large ones, and the checkpoint holds exactly those.
        expected = EXPECTED_CHECKPOINT[name]
        assert checkpoint_variables(published) == expected, published
        assert variable_nodes(published) == set(expected), published
        with open(os.path.join(published, "saved_model.pb"), "rb") as f:
            assert b"global_step" not in f.read()
        histogram = op_histogram(published)
        assert "Assign" not in histogram and "AssignVariableOp" in histogram  # the new saver
        assert histogram.get("VarHandleOp", 0) + histogram.get("VariableV2", 0) == 1

        assert_answers_like_the_plain_export(published, raw)


@pytest.mark.parametrize("name", sorted(EXPECTED_CHECKPOINT))
def test_hook_publishes_what_serving_opt_optimize_makes(trained, name, tmp_path):
    for published, raw in _published(trained, name):
        # The same plain export, optimized outside any training loop, as the CLI does
        # (sandboxed where bubblewrap runs; allow_unsandboxed changes nothing there).
        report = optimize(raw, str(tmp_path / os.path.basename(raw)),
                          dataclasses.replace(EXPECTED_OPTIONS[name],
                                              trust=TrustOptions(allow_unsandboxed=True)))
        assert report.frozen, report.freeze_note
        assert op_histogram(published) == op_histogram(report.output_dir)
        assert variable_nodes(published) == variable_nodes(report.output_dir)
        assert checkpoint_variables(published) == checkpoint_variables(report.output_dir)
    hook = trained.exporters[name].last_export.report  # the newest export's
    assert hook.input_dir == raw
    # What each stage did, without the timings; the checks too (tf2_load: TF2's loader
    # took the result, rather than "not loadable ... (neither is the source)").
    notes = {s.name: s.note for s in hook.stages}
    assert notes == {s.name: s.note for s in report.stages}
    assert notes["tf2_load"].startswith("loads with tf.saved_model.load")
    assert hook.nodes_after == report.nodes_after


@pytest.mark.parametrize("trained", ["in_process"], indirect=True)
def test_optimize_freezes_under_a_finalized_default_graph(trained, tmp_path):
    """Without the exporter's own isolation: no stage builds ops in the caller's graph
    (in this process; a sandboxed pipeline runs in a process of its own)."""
    _, raw = _published(trained, "clf")[0]
    with _mode("in_process"), tf.Graph().as_default() as graph:
        graph.finalize()  # what a MonitoredSession does to the training graph
        report = optimize(raw, str(tmp_path / "out"), _options("clf", "in_process"))
        assert tf.compat.v1.get_default_graph() is graph
    assert report.published and report.frozen, report.freeze_note
    assert checkpoint_variables(report.output_dir) == EXPECTED_CHECKPOINT["clf"]


def test_freeze_fallback_is_logged_as_a_warning_naming_the_cause(trained_classifier, tmp_path,
                                                                 caplog, monkeypatch):
    from serving_opt.savedmodel import checkpoint

    def finalized(*args, **kwargs):
        # The failure the training loop caused, raised by a stage only the frozen
        # candidate runs: what the published model is, and why, must be a WARNING.
        raise RuntimeError("Graph is finalized and cannot be modified.")

    monkeypatch.setattr(checkpoint, "externalize_constants", finalized)
    estimator, receiver = trained_classifier
    # In this process, where the stage above is replaced (no sandboxed worker).
    with _mode("in_process"), caplog.at_level(logging.INFO, logger="serving_opt"):
        result = export_optimized_saved_model(estimator, str(tmp_path / "clf"), receiver,
                                              _options("clf", "in_process"))

    assert result.optimized and not result.report.frozen
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "serving_opt.estimator"]
    (warning,) = [w for w in warnings if "Graph is finalized" in w]
    # What failed, and what was published instead.
    assert "variables kept" in warning and result.export_dir in warning
