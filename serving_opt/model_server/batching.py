"""``--enable_batching``: TF Serving's session-level batching (batching_session.cc).

``--batching_parameters_file`` is the text ``tensorflow.serving.BatchingParameters`` of
session_bundle_config.proto; it is parsed and validated with the checks the real server
makes, and without it ``--enable_batching`` uses upstream's defaults (max_batch_size 1000,
batch_timeout_micros 0, max_enqueued_batches 10, one batch thread per core).

With batching on, every loaded version's session is wrapped like upstream's
``WrapSessionForBatching``: each SignatureDef's tensor set (input tensor names, output
tensor names) gets a queue on one server-wide scheduler (SharedBatchScheduler) run by
``num_batch_threads`` threads. A session run whose feeds and fetches are exactly one of
those sets is queued; a run that matches none (an ``output_filter`` subset, ...) bypasses
the batcher, as upstream does. Queued runs are merged along dimension 0 into one session
run of at most ``max_batch_size`` rows; a batch is run when full, when
``batch_timeout_micros`` has passed since its first run arrived, or at once when that is 0
and a thread is free. With ``allowed_batch_sizes`` the merged inputs are padded up to the
next allowed size with copies of the last run's first row, and the padding rows are
dropped from the outputs; outputs are split back by each run's row count. Upstream's
errors are kept: inputs without a batch dimension or with different 0th-dimension sizes
("Batching Run() input tensors must have ...", INVALID_ARGUMENT); a run larger than
max_batch_size ("Task size 9 is larger than maximum input batch size 8",
INVALID_ARGUMENT); a full queue (``max_enqueued_batches`` batches waiting, UNAVAILABLE);
runs of one batch whose non-batch dimensions differ without
``pad_variable_length_inputs`` (FAILED_PRECONDITION, for every run of the batch); any
error of the merged run goes to every run in it. The RunOptions timeout of a batch is the
latest deadline of its runs; a batch whose runs all timed out in the queue fails with
RESOURCE_EXHAUSTED. Not implemented: ``enable_large_batch_splitting`` does not split a
run across batches (the batch size limit is then ``max_execution_batch_size``, and each
run stays whole), and the low-priority queue options.

The proto is not shipped in the ``tensorflow-serving-api`` wheel, so its message type is
built here from the field list of session_bundle_config.proto.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from serving_opt.model_server.model_config import read_text_file
from serving_opt.model_server.status import (
    ServingStatusError,
    failed_precondition,
    internal,
    invalid_argument,
)

_INT64_WRAPPED = (
    ("max_batch_size", 1),
    ("batch_timeout_micros", 2),
    ("max_enqueued_batches", 3),
    ("num_batch_threads", 4),
    ("max_execution_batch_size", 9),
)
_MESSAGE = None


def _message_class():
    global _MESSAGE
    if _MESSAGE is not None:
        return _MESSAGE
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="serving_opt_batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = proto.message_type.add(name="BatchingParameters")
    f = descriptor_pb2.FieldDescriptorProto
    for name, number in _INT64_WRAPPED:
        message.field.add(name=name, number=number, type=f.TYPE_MESSAGE,
                          type_name=".google.protobuf.Int64Value", label=f.LABEL_OPTIONAL)
    message.field.add(name="thread_pool_name", number=5, type=f.TYPE_MESSAGE,
                      type_name=".google.protobuf.StringValue", label=f.LABEL_OPTIONAL)
    message.field.add(name="enable_large_batch_splitting", number=8, type=f.TYPE_MESSAGE,
                      type_name=".google.protobuf.BoolValue", label=f.LABEL_OPTIONAL)
    message.field.add(name="allowed_batch_sizes", number=6, type=f.TYPE_INT64,
                      label=f.LABEL_REPEATED)
    message.field.add(name="pad_variable_length_inputs", number=7, type=f.TYPE_BOOL,
                      label=f.LABEL_OPTIONAL)
    pool.Add(proto)
    _MESSAGE = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    )
    return _MESSAGE


def parse_batching_parameters(text: str, source: str = "<batching parameters>") -> dict:
    """Parses and validates a text BatchingParameters; returns the values that were set."""
    from google.protobuf import text_format

    params = _message_class()()
    try:
        text_format.Parse(text, params)
    except text_format.ParseError as e:
        raise invalid_argument(f"Can't parse {source} as text proto: {e}") from None
    values: dict = {}
    for name, _ in _INT64_WRAPPED:
        if params.HasField(name):
            values[name] = getattr(params, name).value
    for name in ("thread_pool_name", "enable_large_batch_splitting"):
        if params.HasField(name):
            values[name] = getattr(params, name).value
    if params.allowed_batch_sizes:
        values["allowed_batch_sizes"] = list(params.allowed_batch_sizes)
    if params.pad_variable_length_inputs:
        values["pad_variable_length_inputs"] = True
    _validate(values)
    return values


def _validate(values: dict) -> None:
    for name in ("max_batch_size", "num_batch_threads", "max_enqueued_batches"):
        if name in values and values[name] <= 0:
            raise invalid_argument(f"{name} must be positive; was {values[name]}")
    if values.get("batch_timeout_micros", 0) < 0:
        raise invalid_argument(
            f"batch_timeout_micros must be non-negative; was {values['batch_timeout_micros']}"
        )
    allowed = values.get("allowed_batch_sizes")
    if not allowed:
        return
    for previous, size in zip(allowed, allowed[1:]):
        if size <= previous:
            raise invalid_argument(
                "allowed_batch_sizes entries must be monotonically increasing"
            )
    max_batch_size = values.get("max_batch_size", 1000)  # BasicBatchScheduler's default
    if values.get("enable_large_batch_splitting"):
        if allowed[-1] > max_batch_size:
            raise invalid_argument(
                "Last entry in allowed_batch_sizes must be less than or equal to "
                f"max_batch_size; last entry was {allowed[-1]}; expected {max_batch_size}"
            )
        execution = values.get("max_execution_batch_size", max_batch_size)
        if allowed[-1] != execution:
            raise invalid_argument(
                "Last entry in allowed_batch_sizes must be equal to max_execution_batch_size; "
                f"last entry was {allowed[-1]}; expected {execution}"
            )
    elif allowed[-1] != max_batch_size:
        raise invalid_argument(
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{allowed[-1]}; expected {max_batch_size}"
        )


def read_batching_parameters(path: str) -> dict:
    """Reads ``--batching_parameters_file``; raises ServingStatusError like the server."""
    return parse_batching_parameters(read_text_file(path), path)


# ------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class BatchingOptions:
    """The scheduler and session options of one BatchingParameters (upstream defaults)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int | None = None

    @classmethod
    def from_values(cls, values: Mapping) -> BatchingOptions:
        """From :func:`parse_batching_parameters`'s dict (unset fields keep defaults)."""
        names = {
            "max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
            "num_batch_threads", "pad_variable_length_inputs",
            "enable_large_batch_splitting", "max_execution_batch_size",
        }
        kwargs = {k: v for k, v in values.items() if k in names}
        if values.get("allowed_batch_sizes"):
            kwargs["allowed_batch_sizes"] = tuple(values["allowed_batch_sizes"])
        return cls(**kwargs)

    @property
    def batch_size_limit(self) -> int:
        """Rows of one merged session run (max_execution_batch_size when splitting)."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size:
            return self.max_execution_batch_size
        return self.max_batch_size

    def padded_size(self, size: int) -> int:
        """Upstream's RoundToLowestAllowedBatchSize."""
        for allowed in self.allowed_batch_sizes:
            if allowed >= size:
                return allowed
        return size


class _Task:
    """One session run waiting in a queue (upstream BatchingSessionTask)."""

    __slots__ = ("feeds", "fetches", "size", "enqueue_time", "timeout_ms", "done",
                 "outputs", "error")

    def __init__(self, feeds, fetches, size, timeout_ms) -> None:
        self.feeds: Mapping[str, np.ndarray] = feeds
        self.fetches: Sequence[str] = fetches
        self.size: int = size
        self.enqueue_time = time.monotonic()
        self.timeout_ms = timeout_ms
        self.done = threading.Event()
        self.outputs = None
        self.error: ServingStatusError | None = None


class _Queue:
    """One tensor signature's batches: closed ones first, the open one last."""

    def __init__(self, process: Callable[[list[_Task]], None]) -> None:
        self.process = process
        self.batches: deque[list[_Task]] = deque([[]])
        self.sizes: deque[int] = deque([0])
        self.starts: deque[float] = deque([0.0])
        self.in_flight = 0
        self.closed = False


class BatchScheduler:
    """The server-wide scheduler (upstream SharedBatchScheduler): queues and threads.

    ``batches`` counts the batches processed, for tests and logs.
    """

    def __init__(self, options: BatchingOptions) -> None:
        self.options = options
        self.batches = 0
        self._cond = threading.Condition()
        self._queues: list[_Queue] = []
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"serving-opt-batch-{i}", daemon=True)
            for i in range(max(1, options.num_batch_threads))
        ]
        for thread in self._threads:
            thread.start()

    def add_queue(self, process: Callable[[list[_Task]], None]) -> _Queue:
        with self._cond:
            queue = _Queue(process)
            self._queues.append(queue)
            return queue

    def remove_queue(self, queue: _Queue) -> None:
        """Closes ``queue``: its open batch runs now; returns once it is empty."""
        with self._cond:
            queue.closed = True
            self._cond.notify_all()
            while (queue.in_flight or len(queue.batches) > 1 or queue.batches[0]) and not (
                self._stopping
            ):
                self._cond.wait()
            if queue in self._queues:
                self._queues.remove(queue)
            leftover = [task for batch in queue.batches for task in batch]
        for task in leftover:  # only when the scheduler stopped first
            task.error = ServingStatusError(grpc.StatusCode.UNAVAILABLE, "Batcher stopped")
            task.done.set()

    def schedule(self, queue: _Queue, task: _Task) -> None:
        """Adds ``task`` to the open batch of ``queue`` (upstream Queue::Schedule)."""
        options = self.options
        if task.size > options.max_batch_size:
            raise invalid_argument(
                f"Task size {task.size} is larger than maximum input batch size "
                f"{options.max_batch_size}"
            )
        with self._cond:
            if queue.closed or self._stopping:
                raise ServingStatusError(
                    grpc.StatusCode.UNAVAILABLE, "The batch scheduling queue is closed"
                )
            if queue.sizes[-1] and queue.sizes[-1] + task.size > options.batch_size_limit:
                if len(queue.batches) >= options.max_enqueued_batches:
                    raise ServingStatusError(
                        grpc.StatusCode.UNAVAILABLE,
                        "The batch scheduling queue to which this task was submitted is "
                        f"full; currently {len(queue.batches)} batches enqueued and "
                        f"max_enqueued_batches is {options.max_enqueued_batches}",
                    )
                queue.batches.append([])
                queue.sizes.append(0)
                queue.starts.append(0.0)
            if not queue.batches[-1]:
                queue.starts[-1] = time.monotonic()
            queue.batches[-1].append(task)
            queue.sizes[-1] += task.size
            self._cond.notify_all()

    def _next_batch(self) -> tuple[_Queue, list[_Task]] | None:
        # Under the lock: the schedulable batch that started first, or None and the
        # time until an open batch times out (stored in self._wait).
        now = time.monotonic()
        timeout = self.options.batch_timeout_micros / 1e6
        best = None
        self._wait = None
        for queue in self._queues:
            if len(queue.batches) >= 2:
                candidate = queue.starts[0]
            elif queue.batches[0]:
                deadline = queue.starts[0] + timeout
                if not (queue.closed or now >= deadline
                        or queue.sizes[0] >= self.options.batch_size_limit):
                    wait = deadline - now
                    self._wait = wait if self._wait is None else min(self._wait, wait)
                    continue
                candidate = queue.starts[0]
            else:
                continue
            if best is None or candidate < best[0]:
                best = (candidate, queue)
        if best is None:
            return None
        queue = best[1]
        batch = queue.batches.popleft()
        queue.sizes.popleft()
        queue.starts.popleft()
        if not queue.batches:
            queue.batches.append([])
            queue.sizes.append(0)
            queue.starts.append(0.0)
        queue.in_flight += 1
        self.batches += 1
        return queue, batch

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    picked = self._next_batch()
                    if picked is not None:
                        break
                    self._cond.wait(self._wait)
            queue, batch = picked
            try:
                queue.process(batch)
            except BaseException as e:  # noqa: BLE001 - every run must be answered
                for task in batch:
                    if not task.done.is_set():
                        task.error = internal(f"Batch processing failed: {e}")
                        task.done.set()
            finally:
                with self._cond:
                    queue.in_flight -= 1
                    self._cond.notify_all()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stops the threads; runs still queued fail with UNAVAILABLE."""
        with self._cond:
            self._stopping = True
            leftover = [t for q in self._queues for b in q.batches for t in b]
            for queue in self._queues:
                queue.batches = deque([[]])
                queue.sizes = deque([0])
                queue.starts = deque([0.0])
            self._cond.notify_all()
        for task in leftover:
            task.error = ServingStatusError(grpc.StatusCode.UNAVAILABLE, "Batcher stopped")
            task.done.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


def _input_size(feeds: Mapping[str, np.ndarray]) -> int:
    # Upstream ComputeTensorBatchSize, with its texts.
    if not feeds:
        raise invalid_argument("Batching Run() must have at least one input tensor")
    size = None
    for value in feeds.values():
        if np.ndim(value) == 0:
            raise invalid_argument(
                "Batching Run() input tensors must have at least one dimension"
            )
        if size is None:
            size = value.shape[0]
        elif value.shape[0] != size:
            raise invalid_argument(
                "Batching Run() input tensors must have equal 0th-dimension size"
            )
    return int(size)


def _pad_to(value: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    # Upstream AddPadding: grow every non-batch dimension, filled with the first element.
    if tuple(value.shape[1:]) == tuple(dims[1:]):
        return value
    if value.size == 0:
        raise invalid_argument("Cannot pad empty tensor")
    padded = np.full((value.shape[0], *dims[1:]), value.flat[0], dtype=value.dtype)
    padded[tuple(slice(0, n) for n in value.shape)] = value
    return padded


class BatchingSession:
    """Batches one servable's session runs per SignatureDef tensor set.

    ``run_direct(feeds, fetches, timeout_ms)`` is the wrapped session's run. ``runs``
    counts the merged session runs made (not the bypassed ones), ``tasks`` the runs that
    went through a queue.
    """

    def __init__(self, scheduler: BatchScheduler, signature_defs, run_direct) -> None:
        self.scheduler = scheduler
        self.options = scheduler.options
        self._run_direct = run_direct
        self.runs = 0
        self.tasks = 0
        self._count_lock = threading.Lock()
        self._queues: dict[tuple[frozenset, frozenset], _Queue] = {}
        for signature in signature_defs.values():
            key = (
                frozenset(info.name for info in signature.inputs.values()),
                frozenset(info.name for info in signature.outputs.values()),
            )
            if key not in self._queues:
                outputs = sorted(key[1])  # std::set order, like upstream
                self._queues[key] = scheduler.add_queue(
                    lambda batch, inputs=key[0], outputs=outputs: self._process(
                        inputs, outputs, batch
                    )
                )

    def run(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
            timeout_ms: int | None = None):
        queue = self._queues.get((frozenset(feeds), frozenset(fetches)))
        if queue is None:  # no declared signature: upstream bypasses the batcher
            return self._run_direct(feeds, fetches, timeout_ms)
        task = _Task(feeds, list(fetches), _input_size(feeds), timeout_ms)
        self.scheduler.schedule(queue, task)
        with self._count_lock:
            self.tasks += 1
        task.done.wait()
        if task.error is not None:
            # A fresh exception per waiting thread (they share the batch's status).
            raise ServingStatusError(task.error.code, task.error.message)
        return task.outputs

    def close(self) -> None:
        """Runs what is queued, then removes the queues (before the session closes)."""
        for queue in self._queues.values():
            self.scheduler.remove_queue(queue)
        self._queues = {}

    # -------------------------------------------------------------- batch processing

    def _process(self, inputs: frozenset, outputs: list[str], batch: list[_Task]) -> None:
        try:
            self._process_or_raise(inputs, outputs, batch)
        except ServingStatusError as e:
            for task in batch:
                task.error = e
        for task in batch:
            task.done.set()

    def _process_or_raise(self, inputs, outputs, batch: list[_Task]) -> None:
        now = time.monotonic()
        deadline = 0.0
        for task in batch:
            if task.timeout_ms is None or task.timeout_ms <= 0:
                deadline = float("inf")
            else:
                deadline = max(deadline, task.enqueue_time + task.timeout_ms / 1000)
        if deadline <= now:
            raise ServingStatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "Run() timeout exceeded while waiting in batching queue",
            )
        timeout_ms = None if deadline == float("inf") else max(1, int((deadline - now) * 1000))
        merged, padding = self._merge(inputs, batch)
        with self._count_lock:
            self.runs += 1
        fetched = self._run_direct(merged, outputs, timeout_ms)
        self._split(outputs, fetched, batch, padding)

    def _merge(self, inputs, batch: list[_Task]) -> tuple[dict, int]:
        total = sum(task.size for task in batch)
        padding = self.options.padded_size(total) - total
        merged = {}
        for name in sorted(inputs):
            values = [task.feeds[name] for task in batch]
            if self.options.pad_variable_length_inputs:
                ndim = max(v.ndim for v in values)
                dims = [max(v.shape[d] if d < v.ndim else 0 for v in values)
                        for d in range(ndim)]
                values = [_pad_to(v, dims) for v in values]
            else:
                reference = values[0].shape[1:]
                if any(v.shape[1:] != reference for v in values[1:]):
                    raise failed_precondition(
                        f"Tensors with name '{name}' from different tasks have different "
                        "shapes and padding is turned off.Set pad_variable_length_inputs "
                        "to true, or ensure that all tensors with the same namehave equal "
                        "dimensions starting with the first dim."
                    )
            if any(v.dtype != values[0].dtype for v in values[1:]):
                raise internal(
                    "Tensor concat operation failed: tensors to merge have different dtypes "
                    f"({', '.join(sorted({str(v.dtype) for v in values}))})"
                )
            if padding:
                # Upstream pads with the first row of the last task's tensor.
                values.append(np.repeat(values[-1][:1], padding, axis=0))
            merged[name] = values[0] if len(values) == 1 else np.concatenate(values)
        return merged, padding

    @staticmethod
    def _split(outputs: list[str], fetched, batch: list[_Task], padding: int) -> None:
        total = sum(task.size for task in batch)
        if len(fetched) != len(outputs):
            raise internal("Wrong number of batched output tensors")
        bounds = np.cumsum([task.size for task in batch])[:-1]
        split = {}
        for name, result in zip(outputs, fetched):
            value = result.value
            if value.ndim == 0:
                raise failed_precondition("Batched output tensor has 0 dimensions")
            if value.shape[0] != total + padding:
                raise failed_precondition(
                    "Batched output tensor's 0th dimension does not equal the sum of the 0th "
                    "dimension sizes of the input tensors"
                )
            parts = np.split(value[:total], bounds)
            split[name] = [type(result)(part, result.dtype) for part in parts]
        for index, task in enumerate(batch):
            task.outputs = [split[name][index] for name in task.fetches]
