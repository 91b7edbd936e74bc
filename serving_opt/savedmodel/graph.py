"""What a serving graph is, and the GraphDef walks every stage shares.

A :class:`ServingGraph` is what TF Serving needs from a MetaGraph once variables
are constants: the GraphDef, the signatures to keep verbatim, the init op, and the
asset wiring. ``protected_nodes`` are the node names no stage may remove or
rename, because a signature, the loader or a table initializer refers to them.

The helpers here read GraphDefs the same way for every stage (node names, what a
node depends on, which library functions it calls, which nodes hold state), so
no stage imports another one for them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# Protobuf sizes are int32: a message of 2 GiB or more cannot be serialized. A frozen
# GraphDef (variables turned into constants) must stay below this, and so must a
# MetaGraph written back.
PROTOBUF_LIMIT_BYTES = 2**31

# Ops that call a library function by name: what TF2 signatures are made of.
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})

# Ops that must never be merged or folded away, because their identity is their state
# (tables) or because running them twice differs from running them once.
_ALWAYS_PROTECTED_OPS = frozenset({
    "HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2",
    "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
    "MutableDenseHashTableV2", "AnonymousHashTable",
})


def attr(**fields):
    """An AttrValue: ``attr(type=DT_FLOAT)``, ``attr(b=True)``, ``attr(s=b"x")``.
    """
    from tensorflow.core.framework import attr_value_pb2

    return attr_value_pb2.AttrValue(**fields)


def make_node(name: str, op: str, inputs: Iterable[str] = (), **attrs):
    """A NodeDef built directly, for rewrites that must not import a (huge) graph."""
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def var_handle(name: str, dtype: int, shape) -> object:
    """A resource variable's VarHandleOp named ``name`` (also its shared_name).

    ``shape`` is a TensorShapeProto or a sequence of ints.
    """
    from tensorflow.core.framework import tensor_shape_pb2

    if not isinstance(shape, tensor_shape_pb2.TensorShapeProto):
        shape = tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in shape])
    return make_node(name, "VarHandleOp", dtype=attr(type=dtype), shape=attr(shape=shape),
                     shared_name=attr(s=name.encode()), container=attr(s=b""))


def node_name(tensor_or_node: str) -> str:
    """``"^a"``, ``"a:1"`` and ``"a"`` all name node ``a``.
    """
    return tensor_or_node.lstrip("^").split(":")[0]


def data_consumers(node_defs: Iterable) -> dict[str, list]:
    """Node name -> ``[(consumer node, input index)]`` over the data inputs of
    ``node_defs`` (control inputs left out).
    """
    found: dict[str, list] = {}
    for node in node_defs:
        for index, name in enumerate(node.input):
            if not name.startswith("^"):
                found.setdefault(node_name(name), []).append((node, index))
    return found


def tensor_info_tensors(tensor_info) -> tuple[str, ...]:
    """Tensor names a TensorInfo refers to (dense, sparse COO, or composite components)."""
    encoding = tensor_info.WhichOneof("encoding")
    if encoding == "name":
        return (tensor_info.name,)
    if encoding == "coo_sparse":
        coo = tensor_info.coo_sparse
        return (coo.values_tensor_name, coo.indices_tensor_name, coo.dense_shape_tensor_name)
    if encoding == "composite_tensor":
        names: list[str] = []
        for component in tensor_info.composite_tensor.components:
            names.extend(tensor_info_tensors(component))
        return tuple(names)
    return ()


def tensor_info_nodes(tensor_info) -> list[str]:
    """Node names a TensorInfo refers to (dense, sparse COO, or composite components)."""
    return [node_name(t) for t in tensor_info_tensors(tensor_info)]


def all_node_defs(graph_def) -> Iterator:
    """Every NodeDef of a GraphDef: the top level, then each library function's body."""
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def function_calls(graph_def) -> list[str]:
    """Top-level nodes that call a library function (what TF2 signatures are made of)."""
    return [n.name for n in graph_def.node if n.op in CALL_OPS]


def called_functions(node) -> Iterator[str]:
    """Names of the functions ``node`` may run: every func-valued attr (``f`` of a
    (Stateful)PartitionedCall, If/While branches, dataset functions, ...) and its op
    type, since a library function can also be called as an op. Names that are no
    library function (most op types) are the caller's to ignore.
    """
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        yield from (f.name for f in value.list.func)
    yield node.op


def reachable_functions(graph_def, nodes: Iterable) -> set[str]:
    """Library functions ``nodes`` call, directly or through other functions."""
    library = {f.signature.name: f for f in graph_def.library.function}
    reached: set[str] = set()
    frontier = [f for node in nodes for f in called_functions(node) if f in library]
    while frontier:
        name = frontier.pop()
        if name in reached:
            continue
        reached.add(name)
        frontier.extend(f for node in library[name].node_def for f in called_functions(node)
                        if f in library and f not in reached)
    return reached


def reachable_nodes(graph_def, roots: Iterable[str]) -> set[str]:
    """Names of the top-level nodes ``roots`` depend on (data and control inputs),
    roots included; names that are no node of the graph are skipped.

    Freezing only touches what the signatures and the init op reach; a TF2 SavedModel
    holds every variable up to three times (the object, its checkpoint alias, the
    saver's copy), so counting all of them would triple the frozen size.
    """
    inputs = {n.name: [node_name(i) for i in n.input] for n in graph_def.node}
    seen: set[str] = set()
    stack = [node_name(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in seen or name not in inputs:
            continue
        seen.add(name)
        stack.extend(inputs[name])
    return seen


def reachable_subgraph(graph_def, reached: set[str]):
    """A new GraphDef of the ``reached`` nodes and the library functions they call."""
    from tensorflow.core.framework import graph_pb2

    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(n for n in graph_def.node if n.name in reached)
    prune_library(out)
    return out


def stateful_nodes(graph_def) -> list[str]:
    """Top-level nodes whose op is stateful or touches the host (``host_ops``, e.g. a
    stateless ``ReadFile``): protected from merging and folding.
    """
    from tensorflow.python.framework import op_def_registry

    from serving_opt.savedmodel.host_ops import host_op_kind

    out = []
    for node in graph_def.node:
        op_def = op_def_registry.get(node.op)
        if node.op in _ALWAYS_PROTECTED_OPS or (op_def is not None and op_def.is_stateful) \
                or host_op_kind(node) is not None:
            out.append(node.name)
    return out


def prune_library(graph_def) -> int:
    """Drops library functions no node can call (saver and training leftovers).

    Freezing inlines or rewrites the serving functions, but the library still holds
    the originals, the save/restore functions, and their variable reads. Returns the
    number of functions removed.
    """
    functions = {f.signature.name for f in graph_def.library.function}
    if not functions:
        return 0
    reachable = reachable_functions(graph_def, graph_def.node)
    keep = [f for f in graph_def.library.function if f.signature.name in reachable]
    removed = len(functions) - len(keep)
    if removed:
        del graph_def.library.function[:]
        graph_def.library.function.extend(keep)
        kept_grads = [g for g in graph_def.library.gradient if g.function_name in reachable]
        del graph_def.library.gradient[:]
        graph_def.library.gradient.extend(kept_grads)
    return removed


def total_node_count(graph_def) -> int:
    """Nodes of a GraphDef including those inside its library functions.

    A TF2 SavedModel's top-level graph is a few calls into functions, so counting only
    top-level nodes would compare a handful of calls with an inlined graph.
    """
    return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


@dataclass(frozen=True)
class ServingGraph:
    """A frozen serving graph and everything needed to write it back as a SavedModel."""

    graph_def: object  # tensorflow GraphDef
    signature_defs: dict  # key -> SignatureDef, written back verbatim
    tags: frozenset
    init_op: str | None = None
    # Where the init op is declared, so it is written back the same way:
    # "signature" (__saved_model_init_op), "main_op" or "legacy_init_op".
    init_op_source: str | None = None
    # The source's ``__saved_model_init_op`` SignatureDef, written back verbatim while it
    # still names ``init_op`` (TF2 models declare its shape as unknown rank, for one).
    init_op_signature: object | None = None
    asset_file_defs: tuple = ()  # AssetFileDef protos
    # TF1 collections that still mean something after freezing (table_initializer, ...).
    collections: dict = field(default_factory=dict)
    protected_nodes: tuple[str, ...] = ()
    source_dir: str = ""
    # Only when variables are kept (--freeze=never, or auto fallback): the saver that
    # restores them, the checkpoint to copy, and collections copied verbatim.
    saver_def: object | None = None
    variables_dir: str | None = None
    # Variables this tool wrote a new checkpoint for (stages.checkpoint.KeptVariable);
    # empty when the source's own saver and checkpoint are carried over.
    kept_variables: tuple = ()
    collection_defs: dict = field(default_factory=dict)

    def replace(self, **changes) -> ServingGraph:
        return dataclasses.replace(self, **changes)

    def node_count(self) -> int:
        """Nodes in the graph and in its library functions (where TF2 models keep theirs)."""
        return total_node_count(self.graph_def)

    def op_histogram(self) -> dict[str, int]:
        """Op type -> count, including nodes inside library functions."""
        counts = collections.Counter(n.op for n in all_node_defs(self.graph_def))
        return dict(sorted(counts.items()))

    def signature_input_nodes(self) -> list[str]:
        """Nodes the signatures' inputs name, each once, in signature order."""
        return self._signature_nodes("inputs")

    def signature_output_nodes(self) -> list[str]:
        """Nodes the signatures' outputs name, each once, in signature order."""
        return self._signature_nodes("outputs")

    def _signature_nodes(self, side: str) -> list[str]:
        out: list[str] = []
        for sig in self.signature_defs.values():
            for info in getattr(sig, side).values():
                out.extend(tensor_info_nodes(info))
        return list(dict.fromkeys(out))

    def fed_nodes(self) -> list[str]:
        """Nodes whose value is fed at run time: signature inputs, asset paths, the saver's
        checkpoint path. Nothing downstream of them may be folded into a constant."""
        fed = self.signature_input_nodes() + [node_name(a.tensor_info.name)
                                              for a in self.asset_file_defs]
        if self.saver_def is not None and self.saver_def.filename_tensor_name:
            fed.append(node_name(self.saver_def.filename_tensor_name))
        return list(dict.fromkeys(fed))

    def must_keep(self) -> list[str]:
        """Every node a stage must keep: signature tensors plus the protected set."""
        return list(dict.fromkeys(
            self.signature_input_nodes() + self.signature_output_nodes()
            + list(self.protected_nodes)
        ))

    def serialized_size(self) -> int:
        return self.graph_def.ByteSize()


# Ops that reject an input at run time: what a control dependency onto the output path
# exists for (tf.debugging.assert_*, tf.Assert; TF1 wraps them in an If "AssertGuard").
ASSERTION_OPS = frozenset({"Assert"})
_PRINT_OPS = frozenset({"Print", "PrintV2"})


def _side_effect(node) -> bool:
    from serving_opt.savedmodel.host_ops import host_op_kind

    return node.op in ASSERTION_OPS or node.op in _PRINT_OPS or host_op_kind(node) is not None


def assertion_guards(graph_def) -> set[str]:
    """Top-level nodes whose run is observable: ``Assert`` (rejects an input), prints and
    host ops (``serving_opt.savedmodel.host_ops``), or a call/If/While whose functions hold one.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    asserting = {name for name, f in library.items()
                 if any(_side_effect(n) for n in f.node_def)}
    # A function calling an asserting function asserts too.
    changed = True
    while changed:
        changed = False
        for name, f in library.items():
            if name not in asserting and any(c in asserting for n in f.node_def
                                             for c in called_functions(n)):
                asserting.add(name)
                changed = True
    return {n.name for n in graph_def.node
            if _side_effect(n) or any(c in asserting for c in called_functions(n))}


def guarded_outputs(graph_def, outputs: Iterable[str]) -> dict[str, set[str]]:
    """Output node -> the assertion guards it waits for (through data or control inputs)."""
    guards = assertion_guards(graph_def)
    if not guards:
        return {}
    return {out: reachable_nodes(graph_def, [out]) & guards - {out} for out in outputs}


_GUARD_SUFFIX = "/serving_opt_guard"


def _waits_for(graph_def, out: str, guard, nodes: dict) -> bool:
    """Whether running ``out`` runs the assertion in ``guard``. A guard with outputs (an
    ``If``/call) must be reached through a data edge: a control edge from a lowered
    ``If`` only waits for the branch's control outputs, which a TF1 AssertGuard has none
    of (its Assert feeds the branch's output)."""
    reached = reachable_nodes(graph_def, [out])
    if guard.name not in reached:
        return False
    if not _first_output_type(guard):
        return True
    return any(not i.startswith("^") and node_name(i) == guard.name
               for name in reached for i in nodes[name].input)


def _first_output_type(node) -> int:
    for attr in ("Tout", "output_types"):
        if attr in node.attr and node.attr[attr].list.type:
            return node.attr[attr].list.type[0]
    return 0


def reattach_assertions(graph_def, before: dict[str, set[str]]) -> list[str]:
    """Makes each output wait again for the guards it waited for ``before`` a rewrite.

    Folding and node removal (the Graph Transform Tool's ``remove_nodes`` and
    ``fold_constants``, Grappler's dependency optimizer) drop or shortcut the control
    inputs of the nodes they replace, so an assertion that guarded the output path stops
    running: the original rejects a bad input, the rewritten graph answers it. The guard
    itself is a stateful node and survives; the output gets a control input from an
    ``Identity`` of the guard's first output (``<guard>/serving_opt_guard``, which a
    lowered ``If`` runs its branch for), or from the guard when it has no output.
    Changes ``graph_def`` in place; returns the names of the nodes now guarding an
    output (to be protected by later stages).
    """
    if not before:
        return []
    nodes = {n.name: n for n in graph_def.node}
    added: list[str] = []
    for out, guards in before.items():
        node = nodes.get(out)
        if node is None or node.op in ("Placeholder", "PlaceholderWithDefault"):
            continue
        for guard in sorted(guards):
            if guard not in nodes or _waits_for(graph_def, out, nodes[guard], nodes):
                continue
            dtype = _first_output_type(nodes[guard])
            waiter = guard
            if dtype:
                waiter = guard + _GUARD_SUFFIX
                if waiter not in nodes:
                    identity = graph_def.node.add(name=waiter, op="Identity")
                    identity.input.append(f"{guard}:0")
                    identity.attr["T"].type = dtype
                    nodes[waiter] = identity
            if "^" + waiter not in node.input:
                node.input.append("^" + waiter)
            added.append(waiter)
    return list(dict.fromkeys(added))
