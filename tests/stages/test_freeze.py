"""Specification of freezing: what is kept, what is dropped, what is refused."""

from __future__ import annotations

import os

import pytest

from serving_opt.errors import ServingOptError
from serving_opt.options import MeasureOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import loader
from serving_opt.stages import freeze

pytestmark = pytest.mark.in_process  # our own models, stages in this process

SERVE = frozenset({"serve"})


def _graph_with_variable_and_table_init():
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        weight = v1.get_variable("w", [2], initializer=v1.zeros_initializer(),
                                 use_resource=False)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], [1, 2]), -1, name="table")
        x = v1.placeholder(tf.string, [None], name="x")
        tf.identity(table.lookup(x), name="ids")
        tf.identity(weight, name="w_out")
        tf.group(v1.global_variables_initializer(), v1.tables_initializer(), name="init_all")
    return graph.as_graph_def()


def test_init_op_keeps_table_initializers_and_drops_variable_initializers():
    graph_def = _graph_with_variable_and_table_init()
    rewritten, kept, dropped = freeze.rewrite_init_op(graph_def, "init_all")
    nodes = {n.name: n for n in rewritten.node}
    assert [nodes[k].op for k in kept] == ["LookupTableImportV2"]
    assert [nodes[d].op for d in dropped] == ["Assign"]
    assert nodes["init_all"].op == "NoOp"
    assert [i.lstrip("^") for i in nodes["init_all"].input] == kept


def test_rewriting_the_init_op_leaves_the_input_graph_alone():
    graph_def = _graph_with_variable_and_table_init()
    before = graph_def.SerializeToString(deterministic=True)
    freeze.rewrite_init_op(graph_def, "init_all")
    assert graph_def.SerializeToString(deterministic=True) == before


def test_a_variable_over_the_protobuf_limit_is_refused_by_name(classifier_dir):
    # The real limit is 2 GiB; a test model cannot be that big, so the limit is lowered.
    sizes = freeze.variable_sizes(
        loader.find_meta_graph(loader.read_saved_model(classifier_dir), SERVE).graph_def)
    largest = max(sizes, key=sizes.get)
    with pytest.raises(ServingOptError) as failure:
        freeze.freeze_session_model(classifier_dir, SERVE, ["predict"],
                                    limit_bytes=sizes[largest] - 1)
    assert f"variable {largest} is" in failure.value.problem
    assert "protobuf limit" in failure.value.problem


def test_variables_together_over_the_limit_are_refused():
    with pytest.raises(ServingOptError, match="would total 3.00 GiB"):
        freeze.check_protobuf_limit({"a": 1.5 * 2**30, "b": 1.5 * 2**30})


def test_variables_under_the_limit_pass():
    freeze.check_protobuf_limit({"a": 2**20, "b": 2**20})


def test_frozen_graph_has_no_variable_or_saver_ops(classifier_dir):
    graph, info = freeze.freeze_session_model(classifier_dir, SERVE, ["predict"])
    ops = {n.op for n in graph.graph_def.node}
    assert not ops & {"VarHandleOp", "VariableV2", "ReadVariableOp", "SaveV2", "RestoreV2"}
    source = loader.find_meta_graph(loader.read_saved_model(classifier_dir), SERVE)
    assert info.variables_frozen == sum(
        n.op in ("VarHandleOp", "VariableV2") for n in source.graph_def.node)
    assert graph.init_op in graph.protected_nodes


def test_assets_extra_is_copied_to_the_optimized_model(classifier_dir, model_copy, tmp_path):
    src = model_copy(classifier_dir)
    os.makedirs(os.path.join(src, "assets.extra"))
    with open(os.path.join(src, "assets.extra", "notes.txt"), "w") as f:
        f.write("kept")
    report = optimize(src, str(tmp_path / "out"), OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0)))
    with open(os.path.join(report.output_dir, "assets.extra", "notes.txt")) as f:
        assert f.read() == "kept"


def test_a_failing_transform_is_left_out_only_when_asked(classifier_dir):
    from serving_opt.stages import transforms

    graph, _ = freeze.freeze_session_model(classifier_dir, SERVE, ["predict"])
    # A real tool error: rename_op needs new_op_name too.
    spec = transforms.parse_transforms("rename_op(old_op_name=Foo) fold_constants")
    with pytest.raises(ServingOptError, match="the Graph Transform Tool failed on"):
        transforms.apply_transforms(graph, spec)
    skipped: list[str] = []
    result = transforms.apply_transforms(graph, spec, skipped)
    assert len(skipped) == 1 and skipped[0].startswith("rename_op(old_op_name=Foo):")
    assert "new_op_name" in skipped[0]
    assert result.node_count() < graph.node_count()  # fold_constants still ran


def test_strict_fold_constants_runs_on_a_model_with_assets(classifier_dir):
    # The tool only takes placeholders as feeds, and the asset path is a Const the loader
    # overrides: without care, fold_constants fails here (or, with ignore_errors=true,
    # silently does nothing).
    from serving_opt.stages import transforms

    graph, _ = freeze.freeze_session_model(classifier_dir, SERVE, ["predict"])
    folded = transforms.apply_transforms(graph, transforms.parse_transforms("fold_constants"))
    assert folded.node_count() < graph.node_count()
    asset_node = graph.asset_file_defs[0].tensor_info.name.split(":")[0]
    before = {n.name: n for n in graph.graph_def.node}[asset_node]
    after = {n.name: n for n in folded.graph_def.node}[asset_node]
    assert after.op == "Const" and after.attr["value"] == before.attr["value"]


def test_only_byte_identical_copies_of_the_sources_assets_extra_are_kept(tmp_path):
    from serving_opt.pipeline.optimizer import _copied_from_source

    source, staging = tmp_path / "src", tmp_path / "staging"
    for root in (source, staging):
        os.makedirs(root / "assets.extra")
    (source / "assets.extra" / "notes.txt").write_text("kept")
    (staging / "assets.extra" / "notes.txt").write_text("kept")
    (source / "assets.extra" / "config.txt").write_text("theirs")
    (staging / "assets.extra" / "config.txt").write_text("planted by the model")
    (staging / "assets.extra" / "new.txt").write_text("planted")
    keep = [r for r in ("assets.extra/notes.txt", "assets.extra/config.txt",
                        "assets.extra/new.txt")
            if _copied_from_source(str(source), str(staging), r)]
    assert keep == ["assets.extra/notes.txt"]
