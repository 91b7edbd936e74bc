"""``--prefer_tflite_model``: a version directory's ``model.tflite`` served like upstream's
TfLiteSession (servables/tensorflow/tflite_session.cc).

With the flag on and ``model.tflite`` present, upstream loads the TFLite model instead of
the SavedModel; its signature defs come from the model's signature runners (one
SignatureDef per TFLite signature, inputs and outputs keyed by the signature's names,
method ``tensorflow/serving/predict``), so Predict, GetModelMetadata and REST predict work
on it. Here each request runs one ``tf.lite.Interpreter`` signature runner, taken from a
pool of ``num_tflite_pools * num_tflite_interpreters_per_pool`` interpreters (each used by
one request at a time; upstream's defaults give one). TensorInfo names are
``<signature>/<input or output name>``: what Predict feeds and fetches.

Example:
    >>> servable = TfLiteServable.load(ServableId("m", 1), "/models/m/1", pool_size=2)
    >>> sorted(servable.signature_defs)
    ['serving_default']
"""

from __future__ import annotations

import os
import queue
from collections.abc import Mapping, Sequence

import numpy as np

from serving_opt.serving.model_server.servable import Fetched, ServableId
from serving_opt.serving.model_server.status import (
    ServingStatusError,
    from_tf_error,
    invalid_argument,
    not_found,
    unimplemented,
)

TFLITE_MODEL = "model.tflite"
PREDICT_METHOD = "tensorflow/serving/predict"


def tflite_model_exists(export_dir: str) -> bool:
    """Whether upstream's ``--prefer_tflite_model`` would load this version as TFLite."""
    return os.path.isfile(os.path.join(export_dir, TFLITE_MODEL))


def _interpreter(model_content: bytes):
    import warnings

    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        interpreter = tf.lite.Interpreter(model_content=model_content)
    return interpreter


def _tensor_info(name: str, details) -> object:
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    info = meta_graph_pb2.TensorInfo(name=name,
                                     dtype=tf.as_dtype(details["dtype"]).as_datatype_enum)
    for dim in details.get("shape_signature", details["shape"]):
        info.tensor_shape.dim.add(size=int(dim))
    return info


class TfLiteServable:
    """A loaded ``model.tflite``: the Servable interface the request code uses."""

    def __init__(self, servable_id: ServableId, path: str, signature_defs, pool, names):
        self.id = servable_id
        self.path = path
        self._signature_defs = signature_defs
        self._pool = pool
        # TensorInfo name -> (signature key, input/output name)
        self._names = names
        self.batching = None

    @property
    def signature_defs(self):
        return self._signature_defs

    @classmethod
    def load(cls, servable_id: ServableId, path: str, pool_size: int = 1) -> TfLiteServable:
        from tensorflow.core.protobuf import meta_graph_pb2

        model_path = os.path.join(path, TFLITE_MODEL)
        try:
            with open(model_path, "rb") as f:
                content = f.read()
            interpreters = [_interpreter(content) for _ in range(max(1, pool_size))]
        except OSError as e:
            raise not_found(f"{model_path}: {e.strerror or e}") from None
        except ValueError as e:  # not a FlatBuffer model
            raise invalid_argument(f"Could not load {model_path}: {e}") from None
        signatures = interpreters[0].get_signature_list()
        if not signatures:
            raise unimplemented(
                f"{model_path} has no signatures; the TFLite path serves signature runners "
                "(convert with signatures, e.g. TFLiteConverter.from_saved_model)")
        signature_defs: dict = {}
        names: dict[str, tuple[str, str]] = {}
        runner = None
        for key in signatures:
            runner = interpreters[0].get_signature_runner(key)
            signature = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
            for alias, details in runner.get_input_details().items():
                signature.inputs[alias].CopyFrom(_tensor_info(f"{key}/{alias}", details))
                names[f"{key}/{alias}"] = (key, alias)
            for alias, details in runner.get_output_details().items():
                signature.outputs[alias].CopyFrom(_tensor_info(f"{key}/{alias}", details))
                names[f"{key}/{alias}"] = (key, alias)
            signature_defs[key] = signature
        pool: queue.SimpleQueue = queue.SimpleQueue()
        for interpreter in interpreters:
            pool.put({key: interpreter.get_signature_runner(key) for key in signatures})
        return cls(servable_id, path, signature_defs, pool, names)

    def enable_batching(self, scheduler) -> None:
        # Upstream batches TFLite through its own scheduler; refused at start-up instead.
        raise unimplemented("--enable_batching is not implemented for TFLite models")

    def run(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
            timeout_ms: int | None = None) -> list[Fetched]:
        return self.run_direct(feeds, fetches, timeout_ms)

    def run_direct(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
                   timeout_ms: int | None = None) -> list[Fetched]:
        import tensorflow as tf

        keys = {self._names[n][0] for n in [*feeds, *fetches] if n in self._names}
        for name in [*feeds, *fetches]:
            if name not in self._names:
                raise not_found(f"Tensor {name} not found in the TFLite model")
        if len(keys) != 1:
            raise invalid_argument("a TFLite run feeds and fetches one signature's tensors")
        key = keys.pop()
        runners = self._pool.get()
        try:
            runner = runners[key]
            details = runner.get_input_details()
            inputs = {}
            for name, value in feeds.items():
                alias = self._names[name][1]
                wanted = details[alias]["dtype"]
                if np.asarray(value).dtype != wanted:
                    raise invalid_argument(
                        f"Input {alias} of signature {key} is "
                        f"{tf.as_dtype(wanted).name}, not {np.asarray(value).dtype}")
                inputs[alias] = value
            try:
                outputs = runner(**inputs)
            except (ValueError, RuntimeError) as e:
                raise invalid_argument(str(e)) from None
        except ServingStatusError:
            raise
        except Exception as e:  # noqa: BLE001 - a request error, not a server crash
            raise from_tf_error(e) from None
        finally:
            self._pool.put(runners)
        result = []
        for name in fetches:
            value = np.asarray(outputs[self._names[name][1]])
            result.append(Fetched(value, tf.as_dtype(value.dtype).as_datatype_enum))
        return result

    def close(self) -> None:
        """Drops the interpreters (nothing to release explicitly)."""
        self._pool = queue.SimpleQueue()
