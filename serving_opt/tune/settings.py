"""The settings being tuned: TF Serving's batching parameters and its session threads.

``BatchingSettings`` is one ``tensorflow.serving.BatchingParameters``
(session_bundle_config.proto; the file ``--batching_parameters_file`` reads), with
upstream's defaults where a field is unset; ``ThreadSettings`` is the pair of
``--tensorflow_intra_op_parallelism`` / ``--tensorflow_inter_op_parallelism``;
``ServingSettings`` is one complete server configuration (batching on or off, and its
threads), with the text file and the flag line a deployment uses.

Three configurations every report compares:

* ``tf_serving_default()``: no ``--enable_batching`` (TF Serving's default);
* ``upstream_batching()``: ``--enable_batching`` without a parameters file (upstream's
  defaults: max_batch_size 1000, batch_timeout_micros 0, max_enqueued_batches 10,
  one batch thread per core);
* the tuned settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

# BasicBatchScheduler's defaults, used by TF Serving when --enable_batching has no file.
UPSTREAM_MAX_BATCH_SIZE = 1000
UPSTREAM_BATCH_TIMEOUT_MICROS = 0
UPSTREAM_MAX_ENQUEUED_BATCHES = 10
PARAMETERS_FILENAME = "batching_parameters.txt"


def cores() -> int:
    """The CPUs this process may run on (upstream's ``port::MaxParallelism()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class BatchingSettings:
    """One BatchingParameters message; every field is written, so nothing is implicit.

    ``num_batch_threads`` 0 means "one per core", upstream's default, resolved by
    :meth:`resolved`.
    """

    max_batch_size: int = UPSTREAM_MAX_BATCH_SIZE
    batch_timeout_micros: int = UPSTREAM_BATCH_TIMEOUT_MICROS
    max_enqueued_batches: int = UPSTREAM_MAX_ENQUEUED_BATCHES
    num_batch_threads: int = 0
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False

    def resolved(self, cpus: int | None = None) -> BatchingSettings:
        """``num_batch_threads`` 0 replaced by the number of cores."""
        if self.num_batch_threads > 0:
            return self
        return replace(self, num_batch_threads=cpus or cores())

    def problems(self) -> list[str]:
        """What TF Serving would refuse at startup (its own checks), as sentences."""
        out = []
        for name in ("max_batch_size", "max_enqueued_batches"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be positive (is {getattr(self, name)})")
        if self.num_batch_threads < 0:
            out.append(f"num_batch_threads must be positive (is {self.num_batch_threads})")
        if self.batch_timeout_micros < 0:
            out.append(f"batch_timeout_micros must be >= 0 (is {self.batch_timeout_micros})")
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
                out.append("allowed_batch_sizes must be positive and increasing")
            if sizes[-1] != self.max_batch_size:
                out.append(f"the last allowed_batch_sizes entry ({sizes[-1]}) must equal "
                           f"max_batch_size ({self.max_batch_size})")
        return out

    def text_proto(self) -> str:
        """The text BatchingParameters TF Serving's ``--batching_parameters_file`` reads."""
        lines = [f"max_batch_size {{ value: {self.max_batch_size} }}",
                 f"batch_timeout_micros {{ value: {self.batch_timeout_micros} }}",
                 f"max_enqueued_batches {{ value: {self.max_enqueued_batches} }}",
                 f"num_batch_threads {{ value: {self.resolved().num_batch_threads} }}"]
        lines += [f"allowed_batch_sizes: {size}" for size in self.allowed_batch_sizes]
        if self.pad_variable_length_inputs:
            lines.append("pad_variable_length_inputs: true")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """One line: ``max 32, timeout 2000 us, 1 thread, queue 2, sizes 8/16/32``."""
        threads = self.num_batch_threads or cores()
        text = (f"max {self.max_batch_size}, timeout {self.batch_timeout_micros} us, "
                f"{threads} thread{'s' if threads != 1 else ''}, "
                f"queue {self.max_enqueued_batches}")
        if self.allowed_batch_sizes:
            text += ", sizes " + "/".join(map(str, self.allowed_batch_sizes))
        return text


@dataclass(frozen=True, order=True)
class ThreadSettings:
    """TF Serving's session threads; 0 leaves TensorFlow's default (one per core)."""

    intra_op: int = 0
    inter_op: int = 0

    def flags(self) -> tuple[str, ...]:
        """The tensorflow_model_server flags (none for TensorFlow's defaults)."""
        out = []
        if self.intra_op:
            out.append(f"--tensorflow_intra_op_parallelism={self.intra_op}")
        if self.inter_op:
            out.append(f"--tensorflow_inter_op_parallelism={self.inter_op}")
        return tuple(out)

    def describe(self) -> str:
        """``intra 1, inter default``."""
        def one(value: int) -> str:
            return str(value) if value else "default"

        return f"intra {one(self.intra_op)}, inter {one(self.inter_op)}"

    def session_config(self):
        """The ConfigProto TF Serving builds from these flags (Grappler stays on)."""
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=self.intra_op,
                                        inter_op_parallelism_threads=self.inter_op)


@dataclass(frozen=True)
class ServingSettings:
    """A server configuration: batching (None: off) and session threads."""

    batching: BatchingSettings | None = None
    threads: ThreadSettings = field(default_factory=ThreadSettings)

    def describe(self) -> str:
        what = self.batching.describe() if self.batching else "no batching"
        return f"{what}; threads {self.threads.describe()}"

    def flags(self, model_base_path: str, model_name: str,
              parameters_file: str | None = None) -> tuple[str, ...]:
        """The ``tensorflow_model_server`` flags serving a model with these settings."""
        out = ["--port=8500", "--rest_api_port=8501", f"--model_name={model_name}",
               f"--model_base_path={model_base_path}", *self.threads.flags()]
        if self.batching is not None:
            out.append("--enable_batching=true")
            if parameters_file:
                out.append(f"--batching_parameters_file={parameters_file}")
        return tuple(out)


def tf_serving_default(threads: ThreadSettings = ThreadSettings()) -> ServingSettings:
    """TF Serving as it starts without flags: no batching."""
    return ServingSettings(None, threads)


def upstream_batching(threads: ThreadSettings = ThreadSettings()) -> ServingSettings:
    """``--enable_batching`` without a parameters file: upstream's defaults."""
    return ServingSettings(BatchingSettings(), threads)
