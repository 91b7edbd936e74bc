"""`serving_opt.inspection`: what inspect reports about real SavedModels, and the risks it finds.

Expected values come from the sample builders' design (samples.py), from the proto and
the checkpoint read directly, never from the code under test. Broken models are copies
whose saved_model.pb is edited here.
"""

from __future__ import annotations

import collections
import json
import os
import re

import pytest
import repo_paths
from saved_model_io import edit_saved_model, read_saved_model, save_tf1, serving_default

from serving_opt import inspection, samples
from serving_opt.errors import ServingOptError

REPO = repo_paths.REPO
SCHEMA_DOC = os.path.join(REPO, "docs", "inspect-json-schema.md")
N_CLASSES = len(samples.CLASS_NAMES)


# ------------------------------------------------------------------------------ helpers


def _checkpoint(model_dir: str) -> dict:
    """Checkpoint key -> numpy value, read with TF's own reader."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(model_dir, "variables", "variables"))
    return {
        key: reader.get_tensor(key)
        for key, _ in tf.train.list_variables(os.path.join(model_dir, "variables", "variables"))
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def _risks(report, code: str) -> list:
    return [r for r in report.risks if r.code == code]


def _signature(report, key: str):
    (sig,) = [s for s in report.meta_graphs[0].signatures if s.key == key]
    return sig


def _io(tensors) -> dict:
    return {t.alias: (t.dtype, t.shape, t.name) for t in tensors}


@pytest.fixture(scope="module")
def classifier_report(classifier_dir):
    return inspection.inspect_saved_model(classifier_dir)


@pytest.fixture(scope="module")
def keras_report(keras_dir):
    return inspection.inspect_saved_model(keras_dir)


@pytest.fixture(scope="module")
def read_file_dir(tmp_path_factory) -> str:
    """A TF1 model whose signature output depends on tf.io.read_file of its input path."""
    import tensorflow as tf

    v1 = tf.compat.v1
    export_dir = os.path.join(str(tmp_path_factory.mktemp("read_file")), "1")
    with tf.Graph().as_default() as graph:
        path = v1.placeholder(tf.string, [], name="path")
        scale = v1.get_variable("scale", [], initializer=v1.constant_initializer(2.0))
        contents = tf.io.read_file(path, name="read_file")
        length = tf.identity(
            tf.cast(tf.strings.length(contents), tf.float32) * scale, name="length"
        )
        return save_tf1(graph, export_dir, serving_default({"path": path}, {"length": length}))


# ------------------------------------------------------------------ TF1 sample classifier


def test_classifier_signature_keys_and_methods(classifier_report):
    methods = {s.key: s.method_name for s in classifier_report.meta_graphs[0].signatures}
    assert methods == {
        "serving_default": "tensorflow/serving/classify",
        "classification": "tensorflow/serving/classify",
        "predict": "tensorflow/serving/predict",
    }


def test_classifier_classify_signature_inputs_and_outputs(classifier_report):
    sig = _signature(classifier_report, "serving_default")
    assert _io(sig.inputs) == {"inputs": ("string", (-1,), "input_example_tensor:0")}
    assert _io(sig.outputs) == {
        "classes": ("string", (-1, N_CLASSES), "classes:0"),
        "scores": ("float32", (-1, N_CLASSES), "probabilities:0"),
    }


def test_classifier_predict_signature_inputs_and_outputs(classifier_report):
    sig = _signature(classifier_report, "predict")
    assert _io(sig.inputs) == {"examples": ("string", (-1,), "input_example_tensor:0")}
    assert _io(sig.outputs) == {
        "class_ids": ("int64", (-1,), "class_ids:0"),
        "logits": ("float32", (-1, N_CLASSES), "logits:0"),
        "probabilities": ("float32", (-1, N_CLASSES), "probabilities:0"),
    }


def test_classifier_init_op_is_the_main_op(classifier_dir, classifier_report):
    main_op = read_saved_model(classifier_dir).meta_graphs[0].collection_def["saved_model_main_op"]
    init_op = classifier_report.meta_graphs[0].init_op
    assert (init_op.name, init_op.source) == (main_op.node_list.value[0], "main_op")


def test_classifier_vocabulary_asset_and_its_size(classifier_dir, classifier_report):
    vocab_bytes = len(("\n".join(samples.VOCABULARY) + "\n").encode())
    assert os.path.getsize(os.path.join(classifier_dir, "assets", "vocab.txt")) == vocab_bytes
    (asset,) = classifier_report.meta_graphs[0].assets
    assert (asset.filename, asset.size_bytes, asset.exists, asset.escapes) == (
        "vocab.txt", vocab_bytes, True, False,
    )


def test_classifier_variables_count_and_bytes(classifier_dir, classifier_report):
    values = _checkpoint(classifier_dir)
    variables = classifier_report.variables
    assert (variables.status, variables.naming) == ("ok", "graph")
    assert variables.count == len(values)
    assert variables.total_bytes == sum(v.nbytes for v in values.values())


def test_classifier_largest_five_variables(classifier_dir, classifier_report):
    values = _checkpoint(classifier_dir)
    expected = sorted(values, key=lambda k: (-values[k].nbytes, k))[:5]
    largest = classifier_report.variables.largest
    assert [v.name for v in largest] == expected
    assert [(v.shape, v.dtype, v.size_bytes) for v in largest] == [
        (values[k].shape, values[k].dtype.name, values[k].nbytes) for k in expected
    ]


def test_classifier_is_tf1_with_all_nodes_in_graph_def(classifier_dir, classifier_report):
    graph_def = read_saved_model(classifier_dir).meta_graphs[0].graph_def
    meta = classifier_report.meta_graphs[0]
    assert meta.kind == "tf1"
    assert (meta.graph_def_node_count, meta.function_node_count) == (len(graph_def.node), 0)
    assert dict(meta.graph_def_ops) == collections.Counter(n.op for n in graph_def.node)


def test_classifier_saver_nodes_are_not_risks(classifier_dir, classifier_report):
    ops = {n.op for n in read_saved_model(classifier_dir).meta_graphs[0].graph_def.node}
    # The saver is in the graph, as in every TF1 export, but no signature reaches it.
    assert {"SaveV2", "RestoreV2", "MergeV2Checkpoints"} <= ops
    assert classifier_report.risks == ()


def test_disk_usage_adds_up_the_files(classifier_dir, classifier_report):
    sizes = {}
    for root, _, files in os.walk(classifier_dir):
        for name in files:
            full = os.path.join(root, name)
            sizes[os.path.relpath(full, classifier_dir)] = os.path.getsize(full)
    disk = classifier_report.disk
    assert disk.total_bytes == sum(sizes.values())
    assert disk.saved_model_pb_bytes == sizes["saved_model.pb"]
    assert disk.variables_bytes == sum(v for k, v in sizes.items() if k.startswith("variables"))
    assert disk.assets_bytes == sizes[os.path.join("assets", "vocab.txt")]


# -------------------------------------------------------------------- Keras 3 (TF2) export


def test_keras_is_tf2_with_serve_and_serving_default(keras_report):
    meta = keras_report.meta_graphs[0]
    assert meta.kind == "tf2"
    assert {s.key: _io(s.outputs)["output_0"][:2] for s in meta.signatures} == {
        "serve": ("float32", (-1, 2)),
        "serving_default": ("float32", (-1, 2)),
    }
    assert {s.key: _io(s.inputs)["features"][:2] for s in meta.signatures} == {
        "serve": ("float32", (-1, 5)),
        "serving_default": ("float32", (-1, 5)),
    }


def test_keras_ops_are_counted_inside_functions(keras_dir, keras_report):
    graph_def = read_saved_model(keras_dir).meta_graphs[0].graph_def
    in_functions = collections.Counter(
        n.op for f in graph_def.library.function for n in f.node_def
    )
    meta = keras_report.meta_graphs[0]
    # The Dense layers' MatMuls live only in function bodies, not in the top-level graph.
    assert in_functions["MatMul"] >= 2
    assert dict(meta.function_ops)["MatMul"] == in_functions["MatMul"]
    assert "MatMul" not in dict(meta.graph_def_ops)
    assert meta.function_node_count == sum(in_functions.values())
    assert meta.function_count == len(graph_def.library.function)


def test_keras_init_op_comes_from_the_init_signature(keras_dir, keras_report):
    sig = read_saved_model(keras_dir).meta_graphs[0].signature_def["__saved_model_init_op"]
    init_op = keras_report.meta_graphs[0].init_op
    expected = sig.outputs["__saved_model_init_op"].name.split(":")[0]
    assert (init_op.name, init_op.source) == (expected, "__saved_model_init_op")


def test_keras_variables_use_object_paths_with_full_names(keras_dir, keras_report):
    values = _checkpoint(keras_dir)
    variables = keras_report.variables
    assert variables.naming == "object"
    assert variables.count == len(values)
    assert variables.total_bytes == sum(v.nbytes for v in values.values())
    assert all(v.name.endswith("/.ATTRIBUTES/VARIABLE_VALUE") for v in variables.largest)
    # The largest tensor is the first Dense kernel, 5 features x 8 units.
    assert (variables.largest[0].full_name, variables.largest[0].shape) == (
        "dense/kernel", (5, 8),
    )


def test_keras_export_has_no_risks(keras_report):
    assert keras_report.risks == ()


# ------------------------------------------------------------------------- output formats


def _documented_example() -> dict:
    with open(SCHEMA_DOC) as f:
        text = f.read()
    return json.loads(re.search(r"```json\n(.*?)\n```", text, re.S).group(1))


def _key_paths(value, path: str = "") -> set[str]:
    """Every key path of a JSON value; lists contribute their elements' paths, op
    histograms (op name -> count) only themselves, since their keys are data."""
    if isinstance(value, dict):
        if path.endswith(".ops.graph_def") or path.endswith(".ops.functions"):
            return {path}
        out = {path}
        for key, item in value.items():
            out |= _key_paths(item, f"{path}.{key}")
        return out
    if isinstance(value, list):
        out = {path}
        for item in value:
            if isinstance(item, dict):  # shapes and tag lists hold data, not keys
                out |= _key_paths(item, path + "[]")
        return out
    return {path}


def _add_py_func(meta_graph) -> None:
    """Adds a PyFunc node that every classifier signature reaches through a control input."""
    node = meta_graph.graph_def.node.add(name="evil_py_func", op="PyFunc")
    node.attr["token"].s = b"pyfunc_0"
    probabilities = next(n for n in meta_graph.graph_def.node if n.name == "probabilities")
    probabilities.input.append("^evil_py_func")


def test_json_has_exactly_the_documented_keys(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    edit_saved_model(model, _add_py_func)  # so that the risk object's keys are compared too
    produced = json.loads(inspection.inspect_saved_model(model).to_json())
    assert produced["risks"] and produced["meta_graphs"][0]["assets"]
    assert _key_paths(produced) == _key_paths(_documented_example())


def test_json_values_for_the_classifier(classifier_report):
    data = json.loads(classifier_report.to_json())
    meta = data["meta_graphs"][0]
    predict = next(s for s in meta["signatures"] if s["key"] == "predict")
    logits = next(t for t in predict["outputs"] if t["alias"] == "logits")
    assert logits == {
        "alias": "logits", "dtype": "float32", "shape": [-1, N_CLASSES], "encoding": "name",
        "name": "logits:0", "components": ["logits:0"],
    }
    assert (meta["kind"], meta["init_op"]["source"], data["risks"]) == ("tf1", "main_op", [])


def test_table_lists_every_signature_key_in_the_key_column(classifier_report):
    lines = classifier_report.format_table().splitlines()
    header = next(line for line in lines if line.strip().startswith("KEY"))
    column = header.index("KEY")
    rows = lines[lines.index(header) + 1:]
    keys = {line[column:].split()[0] for line in rows if line[column:column + 1].strip()}
    assert {"serving_default", "classification", "predict"} <= keys


def test_table_aligns_signature_columns(classifier_report):
    lines = classifier_report.format_table().splitlines()
    header = next(line for line in lines if line.strip().startswith("KEY"))
    dtype_column = header.index("DTYPE")
    rows = [line for line in lines if "probabilities:0" in line]
    assert rows and all(line[dtype_column:].startswith("float32") for line in rows)


# ----------------------------------------------------------------------------------- risks


def test_read_file_reachable_from_a_signature_is_a_risk(read_file_dir):
    nodes = read_saved_model(read_file_dir).meta_graphs[0].graph_def.node
    (read_node,) = [n.name for n in nodes if n.op == "ReadFile"]
    (risk,) = inspection.inspect_saved_model(read_file_dir).risks
    # An error, like every host op: optimize refuses the model, `inspect --fail_on=error`
    # must fail a pipeline on it too.
    assert (risk.code, risk.severity, risk.subject, risk.tags) == (
        "file_read_op", "error", read_node, ("serve",),
    )
    assert "ReadFile node 'read_file'" in risk.message
    assert "reached from signature serving_default" in risk.message


def test_py_func_behind_a_control_input_is_a_risk(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    edit_saved_model(model, _add_py_func)
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.severity, risk.subject) == (
        "code_execution_op", "error", "evil_py_func",
    )
    # Every signature outputs the probabilities (classify as "scores").
    assert all(k in risk.message for k in ("classification", "predict", "serving_default"))


def test_py_func_that_no_signature_reaches_is_still_a_risk(classifier_dir, model_copy):
    # The whole graph is checked: "nothing runs it" is what a crafted model would claim.
    model = model_copy(classifier_dir)
    edit_saved_model(model, lambda mg: mg.graph_def.node.add(name="orphan_py_func", op="PyFunc"))
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.subject) == ("code_execution_op", "orphan_py_func")
    assert "on no path of a signature or of the loader" in risk.message


def _called_function(node) -> str:
    return node.attr["f"].func.name


def test_read_file_in_a_function_a_signature_calls_is_a_risk(keras_dir, model_copy):
    model = model_copy(keras_dir)
    target = {}

    def add_read_file(meta_graph):
        graph_def = meta_graph.graph_def
        output = meta_graph.signature_def["serving_default"].outputs["output_0"].name
        call = next(n for n in graph_def.node if n.name == output.split(":")[0])
        functions = {f.signature.name: f for f in graph_def.library.function}
        wrapper = functions[_called_function(call)]
        # One level deeper: the wrapper calls the model's __call__ function.
        inner = next(n for n in wrapper.node_def if n.op.endswith("PartitionedCall"))
        body = functions[_called_function(inner)]
        body.node_def.add(name="sneaky_read", op="ReadFile", input=["whatever:output:0"])
        target["label"] = f"{body.signature.name}/sneaky_read"

    edit_saved_model(model, add_read_file)
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.subject) == ("file_read_op", target["label"])


def test_read_file_in_the_saver_function_is_a_risk(keras_dir, model_copy):
    model = model_copy(keras_dir)

    def add_read_file(meta_graph):
        graph_def = meta_graph.graph_def
        save_node = meta_graph.saver_def.save_tensor_name.split(":")[0]
        call = next(n for n in graph_def.node if n.name == save_node)
        saver = next(
            f for f in graph_def.library.function if f.signature.name == _called_function(call)
        )
        saver.node_def.add(name="saver_read", op="ReadFile")

    edit_saved_model(model, add_read_file)
    # The saver is accepted only in the shape tf.saved_model.save writes: the ReadFile is
    # a finding, and so are the saver's own checkpoint ops.
    risks = {r.subject: r for r in inspection.inspect_saved_model(model).risks}
    (read,) = [r for s, r in risks.items() if s.endswith("/saver_read")]
    assert read.code == "file_read_op" and "saver_def.save_tensor_name" in read.message
    save = next(r for s, r in risks.items() if s.endswith("/SaveV2"))
    assert "also runs ReadFile 'saver_read'" in save.message


def _set_asset_filename(filename: str):
    def edit(meta_graph):
        from tensorflow.core.protobuf import meta_graph_pb2

        packed = meta_graph.collection_def["saved_model_assets"].any_list.value[0]
        asset = meta_graph_pb2.AssetFileDef()
        packed.Unpack(asset)
        asset.filename = filename
        packed.Pack(asset)

    return edit


@pytest.mark.parametrize("filename", ["../../etc/passwd", "/etc/passwd", "sub/../../x"])
def test_asset_escaping_the_assets_dir_is_a_risk(classifier_dir, model_copy, filename):
    model = model_copy(classifier_dir)
    edit_saved_model(model, _set_asset_filename(filename))
    report = inspection.inspect_saved_model(model)
    (risk,) = report.risks
    assert (risk.code, risk.severity, risk.subject) == ("asset_path_escapes", "error", filename)
    # The escaping path is never looked at, even where it exists (/etc/passwd).
    assert report.meta_graphs[0].assets[0].size_bytes is None


def test_asset_name_with_harmless_dots_is_not_a_risk(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    edit_saved_model(model, _set_asset_filename("./vocab.txt"))
    assert inspection.inspect_saved_model(model).risks == ()


def test_asset_name_with_dot_dot_inside_assets_is_a_risk(classifier_dir, model_copy):
    """The kernel resolves sub/.. after following sub, wherever a link sends it."""
    model = model_copy(classifier_dir)
    os.mkdir(os.path.join(model, "assets", "sub"))
    edit_saved_model(model, _set_asset_filename("sub/../vocab.txt"))
    (risk,) = inspection.inspect_saved_model(model).risks
    assert risk.code == "asset_path_escapes" and "'..' component" in risk.message


def test_missing_asset_file_is_a_risk(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    os.remove(os.path.join(model, "assets", "vocab.txt"))
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.severity, risk.subject) == ("asset_missing", "error", "vocab.txt")


def test_signature_naming_a_missing_node_is_a_risk(classifier_dir, model_copy):
    model = model_copy(classifier_dir)

    def dangle(meta_graph):
        meta_graph.signature_def["predict"].outputs["logits"].name = "no_such_node:0"

    edit_saved_model(model, dangle)
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.severity, risk.subject) == (
        "signature_tensor_missing", "error", "predict/output/logits",
    )
    assert "no_such_node:0" in risk.message


def test_sparse_and_composite_tensor_infos_are_reported(classifier_dir, model_copy):
    model = model_copy(classifier_dir)

    def add_signature(meta_graph):
        sig = meta_graph.signature_def["odd"]
        sig.method_name = "tensorflow/serving/predict"
        sparse = sig.inputs["ids"]
        sparse.dtype = 9  # DT_INT64
        sparse.tensor_shape.dim.add(size=-1)
        sparse.coo_sparse.values_tensor_name = "class_ids:0"
        sparse.coo_sparse.indices_tensor_name = "missing_indices:0"
        sparse.coo_sparse.dense_shape_tensor_name = "class_ids:0"
        ragged = sig.outputs["ragged"]
        ragged.composite_tensor.components.add(name="logits:0", dtype=1)
        ragged.composite_tensor.components.add(name="class_ids:0", dtype=9)

    edit_saved_model(model, add_signature)
    report = inspection.inspect_saved_model(model)
    sig = _signature(report, "odd")
    (ids,), (ragged,) = sig.inputs, sig.outputs
    assert (ids.encoding, ids.dtype, ids.shape, ids.name, ids.components) == (
        "coo_sparse", "int64", (-1,), None,
        ("class_ids:0", "missing_indices:0", "class_ids:0"),
    )
    assert (ragged.encoding, ragged.dtype, ragged.shape, ragged.components) == (
        "composite_tensor", None, None, ("logits:0", "class_ids:0"),
    )
    assert json.loads(report.to_json())["meta_graphs"][0]["signatures"][1]["outputs"][0][
        "shape"] == "unknown rank"
    (risk,) = report.risks
    assert (risk.code, risk.subject) == ("signature_tensor_missing", "odd/input/ids")


def test_variable_at_the_protobuf_limit_is_a_risk(classifier_dir, monkeypatch):
    values = _checkpoint(classifier_dir)
    limit = max(v.nbytes for v in values.values())
    monkeypatch.setattr(inspection, "PROTOBUF_LIMIT_BYTES", limit)
    risks = _risks(inspection.inspect_saved_model(classifier_dir), "variable_over_2gib")
    assert {r.subject for r in risks} == {k for k, v in values.items() if v.nbytes >= limit}


def test_variables_plus_graph_over_the_protobuf_limit_is_a_risk(classifier_dir, monkeypatch):
    values = _checkpoint(classifier_dir)
    graph_bytes = read_saved_model(classifier_dir).meta_graphs[0].graph_def.ByteSize()
    frozen = sum(v.nbytes for v in values.values()) + graph_bytes
    monkeypatch.setattr(inspection, "PROTOBUF_LIMIT_BYTES", frozen + 1)
    assert not _risks(inspection.inspect_saved_model(classifier_dir), "frozen_graph_over_2gib")
    monkeypatch.setattr(inspection, "PROTOBUF_LIMIT_BYTES", frozen)
    (risk,) = _risks(inspection.inspect_saved_model(classifier_dir), "frozen_graph_over_2gib")
    assert risk.tags == ("serve",)


def test_unreadable_checkpoint_is_a_risk_not_a_crash(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    with open(os.path.join(model, "variables", "variables.index"), "wb") as f:
        f.write(b"this is not a checkpoint index")
    report = inspection.inspect_saved_model(model)
    assert report.variables.status == "unreadable"
    (risk,) = report.risks
    assert (risk.code, risk.severity, risk.tags) == ("variables_unreadable", "error", None)


def test_model_without_variables_reports_them_absent(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    for name in os.listdir(os.path.join(model, "variables")):
        os.remove(os.path.join(model, "variables", name))
    variables = inspection.inspect_saved_model(model).variables
    assert (variables.status, variables.count, variables.total_bytes) == ("absent", 0, 0)


# -------------------------------------------------------------------------- tags, errors


def test_all_meta_graphs_by_default_and_one_with_tags(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    saved_model = read_saved_model(model)
    gpu = saved_model.meta_graphs.add()
    gpu.CopyFrom(saved_model.meta_graphs[0])
    gpu.meta_info_def.ClearField("tags")
    gpu.meta_info_def.tags.extend(["serve", "gpu"])
    with open(os.path.join(model, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())

    everything = inspection.inspect_saved_model(model)
    assert [m.tags for m in everything.meta_graphs] == [("serve",), ("gpu", "serve")]
    only_gpu = inspection.inspect_saved_model(model, tags="gpu, serve")
    assert [m.tags for m in only_gpu.meta_graphs] == [("gpu", "serve")]


def test_missing_tag_raises_naming_the_available_ones(classifier_dir):
    with pytest.raises(ServingOptError, match=r"no MetaGraph tagged gpu.*--saved_model_tags=serve"):
        inspection.inspect_saved_model(classifier_dir, tags="gpu")


def test_report_is_immutable(classifier_report):
    with pytest.raises(AttributeError):
        classifier_report.path = "elsewhere"
