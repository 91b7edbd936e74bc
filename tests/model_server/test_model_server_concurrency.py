"""Under load the server answers every request correctly: 64 client threads for 10 s."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import threading  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import running, write_model_config  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving_opt import samples  # noqa: E402

THREADS = 64
SECONDS = 10.0


def test_64_concurrent_clients_for_10_seconds_get_only_correct_answers(
    classifier_base, keras_base, tmp_path
):
    config = write_model_config(str(tmp_path / "models.config"),
                                {"clf": classifier_base, "keras": keras_base})
    classify = classification_pb2.ClassificationRequest(model_spec={"name": "clf"})
    for serialized in samples.sample_examples(4):
        classify.input.example_list.examples.add().ParseFromString(serialized)
    features = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    predict = predict_pb2.PredictRequest(model_spec={"name": "keras"})
    predict.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
    status = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "clf"})
    errors: list[str] = []
    counts = [0] * THREADS
    with running(model_config_file=config, port=0, max_num_load_retries=0) as server, \
            grpc.insecure_channel(server.address) as channel:
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        # Reference answers from one quiet request each; under load they must not change.
        want_classify = predictions.Classify(classify, timeout=30)
        want_predict = predictions.Predict(predict, timeout=30)
        deadline = time.monotonic() + SECONDS

        def client(index: int) -> None:
            calls = (
                (predictions.Classify, classify, want_classify),
                (predictions.Predict, predict, want_predict),
                (models.GetModelStatus, status, None),
            )
            n = 0
            while time.monotonic() < deadline and len(errors) < 10:
                call, request, want = calls[(index + n) % len(calls)]
                try:
                    got = call(request, timeout=30)
                except grpc.RpcError as e:
                    errors.append(f"{e.code()}: {e.details()}")
                    continue
                if want is not None and got != want:
                    errors.append(f"thread {index}: answer differs from the reference")
                n += 1
            counts[index] = n

        threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=SECONDS + 60)

    assert errors == []
    assert all(count > 0 for count in counts), "a client thread never got an answer"
