"""The untrusted-model stance: a SavedModel is code, and nothing of it runs on the
build host that touches files or the host, unless the user says so.

The check is static and covers everything that can run: every node of the graph
(reached by a signature or not: anyone may fetch a node) and of every library function
that can run, whose op is in :mod:`serving_opt.savedmodel.host_ops`. A function can run when a
node or function that can run references it (a call's ``f``, a function-valued attr of
any depth, ``If``/``While``/``Case`` branches, dataset functions, an op whose type is
its name, a string attr naming it), when it is the ``library.gradient`` of one that
can, when it shares an ``api_implements`` with one that can (Grappler's implementation
selector swaps it in), when any string of the MetaGraph outside its graph names it (the
object graph's functions, a resource's ``_create_resource``/``_initialize``, which
tf.saved_model.load runs), or when ``library.registered_gradients`` holds it. Any
other function is dead: nothing can call it, so it cannot touch anything (TFX's Trainer
leaves such a table initializer in TF 2.9 Estimator exports). Reachability from the
signatures and the loader's roots decides how a finding is described (its *route*:
which signature or loader op runs it, and through what) and whether one of the loader's
own two uses of files applies, each accepted only in the exact shape TensorFlow's
exporters write and the loaders run:

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
  reaches it (a TF2 model loaded into a TF1 graph brings ``_traced_save`` and
  ``_traced_restore`` functions nothing calls: dead).
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

* **Embedded graphs** (:data:`serving_opt.savedmodel.host_ops.EMBEDDED_GRAPH_OPS`): a
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
  Each (function, placeholder) is resolved once, to the distinct values reaching it
  (k call sites over d levels are k**d chains, not k**d values); past
  ``node_rules._MAX_BINDING_WORK`` steps for a graph the op is refused
  unresolved, never guessed.
* **Escaping assets**: an asset of asset_file_def or of the TF1 ``saved_model_assets``
  collection whose filename, read as TF's C++ file layer opens it, is not a file
  inside ``assets/`` (a NUL byte, an absolute name, a ``..`` component:
  :func:`asset_paths.asset_path_problem`, the rule of ``loader.safe_asset_path`` and
  ``inspect``'s ``asset_path_escapes``) is a finding: the loaders feed
  ``<model>/assets/<filename>``, a file outside the model, to whatever reads it; so is
  a collection entry that is no readable AssetFileDef. (Symlinks out of the model are
  refused by ``model_files.check_model_files``, which reads the directory; this check reads
  protos.)

Everything else is a finding: :func:`host_op_uses` lists them, ``inspect`` rates them,
and :func:`refuse_host_ops` turns the first into the one-line error ``optimize``,
``validate`` and ``compare`` raise before running the model; ``--allow_file_ops`` opts
in. The parts are this package's modules: ``reach`` (the index of a graph and what
reaches what), ``node_rules`` (what one node does), ``saver_shape`` and ``asset_reads``
(the loader's own uses of files).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.savedmodel.asset_paths import asset_path_problem, shown_filename
from serving_opt.savedmodel.graph import node_name, tensor_info_nodes
from serving_opt.savedmodel.host_ops import (
    ASSET_READ_OPS,
    CHECKPOINT_OPS,
    READS_FILES,
    RUNS_CODE,
    RUNS_GRAPH,
    TOUCHES_HOST,
    WRITES_FILES,
)
from serving_opt.savedmodel.untrusted.asset_reads import _Assets, _declared_assets
from serving_opt.savedmodel.untrusted.node_rules import _node_findings
from serving_opt.savedmodel.untrusted.reach import _Graph, _Root
from serving_opt.savedmodel.untrusted.saver_shape import _Saver

INIT_OP = "init op"  # the pseudo-signature name of the loader's init op

# Findings are reported most dangerous first.
_KIND_ORDER = {RUNS_CODE: 0, WRITES_FILES: 1, TOUCHES_HOST: 2, RUNS_GRAPH: 3,
               READS_FILES: 4}
# The op of the finding for an asset whose filename leads out of assets/ (no node).
ESCAPING_ASSET = "asset"
# The op of the finding for an entry of the assets collection the check cannot read.
UNREADABLE_ASSET = "asset declaration"
# How many places the walks naming findings' routes may visit in all; past it a route
# names only its root (which roots reach what is computed in linear time regardless).
_MAX_ROUTE_WORK = 2_000_000


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
        """The op, where it is, how it runs and why it is not the loader's: one clause."""
        sep = " " if self.function else ", "
        text = f"{self.op} {self.where}{sep}{self.route}"
        return f"{text} ({self.reason})" if self.reason else text


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
    named = _named_outside_graph(meta_graph, graph)
    if named:
        desc = ("a function the MetaGraph names outside its graph (its object graph's, "
                 "which tf.saved_model.load restores and may run)")
        roots.append(_Root("named", "named", desc, desc, (), tuple(named)))
    gradients = [g.gradient_func for g in meta_graph.graph_def.library.registered_gradients]
    if gradients:
        desc = ("a registered gradient (library.registered_gradients, which "
                "tf.saved_model.load registers for differentiation)")
        roots.append(_Root("gradient", "gradient", desc, desc, (), tuple(gradients)))
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


def _repeated(field) -> bool:
    # FieldDescriptor.is_repeated is protobuf 5+; the TF 2.15 runtime's protobuf has only
    # the label (deprecated, not yet gone, in later releases).
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == field.LABEL_REPEATED


def _named_outside_graph(meta_graph, graph: _Graph) -> list[str]:
    """The library functions some string of the MetaGraph outside its graph_def names:
    the object graph's concrete functions (a tf.function's, a resource's
    ``_create_resource``/``_initialize``/``_destroy_resource``, a saveable's save and
    restore functions, a captured tensor's), which tf.saved_model.load wraps and runs by
    name, and whatever a later field names: every string is read, not a list of fields."""
    from google.protobuf.descriptor import FieldDescriptor

    strings = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)
    found: dict[str, None] = {}
    pending = [field_value for field_value in meta_graph.ListFields()
               if field_value[0].name != "graph_def"]
    while pending:
        field, value = pending.pop()
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name
            for k, v in value.items():
                pending += [(entry["key"], k), (entry["value"], v)]
            continue
        for item in value if _repeated(field) else [value]:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                pending += item.ListFields()
            elif field.type in strings:
                text = item.decode("utf-8", "replace") if isinstance(item, bytes) else item
                for name in (text, node_name(text)):
                    if name in graph.library:
                        found[name] = None
    return list(found)


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


class _Walks:
    """Which roots reach each place (all roots at once: :meth:`_Graph.reach`), and a
    finding's route through the first of them (a breadth-first walk of that root, made
    on demand while the walks made stay under :data:`_MAX_ROUTE_WORK` places)."""

    def __init__(self, graph: _Graph, roots: list[_Root]) -> None:
        self.graph = graph
        self.roots = roots
        self.mask = graph.reach([root.starts for root in roots],
                                [root.functions for root in roots])
        # What may run at all: every top-level node (nothing says none will be fetched),
        # the roots' functions and what they run. A function outside it is dead: no
        # node, function or loader can call it, so it cannot touch anything.
        self.live = graph.walk(graph.nodes, [f for r in roots for f in r.functions])
        self.parents: dict[int, dict | None] = {}
        self.work = 0

    def reaching(self, place: tuple[str, str]) -> list[_Root]:
        bits = self.mask.get(place, 0)
        out = []
        while bits:
            low = bits & -bits
            out.append(self.roots[low.bit_length() - 1])
            bits ^= low
        return out

    def route(self, place: tuple[str, str]) -> str:
        """How ``place`` runs, through the first root (in the order of the roots)
        reaching it."""
        bits = self.mask.get(place, 0)
        if not bits:
            return _unreached(self.live, place)
        index = (bits & -bits).bit_length() - 1
        root = self.roots[index]
        if index not in self.parents:
            within = self.work < _MAX_ROUTE_WORK
            self.parents[index] = self.graph.walk(root.starts, root.functions) \
                if within else None
            self.work += len(self.parents[index] or ())
        parents = self.parents[index]
        if parents is None:
            return f"reached from {root.desc}"
        parent, how = parents[place]
        if parent is None and place[0] == "function":
            return f"({root.start_desc})"
        if place[0] == "node":
            if parent is None:
                return f"{root.start_desc}"
            if parents[parent][0] is None:
                return f"{how} of {parent[1]} ({root.start_desc})"
            return f"{how} of {parent[1]}, reached from {root.desc}"
        return f"via {how}, reached from {root.desc}"


def _unreached(live: dict, place: tuple[str, str]) -> str:
    # Only a node no loader fetches runs it: still checked, since "nothing runs it" is
    # what a crafted model would like us to believe of a node anyone may fetch.
    parent, how = live.get(place, (None, ""))
    if place[0] == "node" or parent is None:
        return "on no path of a signature or of the loader (every node is checked)"
    return f"via {how}, on no path of a signature or of the loader (every node is checked)"


# ---------------------------------------------------------------------------- assets


def _escaping_assets(meta_graph, walks: _Walks) -> list[tuple[tuple, HostOpUse]]:
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
        reaching = walks.reaching(place)
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
    """
    graph = _Graph(meta_graph.graph_def)
    roots = _roots(meta_graph, graph, list(signature_keys or ()))
    walks = _Walks(graph, roots)
    saver = _Saver(meta_graph, graph)
    assets = _Assets(meta_graph, graph)
    found = _escaping_assets(meta_graph, walks)
    for function, node in graph.all_nodes():
        findings = _node_findings(graph, function, node)
        if not findings:
            continue
        place = ("function", function) if function else ("node", node.name)
        if place not in walks.live:
            continue  # a dead function: nothing can call it
        reaching = walks.reaching(place)
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
                            walks.route(place), reason, finding.inside,
                            finding.inside_label)
            found.append(((not reaching, _KIND_ORDER.get(finding.kind, 9), use.label), use))
    return [use for _, use in sorted(found, key=lambda item: item[0])]


def asset_reads(meta_graph) -> dict[str, list[str]]:
    """asset node -> the ops that read the file the loader feeds it: the asset reads
    (host_ops.ASSET_READ_OPS) the static check accepts, each reached from the init op
    (an asset read a signature reaches is a host op of :func:`host_op_uses`).
    """
    graph = _Graph(meta_graph.graph_def)
    walks = _Walks(graph, _roots(meta_graph, graph, ()))
    assets = _Assets(meta_graph, graph)
    found: dict[str, list[str]] = collections.defaultdict(list)
    for function, node in graph.all_nodes():
        if node.op not in ASSET_READ_OPS:
            continue
        place = ("function", function) if function else ("node", node.name)
        reaching = walks.reaching(place)
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
