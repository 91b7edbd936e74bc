"""A stand-in for the optimizer's Run, for tests of the lossy gate's sequential draw.

The draw (``proving``) reads a Run's resolved plan only for the measuring budget, the
agreement threshold and the user's inputs, and reports through ``warn`` and ``progress``;
a test builds just those, and reads back what the draw said.

Example:
    >>> run = gate_run(measure_seconds=180)
    >>> run.warn("x"); run.warnings
    ['x']
"""

from __future__ import annotations

import types


def gate_run(measure_seconds: float = 600.0, user_inputs=None) -> types.SimpleNamespace:
    """The fields of a Run that the sequential draw reads, and lists of what it said."""
    plan = types.SimpleNamespace(
        measure=types.SimpleNamespace(measure_seconds=measure_seconds),
        gate=types.SimpleNamespace(min_top1_agreement=0.995), user_inputs=user_inputs)
    run = types.SimpleNamespace(plan=plan, warnings=[], said=[])
    run.warn = run.warnings.append
    run.progress = lambda step, message: run.said.append(message)
    return run
