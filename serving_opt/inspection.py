"""What is inside a SavedModel, and what in it could hurt a TF Serving deployment.

:func:`inspect_saved_model` reads a SavedModel directory without loading it into a
session (only the proto and the checkpoint index/data are read) and returns an
immutable :class:`InspectionReport`: per MetaGraph the signatures, init op, assets,
node counts and op histograms; for the directory the size on disk and the
variables; and a list of risks. ``to_json()`` is the stable machine format
(documented in docs/inspect-json-schema.md), ``format_table()`` the human one.

Example:
    >>> report = inspect_saved_model("build/sample/1")
    >>> [s.key for s in report.meta_graphs[0].signatures]
    ['classification', 'predict', 'serving_default']
    >>> print(report.format_table())  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import json
import math
import os
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from serving_opt import host_ops, untrusted
from serving_opt.errors import first_line
from serving_opt.graph import (
    PROTOBUF_LIMIT_BYTES,
    node_name,
    tensor_info_tensors,
)
from serving_opt.report import human_bytes, table
from serving_opt.savedmodel import loader

SCHEMA_VERSION = 1

# Key of the TF2 object graph stored inside object-based checkpoints; it is bookkeeping,
# not a variable.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

LARGEST_VARIABLES = 5

SEVERITY_ERROR = "error"
SEVERITY_WARNING = "warning"
_SEVERITY_ORDER = {SEVERITY_ERROR: 0, SEVERITY_WARNING: 1}

# The ops that touch files or the host, from TF's op registry (serving_opt.host_ops):
# the same list refuses a model in optimize/validate and rates its risks here.
CODE_EXECUTION_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                               if kind == host_ops.RUNS_CODE)
FILE_WRITE_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                           if kind == host_ops.WRITES_FILES)
FILE_READ_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                          if kind == host_ops.READS_FILES)

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
        return "\n".join(_format_report(self))


# --------------------------------------------------------------------------- public API


def inspect_saved_model(
    path: str, tags: Union[str, Iterable[str], None] = None
) -> InspectionReport:
    """Inspects the SavedModel in directory ``path``.

    ``tags`` ("serve", "serve,gpu" or an iterable) selects one MetaGraph; None or empty
    inspects all of them. Raises ServingOptError (one line: problem and fix) when the
    directory is missing, holds no or a corrupt saved_model.pb, or has no such tag set.

    Example:
        >>> report = inspect_saved_model("build/sample/1", tags="serve")
        >>> report.meta_graphs[0].init_op
        InitOp(name='group_deps', source='main_op')
    """
    path = os.fspath(path)
    saved_model = loader.read_saved_model(path)
    wanted = loader.parse_tags(tags) if tags is not None else frozenset()
    if wanted:
        meta_graphs = [loader.find_meta_graph(saved_model, wanted, path)]
    else:
        meta_graphs = list(saved_model.meta_graphs)

    links = loader.unsafe_links(path)
    risks = [_link_risk(link, path) for link in links]
    if any(_under(link.path, os.path.join(path, "variables")) for link in links):
        # Never read a checkpoint through a link out of the model.
        variables = VariablesReport("unreadable", None, 0, 0, (), PROTOBUF_LIMIT_BYTES)
    else:
        variables, variable_risks = _inspect_variables(path)
        risks += variable_risks
    reports = []
    for meta_graph in meta_graphs:
        report, graph_risks = _inspect_meta_graph(meta_graph, path, variables)
        reports.append(report)
        risks.extend(graph_risks)
        if variables.status == "absent" and _has_variables(meta_graph):
            risks.append(_variables_missing_risk(path, report.tags))
    # One risk per (code, subject, MetaGraph), however many ways it was found.
    unique: dict = {}
    for risk in risks:
        unique.setdefault((risk.code, risk.subject, risk.tags), risk)
    risks = list(unique.values())
    risks.sort(key=lambda r: (_SEVERITY_ORDER.get(r.severity, 9), r.code, r.subject))
    return InspectionReport(
        path=path,
        saved_model_schema_version=int(saved_model.saved_model_schema_version),
        disk=_disk_usage(path),
        variables=variables,
        meta_graphs=tuple(reports),
        risks=tuple(risks),
    )


# --------------------------------------------------------------------------- MetaGraphs


def _inspect_meta_graph(
    meta_graph, path: str, variables: VariablesReport
) -> tuple[MetaGraphReport, list[Risk]]:
    tags = tuple(sorted(meta_graph.meta_info_def.tags))
    graph_def = meta_graph.graph_def
    functions = graph_def.library.function
    signatures = tuple(
        _signature_report(key, sig)
        for key, sig in sorted(loader.serving_signatures(meta_graph).items())
    )
    assets = tuple(_asset_report(a, path) for a in loader.asset_files(meta_graph, path))
    graph_ops = collections.Counter(node.op for node in graph_def.node)
    function_ops = collections.Counter(node.op for f in functions for node in f.node_def)
    report = MetaGraphReport(
        tags=tags,
        kind="tf2" if loader.is_tf2(meta_graph) else "tf1",
        tensorflow_version=meta_graph.meta_info_def.tensorflow_version,
        signatures=signatures,
        init_op=loader.find_init_op(meta_graph),
        assets=assets,
        graph_def_node_count=len(graph_def.node),
        function_count=len(functions),
        function_node_count=sum(function_ops.values()),
        graph_def_ops=_histogram(graph_ops),
        function_ops=_histogram(function_ops),
    )
    risks = _signature_risks(meta_graph, signatures, tags)
    risks += _asset_risks(assets, tags)
    risks += _init_op_risks(report.init_op, graph_def, tags)
    risks += _frozen_size_risks(variables, graph_def.ByteSize(), tags)
    return report, risks


def _histogram(counter: collections.Counter) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counter.items(), key=lambda item: (-item[1], item[0])))


def _dtype_name(enum_value: int) -> Optional[str]:
    if not enum_value:  # DT_INVALID: composite TensorInfos carry no dtype of their own
        return None
    from tensorflow.core.framework import types_pb2

    try:
        import tensorflow as tf

        return tf.dtypes.as_dtype(enum_value).name
    except TypeError:  # an enum this TF does not know: show the proto name (or number)
        try:
            return types_pb2.DataType.Name(enum_value)
        except ValueError:
            return str(enum_value)


def _shape(info) -> Shape:
    if not info.HasField("tensor_shape") or info.tensor_shape.unknown_rank:
        return None
    return tuple(int(d.size) for d in info.tensor_shape.dim)


def _tensor_report(alias: str, info) -> TensorReport:
    encoding = info.WhichOneof("encoding") or "none"
    return TensorReport(
        alias=alias,
        dtype=_dtype_name(info.dtype),
        shape=_shape(info),
        encoding=encoding,
        name=info.name if encoding == "name" else None,
        components=tuple(n for n in tensor_info_tensors(info) if n),
    )


def _signature_report(key: str, sig) -> SignatureReport:
    return SignatureReport(
        key=key,
        method_name=sig.method_name,
        inputs=tuple(_tensor_report(a, sig.inputs[a]) for a in sorted(sig.inputs)),
        outputs=tuple(_tensor_report(a, sig.outputs[a]) for a in sorted(sig.outputs)),
    )


# ------------------------------------------------------------------------------- assets


def _escapes(filename: str) -> bool:
    normalized = os.path.normpath(filename)
    return (
        os.path.isabs(filename)
        or normalized == ".."
        or normalized.startswith(".." + os.sep)
    )


def _asset_report(asset: loader.AssetFile, model_dir: str) -> AssetReport:
    escapes = _escapes(asset.filename)
    # Never stat a path outside the model: the name comes from an untrusted proto.
    exists = not escapes and bool(asset.filename) and os.path.isfile(asset.path)
    # Nor a file a symlink leads to outside the model (reported as a `symlink` risk).
    inside = exists and _under(os.path.realpath(asset.path), os.path.realpath(model_dir))
    return AssetReport(
        filename=asset.filename,
        tensor_name=asset.tensor_name,
        size_bytes=os.path.getsize(asset.path) if inside else None,
        exists=exists,
        escapes=escapes,
    )


def _asset_risks(assets: Iterable[AssetReport], tags: tuple[str, ...]) -> list[Risk]:
    risks = []
    for asset in assets:
        if asset.escapes:
            risks.append(Risk(
                "asset_path_escapes", SEVERITY_ERROR,
                f"asset filename {asset.filename!r} points outside the assets directory; "
                "a loader following it reads a file that is not part of the model",
                asset.filename, tags,
            ))
        elif not asset.exists:
            risks.append(Risk(
                "asset_missing", SEVERITY_ERROR,
                f"asset {asset.filename!r} is declared but assets/{asset.filename} does not "
                "exist; TF Serving fails to load the model (copy the file back or re-export)",
                asset.filename, tags,
            ))
    return risks


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _link_risk(link: loader.UnsafeLink, model_dir: str) -> Risk:
    subject = os.path.relpath(link.path, model_dir)
    return Risk(
        "symlink", SEVERITY_ERROR,
        f"{subject} is a symlink that {link.reason} ({link.target}): serving-opt refuses "
        "the model, and a server or copy following it reads a file that is not part of "
        "the model (replace the link with a copy of the file)",
        subject,
    )


# -------------------------------------------------------------------------- reachability


# Every host op is an error: optimize, validate and compare refuse the model for any
# of them, and `inspect --fail_on=error` must fail a pipeline on the same models (a
# read is no milder than a write: it can put a server file into a response).
_OP_RISKS = {
    host_ops.RUNS_CODE: ("code_execution_op", SEVERITY_ERROR,
                         "runs Python code: TF Serving does not have the op, and it executes "
                         "arbitrary code"),
    host_ops.WRITES_FILES: ("file_write_op", SEVERITY_ERROR,
                            "writes files on the machine that runs the model"),
    host_ops.READS_FILES: ("file_read_op", SEVERITY_ERROR,
                           "reads files of the machine that runs the model (and the model "
                           "depends on files outside the SavedModel)"),
    host_ops.TOUCHES_HOST: ("host_op", SEVERITY_ERROR,
                            "touches the host (network, the process, native code, system "
                            "configuration): the model acts on the server itself"),
}


def _signature_risks(
    meta_graph, signatures: tuple[SignatureReport, ...], tags: tuple[str, ...]
) -> list[Risk]:
    graph_def = meta_graph.graph_def
    node_names = {node.name for node in graph_def.node}
    risks = []
    for sig in signatures:
        for direction, tensors in (("input", sig.inputs), ("output", sig.outputs)):
            for tensor in tensors:
                missing = [t for t in tensor.components if node_name(t) not in node_names]
                if missing or not tensor.components:
                    what = ", ".join(missing) or "no tensor"
                    risks.append(Risk(
                        "signature_tensor_missing", SEVERITY_ERROR,
                        f"signature {sig.key!r} {direction} {tensor.alias!r} refers to "
                        f"{what}, which is not in the graph; TF Serving cannot run this "
                        "signature (re-export the model)",
                        f"{sig.key}/{direction}/{tensor.alias}", tags,
                    ))
    # The same whole-graph check as the refusal of optimize/validate/compare: every node
    # of the graph and of every library function, the loader's own saver and asset
    # reads excepted only in the shape TF writes them (serving_opt.untrusted).
    present = [sig.key for sig in signatures if sig.key in meta_graph.signature_def]
    for use in untrusted.host_op_uses(meta_graph, present):
        code, severity, what = _OP_RISKS[use.kind]
        risks.append(Risk(
            code, severity, f"{use.describe()}: it {what}{_also_reached_by(use)}",
            use.label, tags,
        ))
    return risks


def _also_reached_by(use: untrusted.HostOpUse) -> str:
    keys = [k for k in use.signatures if k != untrusted.INIT_OP]
    if len(keys) < 2:
        return ""
    return f" (signatures reaching it: {', '.join(sorted(keys))})"


def _init_op_risks(
    init_op: Optional[loader.InitOp], graph_def, tags: tuple[str, ...]
) -> list[Risk]:
    if init_op is None or any(node.name == init_op.name for node in graph_def.node):
        return []
    return [Risk(
        "init_op_missing", SEVERITY_ERROR,
        f"the init op {init_op.name!r} (from {init_op.source}) is not in the graph; "
        "TF Serving fails to load the model (re-export it)",
        init_op.name, tags,
    )]


# ---------------------------------------------------------------------------- variables


def _variables_prefix(path: str) -> str:
    return os.path.join(path, "variables", "variables")


def _checkpoint_full_names(reader) -> dict[str, str]:
    """Checkpoint key -> the variable's own name, from a TF2 checkpoint's object graph."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    return {
        attr.checkpoint_key: attr.full_name
        for node in graph.nodes
        for attr in node.attributes
        if attr.full_name
    }


def _tensor_bytes(reader, key: str, shape: tuple[int, ...], dtype) -> int:
    if dtype.name == "string":
        # Strings have no fixed width: measure the stored values.
        import numpy as np

        return int(sum(len(v) for v in np.ravel(reader.get_tensor(key))))
    return math.prod(shape) * dtype.size


def _inspect_variables(path: str) -> tuple[VariablesReport, list[Risk]]:
    prefix = _variables_prefix(path)
    if not os.path.exists(prefix + ".index"):
        return VariablesReport("absent", None, 0, 0, (), PROTOBUF_LIMIT_BYTES), []
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        object_based = OBJECT_GRAPH_KEY in shapes
        full_names = _checkpoint_full_names(reader) if object_based else {}
        variables = [
            VariableReport(
                name=key,
                full_name=full_names.get(key),
                shape=tuple(int(d) for d in shapes[key]),
                dtype=dtypes[key].name,
                size_bytes=_tensor_bytes(reader, key, tuple(shapes[key]), dtypes[key]),
            )
            for key in sorted(shapes)
            if key != OBJECT_GRAPH_KEY
        ]
    except Exception as e:  # noqa: BLE001 - TF raises many types for a damaged checkpoint
        first = first_line(e)
        return VariablesReport("unreadable", None, 0, 0, (), PROTOBUF_LIMIT_BYTES), [Risk(
            "variables_unreadable", SEVERITY_ERROR,
            f"the variables checkpoint {prefix} cannot be read ({type(e).__name__}: {first}); "
            "TF Serving will fail to restore it (copy the variables/ directory again)",
            prefix,
        )]
    largest = sorted(variables, key=lambda v: (-v.size_bytes, v.name))[:LARGEST_VARIABLES]
    report = VariablesReport(
        status="ok",
        naming="object" if object_based else "graph",
        count=len(variables),
        total_bytes=sum(v.size_bytes for v in variables),
        largest=tuple(largest),
        limit_bytes=PROTOBUF_LIMIT_BYTES,
    )
    risks = [
        Risk(
            "variable_over_2gib", SEVERITY_WARNING,
            f"variable {v.full_name or v.name!r} holds {human_bytes(v.size_bytes)}, more than "
            f"the {human_bytes(PROTOBUF_LIMIT_BYTES)} protobuf limit: it cannot become a "
            "constant of a frozen GraphDef (keep it a variable)",
            v.name,
        )
        for v in variables
        if v.size_bytes >= PROTOBUF_LIMIT_BYTES
    ]
    return report, risks


VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp"})


def _has_variables(meta_graph) -> bool:
    graph_def = meta_graph.graph_def
    return any(node.op in VARIABLE_OPS for node in graph_def.node) or any(
        node.op in VARIABLE_OPS for f in graph_def.library.function for node in f.node_def)


def _variables_missing_risk(path: str, tags: tuple[str, ...]) -> Risk:
    return Risk(
        "variables_missing", SEVERITY_ERROR,
        f"the graph has variables but {_variables_prefix(path)}.index does not exist; "
        "TF Serving cannot restore them and fails to load or serve the model "
        "(copy the variables/ directory back or re-export)",
        "variables", tags,
    )


def _frozen_size_risks(
    variables: VariablesReport, graph_def_bytes: int, tags: tuple[str, ...]
) -> list[Risk]:
    total = variables.total_bytes + graph_def_bytes
    if total < PROTOBUF_LIMIT_BYTES:
        return []
    return [Risk(
        "frozen_graph_over_2gib", SEVERITY_WARNING,
        f"variables ({human_bytes(variables.total_bytes)}) plus the graph "
        f"({human_bytes(graph_def_bytes)}) exceed the {human_bytes(PROTOBUF_LIMIT_BYTES)} "
        "protobuf limit: a frozen GraphDef of this model cannot be serialized (do not freeze "
        "the variables into constants)",
        "variables", tags,
    )]


# --------------------------------------------------------------------------------- disk


def _disk_usage(path: str) -> DiskUsage:
    proto = os.path.join(path, "saved_model.pb")
    if not os.path.isfile(proto):
        proto = os.path.join(path, "saved_model.pbtxt")
    return DiskUsage(
        total_bytes=loader.dir_size(path),
        saved_model_pb_bytes=os.path.getsize(proto) if os.path.isfile(proto) else 0,
        variables_bytes=loader.dir_size(os.path.join(path, "variables")),
        assets_bytes=loader.dir_size(os.path.join(path, "assets")),
    )


# -------------------------------------------------------------------------------- table

_TOP_OPS = 12


def _aligned(headers: tuple[str, ...], rows: list[tuple[str, ...]], indent: str) -> list[str]:
    # The inspect table has no rule under its headers; its lines are indented per section.
    return table(headers, rows, indent=indent, rule=False).split("\n")


def _format_ops(title: str, ops: tuple[tuple[str, int], ...], indent: str) -> list[str]:
    if not ops:
        return [f"{indent}{title}: none"]
    items = [f"{op} {count}" for op, count in ops[:_TOP_OPS]]
    more = len(ops) - _TOP_OPS
    if more > 0:
        items.append(f"... {more} more op types (see --json)")
    # Wrapped rather than one long line: terminals are ~100 columns.
    return textwrap.wrap(
        ", ".join(items), width=96, initial_indent=f"{indent}{title}: ",
        subsequent_indent=indent + "    ", break_on_hyphens=False,
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


def _format_report(r: InspectionReport) -> list[str]:
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
    return lines


__all__ = [
    "AssetReport",
    "DiskUsage",
    "InspectionReport",
    "MetaGraphReport",
    "PROTOBUF_LIMIT_BYTES",
    "Risk",
    "SignatureReport",
    "TensorReport",
    "VariableReport",
    "VariablesReport",
    "inspect_saved_model",
]
