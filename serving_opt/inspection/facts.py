"""What a SavedModel directory holds, read without loading it into a session.

Only saved_model.pb and the checkpoint's index/data are read: per MetaGraph its
signatures, init op, assets and op histograms; for the directory its sizes on disk and
its variables. Nothing is judged here (serving_opt.inspection.risks does that); paths
that come from the untrusted proto are never followed out of the model.
"""

from __future__ import annotations

import collections
import math
import os
from dataclasses import dataclass
from typing import Optional

from serving_opt.errors import first_line
from serving_opt.inspection.report import (
    AssetReport,
    DiskUsage,
    MetaGraphReport,
    Shape,
    SignatureReport,
    TensorReport,
    VariableReport,
    VariablesReport,
)
from serving_opt.savedmodel import loader
from serving_opt.savedmodel.asset_paths import asset_path_problem
from serving_opt.savedmodel.graph import tensor_info_tensors

# Key of the TF2 object graph stored inside object-based checkpoints; it is bookkeeping,
# not a variable.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

LARGEST_VARIABLES = 5


@dataclass(frozen=True)
class CheckpointRead:
    """The variables checkpoint as read: the report, every tensor in it (the report keeps
    only the largest), and why it could not be read (``"<Type>: <first line>"``), if so."""

    report: VariablesReport
    variables: tuple[VariableReport, ...] = ()
    error: Optional[str] = None


# --------------------------------------------------------------------------- MetaGraphs


def meta_graph_report(meta_graph, path: str) -> MetaGraphReport:
    """One MetaGraph of the SavedModel in ``path``: tags, kind, signatures, init op,
    assets and node counts.
    """
    graph_def = meta_graph.graph_def
    functions = graph_def.library.function
    graph_ops = collections.Counter(node.op for node in graph_def.node)
    function_ops = collections.Counter(node.op for f in functions for node in f.node_def)
    return MetaGraphReport(
        tags=tuple(sorted(meta_graph.meta_info_def.tags)),
        kind="tf2" if loader.is_tf2(meta_graph) else "tf1",
        tensorflow_version=meta_graph.meta_info_def.tensorflow_version,
        signatures=tuple(
            _signature_report(key, sig)
            for key, sig in sorted(loader.serving_signatures(meta_graph).items())
        ),
        init_op=loader.find_init_op(meta_graph),
        assets=tuple(_asset_report(a, path) for a in _asset_files(meta_graph, path)),
        graph_def_node_count=len(graph_def.node),
        function_count=len(functions),
        function_node_count=sum(function_ops.values()),
        graph_def_ops=_histogram(graph_ops),
        function_ops=_histogram(function_ops),
    )


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


def under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or inside it (by name; no link is followed)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _asset_files(meta_graph, path: str) -> list[loader.AssetFile]:
    from google.protobuf.message import DecodeError

    try:
        return loader.asset_files(meta_graph, path)
    except DecodeError:
        return []  # an unreadable declaration: a risk of the static check (untrusted)


def _escapes(filename: str) -> bool:
    # As TensorFlow's C++ layer reads the name (a NUL ends it, ``..`` follows links).
    return bool(asset_path_problem(filename))


def _asset_report(asset: loader.AssetFile, model_dir: str) -> AssetReport:
    escapes = _escapes(asset.filename)
    # Never stat a path outside the model: the name comes from an untrusted proto.
    exists = not escapes and bool(asset.filename) and os.path.isfile(asset.path)
    # Nor a file a symlink leads to outside the model (reported as a `symlink` risk).
    inside = exists and under(os.path.realpath(asset.path), os.path.realpath(model_dir))
    return AssetReport(
        filename=asset.filename,
        tensor_name=asset.tensor_name,
        size_bytes=os.path.getsize(asset.path) if inside else None,
        exists=exists,
        escapes=escapes,
    )


# ---------------------------------------------------------------------------- variables


# VariablesReport.status of a V1-format checkpoint (read, but TF Serving skips it).
V1_CHECKPOINT = "v1 checkpoint"


def variables_prefix(path: str) -> str:
    """The checkpoint prefix of the SavedModel in ``path`` (``variables/variables``)."""
    return os.path.join(path, "variables", "variables")


def unread_variables(limit_bytes: int, status: str = "unreadable") -> VariablesReport:
    """The report of a checkpoint that is not read (``status``: unreadable or absent)."""
    return VariablesReport(status, None, 0, 0, (), limit_bytes)


def read_variables(path: str, limit_bytes: int) -> CheckpointRead:
    """The variables checkpoint of the SavedModel in ``path``; ``limit_bytes`` is the
    protobuf limit the report compares the total with.
    """
    prefix = variables_prefix(path)
    # A V1 checkpoint is one file at the prefix itself, with no index: TF's Python
    # loader restores it, TF Serving's C++ loader looks for the index and skips it.
    v1 = not os.path.exists(prefix + ".index") and os.path.isfile(prefix)
    if not os.path.exists(prefix + ".index") and not v1:
        return CheckpointRead(unread_variables(limit_bytes, "absent"))
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        object_based = OBJECT_GRAPH_KEY in shapes
        full_names = _checkpoint_full_names(reader) if object_based else {}
        variables = tuple(
            VariableReport(
                name=key,
                full_name=full_names.get(key),
                shape=tuple(int(d) for d in shapes[key]),
                dtype=dtypes[key].name,
                size_bytes=_tensor_bytes(reader, key, tuple(shapes[key]), dtypes[key]),
            )
            for key in sorted(shapes)
            if key != OBJECT_GRAPH_KEY
        )
    except Exception as e:  # noqa: BLE001 - TF raises many types for a damaged checkpoint
        return CheckpointRead(unread_variables(limit_bytes),
                              error=f"{type(e).__name__}: {first_line(e)}")
    largest = sorted(variables, key=lambda v: (-v.size_bytes, v.name))[:LARGEST_VARIABLES]
    report = VariablesReport(
        status=V1_CHECKPOINT if v1 else "ok",
        naming="object" if object_based else "graph",
        count=len(variables),
        total_bytes=sum(v.size_bytes for v in variables),
        largest=tuple(largest),
        limit_bytes=limit_bytes,
    )
    return CheckpointRead(report, variables)


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


# --------------------------------------------------------------------------------- disk


def disk_usage(path: str) -> DiskUsage:
    """Bytes on disk of the SavedModel in ``path`` and of its parts."""
    proto = os.path.join(path, "saved_model.pb")
    if not os.path.isfile(proto):
        proto = os.path.join(path, "saved_model.pbtxt")
    return DiskUsage(
        total_bytes=loader.dir_size(path),
        saved_model_pb_bytes=os.path.getsize(proto) if os.path.isfile(proto) else 0,
        variables_bytes=loader.dir_size(os.path.join(path, "variables")),
        assets_bytes=loader.dir_size(os.path.join(path, "assets")),
    )
