"""What is inside a SavedModel, and what in it could hurt a TF Serving deployment.

:func:`inspect_saved_model` reads a SavedModel directory without loading it into a
session (only the proto and the checkpoint index/data are read) and returns an
immutable :class:`InspectionReport`: per MetaGraph the signatures, init op, assets,
node counts and op histograms; for the directory the size on disk and the
variables; and a list of risks. ``to_json()`` is the stable machine format
(documented in docs/inspect-json-schema.md), ``format_table()`` the human one.

The parts: ``facts`` reads the directory, ``risks`` judges what was read, ``report``
holds the result and its JSON form, ``text`` its table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Union

from serving_opt.inspection import facts, risks
from serving_opt.inspection.facts import LARGEST_VARIABLES, OBJECT_GRAPH_KEY
from serving_opt.inspection.report import (
    SCHEMA_VERSION,
    AssetReport,
    DiskUsage,
    InspectionReport,
    JsonDict,
    MetaGraphReport,
    Risk,
    Shape,
    SignatureReport,
    TensorReport,
    VariableReport,
    VariablesReport,
)
from serving_opt.inspection.risks import (
    CODE_EXECUTION_OPS,
    FILE_READ_OPS,
    FILE_WRITE_OPS,
    SEVERITY_ERROR,
    SEVERITY_WARNING,
    VARIABLE_OPS,
)
from serving_opt.savedmodel import loader, model_files
from serving_opt.savedmodel.graph import PROTOBUF_LIMIT_BYTES


def inspect_saved_model(
    path: str, tags: Union[str, Iterable[str], None] = None
) -> InspectionReport:
    """Inspects the SavedModel in directory ``path``.

    ``tags`` ("serve", "serve,gpu" or an iterable) selects one MetaGraph ("" or empty:
    the one with no tags, as saved_model_cli's ``--tag_set ''``); None inspects all.
    Raises ServingOptError (one line: problem and fix) when the directory is missing,
    holds no or a corrupt saved_model.pb, or has no such tag set.
    """
    path = os.fspath(path)
    # Read here, not imported into the parts: the limit is this module's to change.
    limit = PROTOBUF_LIMIT_BYTES
    saved_model = loader.read_saved_model(path)
    if tags is not None:
        meta_graphs = [loader.find_meta_graph(saved_model, loader.parse_tags(tags), path)]
    else:
        meta_graphs = list(saved_model.meta_graphs)

    links = model_files.unsafe_links(path)
    found = [risks.link_risk(link, path) for link in links]
    if any(facts.under(link.path, os.path.join(path, "variables")) for link in links):
        # Never read a checkpoint through a link out of the model.
        variables = facts.unread_variables(limit)
    else:
        checkpoint = facts.read_variables(path, limit)
        variables = checkpoint.report
        found += risks.variable_risks(checkpoint, path, limit)
    reports = []
    for meta_graph in meta_graphs:
        report = facts.meta_graph_report(meta_graph, path)
        reports.append(report)
        found += risks.meta_graph_risks(meta_graph, report, variables, path, limit)
    return InspectionReport(
        path=path,
        saved_model_schema_version=int(saved_model.saved_model_schema_version),
        disk=facts.disk_usage(path),
        variables=variables,
        meta_graphs=tuple(reports),
        risks=risks.ordered(found),
    )


__all__ = [
    "AssetReport",
    "CODE_EXECUTION_OPS",
    "DiskUsage",
    "FILE_READ_OPS",
    "FILE_WRITE_OPS",
    "InspectionReport",
    "JsonDict",
    "LARGEST_VARIABLES",
    "MetaGraphReport",
    "OBJECT_GRAPH_KEY",
    "PROTOBUF_LIMIT_BYTES",
    "Risk",
    "SCHEMA_VERSION",
    "SEVERITY_ERROR",
    "SEVERITY_WARNING",
    "Shape",
    "SignatureReport",
    "TensorReport",
    "VARIABLE_OPS",
    "VariableReport",
    "VariablesReport",
    "inspect_saved_model",
]
