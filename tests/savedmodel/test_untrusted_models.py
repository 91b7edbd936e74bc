"""Issue 12 (part B): a SavedModel is code. Host ops are refused before anything runs
them, never folded, and assertions on the output path survive the optimizer.

Every model is built here, for real: TF1 graphs (tf.compat.v1 builder) and TF2
tf.Module/tf.function exports.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import tree_snapshot

from serving_opt import inspection
from serving_opt.errors import ServingOptError
from serving_opt.options import (
    BuildOptions,
    InputOptions,
    MeasureOptions,
    ServingCheck,
    TrustOptions,
)
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import host_ops, loader
from serving_opt.stages import parity

QUICK = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
BAD_ROW = [[1000.0, 0.0, 0.0]]  # the assertion models reject values above 100


# ------------------------------------------------------------------------------- models


def _tf1_export(export_dir: str, build) -> str:
    graph = tf.Graph()
    with graph.as_default():
        inputs, outputs = build()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return export_dir


def _tf1_weights():
    # A resource variable, created outside any control dependency (its initializer
    # would inherit it); read where it is used.
    return tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]),
                                     use_resource=True)


def build_tf1_write(export_dir: str, target: str) -> str:
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = _tf1_weights()
        write = tf.io.write_file(target, "written by the model", name="write_it")
        with tf.control_dependencies([write]):
            y = tf.identity(x * w, name="y")
        return {"x": x}, {"y": y}

    return _tf1_export(export_dir, build)


def build_tf2_write(export_dir: str, target: str) -> str:
    class Writer(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([1.0, 2.0, 3.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def serve(self, x):
            tf.io.write_file(target, "written by the model")
            return {"y": x * self.w}

    module = Writer()
    tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve})
    return export_dir


def build_tf1_read(export_dir: str, secret_path: str) -> str:
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = _tf1_weights()
        content = tf.io.read_file(tf.constant(secret_path), name="read_it")
        length = tf.cast(tf.strings.length(content), tf.float32)
        y = tf.identity(x * w + length, name="y")
        return {"x": x}, {"y": y, "content": tf.identity(content, name="content")}

    return _tf1_export(export_dir, build)


def build_tf1_assert(export_dir: str, with_assert: bool = True) -> str:
    def build():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = _tf1_weights()
        checks = [tf.debugging.assert_less_equal(x, 100.0, message="x too large")] \
            if with_assert else []
        # The variable read happens under the dependency: what freezing used to drop.
        with tf.control_dependencies(checks):
            y = tf.identity(x * w, name="y")
        return {"x": x}, {"y": y}

    return _tf1_export(export_dir, build)


def build_tf2_assert(export_dir: str) -> str:
    class Checked(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([1.0, 2.0, 3.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def serve(self, x):
            tf.debugging.assert_less_equal(x, 100.0, message="x too large")
            return {"y": x * self.w}

    module = Checked()
    tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve})
    return export_dir


def _run(model_dir: str, rows) -> np.ndarray:
    sess, meta_graph = loader.load_session(model_dir, {"serve"})
    try:
        sig = meta_graph.signature_def["serving_default"]
        return parity.run_signature(sess, sig, {"x": np.asarray(rows, np.float32)}, ["y"])["y"]
    finally:
        sess.close()


def _versions(base: str) -> list[str]:
    return sorted(n for n in os.listdir(base) if n.isdigit()) if os.path.isdir(base) else []


# ----------------------------------------------------------------------------- op list


def test_every_listed_op_is_registered():
    from tensorflow.python.framework import op_def_registry

    missing = sorted(op for op in host_ops.all_listed_ops() if op_def_registry.get(op) is None)
    assert missing == []
    assert host_ops.CHECKPOINT_OPS <= set(host_ops.HOST_OPS)
    assert host_ops.TABLE_FROM_FILE_OPS <= set(host_ops.HOST_OPS)
    assert set(host_ops.ASSET_READ_OPS) <= set(host_ops.HOST_OPS)
    assert len(host_ops.HOST_OPS) > 60


def test_conditional_ops_count_only_with_their_attr():
    from tensorflow.core.framework import node_def_pb2

    to_stderr = node_def_pb2.NodeDef(name="p", op="PrintV2")
    to_stderr.attr["output_stream"].s = b"stderr"
    to_file = node_def_pb2.NodeDef(name="p", op="PrintV2")
    to_file.attr["output_stream"].s = b"file:///tmp/x"
    assert host_ops.host_op_kind(to_stderr) is None
    assert host_ops.host_op_kind(to_file) == host_ops.WRITES_FILES


# --------------------------------------------------------------------- refused by default


@pytest.mark.parametrize("builder", [build_tf1_write, build_tf2_write], ids=["tf1", "tf2"])
def test_optimize_refuses_a_model_that_writes_files(tmp_path, builder):
    target = str(tmp_path / "written.txt")
    src = builder(str(tmp_path / "src" / "1"), target)
    before = tree_snapshot(src)
    base = str(tmp_path / "out")
    with pytest.raises(ServingOptError) as info:
        optimize(src, base, OptimizeOptions(**QUICK))
    message = str(info.value.problem)
    assert "\n" not in message
    assert "WriteFile" in message and "serving_default" in message
    assert not os.path.exists(target), "the model ran on the build host"
    assert _versions(base) == []
    assert tree_snapshot(src) == before


def test_validate_refuses_a_model_that_writes_files(tmp_path):
    from serving_opt.serving.validate import ValidateOptions, validate

    target = str(tmp_path / "written.txt")
    base = str(tmp_path / "base")
    src = build_tf1_write(os.path.join(base, "1"), target)
    before = tree_snapshot(src)
    with pytest.raises(ServingOptError) as info:
        validate(base, ValidateOptions(serving=ServingCheck(server="local", concurrency=0)))
    assert "WriteFile" in info.value.problem and "serving_default" in info.value.problem
    assert not os.path.exists(target)
    assert tree_snapshot(src) == before


def test_cli_validate_has_the_flag():
    from absl import flags

    from serving_opt.cli.commands import optimize as optimize_cmd
    from serving_opt.cli.commands import validate as validate_cmd

    for command in (optimize_cmd, validate_cmd):
        fv = flags.FlagValues()
        command.define_flags(fv)
        assert fv["allow_file_ops"].default is False


def test_allow_file_ops_runs_the_model_and_only_then(tmp_path, unsandboxed):
    target = str(tmp_path / "written.txt")
    src = build_tf1_write(str(tmp_path / "src" / "1"), target)
    base = str(tmp_path / "out")
    with pytest.raises(ServingOptError):
        optimize(src, base, OptimizeOptions(**QUICK, trust=unsandboxed))
    assert not os.path.exists(target)
    report = optimize(src, base, OptimizeOptions(
        trust=TrustOptions(allow_file_ops=True, allow_unsandboxed=True), **QUICK))
    assert _versions(base) == ["1"]
    assert os.path.exists(target)  # parity ran the model, as the user allowed
    assert any("file_write_op" in w for w in report.warnings)
    # The write is still on the output path of the published model.
    os.remove(target)
    _run(report.output_dir, [[1.0, 2.0, 3.0]])
    assert os.path.exists(target)


def test_read_file_of_a_host_path_is_never_folded(tmp_path, unsandboxed):
    secret = tmp_path / "host_secret.txt"
    secret.write_bytes(b"HOST-SECRET-7f3a9c")
    src = build_tf1_read(str(tmp_path / "src" / "1"), str(secret))
    base = str(tmp_path / "out")
    with pytest.raises(ServingOptError, match="ReadFile"):
        optimize(src, base, OptimizeOptions(**QUICK, trust=unsandboxed))
    # Every fold the tool has, on purpose: the read must stay a read.
    options = OptimizeOptions(
        trust=TrustOptions(allow_file_ops=True, allow_unsandboxed=True),
        build=BuildOptions(freeze="always",
                           transforms="fold_constants(ignore_errors=true) "
                                         "strip_unused_nodes remove_nodes(op=Identity)",
                           grappler="constfold,arithmetic,dependency,pruning"),
        **QUICK)
    report = optimize(src, base, options)
    with open(os.path.join(report.output_dir, "saved_model.pb"), "rb") as f:
        assert b"HOST-SECRET" not in f.read()
    ops = {n.op for n in loader.read_saved_model(report.output_dir).meta_graphs[0]
           .graph_def.node}
    assert "ReadFile" in ops
    # It reads the file of the host it runs on, like the original.
    secret.write_bytes(b"changed")
    assert _run(report.output_dir, [[0.0, 0.0, 0.0]]).tolist() == [[7.0, 7.0, 7.0]]


def test_inspect_uses_the_same_list(tmp_path):
    src = build_tf1_write(str(tmp_path / "src" / "1"), str(tmp_path / "never.txt"))
    risks = inspection.inspect_saved_model(src).risks
    assert [(r.code, r.severity, r.subject) for r in risks] == [
        ("file_write_op", "error", "write_it")]
    assert "serving_default" in risks[0].message


def test_the_loaders_own_saver_and_asset_tables_are_not_refused(classifier_dir, keras_dir):
    from serving_opt.savedmodel import untrusted

    for model_dir in (classifier_dir, keras_dir):
        meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), {"serve"})
        assert untrusted.host_op_uses(meta_graph) == []


# ----------------------------------------------------------------------- behaviour kept


@pytest.mark.parametrize("builder", [build_tf1_assert, build_tf2_assert], ids=["tf1", "tf2"])
def test_assertion_on_the_output_path_survives(tmp_path, builder):
    src = builder(str(tmp_path / "src" / "1"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        _run(src, BAD_ROW)
    report = optimize(src, str(tmp_path / "out"), OptimizeOptions(**QUICK))
    assert _run(report.output_dir, [[1.0, 1.0, 1.0]]).tolist() == [[1.0, 2.0, 3.0]]
    with pytest.raises(tf.errors.InvalidArgumentError):
        _run(report.output_dir, BAD_ROW)


def _examples(tmp_path) -> str:
    path = str(tmp_path / "examples.jsonl")
    with open(path, "w") as f:
        for rows in ([[1.0, 2.0, 3.0]], BAD_ROW, [[4.0, 5.0, 6.0]]):
            f.write(json.dumps({"x": rows}) + "\n")
    return path


def test_parity_compares_errors_on_user_inputs(tmp_path):
    from serving_opt.savedmodel import examples as examples_lib

    checked = build_tf1_assert(str(tmp_path / "checked" / "1"))
    unchecked = build_tf1_assert(str(tmp_path / "unchecked" / "1"), with_assert=False)
    user = examples_lib.read_examples_file(_examples(tmp_path))
    same = parity.check_parity(checked, checked, frozenset({"serve"}), ["serving_default"],
                               inputs=parity.ParityInputs(user_inputs=user))
    assert same.ok, same.summary()
    assert any(o.output == "(errors)" and o.elements == 1 for o in same.outputs)
    lost = parity.check_parity(checked, unchecked, frozenset({"serve"}), ["serving_default"],
                               inputs=parity.ParityInputs(user_inputs=user))
    assert not lost.ok
    assert "answers an input the original rejects" in lost.summary()


def test_optimize_with_examples_the_original_rejects(tmp_path):
    src = build_tf1_assert(str(tmp_path / "src" / "1"))
    report = optimize(src, str(tmp_path / "out"),
                      OptimizeOptions(inputs=InputOptions(examples=_examples(tmp_path)), **QUICK))
    assert report.parity.ok
    with pytest.raises(tf.errors.InvalidArgumentError):
        _run(report.output_dir, BAD_ROW)
