"""The untrusted-model stance: a SavedModel is code, and nothing of it runs on the
build host that touches files or the host, unless the user says so.

The check is static and covers the whole model: every node of the graph and of every
library function (called or not, reached through a call, a function-valued attr of any
depth, an ``If``/``While`` branch or the ``library.gradient`` of a ``SymbolicGradient``)
whose op is in :mod:`serving_opt.host_ops`. Reachability decides only how a finding is
described (its *route*: which signature or loader op runs it, and through what) and
whether one of the loader's own two uses of files applies, each accepted only in the
exact shape TensorFlow's exporters write and the loaders run:

* **The saver** named by ``saver_def``: its checkpoint ops, when the restore op and the
  save tensor are built like ``tf.compat.v1.train.Saver`` (TF1: ``RestoreV2`` /
  ``SaveV2`` / ``MergeV2Checkpoints`` / ``StringJoin`` / ``ShardedFilename`` / ``Const``
  / ``Identity`` / ``Assign*`` / ``NoOp`` over variables and mutable tables) or
  ``tf.saved_model.save`` (TF2: one call of a ``_traced_restore``/``_traced_save``
  function with the same ops, called by nothing else, passed the saved objects, or
  TF 2.3-2.8's ``<var>/Read/ReadVariableOp`` of one for the save), every file name
  derived from the ``filename_tensor_name`` placeholder the loader feeds (plus the
  ``_temp/part``-style suffixes and shard numbers TF adds), with no other input, and
  never reached from a signature or the init op. A second TF1 saver of that shape which
  saver_def does not name (a training script's own ``Saver``, next to the one the
  SavedModel builder adds) is tolerated while nothing a loader or a request runs
  reaches it; likewise a ``_traced_save``/``_traced_restore`` function of that shape
  that nothing references (a TF2 model loaded into a TF1 graph brings its own).
* **Reading an asset** (``InitializeTableFromTextFile*``, ``ReadFile``): the file name
  comes, through ``Identity`` only, from a node of the MetaGraph's asset_file_def (or
  the ``saved_model_assets`` collection of TF1 exports, as the loaders read it) that is
  a ``Placeholder`` or ``Const`` the loader feeds, or, in TF2, from the variable
  ``tf.saved_model.save`` assigns that placeholder to; inside a function, from an
  argument that every call of the function passes such a path (a graph-level call, or
  a call in a function whose own argument is one, a few calls deep) and that the object
  graph, if it binds it, binds to an ``asset``. The loaders feed asset paths only when
  they run the init op (and the restore op), so a signature must not reach the op: a
  request would read whatever the node holds (a TF1 asset Const holds the *build
  host's* absolute path).

Three things a node's op type does not say are read too:

* **Embedded graphs** (:data:`serving_opt.host_ops.EMBEDDED_GRAPH_OPS`): a
  ``DatasetFromGraph`` runs the GraphDef serialized in its ``graph_def`` input. When
  that input is a string ``Const`` (through ``Identity``), the GraphDef is parsed and
  checked like the model's (its nodes, its library, graphs it embeds in turn, a few
  deep), with no loader exception (nothing feeds it checkpoint or asset paths); a
  finding there names the embedding op (``TextLineDataset node 'x' in function f
  inside the graph_def of DatasetFromGraph node 'd' ...``). Any other source (a
  computed string, an argument, a signature input) refuses the op itself: it runs a
  graph nothing checked. ``DeserializeIterator`` (TF 1.x-2.2 rebuilt the dataset from
  a GraphDef in the iterator state, a variant) is always refused that way.
* **Attribute placeholders**: a library function's node may hold
  ``AttrValue.placeholder`` instead of a value, bound when the function is
  instantiated by the attr map of the ``NameAttrList`` that references it (a call's
  ``f``, a branch or body attr) or by the attrs of a node calling it as an op. On the
  attr of an op of ``CONDITIONAL_HOST_OPS`` (``PrintV2.output_stream``,
  ``FixedUnigramCandidateSampler.vocab_file``, ``DecodeProtoV2``/``EncodeProto``
  ``descriptor_source``, ``Copy``/``CopyHost`` ``debug_ops_spec``) every value a
  reference binds is judged (a binding to the caller's own placeholder is followed up
  through the caller's references); a placeholder some reference leaves unbound (or a
  function nothing references, a ``library.gradient``, the top level) is a finding.
* **Escaping assets**: an asset of asset_file_def or of the TF1 ``saved_model_assets``
  collection whose filename is absolute or leads out of ``assets/`` with ``..``
  (``loader.safe_asset_path``, the rule of ``inspect``'s ``asset_path_escapes``) is a
  finding: the loaders feed ``<model>/assets/<filename>``, a file outside the model,
  to whatever reads it. (Symlinks out of the model are refused by
  ``loader.check_model_files``, which reads the directory; this check reads protos.)

Everything else is a finding: :func:`host_op_uses` lists them, ``inspect`` rates them,
and :func:`refuse_host_ops` turns the first into the one-line error ``optimize``,
``validate`` and ``compare`` raise before running the model; ``--allow_file_ops`` opts
in.

Example:
    >>> uses = host_op_uses(meta_graph)
    >>> uses[0].op, uses[0].describe()
    ('WriteFile', "WriteFile node 'hook', control input of save/restore_all (the saver's
    restore op, run at every load)")
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from serving_opt.errors import ServingOptError
from serving_opt.graph import CALL_OPS, node_name, tensor_info_nodes
from serving_opt.host_ops import (
    ASSET_READ_OPS,
    CHECKPOINT_OPS,
    CONDITIONAL_HOST_OPS,
    EMBEDDED_GRAPH_OPS,
    READS_FILES,
    RUNS_CODE,
    RUNS_GRAPH,
    TOUCHES_HOST,
    WRITES_FILES,
    conditional_kind,
    host_op_kind,
)
from serving_opt.savedmodel.asset_paths import asset_path_problem, shown_filename

INIT_OP = "init op"  # the pseudo-signature name of the loader's init op

# Findings are reported most dangerous first.
_KIND_ORDER = {RUNS_CODE: 0, WRITES_FILES: 1, TOUCHES_HOST: 2, RUNS_GRAPH: 3,
               READS_FILES: 4}
# The op of the finding for an asset whose filename leads out of assets/ (no node).
ESCAPING_ASSET = "asset"
# The op of the finding for an entry of the assets collection the check cannot read.
UNREADABLE_ASSET = "asset declaration"
# How many graphs deep an embedded graph (a GraphDef in a DatasetFromGraph constant,
# holding another) is read; deeper ones are refused.
_MAX_EMBEDDING_DEPTH = 4
# How many calls up an attr placeholder is followed to the value that binds it.
_MAX_BINDING_DEPTH = 8
# How many (call site, bound value) steps resolving every attr placeholder of a graph
# may take: memoized, a graph needs about (references x distinct values x depth);
# past this the placeholder counts as unresolved (refused), never guessed.
_MAX_BINDING_WORK = 200_000


@dataclass(frozen=True)
class HostOpUse:
    """One host op of the model: ``function`` is None at the top level.

    ``signatures`` are the serving signatures (and :data:`INIT_OP`) whose run reaches it,
    empty when none does (the saver's restore op or nothing at all may run it); ``route``
    says how it runs; ``reason`` why the loader's own use of files (saver, assets) does
    not cover it, empty for ops no exception is made for.
    """

    op: str
    name: str
    function: str | None
    kind: str  # host_ops.WRITES_FILES, ...
    signatures: tuple[str, ...]
    route: str = ""
    reason: str = ""
    # Where the op is inside the graph that the node ``name`` runs from a serialized
    # GraphDef (host_ops.EMBEDDED_GRAPH_OPS), e.g. "node 'x' inside the graph_def of
    # DatasetFromGraph"; empty for an op of the model's own graph.
    inside: str = ""
    inside_label: str = ""

    @property
    def label(self) -> str:
        label = f"{self.function}/{self.name}" if self.function else self.name
        return f"{label}/graph_def:{self.inside_label}" if self.inside else label

    @property
    def where(self) -> str:
        where = f"node {self.name!r}"
        where = f"{where} in function {self.function}" if self.function else where
        if self.op == ESCAPING_ASSET:
            where = f"{self.name!r} of the MetaGraph's assets"
        elif self.op == UNREADABLE_ASSET:
            return self.name
        return f"{self.inside} {where}" if self.inside else where

    def describe(self) -> str:
        """The op, where it is, how it runs and why it is not the loader's: one clause.

        Example:
            >>> use.describe()
            "WriteFile node 'WriteFile' in function HostGrad_x via library.gradient of
            SymbolicGradient g/SymbolicGradient, reached from signature serving_default"
        """
        sep = " " if self.function else ", "
        text = f"{self.op} {self.where}{sep}{self.route}"
        return f"{text} ({self.reason})" if self.reason else text


# ------------------------------------------------------------------------ graph index


@dataclass(frozen=True)
class _Ref:
    """A reference to a library function: from ``node`` (in ``function``, None at the
    top level), described by ``how``; ``call_arg`` when it is the ``f`` of a call op
    (so the call's inputs are the function's arguments)."""

    function: str | None
    node: str
    how: str
    call_arg: bool
    # The attrs the reference binds the function's attr placeholders with (the
    # NameAttrList's attr map, or a call-as-op node's attrs); None when it binds none
    # (a library.gradient entry).
    binds: object = field(default=None, compare=False)


@dataclass(frozen=True)
class _Root:
    """Something a loader or a request runs: a signature's outputs, the init op, the
    saver's restore op or its save tensor."""

    key: str  # signature key, INIT_OP, "restore" or "save"
    kind: str  # "signature", "init", "restore", "save"
    desc: str
    start_desc: str
    starts: tuple[str, ...]


def _data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _attr(node, name: str):
    """``node.attr[name]`` without adding it: indexing a proto map inserts the key, and
    the check must leave the MetaGraph exactly as it found it (inspect measures it)."""
    from tensorflow.core.framework import attr_value_pb2

    return node.attr[name] if name in node.attr else attr_value_pb2.AttrValue()


class _Graph:
    """The top-level nodes, the library, who references which function, and walks."""

    def __init__(self, graph_def, embedded_cache: dict | None = None) -> None:
        self.nodes = {n.name: n for n in graph_def.node}
        # _embedded's findings per (graph bytes, depth), shared with the graphs embedded
        # in this one: many ops naming one constant, a few deep, parse it once.
        self.embedded_cache: dict = {} if embedded_cache is None else embedded_cache
        self.library = {f.signature.name: f for f in graph_def.library.function}
        self.gradients = {g.function_name: g.gradient_func for g in graph_def.library.gradient}
        self.gradient_of = {g.gradient_func: g.function_name
                            for g in graph_def.library.gradient}
        self.refs: dict[str, list[_Ref]] = collections.defaultdict(list)
        # _bindings' memo and step count (work done resolving attr placeholders).
        self.binding_memo: dict[tuple[str, str, int], list[tuple[object, str]]] = {}
        self.binding_work = 0
        self.top_calls: dict[str, list[tuple[str, str]]] = {}
        self.function_calls: dict[str, list[tuple[str, str]]] = {}
        for node in graph_def.node:
            calls = self._function_refs(node)
            self.top_calls[node.name] = [(f, how) for f, how, *_ in calls]
            self.refs_from(None, node, calls)
        for function in graph_def.library.function:
            found = []
            for node in function.node_def:
                calls = self._function_refs(node)
                found += [(f, f"{how} in function {function.signature.name}")
                          for f, how, *_ in calls]
                self.refs_from(function.signature.name, node, calls)
            self.function_calls[function.signature.name] = found
        self.consumers: dict[str, list[str]] = collections.defaultdict(list)
        for node in graph_def.node:
            for i in node.input:
                self.consumers[node_name(i)].append(node.name)

    def refs_from(self, function: str | None, node, calls) -> None:
        for fname, how, call_arg, binds in calls:
            self.refs[fname].append(_Ref(function, node.name, how, call_arg, binds))

    def _function_refs(self, node) -> list[tuple[str, str, bool, object]]:
        """(function, how, is the f of a call op, the attrs it binds) for every
        function ``node`` may run: func attrs and func lists at any depth (a func's own
        attrs can hold funcs), its op type when that is a library function, and for a
        SymbolicGradient the gradient function ``library.gradient`` registers for its
        ``f``."""
        out: list[tuple[str, str, bool, object]] = []

        def visit(attr: str, name_attr_list) -> None:
            name = name_attr_list.name
            if name in self.library:
                if attr == "f" and node.op in CALL_OPS:
                    out.append((name, f"a call by {node.op} {node.name}", True,
                                name_attr_list.attr))
                else:
                    out.append((name, f"{attr} of {node.op} {node.name}", False,
                                name_attr_list.attr))
            if node.op == "SymbolicGradient" and attr == "f" and name in self.gradients:
                out.append((self.gradients[name],
                            f"library.gradient of SymbolicGradient {node.name}", False,
                            None))
            for key, value in name_attr_list.attr.items():
                from_value(f"{attr}.{key}", value)

        def from_value(attr: str, value) -> None:
            if value.HasField("func"):
                visit(attr, value.func)
            for func in value.list.func:
                visit(attr, func)

        for key, value in node.attr.items():
            from_value(key, value)
        if node.op in self.library:
            out.append((node.op, f"a call as an op by {node.name}", False, node.attr))
        return out

    def walk(self, starts: Iterable[str]) -> dict[tuple[str, str], tuple]:
        """Everything a run of ``starts`` may execute: place -> (parent place, how).

        A place is ``("node", name)`` at the top level or ``("function", name)``; inputs
        (data and control) are followed backwards, and a function counts whole: the
        function runtime runs every stateful op of a body. Breadth first, so the
        recorded route is a shortest one.
        """
        parents: dict[tuple[str, str], tuple] = {}
        queue: collections.deque = collections.deque()
        for start in starts:
            place = ("node", start)
            if start in self.nodes and place not in parents:
                parents[place] = (None, "")
                queue.append(place)
        while queue:
            place = queue.popleft()
            kind, name = place
            if kind == "node":
                node = self.nodes[name]
                for i in node.input:
                    source = ("node", node_name(i))
                    if source[1] in self.nodes and source not in parents:
                        how = "control input" if i.startswith("^") else "input"
                        parents[source] = (place, how)
                        queue.append(source)
                calls = self.top_calls[name]
            else:
                calls = self.function_calls[name]
            for fname, how in calls:
                target = ("function", fname)
                if target not in parents:
                    parents[target] = (place, how)
                    queue.append(target)
        return parents

    def all_nodes(self) -> Iterable[tuple[str | None, object]]:
        for node in self.nodes.values():
            yield None, node
        for name, function in self.library.items():
            for node in function.node_def:
                yield name, node


# --------------------------------------------------------------------------- routes


def _roots(meta_graph, graph: _Graph, first_keys: Sequence[str]) -> list[_Root]:
    from serving_opt.savedmodel import loader

    serving = loader.serving_signatures(meta_graph)  # the init-op signature is no request
    keys = list(dict.fromkeys([*first_keys, *sorted(serving)]))
    roots = []
    for key in keys:
        if key not in serving:
            continue
        sig = serving[key]
        # Inputs are fed, but whatever is upstream of them is walked too: it can only
        # make a finding's route more conservative.
        starts = tuple(n for info in sig.outputs.values() for n in tensor_info_nodes(info))
        roots.append(_Root(key, "signature", f"signature {key}",
                           f"an output of signature {key}", starts))
    init_op = loader.find_init_op(meta_graph)
    if init_op:
        roots.append(_Root(INIT_OP, "init", "the init op, run at every load",
                           "the init op, run at every load", (init_op.name,)))
    # Every other init op the MetaGraph declares: another loader (an older TF Serving
    # knows only legacy_init_op) may run it instead.
    for name, source in _declared_init_ops(meta_graph):
        if init_op is None or name != init_op.name:
            desc = f"the {source} (run by loaders that prefer it)"
            roots.append(_Root(INIT_OP, "init", desc, desc, (name,)))
    if meta_graph.HasField("saver_def"):
        saver = meta_graph.saver_def
        if saver.restore_op_name:
            roots.append(_Root("restore", "restore", "the saver's restore op, run at every load",
                               "the saver's restore op, run at every load",
                               (node_name(saver.restore_op_name),)))
        if saver.save_tensor_name:
            roots.append(_Root("save", "save", "saver_def.save_tensor_name",
                               "saver_def.save_tensor_name", (node_name(saver.save_tensor_name),)))
    return roots


def _declared_init_ops(meta_graph) -> list[tuple[str, str]]:
    """(node, where declared) for every init op declaration of the MetaGraph."""
    from serving_opt.savedmodel import loader

    out = []
    sig = meta_graph.signature_def.get(loader.INIT_OP_SIGNATURE_KEY)
    if sig is not None:
        out += [(n, "init-op signature") for info in sig.outputs.values()
                for n in tensor_info_nodes(info)]
    for key in (loader.MAIN_OP_COLLECTION, loader.LEGACY_INIT_OP_COLLECTION):
        collection = meta_graph.collection_def.get(key)
        if collection is not None:
            out += [(node_name(n), key) for n in collection.node_list.value]
    return out


def _route(graph: _Graph, place: tuple[str, str], walks: list[tuple[_Root, dict]]) -> str:
    """How ``place`` runs, through the first root (in the order of ``walks``) reaching it."""
    for root, parents in walks:
        if place not in parents:
            continue
        parent, how = parents[place]
        if place[0] == "node":
            if parent is None:
                return f"{root.start_desc}"
            if parents[parent][0] is None:
                return f"{how} of {parent[1]} ({root.start_desc})"
            return f"{how} of {parent[1]}, reached from {root.desc}"
        return f"via {how}, reached from {root.desc}"
    # Nothing the loaders or a request runs reaches it: still checked, since "nothing
    # runs it" is exactly what a crafted model would like us to believe.
    if place[0] == "node":
        return "on no path of a signature or of the loader (every node is checked)"
    refs = graph.refs.get(place[1])
    if refs:
        where = f" in function {refs[0].function}" if refs[0].function else ""
        return f"via {refs[0].how}{where}, on no path of a signature or of the loader"
    if place[1] in graph.gradient_of:
        return (f"(library.gradient of {graph.gradient_of[place[1]]}), which no "
                "SymbolicGradient runs")
    return "(a library function no node calls; every function is checked)"


# ----------------------------------------------------------------------------- saver

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
_MAX_NAME_DEPTH = 16
# How many calls deep an asset path is followed from the graph-level call passing it.
_MAX_CALL_DEPTH = 4


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
        if not problems:
            allowed = _RESTORE_OPS if node.op.startswith("Restore") else _SAVE_OPS
            nodes = self._closure(node.name, prefix)
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
        file name derived from its first argument."""
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


# ---------------------------------------------------------------------------- assets


class _Assets:
    """Where the loaders feed asset paths, and whether a file-reading op reads one."""

    def __init__(self, meta_graph, graph: _Graph) -> None:

        from serving_opt.savedmodel import loader

        self.graph = graph
        # The loaders' own choice (loader.cc GetAssetFileDefs, Python's
        # _get_asset_tensors): asset_file_def, else the TF1 saved_model_assets collection.
        defs = list(meta_graph.asset_file_def)
        collection = meta_graph.collection_def.get(loader.SAVED_MODEL_ASSETS_COLLECTION)
        if not defs and collection is not None:
            # An entry that does not unpack is refused by _escaping_assets.
            defs = [a for a, _ in _declared_assets(meta_graph) if a is not None]
        self.asset_nodes = {node_name(a.tensor_info.name) for a in defs}
        self.signature_inputs = {
            n for sig in loader.serving_signatures(meta_graph).values()
            for info in sig.inputs.values() for n in tensor_info_nodes(info)}
        objects = meta_graph.object_graph_def
        self.object_nodes = list(objects.nodes)
        self.bound = {name: list(f.bound_inputs)
                      for name, f in objects.concrete_functions.items()}
        self.argument_memo: dict[tuple[str, str, int], tuple[str | None, frozenset]] = {}
        self.read: set[str] = set()

    def problem(self, function: str | None, node, reaching: list[_Root]) -> str | None:
        """None when ``node`` (an op of host_ops.ASSET_READ_OPS) reads an asset path the
        loader feeds, and only the loader runs it; :attr:`read` then holds the asset
        nodes whose path it may read."""
        self.read: set[str] = set()
        runners = [r for r in reaching if r.kind in ("signature", "save")]
        if runners:
            return (f"{runners[0].desc} runs it, and the loaders feed asset paths only to "
                    "the init op: it reads the path the graph holds")
        data = _data_inputs(node)
        index = ASSET_READ_OPS[node.op]
        if index >= len(data):
            return "it is given no file name"
        if function is None:
            return self._top_level(data[index])
        return self._argument(function, data[index])

    def _asset_node(self, name: str) -> str | None:
        node = self.graph.nodes[name]
        if node.op not in ("Placeholder", "Const"):
            return f"asset node {name!r} is a {node.op}, not a node the loader can feed"
        if name in self.signature_inputs:
            return f"asset node {name!r} is also a signature input: a client names the file"
        self.read.add(name)
        return None

    def _top_level(self, tensor: str) -> str | None:
        name = _follow_identity(self.graph.nodes, tensor)
        node = self.graph.nodes.get(name)
        if node is None:
            return f"its file name {tensor!r} is no node"
        if name in self.asset_nodes:
            return self._asset_node(name)
        if node.op == "ReadVariableOp" and _data_inputs(node):
            return self._asset_variable(node_name(_data_inputs(node)[0]), name)
        return f"its file name comes from {node.op} {name!r}, which is no asset the loader feeds"

    def _asset_variable(self, handle: str, read: str) -> str | None:
        """TF2: tf.saved_model.save assigns the asset placeholder to a variable the init
        op reads: accepted when nothing else writes it or hands it on."""
        variable = self.graph.nodes.get(handle)
        if variable is None or variable.op != "VarHandleOp":
            return f"its file name is read from {handle!r}, which is no variable"
        assigned = False
        for consumer_name in self.graph.consumers[handle]:
            consumer = self.graph.nodes[consumer_name]
            data = _data_inputs(consumer)
            if consumer.op in ("ReadVariableOp", "VarIsInitializedOp"):
                continue
            if consumer.op == "AssignVariableOp" and len(data) == 2 and \
                    node_name(data[0]) == handle:
                source = _follow_identity(self.graph.nodes, data[1])
                if source in self.asset_nodes and self._asset_node(source) is None:
                    assigned = True
                    continue
            return (f"its file name is read from variable {handle!r}, which {consumer.op} "
                    f"{consumer_name!r} also uses")
        if not assigned:
            return f"its file name is read from variable {handle!r}, which no asset sets"
        return None

    def _argument(self, fname: str, tensor: str, depth: int = 0) -> str | None:
        """``tensor`` of function ``fname`` is an argument, and every caller passes it an
        asset path (a graph-level call, or a call in a function whose own argument is
        one, :data:`_MAX_CALL_DEPTH` calls deep at most), and the object graph, when it
        binds the argument, binds it to an asset.

        Memoized with the asset nodes it read: k callers per level are k**depth chains.
        """
        key = (fname, tensor, depth)
        if key not in self.argument_memo:
            outer, self.read = self.read, set()
            try:
                self.argument_memo[key] = (self._judge_argument(fname, tensor, depth),
                                           frozenset(self.read))
            finally:
                self.read = outer | self.read
        problem, read = self.argument_memo[key]
        self.read |= read
        return problem

    def _judge_argument(self, fname: str, tensor: str, depth: int) -> str | None:
        function = self.graph.library[fname]
        body = {n.name: n for n in function.node_def}
        args = [a.name for a in function.signature.input_arg]
        name = _follow_identity(body, tensor)
        if name not in args:
            op = body[name].op if name in body else "nothing"
            return f"its file name comes from {op} {name!r} inside the function, not an asset"
        index = args.index(name)
        bound = self.bound.get(fname) if self.object_nodes else None
        if bound is not None:
            # TF2: the Python loader binds captured inputs from the object graph.
            offset = len(args) - len(bound)
            if index < offset or not 0 <= bound[index - offset] < len(self.object_nodes):
                return f"argument {name!r} is no captured asset"
            kind = self.object_nodes[bound[index - offset]].WhichOneof("kind")
            if kind != "asset":
                return f"argument {name!r} is bound to a {kind} of the object graph, not an asset"
        refs = self.graph.refs.get(fname, [])
        if not refs:
            if bound is not None:
                return None
            if self.object_nodes:
                return (f"function {fname} is no saved function of the object graph and no "
                        f"node calls it: nothing binds argument {name!r} to an asset")
            return f"no node calls function {fname}, so nothing passes it an asset"
        # The session loaders (TF Serving, this tool) run the graph's calls, and a
        # function's calls with what its caller passed. A function of no object graph
        # binding is run by nothing else: TF 2.3-2.8's tf.saved_model.save traced each
        # table's initializer as ``lambda: _wrap_initializer(obj)`` (save.py,
        # _trace_resource_initializers) and called it from the init op only, passing
        # the asset variable's read; a TF2 model loaded into a TF1 graph and saved
        # again calls its restored ``_initializer`` from a ``restored_function_body``.
        for ref in refs:
            where = f" in function {ref.function}" if ref.function else ""
            if not ref.call_arg:
                return (f"function {fname} is reached via {ref.how}{where}; only a call "
                        "can pass it an asset path")
            if ref.function is None:
                call = self.graph.nodes[ref.node]
            elif depth + 1 >= _MAX_CALL_DEPTH:
                return (f"function {fname} is called{where}, more than {_MAX_CALL_DEPTH} "
                        "calls below the graph")
            else:
                call = next(n for n in self.graph.library[ref.function].node_def
                            if n.name == ref.node)
            data = _data_inputs(call)
            if index >= len(data):
                return f"{call.name}{where} passes no argument {name!r}"
            problem = self._top_level(data[index]) if ref.function is None else \
                self._argument(ref.function, data[index], depth + 1)
            if problem:
                return f"{call.name}{where} passes argument {name!r}, and {problem}"
        return None


# ------------------------------------------------------------- what one node does


@dataclass(frozen=True)
class _Finding:
    """What one node does to the host: ``op`` and ``kind``, ``reason`` when it needs
    saying, ``inside``/``inside_label`` when the op is in a graph the node embeds."""

    op: str
    kind: str
    reason: str = ""
    inside: str = ""
    inside_label: str = ""


def _follow_identity(body: dict, tensor: str) -> str:
    """The node ``tensor`` comes from, through ``Identity`` only."""
    name = node_name(tensor)
    for _ in range(_MAX_NAME_DEPTH):
        node = body.get(name)
        if node is None or node.op != "Identity" or len(_data_inputs(node)) != 1:
            break
        name = node_name(_data_inputs(node)[0])
    return name


def _show(value) -> str:
    """An AttrValue, briefly, for a finding."""
    if value.list.s:
        return repr([v.decode("utf-8", "replace") for v in value.list.s][:3])
    text = value.s.decode("utf-8", "replace")
    return repr(text if len(text) <= 80 else text[:77] + "...")


class _TooMuchWork(Exception):
    """Resolving attr placeholders took more than :data:`_MAX_BINDING_WORK` steps."""


def _bindings(graph: _Graph, fname: str, placeholder: str,
              depth: int = 0) -> list[tuple[object, str]]:
    """(the AttrValue, the call site binding it) for attr placeholder ``placeholder`` of
    function ``fname``: every distinct value some chain of references binds it to, each
    with the first such chain (in reference order); the value is None where nothing
    binds it: a reference that binds no such attr (a ``library.gradient`` entry binds
    none), a function nothing references (a loader instantiating it by name binds
    nothing), a binding to a placeholder of the caller that no caller of the caller
    binds (followed :data:`_MAX_BINDING_DEPTH` calls up).

    Distinct values, not every chain: k call sites over d levels are k**d chains but
    at most as many values as the graph writes, and the first chain of each value is
    the first chain a judge of values can stop at. Memoized per (function,
    placeholder, depth) on ``graph``; raises :class:`_TooMuchWork` past
    :data:`_MAX_BINDING_WORK` steps for the whole graph.
    """
    key = (fname, placeholder, depth)
    if key in graph.binding_memo:
        return graph.binding_memo[key]
    out: dict[bytes | None, tuple[object, str]] = {}

    def add(value, site: str) -> None:
        graph.binding_work += 1
        if graph.binding_work > _MAX_BINDING_WORK:
            raise _TooMuchWork
        out.setdefault(None if value is None else value.SerializeToString(deterministic=True),
                       (value, site))

    refs = graph.refs.get(fname, [])
    if not refs:
        add(None, f"no node references function {fname}, so nothing binds it")
    for ref in refs:
        site = f"{ref.how} in function {ref.function}" if ref.function else ref.how
        if ref.binds is None or placeholder not in ref.binds:
            add(None, f"{site} does not bind it")
            continue
        value = ref.binds[placeholder]
        if not value.placeholder:
            add(value, site)
        elif ref.function is None:
            add(None, f"{site} binds it to placeholder {value.placeholder!r}, "
                      "which nothing binds at the top level")
        elif depth + 1 >= _MAX_BINDING_DEPTH:
            add(None, f"{site} binds it to placeholder {value.placeholder!r}, "
                      f"more than {_MAX_BINDING_DEPTH} calls up")
        else:
            for v, w in _bindings(graph, ref.function, value.placeholder, depth + 1):
                add(v, f"{site} via placeholder {value.placeholder!r}, bound by {w}"
                    if v is not None else
                    f"{site} binds it to placeholder {value.placeholder!r}, and {w}")
    graph.binding_memo[key] = list(out.values())
    return graph.binding_memo[key]


def _conditional(graph: _Graph, function: str | None, node) -> tuple[str | None, str]:
    """(kind, reason) of an op of host_ops.CONDITIONAL_HOST_OPS: its attr judged as
    written, or, when it is an attr placeholder, as every call site binds it."""
    attr, kind = CONDITIONAL_HOST_OPS[node.op]
    if attr not in node.attr:
        return None, ""
    value = node.attr[attr]
    if not value.placeholder:
        return conditional_kind(node.op, value), ""
    what = f"its {attr} is attr placeholder {value.placeholder!r}"
    if function is None:
        return kind, f"{what}, which nothing binds at the top level"
    try:
        bindings = _bindings(graph, function, value.placeholder)
    except _TooMuchWork:
        return kind, (f"{what}, and resolving what the calls bind it to takes more than "
                      f"{_MAX_BINDING_WORK} steps (the check's limit): refused unresolved")
    for bound, site in bindings:
        if bound is None:
            return kind, (f"{what}, and {site}: an unresolved {attr} may name any file "
                          "or stream")
        bound_kind = conditional_kind(node.op, bound)
        if bound_kind is not None:
            return bound_kind, f"{what}, bound to {_show(bound)} by {site}"
    return None, ""


def _const_bytes(node) -> bytes | None:
    """The one string of a scalar (or one-element) string Const, else None."""
    from tensorflow.core.framework import types_pb2

    if node is None or node.op != "Const" or _data_inputs(node) or "value" not in node.attr:
        return None
    tensor = node.attr["value"].tensor
    if tensor.dtype != types_pb2.DT_STRING or len(tensor.string_val) != 1:
        return None
    return tensor.string_val[0]


def _embedded(graph: _Graph, function: str | None, node, depth: int) -> list[_Finding]:
    """The findings of the graph an op of host_ops.EMBEDDED_GRAPH_OPS runs: parsed from
    the Const (through Identity) feeding its GraphDef input and checked like the
    model's graph (every node and library function, embedded graphs in turn, no
    loader exception: nothing feeds it asset or checkpoint paths); the op itself when
    the graph cannot be read."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import graph_pb2

    body = graph.nodes if function is None else {
        n.name: n for n in graph.library[function].node_def}
    data = _data_inputs(node)
    index = EMBEDDED_GRAPH_OPS[node.op]
    if index >= len(data):
        return [_Finding(node.op, RUNS_GRAPH, "it is given no graph")]
    name = _follow_identity(body, data[index])
    source = body.get(name)
    serialized = _const_bytes(source)
    if serialized is None:
        what = f"{source.op} {name!r}" if source is not None else f"{name!r}, no node"
        if source is None and function is not None:
            what = f"{name!r}, an argument of function {function}"
        return [_Finding(node.op, RUNS_GRAPH,
                         f"its serialized graph comes from {what}, not a constant string "
                         "the check can read: it runs a graph nothing checked")]
    if depth + 1 > _MAX_EMBEDDING_DEPTH:
        return [_Finding(node.op, RUNS_GRAPH,
                         f"its graph is embedded more than {_MAX_EMBEDDING_DEPTH} deep")]
    key = (hashlib.sha256(serialized).digest(), depth)
    if key not in graph.embedded_cache:
        inner_def = graph_pb2.GraphDef()
        try:
            inner_def.ParseFromString(serialized)
        except DecodeError:
            return [_Finding(node.op, RUNS_GRAPH,
                             f"its graph constant {name!r} is no GraphDef the check can parse")]
        inner = _Graph(inner_def, graph.embedded_cache)
        graph.embedded_cache[key] = [
            (inner_function, inner_node.name, finding)
            for inner_function, inner_node in inner.all_nodes()
            for finding in _node_findings(inner, inner_function, inner_node, depth + 1)]
    found = []
    for inner_function, inner_name, finding in graph.embedded_cache[key]:
        where = f"node {inner_name!r}"
        label = inner_name
        if inner_function:
            where += f" in function {inner_function}"
            label = f"{inner_function}/{label}"
        where += f" inside the graph_def of {node.op}"
        if finding.inside:
            where = f"{finding.inside} {where}"
            label = f"{label}/graph_def:{finding.inside_label}"
        found.append(_Finding(finding.op, finding.kind, finding.reason, where, label))
    return found


def _node_findings(graph: _Graph, function: str | None, node, depth: int = 0) -> list[_Finding]:
    """What ``node`` (of ``function``, None at the top level) does to the host."""
    if node.op in EMBEDDED_GRAPH_OPS:
        return _embedded(graph, function, node, depth)
    if node.op in CONDITIONAL_HOST_OPS:
        kind, reason = _conditional(graph, function, node)
        return [_Finding(node.op, kind, reason)] if kind else []
    kind = host_op_kind(node)
    return [_Finding(node.op, kind)] if kind else []


# ---------------------------------------------------------------------------- assets


def _declared_assets(meta_graph) -> list[tuple[object, str]]:
    """(AssetFileDef, where declared) for every asset the MetaGraph declares, in
    asset_file_def and in the TF1 ``saved_model_assets`` collection alike (a loader
    reads one or the other); None for a collection entry that is no AssetFileDef the
    check can read (another type, or a filename that is not UTF-8)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import meta_graph_pb2

    from serving_opt.savedmodel import loader

    out: list[tuple[object, str]] = [(a, "asset_file_def") for a in meta_graph.asset_file_def]
    collection = meta_graph.collection_def.get(loader.SAVED_MODEL_ASSETS_COLLECTION)
    if collection is not None:
        where = f"the {loader.SAVED_MODEL_ASSETS_COLLECTION} collection"
        for index, value in enumerate(collection.any_list.value):
            asset = meta_graph_pb2.AssetFileDef()
            try:
                readable = value.Unpack(asset)
            except DecodeError:
                readable = False
            out.append((asset if readable else None, f"entry {index} of {where}"))
    return out


def _escaping_assets(meta_graph, graph: _Graph, walks) -> list[tuple[tuple, HostOpUse]]:
    """An asset whose filename, as TensorFlow's C++ file layer reads it
    (asset_paths.asset_path_problem: a NUL byte, an absolute name, ``..``), is not a
    file inside ``assets/``: the loaders feed ``<model>/assets/<filename>`` to whatever
    reads the asset node, a file outside the model. An asset declaration the check
    cannot read is refused too. The same rule as ``inspect``'s ``asset_path_escapes``
    (loader.safe_asset_path)."""
    found = []
    for asset, source in _declared_assets(meta_graph):
        if asset is None:
            use = HostOpUse(
                UNREADABLE_ASSET, source, None, READS_FILES, (), f"in {source}",
                "it is no AssetFileDef the check can read (a filename that is not UTF-8, or "
                "another message): the loader's view of its path cannot be checked")
            found.append(((False, _KIND_ORDER[READS_FILES], use.label), use))
            continue
        problem = asset_path_problem(asset.filename)
        if not problem:
            continue
        name = node_name(asset.tensor_info.name)
        place = ("node", name)
        reaching = [root for root, parents in walks if place in parents]
        keys = tuple(r.key for r in reaching if r.kind in ("signature", "init"))
        use = HostOpUse(
            ESCAPING_ASSET, name, None, READS_FILES, keys,
            f"declared in {source}, whose path the loaders feed to node {name!r}",
            f"filename {shown_filename(asset.filename)} {problem}: whatever reads the "
            "asset reads a file outside the model's assets/")
        found.append(((not reaching, _KIND_ORDER[READS_FILES], use.label), use))
    return found


# ------------------------------------------------------------------------------- check


def host_op_uses(meta_graph, signature_keys: Sequence[str] | None = None) -> list[HostOpUse]:
    """Every host op of the model, except the loader's own saver and asset reads.

    ``signature_keys`` only orders the routes (the whole graph is always checked):
    routes through these signatures are preferred, then the others, the init op and the
    saver. Most dangerous first: Python, writes, the host, reads; unreached ones last.

    Example:
        >>> [u.describe() for u in host_op_uses(meta_graph, ["serving_default"])]
        ["WriteFile node 'write_it', control input of y (an output of signature
        serving_default)"]
    """
    graph = _Graph(meta_graph.graph_def)
    roots = _roots(meta_graph, graph, list(signature_keys or ()))
    walks = [(root, graph.walk(root.starts)) for root in roots]
    saver = _Saver(meta_graph, graph)
    assets = _Assets(meta_graph, graph)
    found = _escaping_assets(meta_graph, graph, walks)
    for function, node in graph.all_nodes():
        findings = _node_findings(graph, function, node)
        if not findings:
            continue
        place = ("function", function) if function else ("node", node.name)
        reaching = [root for root, parents in walks if place in parents]
        keys = tuple(r.key for r in reaching if r.kind in ("signature", "init"))
        for finding in findings:
            reason: str | None = finding.reason
            if finding.inside:
                pass  # nothing feeds an embedded graph checkpoint or asset paths
            elif node.op in CHECKPOINT_OPS:
                reason = saver.problem(function, node, reaching)
            elif node.op in ASSET_READ_OPS:
                reason = assets.problem(function, node, reaching)
            if reason is None:  # the loader's own use of a file
                continue
            use = HostOpUse(finding.op, node.name, function, finding.kind, keys,
                            _route(graph, place, walks), reason, finding.inside,
                            finding.inside_label)
            found.append(((not reaching, _KIND_ORDER.get(finding.kind, 9), use.label), use))
    return [use for _, use in sorted(found, key=lambda item: item[0])]


def asset_reads(meta_graph) -> dict[str, list[str]]:
    """asset node -> the ops that read the file the loader feeds it: the asset reads
    (host_ops.ASSET_READ_OPS) the static check accepts, each reached from the init op
    (an asset read a signature reaches is a host op of :func:`host_op_uses`).

    Example:
        >>> asset_reads(meta_graph)
        {'asset_path_initializer': ["InitializeTableFromTextFileV2 node
        'text_file_init/InitializeTableFromTextFileV2' in function
        __inference__initializer_30"]}
    """
    graph = _Graph(meta_graph.graph_def)
    walks = [(root, graph.walk(root.starts)) for root in _roots(meta_graph, graph, ())]
    assets = _Assets(meta_graph, graph)
    found: dict[str, list[str]] = collections.defaultdict(list)
    for function, node in graph.all_nodes():
        if node.op not in ASSET_READ_OPS:
            continue
        place = ("function", function) if function else ("node", node.name)
        reaching = [root for root, parents in walks if place in parents]
        if not any(r.kind in ("signature", "init") for r in reaching):
            continue
        if assets.problem(function, node, reaching) is None:
            use = HostOpUse(node.op, node.name, function, READS_FILES, ())
            for asset in sorted(assets.read):
                found[asset].append(f"{use.op} {use.where}")
    return dict(found)


def refuse_host_ops(meta_graph, signature_keys: Sequence[str], what: str) -> None:
    """Raises the one-line refusal for the model's first host op (the whole graph is
    checked; ``signature_keys`` only picks the route named).

    Example:
        >>> refuse_host_ops(meta_graph, ["serving_default"], "optimize")
        Traceback (most recent call last):
        ServingOptError: WriteFile node 'write_it', control input of y (an output of
        signature serving_default): it writes files on the machine running the model;
        refusing to optimize it, nothing was run; the model is untrusted code: ...
    """
    uses = host_op_uses(meta_graph, signature_keys)
    if not uses:
        return
    first = uses[0]
    more = f" (and {len(uses) - 1} more host op(s))" if len(uses) > 1 else ""
    raise ServingOptError(
        f"{first.describe()}: it {first.kind} on the machine running the model{more}; "
        f"refusing to {what} it, nothing was run",
        "the model is untrusted code: pass --allow_file_ops only for a model you trust "
        "(serving-opt inspect lists every host op)",
    )


__all__ = ["ESCAPING_ASSET", "INIT_OP", "UNREADABLE_ASSET", "HostOpUse", "asset_reads",
           "host_op_uses", "refuse_host_ops"]
