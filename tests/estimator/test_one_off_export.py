"""export_optimized_saved_model: one optimized export of a trained Estimator."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from independent_check import assert_outputs_match, example_feeds

from serving_opt import OptimizeOptions
from serving_opt.errors import UsageError
from serving_opt.integrations.estimator import (
    ExportOptimizationError,
    export_optimized_saved_model,
    raw_export_base,
)
from serving_opt.options import BuildOptions, MeasureOptions

from .estimator_helpers import (
    CLASSIFY,
    FAST,
    PREDICT,
    entries,
    examples,
    method_names,
    signatures,
    versions,
)

OPTIONS = OptimizeOptions(**FAST)


def test_one_off_export_publishes_the_optimized_model(trained_classifier, tmp_path):
    estimator, receiver = trained_classifier
    base = str(tmp_path / "models" / "clf")

    # Measured like a user's export: both models' cold start in fresh TF 2.15 processes.
    measured = dataclasses.replace(OPTIONS, measure=MeasureOptions(benchmark_runs=0))
    result = export_optimized_saved_model(estimator, base, receiver, measured)

    assert result.optimized and result.report.frozen
    cold = result.report.cold_start
    assert cold.before.load_seconds > 0 and cold.after.load_seconds > 0
    # Against the plain export, by plain TensorFlow: every word, an unknown one, 3 ages.
    assert_outputs_match(result.export_dir, result.raw_export_dir,
                         example_feeds(result.raw_export_dir, examples()),
                         rtol=1e-4, atol=1e-5)
    assert result.export_dir == os.path.join(base, str(result.version))
    assert entries(base) == [str(result.version)]
    # The plain export sits outside the served base, under the same version number.
    assert result.raw_export_dir == os.path.join(raw_export_base(base), str(result.version))
    assert signatures(result.export_dir) == signatures(result.raw_export_dir)
    assert method_names(result.export_dir) == {
        "classification": CLASSIFY, "serving_default": CLASSIFY, "predict": PREDICT}

    # A version newer than "now" already in the base (clock skew, a hand-made version):
    # the next export still becomes the highest version, the one TF Serving serves.
    ahead = int(time.time()) + 1000
    os.rename(result.export_dir, os.path.join(base, str(ahead)))
    second = export_optimized_saved_model(estimator, base, receiver, OPTIONS)
    assert second.version == ahead + 1 and versions(base) == [str(ahead), str(ahead + 1)]


def test_one_off_failure_raises_by_default_and_can_publish_plain(trained_classifier, tmp_path):
    estimator, receiver = trained_classifier
    base = str(tmp_path / "clf")
    bad = OptimizeOptions(build=BuildOptions(signatures=("no_such_signature",)), **FAST)

    with pytest.raises(ExportOptimizationError, match="no_such_signature"):
        export_optimized_saved_model(estimator, base, receiver, bad)
    assert versions(base) == [] and len(versions(raw_export_base(base))) == 1

    result = export_optimized_saved_model(estimator, base, receiver, bad, fatal=False)
    assert not result.optimized and "no_such_signature" in result.error
    assert versions(base) == [str(result.version)]
    assert signatures(result.export_dir) == signatures(result.raw_export_dir)


def test_one_off_refuses_to_export_plain_models_into_the_served_base(trained_classifier,
                                                                     tmp_path):
    estimator, receiver = trained_classifier
    base = str(tmp_path / "clf")
    with pytest.raises(UsageError, match="TF Serving would serve the plain exports"):
        export_optimized_saved_model(estimator, base, receiver, OPTIONS,
                                     raw_export_dir_base=base)
    assert not os.path.exists(base)


def test_one_off_export_int8_gathers_the_real_estimators_table_quantized(trained_classifier,
                                                                          tmp_path):
    from serving_opt.savedmodel import loader

    estimator, receiver = trained_classifier
    base = str(tmp_path / "models" / "clf")
    # The suite's Estimator is tiny: every variable counts as large, every weight as big
    # enough, so the real embedding_column table takes the --quantize path.
    options = OptimizeOptions(
        build=BuildOptions(quantize="int8", quantize_min_elements=0, freeze_max_bytes=0), **FAST)

    result = export_optimized_saved_model(estimator, base, receiver, options)

    assert result.optimized
    # int8 weights: measured, logits move by 0.005 and probabilities by 0.001 (classes
    # not at all); a weight dequantized wrong moves them by far more.
    assert_outputs_match(result.export_dir, result.raw_export_dir,
                         example_feeds(result.raw_export_dir, examples()), rtol=0, atol=0.02)
    where = {q.name.rsplit("/", 1)[-1]: q.dequantized for q in result.report.quantized}
    assert where.get("embedding_weights") == "per request, gathered rows only"
    assert "at load (init op)" in where.values()  # the DNN's kernels
    meta_graph = loader.find_meta_graph(loader.read_saved_model(result.export_dir), {"serve"})
    gathers = [n for n in meta_graph.graph_def.node if n.op == "ResourceGather"
               and "embedding_weights" in n.input[0]]
    assert gathers and all("serving_opt_quantized" in n.input[0] for n in gathers)
