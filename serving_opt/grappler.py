"""Grappler, TF's graph optimizer, run offline on the frozen graph.

TF Serving runs Grappler again at load time, but only offline do the weights
exist as constants, so constant folding and arithmetic simplification can reach
through them. Grappler prunes whatever the MetaGraph does not ask for: every
signature tensor goes in the signature map and every other protected node
(init op, table initializers, asset tensors) in the ``train_op`` collection,
which Grappler treats as fetch nodes.
"""

from __future__ import annotations

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.graph import ServingGraph

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

    Example:
        >>> parse_passes("constfold, arithmetic")
        ('constfold', 'arithmetic')
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


def run_grappler(
    graph: ServingGraph, passes: tuple[str, ...], rounds: int = DEFAULT_ROUNDS
) -> ServingGraph:
    """Runs the given Grappler passes ``rounds`` times, keeping every protected node.

    Example:
        >>> optimized = run_grappler(frozen, ("constfold", "arithmetic"))
        >>> optimized.node_count() <= frozen.node_count()
        True
    """
    if not passes:
        return graph
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewriter = config.graph_options.rewrite_options
    rewriter.optimizers.extend(passes)
    rewriter.meta_optimizer_iterations = 1  # ONE; rounds are explicit below
    rewriter.min_graph_nodes = -1  # optimize small graphs too

    graph_def = graph.graph_def
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
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ServingOptError(
                f"Grappler failed with passes {','.join(passes)}: {first}",
                "drop the failing pass from --grappler (or --grappler=none)",
            ) from e
    present = {n.name for n in graph_def.node}
    lost = [n for n in keep if n not in present]
    if lost:
        raise ServingOptError(
            f"Grappler removed nodes the model needs: {', '.join(lost[:5])}",
            "report this; rerun with --grappler=none meanwhile",
        )
    return graph.replace(graph_def=graph_def)
