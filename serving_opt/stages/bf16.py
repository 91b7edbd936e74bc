"""bfloat16 compute with float32 at the edges (``--quantize=bf16``), for CPUs that have it.

Grappler's ``auto_mixed_precision_onednn_bfloat16`` pass, run offline on the frozen
graph, turns the compute ops (Conv2D, depthwise, MatMul, their bias adds, activations,
pools) into bfloat16, with Casts where float32 ops, inputs and outputs meet them;
constant folding in the same run stores the weights those ops read as bfloat16
constants, so no request casts a weight. The written GraphDef needs no special
kernels: stock TensorFlow's oneDNN build (which TF Serving's CPU build is) runs
bfloat16 Conv2D/MatMul with the CPU's AVX-512-BF16 or AMX-BF16 instructions. Without
them it emulates bfloat16, slower than float32: such a CPU is refused before any work.

Lossy (8 significant bits): the lossy gate judges it like the other ``--quantize`` modes,
and the regression gate refuses a model it makes slower (MobileNetV2 at batch 1 on the
machine measured; docs/low_precision_compute.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from serving_opt.errors import ServingOptError, UsageError

MODE = "bf16"
# /proc/cpuinfo flags of bfloat16 arithmetic; either makes oneDNN's bf16 kernels native.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Where the flags are read; tests point it at a file of their own.
CPUINFO = "/proc/cpuinfo"
PASSES = ("auto_mixed_precision_onednn_bfloat16", "constfold")
_DT_BFLOAT16 = 14  # types_pb2.DT_BFLOAT16


def cpu_flags(path: str | None = None) -> frozenset[str]:
    """The CPU's flags from ``/proc/cpuinfo`` (empty when it cannot be read: not Linux)."""
    try:
        with open(path or CPUINFO) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def check_cpu(flags: Iterable[str] | None = None) -> None:
    """UsageError unless the CPU computes bfloat16 natively (``flags``: this CPU's)."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    if not flags & set(BF16_FLAGS):
        raise UsageError(
            "--quantize=bf16 needs a CPU with bfloat16 arithmetic (AVX-512-BF16 or AMX-BF16; "
            "/proc/cpuinfo flags avx512_bf16, amx_bf16): this one has neither, and would "
            "run the bfloat16 graph slower than float32",
            "optimize with --quantize=bf16 on the kind of CPU that will serve (Intel Cooper "
            "Lake, Sapphire Rapids or newer), or use --quantize=none")


def bf16_compute_nodes(graph_def) -> list[str]:
    """Names of the nodes that compute in bfloat16 (Casts and constants not counted)."""
    # ``"T" in attr`` first: indexing a proto map inserts the key, which would corrupt the
    # graph for Grappler (an empty T attr on every node without one).
    return [n.name for n in graph_def.node if n.op not in ("Cast", "Const")
            and "T" in n.attr and n.attr["T"].type == _DT_BFLOAT16]


def to_bf16(graph):
    """The ServingGraph with its compute in bfloat16; returns ``(graph, converted)``,
    ``converted`` the number of nodes computing in bfloat16."""
    from tensorflow.python.util import _pywrap_util_port

    if graph.variables_dir is not None:
        raise ServingOptError(
            "--quantize=bf16 needs the frozen graph: with the variables kept, every request "
            "would cast the weights to bfloat16 again", "use --freeze=auto or always")
    if _pywrap_util_port.IsMklEnabled():
        graph = _run_passes(graph)
    else:
        # The optimizing process turns oneDNN's ops off (tf_process.configure_for_optimizing),
        # and Grappler's bfloat16 pass runs only with them on: a child runs it.
        graph = _run_passes_in_child(graph)
    converted = len(bf16_compute_nodes(graph.graph_def))
    if not converted:
        raise ServingOptError(
            "--quantize=bf16: Grappler turned no op into bfloat16 (it does only with "
            "TensorFlow's oneDNN ops, and only for ops such as Conv2D and MatMul)",
            "use --quantize=none for this model")
    return graph, converted


def _run_passes(graph):
    """Grappler's PASSES once, keeping every node the graph must keep (as stages.grappler
    does: signature tensors in the signature map, the rest as ``train_op`` fetches)."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewriter = config.graph_options.rewrite_options
    rewriter.optimizers.extend(PASSES)
    rewriter.meta_optimizer_iterations = 1
    rewriter.min_graph_nodes = -1
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph.graph_def)
    for key, sig in graph.signature_defs.items():
        meta_graph.signature_def[key].CopyFrom(sig)
    keep = graph.must_keep()
    meta_graph.collection_def["train_op"].node_list.value.extend(keep)
    graph_def = tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False,
                                           graph_id=b"serving_opt_bf16")
    missing = sorted(set(keep) - {n.name for n in graph_def.node})
    if missing:
        raise ServingOptError(f"--quantize=bf16: Grappler removed nodes the model needs "
                              f"({', '.join(missing[:3])})", "use --quantize=none for this model")
    return graph.replace(graph_def=graph_def)


def _run_passes_in_child(graph):
    import os
    import pickle
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as scratch:
        given, result = os.path.join(scratch, "in.pkl"), os.path.join(scratch, "out.pkl")
        with open(given, "wb") as f:
            pickle.dump(graph, f)
        child = subprocess.run([sys.executable, "-m", __name__, given, result],
                               capture_output=True, env=env)
        if child.returncode != 0:
            lines = child.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
            raise ServingOptError(
                f"--quantize=bf16: Grappler's bfloat16 pass failed: {lines[-1]}",
                "use --quantize=none for this model")
        with open(result, "rb") as f:
            return pickle.load(f)


if __name__ == "__main__":  # _run_passes_in_child's child: pickled ServingGraph in, out
    import pickle
    import sys

    with open(sys.argv[1], "rb") as f:
        converted = _run_passes(pickle.load(f))
    with open(sys.argv[2], "wb") as f:
        pickle.dump(converted, f)
