"""The loader's own use of checkpoint files: the saver named by ``saver_def``, accepted
only in the shapes TF's savers build (see :mod:`serving_opt.savedmodel.untrusted`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from serving_opt.savedmodel.graph import CALL_OPS, node_name
from serving_opt.savedmodel.untrusted.reach import (
    _MAX_NAME_DEPTH,
    _attr,
    _data_inputs,
    _Graph,
    _Root,
)

_FILENAME_FEEDS = frozenset({"Placeholder", "PlaceholderWithDefault", "Const"})
# The ops tf.compat.v1.train.Saver / tf.saved_model.save put around the checkpoint ops.
# ExpandDims and SelectV2: Grappler's arithmetic optimizer rewrites a one-input Pack (the
# merge's prefix list) and Select, so an optimized model's saver has them.
_NAME_OPS = frozenset({"Const", "Identity", "StringJoin", "ShardedFilename", "Select",
                       "SelectV2", "StaticRegexFullMatch", "Pack", "ExpandDims"})
_SAVED_OBJECTS = frozenset({
    "VarHandleOp", "VariableV2", "Variable", "MutableHashTableV2",
    "MutableHashTableOfTensorsV2", "MutableDenseHashTableV2", "MutableHashTable",
    "MutableHashTableOfTensors", "MutableDenseHashTable",
    "BoostedTreesEnsembleResourceHandleOp", "BoostedTreesQuantileStreamResourceHandleOp",
})
_RESTORE_OPS = frozenset({
    "NoOp", "RestoreV2", "Restore", "RestoreSlice", "Assign", "AssignVariableOp",
    "LookupTableImportV2", "LookupTableImport", "BoostedTreesDeserializeEnsemble",
    "BoostedTreesQuantileStreamResourceDeserialize",
}) | _NAME_OPS | _SAVED_OBJECTS
_SAVE_OPS = frozenset({
    "NoOp", "SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints", "ReadVariableOp",
    "DisableCopyOnRead", "LookupTableExportV2", "LookupTableExport",
    "BoostedTreesSerializeEnsemble", "BoostedTreesQuantileStreamResourceGetBucketBoundaries",
}) | _NAME_OPS | _SAVED_OBJECTS
# What TF2's save function is passed besides the saved objects themselves: a read of
# one saved object (its only input) -> the saved objects it may read. A mutable table's
# export; and TF 2.3-2.8's variable read: tf.saved_model.save copied each variable into
# the exported graph as an UninitializedVariable, whose graph-mode constructor adds
# ``<var>/Read/ReadVariableOp`` (resource_variable_ops.py, ``with
# ops.name_scope("Read"): value = read_variable_op(handle, dtype)``, its
# ``_graph_element``), and saveable_objects_for_op saved ``op._graph_element`` of a
# graph-mode variable (saveable_object_util.py), so the traced save function captured
# that read; the restore function captured ``var.op.inputs[0]``, the VarHandleOp
# itself (exports of TF 2.3.4, 2.4.4, 2.5.3, 2.6.5, 2.8.4; 2.12 passes the handle).
_SAVED_OBJECT_READS = {
    "LookupTableExportV2": _SAVED_OBJECTS,
    "LookupTableExport": _SAVED_OBJECTS,
    "ReadVariableOp": frozenset({"VarHandleOp"}),
}
# Reads passed only to the save function (the restore function assigns to the handle).
_SAVE_ONLY_READS = frozenset({"ReadVariableOp"})
# The inputs of a checkpoint op that name files.
_FILE_INPUTS = {"SaveV2": (0,), "Save": (0,), "SaveSlices": (0,), "RestoreV2": (0,),
                "Restore": (0,), "RestoreSlice": (0,), "MergeV2Checkpoints": (0, 1)}
# What TF appends to the prefix for sharded saves: ".part" (s3), "_temp/part" (TF 2),
# "_temp_<uuid hex>/part" (TF 1.x).
_SHARD_SUFFIX = re.compile(r"\.part|_temp(_[0-9a-f]{32})?/part")
# How many nodes the checks of savers saver_def does not name may read in all (each
# reads what its checkpoint op runs): a TF saver's ops run a few nodes each, while a
# crafted model's thousands of checkpoint ops over one long chain would be quadratic.
_MAX_SPARE_WORK = 100_000


def _const_string(node) -> str | None:
    if node is None or node.op != "Const" or _data_inputs(node):
        return None
    values = _attr(node, "value").tensor.string_val
    return values[0].decode("utf-8", "replace") if len(values) == 1 else None


class _FileNames:
    """Whether a tensor of ``body`` (top-level nodes, or one function's body) is the
    checkpoint prefix, or a name TF's savers derive from it."""

    def __init__(self, body: dict, prefix: str) -> None:
        self.body = body
        self.prefix = prefix
        # Memoized per (tensor, depth): a Pack or StringJoin whose inputs share one node,
        # level after level, is a DAG of few nodes but exponentially many paths.
        self.memo: dict[tuple[str, str, int], bool] = {}

    def from_prefix(self, tensor: str, depth: int = 0) -> bool:
        key = ("prefix", tensor, depth)
        if key not in self.memo:
            self.memo[key] = self._from_prefix(tensor, depth)
        return self.memo[key]

    def _suffix(self, tensor: str, depth: int) -> bool:
        key = ("suffix", tensor, depth)
        if key not in self.memo:
            self.memo[key] = self._is_suffix(tensor, depth)
        return self.memo[key]

    def _from_prefix(self, tensor: str, depth: int) -> bool:
        name = node_name(tensor)
        if name == self.prefix:
            return True
        node = self.body.get(name)
        if node is None or depth > _MAX_NAME_DEPTH:
            return False
        data = _data_inputs(node)
        if node.op == "Identity":
            return len(data) == 1 and self.from_prefix(data[0], depth + 1)
        if node.op == "StringJoin":
            return (_attr(node, "separator").s == b"" and len(data) >= 2
                    and self.from_prefix(data[0], depth + 1)
                    and all(self._suffix(d, depth + 1) for d in data[1:]))
        if node.op == "ShardedFilename":
            return (len(data) == 3 and self.from_prefix(data[0], depth + 1)
                    and all(self._int_const(d) for d in data[1:]))
        if node.op == "Pack":
            return bool(data) and all(self.from_prefix(d, depth + 1) for d in data)
        if node.op == "ExpandDims":
            return (len(data) == 2 and self.from_prefix(data[0], depth + 1)
                    and self._int_const(data[1]))
        return False

    def _is_suffix(self, tensor: str, depth: int) -> bool:
        node = self.body.get(node_name(tensor))
        if depth > _MAX_NAME_DEPTH:
            return False
        value = _const_string(node)
        if value is not None:
            return bool(_SHARD_SUFFIX.fullmatch(value))
        if node is None or node.op not in ("Select", "SelectV2"):
            return False
        data = _data_inputs(node)
        if len(data) != 3:
            return False
        cond = self.body.get(node_name(data[0]))
        return (cond is not None and cond.op == "StaticRegexFullMatch"
                and len(_data_inputs(cond)) == 1
                and self.from_prefix(_data_inputs(cond)[0], depth + 1)
                and all(self._suffix(d, depth + 1) for d in data[1:]))

    def _int_const(self, tensor: str) -> bool:
        # Grappler's constant folding gives the Consts it makes control inputs; what
        # those run is checked with the rest of the saver.
        node = self.body.get(node_name(tensor))
        return node is not None and node.op == "Const" and not _data_inputs(node)


def _bad_ops(body: dict, names: Iterable[str], allowed: frozenset, prefix: str) -> list[str]:
    return [f"{body[n].op} {n!r}" for n in sorted(names)
            if n != prefix and n in body and body[n].op not in allowed]


def _file_name_problems(body: dict, names: Iterable[str], prefix: str, what: str) -> list[str]:
    names_ok = _FileNames(body, prefix)
    problems = []
    for name in sorted(names):
        node = body.get(name)
        if node is None or node.op not in _FILE_INPUTS:
            continue
        data = _data_inputs(node)
        for index in _FILE_INPUTS[node.op]:
            if index >= len(data) or not names_ok.from_prefix(data[index]):
                source = node_name(data[index]) if index < len(data) else "nothing"
                problems.append(f"{node.op} {name!r} takes its file name from {source!r}, "
                                f"not from {what}")
    return problems


@dataclass
class _Side:
    """The restore op or the save tensor of the SaverDef, and what is wrong with it."""

    root: str
    desc: str
    nodes: set
    functions: set
    problems: list


class _Saver:
    """The SaverDef's subgraph, checked against the shapes TF's savers build."""

    def __init__(self, meta_graph, graph: _Graph) -> None:
        self.graph = graph
        self.sides: list[_Side] = []
        self.spare_work = 0  # nodes _spare_saver has read, up to _MAX_SPARE_WORK
        self.body_problems: dict[tuple[str, frozenset], list[str]] = {}
        self.concrete_functions = set(meta_graph.object_graph_def.concrete_functions)
        if not meta_graph.HasField("saver_def"):
            return
        saver = meta_graph.saver_def
        self.prefix = node_name(saver.filename_tensor_name)
        prefix_problems = self._prefix_problems(self.prefix, saver.filename_tensor_name)
        for tensor, desc, allowed in (
                (saver.restore_op_name, "the saver's restore op", _RESTORE_OPS),
                (saver.save_tensor_name, "saver_def.save_tensor_name", _SAVE_OPS)):
            if not tensor:
                continue
            root = node_name(tensor)
            node = graph.nodes.get(root)
            if node is None:
                side = _Side(root, f"{desc} {root}", set(), set(), [f"{root!r} is no node"])
            elif node.op in CALL_OPS:
                side = self._functional_side(node, f"{desc} {root}", allowed)
            else:
                side = self._graph_side(root, f"{desc} {root}", allowed)
            side.problems[:0] = prefix_problems
            self.sides.append(side)

    def _prefix_problems(self, prefix: str, tensor: str) -> list[str]:
        """The file name the loader feeds: a string Placeholder, or the Const /
        PlaceholderWithDefault(-of-Const) chain TF1 savers write (fed, so its default
        never runs)."""
        node = self.graph.nodes.get(prefix)
        where = f"saver_def.filename_tensor_name {tensor!r}"
        if node is None:
            return [f"{where} is no node"]
        if node.op not in _FILENAME_FEEDS or _attr(node, "dtype").type != 7:  # DT_STRING
            return [f"{where} is a {node.op}, not a string placeholder the loader feeds"]
        if tensor.split(":")[1:] not in ([], ["0"]):
            return [f"{where} is not the node's only output"]
        chain = node
        for _ in range(_MAX_NAME_DEPTH):
            if chain.op != "PlaceholderWithDefault":
                break
            data = _data_inputs(chain)
            if len(chain.input) != 1 or len(data) != 1:
                return [f"{where} has inputs a saver does not give it"]
            chain = self.graph.nodes.get(node_name(data[0]))
            if chain is None or chain.op not in ("PlaceholderWithDefault", "Const"):
                return [f"{where} defaults to something other than a constant"]
        if chain.op != "PlaceholderWithDefault" and chain.input:
            return [f"{where} has inputs a saver does not give it"]
        return []

    def _closure(self, root: str, prefix: str) -> set[str]:
        nodes: set[str] = set()
        stack = [root]
        while stack:
            name = stack.pop()
            if name in nodes or name not in self.graph.nodes:
                continue
            nodes.add(name)
            if name != prefix:  # fed by the loader: nothing upstream of it runs
                stack.extend(node_name(i) for i in self.graph.nodes[name].input)
        return nodes

    def _graph_side(self, root: str, desc: str, allowed: frozenset) -> _Side:
        """TF1: the nodes the op runs, up to the fed file name."""
        nodes = self._closure(root, self.prefix)
        problems = [f"{root} also runs {op}" for op in
                    _bad_ops(self.graph.nodes, nodes, allowed, self.prefix)]
        problems += _file_name_problems(self.graph.nodes, nodes, self.prefix,
                                        "saver_def.filename_tensor_name")
        return _Side(root, desc, nodes, set(), problems)

    def _spare_saver(self, node, reaching: list[_Root]) -> str | None:
        """A TF1 saver that saver_def does not name (a training script's
        tf.compat.v1.train.Saver, next to the one the SavedModel builder adds): accepted
        when it has exactly a saver's shape and nothing a loader or request runs reaches
        it, so it never runs."""
        not_ours = "not part of the saver that saver_def names"
        if reaching:
            return f"{reaching[0].desc} reaches it, and it is {not_ours}"
        data = _data_inputs(node)
        prefix = data[0] if data else ""
        for _ in range(_MAX_NAME_DEPTH):
            source = self.graph.nodes.get(node_name(prefix))
            if source is None or source.op in _FILENAME_FEEDS or not _data_inputs(source):
                break
            prefix = _data_inputs(source)[0]
        prefix = node_name(prefix)
        problems = self._prefix_problems(prefix, prefix) if prefix in self.graph.nodes \
            else ["its file name comes from no saver's file name placeholder"]
        if not problems and self.spare_work > _MAX_SPARE_WORK:
            problems = [f"the check's limit of {_MAX_SPARE_WORK} nodes read for savers "
                        "saver_def does not name is spent, so it is refused unjudged"]
        if not problems:
            allowed = _RESTORE_OPS if node.op.startswith("Restore") else _SAVE_OPS
            nodes = self._closure(node.name, prefix)
            self.spare_work += len(nodes)
            problems = [f"it also runs {op}" for op in
                        _bad_ops(self.graph.nodes, nodes, allowed, prefix)]
            problems += _file_name_problems(self.graph.nodes, nodes, prefix, repr(prefix))
        if problems:
            return f"{not_ours}, nor a spare saver of TF's shape: {problems[0]}"
        return None

    def _functional_side(self, call, desc: str, allowed: frozenset) -> _Side:
        """TF2: one call of a function whose first argument is the file name, whose other
        arguments are the saved objects (and the object-graph Const), called by nothing
        else."""
        problems: list[str] = []
        fname = _attr(call, "f").func.name
        function = self.graph.library.get(fname)
        data = _data_inputs(call)
        nodes = {call.name, self.prefix}
        if function is None:
            return _Side(call.name, desc, nodes, set(), [f"{call.name} calls no library function"])
        if len(data) != len(call.input):
            problems.append(f"{call.name} has control inputs")
        if not data or node_name(data[0]) != self.prefix:
            problems.append(f"{call.name} is not passed saver_def.filename_tensor_name first")
        for tensor in data[1:]:
            source = self.graph.nodes.get(node_name(tensor))
            saved = source
            if source is not None and source.op in _SAVED_OBJECT_READS and \
                    len(source.input) == 1 and (allowed is _SAVE_OPS or
                                                source.op not in _SAVE_ONLY_READS):
                # A mutable table's save (its contents exported at the top level), or a
                # TF 2.3-2.8 variable's <var>/Read/ReadVariableOp: one read, no control
                # input, of a saved object of the kinds it reads.
                saved = self.graph.nodes.get(node_name(source.input[0]))
                if saved is not None and saved.op not in _SAVED_OBJECT_READS[source.op]:
                    saved = None
            if not self._saved_object(saved):
                what = f"{source.op} {source.name!r}" if source is not None else repr(tensor)
                problems.append(f"{call.name} is passed {what}, not a saved object")
            else:
                nodes.update({source.name, saved.name})
        others = [r for r in self.graph.refs[fname] if r.node != call.name or r.function]
        if others:
            where = f" in function {others[0].function}" if others[0].function else ""
            problems.append(f"function {fname} is also reached via {others[0].how}{where}")
        problems += self._body_problems(fname, allowed)
        return _Side(call.name, desc, nodes, {fname}, problems)

    def _body_problems(self, fname: str, allowed: frozenset) -> list[str]:
        """A traced save or restore function: no call, only the ops ``allowed``, every
        file name derived from its first argument. Once per function: each of its
        checkpoint ops asks."""
        key = (fname, allowed)
        if key not in self.body_problems:
            self.body_problems[key] = self._judge_body(fname, allowed)
        return self.body_problems[key]

    def _judge_body(self, fname: str, allowed: frozenset) -> list[str]:
        function = self.graph.library[fname]
        body = {n.name: n for n in function.node_def}
        problems = []
        calls = self.graph.function_calls.get(fname)
        if calls:
            problems.append(f"function {fname} calls {calls[0][0]}")
        args = [a.name for a in function.signature.input_arg]
        prefix_arg = args[0] if args else ""
        problems += [f"function {fname} also runs {op}"
                     for op in _bad_ops(body, body, allowed, prefix_arg)]
        problems += _file_name_problems(body, body, prefix_arg, f"its argument {prefix_arg!r}")
        return problems

    def _spare_function(self, fname: str, node, reaching: list[_Root]) -> str | None:
        """A TF2 traced save or restore function that nothing references: a TF2 SavedModel
        loaded into a TF1 graph (tf.saved_model.load in graph mode) brings its whole
        function library, its ``_traced_save``/``_traced_restore`` included, and a
        Builder saving that graph adds its own saver. Accepted when it has exactly their
        shape, no node, function attr or gradient entry names it, no object graph
        exposes it and nothing a loader or request runs reaches it: nothing can call it."""
        not_ours = "not part of the saver that saver_def names"
        if reaching:
            return f"{reaching[0].desc} reaches it, and it is {not_ours}"
        if self.graph.refs.get(fname) or fname in self.graph.gradient_of or \
                fname in self.concrete_functions:
            return not_ours
        allowed = _RESTORE_OPS if node.op.startswith("Restore") else _SAVE_OPS
        problems = self._body_problems(fname, allowed)
        if problems:
            return f"{not_ours}, nor a spare saver function of TF's shape: {problems[0]}"
        return None

    def _saved_object(self, node) -> bool:
        """A variable or table handle (a dense table's keys are Consts), or a Const."""
        if node is None or node.op not in _SAVED_OBJECTS | {"Const"}:
            return False
        sources = [self.graph.nodes.get(node_name(i)) for i in node.input]
        return node.op != "Const" and all(
            not i.startswith("^") and s is not None and s.op == "Const" and not s.input
            for i, s in zip(node.input, sources)) or not node.input

    def problem(self, function: str | None, node, reaching: list[_Root]) -> str | None:
        """None when ``node`` (a checkpoint op) is the loader's saver, run only by it."""
        for side in self.sides:
            inside = function in side.functions if function else node.name in side.nodes
            if not inside:
                continue
            runners = [r for r in reaching if r.kind in ("signature", "init")]
            reasons = [f"{runners[0].desc} reaches {side.desc}, which only the loader may "
                       "run"] if runners else []
            reasons += [f"{side.desc} is not what TF's savers build: {p}"
                        for p in side.problems[:2]]
            return "; ".join(reasons) or None
        if function is None:
            return self._spare_saver(node, reaching)
        return self._spare_function(function, node, reaching)


