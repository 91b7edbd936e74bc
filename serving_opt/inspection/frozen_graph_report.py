"""``inspect`` on a frozen GraphDef (``frozen_inference_graph.pb``): what to pass as
``--inputs``/``--outputs``, what the graph holds, and what could hurt serving it.

A GraphDef has no signatures: the report lists the candidate inputs (Placeholders) and
outputs (nodes nothing consumes) with dtype and shape, the op histogram, which outputs
pass through discontinuous ops (NMS, TopK, ArgMax: parity judges them as detections or
near-ties) and the batch norms and CheckNumerics the transforms would fold or remove.
Ops that touch the host are ERROR risks, as in a SavedModel. Reads the file only.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import asdict, dataclass

from serving_opt.core.rendering import printable
from serving_opt.inspection.report import Risk
from serving_opt.inspection.risks import SEVERITY_ERROR
from serving_opt.savedmodel import frozen_graph, graph_diff
from serving_opt.savedmodel.host_ops import host_op_kind


@dataclass(frozen=True)
class GraphDefReport:
    """What ``inspect`` says about a ``.pb``."""

    path: str
    size_bytes: int
    nodes: int
    functions: int
    inputs: tuple[str, ...]  # "image_tensor:0 (uint8 [?,?,?,3])"
    outputs: tuple[str, ...]
    op_histogram: dict
    discontinuous: str  # "4 of 4 outputs pass through CombinedNonMaxSuppression; ..."
    foldable: tuple[str, ...]  # "2 FusedBatchNormV3 after Conv2D", "1 CheckNumerics"
    risks: tuple[Risk, ...]

    def to_json(self) -> str:
        data = asdict(self)
        data["risks"] = [r.to_dict() for r in self.risks]
        return json.dumps(data, indent=2)

    def format_table(self) -> str:
        """The report as text: interface, what folds, risks, ops."""
        out = [f"frozen GraphDef {self.path} ({self.size_bytes / 1024:.1f} KiB, "
               f"{self.nodes} nodes, {self.functions} functions)",
               f"  candidate inputs:  {', '.join(self.inputs) or 'none'}",
               f"  candidate outputs: {', '.join(self.outputs) or 'none'}"]
        if self.discontinuous:
            out.append(f"  discontinuous:     {self.discontinuous}")
        for line in self.foldable:
            out.append(f"  to fold/remove:    {line}")
        for risk in self.risks:
            out.append(f"  risk {risk.severity.upper()} {risk.code}: {risk.message}")
        ops = ", ".join(f"{op} {n}" for op, n in
                        sorted(self.op_histogram.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(f"  ops: {ops}")
        outputs = ",".join(o.split(" ")[0].removesuffix(":0") for o in self.outputs)
        out.append(f"  optimize it: serving-opt optimize --saved_model_dir={self.path} "
                   f"--model_base_path=BASE --outputs={outputs or 'NAME[,NAME...]'}")
        # Node, op and tensor names are the model's: escaped, a name cannot drive the
        # terminal (report.printable leaves text it already escaped unchanged).
        return "\n".join(printable(line) for line in out)


def inspect_graph_def(path: str) -> GraphDefReport:
    """Reads the ``.pb`` at ``path`` (never runs it) and reports on it."""
    graph_def = frozen_graph.read_graph_def(path)
    found = frozen_graph.interface(graph_def)
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    risks = []
    for node in nodes:
        kind = host_op_kind(node)
        if kind is not None:
            risks.append(Risk("host_op", SEVERITY_ERROR,
                              f"{node.op} {node.name} {kind}; optimize refuses it unless "
                              "--allow_file_ops", node.name))
    patterns = graph_diff.find_patterns(graph_def)
    foldable = []
    for op, count in sorted(patterns.fused_batch_norms.items()):
        foldable.append(f"{count} {op} (fold_batch_norms / fold_old_batch_norms)")
    chains = sum(patterns.unfused_batch_norms.values())
    if chains:
        foldable.append(f"{chains} unfused batch norms (Mul/Add after a Conv2D or MatMul)")
    if patterns.check_numerics:
        foldable.append(f"{len(patterns.check_numerics)} CheckNumerics (they raise on "
                        "NaN/Inf; serving-opt keeps them on the output path)")
    discontinuous = ""
    try:
        graph = frozen_graph.to_serving_graph(graph_def, outputs=[c.name for c in found.outputs],
                                          path=path)
    except Exception:  # noqa: BLE001 - no single input: the candidates say so
        graph = None
    if graph is not None:
        from serving_opt.detection import discontinuous as discontinuous_lib

        signature = graph.signature_defs[frozen_graph.SIGNATURE_KEY]
        discontinuous = discontinuous_lib.analyze(graph.graph_def, signature).summary()
    return GraphDefReport(
        path=path, size_bytes=os.path.getsize(path), nodes=len(graph_def.node),
        functions=len(graph_def.library.function),
        inputs=tuple(c.describe() for c in found.inputs),
        outputs=tuple(c.describe() for c in found.outputs),
        op_histogram=dict(collections.Counter(n.op for n in graph_def.node)),
        discontinuous=discontinuous, foldable=tuple(foldable), risks=tuple(risks))
