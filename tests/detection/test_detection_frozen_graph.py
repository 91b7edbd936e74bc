"""The OD-API-shaped detection sample, and a frozen GraphDef in (to a SavedModel) and out
(``--output_format=graphdef``): real TensorFlow, models built in seconds."""

from __future__ import annotations

import os

import numpy as np
import pytest

from serving_opt.detection import network
from serving_opt.detection import sample as detection_sample
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.savedmodel import frozen_graph, loader
from serving_opt.savedmodel.graph import ServingGraph

OUTPUTS = list(network.OUTPUT_NODES)


@pytest.fixture(scope="module")
def converted(detection_model, tmp_path_factory):
    export_dir = str(tmp_path_factory.mktemp("converted") / "1")
    return frozen_graph.convert(detection_model.frozen_graph, export_dir, outputs=OUTPUTS)


def _run_saved_model(export_dir: str, images) -> dict:
    sess, meta_graph = loader.load_session(export_dir)
    try:
        signature = meta_graph.signature_def["serving_default"]
        return sess.run({k: v.name for k, v in signature.outputs.items()},
                        {signature.inputs["inputs"].name: images})
    finally:
        sess.close()


# ------------------------------------------------------------------------------ sample


def test_the_sample_detects_on_real_sized_frames(detection_model):
    small = detection_sample.run_frozen_graph(detection_model.frozen_graph,
                                              detection_sample.frame(480, 640))
    assert detection_model.detections == 9 and int(small["num_detections"][0]) == 9
    large = detection_sample.run_frozen_graph(detection_model.frozen_graph,
                                              detection_sample.frame(720, 1280))
    for out in (small, large):
        n = int(out["num_detections"][0])
        assert n > 0
        assert out["detection_boxes"].shape == (1, network.MAX_DETECTIONS, 4)
        assert out["detection_scores"].shape == out["detection_classes"].shape == \
            (1, network.MAX_DETECTIONS)
        assert all(v.dtype == np.float32 for v in out.values())
        scores = out["detection_scores"][0, :n]
        assert (scores >= network.SCORE_THRESHOLD).all()
        assert (np.diff(scores) <= 0).all()  # best first
        assert set(out["detection_classes"][0, :n]) <= {1.0, 2.0, 3.0, 4.0}
        boxes = out["detection_boxes"][0, :n]
        assert (boxes >= 0).all() and (boxes <= 1).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()


def test_the_sample_has_the_ops_of_an_od_api_graph(detection_graph_def):
    ops = [n.op for n in detection_graph_def.node]
    assert ops.count("FusedBatchNormV3") == 2
    assert ops.count("Rsqrt") == 3  # three old-style unfused batch norms
    assert ops.count("CheckNumerics") == 1
    assert ops.count("CombinedNonMaxSuppression") == 1
    assert "ResizeBilinear" in ops
    image = next(n for n in detection_graph_def.node if n.name == "image_tensor")
    assert image.op == "Placeholder" and image.attr["dtype"].type == 4  # uint8
    assert [d.size for d in image.attr["shape"].shape.dim] == [-1, -1, -1, 3]


def test_the_sample_has_near_ties(detection_model):
    assert len(detection_model.near_ties) == 2
    for tie in detection_model.near_ties:
        assert 0 <= tie.rank < detection_model.detections
        assert tie.iou > network.IOU_THRESHOLD
        assert tie.logit_gap < 1e-5  # a few ulp of a logit around 1
    assert "near-ties: rank" in detection_model.summary()


def test_the_saved_model_is_the_od_api_export(detection_model):
    meta_graph = loader.find_meta_graph(loader.read_saved_model(detection_model.saved_model_dir),
                                        {"serve"})
    signature = meta_graph.signature_def["serving_default"]
    assert list(signature.inputs) == ["inputs"]
    assert sorted(signature.outputs) == sorted(OUTPUTS)
    assert signature.method_name == loader.METHOD_PREDICT
    assert os.path.exists(os.path.join(detection_model.saved_model_dir, "variables",
                                       "variables.index"))


def test_frames_are_deterministic_and_scale():
    a, b = detection_sample.frame(48, 64, seed=3), detection_sample.frame(48, 64, seed=3)
    assert a.dtype == np.uint8 and a.shape == (1, 48, 64, 3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, detection_sample.frame(48, 64, seed=4))
    assert detection_sample.frame(48, 64, batch=3).shape == (3, 48, 64, 3)


# -------------------------------------------------------------------------- graphdef in


def test_interface_lists_candidates(detection_graph_def):
    found = frozen_graph.interface(detection_graph_def)
    assert [c.describe() for c in found.inputs] == ["image_tensor:0 (uint8 [?,?,?,3])"]
    assert sorted(c.name for c in found.outputs) == sorted(f"{n}:0" for n in OUTPUTS)
    boxes = next(c for c in found.outputs if c.name == "detection_boxes:0")
    assert (boxes.dtype, boxes.shape) == ("float32", (-1, 100, 4))
    assert found.lines()[0] == "candidate inputs:  image_tensor:0 (uint8 [?,?,?,3])"


def test_names_resolve_with_or_without_index(detection_graph_def):
    ins, outs = frozen_graph.resolve(detection_graph_def, None, "detection_boxes, num_detections:0")
    assert ins == ["image_tensor:0"]
    assert outs == ["detection_boxes:0", "num_detections:0"]
    assert frozen_graph.resolve(detection_graph_def, "image_tensor:0", ["detection_scores"])[0] == \
        ["image_tensor:0"]
    # A node's second output.
    nms = next(n.name for n in detection_graph_def.node if n.op == "CombinedNonMaxSuppression")
    assert frozen_graph.resolve(detection_graph_def, None, f"{nms}:1")[1] == [f"{nms}:1"]


@pytest.mark.parametrize("inputs,outputs,message", [
    (None, None, "does not say which tensors are its outputs (candidates: detection_"),
    ("image", "detection_boxes", "--inputs names 'image', which is not a node of x.pb "
     "(candidate inputs: image_tensor)"),
    (None, "detection_box", "--outputs names 'detection_box', which is not a node of x.pb "
     "(candidate outputs: "),
    (None, "detection_boxes:3", "--outputs names detection_boxes:3, but detection_boxes "
     "(Identity) has 1 output(s)"),
    (None, "detection_boxes:a", "a tensor is node:index"),
    (None, "^detection_boxes", "a control input, not a tensor"),
    ("image_tensor", "image_tensor", "is both an input and an output"),
])
def test_resolution_errors_list_the_candidates(detection_graph_def, inputs, outputs, message):
    with pytest.raises(UsageError) as raised:
        frozen_graph.resolve(detection_graph_def, inputs, outputs, "x.pb")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_missing_outputs_suggest_every_candidate(detection_graph_def):
    with pytest.raises(UsageError, match="pass --outputs, e.g. --outputs=detection_boxes,"):
        frozen_graph.resolve(detection_graph_def)


def test_several_placeholders_need_inputs():
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    for name in ("a", "b"):
        graph_def.node.add(name=name, op="Placeholder").attr["dtype"].type = 1
    add = graph_def.node.add(name="sum", op="AddV2", input=["a", "b"])
    add.attr["T"].type = 1
    with pytest.raises(UsageError, match=r"has 2 Placeholders \(a:0 \(float32 \[...\]\), "
                                         r"b:0 .*pass --inputs"):
        frozen_graph.resolve(graph_def)
    # The only node nothing consumes is the output.
    assert frozen_graph.resolve(graph_def, "a,b") == (["a:0", "b:0"], ["sum:0"])
    keys_in, keys_out = frozen_graph.signature_keys(["a:0", "b:0"], ["sum:0"])
    assert keys_in == {"a": "a:0", "b": "b:0"} and keys_out == {"sum": "sum:0"}


def test_signature_keys():
    assert frozen_graph.signature_keys(["image_tensor:0"], ["detection_boxes:0", "x:1"]) == (
        {"inputs": "image_tensor:0"}, {"detection_boxes": "detection_boxes:0", "x:1": "x:1"})
    assert frozen_graph.signature_keys(["image_tensor:0"], ["y:0"], "images")[0] == \
        {"images": "image_tensor:0"}
    with pytest.raises(UsageError, match="one distinct key per input"):
        frozen_graph.signature_keys(["a:0", "b:0"], ["y:0"], "x,x")


def test_converted_saved_model_answers_like_the_graph_def(detection_model, converted):
    assert converted.inputs == {"inputs": "image_tensor:0"}
    assert converted.outputs == {n: f"{n}:0" for n in OUTPUTS}
    assert converted.dropped == 0
    assert not os.listdir(os.path.join(converted.export_dir, "variables"))
    for shape in ((480, 640), (720, 1280)):
        images = detection_sample.frame(*shape, seed=2)
        served = _run_saved_model(converted.export_dir, images)
        session = detection_sample.run_frozen_graph(detection_model.frozen_graph, images)
        for name in OUTPUTS:
            np.testing.assert_array_equal(served[name], session[name], err_msg=name)
        assert served["num_detections"][0] > 0


def test_converted_signature(converted):
    meta_graph = loader.find_meta_graph(loader.read_saved_model(converted.export_dir),
                                        {"serve"})
    signature = meta_graph.signature_def["serving_default"]
    assert signature.method_name == loader.METHOD_PREDICT
    assert signature.inputs["inputs"].dtype == 4
    assert [d.size for d in signature.inputs["inputs"].tensor_shape.dim] == [-1, -1, -1, 3]
    assert [d.size for d in signature.outputs["detection_boxes"].tensor_shape.dim] == \
        [-1, 100, 4]
    assert loader.find_init_op(meta_graph) is None


def test_unused_nodes_are_dropped(detection_model, tmp_path):
    export = frozen_graph.convert(detection_model.frozen_graph, str(tmp_path / "1"),
                              outputs="num_detections", input_keys="images")
    assert export.inputs == {"images": "image_tensor:0"}
    assert export.dropped > 0 and export.nodes > 0


def test_the_converted_model_passes_the_static_check(converted):
    """The SavedModel goes through the same static check as any input (no host op)."""
    from serving_opt.savedmodel import untrusted

    meta_graph = loader.find_meta_graph(loader.read_saved_model(converted.export_dir),
                                        {"serve"})
    assert untrusted.host_op_uses(meta_graph) == []


def _graph_with_write_file():
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None], name="x")
        write = tf.io.write_file(tf.constant("/tmp/serving_opt_never_written"),
                                 tf.constant("x"), name="write_it")
        with tf.control_dependencies([write]):
            tf.identity(x * 2.0, name="y")
    return graph.as_graph_def()


def test_a_graph_def_with_a_host_op_is_refused(tmp_path):
    path = tmp_path / "frozen.pb"
    path.write_bytes(_graph_with_write_file().SerializeToString())
    with pytest.raises(ServingOptError, match="WriteFile node 'write_it'.*refusing to convert"):
        frozen_graph.convert(str(path), str(tmp_path / "1"))
    assert not (tmp_path / "1").exists()
    assert not os.path.exists("/tmp/serving_opt_never_written")


def test_an_unfrozen_graph_is_refused():
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        w = v1.Variable(np.ones((2, 1), np.float32), name="w", use_resource=False)
        tf.matmul(x, w, name="y")
    with pytest.raises(ServingOptError, match="is not frozen: its outputs read variable w"):
        frozen_graph.to_serving_graph(graph.as_graph_def(), "x", "y", path="g.pb")


@pytest.mark.parametrize("make,message", [
    (lambda d: str(d), "is a directory, not a GraphDef file"),
    (lambda d: str(d / "missing.pb"), "does not exist"),
    (lambda d: _write(d / "saved_model.pb", b"\x08\x01"), "is a SavedModel's saved_model.pb"),
    (lambda d: _write(d / "graph.pbtxt", b"node {}"), "neither a SavedModel directory nor"),
    (lambda d: _write(d / "garbage.pb", b"\xff\xff\xff\xff"), "is not a binary GraphDef"),
    (lambda d: _write(d / "empty.pb", b""), "holds no graph (0 nodes, 0 bytes)"),
    (lambda d: _fifo(d / "fifo.pb"), "is a named pipe (FIFO), not a regular file"),
])
def test_files_that_are_no_graph_def_are_refused(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ServingOptError) as raised:
        frozen_graph.read_graph_def(path)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert raised.value.fix


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


def test_is_graph_def_path(tmp_path, detection_model):
    assert frozen_graph.is_graph_def_path(detection_model.frozen_graph)
    assert not frozen_graph.is_graph_def_path(detection_model.saved_model_dir)
    assert not frozen_graph.is_graph_def_path(os.path.join(detection_model.saved_model_dir,
                                                       "saved_model.pb"))


# ------------------------------------------------------------------------- graphdef out


def test_write_graph_def_from_a_frozen_saved_model(converted, detection_model, tmp_path):
    written = frozen_graph.write_graph_def(frozen_graph.saved_model_graph(converted.export_dir),
                                       str(tmp_path / "out" / "model.pb"))
    assert written.inputs == {"inputs": "image_tensor:0"}
    assert set(written.outputs.values()) == {f"{n}:0" for n in OUTPUTS}
    assert written.line().startswith(f"wrote {tmp_path}/out/model.pb (")
    assert not [f for f in os.listdir(tmp_path / "out") if ".tmp" in f]
    images = detection_sample.frame(seed=5)
    again = detection_sample.run_frozen_graph(written.path, images)
    original = detection_sample.run_frozen_graph(detection_model.frozen_graph, images)
    for name in OUTPUTS:
        np.testing.assert_array_equal(again[name], original[name])


def test_write_graph_def_refuses_kept_variables(detection_model, tmp_path):
    kept = frozen_graph.saved_model_graph(detection_model.saved_model_dir)
    assert kept.variables_dir
    with pytest.raises(ServingOptError, match="needs a frozen model, and this one keeps its "
                                              "variables.*--freeze=always"):
        frozen_graph.write_graph_def(kept, str(tmp_path / "model.pb"))
    assert not os.path.exists(tmp_path / "model.pb")


def test_write_graph_def_refuses_an_init_op(detection_graph_def, tmp_path):
    graph = frozen_graph.to_serving_graph(detection_graph_def, outputs=OUTPUTS)
    with_init = ServingGraph(graph.graph_def, graph.signature_defs, graph.tags,
                             init_op="init_all_tables", init_op_source="main_op")
    with pytest.raises(ServingOptError, match="cannot carry the model's init op "
                                              "init_all_tables"):
        frozen_graph.write_graph_def(with_init, str(tmp_path / "model.pb"))
