"""Issue 18 (item 2): the static check covers the whole model, not what a walk from the
signatures reaches.

Each hostile SavedModel of tests/hostile_models.py (one per route: the saver's restore
op, the saver's save tensor on a signature's path, a gradient function, a table
initializer reading a host path two ways, a network op, the init op) must be reported by
``inspect`` (API and CLI exit code) with its op, its function and its route, and refused
by ``optimize`` before anything runs. The loaders' own uses of files, in the shapes real
exporters write (TF1 and TF2 savers, Estimator/TF1 and TF2/Keras vocabulary assets),
must still pass; and every op of TensorFlow's registry must have been reviewed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import pytest
import tensorflow as tf
from conftest import tree_snapshot
from hostile_models import HOSTILE, REQUEST, canary_files
from saved_model_io import (
    edit_saved_model,
    save_tf1,
    save_tf2_asset_table,
    serving_default,
    write_vocabulary,
)

from serving_opt import inspection
from serving_opt.errors import ServingOptError
from serving_opt.options import MeasureOptions, ServingCheck, TrustOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import host_ops, loader, untrusted
from serving_opt.savedmodel.graph import node_name

v1 = tf.compat.v1
QUICK = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
HOST_CODES = ("code_execution_op", "file_write_op", "file_read_op", "host_op")


@dataclass(frozen=True)
class Expected:
    """How a route must be reported: the node (its name inside ``function``, a prefix of
    the generated function name, None at the top level) and words of the route."""

    node: str
    function: str | None
    route: tuple[str, ...]


EXPECTED = {
    "restore_hook": Expected("restore_hook", None, (
        "control input of save/restore_all", "the saver's restore op, run at every load")),
    "saver_save_in_signature": Expected("dump", None, (
        "reached from signature serving_default", "saver_def.save_tensor_name dump_done")),
    "gradient_host_op": Expected("WriteFile", "HostGrad_", (
        "via library.gradient of SymbolicGradient gradients/",
        "reached from signature serving_default")),
    "table_path_argument": Expected("InitializeTableFromTextFileV2", "__inference__initializer_", (
        "reached from the init op", "is bound to a constant of the object graph, not an asset")),
    "table_asset_in_signature": Expected("vocab_init", None, (
        "reached from signature serving_default", "feed asset paths only to the init op")),
    "register_dataset": Expected("register", None, ("reached from signature serving_default",)),
    "init_op_write": Expected("init_write", None, ("control input of main_op", "the init op")),
}
ROUTES = sorted(HOSTILE)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """route -> (SavedModel dir, canary path), every model built once."""
    models = tmp_path_factory.mktemp("hostile")
    canaries = tmp_path_factory.mktemp("canaries")
    built = {}
    for route, model in HOSTILE.items():
        canary = str(canaries / route)
        built[route] = (model.build(str(models), canary), canary)
        assert canary_files(canary) == [], f"building {route} ran it"
    return built


def _matches(subject: str, expected: Expected) -> bool:
    if expected.function is None:
        return subject == expected.node
    function, _, node = subject.rpartition("/")
    return function.startswith(expected.function) and node == expected.node


def _risk(model_dir: str, route: str):
    risks = [r for r in inspection.inspect_saved_model(model_dir).risks if r.code in HOST_CODES]
    found = [r for r in risks if _matches(r.subject, EXPECTED[route])]
    assert found, f"{route}: not reported; host risks: {[r.subject for r in risks]}"
    return found[0]


def _assert_names_op_function_and_route(text: str, route: str, subject: str) -> None:
    expected = EXPECTED[route]
    assert HOSTILE[route].op in text
    assert repr(expected.node) in text
    if expected.function:
        assert f"in function {subject.rpartition('/')[0]}" in text
    for words in expected.route:
        assert words in text, f"{route}: {words!r} not in {text!r}"


# ---------------------------------------------------------------------------- inspect


@pytest.mark.parametrize("route", ROUTES)
def test_inspect_reports_op_function_and_route(hostile, route):
    model_dir, _ = hostile[route]
    risk = _risk(model_dir, route)
    assert risk.severity == inspection.SEVERITY_ERROR
    assert risk.tags == ("serve",)
    _assert_names_op_function_and_route(risk.message, route, risk.subject)


@pytest.mark.parametrize("route", ROUTES)
def test_cli_inspect_exits_1_with_fail_on_error(hostile, route, capsys):
    from serving_opt.cli import main as cli_main

    model_dir, canary = hostile[route]
    code = cli_main.main(["serving-opt", "inspect", f"--saved_model_dir={model_dir}",
                          "--fail_on=error"])
    captured = capsys.readouterr()
    assert code == 1
    assert HOSTILE[route].op in captured.out
    assert "at or above --fail_on=error" in captured.err.strip().splitlines()[-1]
    assert canary_files(canary) == []


# --------------------------------------------------------------------------- optimize


@pytest.fixture
def nothing_may_run(monkeypatch):
    """The static check alone stands in the way: no sandbox (switched off, with consent
    to run unsandboxed, so a model let through would run in this process), and any
    TensorFlow session or TF2 load in this process fails the test."""
    from tensorflow.python.client import session as session_lib

    from serving_opt import sandbox

    def ran(*args, **kwargs):
        raise AssertionError("the model was loaded: a session or tf.saved_model.load ran")

    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "switched off by the test")
    monkeypatch.setattr(session_lib.BaseSession, "__init__", ran)
    monkeypatch.setattr(tf.saved_model, "load", ran)


@pytest.mark.parametrize("route", ROUTES)
def test_optimize_refuses_before_running_anything(hostile, route, tmp_path, nothing_may_run):
    model_dir, canary = hostile[route]
    before = tree_snapshot(model_dir)
    out = str(tmp_path / "out")
    with pytest.raises(ServingOptError) as info:
        optimize(model_dir, out, OptimizeOptions(
            trust=TrustOptions(allow_unsandboxed=True), **QUICK))
    message = info.value.one_line()
    assert "\n" not in message
    subject = _risk(model_dir, route).subject
    _assert_names_op_function_and_route(message, route, subject)
    assert "nothing was run" in message and "--allow_file_ops" in message
    assert canary_files(canary) == []
    assert not os.path.exists(out) or os.listdir(out) == []
    assert tree_snapshot(model_dir) == before


def test_validate_refuses_the_restore_hook(hostile, nothing_may_run):
    from serving_opt.serving.validate import ValidateOptions, validate

    model_dir, canary = hostile["restore_hook"]
    with pytest.raises(ServingOptError, match="control input of save/restore_all"):
        validate(os.path.dirname(model_dir), ValidateOptions(
            serving=ServingCheck(server="local", concurrency=0),
            trust=TrustOptions(allow_unsandboxed=True)))
    assert canary_files(canary) == []


@pytest.mark.parametrize("route", [r for r in ROUTES if HOSTILE[r].effect != "network"])
def test_the_models_are_hostile_when_tensorflow_runs_them(route, tmp_path):
    """The check matters: TF's own loader does what each builder says (on a tmp canary)."""
    canary = str(tmp_path / "canary")
    if HOSTILE[route].effect == "reads":
        with open(canary, "w") as f:
            f.write("b\nc\na\n")  # the vocabulary the model will have read: a->2, c->1
    model_dir = HOSTILE[route].build(str(tmp_path / "models"), canary)
    sess, meta_graph = loader.load_session(model_dir)
    try:
        if HOSTILE[route].runs_at == "load" and HOSTILE[route].effect == "writes":
            assert canary_files(canary) == [canary]
        sig = meta_graph.signature_def["serving_default"]
        feed = ({"words": np.array([b"a", b"c"])} if "words" in sig.inputs
                else {"x": np.asarray(REQUEST, np.float32)})
        y = loader.run_signature(sess, sig, feed, ["y"])["y"]
    finally:
        sess.close()
    if HOSTILE[route].effect == "writes":
        assert canary_files(canary)
    else:
        assert y.tolist() == [3.0, 2.0]  # w[2], w[1]: the canary's lines were read


# ----------------------------------------------------------------- the whole graph


def _small_tf1(export_dir: str) -> str:
    """x * w under serving_default, saved with the builder's own saver."""
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]), use_resource=True)
        y = tf.identity(x * w, name="y")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))


def _uses(model_dir: str) -> list[untrusted.HostOpUse]:
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), {"serve"})
    before = meta_graph.SerializeToString(deterministic=True)
    uses = untrusted.host_op_uses(meta_graph)
    # Looked at, never touched (a proto map read with [] would grow the graph).
    assert meta_graph.SerializeToString(deterministic=True) == before
    return uses


def _add_function(meta_graph, name: str, op: str = "PyFunc", **attrs) -> None:
    function = meta_graph.graph_def.library.function.add()
    function.signature.name = name
    node = function.node_def.add(name="inner", op=op)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    return _small_tf1(os.path.join(str(tmp_path_factory.mktemp("small")), "1"))


def test_the_small_model_is_clean(small_model):
    assert _uses(small_model) == []


def test_a_function_nothing_calls_is_dead_and_one_an_orphan_node_calls_is_checked(
        small_model, model_copy):
    """Nothing can run a function no node, function or loader names (more shapes in
    test_dead_functions.py); a node no signature reaches still counts: anyone may fetch it."""
    model = model_copy(small_model)
    edit_saved_model(model, lambda mg: _add_function(mg, "never_called"))
    assert _uses(model) == []
    assert not inspection.inspect_saved_model(model).risks
    edit_saved_model(model, lambda mg: mg.graph_def.node.add(name="orphan", op="never_called"))
    (use,) = _uses(model)
    assert (use.op, use.function, use.signatures) == ("PyFunc", "never_called", ())
    assert use.route == ("via a call as an op by orphan, on no path of a signature or of "
                         "the loader (every node is checked)")
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.subject) == ("code_execution_op", "never_called/inner")


def test_an_orphan_node_is_checked(small_model, model_copy):
    model = model_copy(small_model)
    edit_saved_model(model, lambda mg: mg.graph_def.node.add(name="orphan_write", op="WriteFile"))
    (use,) = _uses(model)
    assert (use.name, use.route) == (
        "orphan_write", "on no path of a signature or of the loader (every node is checked)")


def test_a_function_behind_nested_function_attrs_is_checked(small_model, model_copy):
    """A WriteFile in the body of a While that is itself the then_branch of an If's func
    attr: func attrs are followed at any depth, and the route names the chain's end."""
    from tensorflow.core.framework import attr_value_pb2

    model = model_copy(small_model)

    def edit(meta_graph):
        _add_function(meta_graph, "loop_body", op="WriteFile")
        branch = attr_value_pb2.AttrValue()
        branch.func.name = "then_fn"
        branch.func.attr["body"].func.name = "loop_body"  # a func inside a func attr
        node = meta_graph.graph_def.node.add(name="maybe", op="If")
        node.attr["then_branch"].CopyFrom(branch)
        meta_graph.graph_def.library.function.add().signature.name = "then_fn"
        y = next(n for n in meta_graph.graph_def.node if n.name == "y")
        y.input.append("^maybe")

    edit_saved_model(model, edit)
    (use,) = _uses(model)
    assert (use.op, use.function) == ("WriteFile", "loop_body")
    assert use.route == ("via then_branch.body of If maybe, reached from signature "
                         "serving_default")


def test_copy_with_a_debug_spec_is_a_host_op(small_model, model_copy):
    model = model_copy(small_model)

    def edit(meta_graph):
        node = meta_graph.graph_def.node.add(name="debug_copy", op="Copy", input=["y"])
        node.attr["debug_ops_spec"].list.s.append(b"DebugIdentity;grpc://evil:1;0")

    edit_saved_model(model, edit)
    assert [u.name for u in _uses(model)] == ["debug_copy"]


# ------------------------------------------------------------------------ the saver


def test_restore_reading_another_file_is_refused(small_model, model_copy):
    model = model_copy(small_model)

    def edit(meta_graph):
        meta_graph.graph_def.node.add(name="host_path", op="Const").attr["dtype"].type = 7
        restore = next(n for n in meta_graph.graph_def.node if n.op == "RestoreV2")
        restore.input[0] = "host_path"

    edit_saved_model(model, edit)
    (use,) = _uses(model)
    assert use.op == "RestoreV2"
    assert "takes its file name from 'host_path'" in use.reason


def test_the_init_op_must_not_reach_the_save_tensor(tmp_path):
    model = _small_tf1(str(tmp_path / "1"))

    def edit(meta_graph):
        node = meta_graph.graph_def.node.add(name="main", op="NoOp")
        node.input.append("^" + node_name(meta_graph.saver_def.save_tensor_name))
        meta_graph.collection_def["saved_model_main_op"].node_list.value.append("main")

    edit_saved_model(model, edit)
    uses = _uses(model)
    assert {u.op for u in uses} == {"SaveV2", "MergeV2Checkpoints"}
    assert all("the init op, run at every load reaches saver_def.save_tensor_name" in u.reason
               for u in uses)


def _saver_model(tmp_path, name: str, make_saver) -> str:
    """A TF1 model saved with the saver ``make_saver()`` builds."""
    export_dir = str(tmp_path / name / "1")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        with v1.variable_scope("m", partitioner=v1.fixed_size_partitioner(2)):
            w = v1.get_variable("w", [4, 2], use_resource=False)  # partitioned ref variable
        b = v1.get_variable("b", [2], use_resource=True)
        words = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)
        dense = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, -1, empty_key=-2,
                                                      deleted_key=-3)
        bias = tf.cast(words.lookup(tf.constant("a")) + dense.lookup(tf.constant(1, tf.int64)),
                       tf.float32)
        y = tf.identity(tf.matmul(x, w) + b + bias, name="y")
        v1.train.Saver()  # a training script's own saver, which the export does not use
        saver = make_saver()
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}), saver=saver)


@pytest.mark.parametrize("saver", ["builder_default", "plain", "sharded", "v1_format"])
def test_tf1_savers_pass(tmp_path, saver):
    make = {
        "builder_default": lambda: None,
        "plain": lambda: v1.train.Saver(),
        "sharded": lambda: v1.train.Saver(sharded=True),
        "v1_format": lambda: v1.train.Saver(write_version=v1.train.SaverDef.V1),
    }[saver]
    model = _saver_model(tmp_path, saver, make)
    assert _uses(model) == []
    report = inspection.inspect_saved_model(model)
    assert [r.code for r in report.risks if r.code in HOST_CODES] == []


def test_tf2_saver_with_mutable_tables_passes(tmp_path):
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)
            self.w = tf.Variable([1.0, 2.0, 3.0])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, words):
            return {"y": tf.gather(self.w, tf.maximum(self.table.lookup(words), 0))}

    model = Model()
    export_dir = str(tmp_path / "1")
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    assert _uses(export_dir) == []


def test_the_tf2_restore_function_called_from_elsewhere_is_refused(keras_dir, model_copy):
    model = model_copy(keras_dir)

    def edit(meta_graph):
        restore = next(n for n in meta_graph.graph_def.node
                       if n.name == node_name(meta_graph.saver_def.restore_op_name))
        rogue = meta_graph.graph_def.node.add(name="rogue", op="StatefulPartitionedCall")
        rogue.attr["f"].CopyFrom(restore.attr["f"])
        meta_graph.collection_def["saved_model_main_op"].node_list.value.append("rogue")

    edit_saved_model(model, edit)
    uses = _uses(model)
    assert uses and {u.op for u in uses} == {"RestoreV2"}
    assert "is also reached via a call by StatefulPartitionedCall rogue" in uses[0].reason


# ----------------------------------------------------------------------------- assets


def _tf1_table_model(export_dir: str, vocabulary: str, declare_asset: bool) -> str:
    """How TF1/Estimator code exports a vocabulary table: the asset is a Const of the
    build host's absolute path, fed by the loader to the main op."""
    with tf.Graph().as_default() as graph:
        words = v1.placeholder(tf.string, [None], name="words")
        table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            vocabulary, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER), -1)
        y = tf.identity(table.lookup(words), name="y")
        assets = v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS) if declare_asset else None
        return save_tf1(graph, export_dir, serving_default({"words": words}, {"y": y}),
                        main_op=v1.tables_initializer(), assets_collection=assets)


def test_tf1_vocabulary_asset_passes(tmp_path):
    model = _tf1_table_model(str(tmp_path / "1"), write_vocabulary(tmp_path), declare_asset=True)
    mg = loader.find_meta_graph(loader.read_saved_model(model), {"serve"})
    asset = next(n for n in mg.graph_def.node if n.name == "asset_path")
    # What TF1 writes: a Const of the build host's path, overridden by the loader's feed.
    assert asset.op == "Const" and os.path.isabs(asset.attr["value"].tensor.string_val[0])
    assert _uses(model) == []


def test_tf1_vocabulary_not_declared_as_an_asset_is_refused(tmp_path):
    """Without assets_collection the table reads the build host's absolute path at every
    load: no loader feeds asset_filepaths."""
    model = _tf1_table_model(str(tmp_path / "1"), write_vocabulary(tmp_path), declare_asset=False)
    (use,) = _uses(model)
    assert use.op == "InitializeTableFromTextFileV2"
    assert "comes from Const 'asset_path', which is no asset the loader feeds" in use.reason


def test_asset_node_that_is_a_signature_input_is_refused(tmp_path):
    model = _tf1_table_model(str(tmp_path / "1"), write_vocabulary(tmp_path), declare_asset=True)

    def edit(meta_graph):
        meta_graph.signature_def["serving_default"].inputs["path"].name = "asset_path:0"

    edit_saved_model(model, edit)
    (use,) = _uses(model)
    assert "is also a signature input" in use.reason


def test_read_file_of_an_asset_in_the_init_op_passes(tmp_path):
    export_dir = str(tmp_path / "1")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.identity(x * 2.0, name="y")
        asset = tf.constant(write_vocabulary(tmp_path), name="notes_asset")
        main_op = tf.group(tf.io.read_file(asset, name="read_notes"), name="main_op")
        save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}), main_op=main_op,
                 assets_collection=[asset])
    assert _uses(export_dir) == []


def test_tf2_asset_table_passes(tmp_path):
    """tf.saved_model.save of tf.lookup.StaticHashTable(TextFileInitializer(Asset)): the
    asset placeholder is assigned to a variable the init op reads and passes to the
    initializer function, whose argument the object graph binds to the asset."""
    export_dir = save_tf2_asset_table(str(tmp_path / "1"), write_vocabulary(tmp_path))
    assert _uses(export_dir) == []

    def hand_the_variable_on(meta_graph):
        # The asset variable also passed to the signature's call: no longer the shape.
        read = next(n for n in meta_graph.graph_def.node
                    if n.op == "ReadVariableOp" and any(i.startswith("^") for i in n.input))
        handle = node_name(read.input[0])
        call = next(n for n in meta_graph.graph_def.node if n.name == node_name(
            meta_graph.signature_def["serving_default"].outputs["y"].name))
        call.input.append(handle)

    edit_saved_model(export_dir, hand_the_variable_on)
    (use,) = _uses(export_dir)
    assert "StatefulPartitionedCall" in use.reason and "also uses" in use.reason


def test_keras_string_lookup_export_passes(tmp_path):
    import keras

    inputs = keras.Input(shape=(1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=write_vocabulary(tmp_path))(inputs)
    model = keras.Model(inputs, keras.layers.Embedding(10, 2)(ids))
    export_dir = str(tmp_path / "1")
    model.export(export_dir)
    assert _uses(export_dir) == []


@pytest.mark.parametrize("fixture", ["classifier_dir", "regressor_dir", "keras_dir",
                                     "text_lstm_dir", "tf_module_dir"])
def test_the_fixture_models_pass(fixture, request):
    model = request.getfixturevalue(fixture)
    assert _uses(model) == []


# --------------------------------------------------------------------- the op registry


def _registered_ops():
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session

    buffer = pywrap_tf_session.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList()
        ops.ParseFromString(pywrap_tf_session.TF_GetBuffer(buffer))
    finally:
        pywrap_tf_session.TF_DeleteBuffer(buffer)
    return list(ops.op)


def test_every_registered_op_was_reviewed():
    """A TensorFlow release with a new op fails here until the op is classified
    (serving_opt/savedmodel/host_ops.py says how). The op libraries `serve` loads (TensorFlow Text,
    as TF Serving links it) are registered first: their ops run there too."""
    from serving_opt.model_server.servable import load_custom_op_libraries

    assert load_custom_op_libraries() == ["tensorflow_text"]  # make venv installs it
    ops = _registered_ops()
    assert "SentencepieceOp" in {op.name for op in ops}
    assert len(ops) > 1500
    unreviewed = {}
    for op_def in ops:
        kind, why = host_ops.review(op_def)
        if kind == "unreviewed":
            unreviewed[op_def.name] = why
    assert unreviewed == {}
    names = {op_def.name for op_def in ops}
    assert {n for n in dir(tf.raw_ops) if not n.startswith("_")} <= names


def _op_def(name: str, inputs=(), stateful=False):
    from tensorflow.core.framework import op_def_pb2

    op_def = op_def_pb2.OpDef(name=name, is_stateful=stateful)
    for arg in inputs:
        op_def.input_arg.add(name=arg)
    return op_def


@pytest.mark.parametrize("op_def", [
    _op_def("WriteTensorToDisk", ["tensor"]),
    _op_def("ParseThing", ["filename"]),
    _op_def("FrobnicateDataset", ["input_dataset", "url"], stateful=True),
    _op_def("BrandNewStatefulOp", ["x"], stateful=True),
    _op_def("RegisterModel", ["x"]),
], ids=lambda o: o.name)
def test_a_new_op_that_could_touch_the_host_is_unreviewed(op_def):
    assert host_ops.review(op_def)[0] == "unreviewed"


def test_a_new_plain_compute_op_is_pure():
    assert host_ops.review(_op_def("FusedFrobnicate", ["x", "y"]))[0] == "pure"


def test_network_and_file_ops_of_the_issue_are_listed():
    ops = {op_def.name: op_def for op_def in _registered_ops()}
    network = ["RegisterDataset", "RegisterDatasetV2", "DataServiceDatasetV4", "RpcCall",
               "RpcServer", "Send", "Recv", "_HostRecv", "_HostSend", "NcclAllReduce",
               "CollectiveReduceV2", "CollectiveBcastSend", "RemoteCall"]
    files = ["ImmutableConst", "LoadAndRemapMatrix", "TFRecordReaderV2", "ReaderReadV2",
             "MatchingFiles", "CreateSummaryFileWriter", "DebugIdentityV2", "ReadFile"]
    for name in network:
        assert host_ops.review(ops[name]) == ("host", host_ops.TOUCHES_HOST), name
    for name in files:
        assert host_ops.review(ops[name])[0] == "host", name
    assert host_ops.review(ops["PrintV2"]) == ("conditional", "output_stream")
    assert host_ops.review(ops["Fingerprint"])[0] == "reviewed"
    assert re.search(r"stderr", host_ops.review(ops["Print"])[1])
