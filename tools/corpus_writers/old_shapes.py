"""Hand-built SavedModels in the shapes older TensorFlow writers produced (issue 29).

TensorFlow < 2.12 does not install on Python 3.11, so these are written by the current
TensorFlow (the project's .venv) and then, where needed, edited to the older shape. Each
model says below what was changed and which writer it mirrors. Run:

    .venv/bin/python tools/corpus_writers/old_shapes.py --out tests/corpus/models/handbuilt

Models:
  tf24_keras         tf.saved_model.save of a small Dense model, its saver_def's save call
                     rewritten to take `<var>/Read/ReadVariableOp` values (TF 2.0-2.4 shape).
  tf1_saver_v1       TF1 graph whose Saver is write_version=V1 (SaveSlices; restored with
                     RestoreV2, which reads V1; a single `variables/variables` file).
  tf1_sharded_saver  TF1 graph with tf.compat.v1.train.Saver(sharded=True) over two device
                     groups (two shards), as Estimator's Scaffold saver writes.
  tf10_noshape       TF 1.0 shape: signature TensorInfos without tensor_shape, the init op in
                     the `legacy_init_op` collection, assets in the `saved_model_assets`
                     collection instead of MetaGraphDef.asset_file_def.
  absent_asset       TF1 graph declaring an asset (asset_file_def) whose file is not in
                     assets/ and that no op reads.
  tf1_tagless        TF1 graph whose MetaGraph has no tags, as old TF Hub exports have
                     (the Builder insists on tags: the list is emptied in the proto).
  tfx_dead_initializer
                     TF1 Estimator-style graph with an asset vocabulary table, plus what
                     TFX's Trainer (TF 2.9) left in its library: a TF2 table initializer
                     `__inference_<lambda>_N` (InitializeTableFromTextFileV2) nothing calls.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2, saver_pb2  # noqa: E402

v1 = tf.compat.v1
SEED = 29


def rng(offset):
    return np.random.RandomState(SEED + offset)


def read_sm(path):
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    return sm


def write_sm(path, sm):
    with open(os.path.join(path, "saved_model.pb"), "wb") as f:
        f.write(sm.SerializeToString(deterministic=True))
    fingerprint = os.path.join(path, "fingerprint.pb")
    if os.path.exists(fingerprint):
        os.remove(fingerprint)  # it hashes the old saved_model.pb; TF < 2.12 wrote none


# --------------------------------------------------------------------------- tf24_keras


def tf24_keras(path):
    """TF 2.0-2.4 tf.saved_model.save: the save function gets variable *values*.

    Mirrors, at v2.0.0-v2.4.x:
      - tensorflow/python/training/saving/saveable_object_util.py, saveable_objects_for_op:
        for a BaseResourceVariable in graph mode `variable = op._graph_element` (the
        `<var>/Read/ReadVariableOp` tensor made with the variable), then
        ResourceVariableSaveable(Tensor) sets `handle_op = var.op.inputs[0]; tensor = var`,
        so the SaveSpec's tensor is that read value;
      - tensorflow/python/training/saving/functional_saver.py, MultiDeviceSaver.to_proto /
        _traced_save: the save function is traced in the exported graph and captures those
        SaveSpec tensors, so the `StatefulPartitionedCall_1` of saver_def.save_tensor_name is
        fed `<var>/Read/ReadVariableOp` (float) instead of the VarHandleOp (resource), and
        its FunctionDef's args are float (named `savev2_<var>_read_readvariableop`), passed
        straight into SaveV2 (_SingleDeviceSaver.save: `tensors.append(spec.tensor)`).
      - the restore function keeps taking the handles (ResourceVariableSaveable.restore
        assigns to `handle_op`).
    TF >= 2.5 passes the handles and reads inside the function (with DisableCopyOnRead
    from 2.13 on); this script saves with the current TF and undoes that: outer call
    inputs -> the ReadVariableOps, arg types resource -> the variable dtype, the in-function
    DisableCopyOnRead/ReadVariableOp/Identity chain removed. Nothing else is changed.
    """
    r = rng(10)
    layer_names = ["dense", "dense_1"]
    shapes = [((3, 4), (4,)), ((4, 1), (1,))]

    class DenseModel(tf.Module):
        def __init__(self):
            super().__init__(name="sequential")
            self.vars = []
            for name, (k, b) in zip(layer_names, shapes):
                self.vars.append((
                    tf.Variable(r.normal(0, 0.5, k).astype(np.float32), name=f"{name}/kernel"),
                    tf.Variable(r.normal(0, 0.1, b).astype(np.float32), name=f"{name}/bias")))

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="dense_input")])
        def serve(self, x):
            (k0, b0), (k1, b1) = self.vars
            h = tf.nn.relu(tf.matmul(x, k0) + b0)
            return {"dense_1": tf.matmul(h, k1) + b1}

    model = DenseModel()
    tf.saved_model.save(model, path, signatures={"serving_default": model.serve})
    sm = read_sm(path)
    mg = sm.meta_graphs[0]
    graph = mg.graph_def
    nodes = {n.name: n for n in graph.node}
    call = nodes[mg.saver_def.save_tensor_name.split(":")[0]]
    fdef = next(f for f in graph.library.function if f.signature.name == call.attr["f"].func.name)
    changed = []
    for i, inp in enumerate(call.input):
        producer = nodes.get(inp.split(":")[0].lstrip("^"))
        if producer is None or producer.op != "VarHandleOp":
            continue
        read = producer.name + "/Read/ReadVariableOp"
        if read not in nodes:
            raise RuntimeError(f"no {read} in the graph")
        call.input[i] = read
        arg = fdef.signature.input_arg[i]
        dtype = producer.attr["dtype"].type
        old_name = arg.name
        arg.name = "savev2_" + re.sub(r"[^a-z0-9]+", "_", read.lower())
        arg.type = dtype
        arg.ClearField("handle_data")
        call.attr["Tin"].list.type[i] = dtype
        if i in fdef.resource_arg_unique_id:
            del fdef.resource_arg_unique_id[i]
        changed.append((i, old_name, arg.name))
    if not changed:
        raise RuntimeError("the save call takes no VarHandleOp: nothing to rewrite")
    if "_read_only_resource_inputs" in call.attr:
        keep = [j for j in call.attr["_read_only_resource_inputs"].list.i
                if j not in {c[0] for c in changed}]
        del call.attr["_read_only_resource_inputs"].list.i[:]
        call.attr["_read_only_resource_inputs"].list.i.extend(keep)
    # Inside the function: arg -> [DisableCopyOnRead] -> ReadVariableOp -> Identity* -> SaveV2.
    renamed = {old: new for _, old, new in changed}
    alias = {}  # tensor reference inside the function -> arg name
    removed = set()
    for n in fdef.node_def:
        data_inputs = [x for x in n.input if not x.startswith("^")]
        reads_arg = bool(data_inputs) and data_inputs[0] in renamed
        if n.op in ("ReadVariableOp", "DisableCopyOnRead") and reads_arg:
            removed.add(n.name)
            if n.op == "ReadVariableOp":
                alias[n.name + ":value:0"] = renamed[data_inputs[0]]
    grew = True
    while grew:
        grew = False
        for n in fdef.node_def:
            if n.op == "Identity" and n.name not in removed and n.input and n.input[0] in alias:
                alias[n.name + ":output:0"] = alias[n.input[0]]
                removed.add(n.name)
                grew = True
    kept = [n for n in fdef.node_def if n.name not in removed]
    for n in kept:
        new_inputs = []
        for x in n.input:
            if x.startswith("^"):
                if x[1:] not in removed:
                    new_inputs.append(x)
            else:
                new_inputs.append(alias.get(x, renamed.get(x, x)))
        del n.input[:]
        n.input.extend(new_inputs)
    del fdef.node_def[:]
    fdef.node_def.extend(kept)
    for key in [k for k in fdef.control_ret if k in removed]:
        del fdef.control_ret[key]
    outs = [c for c in fdef.signature.control_output if c not in removed]
    del fdef.signature.control_output[:]
    fdef.signature.control_output.extend(outs)
    write_sm(path, sm)
    return {
        "writer": "tf.saved_model.save (TF 2.21), save function rewritten to the TF 2.0-2.4 shape",
        "notes": ("saver_def save call StatefulPartitionedCall_1 takes <var>/Read/ReadVariableOp "
                  "float "
                  "values, FunctionDef args savev2_*_read_readvariableop feed SaveV2 directly, as "
                  "saveable_object_util.saveable_objects_for_op (_graph_element) + "
                  "functional_saver._traced_save wrote them in TF 2.0-2.4; restore still takes "
                  "handles. "
                  "Rewritten args: " + ", ".join(f"{o}->{n}" for _, o, n in changed)),
    }


# --------------------------------------------------------------------------- TF1 graphs


def _tf1_graph(r, device_split=False):
    """x [None, 1] float -> y = x * a + b (half_plus_two-like) plus a second output."""
    x = v1.placeholder(tf.float32, [None, 1], name="x")
    with tf.device("/device:CPU:0" if device_split else None):
        a = v1.get_variable("a", initializer=np.float32(0.5))
    b = v1.get_variable("b", initializer=np.float32(2.0))
    c = v1.get_variable("c", initializer=r.normal(0, 1, (1, 3)).astype(np.float32))
    y = tf.add(x * a, b, name="y")
    z = tf.matmul(x, c, name="z")
    return x, y, z


def regression_sig(examples, output):
    return v1.saved_model.signature_def_utils.regression_signature_def(examples, output)


def _predict_sig(inputs, outputs):
    return v1.saved_model.signature_def_utils.predict_signature_def(inputs, outputs)


def tf1_saver_v1(path):
    graph = tf.Graph()
    with graph.as_default():
        x, y, z = _tf1_graph(rng(11))
        saver = v1.train.Saver(write_version=saver_pb2.SaverDef.V1, sharded=False)
        ops = sorted({n.op for n in graph.as_graph_def().node})
        # tf.compat.v1's BaseSaverBuilder writes V1 with SaveSlices but restores with
        # RestoreV2 (which reads V1 files too); TF 1.x did the same from 1.0 on.
        if "SaveSlices" not in ops:
            raise RuntimeError(f"tf.compat.v1 Saver V1 built no SaveSlices: {ops}")
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": _predict_sig({"x": x}, {"y": y, "z": z})},
                saver=saver, strip_default_attrs=True)
            builder.save()
    return {"writer": "tf.compat.v1.saved_model.Builder with "
                      "tf.compat.v1.train.Saver(write_version=V1)",
            "notes": "saver_def.version V1: save/SaveSlices writes, save/RestoreV2 restores "
                     "(tf.compat.v1 "
                     "builds no RestoreSlice); variables/variables is one V1 checkpoint file "
                     "(no .index/.data)"}


def tf1_sharded_saver(path):
    graph = tf.Graph()
    with graph.as_default():
        x, y, z = _tf1_graph(rng(12), device_split=True)
        saver = v1.train.Saver(sharded=True, allow_empty=True, max_to_keep=5)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": _predict_sig({"x": x}, {"y": y}),
                    "z": _predict_sig({"x": x}, {"z": z})},
                saver=saver, strip_default_attrs=True)
            builder.save()
    return {"writer": "tf.compat.v1.saved_model.Builder with "
                      "tf.compat.v1.train.Saver(sharded=True)",
            "notes": "variables on two device groups (/device:CPU:0 and unplaced): two shards, "
                     "save/ShardedFilename_1, save/SaveV2_1, save/restore_shard_1, "
                     "save/restore_all"}


def tf10_noshape(path):
    """TF 1.0's writer shape (compare TF Serving's saved_model_half_plus_three, TF 1.0.0-rc2).

    TF 1.0 utils.build_tensor_info set only name and dtype; the init op went to the
    `legacy_init_op` collection; assets were AssetFileDefs in the `saved_model_assets`
    collection (MetaGraphDef.asset_file_def did not exist). Written with the current
    Builder, then: tensor_shape cleared from every TensorInfo, asset_file_def moved to the
    `saved_model_assets` collection, `saved_model_main_op` renamed `legacy_init_op`.
    """
    tmp = tempfile.mkdtemp()
    vocab = os.path.join(tmp, "foo.txt")
    with open(vocab, "w") as f:
        f.write("asset-file-contents")
    graph = tf.Graph()
    with graph.as_default():
        x, y, z = _tf1_graph(rng(13))
        # As half_plus_three's regress signature: tf.Examples parsed into x, the same math.
        tf_example = v1.placeholder(tf.string, name="tf_example")
        parsed = v1.parse_example(tf_example, {"x": v1.FixedLenFeature([1], tf.float32)})
        with v1.variable_scope("", reuse=True):
            y_regress = tf.add(parsed["x"] * v1.get_variable("a"), v1.get_variable("b"),
                               name="y_regress")
        asset = tf.constant(vocab, name="asset_filepath")
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset)
        init = tf.group(v1.tables_initializer(), name="init_all_tables")
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": _predict_sig({"x": x}, {"y": y}),
                    "tensorflow/serving/regress": regression_sig(tf_example, y_regress)},
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=init, strip_default_attrs=True)
            builder.save()
    shutil.rmtree(tmp)
    sm = read_sm(path)
    mg = sm.meta_graphs[0]
    for sig in mg.signature_def.values():
        for info in list(sig.inputs.values()) + list(sig.outputs.values()):
            info.ClearField("tensor_shape")
    assets = mg.collection_def["saved_model_assets"].any_list
    for a in mg.asset_file_def:
        assets.value.add().Pack(a)
    mg.ClearField("asset_file_def")
    if "saved_model_main_op" in mg.collection_def:
        mg.collection_def["legacy_init_op"].CopyFrom(mg.collection_def["saved_model_main_op"])
        del mg.collection_def["saved_model_main_op"]
    write_sm(path, sm)
    return {"writer": "tf.compat.v1.saved_model.Builder, edited to the TF 1.0 shape",
            "notes": "TensorInfo without tensor_shape (graph placeholder x is [None, 1] float); "
                     "init op in collection legacy_init_op; asset foo.txt declared in collection "
                     "saved_model_assets, no asset_file_def"}


def absent_asset(path):
    tmp = tempfile.mkdtemp()
    vocab = os.path.join(tmp, "unused_vocab.txt")
    with open(vocab, "w") as f:
        f.write("a\nb\n")
    graph = tf.Graph()
    with graph.as_default():
        x, y, z = _tf1_graph(rng(14))
        asset = tf.constant(vocab, name="unused_asset_path")  # no op reads it
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": _predict_sig({"x": x}, {"y": y})},
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer(), strip_default_attrs=True)
            builder.save()
    shutil.rmtree(tmp)
    os.remove(os.path.join(path, "assets", "unused_vocab.txt"))
    if not os.listdir(os.path.join(path, "assets")):
        os.rmdir(os.path.join(path, "assets"))
    return {"writer": "tf.compat.v1.saved_model.Builder, asset file then removed",
            "notes": "asset_file_def declares unused_vocab.txt (tensor unused_asset_path:0), the "
                     "file is not in assets/ and no op consumes the tensor"}


def tf1_tagless(path):
    graph = tf.Graph()
    with graph.as_default():
        x, y, z = _tf1_graph(rng(17))
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                "serving_default": _predict_sig({"x": x}, {"y": y, "z": z})})
            builder.save()
    sm = read_sm(path)
    del sm.meta_graphs[0].meta_info_def.tags[:]
    write_sm(path, sm)
    return {"writer": "tf.compat.v1.saved_model.Builder, tags emptied in the proto",
            "notes": "one MetaGraph with an empty tag set (old TF Hub exports): selected by "
                     "--saved_model_tags='' as saved_model_cli's --tag_set ''"}


def _lambda_table_initializer():
    """What TF 2.3-2.9's tf.saved_model.save traced for a table (``lambda:
    _wrap_initializer(obj)``), the table and the asset path as arguments."""

    def init(table, path):
        tf.raw_ops.InitializeTableFromTextFileV2(
            table_handle=table, filename=path, key_index=-2, value_index=-1)
        return tf.constant(1)

    traced = tf.function(lambda table, path: init(table, path))
    return traced.get_concrete_function(
        tf.TensorSpec([], tf.resource), tf.TensorSpec([], tf.string)).function_def


def tfx_dead_initializer(path):
    """TFX's Trainer loads the Transform graph (a TF2 SavedModel) into the Estimator's
    TF1 graph: its whole function library comes along, the traced table initializer
    included, though the graph initializes its tables its own way. Written with the
    Builder, then that function appended to the library, called by nothing."""
    tmp = tempfile.mkdtemp()
    vocab = os.path.join(tmp, "words.txt")
    with open(vocab, "w") as f:
        f.write("red\ngreen\nblue\n")
    graph = tf.Graph()
    with graph.as_default():
        words = v1.placeholder(tf.string, [None], name="words")
        table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                          tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
            default_value=-1)
        ids = tf.identity(table.lookup(words), name="ids")
        w = v1.get_variable("w", initializer=np.float32(0.25))
        score = tf.identity(tf.cast(ids, tf.float32) * w, name="score")
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={
                    "serving_default": _predict_sig({"words": words},
                                                    {"ids": ids, "score": score})},
                assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
                main_op=v1.tables_initializer(), strip_default_attrs=True)
            builder.save()
    shutil.rmtree(tmp)
    sm = read_sm(path)
    function_def = _lambda_table_initializer()
    sm.meta_graphs[0].graph_def.library.function.add().CopyFrom(function_def)
    write_sm(path, sm)
    return {"writer": "tf.compat.v1.saved_model.Builder, an uncalled traced table "
                      "initializer appended to the library",
            "notes": f"library function {function_def.signature.name} "
                     "(InitializeTableFromTextFileV2 on its arguments) is called by no node, "
                     "function or object graph, as in a TF 2.9 Estimator export by TFX's "
                     "Trainer: dead, not a host op; the graph's own table reads asset "
                     "words.txt from the main op"}


KINDS = {
    "tf24_keras": tf24_keras,
    "tf1_saver_v1": tf1_saver_v1,
    "tf1_sharded_saver": tf1_sharded_saver,
    "tf10_noshape": tf10_noshape,
    "absent_asset": absent_asset,
    "tf1_tagless": tf1_tagless,
    "tfx_dead_initializer": tfx_dead_initializer,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    record_path = os.path.join(args.out, "WRITER.json")
    record = {"models": {}, "skipped": {}}
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
    record["versions"] = {"tensorflow": tf.__version__, "python": sys.version.split()[0]}
    for kind in args.kinds.split(","):
        path = os.path.join(args.out, kind)
        shutil.rmtree(path, ignore_errors=True)
        np.random.seed(SEED)
        tf.random.set_seed(SEED)
        try:
            record["models"][kind] = KINDS[kind](path)
            record["skipped"].pop(kind, None)
            print(f"wrote {kind} -> {path}", flush=True)
        except Exception as e:  # noqa: BLE001  (recorded; the other kinds still run)
            shutil.rmtree(path, ignore_errors=True)
            record["models"].pop(kind, None)
            record["skipped"][kind] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"skipped {kind}: {record['skipped'][kind]}", flush=True)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
