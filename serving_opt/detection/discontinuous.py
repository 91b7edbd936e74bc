"""Which outputs of a signature pass through discontinuous ops, and what feeds those ops.

NMS, TopK, ArgMax, comparisons, Where, Unique and float-to-integer casts turn a rounding
difference into a different discrete answer: two boxes whose scores nearly tie swap,
a score on the threshold drops out. For outputs behind such an op an elementwise check
is the wrong test; the right one compares the continuous tensors that feed the op
elementwise and the outputs as what they mean (:mod:`serving_opt.detection.matching`).
:func:`analyze` finds, for one signature of a GraphDef (top level; ops inside library
functions are reported without fetchable feeds):

* each output's discontinuous ops (none: compare it elementwise as always);
* each discontinuous op's *feeds*: its float inputs that depend on the request (not the
  thresholds and sizes, which are constants);
* whether the signature looks like a detection model (boxes, scores, classes and
  optionally a count, from an NMS op), and its output keys.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from serving_opt.detection.matching import DetectionKeys
from serving_opt.savedmodel.graph import called_functions, node_name
from serving_opt.savedmodel.graph_diff import request_dependent

NMS_OPS = frozenset({
    "NonMaxSuppression", "NonMaxSuppressionV2", "NonMaxSuppressionV3",
    "NonMaxSuppressionV4", "NonMaxSuppressionV5", "NonMaxSuppressionWithOverlaps",
    "CombinedNonMaxSuppression",
})
TOPK_OPS = frozenset({"TopK", "TopKV2", "ApproxTopK", "InTopK", "InTopKV2"})
ARG_OPS = frozenset({"ArgMax", "ArgMin"})
COMPARISON_OPS = frozenset({"Greater", "GreaterEqual", "Less", "LessEqual", "Equal",
                            "NotEqual", "ApproximateEqual"})
SELECTION_OPS = frozenset({"Where", "Unique", "UniqueV2", "UniqueWithCounts",
                           "UniqueWithCountsV2", "Bucketize"})
ROUNDING_OPS = frozenset({"Round", "Floor", "Ceil", "Rint", "Sign", "FloorDiv", "FloorMod"})
# Casts are discontinuous only from a float type to an integer or bool (checked below).
DISCONTINUOUS_OPS = NMS_OPS | TOPK_OPS | ARG_OPS | COMPARISON_OPS | SELECTION_OPS | \
    ROUNDING_OPS | frozenset({"Cast"})

_FLOAT_TYPES = frozenset({1, 2, 14, 19})  # DT_FLOAT, DT_DOUBLE, DT_BFLOAT16, DT_HALF


def kind(op: str) -> str | None:
    """"nms", "topk", "argmax", "comparison", "selection", "rounding", "cast" or None.
    """
    for name, ops in (("nms", NMS_OPS), ("topk", TOPK_OPS), ("argmax", ARG_OPS),
                      ("comparison", COMPARISON_OPS), ("selection", SELECTION_OPS),
                      ("rounding", ROUNDING_OPS)):
        if op in ops:
            return name
    return "cast" if op == "Cast" else None


def _input_types(node) -> list[int | None]:
    """The dtype of each data input of ``node`` from its op's definition and attrs;
    None where unknown (an op TensorFlow does not know)."""
    from tensorflow.python.framework import op_def_registry

    inputs = [i for i in node.input if not i.startswith("^")]
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return [None] * len(inputs)
    types: list[int | None] = []
    for arg in op_def.input_arg:
        if arg.type_list_attr:
            types.extend(node.attr[arg.type_list_attr].list.type
                         if arg.type_list_attr in node.attr else [])
            continue
        count = node.attr[arg.number_attr].i if arg.number_attr and \
            arg.number_attr in node.attr else 1
        if arg.type:
            dtype: int | None = arg.type
        elif arg.type_attr and arg.type_attr in node.attr:
            dtype = node.attr[arg.type_attr].type
        else:
            dtype = None
        types.extend([dtype] * count)
    types += [None] * (len(inputs) - len(types))
    return types[:len(inputs)]


def _is_discontinuous(node, float_inputs: list[str]) -> bool:
    if node.op == "Cast":  # float to an integer or bool; not to a float or complex type
        dst = node.attr["DstT"].type if "DstT" in node.attr else 0
        return bool(float_inputs) and dst not in _FLOAT_TYPES and dst not in (8, 18)
    # An integer comparison or argmax is exact: only float inputs make near-ties.
    return node.op in DISCONTINUOUS_OPS and bool(float_inputs)


@dataclass(frozen=True)
class DiscontinuousOp:
    """One discontinuous op the signature's outputs depend on.

    ``feeds`` are the tensors to compare elementwise instead of trusting its output:
    its float inputs that depend on the request. ``function`` names the library function
    it is in (its feeds then cannot be fetched; ``feeds`` is empty).
    """

    name: str
    op: str
    kind: str
    feeds: tuple[str, ...]
    function: str | None = None
    # Discontinuous ops upstream of a feed: its feeds are themselves discrete-derived,
    # so an elementwise check of them is not the whole story.
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutputPath:
    """One signature output and the discontinuous ops between the inputs and it."""

    key: str
    tensor: str
    ops: tuple[str, ...]  # names of its DiscontinuousOps, nearest to the output first

    @property
    def continuous(self) -> bool:
        return not self.ops


@dataclass(frozen=True)
class Analysis:
    """What :func:`analyze` found for one signature."""

    signature_key: str
    outputs: tuple[OutputPath, ...]
    ops: tuple[DiscontinuousOp, ...]
    detection: DetectionKeys | None  # set when the signature looks like a detection model

    def op(self, name: str) -> DiscontinuousOp:
        return next(o for o in self.ops if o.name == name)

    def continuous_keys(self) -> tuple[str, ...]:
        """Output keys to compare elementwise, as always."""
        return tuple(p.key for p in self.outputs if p.continuous)

    def discontinuous_keys(self) -> tuple[str, ...]:
        """Output keys to compare as what they mean (detections, top-k sets, argmax)."""
        return tuple(p.key for p in self.outputs if not p.continuous)

    def first_ops(self) -> tuple[DiscontinuousOp, ...]:
        """The discontinuous ops fed by continuous tensors only (no other such op
        upstream): where a rounding difference first becomes a discrete one."""
        return tuple(o for o in self.ops if not o.after)

    def feeding_tensors(self) -> tuple[str, ...]:
        """The tensors to fetch and compare elementwise in both runs: the feeds of
        :meth:`first_ops`, in graph order of the ops.
        """
        out: list[str] = []
        for o in self.first_ops():
            out.extend(o.feeds)
        return tuple(dict.fromkeys(out))

    def unfetchable(self) -> tuple[DiscontinuousOp, ...]:
        """Discontinuous ops inside library functions: their feeds cannot be fetched, so
        a changed answer behind them cannot be excused as a near-tie."""
        return tuple(o for o in self.ops if o.function)

    def summary(self) -> str:
        """E.g. "4 of 4 outputs pass through CombinedNonMaxSuppression; fed by 2 tensors;
        a detection model (detection_boxes, ...)"."""
        outputs = len(self.outputs)
        behind = len(self.discontinuous_keys())
        if not behind:
            return f"all {outputs} outputs are continuous"
        ops = sorted({o.op for o in self.ops})
        text = (f"{behind} of {outputs} outputs pass through {', '.join(ops)}; fed by "
                f"{len(self.feeding_tensors())} continuous tensors")
        if self.detection:
            d = self.detection
            keys = ", ".join(k for k in (d.boxes, d.scores, d.classes, d.num) if k)
            text += f"; a detection model ({keys})"
        return text


def _float_typed(node) -> bool:
    """Inside a function, where inputs are not traced: a comparison, argmax or rounding
    of integers (a while loop's ``i < n``) is exact; NMS and TopK are always counted."""
    if node.op in NMS_OPS or node.op in TOPK_OPS:
        return True
    if "T" not in node.attr:
        return True  # unknown: counted, as the safe side
    return node.attr["T"].type in _FLOAT_TYPES


def _producing_op(function_library: dict, name: str, seen: set[str]) -> str | None:
    """The first discontinuous op type inside function ``name`` or one it calls."""
    if name in seen or name not in function_library:
        return None
    seen.add(name)
    for node in function_library[name].node_def:
        if node.op in DISCONTINUOUS_OPS - {"Cast"} and _float_typed(node):
            return node.op
        for called in called_functions(node):
            found = _producing_op(function_library, called, seen)
            if found:
                return found
    return None


def analyze(graph_def, signature_def, signature_key: str = "serving_default") -> Analysis:
    """Finds the discontinuous ops each output of ``signature_def`` passes through, the
    continuous tensors feeding them, and whether the signature is a detection model.

    Walks data edges back from each output over the top-level graph (TF1 while loops
    included: the OD API's NMS runs inside one, and its feeds, which cannot be fetched
    there, are replaced by the tensors entering the loop); a call op whose function holds
    a discontinuous op is reported with ``function`` set and no feeds.
    """
    nodes = {n.name: n for n in graph_def.node}
    library = {f.signature.name: f for f in graph_def.library.function}
    dependent = request_dependent(graph_def)
    classified: dict[str, DiscontinuousOp | None] = {}
    in_loops = _in_loop_frames(graph_def)

    def classify(name: str) -> DiscontinuousOp | None:
        if name not in classified:
            op = _classify(nodes[name], library, dependent)
            if op is not None and in_loops and any(node_name(f) in in_loops for f in op.feeds):
                op = dataclasses.replace(op, feeds=_hoisted(op.feeds, nodes, in_loops,
                                                            dependent))
            classified[name] = op
        return classified[name]

    def upstream(name: str) -> tuple[str, ...]:
        """Discontinuous ops at or above node ``name``, nearest first (breadth first,
        so cycles of while loops end)."""
        seen = {name}
        frontier = [name]
        out: list[str] = []
        while frontier:
            following: list[str] = []
            for current in frontier:
                if current not in nodes:
                    continue
                if classify(current) is not None:
                    out.append(current)
                for i in nodes[current].input:
                    if i.startswith("^"):
                        continue
                    parent = node_name(i)
                    if parent not in seen:
                        seen.add(parent)
                        following.append(parent)
            frontier = following
        return tuple(out)

    paths = []
    for key in sorted(signature_def.outputs):
        tensor = signature_def.outputs[key].name
        paths.append(OutputPath(key, tensor, upstream(node_name(tensor)) if tensor else ()))
    reached = dict.fromkeys(name for p in paths for name in p.ops)
    # Which ops have another discontinuous op upstream of one of their feeds.
    ops = []
    for name in reached:
        op = classified[name]
        after: list[str] = []
        for feed in op.feeds:
            after.extend(o for o in upstream(node_name(feed)) if o != name)
        ops.append(dataclasses.replace(op, after=tuple(dict.fromkeys(after))))
    order = {n.name: i for i, n in enumerate(graph_def.node)}
    ops.sort(key=lambda o: order.get(o.name, 0))
    analysis = Analysis(signature_key, tuple(paths), tuple(ops), None)
    return dataclasses.replace(analysis, detection=detection_keys(signature_def, analysis))


def _in_loop_frames(graph_def) -> set[str]:
    """Nodes inside a TF1 while loop's frame: downstream of an Enter, up to its Exit.
    Their tensors cannot be fetched from outside the loop."""
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    enters = []
    for node in graph_def.node:
        if node.op in ("Enter", "RefEnter"):
            enters.append(node.name)
        for i in node.input:
            if not i.startswith("^"):
                consumers[node_name(i)].append(node.name)
    by_name = {n.name: n for n in graph_def.node}
    inside: set[str] = set()
    stack = list(enters)
    while stack:
        name = stack.pop()
        if name in inside:
            continue
        inside.add(name)
        for consumer in consumers.get(name, ()):
            if by_name[consumer].op not in ("Exit", "RefExit"):
                stack.append(consumer)
    return inside


def _hoisted(feeds: tuple[str, ...], nodes: dict, in_loops: set[str],
             dependent: set[str]) -> tuple[str, ...]:
    """Feeds inside a while loop (the OD API's per-image, per-class NMS) replaced by the
    request-dependent float tensors that enter the loop and reach them: fetchable, and
    when they agree row by row the values inside the loop computed from them do too."""
    out: list[str] = []
    for feed in feeds:
        if node_name(feed) not in in_loops:
            out.append(feed)
            continue
        seen = {node_name(feed)}
        stack = [node_name(feed)]
        while stack:
            node = nodes.get(stack.pop())
            if node is None:
                continue
            if node.op in ("Enter", "RefEnter"):
                source = next((i for i in node.input if not i.startswith("^")), "")
                dtype = node.attr["T"].type if "T" in node.attr else 0
                if source and node_name(source) in dependent and dtype in _FLOAT_TYPES:
                    if node_name(source) in in_loops:  # a nested loop: one level out more
                        out.extend(_hoisted((_tensor(source),), nodes, in_loops, dependent))
                    else:
                        out.append(_tensor(source))
                continue
            for i in node.input:
                parent = node_name(i)
                if not i.startswith("^") and parent in in_loops and parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
    return tuple(dict.fromkeys(out))


def _classify(node, library: dict, dependent: set[str]) -> DiscontinuousOp | None:
    """The node as a discontinuous op, or None."""
    functions = [f for f in called_functions(node) if f in library]
    if functions:  # a call, If, While...: what runs is in the library
        for function in functions:
            inner = _producing_op(library, function, set())
            if inner:
                return DiscontinuousOp(node.name, f"{node.op}:{inner}", kind(inner) or "", (),
                                       function=function)
        return None
    if node.op not in DISCONTINUOUS_OPS:
        return None
    inputs = [i for i in node.input if not i.startswith("^")]
    float_inputs = [_tensor(i) for i, t in zip(inputs, _input_types(node))
                    if t in _FLOAT_TYPES and node_name(i) in dependent]
    if not _is_discontinuous(node, float_inputs):
        return None
    return DiscontinuousOp(node.name, node.op, kind(node.op) or "", tuple(float_inputs))


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"


_ROLE_WORDS = (("boxes", ("box",)), ("scores", ("score",)),
               ("classes", ("class", "label")), ("num", ("num", "count", "valid")))


def detection_keys(signature_def, analysis: Analysis) -> DetectionKeys | None:
    """The signature's detection outputs when it looks like a detection model: outputs
    named for boxes, scores and classes (and optionally a count) whose boxes and scores
    come out of an NMS op; None otherwise.
    """
    paths = {p.key: p for p in analysis.outputs}
    roles: dict[str, str] = {}
    for role, words in _ROLE_WORDS:
        candidates = [k for k in sorted(paths) if any(w in k.lower() for w in words)
                      and k not in roles.values()]
        if role == "boxes":  # "raw_detection_boxes" (before NMS) is not the answer
            candidates = [k for k in candidates if not k.lower().startswith("raw")] \
                or candidates
        if len(candidates) > 1:
            behind = [k for k in candidates if not paths[k].continuous]
            candidates = behind or candidates
        if candidates:
            roles[role] = candidates[0]
    if not all(r in roles for r in ("boxes", "scores", "classes")):
        return None
    nms_ops = {o.name for o in analysis.ops if o.kind == "nms"}
    if not all(nms_ops & set(paths[roles[r]].ops) for r in ("boxes", "scores")):
        return None
    boxes_info = signature_def.outputs[roles["boxes"]]
    dims = boxes_info.tensor_shape.dim
    if not boxes_info.tensor_shape.unknown_rank and dims and dims[-1].size not in (-1, 4):
        return None
    return DetectionKeys(roles["boxes"], roles["scores"], roles["classes"], roles.get("num"))


def pair_feeds(before: Analysis, after: Analysis) -> list[tuple[str, str]]:
    """(tensor in the original, tensor in the optimized graph) for each feed of the
    original's :meth:`Analysis.first_ops`: ops are paired by name, else by op type in
    order. Rewrites rename what feeds an op (fold_batch_norms gives the folded conv the
    Mul's name), rarely the NMS itself; unpaired feeds are left out.
    """
    by_name = {o.name: o for o in after.first_ops()}
    by_type: dict[str, list[DiscontinuousOp]] = collections.defaultdict(list)
    for o in after.first_ops():
        by_type[o.op].append(o)
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    for o in before.first_ops():
        match = by_name.get(o.name)
        if match is None or match.name in used:
            match = next((c for c in by_type.get(o.op, []) if c.name not in used), None)
        if match is None or len(match.feeds) != len(o.feeds):
            continue
        used.add(match.name)
        pairs.extend(zip(o.feeds, match.feeds))
    return list(dict.fromkeys(pairs))


__all__: Sequence[str] = ("Analysis", "DiscontinuousOp", "OutputPath", "analyze",
                          "detection_keys", "kind", "pair_feeds")
