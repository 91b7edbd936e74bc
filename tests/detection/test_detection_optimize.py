"""optimize on a frozen GraphDef (``frozen_inference_graph.pb``) of an Object Detection
API-shaped model: in as a .pb, folded, proven by the detection parity rule, served by
the local server over gRPC and REST (--validate), published with the .pb beside it.

One optimize run is shared by the tests that read its result (module fixture). Its
detections are checked against the original .pb run by plain TensorFlow, by the rule of
tests/independent_check.py (NMS candidates within tolerance; detections paired, except
near-ties the original's own candidates show).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from independent_check import (
    assert_detections_match,
    run_detector_graph_def,
    run_detector_saved_model,
)

from serving_opt import OptimizeOptions, optimize
from serving_opt.detection import network
from serving_opt.detection import sample as detection_sample
from serving_opt.errors import UsageError
from serving_opt.options import (
    GRAPH_DEF_NAME,
    BuildOptions,
    GraphDefOptions,
    InputOptions,
    MeasureOptions,
    OutputOptions,
    ServingCheck,
)
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import frozen_graph, loader
from serving_opt.stages.parity import ParityInputs, check_parity

OUTPUTS = tuple(network.OUTPUT_NODES)
# Folding batch norms moved candidates' boxes and scores by at most 5e-7 (measured on
# the 480x640 and 720x1280 frames below): twenty times that.
SCORE_ATOL = BOX_ATOL = 1e-5
BATCH_NORM_OPS = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
                  "BatchNormWithGlobalNormalization", "Rsqrt"}


def _frames_file(path, height: int, width: int, seeds=(0, 1)) -> str:
    with open(path, "w") as f:
        for seed in seeds:
            f.write(json.dumps({"inputs": detection_sample.frame(height, width, seed=seed)
                                .tolist()}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def published(detection_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("optimized")
    frames = _frames_file(work / "frames.jsonl", 480, 640)
    options = OptimizeOptions(
        validate=ServingCheck(server="local", concurrency=0),
        graph_def=GraphDefOptions(graph_outputs=OUTPUTS), inputs=InputOptions(examples=frames),
        output=OutputOptions(output_format="graphdef"),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False))
    return optimize(detection_model.frozen_graph, str(work / "base"), options)


def _frames(height: int, width: int) -> np.ndarray:
    """One batch: the reference scene (seed 0, whose near-ties the sample made at 480x640)
    and two others."""
    return np.concatenate([detection_sample.frame(height, width, seed=s) for s in (0, 5, 6)])


def _run_both(frozen_graph: str, published_dir: str, images: np.ndarray) -> tuple:
    """(published, original): the published SavedModel as TF Serving loads it, the
    original .pb by import_graph_def, both by plain TensorFlow."""
    return (run_detector_saved_model(published_dir, "serving_default",
                                     detection_sample.INPUT_KEY, images),
            run_detector_graph_def(frozen_graph, f"{network.INPUT_NODE}:0", images,
                                   OUTPUTS))


@pytest.fixture(scope="module")
def original(detection_model, tmp_path_factory) -> str:
    """The original frozen graph wrapped as a SavedModel by the project's converter, for
    the test of the project's own detection gate: converted once."""
    return frozen_graph.convert(detection_model.frozen_graph,
                            str(tmp_path_factory.mktemp("original") / "export"),
                            outputs=OUTPUTS).export_dir


def _ops(saved_model_dir: str) -> set[str]:
    saved_model = loader.read_saved_model(saved_model_dir)
    graph_def = saved_model.meta_graphs[0].graph_def
    return {n.op for n in graph_def.node} | \
        {n.op for f in graph_def.library.function for n in f.node_def}


def test_a_pb_is_published_as_a_servable_version(published):
    assert published.published and published.output_dir.endswith(os.sep + "1")
    assert published.graph_def["input"]["inputs"] == {"inputs": "image_tensor:0"}
    assert sorted(published.graph_def["input"]["outputs"]) == sorted(OUTPUTS)
    assert published.signatures == ("serving_default",)


def test_no_batch_norm_is_left_in_the_served_graph(detection_model, published):
    before = {n.op for n in frozen_graph.read_graph_def(detection_model.frozen_graph).node}
    assert before & BATCH_NORM_OPS  # the sample has both kinds
    assert not _ops(published.output_dir) & BATCH_NORM_OPS


def test_the_local_server_served_it_over_grpc_and_rest(published):
    validation = published.validation
    assert validation is not None and validation.ok
    assert validation.reference_dir == os.path.abspath(published.output_dir)
    assert set(validation.protocols) == {"grpc", "rest"}


def test_the_optimized_pb_is_written_beside_it_and_answers_the_same(published):
    written = os.path.join(published.output_dir, GRAPH_DEF_NAME)
    assert published.graph_def["output"]["file"] == GRAPH_DEF_NAME
    assert not {n.op for n in frozen_graph.read_graph_def(written).node} & BATCH_NORM_OPS
    image = detection_sample.frame(480, 640, seed=3)
    from_pb = detection_sample.run_frozen_graph(written, image)
    served = run_detector_saved_model(published.output_dir, "serving_default",
                                      detection_sample.INPUT_KEY, image)["outputs"]
    for key in OUTPUTS:  # the same graph: the same numbers
        np.testing.assert_array_equal(from_pb[key], served[key])


@pytest.mark.golden
@pytest.mark.parametrize("height,width", [(480, 640), (720, 1280)])
def test_the_published_version_detects_like_the_original_frozen_graph(detection_model, published,
                                                                      height, width):
    found = assert_detections_match(
        *_run_both(detection_model.frozen_graph, published.output_dir, _frames(height, width)),
        score_atol=SCORE_ATOL, box_atol=BOX_ATOL)
    assert found["detections"] >= 3 * 9, found  # not an empty comparison
    if (height, width) == detection_sample.REFERENCE_FRAME:
        # The rule met the sample's ties: a flip there is allowed, not required.
        assert found["near_ties"] >= len(detection_model.near_ties), found


def test_the_independent_rule_fails_on_a_corrupted_weight_and_an_unexplained_flip(
        detection_model, published, tmp_path):
    """The control: a copy of the published version with one folded weight 5% off, and
    the published answer with one detection that is no near-tie moved."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import tensor_util

    images = _frames(*detection_sample.REFERENCE_FRAME)
    good, original = _run_both(detection_model.frozen_graph, published.output_dir, images)
    assert_detections_match(good, original, score_atol=SCORE_ATOL, box_atol=BOX_ATOL)
    corrupted = str(tmp_path / "corrupted")
    shutil.copytree(published.output_dir, corrupted)
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(corrupted, "saved_model.pb")
    with open(pb, "rb") as f:
        saved_model.ParseFromString(f.read())
    node = next(n for n in saved_model.meta_graphs[0].graph_def.node
                if n.op == "Const" and n.name.startswith("FeatureExtractor/Conv2d_3/")
                and len(n.attr["value"].tensor.tensor_shape.dim) == 4)
    weights = tensor_util.MakeNdarray(node.attr["value"].tensor).copy()
    weights[0, 0, 0, :] *= 1.05
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(weights))
    with open(pb, "wb") as f:
        f.write(saved_model.SerializeToString())
    bad, _ = _run_both(detection_model.frozen_graph, corrupted, images)
    with pytest.raises(AssertionError, match="NMS candidate"):
        assert_detections_match(bad, original, score_atol=SCORE_ATOL, box_atol=BOX_ATOL)
    # Past the candidates: the last detection of the second frame (no ties there) moved.
    count = int(original["outputs"]["num_detections"][1])
    good["outputs"]["detection_boxes"][1, count - 1] += 0.01
    with pytest.raises(AssertionError, match="is no near-tie"):
        assert_detections_match(good, original, score_atol=SCORE_ATOL, box_atol=BOX_ATOL)


def test_a_folded_graph_with_a_corrupted_weight_fails_the_detection_gate(detection_model, original,
                                                                       tmp_path):
    from tensorflow.python.framework import tensor_util

    detection_graph_def = frozen_graph.read_graph_def(detection_model.frozen_graph)
    node = next(n for n in detection_graph_def.node
                if n.name == "FeatureExtractor/Conv2d_3/weights")
    weights = tensor_util.MakeNdarray(node.attr["value"].tensor).copy()
    weights[0, 0, 0, :] *= 1.05  # one input channel's taps at one position, 5% off
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(weights))
    corrupted_pb = tmp_path / "corrupted.pb"
    corrupted_pb.write_bytes(detection_graph_def.SerializeToString())
    corrupted = frozen_graph.convert(str(corrupted_pb), str(tmp_path / "corrupted"),
                                 outputs=OUTPUTS).export_dir
    frames = examples_lib.read_examples_file(
        _frames_file(tmp_path / "frames.jsonl", 480, 640))
    report = check_parity(original, corrupted, frozenset({"serve"}), ["serving_default"],
                          inputs=ParityInputs(user_inputs=frames))
    assert not report.ok
    boxes = next(o for o in report.outputs if o.output == "detection_boxes")
    assert "not near-ties" in boxes.detail or "detections" in boxes.detail
    assert not boxes.ok


@pytest.mark.parametrize("options,message", [
    (OptimizeOptions(graph_def=GraphDefOptions(graph_outputs=("detection_boxes",))),
     "--outputs applies to a frozen"),
    (OptimizeOptions(output=OutputOptions(output_format="graphdef"),
                     build=BuildOptions(freeze="never")), "--output_format=graphdef"),
])
def test_pb_flags_are_usage_errors_before_any_work(classifier_dir, tmp_path, options,
                                                   message):
    with pytest.raises(UsageError, match=message):
        optimize(classifier_dir, str(tmp_path / "out"), options)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_pb_usage_errors_name_the_fix(detection_model, tmp_path):
    with pytest.raises(UsageError, match="--signatures with a frozen GraphDef"):
        optimize(detection_model.frozen_graph, str(tmp_path / "out"),
                 OptimizeOptions(build=BuildOptions(signatures=("serving_default",))))
    with pytest.raises(UsageError, match="is not a file"):
        optimize(str(tmp_path / "missing.pb"), str(tmp_path / "out"), OptimizeOptions())


def test_an_output_the_graph_lacks_is_named(detection_model, tmp_path):
    with pytest.raises(UsageError, match="'detection_masks', which is not a node"):
        optimize(detection_model.frozen_graph, str(tmp_path / "out"),
                 OptimizeOptions(
                     graph_def=GraphDefOptions(graph_outputs=("detection_masks",)),
                     measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    assert not [n for n in os.listdir(tmp_path / "out") if not n.startswith(".")]


def test_the_report_says_what_each_transform_pass_did(published):
    from serving_opt.pipeline import report as report_lib
    passes = {line.split(":")[0]: line for line in published.transform_passes}
    assert "2 FusedBatchNorm folded into Conv2D" in passes["fold_old_batch_norms"]
    assert "3 unfused batch norms" in passes["fold_batch_norms"]
    table = report_lib.format_optimize_report(published)
    assert "    pass     fold_old_batch_norms: 2 FusedBatchNorm folded" in table
    assert "graphdef   out: frozen_inference_graph.pb" in table


def test_inspect_lists_a_pbs_candidate_inputs_and_outputs(detection_model, capsys):
    from serving_opt.cli import main as cli

    assert cli.main(["serving-opt", "inspect",
                     f"--saved_model_dir={detection_model.frozen_graph}"]) == 0
    text = capsys.readouterr().out
    assert "candidate inputs:  image_tensor:0 (uint8 [?,?,?,3])" in text
    assert "detection_boxes:0 (float32 [?,100,4])" in text
    assert "pass through CombinedNonMaxSuppression" in text
    assert "2 FusedBatchNormV3" in text
    assert "--outputs=" in text and "detection_boxes" in text.split("--outputs=")[1]


def test_inspect_rates_a_pb_with_a_host_op_an_error(tmp_path, capsys):
    import tensorflow as tf

    from serving_opt.cli import main as cli

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.string, [], name="path")
        tf.io.read_file(x, name="contents")
    path = tmp_path / "reads.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    assert cli.main(["serving-opt", "inspect", f"--saved_model_dir={path}"]) == 1
    out = capsys.readouterr()
    assert "risk ERROR host_op: ReadFile contents" in out.out
    assert "host_op" in out.err


def test_examples_that_fit_no_signature_are_a_usage_error_not_synthesized(detection_model,
                                                                          tmp_path):
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"images": detection_sample.frame(48, 64).tolist()}) + "\n")
    with pytest.raises(UsageError, match="fits no signature: it has requests with keys "
                                         "images, and serving_default takes inputs"):
        optimize(detection_model.frozen_graph, str(tmp_path / "out"),
                 OptimizeOptions(
                     graph_def=GraphDefOptions(graph_outputs=OUTPUTS),
                     inputs=InputOptions(examples=str(wrong)),
                     measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
