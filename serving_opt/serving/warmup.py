"""Warmup files: the requests TF Serving replays at load so first requests are fast.

TF Serving reads ``assets.extra/tf_serving_warmup_requests``, a TFRecord of
``PredictionLog`` (at most 1000 records), and replays each before marking the
version AVAILABLE; any failing record fails the load. The validation requests are
the natural warmup set: one per signature and request kind, already proven to
answer correctly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# Defined with their replay (the cold-start measurement, a stage, replays them too).
from serving_opt.savedmodel.warmup_replay import MAX_RECORDS, WARMUP_FILENAME, replay

__all__ = ["MAX_RECORDS", "WARMUP_FILENAME", "prediction_log", "records", "replay",
           "write_warmup_file", "write_warmup_records"]


def prediction_log(method: str, request):
    """Wraps a request in the PredictionLog field TF Serving expects for its method."""
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    field = {"Predict": log.predict_log, "Classify": log.classify_log,
             "Regress": log.regress_log, "MultiInference": log.multi_inference_log}.get(method)
    if field is None:
        raise ValueError(f"no PredictionLog type for {method}")
    field.request.CopyFrom(request)
    return log


def records(probes: Sequence, repeat: int = 1) -> tuple[bytes, ...]:
    """The probes' requests as serialized PredictionLogs (at most MAX_RECORDS)."""
    logs = [prediction_log(p.method, p.request) for p in probes for _ in range(repeat)]
    return tuple(log.SerializeToString() for log in logs[:MAX_RECORDS])


def write_warmup_records(model_dir: str, serialized: Sequence[bytes]) -> str:
    """Writes serialized PredictionLogs as the model's warmup file (atomically)."""
    import tensorflow as tf

    directory = os.path.join(model_dir, "assets.extra")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, WARMUP_FILENAME)
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in list(serialized)[:MAX_RECORDS]:
            writer.write(bytes(record))
    os.replace(tmp, path)
    return path


def write_warmup_file(model_dir: str, probes: Sequence, repeat: int = 1) -> str:
    """Writes the probes' requests as the model's warmup file (atomically)."""
    import tensorflow as tf

    logs = [prediction_log(p.method, p.request) for p in probes for _ in range(repeat)]
    logs = logs[:MAX_RECORDS]
    directory = os.path.join(model_dir, "assets.extra")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, WARMUP_FILENAME)
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    os.replace(tmp, path)
    return path

