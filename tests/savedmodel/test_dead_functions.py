"""A library function nothing can call is not a host op (issue 40 item 1).

TFX's Trainer writes TF 2.9 Estimator exports whose library holds an uncalled
``__inference_<lambda>_N`` with an ``InitializeTableFromTextFileV2``: the static check
must accept it, and refuse the same function once anything can run it (a node, a
called function, an op named after it, any function-valued attr, the object graph, a
string naming it, a gradient registration, an api_implements sibling). The control
proves the function's op reads the file it is given once called.
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf
from hostile_models_dead import ARGS, DEAD, TWINS, add_dead_function, table_initializer_function
from saved_model_io import edit_saved_model, save_tf1, serving_default

from serving_opt import inspection
from serving_opt.errors import ServingOptError
from serving_opt.options import BuildOptions, MeasureOptions, TrustOptions
from serving_opt.savedmodel import loader, untrusted

v1 = tf.compat.v1
HOST_CODES = ("code_execution_op", "file_write_op", "file_read_op", "host_op")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    """x * w under serving_default, saved with the builder's own saver."""
    export_dir = os.path.join(str(tmp_path_factory.mktemp("small")), "1")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]), use_resource=True)
        y = tf.identity(x * w, name="y")
        return save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))


def _meta_graph(model: str):
    return loader.find_meta_graph(loader.read_saved_model(model), {"serve"})


def _with_dead_function(model: str, edit) -> str:
    names = []

    def change(meta_graph):
        names.append(add_dead_function(meta_graph))
        edit(meta_graph, names[0])

    edit_saved_model(model, change)
    return names[0]


@pytest.mark.parametrize("shape", sorted(DEAD))
def test_a_function_nothing_can_call_is_accepted(shape, small_model, model_copy):
    model = model_copy(small_model)
    fname = _with_dead_function(model, DEAD[shape])
    meta_graph = _meta_graph(model)
    assert fname in {f.signature.name for f in meta_graph.graph_def.library.function}
    assert untrusted.host_op_uses(meta_graph) == []
    untrusted.refuse_host_ops(meta_graph, ["serving_default"], "optimize")
    risks = inspection.inspect_saved_model(model).risks
    assert not [r for r in risks if r.code in HOST_CODES]


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_same_function_made_callable_is_refused(twin, small_model, model_copy):
    model = model_copy(small_model)
    fname = _with_dead_function(model, TWINS[twin])
    meta_graph = _meta_graph(model)
    uses = untrusted.host_op_uses(meta_graph)
    assert [(u.op, u.function) for u in uses] == [("InitializeTableFromTextFileV2", fname)]
    assert "every function is checked" not in uses[0].describe()
    with pytest.raises(ServingOptError, match="InitializeTableFromTextFileV2 node"):
        untrusted.refuse_host_ops(meta_graph, ["serving_default"], "optimize")
    risks = inspection.inspect_saved_model(model).risks
    assert [r.subject for r in risks if r.code in HOST_CODES] == [uses[0].label]


def test_the_functions_op_reads_the_file_it_is_given_once_called(tmp_path):
    """Control: called by a node in plain TensorFlow, the very FunctionDef the twins use
    fills a table from the file named by its argument."""
    from tensorflow.core.framework import graph_pb2

    canary = tmp_path / "canary.txt"
    canary.write_text("alpha\nbeta\ngamma\n")
    function_def = table_initializer_function()
    graph_def = graph_pb2.GraphDef()
    graph_def.library.function.add().CopyFrom(function_def)
    table = graph_def.node.add(name="table", op="HashTableV2")
    table.attr["key_dtype"].type = tf.string.as_datatype_enum
    table.attr["value_dtype"].type = tf.int64.as_datatype_enum
    graph_def.node.add(name="path", op="Placeholder").attr["dtype"].type = \
        tf.string.as_datatype_enum
    call = graph_def.node.add(name="init", op="StatefulPartitionedCall",
                              input=["table", "path"])
    call.attr["f"].func.name = function_def.signature.name
    call.attr["Tin"].list.type.extend(ARGS)
    call.attr["Tout"].list.type.append(tf.int32.as_datatype_enum)
    with tf.Graph().as_default() as graph:
        v1.import_graph_def(graph_def, name="")
        handle = graph.get_tensor_by_name("table:0")
        found = tf.raw_ops.LookupTableFindV2(
            table_handle=handle, keys=tf.constant(["gamma", "alpha", "nope"]),
            default_value=tf.constant(-1, tf.int64))
        with v1.Session(graph=graph) as sess:
            sess.run("init", {"path:0": str(canary)})
            assert sess.run(found).tolist() == [2, 0, -1]


@pytest.mark.parametrize("freeze", ["auto", "never"])
def test_optimize_publishes_the_dead_shape_and_nothing_can_call_it_there(
        freeze, small_model, model_copy, tmp_path):
    """What the output holds is what TF Serving loads: the function may be pruned or
    kept, but never published where something would call it."""
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    model = model_copy(small_model)
    _with_dead_function(model, DEAD["alone"])
    report = optimize(model, str(tmp_path / "out"), OptimizeOptions(
        trust=TrustOptions(allow_unsandboxed=True),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        build=BuildOptions(freeze=freeze)))
    assert report.parity.ok
    published = _meta_graph(report.output_dir)
    assert untrusted.host_op_uses(published) == []
    assert not untrusted.host_op_uses(_meta_graph(model))
