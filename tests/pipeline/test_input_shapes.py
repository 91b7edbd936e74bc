"""``--input_shapes``: pinning unknown input dimensions, like
``strip_unused_nodes(shape=...)``; the pinned candidate kept only where it measures faster.

The model here takes ``x`` of shape [?, ?] and asserts that its width is 64 (as a model
checking its inputs does), and spends most of each request on a computation that
depends only on that width (a 1.3M-element sort: a stand-in for an anchor grid). Pinned,
the transforms fold that computation into a constant; unpinned, it runs per request.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from independent_check import assert_outputs_match

from serving_opt import OptimizeOptions, optimize
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import BuildOptions, GateOptions, InputOptions, MeasureOptions
from serving_opt.pipeline.report import format_optimize_report
from serving_opt.savedmodel import loader
from serving_opt.savedmodel import shapes as shapes_lib

pytestmark = pytest.mark.in_process  # our own models, stages in this process

WIDTH = 64
# Two matmuls and a sum of 64 sines, reordered by folding: float32 rounding only.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _rows(count: int) -> dict:
    x = np.random.default_rng(count).normal(size=(count, WIDTH)).astype(np.float32)
    return {"serving_default": {"x": x}}
SHAPE_ONLY_OPS = {"Shape", "Range", "Sort", "TopKV2"}  # the Assert stays: it is stateful


def _build(export_dir: str) -> None:
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
        width = tf.shape(x)[1]
        check = tf.debugging.Assert(tf.equal(width, WIDTH), ["x must be 64 wide"])
        with tf.control_dependencies([check]):
            # Everything after the check: a MatMul of the wrong width must not fail first.
            x = tf.identity(x)
            grid = tf.sin(tf.cast(tf.range(width * 20000), tf.float32))
        # The largest values of a grid computed from the width alone: what pinning folds.
        offset = tf.reduce_sum(tf.math.top_k(grid, k=WIDTH, sorted=True).values)
        rng = np.random.default_rng(0)
        # A variable (1 KiB) and a constant (2 KiB): with small limits, the one stays a
        # variable when freezing and the other is moved into the checkpoint after it.
        weights = tf.compat.v1.get_variable(
            "weights", initializer=rng.normal(size=(WIDTH, 4)).astype(np.float32))
        head = tf.constant(rng.normal(size=(4, 128)).astype(np.float32))
        y = tf.identity(tf.matmul(tf.matmul(x, weights) + offset * 1e-3, head), name="y")
        sess.run(tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def(
            {"x": graph.get_tensor_by_name("x:0")}, {"y": y})
        builder.add_meta_graph_and_variables(sess, ["serve"],
                                             signature_def_map={"serving_default": signature})
        builder.save()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("pinned") / "1")
    _build(path)
    return path


def _options(input_shapes: str | None = None, benchmark_runs: int = 0,
             build: dict | None = None, **groups) -> OptimizeOptions:
    # One parity batch: pinned to batch 1, the gate's 16 rows are 16 runs of each model
    # (two batches: 32), each sorting 1.3M floats unpinned.
    return OptimizeOptions(build=BuildOptions(input_shapes=input_shapes, **(build or {})),
                           measure=MeasureOptions(cold_start=False, benchmark_runs=benchmark_runs),
                           gate=GateOptions(parity_batches=1), **groups)


def _ops(saved_model_dir: str) -> set[str]:
    graph_def = loader.read_saved_model(saved_model_dir).meta_graphs[0].graph_def
    return {n.op for n in graph_def.node}


def _signature_shape(saved_model_dir: str) -> tuple[int, ...]:
    meta_graph = loader.read_saved_model(saved_model_dir).meta_graphs[0]
    info = meta_graph.signature_def["serving_default"].inputs["x"]
    return tuple(d.size for d in info.tensor_shape.dim)


# --- the flag's syntax -------------------------------------------------------------------

def test_entries_are_name_colon_dims_with_minus_one_left_free():
    pins = shapes_lib.parse("image_tensor:1,480,640,3; b:0:-1,?")
    assert [(p.name, p.dims) for p in pins] == [("image_tensor", (1, 480, 640, 3)),
                                                 ("b:0", (-1, -1))]


@pytest.mark.parametrize("spec", ["x", "x:", "x:1,a", "x:1,,2", "x:0,3", "x:1;x:0:2"])
def test_a_malformed_spec_is_a_usage_error_from_the_options(spec):
    with pytest.raises(UsageError, match="--input_shapes"):
        OptimizeOptions(build=BuildOptions(input_shapes=spec)).check()


# --- resolved against the model, before anything runs it ---------------------------------

@pytest.mark.parametrize("spec, problem", [
    ("z:1,64", "no input of the signatures kept"),
    ("x:1,64,3", "has rank 2"),
    ("y:1,4", "no input"),
])
def test_a_spec_the_model_contradicts_is_a_usage_error(model_dir, spec, problem):
    # The rule, on the model's own MetaGraph; that optimize applies it before freezing
    # is the next test's.
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), {"serve"})
    with pytest.raises(UsageError, match=problem):
        shapes_lib.resolve(meta_graph, ["serving_default"], shapes_lib.parse(spec))


def test_a_spec_the_model_contradicts_is_refused_by_optimize_before_freezing(model_dir,
                                                                             tmp_path):
    with pytest.raises(UsageError, match="has rank 2") as raised:
        optimize(model_dir, str(tmp_path / "out"), _options(input_shapes="x:1,64,3"))
    stages = [s.name for s in raised.value.report.stages]
    assert "freeze" not in stages
    assert not os.path.exists(tmp_path / "out" / "1")


def _build_doubler(export: str) -> str:
    """y = 2x, x of shape [?, 3]: nothing in it depends on the batch size."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.identity(x * 2.0, name="y")
        builder = tf.compat.v1.saved_model.Builder(export)
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x},
                                                                              {"y": y})})
        builder.save()
    return export


@pytest.fixture(scope="module")
def doubler(tmp_path_factory) -> str:
    """One doubler export for the tests that optimize it (each into its own base)."""
    return _build_doubler(str(tmp_path_factory.mktemp("fixed") / "1"))


def test_a_dimension_the_model_fixes_cannot_be_pinned_otherwise(doubler):
    meta_graph = loader.find_meta_graph(loader.read_saved_model(doubler), {"serve"})
    with pytest.raises(UsageError, match="dimension 1 fixed at 3"):
        shapes_lib.resolve(meta_graph, ["serving_default"], shapes_lib.parse("x:1,4"))


def test_a_pin_that_folds_nothing_is_not_kept_nor_timed(doubler, tmp_path):
    report = optimize(doubler, str(tmp_path / "out"),
                      _options(input_shapes="x:1,-1", benchmark_runs=15))
    pinning = report.input_shapes
    assert not pinning["kept"] and "folds nothing" in pinning["reason"]
    assert "ratio" not in pinning  # not timed
    assert "pin_compare" not in [s.name for s in report.stages]
    assert _signature_shape(report.output_dir) == (-1, 3)


def test_the_users_requests_of_another_shape_are_refused(model_dir, tmp_path):
    examples = tmp_path / "two_rows.jsonl"
    examples.write_text(json.dumps({"x": np.ones((2, WIDTH)).tolist()}) + "\n")
    with pytest.raises(UsageError, match="pins x of serving_default to 1,64.*shape 2,64"):
        optimize(model_dir, str(tmp_path / "out"),
                 _options(input_shapes="x:1,64", inputs=InputOptions(examples=str(examples))))


# --- the pinned shape is what the gates and measurements feed ----------------------------

def test_without_the_pin_synthesized_inputs_fail_the_models_own_check(model_dir, tmp_path):
    # The synthesizer's guess for an unknown width (3) meets the model's Assert.
    with pytest.raises(ServingOptError, match="must be 64 wide"):
        optimize(model_dir, str(tmp_path / "out"), _options())


def test_pinned_inputs_pass_the_gate_and_fold_what_only_the_shape_decided(model_dir,
                                                                          tmp_path):
    # Not measured (--benchmark_runs=0): pinning is kept only where it measures faster,
    # so the unpinned candidate is published, proven on the pinned shape.
    report = optimize(model_dir, str(tmp_path / "out"), _options(input_shapes="x:1,64"))
    pinning = report.input_shapes
    assert pinning["pinned"] == {"serving_default": {"x": [1, WIDTH]}}
    assert not pinning["kept"] and "not measured" in pinning["reason"]
    assert pinning["nodes_pinned"] < pinning["nodes_unpinned"]
    assert _signature_shape(report.output_dir) == (-1, -1)
    assert "Sort" in _ops(report.output_dir) or "TopKV2" in _ops(report.output_dir)
    # Unpinned: any batch, not only the pinned shape's.
    assert_outputs_match(report.output_dir, model_dir, _rows(3), **TOLERANCE)
    assert "shapes     serving_default.x=1,64: not kept" in format_optimize_report(report)
    # What the transforms did is told of the build published, not of the pinned one.
    assert report.transform_passes
    assert not any("Range" in line for line in report.transform_passes), \
        report.transform_passes


def test_a_pinned_candidate_that_measures_faster_is_published_pinned(model_dir, tmp_path):
    # Timed side by side in one process, the unpinned model sorts 1.3M floats per request
    # and the pinned one two small matmuls: a gap of two orders of magnitude, which no
    # load on the machine closes (both sides are slowed alike).
    # Limits that keep the variable and move the constant: both builds read the
    # checkpoint freezing wrote (the first must not consume it).
    report = optimize(model_dir, str(tmp_path / "out"),
                      _options(input_shapes="x:1,64", benchmark_runs=15,
                               build=dict(freeze_max_bytes=512, max_constant_bytes=512)))
    pinning = report.input_shapes
    assert pinning["kept"], pinning
    assert sorted(v.name for v in report.variables_kept) == [
        "Const_1/serving_opt_variable", "weights"], report.variables_kept
    assert pinning["ratio"]["high"] < 1.0 and pinning["ratio"]["batch_size"] == 1
    assert _signature_shape(report.output_dir) == (1, WIDTH)
    assert not _ops(report.output_dir) & SHAPE_ONLY_OPS
    assert_outputs_match(report.output_dir, model_dir, _rows(1), **TOLERANCE)
    assert any("Range" in line for line in report.transform_passes), report.transform_passes
    assert [s.name for s in report.stages].count("parity") == 1  # the pinned build's only
    assert any("accept only serving_default.x=1,64" in w for w in report.warnings)
    assert [lat.batch_size for lat in report.benchmark.after] == [1]  # the pinned batch


def test_a_pin_of_only_what_the_model_already_fixes_is_ignored(doubler, tmp_path):
    report = optimize(doubler, str(tmp_path / "out"), _options(input_shapes="x:-1,3"))
    assert report.input_shapes == {}
    assert "--input_shapes pins nothing the model leaves unknown: ignored" in report.warnings
    assert "pin_shapes" not in [s.name for s in report.stages]
