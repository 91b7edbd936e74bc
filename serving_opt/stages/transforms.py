"""Graph Transform Tool transforms, with the original tool's ``--transforms`` syntax.

TF 2.x pip packages dropped the ``tensorflow.tools.graph_transforms`` Python module
but still ship the C++ tool behind a private pybind module; this is the one place
that touches it. Specs are parsed and checked here (names, argument names,
numeric values) before any work starts, so a typo fails in milliseconds with the
list of valid names instead of minutes later inside C++.

Protected nodes (signature tensors, init op, table initializers, asset paths) are
passed to the tool as outputs: ``strip_unused_nodes`` keeps them, ``remove_nodes``
and ``merge_duplicate_nodes`` leave them alone, ``obfuscate_names`` keeps their names.

The batch-norm folding the tool gets wrong or misses is done first, by
:mod:`serving_opt.savedmodel.batch_norm_folding`; :func:`apply_transforms` runs it where the spec
asks for those folds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, UsageError, first_line
from serving_opt.savedmodel import batch_norm_folding
from serving_opt.savedmodel.graph import ServingGraph, guarded_outputs, reattach_assertions
from serving_opt.savedmodel.host_ops import host_op_kind

# Transform name -> accepted argument names, as registered in TF's C++ tool
# (tensorflow/tools/graph_transforms/*.cc). Checked before anything runs.
KNOWN_TRANSFORMS: dict[str, frozenset[str]] = {
    "add_default_attributes": frozenset(),
    "backport_concatv2": frozenset(),
    "backport_tensor_array_v3": frozenset(),
    "flatten_atrous_conv": frozenset(),
    "fold_batch_norms": frozenset(),
    "fold_constants": frozenset({"clear_output_shapes", "ignore_errors"}),
    "fold_old_batch_norms": frozenset(),
    "freeze_requantization_ranges": frozenset(
        {"min_max_log_file", "min_percentile", "max_percentile"}
    ),
    "fuse_pad_and_conv": frozenset(),
    "fuse_resize_and_conv": frozenset(),
    "fuse_resize_pad_and_conv": frozenset(),
    "insert_logging": frozenset(
        {"op", "prefix", "show_op", "show_name", "message", "first_n", "summarize"}
    ),
    "merge_duplicate_nodes": frozenset(),
    "obfuscate_names": frozenset(),
    "quantize_nodes": frozenset(
        {"input_min", "input_max", "fallback_min", "fallback_max"}
    ),
    "quantize_weights": frozenset({"minimum_size"}),
    "remove_attribute": frozenset({"attribute_name", "op_name"}),
    "remove_control_dependencies": frozenset(),
    "remove_device": frozenset(),
    "remove_nodes": frozenset({"op", "max_inputs"}),
    "rename_attribute": frozenset({"old_attribute_name", "new_attribute_name", "op_name"}),
    "rename_node": frozenset({"old_node_name", "new_node_name"}),
    "rename_op": frozenset({"old_op_name", "new_op_name"}),
    "round_weights": frozenset({"num_steps"}),
    "set_device": frozenset({"device", "if_default"}),
    "sort_by_execution_order": frozenset(),
    "sparsify_gather": frozenset({"group_init_node", "input_checkpoint"}),
    "strip_unused_nodes": frozenset(
        {"type", "shape", "name", "type_for_name", "shape_for_name"}
    ),
}

# Transforms that change numbers (or, for remove_control_dependencies/insert_logging,
# semantics). Allowed, but flagged in the report; the parity gate decides.
LOSSY_TRANSFORMS = frozenset({
    "quantize_weights", "quantize_nodes", "round_weights", "freeze_requantization_ranges",
    "remove_control_dependencies", "insert_logging", "sparsify_gather",
})

_INT_ARGS = frozenset({"num_steps", "minimum_size", "max_inputs", "first_n", "summarize"})
_FLOAT_ARGS = frozenset({
    "input_min", "input_max", "fallback_min", "fallback_max", "min_percentile", "max_percentile",
})
_BOOL_ARGS = frozenset({"ignore_errors", "clear_output_shapes", "show_op", "show_name",
                        "if_default"})

# Lossless and safe on any inference graph: the default preset.
DEFAULT_TRANSFORMS = (
    "strip_unused_nodes remove_nodes(op=Identity, op=CheckNumerics) "
    "fold_constants(ignore_errors=true) fold_batch_norms fold_old_batch_norms "
    "merge_duplicate_nodes strip_unused_nodes sort_by_execution_order"
)


@dataclass(frozen=True)
class Transform:
    """One parsed transform: ``name(arg=v, arg=w)`` keeps repeated args in order."""

    name: str
    args: tuple[tuple[str, str], ...] = ()

    def spec(self) -> str:
        if not self.args:
            return self.name
        rendered = ", ".join(f"{k}={_quote(v)}" for k, v in self.args)
        return f"{self.name}({rendered})"

    @property
    def lossy(self) -> bool:
        return self.name in LOSSY_TRANSFORMS


def _quote(value: str) -> str:
    return f'"{value}"' if re.search(r'[\s,()="]', value) or value == "" else value


def parse_transforms(spec: str) -> tuple[Transform, ...]:
    """Parses a Graph Transform Tool ``--transforms`` string and validates it.

    Same syntax as the original tool: whitespace-separated names, optional
    ``(arg=value, ...)``, repeated arguments allowed, values may be double-quoted.
    """
    transforms: list[Transform] = []
    i, n = 0, len(spec)
    while i < n:
        if spec[i].isspace():
            i += 1
            continue
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(spec, i)
        if not match:
            raise UsageError(
                f"bad --transforms at character {i + 1}: {spec[i:i + 20]!r}",
                "write transforms as name or name(arg=value, ...) separated by spaces",
            )
        name = match.group(0)
        i = match.end()
        args: list[tuple[str, str]] = []
        if i < n and spec[i] == "(":
            i, args = _parse_args(spec, i + 1, name)
        transforms.append(Transform(name, tuple(args)))
    for t in transforms:
        _validate(t)
    return tuple(transforms)


def _parse_args(spec: str, i: int, name: str) -> tuple[int, list[tuple[str, str]]]:
    args: list[tuple[str, str]] = []
    n = len(spec)
    while True:
        while i < n and (spec[i].isspace() or spec[i] == ","):
            i += 1
        if i >= n:
            raise UsageError(f"unclosed '(' after {name} in --transforms", "add the ')'")
        if spec[i] == ")":
            return i + 1, args
        match = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*").match(spec, i)
        if not match:
            raise UsageError(
                f"bad argument in {name}(...) at {spec[i:i + 20]!r}",
                f"write arguments as {name}(arg=value, ...)",
            )
        key = match.group(1)
        i = match.end()
        if i < n and spec[i] == '"':
            end = spec.find('"', i + 1)
            if end < 0:
                raise UsageError(f"unclosed quote in {name}(...)", 'close the "')
            value = spec[i + 1:end]
            i = end + 1
        else:
            value_match = re.compile(r"[^,)\s]*").match(spec, i)
            value = value_match.group(0)
            i = value_match.end()
        args.append((key, value))


def _validate(t: Transform) -> None:
    if t.name not in KNOWN_TRANSFORMS:
        close = [k for k in KNOWN_TRANSFORMS if k.startswith(t.name[:4])]
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(
            f"unknown transform {t.name!r} in --transforms",
            f"{hint}valid transforms: {', '.join(sorted(KNOWN_TRANSFORMS))}",
        )
    allowed = KNOWN_TRANSFORMS[t.name]
    for key, value in t.args:
        if key not in allowed:
            valid = ", ".join(sorted(allowed)) or "none"
            raise UsageError(
                f"transform {t.name} has no argument {key!r}",
                f"its arguments are: {valid}",
            )
        if key in _INT_ARGS and not re.fullmatch(r"-?\d+", value):
            raise UsageError(f"{t.name}({key}={value}) needs an integer", f"e.g. {key}=256")
        if key in _FLOAT_ARGS:
            try:
                float(value)
            except ValueError:
                raise UsageError(
                    f"{t.name}({key}={value}) needs a number", f"e.g. {key}=-1.0"
                ) from None
        if key in _BOOL_ARGS and value.lower() not in ("true", "false", "1", "0"):
            raise UsageError(f"{t.name}({key}={value}) needs true or false", f"e.g. {key}=true")
    if t.name == "remove_nodes" and not any(k == "op" for k, _ in t.args):
        raise UsageError("remove_nodes needs at least one op argument",
                         "e.g. remove_nodes(op=Identity)")
    if t.name == "round_weights":
        steps = [int(v) for k, v in t.args if k == "num_steps"]
        if steps and steps[0] < 2:
            raise UsageError("round_weights(num_steps) must be at least 2", "e.g. num_steps=256")


def _pywrap():
    try:
        from tensorflow.python.util import _pywrap_transform_graph
    except ImportError as e:  # private module: fail clearly if a TF build drops it
        raise ServingOptError(
            "this TensorFlow build does not ship the Graph Transform Tool "
            "(tensorflow.python.util._pywrap_transform_graph)",
            "use --transforms=none, or install tensorflow==2.21.* (see constraints.txt)",
        ) from e
    return _pywrap_transform_graph


_DEFAULT_SUFFIX = "/serving_opt_default"


def _consts_to_placeholders(data: bytes, names: list[str]) -> tuple[bytes, dict]:
    """Const ``n`` -> PlaceholderWithDefault ``n`` over a Const ``n/serving_opt_default``.

    Returns the new graph and the original Const NodeDefs, to put back afterwards.
    """
    from tensorflow.core.framework import graph_pb2, node_def_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(data)
    wanted, originals = set(names), {}
    for node in list(graph_def.node):
        if node.name not in wanted or node.op != "Const":
            continue
        originals[node.name] = node_def_pb2.NodeDef()
        originals[node.name].CopyFrom(node)
        default = graph_def.node.add()
        default.CopyFrom(node)
        default.name = node.name + _DEFAULT_SUFFIX
        value = node.attr["value"].tensor
        node.op = "PlaceholderWithDefault"
        node.attr["shape"].shape.CopyFrom(value.tensor_shape)
        del node.attr["value"]
        del node.input[:]
        node.input.append(default.name)
    return graph_def.SerializeToString(), originals


def _placeholders_to_consts(data: bytes, originals: dict) -> bytes:
    """Puts the original Consts back (the tool may have turned them into Placeholders)."""
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(data)
    defaults = {name + _DEFAULT_SUFFIX for name in originals}
    kept = []
    for node in graph_def.node:
        if node.name in defaults:
            continue
        if node.name in originals:
            node.CopyFrom(originals[node.name])
        kept.append(node)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    return graph_def.SerializeToString()


_ANCHOR = "serving_opt/keep_anchor"
# Transforms that build a session and fetch the outputs by tensor name.
_FETCHING_TRANSFORMS = frozenset({"fold_constants", "quantize_nodes",
                                  "freeze_requantization_ranges"})


def _has_no_outputs(op: str) -> bool:
    from tensorflow.python.framework import op_def_registry

    if op == "NoOp":
        return True
    op_def = op_def_registry.get(op)
    return op_def is not None and not op_def.output_arg


def _call_groups(transforms: tuple[Transform, ...]) -> list[list[Transform]]:
    """Consecutive transforms that can share one call of the tool (same inputs and
    outputs); each call parses and serializes the whole GraphDef, weights included."""
    groups: list[list[Transform]] = []
    for t in transforms:
        fetching = t.name in _FETCHING_TRANSFORMS
        if groups and t.name != "fold_batch_norms" and \
                (groups[-1][0].name in _FETCHING_TRANSFORMS) == fetching:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


# Graphs up to this size are transformed one pass per call of the tool, so the report can
# say what each pass did; larger ones (weights folded in) keep the shared calls, each of
# which parses and serializes everything.
TRACE_MAX_BYTES = 256 * 2**20


def apply_transforms(graph: ServingGraph, transforms: tuple[Transform, ...],
                     skipped: list[str] | None = None,
                     trace: list | None = None) -> ServingGraph:
    """Runs TF's C++ Graph Transform Tool on the graph, protecting what serving needs.

    With ``skipped`` (a list), a transform the tool fails on is left out and its error
    appended there instead of raised: the lossless default preset degrades instead of
    failing a run on a graph one of its transforms cannot handle.

    With ``trace`` (a list), ``("", the GraphDef the first pass gets)`` and then
    ``(spec, GraphDef after it)`` per pass (per shared call for graphs over
    :data:`TRACE_MAX_BYTES`) are appended, for :func:`savedmodel.graph_diff.diff_passes`.
    """
    from tensorflow.core.framework import graph_pb2, types_pb2

    if not transforms:
        return graph
    node_ops = {n.name: n.op for n in graph.graph_def.node}
    # Only true Placeholders go in as inputs: strip_unused_nodes turns any other input
    # node into a float Placeholder. Other fed tensors are kept as outputs instead.
    inputs = [n for n in graph.signature_input_nodes() if node_ops.get(n) == "Placeholder"]
    outputs = [n for n in graph.must_keep() if n not in inputs]
    graph_def = type(graph.graph_def)()
    graph_def.CopyFrom(graph.graph_def)
    if any(t.name == "fold_old_batch_norms" for t in transforms):
        batch_norm_folding.downgrade_foldable_batch_norms(graph_def, set(outputs))
    # Transforms that run the graph (fold_constants) fetch every output by tensor, and a
    # NoOp init op or a table initializer has no tensor: the tool then fails, or with
    # ignore_errors=true silently skips the whole transform. Those nodes hang off one
    # anchor Const instead (control inputs keep them alive), removed afterwards.
    silent = [n for n in outputs if _has_no_outputs(node_ops.get(n, ""))]
    tensor_outputs = [n for n in outputs if n not in silent]
    if silent:
        anchor = graph_def.node.add()
        anchor.name, anchor.op = _ANCHOR, "Const"
        anchor.attr["dtype"].type = types_pb2.DT_INT32
        anchor.attr["value"].tensor.dtype = types_pb2.DT_INT32
        anchor.attr["value"].tensor.int_val.append(0)
        anchor.input.extend("^" + n for n in silent)
    data = graph_def.SerializeToString()
    if trace is not None:  # where the first pass starts (batch norms downgraded, anchored)
        trace.append(("", graph_def))
    # Folding treats its inputs as feeds: every fed node (asset paths fed at load, the
    # saver's checkpoint path, non-Placeholder signature inputs) goes in, or its consumer
    # would be folded with the export-time value baked in.
    fed = [n for n in graph.fed_nodes()
           if node_ops.get(n) in ("Placeholder", "PlaceholderWithDefault", "Const")]
    # The tool accepts only placeholders as feeds, but asset paths are Consts the loader
    # overrides: they become PlaceholderWithDefault around the fetching transforms.
    const_fed = [n for n in fed if node_ops[n] == "Const"]
    # Ops touching files or the host are never folded, whatever the spec: a ReadFile of
    # a constant path would otherwise become a constant holding the build host's file.
    host_op_types = sorted({n.op for n in graph_def.node if host_op_kind(n) is not None})
    groups = _call_groups(transforms)
    if trace is not None and len(data) <= TRACE_MAX_BYTES:
        groups = [[t] for group in groups for t in group]
    for group in groups:
        if group[0].name == "fold_batch_norms":
            # Needs the constants fold_constants produced, so it runs in between;
            # the tool's own fold then finds nothing left it could get wrong.
            staged = graph_pb2.GraphDef()
            staged.ParseFromString(data)
            folds = batch_norm_folding.fold_batch_norm_scales(staged, set(outputs) | set(inputs))
            if folds != batch_norm_folding.FoldReport():
                data = staged.SerializeToString()
        fetching = group[0].name in _FETCHING_TRANSFORMS
        these_inputs = fed if fetching else inputs
        originals: dict = {}
        if fetching and const_fed:
            data, originals = _consts_to_placeholders(data, const_fed)
        keep = [n for n in tensor_outputs if not (fetching and n in fed)]
        keep += ([_ANCHOR] if silent else []) + ([] if fetching else silent)
        spec = " ".join(_never_fold(t, host_op_types).spec() for t in group)
        try:
            data = _pywrap().TransformGraphWithStringInputs(
                data, ",".join(these_inputs), ",".join(keep), spec)
        except ServingOptError:
            raise
        except Exception as e:
            if skipped is None:
                raise ServingOptError(
                    f"the Graph Transform Tool failed on {spec!r}: {first_line(e)}",
                    "drop or fix the failing transform in --transforms",
                ) from e
            # One at a time, so only the transform that fails is left out.
            for transform in group:
                try:
                    data = _pywrap().TransformGraphWithStringInputs(
                        data, ",".join(these_inputs), ",".join(keep),
                        _never_fold(transform, host_op_types).spec())
                except ServingOptError:
                    raise
                except Exception as single:
                    skipped.append(f"{transform.spec()}: {first_line(single)}")
        if originals:
            data = _placeholders_to_consts(data, originals)
        if trace is not None:
            after = graph_pb2.GraphDef()
            after.ParseFromString(data)
            trace.append((" ".join(t.spec() for t in group), after))
    out_bytes = data
    result = graph_pb2.GraphDef()
    result.ParseFromString(out_bytes)
    kept = [n for n in result.node if n.name != _ANCHOR]
    del result.node[:]
    result.node.extend(kept)
    # The tool rebuilds the GraphDef from nodes only; keep the function library.
    if graph.graph_def.library.function and not result.library.function:
        result.library.CopyFrom(graph.graph_def.library)
    result.versions.CopyFrom(graph.graph_def.versions)
    # remove_nodes and fold_constants drop the control inputs of what they replace: an
    # assertion on the output path would stop running.
    guards = reattach_assertions(result, guarded_outputs(graph.graph_def,
                                                         graph.signature_output_nodes()))
    return graph.replace(graph_def=result, protected_nodes=tuple(dict.fromkeys(
        graph.protected_nodes + tuple(guards))))


def _never_fold(transform: Transform, op_types: list[str]) -> Transform:
    """``fold_constants`` with ``exclude_op`` for each op type in ``op_types`` (the tool's
    own argument, not offered in ``--transforms``: nothing a user writes can lift it)."""
    if transform.name != "fold_constants" or not op_types:
        return transform
    return Transform(transform.name, transform.args + tuple(("exclude_op", op)
                                                            for op in op_types))


def describe(transforms: tuple[Transform, ...]) -> str:
    """Canonical one-line spec, for reports."""
    return " ".join(t.spec() for t in transforms)


def resolve_spec(spec: str | None) -> tuple[Transform, ...]:
    """``None``/"default" is the lossless preset, "none" (or empty) applies nothing.
    """
    if spec is None or spec.strip().lower() == "default":
        return parse_transforms(DEFAULT_TRANSFORMS)
    if spec.strip().lower() in ("", "none"):
        return ()
    return parse_transforms(spec)
