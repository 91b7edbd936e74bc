"""The inspection report: immutable dataclasses, each with its part of the JSON format.

``InspectionReport.to_dict()`` is the structure docs/inspect-json-schema.md documents
(``schema_version`` :data:`SCHEMA_VERSION`); ``format_table()`` the human text
(:func:`format_report`, at the end: the directory's sizes and largest variables, then
per MetaGraph its signatures, assets and most frequent ops, then the risks). The text
lives here, beside the dataclasses it prints, so that neither module imports the other.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional

from serving_opt.core.rendering import human_bytes, printable, table
from serving_opt.savedmodel import loader

SCHEMA_VERSION = 1

Shape = Optional[tuple[int, ...]]
JsonDict = dict[str, Any]


@dataclass(frozen=True)
class TensorReport:
    """One input or output of a signature (a TensorInfo under its alias).

    ``encoding`` is the TensorInfo oneof in use: ``"name"`` (a dense tensor),
    ``"coo_sparse"`` or ``"composite_tensor"``. ``name`` is the dense tensor name, or None
    for sparse and composite tensors; ``components`` lists every graph tensor the
    TensorInfo refers to. ``shape`` None means unknown rank; -1 is an unknown dimension.
    ``dtype`` is TensorFlow's name ("float32"), None when the TensorInfo has none.
    """

    alias: str
    dtype: Optional[str]
    shape: Shape
    encoding: str
    name: Optional[str]
    components: tuple[str, ...]

    @property
    def shape_text(self) -> str:
        return "unknown rank" if self.shape is None else "[" + ", ".join(map(str, self.shape)) + "]"

    def to_dict(self) -> JsonDict:
        return {
            "alias": self.alias,
            "dtype": self.dtype,
            "shape": "unknown rank" if self.shape is None else list(self.shape),
            "encoding": self.encoding,
            "name": self.name,
            "components": list(self.components),
        }


@dataclass(frozen=True)
class SignatureReport:
    """A signature: key, method name (e.g. tensorflow/serving/predict), inputs and outputs."""

    key: str
    method_name: str
    inputs: tuple[TensorReport, ...]
    outputs: tuple[TensorReport, ...]

    def to_dict(self) -> JsonDict:
        return {
            "key": self.key,
            "method_name": self.method_name,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


@dataclass(frozen=True)
class AssetReport:
    """An asset file declared by the MetaGraph.

    ``size_bytes`` is None when the file is missing or its name escapes ``assets/`` (such
    a file is deliberately not looked at).
    """

    filename: str
    tensor_name: str
    size_bytes: Optional[int]
    exists: bool
    escapes: bool

    def to_dict(self) -> JsonDict:
        return {
            "filename": self.filename,
            "tensor_name": self.tensor_name,
            "size_bytes": self.size_bytes,
            "exists": self.exists,
            "escapes_assets_dir": self.escapes,
        }


@dataclass(frozen=True)
class VariableReport:
    """One tensor of the variables checkpoint.

    ``name`` is the checkpoint key: the variable's graph name for TF1 exports, an object
    path such as ``variables/0/.ATTRIBUTES/VARIABLE_VALUE`` for TF2 ones, where
    ``full_name`` then holds the variable's own name (``dense/kernel``) if recorded.
    """

    name: str
    full_name: Optional[str]
    shape: tuple[int, ...]
    dtype: str
    size_bytes: int

    def to_dict(self) -> JsonDict:
        return {
            "name": self.name,
            "full_name": self.full_name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.size_bytes,
        }


@dataclass(frozen=True)
class VariablesReport:
    """The variables checkpoint (``variables/variables.*``), shared by all MetaGraphs.

    ``status`` is ``"ok"``, ``"absent"`` (no checkpoint: a model without variables) or
    ``"unreadable"``. ``naming`` is ``"graph"`` (TF1 name-based checkpoint) or
    ``"object"`` (TF2 object-based checkpoint keys), None unless the status is ok.
    """

    status: str
    naming: Optional[str]
    count: int
    total_bytes: int
    largest: tuple[VariableReport, ...]
    limit_bytes: int

    def to_dict(self) -> JsonDict:
        return {
            "status": self.status,
            "naming": self.naming,
            "count": self.count,
            "total_bytes": self.total_bytes,
            "protobuf_limit_bytes": self.limit_bytes,
            "largest": [v.to_dict() for v in self.largest],
        }


@dataclass(frozen=True)
class DiskUsage:
    """Bytes on disk: the whole directory and its parts (regular files, symlinks skipped)."""

    total_bytes: int
    saved_model_pb_bytes: int
    variables_bytes: int
    assets_bytes: int

    def to_dict(self) -> JsonDict:
        return {
            "total_bytes": self.total_bytes,
            "saved_model_pb_bytes": self.saved_model_pb_bytes,
            "variables_bytes": self.variables_bytes,
            "assets_bytes": self.assets_bytes,
        }


@dataclass(frozen=True)
class MetaGraphReport:
    """One MetaGraph: its tags, kind, signatures, init op, assets and op statistics.

    Nodes are counted in two places, kept apart: ``graph_def`` (the top-level graph, all
    of a TF1 model) and ``functions`` (the bodies of the function library, where a TF2
    model's computation lives). Op histograms are (op, count) pairs, most frequent first.
    """

    tags: tuple[str, ...]
    kind: str
    tensorflow_version: str
    signatures: tuple[SignatureReport, ...]
    init_op: Optional[loader.InitOp]
    assets: tuple[AssetReport, ...]
    graph_def_node_count: int
    function_count: int
    function_node_count: int
    graph_def_ops: tuple[tuple[str, int], ...]
    function_ops: tuple[tuple[str, int], ...]

    def to_dict(self) -> JsonDict:
        return {
            "tags": list(self.tags),
            "kind": self.kind,
            "tensorflow_version": self.tensorflow_version,
            "signatures": [s.to_dict() for s in self.signatures],
            "init_op": (
                {"name": self.init_op.name, "source": self.init_op.source}
                if self.init_op else None
            ),
            "assets": [a.to_dict() for a in self.assets],
            "node_count": {
                "graph_def": self.graph_def_node_count,
                "functions": self.function_node_count,
                "total": self.graph_def_node_count + self.function_node_count,
            },
            "function_count": self.function_count,
            "ops": {
                "graph_def": dict(self.graph_def_ops),
                "functions": dict(self.function_ops),
            },
        }


@dataclass(frozen=True)
class Risk:
    """Something that can break or endanger serving. ``tags`` names the MetaGraph concerned
    (None for the directory as a whole); ``subject`` the node, asset, variable or signature.
    """

    code: str
    severity: str
    message: str
    subject: str
    tags: Optional[tuple[str, ...]] = None

    def to_dict(self) -> JsonDict:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "subject": self.subject,
            "tags": list(self.tags) if self.tags is not None else None,
        }


@dataclass(frozen=True)
class InspectionReport:
    """Everything :func:`inspect_saved_model` found; immutable, JSON- and table-printable."""

    path: str
    saved_model_schema_version: int
    disk: DiskUsage
    variables: VariablesReport
    meta_graphs: tuple[MetaGraphReport, ...]
    risks: tuple[Risk, ...] = field(default=())

    def to_dict(self) -> JsonDict:
        """The report as plain dicts/lists, the structure of docs/inspect-json-schema.md."""
        return {
            "schema_version": SCHEMA_VERSION,
            "path": self.path,
            "saved_model_schema_version": self.saved_model_schema_version,
            "disk": self.disk.to_dict(),
            "variables": self.variables.to_dict(),
            "meta_graphs": [m.to_dict() for m in self.meta_graphs],
            "risks": [r.to_dict() for r in self.risks],
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        """The report as aligned, human-readable text."""
        return "\n".join(format_report(self))


# The human text of ``serving-opt inspect``.

_TOP_OPS = 12


def _aligned(headers: tuple[str, ...], rows: list[tuple[str, ...]], indent: str) -> list[str]:
    # The inspect table has no rule under its headers; its lines are indented per section.
    return table(headers, rows, indent=indent, rule=False).split("\n")


def _format_ops(title: str, ops: tuple[tuple[str, int], ...], indent: str) -> list[str]:
    if not ops:
        return [f"{indent}{title}: none"]
    # Escaped before wrapping: textwrap turns a newline or tab in an op name into a space.
    items = [f"{printable(op)} {count}" for op, count in ops[:_TOP_OPS]]
    more = len(ops) - _TOP_OPS
    if more > 0:
        items.append(f"... {more} more op types (see --json)")
    # Wrapped rather than one long line: terminals are ~100 columns.
    return textwrap.wrap(
        ", ".join(items), width=96, initial_indent=f"{indent}{title}: ",
        subsequent_indent=indent + "    ", break_on_hyphens=False, break_long_words=False,
    )


def _format_meta_graph(m: MetaGraphReport) -> list[str]:
    lines = [
        f"MetaGraph [{','.join(m.tags) or '<no tags>'}]  kind {m.kind}  "
        f"(exported by TensorFlow {m.tensorflow_version or 'unknown'})",
        f"  nodes: {m.graph_def_node_count} in graph_def, {m.function_node_count} in "
        f"{m.function_count} library functions",
        "  init op: " + (f"{m.init_op.name} (from {m.init_op.source})" if m.init_op else "none"),
    ]
    if m.signatures:
        rows = []
        for sig in m.signatures:
            first = True
            for direction, tensors in (("in", sig.inputs), ("out", sig.outputs)):
                for t in tensors:
                    rows.append((
                        sig.key if first else "", sig.method_name if first else "", direction,
                        t.alias, t.dtype or "-", t.shape_text,
                        t.name or f"{t.encoding}: {', '.join(t.components)}",
                    ))
                    first = False
            if first:  # a signature without inputs or outputs still gets its line
                rows.append((sig.key, sig.method_name, "", "", "", "", ""))
        lines.append("  signatures:")
        lines += _aligned(
            ("KEY", "METHOD", "DIR", "ALIAS", "DTYPE", "SHAPE", "TENSOR"), rows, "    "
        )
    else:
        lines.append("  signatures: none")
    if m.assets:
        rows = [
            (a.filename, human_bytes(a.size_bytes) if a.size_bytes is not None else
             ("outside assets/" if a.escapes else "symlink out" if a.exists else "MISSING"),
             a.tensor_name)
            for a in m.assets
        ]
        lines.append("  assets:")
        lines += _aligned(("FILENAME", "SIZE", "TENSOR"), rows, "    ")
    else:
        lines.append("  assets: none")
    lines += _format_ops("ops in graph_def", m.graph_def_ops, "  ")
    if m.function_count:
        lines += _format_ops("ops in functions", m.function_ops, "  ")
    return lines


def format_report(r: InspectionReport) -> list[str]:
    """The lines of ``InspectionReport.format_table()``."""
    d = r.disk
    v = r.variables
    lines = [
        f"SavedModel {r.path}",
        f"  size on disk: {human_bytes(d.total_bytes)} (saved_model.pb "
        f"{human_bytes(d.saved_model_pb_bytes)}, variables {human_bytes(d.variables_bytes)}, "
        f"assets {human_bytes(d.assets_bytes)})",
    ]
    if v.status == "ok":
        naming = "graph names" if v.naming == "graph" else "TF2 object paths"
        lines.append(
            f"  variables: {v.count} ({naming}), {human_bytes(v.total_bytes)} "
            f"({v.total_bytes / v.limit_bytes:.1%} of the {human_bytes(v.limit_bytes)} "
            "frozen-graph limit)"
        )
        if v.largest:
            rows = [
                (x.name, x.full_name or "", "[" + ", ".join(map(str, x.shape)) + "]", x.dtype,
                 human_bytes(x.size_bytes))
                for x in v.largest
            ]
            headers = ("LARGEST", "NAME", "SHAPE", "DTYPE", "SIZE")
            if v.naming == "graph":  # TF1 checkpoints carry no second name
                rows = [(row[0], *row[2:]) for row in rows]
                headers = ("LARGEST", "SHAPE", "DTYPE", "SIZE")
            lines += _aligned(headers, rows, "    ")
    else:
        lines.append(f"  variables: {v.status}")
    for m in r.meta_graphs:
        lines.append("")
        lines += _format_meta_graph(m)
    lines.append("")
    if not r.risks:
        lines.append("risks: none found")
    else:
        lines.append(f"risks: {len(r.risks)}")
        rows = [
            (x.severity.upper(), x.code, ",".join(x.tags) if x.tags else "-", x.message)
            for x in r.risks
        ]
        lines += _aligned(("SEVERITY", "CODE", "TAGS", "MESSAGE"), rows, "  ")
    # Any string of a line may be the model's (names, tags, ops, versions): each line is
    # escaped whole (table cells already are, and escaping twice changes nothing).
    return [printable(line) for line in lines]
