"""Specification of `optimize` on TF1-graph (Estimator-style) SavedModels.

Every expectation is computed independently of the code under test: outputs
from the original model run in its own session, vocabulary ids from the
vocabulary list the sample was built with, signature maps from the source proto.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import in_process, tree_snapshot
from independent_check import assert_outputs_match, example

from serving_opt import samples
from serving_opt.errors import ParityError, ServingOptError, UsageError
from serving_opt.options import (
    BuildOptions,
    GateOptions,
    InputOptions,
    MeasureOptions,
    OutputOptions,
)
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.pipeline.run import SizeReport
from serving_opt.savedmodel import loader

# The cold-start gate times fresh processes: on a busy machine it may see noise, confirm
# it and retry with variables kept (or refuse). Only the test about measuring turns it on.
NOT_MEASURED = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
FAST = OptimizeOptions(**NOT_MEASURED)
# Freezing and folding reorder float math: a few ulp of float32, far inside this.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _signature_map(path: str) -> dict:
    meta_graph = loader.find_meta_graph(loader.read_saved_model(path), {"serve"})
    return {k: v.SerializeToString(deterministic=True)
            for k, v in loader.serving_signatures(meta_graph).items()}


def _examples(count: int, seed: int) -> np.ndarray:
    """The sample models' features, every vocabulary word and an unknown one among them."""
    rng = np.random.default_rng(seed)
    words = [*samples.VOCABULARY, "not-in-vocabulary"]
    return np.array([example(word=words[i % len(words)], city=f"city-{rng.integers(100)}",
                             age=float(rng.uniform(18, 80)),
                             clicks=int(rng.integers(0, 50))) for i in range(count)],
                    dtype=object)


@pytest.fixture(scope="module")
def feeds() -> dict:
    """Per sample model, one batch for each of its signatures (input aliases as exported)."""
    examples = _examples(24, seed=7)
    images = np.random.default_rng(5).normal(size=(4, 16, 16, 3)).astype(np.float32)
    return {
        "classifier_dir": {"serving_default": {"inputs": examples},
                           "classification": {"inputs": examples},
                           "predict": {"examples": examples}},
        "regressor_dir": {"serving_default": {"inputs": examples},
                          "regression": {"inputs": examples},
                          "predict": {"examples": examples}},
        "convnet_dir": {"serving_default": {"images": images}},
    }


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    """Each sample model optimized once (FAST) for the whole module, on first use: maps a
    source directory to (its files just before the run, the report). Tests only read
    these; a test that changes the result or the source runs its own optimize."""
    runs: dict[str, tuple[dict, object]] = {}

    def run(src: str):
        if src not in runs:
            before = tree_snapshot(src)
            base = str(tmp_path_factory.mktemp("optimized"))
            runs[src] = (before, optimize(src, base, FAST))
        return runs[src]

    return run


@pytest.fixture(scope="module")
def optimized_classifier(optimized, classifier_dir):
    return optimized(classifier_dir)[1]


@pytest.mark.parametrize("fixture", ["classifier_dir", "regressor_dir", "convnet_dir"])
def test_optimized_model_keeps_the_exact_signature_map(fixture, request, optimized):
    src = request.getfixturevalue(fixture)
    _, report = optimized(src)
    assert _signature_map(report.output_dir) == _signature_map(src)


@pytest.mark.golden
@pytest.mark.parametrize("fixture", ["classifier_dir", "regressor_dir", "convnet_dir"])
def test_optimized_model_answers_like_the_original_and_is_smaller(fixture, request, optimized,
                                                                  feeds):
    src = request.getfixturevalue(fixture)
    _, report = optimized(src)
    assert report.published
    assert_outputs_match(report.output_dir, src, feeds[fixture], **TOLERANCE)
    assert report.nodes_after < report.nodes_before
    assert report.size_after.total < report.size_before.total


def test_vocabulary_table_resolves_known_and_unknown_words(optimized_classifier):
    sess, meta_graph = loader.load_session(optimized_classifier.output_dir)
    try:
        finds = [n for n in sess.graph.as_graph_def().node if n.op == "LookupTableFindV2"]
        assert len(finds) == 1
        find = sess.graph.get_operation_by_name(finds[0].name)
        words = ["apple", "grape", "not-a-fruit"]
        ids = sess.run(find.outputs[0], {find.inputs[1]: np.array(words, dtype=object)})
    finally:
        sess.close()
    # The vocabulary file lists VOCABULARY in order; the table answers -1 for a miss
    # (feature columns hash misses into the OOV bucket after the lookup).
    expected = [samples.VOCABULARY.index("apple"), samples.VOCABULARY.index("grape"), -1]
    np.testing.assert_array_equal(ids, expected)


def test_assets_are_copied_and_wired(optimized_classifier, classifier_dir):
    out = optimized_classifier.output_dir
    with open(os.path.join(classifier_dir, "assets", "vocab.txt"), "rb") as f:
        original = f.read()
    with open(os.path.join(out, "assets", "vocab.txt"), "rb") as f:
        assert f.read() == original
    meta_graph = loader.find_meta_graph(loader.read_saved_model(out), {"serve"})
    assert [a.filename for a in meta_graph.asset_file_def] == ["vocab.txt"]


def test_init_op_survives_and_variables_are_gone(optimized_classifier, classifier_dir):
    src_mg = loader.find_meta_graph(loader.read_saved_model(classifier_dir), {"serve"})
    out_mg = loader.find_meta_graph(
        loader.read_saved_model(optimized_classifier.output_dir), {"serve"})
    assert loader.init_op_name(out_mg) == loader.init_op_name(src_mg)
    ops = {n.op for n in out_mg.graph_def.node}
    assert not ops & {"VarHandleOp", "VariableV2", "SaveV2", "RestoreV2"}
    assert "InitializeTableFromTextFileV2" in ops


def test_signature_output_identity_survives_remove_nodes(optimized_classifier):
    # The classifier's "logits" output is an Identity node; the default preset
    # removes Identity nodes everywhere else.
    out_mg = loader.find_meta_graph(
        loader.read_saved_model(optimized_classifier.output_dir), {"serve"})
    nodes = {n.name: n.op for n in out_mg.graph_def.node}
    assert nodes["logits"] == "Identity"
    assert list(nodes.values()).count("Identity") < 5


def test_batch_norm_folding_removes_batch_norm_ops(convnet_dir, optimized, feeds):
    src_mg = loader.find_meta_graph(loader.read_saved_model(convnet_dir), {"serve"})
    assert any(n.op.startswith("FusedBatchNorm") for n in src_mg.graph_def.node)
    _, report = optimized(convnet_dir)
    out_mg = loader.find_meta_graph(loader.read_saved_model(report.output_dir), {"serve"})
    assert not [n.op for n in out_mg.graph_def.node if "BatchNorm" in n.op]
    assert_outputs_match(report.output_dir, convnet_dir, feeds["convnet_dir"], **TOLERANCE)


@pytest.mark.in_process
def test_lossy_transform_is_caught_and_nothing_is_published(classifier_dir, tmp_path):
    base = tmp_path / "out"
    with pytest.raises(ParityError) as failure:
        optimize(classifier_dir, str(base),
                 OptimizeOptions(
                     build=BuildOptions(transforms="round_weights(num_steps=2)"),
                     measure=MeasureOptions(benchmark_runs=0)))
    assert "parity failed" in failure.value.problem
    assert "nothing was published" in failure.value.problem
    assert failure.value.report is not None and not failure.value.report.published
    assert os.listdir(base) == []  # no version, no staging leftovers


def test_source_directory_is_byte_for_byte_unchanged(classifier_dir, optimized):
    before, _ = optimized(classifier_dir)  # taken just before its optimize ran
    assert tree_snapshot(classifier_dir) == before


@pytest.fixture(scope="module")
def from_a_copy_into_a_used_base(classifier_dir, tmp_path_factory):
    """The classifier optimized from a copy of its own (which a test may delete) into a
    base already holding version 3 and a directory that is not a version:
    (source copy, base, report)."""
    root = tmp_path_factory.mktemp("used_base")
    src = str(root / "source")
    shutil.copytree(classifier_dir, src)
    base = root / "out"
    os.makedirs(base / "3")
    os.makedirs(base / "not-a-version")
    with in_process():
        return src, str(base), optimize(src, str(base), FAST)


def test_default_version_is_one_above_the_highest(from_a_copy_into_a_used_base):
    _, base, report = from_a_copy_into_a_used_base
    assert report.version == 4 and report.output_dir == os.path.join(base, "4")


def test_existing_version_is_refused_before_any_work(classifier_dir, tmp_path):
    base = tmp_path / "out"
    os.makedirs(base / "2")
    with pytest.raises(ServingOptError, match="already exists.*--overwrite"):
        optimize(classifier_dir, str(base), OptimizeOptions(
            output=OutputOptions(version=2), measure=MeasureOptions(benchmark_runs=0)))
    assert os.listdir(base / "2") == []


def test_overwrite_replaces_an_existing_version(overwritten_with_variables_kept):
    base, report = overwritten_with_variables_kept
    assert os.path.exists(os.path.join(report.output_dir, "saved_model.pb"))
    assert sorted(os.listdir(base)) == ["2"]


def test_unknown_transform_is_rejected_with_the_valid_names(classifier_dir, tmp_path):
    with pytest.raises(UsageError) as failure:
        optimize(classifier_dir, str(tmp_path / "out"),
                 OptimizeOptions(build=BuildOptions(transforms="fold_constants fold_batchnorms")))
    message = failure.value.one_line()
    assert "fold_batchnorms" in message and "fold_batch_norms" in message
    assert not os.path.exists(tmp_path / "out")


def test_bad_transform_argument_is_rejected(classifier_dir, tmp_path):
    with pytest.raises(UsageError, match="round_weights has no argument 'steps'"):
        optimize(classifier_dir, str(tmp_path / "out"),
                 OptimizeOptions(build=BuildOptions(transforms="round_weights(steps=3)")))


def test_unknown_signature_is_rejected(classifier_dir, tmp_path):
    with pytest.raises(ServingOptError, match="nope not in the model"):
        optimize(classifier_dir, str(tmp_path / "out"),
                 OptimizeOptions(
                     build=BuildOptions(signatures=("nope",)),
                     measure=MeasureOptions(benchmark_runs=0)))


def test_selected_signatures_only_are_kept(tfrecord_examples_two_signatures):
    report = tfrecord_examples_two_signatures
    assert sorted(_signature_map(report.output_dir)) == ["classification", "predict"]


def test_output_inside_input_is_refused(model_copy, classifier_dir):
    src = model_copy(classifier_dir)
    with pytest.raises(UsageError, match="inside --input_dir"):
        optimize(src, os.path.join(src, "out"), FAST)


@pytest.fixture(scope="module")
def overwritten_with_variables_kept(classifier_dir, tmp_path_factory):
    """The classifier optimized with --freeze=never over an existing version 2
    (--overwrite): (base, report). One run for both behaviours, which do not interact."""
    base = tmp_path_factory.mktemp("overwritten") / "out"
    os.makedirs(base / "2")
    with in_process():
        return str(base), optimize(classifier_dir, str(base), OptimizeOptions(
            output=OutputOptions(version=2, overwrite=True), build=BuildOptions(freeze="never"),
            **NOT_MEASURED))


def test_freeze_never_keeps_variables_and_still_matches(classifier_dir, feeds,
                                                        overwritten_with_variables_kept):
    _, report = overwritten_with_variables_kept
    assert not report.frozen
    assert os.path.exists(os.path.join(report.output_dir, "variables", "variables.index"))
    assert_outputs_match(report.output_dir, classifier_dir, feeds["classifier_dir"],
                         **TOLERANCE)


def test_json_examples_drive_the_parity_check(convnet_dir, tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "requests.jsonl"
    with open(path, "w") as f:
        for _ in range(3):
            f.write(json.dumps({"images": rng.normal(size=(2, 16, 16, 3)).tolist()}) + "\n")
    report = optimize(convnet_dir, str(tmp_path / "out"),
                      OptimizeOptions(inputs=InputOptions(examples=str(path)), **NOT_MEASURED))
    assert report.parity.input_sources == {"serving_default": f"json:{path}"}
    assert report.parity.batches_run == 3


@pytest.fixture(scope="module")
def tfrecord_examples_two_signatures(classifier_dir, tmp_path_factory):
    """The classifier's classification and predict signatures kept (of its three), the
    parity check fed 20 tf.Examples from a TFRecord file in batches of 8."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("tfrecord")
    path = str(root / "examples.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for record in samples.sample_examples(20, seed=1):
            w.write(record)
    return optimize(classifier_dir, str(root / "out"),
                    OptimizeOptions(
                        inputs=InputOptions(examples=path),
                        build=BuildOptions(signatures=("classification", "predict")),
                        gate=GateOptions(parity_batch_size=8), **NOT_MEASURED))


def test_tfrecord_examples_drive_the_parity_check(tfrecord_examples_two_signatures):
    report = tfrecord_examples_two_signatures
    (source,) = set(report.parity.input_sources.values())
    assert source.startswith("examples:") and source.endswith("examples.tfrecord")
    assert sorted(report.parity.input_sources) == ["classification", "predict"]
    assert report.parity.batches_run == 3 * 2  # 20 examples in batches of 8, 2 signatures


def stage_names_without_confirm(report) -> list[str]:
    """The stages run, with the regression gate's optional ``confirm`` checked and taken
    out: a first measurement that looks worse (noise on a busy machine) is measured
    again, once, after the measuring stages; that is the gate working, not a failure."""
    names = [s.name for s in report.stages]
    if "confirm" in names:
        assert names.count("confirm") == 1, names
        assert names.index("confirm") > max(names.index(n) for n in ("cold_start", "benchmark")
                                            if n in names), names
        names.remove("confirm")
    return names


@pytest.mark.in_process
def test_report_has_sizes_stages_and_side_by_side_latency(classifier_dir, tmp_path):
    # freeze=always and allow_regression: whatever the (noisy) measurements say, the
    # frozen candidate is the one published, so the report's shape does not depend on the
    # machine's load; only a "confirm" stage may be added.
    report = optimize(classifier_dir, str(tmp_path / "out"),
                      OptimizeOptions(
                          measure=MeasureOptions(benchmark_runs=5),
                          build=BuildOptions(freeze="always"),
                          gate=GateOptions(allow_regression=True)))
    assert stage_names_without_confirm(report) == [
        "read", "freeze", "transforms", "grappler", "rewrites", "externalize", "write",
        "target_check", "parity", "tf2_load", "cold_start", "benchmark"]
    assert [lat.batch_size for lat in report.benchmark.after] == [1, 32]
    assert [lat.batch_size for lat in report.benchmark.before] == [1, 32]
    assert all(lat.runs == 5 for lat in report.benchmark.before + report.benchmark.after)
    assert report.benchmark.load_seconds_after > 0 and report.cold_start is not None
    assert report.size_before == SizeReport.of(classifier_dir)
    assert report.size_after == SizeReport.of(report.output_dir)
    assert report.size_before.variables > 0 and report.size_after.variables == 0
    assert report.ops_removed.get("VarHandleOp", 0) > 0


def test_optimized_model_loads_with_the_tf2_loader(optimized_classifier):
    import tensorflow as tf

    loaded = tf.saved_model.load(optimized_classifier.output_dir)
    examples = tf.constant(samples.sample_examples(4))
    outputs = loaded.signatures["predict"](examples=examples)
    assert outputs["probabilities"].shape == (4, len(samples.CLASS_NAMES))


def test_optimized_model_works_after_moving_it_and_deleting_the_source(
        classifier_dir, from_a_copy_into_a_used_base, tmp_path, feeds):
    # Catches asset paths baked in at export or optimize time: the table must be fed
    # the path of the vocabulary inside the optimized model, wherever it lives.
    src, _, report = from_a_copy_into_a_used_base
    shutil.rmtree(src)
    moved = str(tmp_path / "elsewhere" / "1")
    shutil.move(report.output_dir, moved)
    assert_outputs_match(moved, classifier_dir, feeds["classifier_dir"], **TOLERANCE)


def test_inputs_the_original_rejects_are_a_clear_error(convnet_dir, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"images": [[1.0, 2.0]]}) + "\n")  # wrong rank
    with pytest.raises(ServingOptError, match="the original model fails on json:.*--examples"):
        optimize(convnet_dir, str(tmp_path / "out"),
                 OptimizeOptions(
                     inputs=InputOptions(examples=str(path)),
                     measure=MeasureOptions(benchmark_runs=0)))
    assert os.listdir(tmp_path / "out") == []
