"""The inspection report: immutable dataclasses, each with its part of the JSON format.

``InspectionReport.to_dict()`` is the structure docs/inspect-json-schema.md documents
(``schema_version`` :data:`SCHEMA_VERSION`); ``format_table()`` the human text
(serving_opt.inspection.text).

Example:
    >>> report = inspect_saved_model("build/sample/1")
    >>> report.variables.to_dict()["status"]
    'ok'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from serving_opt.inspection.text import format_report
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
        """The report as plain dicts/lists, the structure of docs/inspect-json-schema.md.

        Example:
            >>> inspect_saved_model("build/sample/1").to_dict()["meta_graphs"][0]["kind"]
            'tf1'
        """
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
        """The report as JSON text.

        Example:
            >>> json.loads(inspect_saved_model("build/sample/1").to_json())["risks"]
            []
        """
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        """The report as aligned, human-readable text.

        Example:
            >>> print(inspect_saved_model("build/sample/1").format_table())  # doctest: +SKIP
            SavedModel build/sample/1
            ...
        """
        return "\n".join(format_report(self))
