"""Issue 29 (items 1-4): real, benign exports the static check refused, each rebuilt here in
the shape its writer gives it, and a hostile twin of each that differs only in what a
hostile model would change, still refused.

1. TF 2.3-2.8's ``tf.saved_model.save`` passed ``<var>/Read/ReadVariableOp`` (a read of the
   VarHandleOp, no other input) to the traced save function, not the handle; the restore
   function got the handle (checked on exports of TF 2.3.4, 2.4.4, 2.5.3, 2.6.5 and
   2.8.4; TF 2.12 passes the handle).
2. ``EncodeProto``/``DecodeProtoV2`` with ``descriptor_source="bytes://<FileDescriptorSet>"``
   carry their descriptors in the attr and open no file.
3. Table initializers the session loaders run with an asset path: (a) TF 2.3-2.8 traced
   each resource's initializer a second time as ``__inference_<lambda>_N`` (save.py,
   ``_trace_resource_initializers``), called only by the init op with the asset
   variable's read and bound by no object graph; (b) a TF2 model loaded into a TF1 graph
   and saved with a Builder calls its ``_initializer`` from a ``restored_function_body``,
   the asset path passed two calls deep (and brings its unreferenced traced save and
   restore functions along).
4. A declared asset whose file is absent: the loaders only build the path string, so it
   is a warning unless an op reads it (then an error naming the op), and optimize
   publishes the model declaring it the same way.

The TF 2.3-2.8 shapes are written by hand from a TF 2.21 export, exactly as those
versions wrote them (the other shapes are TF 2.21's own).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from saved_model_io import (
    edit_saved_model,
    read_saved_model,
    save_tf2_asset_table,
    write_vocabulary,
)
from tensorflow.core.framework import types_pb2

from serving_opt import inspection
from serving_opt.options import MeasureOptions
from serving_opt.savedmodel import host_ops, loader, untrusted
from serving_opt.savedmodel.graph import node_name

v1 = tf.compat.v1
HOST_PATH = "/etc/hostname"


def _uses(model_dir: str) -> list[untrusted.HostOpUse]:
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), {"serve"})
    return untrusted.host_op_uses(meta_graph)


def _inspect_exit(model_dir: str, capsys) -> int:
    from serving_opt.cli import main as cli_main

    code = cli_main.main(["serving-opt", "inspect", f"--saved_model_dir={model_dir}",
                          "--fail_on=error"])
    capsys.readouterr()
    return code


def _assert_clean(model_dir: str, capsys) -> None:
    assert _uses(model_dir) == []
    report = inspection.inspect_saved_model(model_dir)
    assert [r for r in report.risks if r.severity == inspection.SEVERITY_ERROR] == []
    assert _inspect_exit(model_dir, capsys) == 0


def _session_run(model_dir: str, feeds: dict, output: str = "y"):
    """The signature run as TF Serving runs it: the session loader (restore op, then the
    init op with the asset paths fed)."""
    with tf.Graph().as_default(), v1.Session() as sess:
        meta_graph = v1.saved_model.load(sess, ["serve"], model_dir)
        sig = meta_graph.signature_def["serving_default"]
        return sess.run(sig.outputs[output].name,
                        {sig.inputs[k].name: v for k, v in feeds.items()})


def _node(meta_graph, name: str):
    return next(n for n in meta_graph.graph_def.node if n.name == name)


def _function(meta_graph, name: str):
    return next(f for f in meta_graph.graph_def.library.function if f.signature.name == name)


# ------------------------------------------------ item 1: TF 2.3-2.8's save function


def _tf2_variable_model(export_dir: str) -> str:
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([1.0, 2.0, 3.0], name="w")

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def serve(self, x):
            return {"y": x * self.w}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


def _save_passed_the_read(meta_graph, read_of: str | None = None) -> str:
    """TF 2.3-2.8's shape: the save call is passed ``w/Read/ReadVariableOp`` (the
    UninitializedVariable's graph element, its one input the VarHandleOp) and its
    function saves that argument as it is; ``read_of`` makes the read read another
    node instead. Returns the read's name."""
    save_call = _node(meta_graph, node_name(meta_graph.saver_def.save_tensor_name))
    index = next(i for i, t in enumerate(save_call.input) if node_name(t) == "w")
    read = _node(meta_graph, "w/Read/ReadVariableOp")
    assert read.op == "ReadVariableOp" and list(read.input) == ["w"]
    if read_of is not None:
        read.input[0] = read_of
    save_call.input[index] = read.name
    save_call.attr["Tin"].list.type[index] = types_pb2.DT_FLOAT
    if "_read_only_resource_inputs" in save_call.attr:
        resources = save_call.attr["_read_only_resource_inputs"].list
        kept_ints = [i for i in resources.i if i != index]
        del resources.i[:]
        resources.i.extend(kept_ints)
    function = _function(meta_graph, save_call.attr["f"].func.name)
    arg = function.signature.input_arg[index]
    arg.type, arg.name = types_pb2.DT_FLOAT, "savev2_w_read_readvariableop"
    # TF 2.21 reads the handle inside (DisableCopyOnRead, ReadVariableOp, Identity x2);
    # TF 2.4 handed SaveV2 the argument.
    dropped = {"Read/DisableCopyOnRead", "Read/ReadVariableOp", "Identity", "Identity_1"}
    kept = [n for n in function.node_def if n.name not in dropped]
    assert len(kept) == len(function.node_def) - len(dropped)
    del function.node_def[:]
    function.node_def.extend(kept)
    for node in function.node_def:
        inputs = [i for i in node.input if node_name(i) not in dropped]
        if node.op == "SaveV2":
            inputs = [arg.name if i == "Identity_1:output:0" else i for i in node.input]
        del node.input[:]
        node.input.extend(inputs)
    for name in dropped:
        function.control_ret.pop(name, None)
    outputs = [o for o in function.signature.control_output if o not in dropped]
    del function.signature.control_output[:]
    function.signature.control_output.extend(outputs)
    function.arg_attr[index].Clear()
    function.resource_arg_unique_id.pop(index, None)
    return read.name


def test_tf24_save_function_passed_the_variable_read_passes(tmp_path, capsys):
    model = _tf2_variable_model(str(tmp_path / "1"))
    edit_saved_model(model, _save_passed_the_read)
    _assert_clean(model, capsys)
    assert _session_run(model, {"x": [[1.0, 1.0, 1.0]]}).tolist() == [[1.0, 2.0, 3.0]]
    # The edited save function is one TensorFlow runs: it writes w's value.
    prefix = str(tmp_path / "saved")
    with tf.Graph().as_default(), v1.Session() as sess:
        meta_graph = v1.saved_model.load(sess, ["serve"], model)
        saver = meta_graph.saver_def
        sess.run(saver.save_tensor_name, {saver.filename_tensor_name: prefix})
    assert tf.train.load_checkpoint(prefix).get_tensor(
        "w/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("twin", ["read_of_a_placeholder", "read_with_a_control_input",
                                  "read_passed_to_restore"])
def test_tf24_save_function_passed_another_read_is_refused(tmp_path, twin):
    model = _tf2_variable_model(str(tmp_path / "1"))

    def edit(meta_graph):
        if twin == "read_of_a_placeholder":
            meta_graph.graph_def.node.add(name="handle", op="Placeholder").attr[
                "dtype"].type = types_pb2.DT_RESOURCE
            _save_passed_the_read(meta_graph, read_of="handle")
        elif twin == "read_with_a_control_input":
            read = _save_passed_the_read(meta_graph)
            _node(meta_graph, read).input.append("^serving_default_x")
        else:  # the restore function is passed the read, not the handle it assigns
            _save_passed_the_read(meta_graph)
            restore = _node(meta_graph, meta_graph.saver_def.restore_op_name)
            restore.input[list(restore.input).index("w")] = "w/Read/ReadVariableOp"

    edit_saved_model(model, edit)
    uses = _uses(model)
    assert uses and {u.op for u in uses} <= {"SaveV2", "MergeV2Checkpoints", "RestoreV2"}
    assert all("not what TF's savers build" in u.reason for u in uses)
    assert any("is passed ReadVariableOp 'w/Read/ReadVariableOp', not a saved object"
               in u.reason for u in uses)


# ----------------------------------------------------- item 2: bytes:// descriptors


def _descriptor_set() -> bytes:
    from google.protobuf import descriptor_pb2
    from tensorflow.core.example import example_pb2, feature_pb2

    files = descriptor_pb2.FileDescriptorSet()
    for module in (feature_pb2, example_pb2):
        module.DESCRIPTOR.CopyToProto(files.file.add())
    return files.SerializeToString()


def _decode_proto_model(export_dir: str, descriptor_source: str | bytes) -> str:
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, examples):
            _, (features,) = tf.io.decode_proto(
                examples, "tensorflow.Example", ["features"], [tf.string],
                descriptor_source=descriptor_source)
            return {"y": tf.strings.length(features[:, 0])}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


def _example() -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={"a": tf.train.Feature(
        int64_list=tf.train.Int64List(value=[7]))})).SerializeToString()


def test_decode_proto_with_bytes_descriptors_passes(tmp_path, capsys):
    model = _decode_proto_model(str(tmp_path / "1"), b"bytes://" + _descriptor_set())
    mg = loader.find_meta_graph(loader.read_saved_model(model), {"serve"})
    ops = [n for f in mg.graph_def.library.function for n in f.node_def
           if n.op == "DecodeProtoV2"]
    assert ops and ops[0].attr["descriptor_source"].s.startswith(b"bytes://")
    _assert_clean(model, capsys)
    expected = len(tf.train.Example.FromString(_example()).features.SerializeToString())
    assert _session_run(model, {"examples": [_example()]}).tolist() == [expected]


def test_decode_proto_with_a_descriptor_file_is_refused(tmp_path):
    path = tmp_path / "descriptors.pb"
    path.write_bytes(_descriptor_set())
    model = _decode_proto_model(str(tmp_path / "1"), str(path))
    (use,) = _uses(model)
    assert (use.op, use.kind) == ("DecodeProtoV2", host_ops.READS_FILES)


@pytest.mark.parametrize("source,kind", [
    (b"bytes://\n\x0b", None), (b"local://", None), (b"", None),
    (b"bytes:/etc/descriptors.pb", host_ops.READS_FILES),
    (b"/tmp/bytes://x", host_ops.READS_FILES), (b"BYTES://x", host_ops.READS_FILES)])
def test_only_the_bytes_prefix_clears_a_proto_codec(source, kind):
    from tensorflow.core.framework import node_def_pb2

    for op in ("EncodeProto", "DecodeProtoV2"):
        node = node_def_pb2.NodeDef(name="p", op=op)
        node.attr["descriptor_source"].s = source
        assert host_ops.host_op_kind(node) == kind


# --------------------------------------------- item 3: table initializers' asset paths


def _init_call(meta_graph):
    """The init op's call of the table initializer (TF 2.21: of ``_initializer``)."""
    init = _node(meta_graph, meta_graph.collection_def["saved_model_main_op"]
                 .node_list.value[0])
    calls = [_node(meta_graph, node_name(i)) for i in init.input]
    (call,) = [c for c in calls if c.op == "StatefulPartitionedCall"]
    return call


def _initializer_as_lambda(meta_graph) -> None:
    """TF 2.3-2.8's shape: the init op calls ``__inference_<lambda>_N``, the same body
    traced again by _trace_resource_initializers, which no object graph binds."""
    call = _init_call(meta_graph)
    initializer = _function(meta_graph, call.attr["f"].func.name)
    assert initializer.signature.name in meta_graph.object_graph_def.concrete_functions
    twin = meta_graph.graph_def.library.function.add()
    twin.CopyFrom(initializer)
    twin.signature.name = "__inference_<lambda>_314"
    call.attr["f"].func.name = twin.signature.name
    assert twin.signature.name not in meta_graph.object_graph_def.concrete_functions
    read = _node(meta_graph, node_name(call.input[0]))  # the asset variable's read
    assert read.op == "ReadVariableOp"


def test_tf24_lambda_table_initializer_passes(tmp_path, capsys):
    model = save_tf2_asset_table(str(tmp_path / "1"), write_vocabulary(tmp_path))
    edit_saved_model(model, _initializer_as_lambda)
    _assert_clean(model, capsys)
    assert _session_run(model, {"words": [b"b", b"z"]}).tolist() == [1, -1]


@pytest.mark.parametrize("twin", ["const_host_path", "also_called_in_a_function",
                                  "called_by_an_if"])
def test_lambda_table_initializer_fed_otherwise_is_refused(tmp_path, twin):
    model = save_tf2_asset_table(str(tmp_path / "1"), write_vocabulary(tmp_path))

    def edit(meta_graph):
        _initializer_as_lambda(meta_graph)
        call = _init_call(meta_graph)
        if twin == "const_host_path":
            path = meta_graph.graph_def.node.add(name="host_path", op="Const")
            path.attr["dtype"].type = types_pb2.DT_STRING
            path.attr["value"].tensor.dtype = types_pb2.DT_STRING
            path.attr["value"].tensor.string_val.append(HOST_PATH.encode())
            call.input[0] = "host_path"
            return
        # The lambda also reached from a function, which passes it its own Const.
        caller = meta_graph.graph_def.library.function.add()
        caller.signature.name = "rogue_caller"
        caller.signature.input_arg.add(name="table", type=types_pb2.DT_RESOURCE)
        const = caller.node_def.add(name="path", op="Const")
        const.attr["dtype"].type = types_pb2.DT_STRING
        const.attr["value"].tensor.dtype = types_pb2.DT_STRING
        const.attr["value"].tensor.string_val.append(HOST_PATH.encode())
        if twin == "also_called_in_a_function":
            inner = caller.node_def.add(name="call", op="StatefulPartitionedCall")
            inner.input.extend(["path:output:0", "table"])
            inner.attr["f"].func.name = call.attr["f"].func.name
        else:
            inner = caller.node_def.add(name="if", op="If")
            inner.input.extend(["path:output:0", "path:output:0", "table"])
            inner.attr["then_branch"].func.name = call.attr["f"].func.name
            inner.attr["else_branch"].func.name = call.attr["f"].func.name
        rogue = meta_graph.graph_def.node.add(name="rogue", op="StatefulPartitionedCall")
        rogue.input.append(call.input[1])
        rogue.attr["f"].func.name = "rogue_caller"

    edit_saved_model(model, edit)
    uses = _uses(model)
    assert uses and {u.op for u in uses} == {"InitializeTableFromTextFileV2"}
    reasons = " ".join(u.reason for u in uses)
    if twin == "const_host_path":
        assert "comes from Const 'host_path', which is no asset the loader feeds" in reasons
    elif twin == "also_called_in_a_function":
        assert "comes from Const 'path' inside the function, not an asset" in reasons
    else:
        assert "only a call can pass it an asset path" in reasons


def _tf2_table_loaded_into_tf1(export_dir: str, tf2_model: str) -> str:
    """A TF2 model loaded into a TF1 graph (as an Estimator's model_fn loads a
    tf.Transform layer) and saved with the Builder: the init op's call runs
    ``restored_function_body``, which calls the restored ``_initializer``."""
    with tf.Graph().as_default():
        layer = tf.saved_model.load(tf2_model)
        words = v1.placeholder(tf.string, [None], name="words")
        y = tf.identity(layer.signatures["serving_default"](words=words)["y"], name="y")
        with v1.Session() as sess:
            sess.run(v1.tables_initializer())
            builder = v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": (
                    v1.saved_model.predict_signature_def({"words": words}, {"y": y}))},
                main_op=v1.tables_initializer(),
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS))
            builder.save()
    return export_dir


@pytest.fixture
def two_deep(tmp_path) -> str:
    tf2_model = save_tf2_asset_table(str(tmp_path / "tf2" / "1"), write_vocabulary(tmp_path))
    model = _tf2_table_loaded_into_tf1(str(tmp_path / "tf1" / "1"), tf2_model)
    meta_graph = read_saved_model(model).meta_graphs[0]
    call = _init_call(meta_graph)
    outer = _function(meta_graph, call.attr["f"].func.name)
    assert outer.signature.name.startswith("__inference_restored_function_body_")
    (inner,) = [n for n in outer.node_def if n.op == "StatefulPartitionedCall"]
    assert inner.attr["f"].func.name.startswith("__inference__initializer_")
    assert not meta_graph.HasField("object_graph_def")
    return model


def test_asset_path_passed_two_calls_deep_passes(two_deep, capsys):
    _assert_clean(two_deep, capsys)
    assert _session_run(two_deep, {"words": [b"c", b"z"]}).tolist() == [2, -1]


@pytest.mark.parametrize("twin", ["graph_passes_a_const", "body_passes_a_const",
                                  "spare_saver_called"])
def test_two_deep_fed_otherwise_is_refused(two_deep, twin):
    def edit(meta_graph):
        call = _init_call(meta_graph)
        outer = _function(meta_graph, call.attr["f"].func.name)
        if twin == "graph_passes_a_const":
            path = meta_graph.graph_def.node.add(name="host_path", op="Const")
            path.attr["dtype"].type = types_pb2.DT_STRING
            path.attr["value"].tensor.dtype = types_pb2.DT_STRING
            path.attr["value"].tensor.string_val.append(HOST_PATH.encode())
            call.input[0] = "host_path"
        elif twin == "body_passes_a_const":
            const = outer.node_def.add(name="host_path", op="Const")
            const.attr["dtype"].type = types_pb2.DT_STRING
            const.attr["value"].tensor.dtype = types_pb2.DT_STRING
            const.attr["value"].tensor.string_val.append(HOST_PATH.encode())
            (inner,) = [n for n in outer.node_def if n.op == "StatefulPartitionedCall"]
            inner.input[0] = "host_path:output:0"
        else:  # the loaded model's traced restore function, called by the init op
            restore = next(f for f in meta_graph.graph_def.library.function
                           if "_traced_restore_" in f.signature.name)
            prefix = meta_graph.graph_def.node.add(name="prefix", op="Const")
            prefix.attr["dtype"].type = types_pb2.DT_STRING
            prefix.attr["value"].tensor.dtype = types_pb2.DT_STRING
            prefix.attr["value"].tensor.string_val.append(HOST_PATH.encode())
            rogue = meta_graph.graph_def.node.add(name="rogue", op="StatefulPartitionedCall")
            rogue.input.append("prefix")
            rogue.attr["f"].func.name = restore.signature.name
            _node(meta_graph, node_name(
                meta_graph.collection_def["saved_model_main_op"].node_list.value[0])
            ).input.append("^rogue")

    edit_saved_model(two_deep, edit)
    uses = _uses(two_deep)
    assert uses
    reasons = " ".join(u.reason for u in uses)
    if twin == "graph_passes_a_const":
        assert {u.op for u in uses} == {"InitializeTableFromTextFileV2"}
        assert "comes from Const 'host_path', which is no asset the loader feeds" in reasons
    elif twin == "body_passes_a_const":
        assert {u.op for u in uses} == {"InitializeTableFromTextFileV2"}
        assert "comes from Const 'host_path' inside the function, not an asset" in reasons
    else:
        assert {u.op for u in uses} == {"RestoreV2"}
        assert "the init op" in reasons and "not part of the saver" in reasons


@pytest.mark.parametrize("called", [False, True], ids=["dead", "called"])
def test_a_spare_traced_save_of_another_shape_is_refused_once_anything_calls_it(two_deep,
                                                                              called):
    """The traced save function of the TF2 model loaded into this TF1 graph is a library
    function nothing calls: it cannot run, so a host prefix in it is no risk. A node that
    calls it makes it run, and then its shape is judged (not TF's spare saver's)."""
    def edit(meta_graph):
        save = next(f for f in meta_graph.graph_def.library.function
                    if "_traced_save_" in f.signature.name)
        const = save.node_def.add(name="host_prefix", op="Const")
        const.attr["dtype"].type = types_pb2.DT_STRING
        const.attr["value"].tensor.dtype = types_pb2.DT_STRING
        const.attr["value"].tensor.string_val.append(HOST_PATH.encode())
        (merge,) = [n for n in save.node_def if n.op == "MergeV2Checkpoints"]
        merge.input[1] = "host_prefix:output:0"
        if called:
            rogue = meta_graph.graph_def.node.add(name="rogue", op="StatefulPartitionedCall")
            rogue.attr["f"].func.name = save.signature.name

    edit_saved_model(two_deep, edit)
    uses = _uses(two_deep)
    if not called:
        assert uses == []
        return
    assert {u.op for u in uses} == {"SaveV2", "MergeV2Checkpoints"}
    assert [u.reason for u in uses] == ["not part of the saver that saver_def names"] * 2


# ----------------------------------------------- item 4: a declared but absent asset


def _unread_asset_model(export_dir: str, notes: str) -> str:
    """An asset tracked by the module and read by no op (TF2 still declares it and
    assigns its path to a variable in the init op)."""

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.notes = tf.saved_model.Asset(notes)
            self.w = tf.Variable([1.0, 2.0, 3.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def serve(self, x):
            return {"y": x * self.w}

    model = Model()
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return export_dir


def _asset_risk(model_dir: str):
    (risk,) = [r for r in inspection.inspect_saved_model(model_dir).risks
               if r.code == "asset_missing"]
    return risk


def test_an_absent_asset_nothing_reads_is_a_warning(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    model = _unread_asset_model(str(tmp_path / "1"), str(notes))
    mg = loader.find_meta_graph(loader.read_saved_model(model), {"serve"})
    assert [a.filename for a in mg.asset_file_def] == ["notes.txt"]
    os.remove(os.path.join(model, "assets", "notes.txt"))
    _assert_clean(model, capsys)
    risk = _asset_risk(model)
    assert (risk.severity, risk.subject) == (inspection.SEVERITY_WARNING, "notes.txt")
    assert "no op of the init op or a signature reads it" in risk.message
    # TensorFlow loads and runs it, both loaders.
    assert _session_run(model, {"x": [[1.0, 1.0, 1.0]]}).tolist() == [[1.0, 2.0, 3.0]]
    loaded = tf.saved_model.load(model)
    y = loaded.signatures["serving_default"](x=tf.ones([1, 3]))["y"]
    assert y.numpy().tolist() == [[1.0, 2.0, 3.0]]


def test_an_absent_asset_a_table_reads_is_an_error(tmp_path, capsys):
    model = save_tf2_asset_table(str(tmp_path / "1"), write_vocabulary(tmp_path))
    os.remove(os.path.join(model, "assets", "vocab.txt"))
    risk = _asset_risk(model)
    assert (risk.severity, risk.subject) == (inspection.SEVERITY_ERROR, "vocab.txt")
    assert "InitializeTableFromTextFileV2 node 'text_file_init/InitializeTableFromTextFileV2' " \
           "in function __inference__initializer_" in risk.message
    assert "reads it when the model loads" in risk.message
    assert _inspect_exit(model, capsys) == 1
    with pytest.raises(Exception, match="vocab.txt"):
        _session_run(model, {"words": [b"a"]})


def test_optimize_publishes_a_model_with_an_absent_unread_asset(tmp_path):
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    model = _unread_asset_model(str(tmp_path / "src" / "1"), str(notes))
    os.remove(os.path.join(model, "assets", "notes.txt"))
    out = str(tmp_path / "out")
    optimize(model, out, OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    published = os.path.join(out, sorted(os.listdir(out))[-1]) \
        if not os.path.exists(os.path.join(out, "saved_model.pb")) else out
    mg = loader.find_meta_graph(loader.read_saved_model(published), {"serve"})
    assets = list(mg.asset_file_def) or loader.asset_files(mg, published)
    assert [a.filename for a in assets] == ["notes.txt"]
    assert not os.path.exists(os.path.join(published, "assets", "notes.txt"))
    y = _session_run(published, {"x": np.ones([1, 3], np.float32)})
    assert y.tolist() == [[1.0, 2.0, 3.0]]
