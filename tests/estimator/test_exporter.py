"""OptimizingExporter inside tf.estimator.train_and_evaluate, with real canned Estimators.

Each test trains for a few steps on in-memory data and exports through the real
Estimator machinery. What TF Serving would see in the export base is checked
directly on disk: only integer version directories, each the optimized model, with
the signatures of the plain export it came from.
"""

from __future__ import annotations

import logging
import os

import pytest
import tensorflow as tf

from serving_opt import OptimizeOptions
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.integrations.estimator import (
    ExportOptimizationError,
    OptimizingExporter,
    raw_export_base,
)
from serving_opt.options import BuildOptions, OutputOptions

from .estimator_helpers import (
    CLASSIFY,
    FAST,
    PREDICT,
    REGRESS,
    assert_answers_like_the_plain_export,
    dnn_classifier,
    dnn_linear_classifier,
    entries,
    linear_regressor,
    method_names,
    signatures,
    train_and_evaluate,
    tree,
    versions,
)

OPTIONS = OptimizeOptions(**FAST)


def _check_published(base: str, raw_base: str) -> None:
    """Every served version is an optimized, proven twin of the plain export it came from."""
    for version in versions(base):
        published, raw = os.path.join(base, version), os.path.join(raw_base, version)
        assert signatures(published) == signatures(raw), version
        # Frozen: the variables live in the graph now, not in a checkpoint.
        assert not os.path.exists(os.path.join(published, "variables", "variables.index"))
        assert os.path.exists(os.path.join(raw, "variables", "variables.index"))
        assert_answers_like_the_plain_export(published, raw)


def test_dnn_classifier_vocab_embedding_latest_by_name(tmp_path, vocab_path):
    estimator, receiver = dnn_classifier(str(tmp_path / "model"), vocab_path)
    exporter = OptimizingExporter("clf", receiver, OPTIONS, exports_to_keep=2)

    _, export_results = train_and_evaluate(estimator, [exporter], "class", max_steps=30)

    base = str(tmp_path / "model" / "export" / "clf")
    raw_base = raw_export_base(base)
    assert raw_base == str(tmp_path / "model" / "export" / "clf_raw")
    # Three evaluations exported; exports_to_keep=2 holds for the served and the plain base,
    # and TF Serving's base holds nothing but finished version directories.
    assert len(versions(base)) == 2
    assert entries(base) == versions(base) == versions(raw_base)
    assert entries(raw_base) == versions(raw_base)
    # Same version number the Estimator gave the plain export; the return value names the
    # published directory, as bytes like the Estimator's own exporters return.
    newest = versions(base)[-1]
    assert export_results == [os.path.join(base, newest).encode()]
    result = exporter.last_export
    assert result.optimized and result.error is None
    assert result.raw_export_dir == os.path.join(raw_base, newest)
    assert result.report.frozen, result.report.freeze_note
    assert result.report.size_after.total < result.report.size_before.total
    _check_published(base, raw_base)
    assert method_names(os.path.join(base, newest)) == {
        "classification": CLASSIFY, "serving_default": CLASSIFY, "predict": PREDICT}


def test_linear_regressor_wrapped_latest_exporter(tmp_path, vocab_path):
    estimator, receiver = linear_regressor(str(tmp_path / "model"), vocab_path)
    exporter = OptimizingExporter(
        tf.estimator.LatestExporter("reg", receiver, exports_to_keep=1), options=OPTIONS)
    assert exporter.name == "reg" and exporter.exports_to_keep == 1

    train_and_evaluate(estimator, [exporter], "target", max_steps=20)

    base = str(tmp_path / "model" / "export" / "reg")
    assert len(versions(base)) == 1 and entries(base) == versions(base)
    assert versions(raw_export_base(base)) == versions(base)
    assert exporter.last_export.optimized
    _check_published(base, raw_export_base(base))
    assert method_names(os.path.join(base, versions(base)[0])) == {
        "regression": REGRESS, "serving_default": REGRESS, "predict": PREDICT}


def test_dnn_linear_combined_best_and_final_exporters(tmp_path, vocab_path):
    estimator, receiver = dnn_linear_classifier(str(tmp_path / "model"), vocab_path)
    best = OptimizingExporter(
        tf.estimator.BestExporter(name="best", serving_input_receiver_fn=receiver,
                                  exports_to_keep=2), options=OPTIONS)
    final = OptimizingExporter(tf.estimator.FinalExporter("final", receiver), options=OPTIONS)
    assert best.exports_to_keep == 2 and final.exports_to_keep is None

    train_and_evaluate(estimator, [best, final], "class", max_steps=30)

    export = tmp_path / "model" / "export"
    # The BestExporter decides when to export, and its exports_to_keep holds for both bases.
    best_base = str(export / "best")
    assert 1 <= len(versions(best_base)) <= 2 and entries(best_base) == versions(best_base)
    assert versions(raw_export_base(best_base)) == versions(best_base)
    _check_published(best_base, raw_export_base(best_base))
    # The FinalExporter exported once, at the end.
    final_base = str(export / "final")
    assert len(versions(final_base)) == 1 and entries(final_base) == versions(final_base)
    _check_published(final_base, raw_export_base(final_base))
    assert method_names(final.last_export.export_dir) == {
        "classification": CLASSIFY, "serving_default": CLASSIFY, "predict": PREDICT}
    assert final.last_export.optimized


def test_failed_optimization_publishes_plain_export_and_logs(tmp_path, vocab_path, caplog):
    estimator, receiver = dnn_classifier(str(tmp_path / "model"), vocab_path)
    # A real failure inside the optimizer: the model has no such signature.
    exporter = OptimizingExporter(
        "clf", receiver, OptimizeOptions(
            build=BuildOptions(signatures=("no_such_signature",)), **FAST),
        exports_to_keep=1)

    with caplog.at_level(logging.ERROR, logger="serving_opt.estimator"):
        metrics, _ = train_and_evaluate(estimator, [exporter], "class", max_steps=20)

    assert metrics["global_step"] == 20  # training was not killed
    base = str(tmp_path / "model" / "export" / "clf")
    raw_base = raw_export_base(base)
    assert len(versions(base)) == 1 and entries(base) == versions(base) == versions(raw_base)
    version = versions(base)[0]
    # TF Serving gets the plain export, byte for byte, and the plain export is still kept.
    assert tree(os.path.join(base, version)) == tree(os.path.join(raw_base, version))
    result = exporter.last_export
    assert not result.optimized and "no_such_signature" in result.error
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # one per export
    assert "no_such_signature" in errors[-1] and "PLAIN" in errors[-1]
    assert result.raw_export_dir in errors[-1] and result.export_dir in errors[-1]


def test_unexpected_exception_is_not_fatal_either(trained_classifier, tmp_path, caplog,
                                                  monkeypatch):
    from serving_opt.pipeline import optimizer
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the optimizer")

    monkeypatch.setattr(optimizer, "optimize", broken)
    estimator, receiver = trained_classifier
    exporter = OptimizingExporter("clf", receiver, OPTIONS)
    base = str(tmp_path / "export" / "clf")
    with caplog.at_level(logging.ERROR, logger="serving_opt.estimator"):
        published = os.fsdecode(exporter.export(estimator, base, None, {}, False))

    assert os.path.isdir(published) and versions(base) == [os.path.basename(published)]
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "RuntimeError: a bug in the optimizer" in message
    assert "Traceback" in message  # not a user error: the traceback helps the bug report


def test_fatal_option_stops_training_and_publishes_nothing(tmp_path, vocab_path):
    estimator, receiver = dnn_classifier(str(tmp_path / "model"), vocab_path)
    exporter = OptimizingExporter(
        "clf", receiver, OptimizeOptions(
            build=BuildOptions(signatures=("no_such_signature",)), **FAST),
        fatal=True)

    with pytest.raises(ExportOptimizationError) as info:
        train_and_evaluate(estimator, [exporter], "class", max_steps=10)

    assert isinstance(info.value, ServingOptError)
    base = str(tmp_path / "model" / "export" / "clf")
    assert entries(base) == []  # nothing published, no staging leftovers
    (raw_version,) = versions(raw_export_base(base))
    raw_dir = os.path.join(raw_export_base(base), raw_version)
    assert info.value.raw_export_dir == raw_dir
    assert "no_such_signature" in str(info.value) and raw_dir in str(info.value)
    assert os.path.isfile(os.path.join(raw_dir, "saved_model.pb"))  # the plain export is kept


def test_bad_configuration_fails_at_construction():
    receiver = object()
    with pytest.raises(UsageError, match="serving_input_receiver_fn"):
        OptimizingExporter("clf")
    with pytest.raises(UsageError, match="belong to the wrapped exporter"):
        OptimizingExporter(tf.estimator.LatestExporter("clf", receiver), receiver)
    with pytest.raises(UsageError, match="version/overwrite"):
        OptimizingExporter("clf", receiver, OptimizeOptions(output=OutputOptions(version=3)))
    with pytest.raises(UsageError):
        OptimizingExporter("clf", receiver, OptimizeOptions(
            build=BuildOptions(transforms="no_such_transform")))
    with pytest.raises(UsageError, match="exports_to_keep"):
        OptimizingExporter("clf", receiver, exports_to_keep=0)
    with pytest.raises(UsageError, match="tf.estimator.Exporter"):
        OptimizingExporter(42)
    inner = OptimizingExporter("clf", receiver)
    with pytest.raises(UsageError, match="cannot wrap"):
        OptimizingExporter(inner)
    assert inner.name == "clf" and inner.exports_to_keep == 5
    assert isinstance(inner, tf.estimator.Exporter)
    assert OptimizingExporter(tf.estimator.LatestExporter("x", receiver, exports_to_keep=3),
                              exports_to_keep=None).exports_to_keep is None
