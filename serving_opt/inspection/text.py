"""The inspection report as aligned, human-readable text (``serving-opt inspect``).

The directory's sizes and largest variables, then per MetaGraph its signatures (one
row per input and output), assets and most frequent ops, then the risks.

Example:
    >>> print("\\n".join(format_report(inspect_saved_model("build/sample/1"))))  # doctest: +SKIP
    SavedModel build/sample/1
    ...
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from serving_opt.report import human_bytes, table

if TYPE_CHECKING:
    from serving_opt.inspection.report import InspectionReport, MetaGraphReport

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


def format_report(r: InspectionReport) -> list[str]:
    """The lines of ``InspectionReport.format_table()``.

    Example:
        >>> format_report(inspect_saved_model("build/sample/1"))[0]
        'SavedModel build/sample/1'
    """
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
