"""Replaying a SavedModel's warmup file as TF Serving does at load.

TF Serving reads ``assets.extra/tf_serving_warmup_requests`` (a TFRecord of
``PredictionLog``, at most 1000 records) and runs each request once before the version
is AVAILABLE; a record that fails fails the load. The cold-start measurement replays
it the same way, so the first request it times is the first a user would send.
"""

from __future__ import annotations

import os

WARMUP_FILENAME = "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # TF Serving refuses more (servables/tensorflow/saved_model_warmup_util)


def _examples(model_input) -> list[bytes]:
    """The serialized tf.Examples of a Classify/Regress ``Input`` (context merged in, as
    TF Serving does for ``example_list_with_context``)."""
    kind = model_input.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in model_input.example_list.examples]
    if kind == "example_list_with_context":
        listed = model_input.example_list_with_context
        out = []
        for example in listed.examples:
            merged = type(example)()
            merged.CopyFrom(listed.context)
            merged.MergeFrom(example)
            out.append(merged.SerializeToString())
        return out
    return []


def _runs(log, meta_graph) -> list[tuple[dict, list[str]]]:
    """The ``(feed, fetch)`` session runs one PredictionLog stands for (by tensor name)."""
    import numpy as np
    import tensorflow as tf

    def signature(name: str):
        # Checked first: indexing a protobuf map with a missing key adds an empty entry.
        name = name or "serving_default"
        if name not in meta_graph.signature_def:
            raise ValueError(f"warmup request for signature {name!r}, which the model "
                             f"does not have")
        return meta_graph.signature_def[name]

    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        request = log.predict_log.request
        sig = signature(request.model_spec.signature_name)
        feed = {sig.inputs[alias].name: tf.make_ndarray(proto)
                for alias, proto in request.inputs.items()}
        aliases = list(request.output_filter) or sorted(sig.outputs)
        return [(feed, [sig.outputs[alias].name for alias in aliases])]
    if kind in ("classify_log", "regress_log"):
        request = getattr(log, kind).request
        sig = signature(request.model_spec.signature_name)
        (alias,) = sig.inputs  # classify and regress signatures take one input
        feed = {sig.inputs[alias].name: np.array(_examples(request.input), dtype=object)}
        return [(feed, [sig.outputs[a].name for a in sorted(sig.outputs)])]
    if kind == "multi_inference_log":
        request = log.multi_inference_log.request
        runs = []
        for task in request.tasks:
            sig = signature(task.model_spec.signature_name)
            (alias,) = sig.inputs
            feed = {sig.inputs[alias].name: np.array(_examples(request.input), dtype=object)}
            runs.append((feed, [sig.outputs[a].name for a in sorted(sig.outputs)]))
        return runs
    if kind == "session_run_log":
        request = log.session_run_log.request
        feed = {named.name: tf.make_ndarray(named.tensor) for named in request.feed}
        return [(feed, list(request.fetch))]
    raise ValueError(f"warmup record of unsupported type {kind}")


def replay(sess, meta_graph, model_dir: str) -> int:
    """Runs the model's warmup requests in ``sess`` as TF Serving does at load; how many.

    TF Serving replays ``assets.extra/tf_serving_warmup_requests`` (each record once,
    at most ``MAX_RECORDS``) before the version is AVAILABLE, so the one-time work of a
    first run (Grappler, the kernels' first allocations) is load time, not the first
    user's. A record that fails raises, as it fails TF Serving's load. No file: 0.
    """
    import tensorflow as tf

    path = os.path.join(model_dir, "assets.extra", WARMUP_FILENAME)
    if not os.path.exists(path):
        return 0
    from tensorflow_serving.apis import prediction_log_pb2

    count = 0
    for record in tf.compat.v1.io.tf_record_iterator(path):
        if count >= MAX_RECORDS:
            break
        log = prediction_log_pb2.PredictionLog.FromString(record)
        for feed, fetch in _runs(log, meta_graph):
            sess.run(fetch, feed)
        count += 1
    return count
