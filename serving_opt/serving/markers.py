"""Marker files: the validation verdict as a file a pipeline can test for.

TFX's InfraValidator "blesses" a model by writing INFRA_BLESSED or
INFRA_NOT_BLESSED into its output directory; serving-opt writes VALIDATED or
NOT_VALIDATED beside the JSON report (``validate --report``, ``optimize
--validate --report``). Exactly one of the two exists after a run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving_opt.serving.validate import ValidationReport

MARKER_OK = "VALIDATED"
MARKER_FAILED = "NOT_VALIDATED"


def write_marker(report: ValidationReport, directory: str) -> str:
    """Writes VALIDATED or NOT_VALIDATED (InfraValidator's blessing, our names) and
    removes the other one, so a pipeline never reads a stale verdict.

    Example:
        >>> write_marker(report, "build/validation")
        'build/validation/VALIDATED'
    """
    os.makedirs(directory, exist_ok=True)
    name = MARKER_OK if report.ok else MARKER_FAILED
    other = MARKER_FAILED if report.ok else MARKER_OK
    stale = os.path.join(directory, other)
    if os.path.exists(stale):
        os.remove(stale)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f"{report.model_name} version {report.version} via {report.backend}\n")
    return path
