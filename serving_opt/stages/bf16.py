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
    return [n.name for n in graph_def.node
            if n.op not in ("Cast", "Const") and n.attr["T"].type == _DT_BFLOAT16]


def to_bf16(graph):
    """The ServingGraph with its compute in bfloat16; returns ``(graph, converted)``,
    ``converted`` the number of nodes computing in bfloat16."""
    from serving_opt.stages import grappler as grappler_lib

    graph = grappler_lib.run_grappler(graph, PASSES, rounds=1)
    converted = len(bf16_compute_nodes(graph.graph_def))
    if not converted:
        raise ServingOptError(
            "--quantize=bf16: Grappler turned no op into bfloat16 (it does only where "
            "TensorFlow's oneDNN ops are on, and only for ops such as Conv2D and MatMul)",
            "unset TF_ENABLE_ONEDNN_OPTS=0, or use --quantize=none for this model")
    return graph, converted
