"""What in a SavedModel could break or endanger a TF Serving deployment, as :class:`Risk`\\ s.

Errors: an op that touches the host (the same whole-graph check by which optimize,
validate and compare refuse a model: serving_opt.savedmodel.untrusted), a signature tensor or init
op missing from the graph, an escaping asset, a missing asset that an op reads, a
symlink out of the model, an unreadable or missing variables checkpoint. Warnings: a
missing asset that no op reads (the loaders only build its path), a variable, or
variables plus graph, over the 2 GiB protobuf limit (such a model cannot be frozen).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Optional

from serving_opt.core.rendering import human_bytes
from serving_opt.inspection.facts import V1_CHECKPOINT, CheckpointRead, variables_prefix
from serving_opt.inspection.report import (
    AssetReport,
    MetaGraphReport,
    Risk,
    SignatureReport,
    VariablesReport,
)
from serving_opt.savedmodel import host_ops, loader, model_files, unbound_variables, untrusted
from serving_opt.savedmodel.asset_paths import asset_path_problem, shown_filename
from serving_opt.savedmodel.graph import node_name

SEVERITY_ERROR = "error"
SEVERITY_WARNING = "warning"
_SEVERITY_ORDER = {SEVERITY_ERROR: 0, SEVERITY_WARNING: 1}

# The ops that touch files or the host, from TF's op registry (serving_opt.savedmodel.host_ops):
# the same list refuses a model in optimize/validate and rates its risks here.
CODE_EXECUTION_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                               if kind == host_ops.RUNS_CODE)
FILE_WRITE_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                           if kind == host_ops.WRITES_FILES)
FILE_READ_OPS = frozenset(op for op, kind in host_ops.HOST_OPS.items()
                          if kind == host_ops.READS_FILES)

VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp"})

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
    host_ops.RUNS_GRAPH: ("embedded_graph_op", SEVERITY_ERROR,
                          "runs a graph serialized in a tensor that the static check cannot "
                          "read, which may do anything a graph can"),
}


def ordered(risks: Iterable[Risk]) -> tuple[Risk, ...]:
    """One risk per (code, subject, MetaGraph), however many ways it was found; errors
    first, then by code and subject.
    """
    unique: dict = {}
    for risk in risks:
        unique.setdefault((risk.code, risk.subject, risk.tags), risk)
    return tuple(sorted(unique.values(),
                        key=lambda r: (_SEVERITY_ORDER.get(r.severity, 9), r.code, r.subject)))


def meta_graph_risks(
    meta_graph, report: MetaGraphReport, variables: VariablesReport, path: str,
    limit_bytes: int,
) -> list[Risk]:
    """The risks of one MetaGraph of the SavedModel in ``path`` (``report`` and
    ``variables`` are what facts read of it).
    """
    tags = report.tags
    graph_def = meta_graph.graph_def
    risks = _signature_risks(meta_graph, report.signatures, tags)
    risks += _asset_risks(report.assets, tags, meta_graph)
    risks += _init_op_risks(report.init_op, graph_def, tags)
    risks += _frozen_size_risks(variables, graph_def.ByteSize(), tags, limit_bytes)
    if variables.status == "absent" and _has_variables(meta_graph):
        risks.append(_variables_missing_risk(tags, variables_prefix(path)))
    if variables.status == V1_CHECKPOINT and _has_variables(meta_graph):
        risks.append(_variables_v1_risk(tags, variables_prefix(path)))
    unbound = unbound_variables.find(meta_graph, path)
    if unbound:
        risks.append(_unbound_risk(unbound, meta_graph, tags))
    return risks


def variable_risks(checkpoint: CheckpointRead, path: str, limit_bytes: int) -> list[Risk]:
    """An unreadable checkpoint, or every variable over the protobuf limit."""
    if checkpoint.error is not None:
        prefix = variables_prefix(path)
        return [Risk(
            "variables_unreadable", SEVERITY_ERROR,
            f"the variables checkpoint {prefix} cannot be read ({checkpoint.error}); "
            "TF Serving will fail to restore it (copy the variables/ directory again)",
            prefix,
        )]
    return [
        Risk(
            "variable_over_2gib", SEVERITY_WARNING,
            f"variable {v.full_name or v.name!r} holds {human_bytes(v.size_bytes)}, more than "
            f"the {human_bytes(limit_bytes)} protobuf limit: it cannot become a "
            "constant of a frozen GraphDef (keep it a variable)",
            v.name,
        )
        for v in checkpoint.variables
        if v.size_bytes >= limit_bytes
    ]


def link_risk(link: model_files.UnsafeLink, model_dir: str) -> Risk:
    """A symlink out of the model (or to nowhere)."""
    subject = os.path.relpath(link.path, model_dir)
    return Risk(
        "symlink", SEVERITY_ERROR,
        f"{subject} is a symlink that {link.reason} ({link.target}): serving-opt refuses "
        "the model, and a server or copy following it reads a file that is not part of "
        "the model (replace the link with a copy of the file)",
        subject,
    )


# ------------------------------------------------------------------------ the graph


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
    # reads excepted only in the shape TF writes them (serving_opt.savedmodel.untrusted).
    present = [sig.key for sig in signatures if sig.key in meta_graph.signature_def]
    for use in untrusted.host_op_uses(meta_graph, present):
        if use.op == untrusted.ESCAPING_ASSET and (
                "asset_file_def" in use.route or not meta_graph.asset_file_def):
            continue  # an asset facts reads: _asset_risks reports it (asset_path_escapes)
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


def _asset_risks(assets: Iterable[AssetReport], tags: tuple[str, ...], meta_graph) -> list[Risk]:
    assets = list(assets)
    reads: dict[str, list[str]] = {}
    if any(not a.escapes and not a.exists for a in assets):
        by_node = untrusted.asset_reads(meta_graph)
        for asset in assets:  # TF2 may declare one file twice: an error if either is read
            reads.setdefault(asset.filename, []).extend(
                by_node.get(node_name(asset.tensor_name), []))
    risks = []
    for asset in assets:
        if asset.escapes:
            risks.append(Risk(
                "asset_path_escapes", SEVERITY_ERROR,
                f"asset filename {shown_filename(asset.filename)} "
                f"{asset_path_problem(asset.filename) or 'leads outside assets/'}: a loader "
                "following it reads a file that is not part of the model",
                asset.filename, tags,
            ))
        elif not asset.exists and reads[asset.filename]:
            risks.append(Risk(
                "asset_missing", SEVERITY_ERROR,
                f"asset {asset.filename!r} is declared but assets/{asset.filename} does not "
                f"exist, and {reads[asset.filename][0]} reads it when the model loads; TF "
                "Serving fails to load the model (copy the file back or re-export)",
                asset.filename, tags,
            ))
        elif not asset.exists:
            # The loaders only build the path string (loader.cc, Python's
            # _get_asset_tensors): nothing opens a file no op reads.
            risks.append(Risk(
                "asset_missing", SEVERITY_WARNING,
                f"asset {asset.filename!r} is declared but assets/{asset.filename} does not "
                "exist; no op of the init op or a signature reads it, so the model loads "
                "and serves, but code that expects the file will not find it (copy the file "
                "back or re-export)",
                asset.filename, tags,
            ))
    return risks


# -------------------------------------------------------------------------- variables


def _has_variables(meta_graph) -> bool:
    graph_def = meta_graph.graph_def
    return any(node.op in VARIABLE_OPS for node in graph_def.node) or any(
        node.op in VARIABLE_OPS for f in graph_def.library.function for node in f.node_def)


# The errors optimize itself repairs (see optimizer.check_untrusted).
VARIABLES_V1 = "variables_v1_checkpoint"
UNBOUND_VARIABLES = "unbound_variables"


def _unbound_risk(unbound, meta_graph, tags: tuple[str, ...]) -> Risk:
    restored = unbound_variables.restored_handles(meta_graph)
    lost = [v for v in unbound if v.checkpoint_key is None]
    return Risk(
        UNBOUND_VARIABLES, SEVERITY_ERROR,
        f"{unbound_variables.problem(unbound)}; the restore and init ops initialize "
        f"{', '.join(restored[:3]) + (' ...' if len(restored) > 3 else '') or 'nothing'} "
        "instead; " + (f"the values of {unbound_variables.describe(lost)} are not in the "
                       "checkpoint: re-export the model" if lost else
                       "serving-opt optimize repairs it (freezes them from the checkpoint)"),
        "variables", tags,
    )


def _variables_missing_risk(tags: tuple[str, ...], prefix: str) -> Risk:
    return Risk(
        "variables_missing", SEVERITY_ERROR,
        f"the graph has variables but {prefix}.index does not exist; "
        "TF Serving cannot restore them and fails to load or serve the model "
        "(copy the variables/ directory back or re-export)",
        "variables", tags,
    )


def _variables_v1_risk(tags: tuple[str, ...], prefix: str) -> Risk:
    # loader.cc RunRestore: "The specified SavedModel has no variables; no checkpoints
    # were restored" when variables.index is absent; TF's Python loader restores V1.
    return Risk(
        VARIABLES_V1, SEVERITY_ERROR,
        f"{prefix} is a V1-format checkpoint (no variables.index): TF Serving's loader "
        "restores only V2 checkpoints, skips it, and serves the variables uninitialized "
        "(every request fails); serving-opt optimize rewrites it as constants or a V2 "
        "checkpoint",
        "variables", tags,
    )


def _frozen_size_risks(
    variables: VariablesReport, graph_def_bytes: int, tags: tuple[str, ...], limit_bytes: int
) -> list[Risk]:
    total = variables.total_bytes + graph_def_bytes
    if total < limit_bytes:
        return []
    return [Risk(
        "frozen_graph_over_2gib", SEVERITY_WARNING,
        f"variables ({human_bytes(variables.total_bytes)}) plus the graph "
        f"({human_bytes(graph_def_bytes)}) exceed the {human_bytes(limit_bytes)} "
        "protobuf limit: a frozen GraphDef of this model cannot be serialized (do not freeze "
        "the variables into constants)",
        "variables", tags,
    )]
