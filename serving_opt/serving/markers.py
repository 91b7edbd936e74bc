"""Marker files: the validation verdict as a file a pipeline can test for.

TFX's InfraValidator "blesses" a model by writing INFRA_BLESSED or
INFRA_NOT_BLESSED into its output directory; serving-opt writes VALIDATED or
NOT_VALIDATED beside the JSON report (``validate --report``, ``optimize
--validate --report``). Exactly one of the two exists after a run. Its text names the
server that answered and its TensorFlow version: a pass on the local stand-in says so.
"""

from __future__ import annotations

import os

from serving_opt.serving.results import ValidationReport

MARKER_OK = "VALIDATED"
MARKER_FAILED = "NOT_VALIDATED"


def write_marker(report: ValidationReport, directory: str) -> str:
    """Writes VALIDATED or NOT_VALIDATED (InfraValidator's blessing, our names) and
    removes the other one, so a pipeline never reads a stale verdict.
    """
    os.makedirs(directory, exist_ok=True)
    name = MARKER_OK if report.ok else MARKER_FAILED
    other = MARKER_FAILED if report.ok else MARKER_OK
    stale = os.path.join(directory, other)
    if os.path.exists(stale):
        os.remove(stale)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(marker_text(report))
    return path


def marker_text(report: ValidationReport) -> str:
    """What the marker says: the verdict, what answered and on which TensorFlow, over which
    protocols; a stand-in is named as one, so a pipeline can tell.
    """
    verdict = MARKER_OK if report.ok else MARKER_FAILED
    server = getattr(report, "server", "") or report.backend
    lines = [f"{verdict} {report.model_name} version {report.version}",
             f"server: {server}",
             f"sandbox: {getattr(report, 'sandbox', '') or 'unknown'}",
             f"tensorflow: {getattr(report, 'tensorflow_version', '') or 'unknown'}",
             "tf_serving: " + ("no (stand-in)" if report.backend == "local" else "yes"),
             f"protocols: {','.join(getattr(report, 'protocols', ('grpc',)))}"]
    note = getattr(report, "runtime_note", "")
    if note:
        lines.append(f"note: {note}")
    if not report.ok and report.failures:
        lines.append(f"failure: {report.failures[0]}")
    return "\n".join(lines) + "\n"
