"""The value every optimizer stage takes and returns: a servable graph plus its contract.

A :class:`ServingGraph` is what TF Serving needs from a MetaGraph once variables
are constants: the GraphDef, the signatures to keep verbatim, the init op, and the
asset wiring. ``protected_nodes`` are the node names no stage may remove or
rename, because a signature, the loader or a table initializer refers to them.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field


def node_name(tensor_or_node: str) -> str:
    """``"^a"``, ``"a:1"`` and ``"a"`` all name node ``a``.

    Example:
        >>> node_name("dense/BiasAdd:0")
        'dense/BiasAdd'
    """
    return tensor_or_node.lstrip("^").split(":")[0]


def tensor_info_nodes(tensor_info) -> list[str]:
    """Node names a TensorInfo refers to (dense, sparse COO, or composite components).

    Example:
        >>> from tensorflow.core.protobuf import meta_graph_pb2
        >>> tensor_info_nodes(meta_graph_pb2.TensorInfo(name="x:0"))
        ['x']
    """
    encoding = tensor_info.WhichOneof("encoding")
    if encoding == "name":
        return [node_name(tensor_info.name)]
    if encoding == "coo_sparse":
        coo = tensor_info.coo_sparse
        return [node_name(n) for n in (coo.values_tensor_name, coo.indices_tensor_name,
                                       coo.dense_shape_tensor_name)]
    if encoding == "composite_tensor":
        out: list[str] = []
        for component in tensor_info.composite_tensor.components:
            out.extend(tensor_info_nodes(component))
        return out
    return []


def _function_refs(nodes) -> set[str]:
    refs: set[str] = set()
    for node in nodes:
        for value in node.attr.values():
            if value.HasField("func"):
                refs.add(value.func.name)
            refs.update(f.name for f in value.list.func)
        # Some ops name a function by op type (a call through the function library).
        refs.add(node.op)
    return refs


def prune_library(graph_def) -> int:
    """Drops library functions no node can call (saver and training leftovers).

    Freezing inlines or rewrites the serving functions, but the library still holds
    the originals, the save/restore functions, and their variable reads. Returns the
    number of functions removed.

    Example:
        >>> prune_library(frozen_graph_def)
        6
    """
    functions = {f.signature.name: f for f in graph_def.library.function}
    if not functions:
        return 0
    reachable: set[str] = set()
    frontier = [n for n in _function_refs(graph_def.node) if n in functions]
    while frontier:
        name = frontier.pop()
        if name in reachable:
            continue
        reachable.add(name)
        frontier.extend(n for n in _function_refs(functions[name].node_def)
                        if n in functions and n not in reachable)
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

    Example:
        >>> total_node_count(meta_graph.graph_def)
        2367
    """
    return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


@dataclass(frozen=True)
class ServingGraph:
    """A frozen serving graph and everything needed to write it back as a SavedModel.

    Example:
        >>> serving_graph.node_count()
        57
    """

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
    collection_defs: dict = field(default_factory=dict)

    def replace(self, **changes) -> ServingGraph:
        return dataclasses.replace(self, **changes)

    def node_count(self) -> int:
        """Nodes in the graph and in its library functions (where TF2 models keep theirs).

        Example:
            >>> serving_graph.node_count()
            57
        """
        return total_node_count(self.graph_def)

    def op_histogram(self) -> dict[str, int]:
        """Op type -> count, including nodes inside library functions.

        Example:
            >>> serving_graph.op_histogram()["MatMul"]
            2
        """
        counts = collections.Counter(n.op for n in self.graph_def.node)
        for function in self.graph_def.library.function:
            counts.update(n.op for n in function.node_def)
        return dict(sorted(counts.items()))

    def signature_input_nodes(self) -> list[str]:
        out: list[str] = []
        for sig in self.signature_defs.values():
            for info in sig.inputs.values():
                out.extend(tensor_info_nodes(info))
        return list(dict.fromkeys(out))

    def signature_output_nodes(self) -> list[str]:
        out: list[str] = []
        for sig in self.signature_defs.values():
            for info in sig.outputs.values():
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
