"""The untrusted-model stance: a SavedModel is code, and nothing of it runs on the
build host that touches files or the host, unless the user says so.

:func:`host_op_uses` finds the ops of :mod:`serving_opt.host_ops` a signature (or the
init op, which the loader runs) can execute, at the top level and inside every
function called on the way, except the loader's own: the checkpoint ops of the
SaverDef's save/restore subgraph, and table initializers reading an asset
(``InitializeTableFromTextFile`` whose file name is an asset tensor, or, inside a
function, a function argument: TF2 passes the asset path in). :func:`refuse_host_ops`
turns the first of them into the one-line error ``optimize`` and ``validate`` raise
before running the model at all; ``--allow_file_ops`` opts in.

Example:
    >>> uses = host_op_uses(meta_graph)
    >>> uses[0].op, uses[0].signatures
    ('WriteFile', ('serving_default',))
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.graph import (
    node_name,
    reachable_functions,
    reachable_nodes,
    tensor_info_nodes,
)
from serving_opt.host_ops import CHECKPOINT_OPS, TABLE_FROM_FILE_OPS, host_op_kind

INIT_OP = "init op"  # the pseudo-signature name of the loader's init op
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "ReadVariableOp"})


@dataclass(frozen=True)
class HostOpUse:
    """One host op a run can execute: ``function`` is None at the top level."""

    op: str
    name: str
    function: str | None
    kind: str  # host_ops.WRITES_FILES, ...
    signatures: tuple[str, ...]  # keys that reach it (INIT_OP for the init op)

    @property
    def label(self) -> str:
        return f"{self.function}/{self.name}" if self.function else self.name


def _closure(graph_def, roots: Iterable[str]) -> tuple[set[str], set[str]]:
    """(top-level node names, library function names) a run of ``roots`` may execute."""
    nodes = {n.name: n for n in graph_def.node}
    top = reachable_nodes(graph_def, roots)
    functions = reachable_functions(graph_def, [nodes[n] for n in top])
    return top, functions


def _asset_nodes(meta_graph) -> set[str]:
    """Nodes of the asset tensors the loader feeds with asset paths."""
    from tensorflow.core.protobuf import meta_graph_pb2

    from serving_opt.stages import loader

    out = {node_name(a.tensor_info.name) for a in meta_graph.asset_file_def}
    collections_ = meta_graph.collection_def
    if loader.SAVED_MODEL_ASSETS_COLLECTION in collections_:
        for value in collections_[loader.SAVED_MODEL_ASSETS_COLLECTION].any_list.value:
            asset = meta_graph_pb2.AssetFileDef()
            value.Unpack(asset)
            out.add(node_name(asset.tensor_info.name))
    if loader.ASSET_FILEPATHS_COLLECTION in collections_:
        out.update(node_name(n) for n in
                   collections_[loader.ASSET_FILEPATHS_COLLECTION].node_list.value)
    return out


def _asset_fed(graph_def, node, asset_nodes: set[str]) -> bool:
    """Top-level table initializer whose file name is an asset tensor (via Identity)."""
    nodes = {n.name: n for n in graph_def.node}
    data = [i for i in node.input if not i.startswith("^")]
    if len(data) < 2:
        return False
    source = nodes.get(node_name(data[1]))
    while source is not None and source.name not in asset_nodes and \
            source.op in _PASS_THROUGH and source.input:
        source = nodes.get(node_name(source.input[0]))
    return source is not None and source.name in asset_nodes


def _argument_fed(function, node) -> bool:
    """Table initializer inside a function whose file name is a function argument."""
    args = {a.name for a in function.signature.input_arg}
    body = {n.name: n for n in function.node_def}
    data = [i for i in node.input if not i.startswith("^")]
    if len(data) < 2:
        return False
    name = data[1].split(":")[0]
    while name in body and body[name].op in _PASS_THROUGH and body[name].input:
        name = body[name].input[0].split(":")[0]
    return name in args


def host_op_uses(meta_graph, signature_keys: Sequence[str] | None = None,
                 include_init_op: bool = True) -> list[HostOpUse]:
    """Host ops the signatures (default: all serving ones) and the init op can run.

    Example:
        >>> [u.label for u in host_op_uses(meta_graph, ["serving_default"])]
        ['write_it']
    """
    from serving_opt.stages import loader

    graph_def = meta_graph.graph_def
    library = {f.signature.name: f for f in graph_def.library.function}
    keys = list(signature_keys) if signature_keys is not None \
        else sorted(loader.serving_signatures(meta_graph))
    roots: dict[str, list[str]] = {}
    for key in keys:
        sig = meta_graph.signature_def[key]
        # Inputs are fed: nothing upstream of them runs.
        roots[key] = [n for info in sig.outputs.values() for n in tensor_info_nodes(info)]
    init_op = loader.init_op_name(meta_graph) if include_init_op else None
    if init_op:
        roots[INIT_OP] = [init_op]

    # The loader's own saver: its checkpoint ops are not the model's doing.
    saver_top: set[str] = set()
    saver_functions: set[str] = set()
    if meta_graph.HasField("saver_def"):
        saver = meta_graph.saver_def
        saver_top, saver_functions = _closure(
            graph_def, [node_name(n) for n in (saver.restore_op_name, saver.save_tensor_name)
                        if n])
    asset_nodes = _asset_nodes(meta_graph)

    reached: dict[tuple, list[str]] = collections.defaultdict(list)
    kinds: dict[tuple, tuple[str, str]] = {}
    top_nodes = {n.name: n for n in graph_def.node}
    for key, starts in roots.items():
        top, functions = _closure(graph_def, starts)
        for name in top:
            node = top_nodes[name]
            kind = host_op_kind(node)
            if kind is None:
                continue
            if node.op in CHECKPOINT_OPS and name in saver_top:
                continue
            if node.op in TABLE_FROM_FILE_OPS and _asset_fed(graph_def, node, asset_nodes):
                continue
            reached[(None, name)].append(key)
            kinds[(None, name)] = (node.op, kind)
        for fname in functions:
            function = library[fname]
            for node in function.node_def:
                kind = host_op_kind(node)
                if kind is None:
                    continue
                if node.op in CHECKPOINT_OPS and fname in saver_functions:
                    continue
                if node.op in TABLE_FROM_FILE_OPS and _argument_fed(function, node):
                    continue
                reached[(fname, node.name)].append(key)
                kinds[(fname, node.name)] = (node.op, kind)
    uses = [HostOpUse(kinds[k][0], k[1], k[0], kinds[k][1], tuple(dict.fromkeys(v)))
            for k, v in reached.items()]
    return sorted(uses, key=lambda u: (u.signatures[0] == INIT_OP, u.label))


def refuse_host_ops(meta_graph, signature_keys: Sequence[str], what: str) -> None:
    """Raises the one-line refusal for the first host op ``signature_keys`` can run.

    Example:
        >>> refuse_host_ops(meta_graph, ["serving_default"], "optimize")
        Traceback (most recent call last):
        ServingOptError: signature serving_default runs WriteFile (node 'write_it'): ...
    """
    uses = host_op_uses(meta_graph, signature_keys)
    if not uses:
        return
    first = uses[0]
    where = "the init op" if first.signatures[0] == INIT_OP else \
        f"signature {first.signatures[0]}"
    more = f" (and {len(uses) - 1} more host op(s))" if len(uses) > 1 else ""
    raise ServingOptError(
        f"{where} runs {first.op} (node {first.label!r}), which {first.kind} on the machine "
        f"running the model{more}; refusing to {what} it: nothing was run",
        "the model is untrusted code; pass --allow_file_ops only if you trust it",
    )


__all__ = ["INIT_OP", "HostOpUse", "host_op_uses", "refuse_host_ops"]
