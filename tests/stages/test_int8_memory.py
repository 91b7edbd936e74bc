"""Serving memory of quantized models (issue 32): measured without /proc, stage by stage,
and the quantized copies of dense weights are not kept once the init op has used them.

Real TensorFlow and real SavedModels, small ones (the 1 GB model is only in
benchmarks/int8_memory.py). No timing is asserted: memory figures only, with margins far
above allocator noise. The native loader (``savedmodel.native_load``: TensorFlow's C++
runtime in a fresh process, as tensorflow_model_server holds memory) is checked to run
the model for real: its answers are TF's Python loader's.
"""

from __future__ import annotations

import builtins
import os
import pickle
import shutil

import numpy as np
import pytest
from conftest import TEXT_CLASSIFIER_VOCAB

from serving_opt import samples
from serving_opt.core import measuring
from serving_opt.options import BuildOptions, GateOptions, MeasureOptions
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.pipeline.report import format_cold_start
from serving_opt.savedmodel import loader, native_load
from serving_opt.stages import coldstart

pytestmark = pytest.mark.in_process  # our own models, stages in this process

MIB = 1 << 20


@pytest.fixture
def no_proc_self(monkeypatch):
    """/proc/self/* cannot be opened, as inside the sandbox whose /proc is synthetic."""
    real_open = builtins.open

    def refusing_open(path, *args, **kwargs):
        if str(path).startswith(("/proc/self", f"/proc/{os.getpid()}")):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)


def test_held_memory_follows_an_allocation_without_proc(no_proc_self):
    before = measuring.held_rss_bytes()
    block = np.ones(160 * MIB, np.uint8)  # touched: resident
    held = measuring.held_rss_bytes()
    peak = measuring.peak_rss_bytes()
    del block  # a large numpy block is its own mapping: freed at once
    after = measuring.held_rss_bytes()
    assert held - before >= 150 * MIB
    assert peak >= held
    assert held - after >= 150 * MIB
    # The peak remembers what is no longer held.
    assert measuring.peak_rss_bytes() - after >= 150 * MIB


def test_rss_bytes_is_zero_without_proc(no_proc_self):
    assert measuring.rss_bytes("VmHWM") == 0


@pytest.fixture(scope="module")
def quantized_convnet(convnet_dir, tmp_path_factory):
    """The conv net with its dense weights int8, dequantized at load by the init op."""
    out = str(tmp_path_factory.mktemp("q_convnet"))
    report = optimize(convnet_dir, out, OptimizeOptions(
        build=BuildOptions(quantize="int8", quantize_min_elements=256, max_constant_bytes=1024),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        gate=GateOptions(max_probability_error=0.1)))
    assert report.quantized and report.parity.ok
    return report


def test_the_int8_copies_are_emptied_once_dequantized_at_load(quantized_convnet):
    import tensorflow as tf

    report = quantized_convnet
    prefix = os.path.join(report.output_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    sess = tf.compat.v1.Session(graph=tf.Graph())
    try:
        with sess.graph.as_default():
            tf.compat.v1.saved_model.loader.load(sess, ["serve"], report.output_dir)

            def read(name: str, dtype):
                return sess.run(tf.raw_ops.ReadVariableOp(
                    resource=sess.graph.get_tensor_by_name(f"{name}:0"), dtype=dtype))

            for q in report.quantized:
                qname = f"{q.name}/serving_opt_quantized_int8"
                sname = f"{q.name}/serving_opt_quantized_scale"
                stored = reader.get_tensor(qname)
                assert stored.size > 0
                # The float weight is what the checkpoint's int8 copy says ...
                np.testing.assert_array_equal(
                    read(q.name, tf.float32),
                    stored.astype(np.float32) * reader.get_tensor(sname))
                # ... and the copy itself no longer holds memory in the serving process.
                assert read(qname, tf.int8).size == 0
                assert read(sname, tf.float32).size == 0
    finally:
        sess.close()


@pytest.fixture(scope="module")
def text_model_with_warmup(text_classifier_base, tmp_path_factory) -> str:
    """The small text classifier with a warmup file of one Classify and one Predict."""
    import tensorflow as tf
    from tensorflow_serving.apis import classification_pb2, predict_pb2

    from serving_opt.serving import warmup

    model = os.path.join(str(tmp_path_factory.mktemp("warm")), "1")
    shutil.copytree(os.path.join(text_classifier_base, "1"), model)
    examples = samples.text_examples(4, vocab_size=TEXT_CLASSIFIER_VOCAB)
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classification"
    for serialized in examples:
        classify.input.example_list.examples.add().ParseFromString(serialized)
    predict = predict_pb2.PredictRequest()
    predict.model_spec.signature_name = "predict"
    predict.inputs["examples"].CopyFrom(tf.make_tensor_proto(examples, dtype=tf.string))
    warmup.write_warmup_records(model, [
        warmup.prediction_log("Classify", classify).SerializeToString(),
        warmup.prediction_log("Predict", predict).SerializeToString()])
    return model


def test_cold_start_job_reports_each_stage_and_replays_the_warmup(text_model_with_warmup,
                                                                  tmp_path, no_proc_self):
    feeds = str(tmp_path / "feeds.pkl")
    with open(feeds, "wb") as f:
        pickle.dump({"inputs": np.array(samples.text_examples(
            2, seed=1, vocab_size=TEXT_CLASSIFIER_VOCAB), dtype=object)}, f)
    result = coldstart.cold_start_job({"model": text_model_with_warmup, "tags": ["serve"],
                                       "signature": "serving_default", "feeds": feeds})
    assert result["warmup_records"] == 2
    names = [name for name, _, _ in result["stages"]]
    assert names == ["runtime", "graph", "restore", "init op", "warmup", "first request"]
    peaks = [peak for _, peak, _ in result["stages"]]
    assert peaks == sorted(peaks)  # a peak so far never goes down
    assert all(held > 0 for _, _, held in result["stages"])
    assert result["peak_rss_bytes"] >= result["steady_rss_bytes"] > 0
    summary = coldstart.summarize_runs([result, result])
    assert summary.steady_rss_bytes == result["steady_rss_bytes"]
    assert [s[0] for s in summary.stages] == names


def test_a_failing_warmup_record_fails_the_load(text_model_with_warmup, tmp_path):
    """TF Serving refuses a version whose warmup fails; so does the measurement."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from serving_opt.serving import warmup

    model = str(tmp_path / "1")
    shutil.copytree(text_model_with_warmup, model)
    bad = predict_pb2.PredictRequest()
    bad.model_spec.signature_name = "no_such_signature"
    bad.inputs["examples"].CopyFrom(tf.make_tensor_proto([b""], dtype=tf.string))
    warmup.write_warmup_records(model, [warmup.prediction_log("Predict", bad)
                                        .SerializeToString()])
    sess, meta_graph = _load(model)
    try:
        with pytest.raises(ValueError, match="no_such_signature"):
            warmup.replay(sess, meta_graph, model)
    finally:
        sess.close()


def _load(model: str):
    import tensorflow as tf

    sess = tf.compat.v1.Session(graph=tf.Graph())
    with sess.graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], model)
    return sess, meta_graph


def test_the_report_shows_peak_and_steady_rss_apart():
    cold = coldstart.ColdStartReport(
        coldstart.ColdStart(1.0, 0.06, 1300 * MIB, 220 * MIB, 1250 * MIB),
        coldstart.ColdStart(0.9, 0.05, 520 * MIB, 220 * MIB, 500 * MIB), 3)
    lines = format_cold_start(cold).splitlines()
    peak = next(line for line in lines if line.startswith("serving peak RSS"))
    steady = next(line for line in lines if line.startswith("serving steady RSS"))
    assert "0.40x" in peak and "520.0 MiB" in peak
    assert "500.0 MiB" in steady and "0.40x" in steady
    assert any("of which the runtime" in line for line in lines)
    # A report measured before steady RSS was: no row rather than a 0.
    old = coldstart.ColdStartReport(coldstart.ColdStart(1.0, 0.06, 1300 * MIB, 220 * MIB),
                                    coldstart.ColdStart(0.9, 0.05, 520 * MIB, 220 * MIB), 1)
    assert "steady" not in format_cold_start(old)


def test_the_native_loader_answers_as_tfs_python_loader(text_classifier_base):
    """C++ runtime, fresh process, no Python TensorFlow: the same outputs for serialized
    tf.Examples (a string feed; string and float outputs), and consistent memory."""
    model = os.path.join(text_classifier_base, "1")
    examples = np.array(samples.text_examples(6, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB),
                        dtype=object)
    result = native_load.measure(model, {"inputs": examples}, "serving_default",
                                 return_outputs=True)
    sess, meta_graph = loader.load_session(model)
    try:
        sig = meta_graph.signature_def["serving_default"]
        aliases = sorted(sig.outputs)
        expected = sess.run([sig.outputs[a].name for a in aliases],
                            {sig.inputs["inputs"].name: examples})
    finally:
        sess.close()
    assert sorted(result.outputs) == aliases
    for alias, want in zip(aliases, expected):
        got = result.outputs[alias]
        assert got.shape == np.asarray(want).shape
        if got.dtype == object:
            assert got.tolist() == np.asarray(want).tolist()
        else:  # the same kernels; thread pools may sum in another order
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert [s.name for s in result.stages] == ["interpreter", "libraries", "runtime",
                                               "load", "first request"]
    assert result.warmup_records == 0  # no warmup file: the stage is skipped, and said so
    assert result.peak_rss_bytes >= result.steady_rss_bytes > result.runtime_rss_bytes > 0
    runtime = result.stage("runtime")
    # The runtime's code pages count, as in a server: most of what it holds is file-backed.
    assert runtime.rss_file_bytes > runtime.rss_anon_bytes > 0
    assert runtime.rss_bytes > result.interpreter_rss_bytes > 0
    # The dynamic-linking tables were dropped (the outputs above were computed after).
    assert result.stage("libraries").rss_file_bytes - runtime.rss_file_bytes > 16 * MIB
    peaks = [s.peak_rss_bytes for s in result.stages]
    assert peaks == sorted(peaks)


def test_the_native_loader_can_keep_the_linker_tables(text_classifier_base):
    """``static_runtime=False``: the libraries as pip's loader leaves them, no stage for
    the release, and a larger runtime than the default's measured in the same way."""
    model = os.path.join(text_classifier_base, "1")
    examples = np.array(samples.text_examples(2, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB),
                        dtype=object)
    kept = native_load.measure(model, {"inputs": examples}, static_runtime=False)
    dropped = native_load.measure(model, {"inputs": examples})
    assert "libraries" not in [s.name for s in kept.stages]
    assert kept.runtime_rss_bytes - dropped.runtime_rss_bytes > 16 * MIB


def test_linker_tables_are_whole_pages_of_the_read_only_segment(tmp_path):
    library = os.path.join(native_load.tensorflow_dir(), "libtensorflow_cc.so.2")
    base = 0x7F0000000000
    ranges = native_load.linker_table_ranges(library, base)
    assert ranges and ranges == sorted(ranges)
    for (start, end), following in zip(ranges, ranges[1:] + [(None, None)]):
        assert start % 4096 == 0 and end % 4096 == 0 and base <= start < end
        assert following[0] is None or end < following[0]  # merged: no overlap or contact
    # Within the file: a library is mapped from its first byte.
    assert ranges[-1][1] - base <= os.path.getsize(library)
    not_elf = tmp_path / "not.so"
    not_elf.write_bytes(b"#!/bin/sh\n" * 10)
    assert native_load.linker_table_ranges(str(not_elf), base) == []


def test_the_native_loader_replays_the_warmup_file(text_model_with_warmup):
    examples = np.array(samples.text_examples(2, seed=4, vocab_size=TEXT_CLASSIFIER_VOCAB),
                        dtype=object)
    result = native_load.measure(text_model_with_warmup, {"inputs": examples})
    assert result.warmup_records == 2
    assert [s.name for s in result.stages] == ["interpreter", "libraries", "runtime", "load",
                                               "warmup", "first request"]
    assert result.peak_rss_bytes >= result.steady_rss_bytes > result.runtime_rss_bytes > 0


@pytest.fixture(scope="module")
def quantized_mlp(tmp_path_factory):
    """A TF1 MLP of three 64x64 kernels, int8, dequantized at load by the init op."""
    import tensorflow as tf

    v1 = tf.compat.v1
    source = str(tmp_path_factory.mktemp("mlp") / "1")
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 64], name="x")
        net = x
        for i in range(3):
            kernel = v1.get_variable(f"dense_{i}/kernel", [64, 64],
                                     initializer=v1.glorot_uniform_initializer(seed=i))
            net = tf.nn.relu(tf.matmul(net, kernel))
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(source)
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                "serving_default": v1.saved_model.signature_def_utils.predict_signature_def(
                    {"x": x}, {"y": net})})
            builder.save()
    report = optimize(source, str(tmp_path_factory.mktemp("q_mlp")), OptimizeOptions(
        build=BuildOptions(quantize="int8", quantize_min_elements=1000, freeze_max_bytes=0),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    assert report.parity.ok
    return report


def test_weights_are_dequantized_one_at_a_time(quantized_mlp):
    """Each weight's dequantization starts once the previous one is done (its float
    temporaries freed): the init op never holds two weights' temporaries at once."""
    report = quantized_mlp
    mg = loader.find_meta_graph(loader.read_saved_model(report.output_dir), {"serve"})
    nodes = {n.name: n for n in mg.graph_def.node}
    reads = [f"{q.name}/serving_opt_quantized/dequantize/read" for q in report.quantized]
    assert len(reads) == 3 and all(r in nodes for r in reads)
    waits = {r: [i[1:] for i in nodes[r].input if i.startswith("^")] for r in reads}
    assert sum(not w for w in waits.values()) == 1  # one starts the chain ...
    done = {w[0] for w in waits.values() if w}
    assert len(done) == 2  # ... and each other waits for a different one
    assert all(d.endswith("/dequantize/done") for d in done)
