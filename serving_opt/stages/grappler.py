"""Grappler, TF's graph optimizer, run offline on the frozen graph.

TF Serving runs Grappler again at load time, but only offline do the weights
exist as constants, so constant folding and arithmetic simplification can reach
through them. Grappler prunes whatever the MetaGraph does not ask for: every
signature tensor goes in the signature map and every other protected node
(init op, table initializers, asset tensors) in the ``train_op`` collection,
which Grappler treats as fetch nodes.

For TF2 models the same machinery, with only the ``function`` optimizer, first
inlines the signature functions into the top level (:func:`inline_functions`), so
the Graph Transform Tool and the passes here see the ops instead of calls.
"""

from __future__ import annotations

from serving_opt.errors import ServingOptError, UsageError, first_line
from serving_opt.savedmodel.graph import (
    ServingGraph,
    all_node_defs,
    function_calls,
    guarded_outputs,
    reattach_assertions,
    stateful_nodes,
)

# The tfjs converter's choice: safe on inference graphs, and together they undo most
# of what freezing leaves behind (Identity chains, foldable shape math).
DEFAULT_PASSES = ("pruning", "constfold", "arithmetic", "dependency")
DEFAULT_ROUNDS = 2

# Names accepted by RewriterConfig.optimizers (tensorflow/core/grappler/optimizers/
# meta_optimizer.cc), the same names TF uses in ConfigProto.
KNOWN_PASSES = frozenset({
    "pruning", "function", "constfold", "shape", "arithmetic", "layout", "remap",
    "loop", "dependency", "memory", "common_subgraph_elimination", "debug_stripper",
    "scoped_allocator", "pin_to_host", "auto_mixed_precision", "implementation_selector",
})


def parse_passes(spec: str | None) -> tuple[str, ...]:
    """Parses ``--grappler``: a comma list, "default", or "none".
    """
    if spec is None or spec.strip().lower() == "default":
        return DEFAULT_PASSES
    if spec.strip().lower() in ("", "none"):
        return ()
    passes = tuple(p.strip() for p in spec.split(",") if p.strip())
    unknown = [p for p in passes if p not in KNOWN_PASSES]
    if unknown:
        raise UsageError(
            f"unknown Grappler pass(es) {', '.join(unknown)} in --grappler",
            f"valid passes: {', '.join(sorted(KNOWN_PASSES))}, or none",
        )
    return passes


def with_default_attrs(graph_def):
    """A copy of ``graph_def`` with every registered op's missing attrs at their
    defaults, as TF's importers fill them in.

    Exporters that strip default attrs (``strip_default_attrs=True``, the Estimator's
    since TF 1.9) leave a ``Placeholder`` of unknown shape without its ``shape`` attr,
    and Grappler's item builder then fails with "Failed to import metagraph" (seen on a
    TF 1.x export kept with its variables).
    """
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import op_def_registry

    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    functions = {f.signature.name for f in out.library.function}
    for node in all_node_defs(out):
        if node.op in functions:
            continue
        op_def = op_def_registry.get(node.op)
        if op_def is None:
            continue
        for attr in op_def.attr:
            if attr.name not in node.attr and attr.HasField("default_value"):
                node.attr[attr.name].CopyFrom(attr.default_value)
    return out


def run_grappler(
    graph: ServingGraph, passes: tuple[str, ...], rounds: int = DEFAULT_ROUNDS
) -> ServingGraph:
    """Runs the given Grappler passes ``rounds`` times, keeping every protected node."""
    if not passes:
        return graph
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewriter = config.graph_options.rewrite_options
    rewriter.optimizers.extend(passes)
    rewriter.meta_optimizer_iterations = 1  # ONE; rounds are explicit below
    rewriter.min_graph_nodes = -1  # optimize small graphs too

    graph_def = with_default_attrs(graph.graph_def)
    keep = graph.must_keep()
    for _ in range(rounds):
        meta_graph = meta_graph_pb2.MetaGraphDef()
        meta_graph.graph_def.CopyFrom(graph_def)
        for key, sig in graph.signature_defs.items():
            meta_graph.signature_def[key].CopyFrom(sig)
        meta_graph.collection_def["train_op"].node_list.value.extend(keep)
        try:
            graph_def = tf_optimizer.OptimizeGraph(
                config, meta_graph, verbose=False, graph_id=b"serving_opt"
            )
        except Exception as e:
            first = first_line(e)
            raise ServingOptError(
                f"Grappler failed with passes {','.join(passes)}: {first}",
                "drop the failing pass from --grappler (or --grappler=none)",
            ) from e
    _require_kept(graph_def, keep, "Grappler removed nodes the model needs",
                  "report this; rerun with --grappler=none meanwhile")
    # The dependency optimizer may drop control edges from assertions: put them back.
    guards = reattach_assertions(graph_def, guarded_outputs(graph.graph_def,
                                                            graph.signature_output_nodes()))
    return graph.replace(graph_def=graph_def, protected_nodes=tuple(dict.fromkeys(
        graph.protected_nodes + tuple(guards))))


def _require_kept(graph_def, keep: list[str], problem: str, fix: str) -> None:
    """Raises ``problem`` (naming up to five lost nodes) unless every ``keep`` node is
    still in ``graph_def``: a lost signature tensor or init op would only fail at load."""
    present = {n.name for n in graph_def.node}
    lost = [n for n in keep if n not in present]
    if lost:
        raise ServingOptError(f"{problem}: {', '.join(lost[:5])}", fix)


_CONTROL_FLOW_OPS = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case",
                               "StatelessCase"})
_LOWER_ATTR = "_lower_using_switch_merge"
# Remembers, across inlining (which copies node attributes verbatim), what the lowering
# attribute was before it was switched off: "1" true, "0" false, "" absent.
_LOWER_MARK = "_serving_opt_lowering"


def _switch_lowering_off(graph_def) -> None:
    # Inlining would otherwise lower tf.cond/tf.while_loop to Switch/Merge/Enter/Exit
    # frames: bigger graphs, cycles the Graph Transform Tool does not expect, and a
    # different graph than the one TF Serving builds (it lowers at load, itself).
    for node in all_node_defs(graph_def):
        if node.op in _CONTROL_FLOW_OPS:
            had = node.attr[_LOWER_ATTR].b if _LOWER_ATTR in node.attr else None
            node.attr[_LOWER_MARK].s = b"" if had is None else (b"1" if had else b"0")
            node.attr[_LOWER_ATTR].b = False


def _restore_lowering(graph_def) -> None:
    for node in all_node_defs(graph_def):
        if _LOWER_MARK not in node.attr:
            continue
        mark = node.attr[_LOWER_MARK].s
        del node.attr[_LOWER_MARK]
        if mark:
            node.attr[_LOWER_ATTR].b = mark == b"1"
        else:
            del node.attr[_LOWER_ATTR]


def inline_functions(graph: ServingGraph) -> tuple[ServingGraph, int]:
    """Inlines the function calls of a frozen TF2 graph into its top level.

    TF2 signatures are ``StatefulPartitionedCall`` nodes into the function library,
    so the Graph Transform Tool (which sees the top level only) would find nothing
    to fold. Grappler's function optimizer, alone, inlines them; call nodes keep
    their names (as ``IdentityN``/``NoOp``), so signatures, the init op and table
    initializers still resolve. tf.cond/tf.while_loop stay functional (``If``,
    ``While`` with their bodies in the library). Returns ``(graph, calls_inlined)``.
    """
    calls = function_calls(graph.graph_def)
    if not calls:
        return graph, 0
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewriter = config.graph_options.rewrite_options
    rewriter.optimizers.append("function")
    rewriter.meta_optimizer_iterations = 1
    rewriter.min_graph_nodes = -1
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(with_default_attrs(graph.graph_def))
    _switch_lowering_off(meta_graph.graph_def)
    for key, sig in graph.signature_defs.items():
        meta_graph.signature_def[key].CopyFrom(sig)
    keep = graph.must_keep()
    meta_graph.collection_def["train_op"].node_list.value.extend(keep)
    try:
        graph_def = tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False,
                                               graph_id=b"serving_opt_inline")
    except Exception as e:
        first = first_line(e)
        raise ServingOptError(f"inlining the signature functions failed: {first}",
                              "rerun with --freeze=never to keep the functions") from e
    _restore_lowering(graph_def)
    _require_kept(graph_def, keep, "inlining the signature functions lost nodes the model needs",
                  "rerun with --freeze=never to keep the functions")
    present = {n.name for n in graph_def.node}
    for node in graph_def.node:
        # Inlined nodes carry colocation constraints on the call's argument nodes, which
        # the transforms remove (Identity); a dangling constraint makes the graph
        # unimportable. Placement needs none of them: resource users follow their
        # resource anyway.
        if "_class" in node.attr:
            del node.attr["_class"]
        node.device = ""
    remaining = set(function_calls(graph_def))
    # Stateful ops that lived inside functions are top-level now: protect them like the
    # freeze protected the top-level ones (no merging, no folding away).
    protected = [n for n in graph.protected_nodes if n in present] + stateful_nodes(graph_def)
    inlined = graph.replace(graph_def=graph_def,
                            protected_nodes=tuple(dict.fromkeys(protected)))
    return inlined, len([c for c in calls if c not in remaining])
