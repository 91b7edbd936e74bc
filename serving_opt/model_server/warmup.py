"""SavedModel warmup: replay ``assets.extra/tf_serving_warmup_requests`` at load time.

The file is a TFRecord of ``PredictionLog`` protos (classify, regress, predict or
multi_inference logs). Like TF Serving's saved_model_warmup.cc, each record runs directly
on the freshly loaded servable (no model-name resolution), at most 1000 records are
allowed, and any failure - unreadable file, unparsable record, a request that errors -
fails the whole load.
"""

from __future__ import annotations

import os
import tempfile

from serving_opt.model_server.classifier import run_classify
from serving_opt.model_server.multi_inference import run_multi_inference
from serving_opt.model_server.predict import run_predict
from serving_opt.model_server.regressor import run_regress
from serving_opt.model_server.request_options import RequestOptions
from serving_opt.model_server.servable import Servable
from serving_opt.model_server.status import (
    ServingStatusError,
    from_tf_error,
    invalid_argument,
    unimplemented,
)

ASSETS_EXTRA = "assets.extra"
WARMUP_FILENAME = "tf_serving_warmup_requests"
MAX_RECORDS = 1000

_RUNNERS = {
    "classify_log": run_classify,
    "regress_log": run_regress,
    "predict_log": run_predict,
    "multi_inference_log": run_multi_inference,
}


def warmup_path(export_dir: str) -> str:
    """Where TF Serving looks for warmup data in a version directory."""
    return os.path.join(export_dir, ASSETS_EXTRA, WARMUP_FILENAME)


def _replay_one(servable: Servable, log, options: RequestOptions, iterations: int) -> None:
    kind = log.WhichOneof("log_type")
    if kind is None:
        return  # an empty log is skipped, as in C++
    runner = _RUNNERS.get(kind)
    if runner is None:
        number = log.DESCRIPTOR.fields_by_name[kind].number
        raise unimplemented(f"Unsupported log_type for warmup: {number}")
    request = getattr(log, kind).request
    for _ in range(iterations):
        runner(servable, request, options, None)


def replay_warmup(servable: Servable, options: RequestOptions, iterations: int = 1) -> int:
    """Replays the warmup file of ``servable`` if it has one; returns the records replayed.

    Raises ServingStatusError on the first failure (the load then fails).
    """
    import grpc

    from serving_opt.savedmodel import checked_load, model_files

    path = warmup_path(servable.path)
    with tempfile.TemporaryDirectory(prefix="serving-opt-warmup-") as private:
        # A private copy, read without following links: the version's file checks ran
        # before the load, and a FIFO or a link swapped in since is refused, not read.
        copy = os.path.join(private, WARMUP_FILENAME)
        try:
            checked_load.copy_beneath(servable.path, f"{ASSETS_EXTRA}/{WARMUP_FILENAME}",
                                      copy)
        except FileNotFoundError:
            return 0  # warmup data is optional
        except model_files.UnsafeModelFile as e:
            raise ServingStatusError(grpc.StatusCode.DATA_LOSS, e.reason) from None
        return _replay_file(servable, options, iterations, copy, path)


def _replay_file(servable, options: RequestOptions, iterations: int, copy: str,
                 path: str) -> int:
    import tensorflow as tf
    from tensorflow.python.lib.io import tf_record
    from tensorflow_serving.apis import prediction_log_pb2

    count = 0
    try:
        for record in tf_record.tf_record_iterator(copy):
            log = prediction_log_pb2.PredictionLog()
            try:
                log.ParseFromString(record)
            except Exception:  # noqa: BLE001 - any protobuf decode failure
                raise invalid_argument(
                    f"Failed to parse warmup record: {record[:64]!r} from {path}"
                ) from None
            _replay_one(servable, log, options, max(1, iterations))
            count += 1
            # C++ checks after running the record, so the 1001st record is the one refused.
            if count > MAX_RECORDS:
                raise invalid_argument(
                    f"Number of warmup records exceeds the maximum ({MAX_RECORDS}) at {path}"
                )
    except ServingStatusError:
        raise
    except tf.errors.DataLossError as e:
        status = from_tf_error(e)
        raise ServingStatusError(
            status.code,
            f"{status.message}. Please verify your warmup data is in TFRecord format.",
        ) from None
    except tf.errors.OpError as e:
        raise from_tf_error(e) from None
    return count
