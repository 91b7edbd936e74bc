"""What ``serving-opt compare`` can be told (:class:`CompareOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from serving_opt.core import gates

DEFAULT_BATCH_SIZE = 256


@dataclass(frozen=True)
class CompareOptions:
    """What ``serving-opt compare`` can be told. ``pipeline_args`` go to Beam as they are
    (``--project=... --region=...``); ``runner`` and ``direct_num_workers`` are shortcuts.
    """

    signatures: tuple[str, ...] = ()  # empty: every signature the examples fit
    saved_model_tags: str = "serve"
    runner: str = "DirectRunner"
    direct_num_workers: int = 1  # DirectRunner/Prism: >1 runs worker processes
    pipeline_args: tuple[str, ...] = ()
    batch_size: int = DEFAULT_BATCH_SIZE  # BatchElements' maximum
    atol: float = gates.DEFAULT_ATOL
    rtol: float = gates.DEFAULT_RTOL
    worst_k: int = 10
    allow_file_ops: bool = False
    # Run the models outside the bubblewrap sandbox where none can start (local runners;
    # a remote runner's workers run them elsewhere).
    allow_unsandboxed: bool = False
    sandbox_memory_bytes: int | None = None  # None: 3/4 of the RAM, per process
    sandbox_timeout_seconds: float | None = None  # None: sandbox.DEFAULT_TIMEOUT_SECONDS
