"""A frozen GraphDef (``frozen_inference_graph.pb``) as an input, and as an output.

Every TF1 tutorial and the Object Detection API hand users a frozen GraphDef: weights as
constants, no signatures. To optimize and serve it, it becomes a SavedModel with a
``serving_default`` predict signature (:func:`to_serving_graph`, :func:`convert`):
inputs and outputs are named by ``--inputs``/``--outputs`` (with or without ``:0``)
or inferred where the graph leaves no doubt (the only Placeholder; the only node nothing
consumes); the input key is ``inputs`` for one input, as the OD API exports it, else the
tensor names; output keys are the tensor names. The SavedModel has no variables: what
the optimizer writes for a frozen model, and what TF Serving serves.

:func:`write_graph_def` is ``--output_format=graphdef``: the optimized graph written
back as a ``.pb`` for users who load GraphDefs directly, refused when variables were kept
(a GraphDef cannot hold them) or an init op must run (tables).

A ``.pb`` is untrusted like any model: it is read bounded (never blocking, within
protobuf's limit), imported only to infer shapes, never run here; the static check
(:mod:`serving_opt.savedmodel.untrusted`) sees the SavedModel it becomes (:func:`convert` runs it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, UsageError, first_line, storage_error
from serving_opt.savedmodel import loader, model_files
from serving_opt.savedmodel.graph import (
    ServingGraph,
    node_name,
    reachable_nodes,
    reachable_subgraph,
)

GRAPH_DEF_SUFFIXES = (".pb",)
SIGNATURE_KEY = "serving_default"
SINGLE_INPUT_KEY = "inputs"  # what the OD API's exporter names its one input

INPUT_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
# Nodes nothing consumes that are no output: no value, or one nobody wants served.
_NOT_OUTPUTS = frozenset({
    "NoOp", "Const", "Assert", "Print", "PrintV2", "SaveV2", "Save", "SaveSlices",
    "RestoreV2", "Restore", "RestoreSlice", "MergeV2Checkpoints", "VariableV2", "Variable",
    "VarHandleOp", "AssignVariableOp", "Assign", "AssignAdd", "AssignSub",
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "ControlTrigger",
})
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "AutoReloadVariable",
                          "TemporaryVariable"})


def is_graph_def_path(path: str) -> bool:
    """Whether ``--input_dir`` names a GraphDef file rather than a SavedModel directory."""
    return not os.path.isdir(path) and path.endswith(GRAPH_DEF_SUFFIXES) and \
        os.path.basename(path) != "saved_model.pb"


def read_graph_def(path: str):
    """Reads and parses a binary GraphDef ``.pb``; a one-line ServingOptError for every
    file that is not one (missing, a directory, a SavedModel's ``saved_model.pb``, text,
    corrupt, empty, over 2 GiB, a FIFO...).
    """
    if not os.path.lexists(path):
        raise ServingOptError(f"{path} does not exist",
                              "check the path of the frozen GraphDef (.pb)")
    if os.path.isdir(path):
        raise ServingOptError(f"{path} is a directory, not a GraphDef file",
                              "pass the frozen .pb file, or the directory as a SavedModel")
    if os.path.basename(path) == "saved_model.pb":
        raise ServingOptError(
            f"{path} is a SavedModel's saved_model.pb, not a frozen GraphDef",
            f"pass its directory, {os.path.dirname(path) or '.'}, as --input_dir")
    if not path.endswith(GRAPH_DEF_SUFFIXES):
        raise ServingOptError(
            f"{path} is neither a SavedModel directory nor a binary GraphDef (.pb)",
            "pass a SavedModel directory or a frozen_inference_graph.pb "
            "(a text .pbtxt graph: convert it with text_format first)")
    try:
        data = model_files.read_model_file(path)
    except OSError as e:
        raise ServingOptError(f"cannot read {path}: {e.strerror or e}",
                              "check the file's permissions") from e
    from google.protobuf import message
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except (message.DecodeError, RuntimeError, ValueError) as e:
        raise ServingOptError(
            f"{path} is not a binary GraphDef ({len(data)} bytes, {first_line(e)})",
            "pass the frozen .pb written by freeze_graph or export_inference_graph.py") from e
    if not graph_def.node or any(not n.name or not n.op for n in graph_def.node):
        raise ServingOptError(
            f"{path} holds no graph ({len(graph_def.node)} nodes, {len(data)} bytes)",
            "pass the frozen .pb written by freeze_graph or export_inference_graph.py")
    return graph_def


@dataclass(frozen=True)
class TensorCandidate:
    """A tensor that could be a signature input or output."""

    name: str  # "image_tensor:0"
    op: str
    dtype: str  # "uint8", "" when unknown
    shape: tuple[int, ...] | None  # -1 for unknown dims; None for unknown rank

    def describe(self) -> str:
        """E.g. "image_tensor:0 (uint8 [?,?,?,3])"."""
        if self.shape is None:
            shape = "[...]"
        else:
            shape = "[" + ",".join("?" if d < 0 else str(d) for d in self.shape) + "]"
        return f"{self.name} ({self.dtype or self.op} {shape})".replace(" )", ")")


@dataclass(frozen=True)
class GraphInterface:
    """The candidate inputs (Placeholders) and outputs (tensors of nodes nothing
    consumes) of a GraphDef, as ``inspect`` lists them."""

    inputs: tuple[TensorCandidate, ...]
    outputs: tuple[TensorCandidate, ...]

    def lines(self) -> list[str]:
        """The inspect section: one line each."""
        return ([f"candidate inputs:  {', '.join(c.describe() for c in self.inputs) or 'none'}",
                 f"candidate outputs: {', '.join(c.describe() for c in self.outputs) or 'none'}"])


def _dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    try:
        return dtypes.as_dtype(enum).name
    except TypeError:
        return ""


def _shape(shape_proto) -> tuple[int, ...] | None:
    if shape_proto.unknown_rank:
        return None
    return tuple(int(d.size) for d in shape_proto.dim)


def _output_count(node) -> int:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return 1
    count = 0
    for arg in op_def.output_arg:
        if arg.number_attr:
            count += node.attr[arg.number_attr].i if arg.number_attr in node.attr else 1
        elif arg.type_list_attr:
            count += len(node.attr[arg.type_list_attr].list.type) \
                if arg.type_list_attr in node.attr else 1
        else:
            count += 1
    return count


def _imported_specs(graph_def, tensors: Sequence[str]) -> dict[str, tuple[int, object]]:
    """tensor -> (dtype enum, TensorShapeProto) by importing the graph into a fresh
    tf.Graph: shape inference only, no kernel runs. Unknown ops are a one-line error."""
    import tensorflow as tf

    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as e:
        raise ServingOptError(
            f"TensorFlow cannot import the GraphDef: {first_line(e)}",
            "the graph needs ops this TensorFlow does not have (a newer TF, or a custom "
            "op library); export it with the TF version serving will use") from e
    out = {}
    for name in tensors:
        tensor = graph.get_tensor_by_name(name)
        out[name] = (tensor.dtype.as_datatype_enum, tensor.shape.as_proto())
    return out


def interface(graph_def) -> GraphInterface:
    """Candidate inputs and outputs of ``graph_def``.

    Inputs are its Placeholders; outputs the tensors of nodes no other node consumes
    (data or control), other than NoOps, constants, assertions, savers and variables.
    """
    consumed = {node_name(i) for n in graph_def.node for i in n.input}
    inputs = []
    output_names = []
    for node in graph_def.node:
        if node.op in INPUT_OPS:
            dtype = node.attr["dtype"].type if "dtype" in node.attr else 0
            shape = _shape(node.attr["shape"].shape) if "shape" in node.attr else None
            inputs.append(TensorCandidate(f"{node.name}:0", node.op, _dtype_name(dtype),
                                          shape))
        elif node.name not in consumed and node.op not in _NOT_OUTPUTS:
            output_names.extend(f"{node.name}:{i}" for i in range(_output_count(node)))
    outputs = []
    if output_names:
        try:
            specs = _imported_specs(graph_def, output_names)
        except ServingOptError:
            specs = {}
        ops = {n.name: n.op for n in graph_def.node}
        for name in output_names:
            dtype, shape = specs.get(name, (0, None))
            outputs.append(TensorCandidate(name, ops[node_name(name)], _dtype_name(dtype),
                                           _shape(shape) if shape is not None else None))
    return GraphInterface(tuple(inputs), tuple(outputs))


def _split(names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str):
        names = names.split(",")
    return [n.strip() for n in names if n.strip()]


def _canonical(name: str, nodes: dict, flag: str, candidates: Sequence[TensorCandidate],
               path: str) -> str:
    listed = ", ".join(c.name.removesuffix(":0") for c in candidates) or "none"
    kind = "inputs" if flag == "--inputs" else "outputs"
    if name.startswith("^"):
        raise UsageError(f"{flag} names {name!r}, a control input, not a tensor",
                         f"pass a tensor name (candidate {kind}: {listed})")
    node, _, index = name.partition(":")
    if node not in nodes:
        raise UsageError(f"{flag} names {node!r}, which is not a node of {path} "
                         f"(candidate {kind}: {listed})", f"fix {flag}")
    if index and not index.isdigit():
        raise UsageError(f"{flag} names {name!r}; a tensor is node:index, e.g. {node}:0",
                         f"fix {flag}")
    count = _output_count(nodes[node])
    tensor = f"{node}:{int(index or 0)}"
    if int(index or 0) >= count:
        raise UsageError(f"{flag} names {tensor}, but {node} ({nodes[node].op}) has "
                         f"{count} output(s)", f"fix {flag}")
    return tensor


def resolve(graph_def, inputs: str | Sequence[str] | None = None,
            outputs: str | Sequence[str] | None = None,
            path: str = "the GraphDef") -> tuple[list[str], list[str]]:
    """The input and output tensor names (``node:index``) for ``--inputs``/``--outputs``.

    Names may omit ``:0``. Without ``--inputs`` the only Placeholder is the input;
    without ``--outputs`` the only node nothing consumes is the output. Otherwise a
    one-line :class:`UsageError` lists the candidates.
    """
    nodes = {n.name: n for n in graph_def.node}
    found = interface(graph_def)
    wanted_in, wanted_out = _split(inputs), _split(outputs)
    if wanted_in:
        ins = [_canonical(n, nodes, "--inputs", found.inputs, path) for n in wanted_in]
    elif len(found.inputs) == 1:
        ins = [found.inputs[0].name]
    else:
        listed = ", ".join(c.describe() for c in found.inputs) or "none"
        raise UsageError(
            f"{path} has {len(found.inputs)} Placeholders ({listed}); which are the inputs?",
            "pass --inputs=name[,name...]")
    if wanted_out:
        outs = [_canonical(n, nodes, "--outputs", found.outputs, path) for n in wanted_out]
    elif len(found.outputs) == 1:
        outs = [found.outputs[0].name]
    else:
        every = ",".join(c.name.removesuffix(":0") for c in found.outputs)
        listed = ", ".join(c.describe() for c in found.outputs) or "none"
        raise UsageError(
            f"{path} does not say which tensors are its outputs (candidates: {listed})",
            f"pass --outputs, e.g. --outputs={every}" if every else
            "pass --outputs=name[,name...]")
    ins, outs = list(dict.fromkeys(ins)), list(dict.fromkeys(outs))
    both = sorted(set(ins) & set(outs))
    if both:
        raise UsageError(f"{', '.join(both)} is both an input and an output",
                         "fix --inputs/--outputs")
    return ins, outs


def _key(tensor: str) -> str:
    return tensor.removesuffix(":0")


def signature_keys(inputs: Sequence[str], outputs: Sequence[str],
                   input_keys: str | Sequence[str] | None = None
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """(key -> input tensor, key -> output tensor) of the serving signature.

    One input is ``inputs`` (the OD API's key); several are their tensor names;
    ``input_keys`` (``--signature_keys``) names them in ``--inputs`` order instead.
    Output keys are the tensor names (without ``:0``).
    """
    chosen = _split(input_keys)
    if chosen:
        if len(chosen) != len(inputs) or len(set(chosen)) != len(chosen):
            raise UsageError(
                f"--signature_keys names {len(chosen)} key(s) ({', '.join(chosen)}) for "
                f"{len(inputs)} input(s) ({', '.join(inputs)})",
                "pass one distinct key per input, in --inputs order")
        keys_in = dict(zip(chosen, inputs))
    elif len(inputs) == 1:
        keys_in = {SINGLE_INPUT_KEY: inputs[0]}
    else:
        keys_in = {_key(t): t for t in inputs}
    keys_out = {_key(t): t for t in outputs}
    return keys_in, keys_out


def to_serving_graph(graph_def, inputs: str | Sequence[str] | None = None,
                     outputs: str | Sequence[str] | None = None,
                     input_keys: str | Sequence[str] | None = None,
                     path: str = "the GraphDef") -> ServingGraph:
    """The frozen GraphDef as the optimizer's :class:`ServingGraph`: the nodes the
    outputs need, a ``serving_default`` predict signature, tag ``serve``, no variables.

    Refuses a graph whose outputs read variables (not frozen). Nothing is run.
    """
    from tensorflow.core.protobuf import meta_graph_pb2

    ins, outs = resolve(graph_def, inputs, outputs, path)
    keys_in, keys_out = signature_keys(ins, outs, input_keys)
    reached = reachable_nodes(graph_def, [node_name(t) for t in outs + ins])
    variables = sorted(n.name for n in graph_def.node
                       if n.name in reached and n.op in VARIABLE_OPS)
    if variables:
        more = f" (and {len(variables) - 1} more)" if len(variables) > 1 else ""
        raise ServingOptError(
            f"{path} is not frozen: its outputs read variable {variables[0]}{more}",
            "freeze it first (freeze_graph / convert_variables_to_constants), or pass the "
            "SavedModel it was exported from")
    pruned = reachable_subgraph(graph_def, reached)
    specs = _imported_specs(pruned, ins + outs)
    signature = meta_graph_pb2.SignatureDef(method_name=loader.METHOD_PREDICT)
    for side, keys in ((signature.inputs, keys_in), (signature.outputs, keys_out)):
        for key, tensor in keys.items():
            dtype, shape = specs[tensor]
            side[key].name = tensor
            side[key].dtype = dtype
            side[key].tensor_shape.CopyFrom(shape)
    return ServingGraph(
        graph_def=pruned,
        signature_defs={SIGNATURE_KEY: signature},
        tags=frozenset({loader.SERVE_TAG}),
        protected_nodes=tuple(dict.fromkeys(node_name(t) for t in ins + outs)),
    )


@dataclass(frozen=True)
class ConvertedModel:
    """A SavedModel written from a frozen GraphDef."""

    export_dir: str
    inputs: Mapping[str, str]  # signature key -> tensor
    outputs: Mapping[str, str]
    nodes: int  # nodes kept (those the outputs need)
    dropped: int  # nodes of the .pb the outputs do not need


def convert(graph_def_path: str, export_dir: str, inputs: str | Sequence[str] | None = None,
            outputs: str | Sequence[str] | None = None,
            input_keys: str | Sequence[str] | None = None,
            allow_file_ops: bool = False) -> ConvertedModel:
    """Writes the frozen GraphDef at ``graph_def_path`` as a SavedModel into the (new or
    empty) ``export_dir``, after the static check (host ops are refused unless
    ``allow_file_ops``). The result loads with :func:`loader.load_session` and TF Serving.
    """
    from serving_opt.savedmodel import untrusted, writer

    graph_def = read_graph_def(graph_def_path)
    graph = to_serving_graph(graph_def, inputs, outputs, input_keys, graph_def_path)
    if not allow_file_ops:
        untrusted.refuse_host_ops(writer.build_meta_graph(graph), [SIGNATURE_KEY], "convert")
    if os.path.isdir(export_dir) and os.listdir(export_dir):
        raise ServingOptError(f"{export_dir} is not empty",
                              "choose a new directory for the SavedModel")
    writer.write_saved_model(graph, export_dir)
    signature = graph.signature_defs[SIGNATURE_KEY]
    return ConvertedModel(
        export_dir,
        {k: v.name for k, v in signature.inputs.items()},
        {k: v.name for k, v in signature.outputs.items()},
        len(graph.graph_def.node), len(graph_def.node) - len(graph.graph_def.node))


# ------------------------------------------------------------------------ graphdef out


@dataclass(frozen=True)
class GraphDefFile:
    """A GraphDef ``.pb`` written by :func:`write_graph_def`, and the tensor names a user
    feeds and fetches (a GraphDef has no signatures)."""

    path: str
    inputs: Mapping[str, str]  # signature key -> tensor, of the signature written
    outputs: Mapping[str, str]
    size_bytes: int

    def line(self) -> str:
        """E.g. "wrote model.pb (1.2 MB): feed image_tensor:0, fetch detection_boxes:0, ..."."""
        feeds = ", ".join(self.inputs.values())
        fetches = ", ".join(self.outputs.values())
        return (f"wrote {self.path} ({self.size_bytes / 1e6:.1f} MB): feed {feeds}; "
                f"fetch {fetches}")


def _refuse_unfrozen(graph: ServingGraph) -> None:
    variables = [n.name for n in graph.graph_def.node if n.op in VARIABLE_OPS]
    if graph.saver_def is not None or graph.variables_dir or graph.kept_variables or variables:
        raise ServingOptError(
            "--output_format=graphdef needs a frozen model, and this one keeps its variables "
            "(a GraphDef .pb cannot hold them)",
            "pass --freeze=always, or drop --output_format=graphdef and serve the SavedModel")
    if graph.init_op or graph.asset_file_defs:
        what = f"init op {graph.init_op}" if graph.init_op else "assets"
        raise ServingOptError(
            f"--output_format=graphdef cannot carry the model's {what} (tables and asset "
            "files are initialized by the SavedModel loader, which a GraphDef has no place "
            "for)", "drop --output_format=graphdef and serve the SavedModel")


def write_graph_def(graph: ServingGraph, path: str,
                    signature_key: str = SIGNATURE_KEY) -> GraphDefFile:
    """Writes ``graph``'s GraphDef as a binary ``.pb`` (atomically: a temporary file
    renamed), refused with one line when variables were kept or an init op or assets
    must run. Node names are those of the signatures, so users feed and fetch as before.
    """
    _refuse_unfrozen(graph)
    data = graph.graph_def.SerializeToString()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        full = storage_error(e, os.path.dirname(os.path.abspath(path)),
                             published="the .pb was not written")
        if full is None:
            raise
        raise full from e
    signature = graph.signature_defs.get(signature_key)
    if signature is None and graph.signature_defs:
        signature = graph.signature_defs[sorted(graph.signature_defs)[0]]
    ins = {k: v.name for k, v in signature.inputs.items()} if signature else {}
    outs = {k: v.name for k, v in signature.outputs.items()} if signature else {}
    return GraphDefFile(path, ins, outs, len(data))


def saved_model_graph(saved_model_dir: str, tags=(loader.SERVE_TAG,)) -> ServingGraph:
    """A written (optimized) SavedModel as a :class:`ServingGraph` to hand to
    :func:`write_graph_def`: its graph, signatures, init op and, when it has a
    checkpoint, a ``variables_dir`` (so the writer refuses it).
    """
    saved_model = loader.read_saved_model(saved_model_dir)
    meta_graph = loader.find_meta_graph(saved_model, tags, saved_model_dir)
    variables_dir = os.path.join(saved_model_dir, "variables")
    has_checkpoint = os.path.exists(os.path.join(variables_dir, "variables.index"))
    init_op = loader.find_init_op(meta_graph)
    return ServingGraph(
        graph_def=meta_graph.graph_def,
        signature_defs=dict(loader.serving_signatures(meta_graph)),
        tags=frozenset(tags),
        init_op=init_op.name if init_op else None,
        asset_file_defs=tuple(meta_graph.asset_file_def),
        source_dir=saved_model_dir,
        saver_def=meta_graph.saver_def if has_checkpoint and meta_graph.HasField("saver_def")
        else None,
        variables_dir=variables_dir if has_checkpoint else None,
    )
