"""A library function nothing calls (issue 40): the shape a TF 2.9 Estimator export from
TFX's Trainer carries (``__inference_<lambda>_N`` holding an
``InitializeTableFromTextFileV2``: a TF2 table initializer brought along by a
transform graph loaded into the Estimator's TF1 graph), and its hostile twins, the same
function made callable one way or another. The function is traced by TensorFlow; the
edits are what a crafted model (or TF's own writers) put in the proto.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, types_pb2

# The table and the file name the function reads, as arguments (TFX's took them as
# captured inputs: the table resource and the asset path).
ARGS = (types_pb2.DT_RESOURCE, types_pb2.DT_STRING)


def table_initializer_function():
    """A FunctionDef ``__inference_<lambda>_N``: fills its table argument from the file
    its string argument names (whole lines -> line numbers)."""

    def init(table, path):
        tf.raw_ops.InitializeTableFromTextFileV2(
            table_handle=table, filename=path, key_index=-2, value_index=-1)
        return tf.constant(1)

    traced = tf.function(lambda table, path: init(table, path))
    concrete = traced.get_concrete_function(
        tf.TensorSpec([], tf.resource), tf.TensorSpec([], tf.string))
    function_def = concrete.function_def
    assert function_def.signature.name.startswith("__inference_<lambda>_")
    assert any(n.op == "InitializeTableFromTextFileV2" for n in function_def.node_def)
    return function_def


def add_dead_function(meta_graph) -> str:
    """Adds the initializer to the library, called by nothing; returns its name."""
    function_def = table_initializer_function()
    meta_graph.graph_def.library.function.add().CopyFrom(function_def)
    return function_def.signature.name


def _func(name: str, **attrs) -> attr_value_pb2.AttrValue:
    value = attr_value_pb2.AttrValue()
    value.func.name = name
    for key, inner in attrs.items():
        value.func.attr[key].CopyFrom(inner)
    return value


def _types(*dtypes) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=dtypes))


def _table_and_path(nodes, prefix: str) -> list[str]:
    """A table and a string Const to call the initializer with (at the top level or in a
    function body): the path is a build-host file, which the check must not trust."""
    table = nodes.add(name=f"{prefix}table", op="HashTableV2")
    table.attr["key_dtype"].type = types_pb2.DT_STRING
    table.attr["value_dtype"].type = types_pb2.DT_INT64
    path = nodes.add(name=f"{prefix}path", op="Const")
    path.attr["dtype"].type = types_pb2.DT_STRING
    path.attr["value"].tensor.dtype = types_pb2.DT_STRING
    path.attr["value"].tensor.string_val.append(b"/etc/hostname")
    return [table.name, path.name]


def _call(nodes, name: str, op: str, inputs: list[str], **attrs):
    node = nodes.add(name=name, op=op)
    node.input.extend(inputs)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def _function(meta_graph, name: str, **attrs):
    """An empty library function, called by a top-level node (so it runs)."""
    function = meta_graph.graph_def.library.function.add()
    function.signature.name = name
    for key, value in attrs.items():
        function.attr[key].CopyFrom(value)
    _call(meta_graph.graph_def.node, f"call_{name}", "PartitionedCall", [],
          f=_func(name), Tin=_types(), Tout=_types())
    return function


def _called_by_node(meta_graph, fname: str) -> None:
    inputs = _table_and_path(meta_graph.graph_def.node, "twin/")
    _call(meta_graph.graph_def.node, "twin/init", "StatefulPartitionedCall", inputs,
          f=_func(fname), Tin=_types(*ARGS), Tout=_types(types_pb2.DT_INT32))


def _called_as_op(meta_graph, fname: str) -> None:
    _call(meta_graph.graph_def.node, "twin/init", fname,
          _table_and_path(meta_graph.graph_def.node, "twin/"))


def _called_by_function(meta_graph, fname: str) -> None:
    outer = _function(meta_graph, "outer")
    _call(outer.node_def, "init", "StatefulPartitionedCall",
          _table_and_path(outer.node_def, ""), f=_func(fname), Tin=_types(*ARGS),
          Tout=_types(types_pb2.DT_INT32))


def _attr_of_node(attr: str, op: str, nested: bool = False, as_list: bool = False):
    def edit(meta_graph, fname: str) -> None:
        value = _func(fname)
        if nested:  # a func attr's own attr map holds it
            value = _func("some_op", inner=value)
        if as_list:
            value = attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(func=[value.func]))
        _call(meta_graph.graph_def.node, "twin/node", op, [], **{attr: value})
    return edit


def _object_graph_function(meta_graph, fname: str) -> None:
    """The object graph's resource ``_initialize`` function: tf.saved_model.load runs it."""
    objects = meta_graph.object_graph_def
    root = objects.nodes.add()
    root.user_object.identifier = "_generic_user_object"
    root.children.add(node_id=1, local_name="table")
    resource = objects.nodes.add()
    resource.resource.device = ""
    resource.children.add(node_id=2, local_name="_initialize")
    objects.nodes.add().bare_concrete_function.concrete_function_name = fname
    objects.concrete_functions[fname].SetInParent()


def _object_graph_key_only(meta_graph, fname: str) -> None:
    """Only a key of ``concrete_functions`` names it."""
    meta_graph.object_graph_def.nodes.add().user_object.identifier = "_generic_user_object"
    meta_graph.object_graph_def.concrete_functions[fname].SetInParent()


def _string_attr_of_called_function(meta_graph, fname: str) -> None:
    _function(meta_graph, "forward", backward_function_name=attr_value_pb2.AttrValue(
        s=fname.encode()))


def _func_attr_of_called_function(meta_graph, fname: str) -> None:
    _function(meta_graph, "forward", some_func=_func(fname))


def _string_attr_of_node(meta_graph, fname: str) -> None:
    _call(meta_graph.graph_def.node, "twin/node", "NoOp", [],
          function_name=attr_value_pb2.AttrValue(s=fname.encode()))


def _same_api_implements(meta_graph, fname: str) -> None:
    api = attr_value_pb2.AttrValue(s=b"lstm_0f1e")
    _function(meta_graph, "standard_lstm", api_implements=api)
    dead = next(f for f in meta_graph.graph_def.library.function if f.signature.name == fname)
    dead.attr["api_implements"].CopyFrom(api)


def _gradient_of_called_function(meta_graph, fname: str) -> None:
    _function(meta_graph, "forward")
    meta_graph.graph_def.library.gradient.add(function_name="forward", gradient_func=fname)


def _registered_gradient(meta_graph, fname: str) -> None:
    meta_graph.graph_def.library.registered_gradients.add(
        gradient_func=fname, registered_op_type="CustomGradient-1")


def _init_op_collection(meta_graph, fname: str) -> None:
    """main_op names a node that calls it (the init path)."""
    _called_by_node(meta_graph, fname)
    meta_graph.collection_def["saved_model_main_op"].node_list.value.append("twin/init")


# name -> edit(meta_graph, the dead function's name) making the function callable.
TWINS = {
    "called by a node": _called_by_node,
    "called as an op": _called_as_op,
    "called by a called function": _called_by_function,
    "called from the init op": _init_op_collection,
    "then_branch of If": _attr_of_node("then_branch", "If"),
    "body of While": _attr_of_node("body", "While"),
    "branches of Case": _attr_of_node("branches", "Case", as_list=True),
    "f of MapDataset": _attr_of_node("f", "MapDataset"),
    "a func attr's own attr": _attr_of_node("f", "PartitionedCall", nested=True),
    "resource _initialize of the object graph": _object_graph_function,
    "key of the object graph's concrete_functions": _object_graph_key_only,
    "string attr of a called function": _string_attr_of_called_function,
    "func attr of a called function": _func_attr_of_called_function,
    "string attr of a node": _string_attr_of_node,
    "api_implements of a called function": _same_api_implements,
    "library.gradient of a called function": _gradient_of_called_function,
    "registered gradient": _registered_gradient,
}


def _called_by_dead_function(meta_graph, fname: str) -> None:
    dead = meta_graph.graph_def.library.function.add()
    dead.signature.name = "also_dead"
    _call(dead.node_def, "init", "StatefulPartitionedCall", _table_and_path(dead.node_def, ""),
          f=_func(fname), Tin=_types(*ARGS), Tout=_types(types_pb2.DT_INT32))


def _api_implements_of_dead_function(meta_graph, fname: str) -> None:
    api = attr_value_pb2.AttrValue(s=b"lstm_0f1e")
    meta_graph.graph_def.library.function.add(signature={"name": "also_dead"},
                                              attr={"api_implements": api})
    dead = next(f for f in meta_graph.graph_def.library.function if f.signature.name == fname)
    dead.attr["api_implements"].CopyFrom(api)


# Still dead: only dead things name it.
DEAD = {
    "alone": lambda meta_graph, fname: None,
    "called by a dead function": _called_by_dead_function,
    "api_implements of a dead function": _api_implements_of_dead_function,
}
