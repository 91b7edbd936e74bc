"""--quantize: int8 / int4 / fp16 weights, dequantized where it costs nothing, behind a
lossy gate.

Specifications on real models: the Estimator-like text classifier (a vocab-file
embedding read by ResourceGather), a Keras text model (Embedding read by ReadVariableOp
+ GatherV2 after inlining) and a conv net (weights dequantized once, at load).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import TEXT_CLASSIFIER_DIM, TEXT_CLASSIFIER_VOCAB, in_process

from serving_opt import samples
from serving_opt.core import gates
from serving_opt.errors import ParityError, UsageError
from serving_opt.options import BuildOptions, GateOptions, MeasureOptions
from serving_opt.pipeline.attempts import LOSSY_GATE_FAILED
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize
from serving_opt.savedmodel import loader, untrusted

EMBEDDING = "dnn/input_from_feature_columns/input_layer/text_embedding/embedding_weights"
# Not measured: the cold-start gate times fresh processes, and on a busy machine its
# noise could make optimize retry with variables kept. Nothing here is about timing.
FAST = dict(measure=MeasureOptions(benchmark_runs=0, cold_start=False))
FAST_BUILD = dict(freeze_max_bytes=512 * 1024)


def _meta_graph(path: str):
    return loader.find_meta_graph(loader.read_saved_model(path), {"serve"})


def _request_path_reads_of(meta_graph, prefix: str) -> list[tuple[str, str]]:
    """(op, input) for every node that reads a variable whose name starts with ``prefix``."""
    handles = {n.name: n for n in meta_graph.graph_def.node if n.op == "VarHandleOp"
               and n.name.startswith(prefix)}
    out = []
    for n in meta_graph.graph_def.node:
        if n.name.startswith("serving_opt_saver/"):
            continue  # the loader's restore
        for i in n.input:
            if i.split(":")[0].lstrip("^") in handles:
                out.append((n.op, handles[i.split(":")[0].lstrip("^")].attr["dtype"].type))
    return out


def _predict(model_dir: str, examples: list[bytes]) -> dict:
    sess, mg = loader.load_session(model_dir)
    try:
        sig = mg.signature_def["predict"]
        return sess.run({k: v.name for k, v in sig.outputs.items()},
                        {sig.inputs["examples"].name: examples})
    finally:
        sess.close()


@pytest.fixture(scope="module", params=["int8", "fp16"])
def quantized_text(request, text_classifier_base, tmp_path_factory):
    out = str(tmp_path_factory.mktemp(f"q_{request.param}"))
    report = optimize(os.path.join(text_classifier_base, "1"), out,
                      OptimizeOptions(build=BuildOptions(quantize=request.param, **FAST_BUILD),
                                      **FAST))
    return request.param, report


def test_the_table_is_only_gathered_quantized_never_read_whole_as_float(quantized_text):
    from tensorflow.core.framework import types_pb2

    mode, report = quantized_text
    mg = _meta_graph(report.output_dir)
    reads = _request_path_reads_of(mg, EMBEDDING)
    stored = types_pb2.DT_INT8 if mode == "int8" else types_pb2.DT_HALF
    # Only row gathers touch the table; nothing reads it whole, nothing reads it as float.
    assert reads and {op for op, _ in reads} == {"ResourceGather"}
    assert stored in {dtype for _, dtype in reads}
    assert EMBEDDING not in {n.name for n in mg.graph_def.node}  # the float table is gone
    table = next(q for q in report.quantized if q.name == EMBEDDING)
    assert table.dequantized == "per request, gathered rows only"
    rows, dim = TEXT_CLASSIFIER_VOCAB + samples.TEXT_OOV_BUCKETS, TEXT_CLASSIFIER_DIM
    assert table.bytes_before == rows * dim * 4
    # int8: a byte per value (its scale per column is a constant of the graph); fp16: two
    # bytes per value.
    assert table.bytes_after == (rows * dim if mode == "int8" else rows * dim * 2)


def test_the_checkpoint_holds_the_quantized_table(quantized_text):
    import tensorflow as tf

    mode, report = quantized_text
    dtypes = {name: tf.train.load_checkpoint(
        os.path.join(report.output_dir, "variables", "variables")).get_tensor(name).dtype
        for name, _ in tf.train.list_variables(
            os.path.join(report.output_dir, "variables", "variables"))}
    table = [d for name, d in dtypes.items() if name.startswith(EMBEDDING + "/")]
    assert np.dtype(np.int8 if mode == "int8" else np.float16) in table
    assert report.size_after.variables < report.size_before.variables / 2


@pytest.mark.golden
def test_answers_pass_the_lossy_gate_and_agree_on_top1(quantized_text, text_classifier_base):
    mode, report = quantized_text
    assert report.parity.ok
    examples = samples.text_examples(64, seed=11, vocab_size=TEXT_CLASSIFIER_VOCAB)
    before = _predict(os.path.join(text_classifier_base, "1"), examples)
    after = _predict(report.output_dir, examples)
    agreement = float(np.mean(before["class_ids"] == after["class_ids"]))
    assert agreement >= 0.995
    assert np.abs(before["probabilities"] - after["probabilities"]).max() <= \
        gates.DEFAULT_MAX_PROBABILITY_ERROR
    probabilities = next(o for o in report.parity.outputs if o.output == "probabilities")
    assert probabilities.agreement is not None and probabilities.agreement >= 0.995


def test_it_loads_with_tf_saved_model_load(quantized_text, text_classifier_base):
    import tensorflow as tf

    _, report = quantized_text
    examples = samples.text_examples(8, seed=5, vocab_size=TEXT_CLASSIFIER_VOCAB)
    expected = _predict(os.path.join(text_classifier_base, "1"), examples)
    got = tf.saved_model.load(report.output_dir).signatures["predict"](
        examples=tf.constant(examples))
    np.testing.assert_allclose(got["probabilities"].numpy(), expected["probabilities"],
                               atol=0.02)


def test_dense_weights_are_dequantized_once_at_load_by_the_init_op(quantized_text):
    mode, report = quantized_text
    at_load = [q for q in report.quantized if q.dequantized == "at load (init op)"]
    assert at_load  # the head's kernels
    mg = _meta_graph(report.output_dir)
    init = mg.collection_def["saved_model_main_op"].node_list.value[0]
    assert init.startswith("serving_opt_quantized/")
    nodes = {n.name: n for n in mg.graph_def.node}
    assigns = [i.lstrip("^") for i in nodes[init].input if "dequantize" in i]
    assert len(assigns) == len(at_load)
    for q in at_load:
        # Requests read the float variable, as before; only the init op reads the copy.
        readers = [n.op for n in mg.graph_def.node if q.name in [i.split(":")[0]
                                                                 for i in n.input]]
        assert "AssignVariableOp" in readers and "ReadVariableOp" in readers


# Judged on the error alone: no agreement interval to decide by drawing more rows.
LOOSE_GATE = dict(gate=GateOptions(max_probability_error=1.0, min_top1_agreement=0.0))


@pytest.fixture(scope="module")
def tables_only_by_size(text_classifier_base, tmp_path_factory):
    """int8 with --quantize_min_elements above the head's kernels, under a gate that
    passes anything: what the size threshold picks, and the error the table alone adds."""
    with in_process():
        return optimize(os.path.join(text_classifier_base, "1"),
                        str(tmp_path_factory.mktemp("tables_by_size")),
                        OptimizeOptions(
                            build=BuildOptions(quantize="int8", quantize_min_elements=100_000,
                                               **FAST_BUILD),
                            **LOOSE_GATE, **FAST))


def test_quantize_min_elements_leaves_small_tensors_alone(tables_only_by_size):
    report = tables_only_by_size
    assert report.published
    # 5100 x 32 = 163200 elements: the table only; the head's kernels (<= 32768) stay.
    assert [q.name for q in report.quantized] == [EMBEDDING]


@pytest.mark.in_process
def test_a_lossy_gate_too_tight_tries_the_tables_alone_then_refuses(text_classifier_base,
                                                                    tmp_path):
    # No gate a quantized model passes (max error 0): everything quantized fails, the
    # tables alone too. The error decides, so the agreement is not asked for (0.0): an
    # undecided agreement interval would only draw more rows for the same verdict.
    # Sandboxed: the attempts come back from the worker in its report.
    out = tmp_path / "out"
    with pytest.raises(ParityError) as failure:
        optimize(os.path.join(text_classifier_base, "1"), str(out),
                 OptimizeOptions(
                     build=BuildOptions(quantize="int8", **FAST_BUILD),
                     gate=GateOptions(max_probability_error=0.0, min_top1_agreement=0.0), **FAST))
    assert "parity failed" in failure.value.problem and "max abs diff" in failure.value.problem
    report = failure.value.report
    assert [(a.candidate.describe(), a.outcome, a.then) for a in report.attempts] == [
        ("frozen, int8: all large weights", LOSSY_GATE_FAILED,
         "retried: frozen, int8: tables only"),
        ("frozen, int8: tables only", LOSSY_GATE_FAILED,
         "retried: frozen, int8: tables only, a scale per table row"),
        ("frozen, int8: tables only, a scale per table row", LOSSY_GATE_FAILED,
         "refused: nothing was published")]
    assert all(q.dequantized.startswith("per request") for q in report.quantized)
    assert not report.published
    assert not os.path.exists(out) or os.listdir(out) == []


def test_bad_quantize_options_are_usage_errors(classifier_dir, tmp_path):
    with pytest.raises(UsageError, match="--quantize=int2"):
        optimize(classifier_dir, str(tmp_path / "o"), OptimizeOptions(
            build=BuildOptions(quantize="int2")))
    with pytest.raises(UsageError, match="min_top1_agreement"):
        optimize(classifier_dir, str(tmp_path / "o"),
                 OptimizeOptions(
                     build=BuildOptions(quantize="int8"),
                     gate=GateOptions(min_top1_agreement=1.5)))


def _keras_embedding_export(tmp_path_factory, name: str, width: int, seed: int) -> str:
    """Keras 3 export: Embedding(20000, width) -> mean -> Dense(4, softmax) named probs."""
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(6,), dtype="int32", name="ids")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20000, width)(ids))
    out = keras.layers.Dense(4, activation="softmax", name="probs")(x)
    path = os.path.join(str(tmp_path_factory.mktemp(name)), "1")
    keras.Model(ids, out).export(path, verbose=False)
    return path


@pytest.fixture(scope="module")
def keras_text_dir(tmp_path_factory) -> str:
    return _keras_embedding_export(tmp_path_factory, "keras_text", 32, seed=1)


@pytest.mark.in_process
def test_keras_embedding_int8_gathers_rows_and_agrees(keras_text_dir, tmp_path):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    report = optimize(keras_text_dir, str(tmp_path / "out"),
                      OptimizeOptions(build=BuildOptions(quantize="int8", **FAST_BUILD), **FAST))
    table = [q for q in report.quantized if q.dequantized.startswith("per request")]
    assert len(table) == 1
    mg = _meta_graph(report.output_dir)
    reads = _request_path_reads_of(mg, table[0].name)
    assert {op for op, _ in reads} == {"ResourceGather"}
    assert types_pb2.DT_INT8 in {d for _, d in reads}
    ids = np.random.default_rng(2).integers(0, 20000, size=(64, 6)).astype(np.int32)
    before = tf.saved_model.load(keras_text_dir).signatures["serving_default"](
        ids=tf.constant(ids))
    after = tf.saved_model.load(report.output_dir).signatures["serving_default"](
        ids=tf.constant(ids))
    key = next(iter(before))
    agree = np.mean(before[key].numpy().argmax(1) == after[key].numpy().argmax(1))
    assert agree >= 0.95  # near-ties on random weights may flip; the gate saw its own rows
    assert np.abs(before[key].numpy() - after[key].numpy()).max() <= 0.02


@pytest.mark.in_process
def test_conv_net_weights_int8_dequantized_at_load(convnet_dir, tmp_path):
    import tensorflow as tf

    report = optimize(convnet_dir, str(tmp_path / "out"),
                      OptimizeOptions(
                          build=BuildOptions(quantize="int8",
                                             quantize_min_elements=256,
                                             max_constant_bytes=1024),
                          measure=MeasureOptions(benchmark_runs=0, cold_start=False),
                          gate=GateOptions(max_probability_error=0.1)))
    assert report.quantized and report.parity.ok
    assert {q.dequantized for q in report.quantized} == {"at load (init op)"}
    ops = {n.op for n in _meta_graph(report.output_dir).graph_def.node}
    assert "Conv2D" in ops or "_FusedConv2D" in ops
    # What the published checkpoint holds, read with TensorFlow's own reader.
    prefix = os.path.join(report.output_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    stored = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}
    sess = tf.compat.v1.Session(graph=tf.Graph())
    try:
        with sess.graph.as_default():
            # The SavedModel loader runs the init op, which fills the float weights.
            tf.compat.v1.saved_model.loader.load(sess, ["serve"], report.output_dir)
            for q in report.quantized:
                values = stored[f"{q.name}/serving_opt_quantized_int8"]
                scales = stored[f"{q.name}/serving_opt_quantized_scale"]
                assert q.name not in stored  # no float copy on disk
                assert values.dtype == np.int8 and scales.dtype == np.float32
                # One scale per output channel (the last axis), symmetric: each channel's
                # largest weight is stored as +-127.
                assert scales.shape == (1,) * (values.ndim - 1) + (values.shape[-1],)
                peak = np.abs(values.astype(np.int32)).reshape(-1, values.shape[-1]).max(0)
                np.testing.assert_array_equal(peak[scales.reshape(-1) > 0], 127)
                loaded = sess.run(tf.raw_ops.ReadVariableOp(
                    resource=sess.graph.get_tensor_by_name(f"{q.name}:0"), dtype=tf.float32))
                np.testing.assert_array_equal(loaded, values.astype(np.float32) * scales)
    finally:
        sess.close()


@pytest.mark.in_process
def test_when_the_gate_refuses_dense_weights_only_the_tables_are_quantized(
        text_classifier_base, tables_only_by_size, tmp_path):
    src = os.path.join(text_classifier_base, "1")

    def max_probability_error(report) -> float:
        return next(o.max_abs_diff for o in report.parity.outputs
                    if o.output == "probabilities")

    everything = optimize(src, str(tmp_path / "all"), OptimizeOptions(
        build=BuildOptions(quantize="int8", **FAST_BUILD), **LOOSE_GATE, **FAST))
    worst = max_probability_error(everything)
    table_only = max_probability_error(tables_only_by_size)
    assert table_only < worst  # the dense weights add error on top of the table's
    # A gate between the two: everything quantized fails it, the tables alone pass.
    report = optimize(src, str(tmp_path / "gated"), OptimizeOptions(
        build=BuildOptions(quantize="int8", **FAST_BUILD),
        gate=GateOptions(max_probability_error=(worst + table_only) / 2, min_top1_agreement=0.0),
        **FAST))
    assert report.published
    assert [q.name for q in report.quantized] == [EMBEDDING]
    assert any("only the embedding tables" in w for w in report.warnings)


@pytest.mark.in_process
def test_when_the_gate_refuses_a_scale_per_column_the_table_gets_one_per_row(
        text_classifier_base, tables_only_by_size, tmp_path, monkeypatch):
    from serving_opt.stages import quantize as quantize_lib

    src = os.path.join(text_classifier_base, "1")

    def max_probability_error(report) -> float:
        return next(o.max_abs_diff for o in report.parity.outputs
                    if o.output == "probabilities")

    build = BuildOptions(quantize="int8", quantize_min_elements=100_000, **FAST_BUILD)
    columns = max_probability_error(tables_only_by_size)
    assert tables_only_by_size.quantized[0].column_scales
    with monkeypatch.context() as patch:
        patch.setattr(quantize_lib, "_COLUMN_ERROR", 0.0)  # a scale per row, always
        by_rows = optimize(src, str(tmp_path / "rows"),
                           OptimizeOptions(build=build, **LOOSE_GATE, **FAST))
    assert not by_rows.quantized[0].column_scales
    rows = max_probability_error(by_rows)
    assert rows < columns  # control: a step per row is finer here
    # A gate between the two: the scale per column fails it, a retry with one per row
    # passes.
    report = optimize(src, str(tmp_path / "gated"), OptimizeOptions(
        build=build, gate=GateOptions(max_probability_error=(rows + columns) / 2,
                                      min_top1_agreement=0.0), **FAST))
    assert report.published
    assert [(a.candidate.describe(), a.outcome, a.then) for a in report.attempts] == [
        ("frozen, int8: all large weights", LOSSY_GATE_FAILED,
         "retried: frozen, int8: all large weights, a scale per table row"),
        ("frozen, int8: all large weights, a scale per table row", "ok", "taken")]
    assert [(q.name, q.column_scales) for q in report.quantized] == [(EMBEDDING, False)]


# ------------------------------------------------------------------------------ int4
# Embedding tables only: two 4-bit values a byte, a float32 scale per row, symmetric
# ([-7, 7]); the gathered bytes are unpacked in the graph, the table never is.

INT4_TABLE = f"{EMBEDDING}/serving_opt_quantized_int4"
INT4_SCALES = f"{EMBEDDING}/serving_opt_quantized_scale"


def _checkpoint(model_dir: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    prefix = os.path.join(model_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(prefix)}


def _int4_bound(table: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per value, the most a symmetric 4-bit row ([-7, 7] steps of its scale) can move it:
    half a step, or what lies beyond 7 steps for a value the row's scale clips."""
    step = scales.reshape(-1, 1)
    return np.maximum(step / 2, np.abs(table) - 7 * step)


def _check_int4_scales(table: np.ndarray, scales: np.ndarray, restored: np.ndarray) -> None:
    """Each row's scale is at most its peak / 7 and at least 0.6 of it, and rounds the row
    no worse than peak / 7 would (computed here, from the float table)."""
    peak = np.abs(table).max(axis=1)
    plain = np.where(peak > 0, peak / 7, 1.0)
    assert (scales <= plain * (1 + 1e-6)).all() and (scales >= 0.6 * plain * (1 - 1e-6)).all()
    plain_error = np.square(np.clip(np.rint(table / plain[:, None]), -7, 7) * plain[:, None]
                            - table).sum(axis=1)
    assert (np.square(restored - table).sum(axis=1) <= plain_error * (1 + 1e-5) + 1e-12).all()


@pytest.fixture(scope="module")
def int4_text(text_classifier_base, tmp_path_factory):
    """int4 under a gate that passes anything: at 32 values a row, 4 bits flip ~2-3% of
    this untrained sample's clear rows, which the default gate refuses (tested below)."""
    with in_process():
        return optimize(os.path.join(text_classifier_base, "1"),
                        str(tmp_path_factory.mktemp("q_int4")),
                        OptimizeOptions(build=BuildOptions(quantize="int4", **FAST_BUILD),
                                        **LOOSE_GATE, **FAST))


def test_int4_packs_two_values_a_byte_with_a_scale_per_row(int4_text, text_classifier_base):
    report = int4_text
    stored = _checkpoint(report.output_dir)
    rows, dim = TEXT_CLASSIFIER_VOCAB + samples.TEXT_OOV_BUCKETS, TEXT_CLASSIFIER_DIM
    assert EMBEDDING not in stored  # no float copy of the table on disk
    assert stored[INT4_TABLE].dtype == np.uint8
    assert stored[INT4_TABLE].shape == (rows, (dim + 1) // 2)
    assert stored[INT4_SCALES].dtype == np.float32 and stored[INT4_SCALES].shape == (rows,)
    table = next(q for q in report.quantized if q.name == EMBEDDING)
    assert (table.mode, table.dequantized) == ("int4", "per request, gathered rows only")
    assert table.bytes_after == rows * ((dim + 1) // 2) + rows * 4  # an eighth, + scales
    # Every nibble is a level of [-7, 7] offset by 8: 0 never occurs.
    nibbles = np.concatenate([stored[INT4_TABLE] & 15, stored[INT4_TABLE] >> 4])
    assert nibbles.min() >= 1 and nibbles.max() <= 15
    original = _checkpoint(os.path.join(text_classifier_base, "1"))[EMBEDDING]
    scales = stored[INT4_SCALES]
    restored = (np.concatenate([stored[INT4_TABLE] & 15, stored[INT4_TABLE] >> 4], axis=1)
                [:, :dim].astype(np.float32) - 8) * scales[:, None]
    _check_int4_scales(original, scales, restored)
    # Clipping a row's largest values pays here: less error over the table than peak / 7.
    peak_step = np.abs(original).max(axis=1, keepdims=True) / 7
    plain = np.clip(np.rint(original / peak_step), -7, 7) * peak_step
    assert np.square(restored - original).sum() < 0.95 * np.square(plain - original).sum()


def test_int4_served_graph_unpacks_only_the_gathered_rows(int4_text):
    from tensorflow.core.framework import types_pb2

    mg = _meta_graph(int4_text.output_dir)
    reads = _request_path_reads_of(mg, EMBEDDING)
    # The packed table is only gathered: no read of it whole, so no full-table unpack
    # or Cast can exist.
    assert reads and {op for op, _ in reads} == {"ResourceGather"}
    assert types_pb2.DT_UINT8 in {dtype for _, dtype in reads}
    assert untrusted.host_op_uses(mg) == []  # the unpack ops are pure math to the check
    nodes = {n.name: n for n in mg.graph_def.node}
    casts = [n for n in mg.graph_def.node if n.op == "Cast"
             and n.attr["SrcT"].type == types_pb2.DT_UINT8]
    assert casts
    for cast in casts:
        # uint8 -> float happens after ConcatV2(BitwiseAnd, RightShift) of a ResourceGather.
        unpacked = nodes[cast.input[0].split(":")[0]]
        assert unpacked.op == "ConcatV2"
        parts = [nodes[i.split(":")[0]] for i in unpacked.input[:2]]
        assert [p.op for p in parts] == ["BitwiseAnd", "RightShift"]
        assert {nodes[p.input[0].split(":")[0]].op for p in parts} == {"ResourceGather"}


def _gathers_and_ids(model_dir: str, examples) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, dequantized rows) of every int4 gather the served graph runs for ``examples``,
    fed to every signature's input (each signature has its own gathers once inlined)."""
    suffix = "/serving_opt_quantized/rows"
    sess, mg = loader.load_session(model_dir)
    try:
        feeds = {t.name: examples for sig in mg.signature_def.values()
                 for t in sig.inputs.values()}
        rewritten = [n for n in mg.graph_def.node if n.name.endswith(suffix)]
        fetches = [(n.input[1] if ":" in n.input[1] else f"{n.input[1]}:0",
                    n.name[:-len(suffix)] + ":0") for n in rewritten]
        got = sess.run(fetches, feeds)
        return [(np.asarray(ids), np.asarray(rows)) for ids, rows in got]
    finally:
        sess.close()


def test_int4_rows_served_are_within_half_a_step_of_the_original(int4_text,
                                                                text_classifier_base):
    original = _checkpoint(os.path.join(text_classifier_base, "1"))[EMBEDDING]
    bound = _int4_bound(original, _checkpoint(int4_text.output_dir)[INT4_SCALES])
    examples = samples.text_examples(32, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB)
    gathered = _gathers_and_ids(int4_text.output_dir, examples)
    assert gathered
    for ids, rows in gathered:
        assert rows.dtype == np.float32 and rows.shape == ids.shape + (TEXT_CLASSIFIER_DIM,)
        err = np.abs(rows - original[ids])
        assert (err <= bound[ids] * (1 + 1e-5) + 1e-7).all(), err.max()
        assert err.max() > 0  # quantized indeed: a float table passes no test here


def test_int4_is_judged_by_the_lossy_gate(int4_text):
    report = int4_text
    assert report.parity.ok  # the loose gate
    probabilities = next(o for o in report.parity.outputs if o.output == "probabilities")
    # Judged as int8 and fp16 are: an agreement on top-1, answers changed.
    assert probabilities.agreement is not None and probabilities.agreement >= 0.9
    assert probabilities.max_abs_diff > 0
    assert [(a.candidate.describe(), a.then) for a in report.attempts] == [
        ("frozen, int4: tables only", "taken")]


@pytest.mark.in_process
def test_int4_the_default_agreement_gate_refuses_it_here(text_classifier_base, tmp_path):
    # The default gate: on this sample the agreement's interval lies below 0.995 (and
    # probabilities move past 0.05), so nothing is published.
    out = tmp_path / "out"
    with pytest.raises(ParityError) as failure:
        optimize(os.path.join(text_classifier_base, "1"), str(out),
                 OptimizeOptions(build=BuildOptions(quantize="int4", **FAST_BUILD), **FAST))
    assert "top-1 agreement" in failure.value.problem and "< 0.995" in failure.value.problem
    assert "--quantize=int4" in failure.value.fix
    report = failure.value.report
    # Tables only from the start: no "dense weights" attempt to fall back from.
    assert [(a.candidate.describe(), a.outcome, a.then) for a in report.attempts] == [
        ("frozen, int4: tables only", LOSSY_GATE_FAILED, "refused: nothing was published")]
    assert not report.published
    assert not os.path.exists(out) or os.listdir(out) == []


def test_int4_leaves_dense_weights_float32_and_says_so(int4_text, text_classifier_base):
    report = int4_text
    assert [q.name for q in report.quantized] == [EMBEDDING]
    stored = _checkpoint(report.output_dir)
    original = _checkpoint(os.path.join(text_classifier_base, "1"))
    # What int8 stores as int8 (the frozen, then externalized kernel; see
    # test_dense_weights_are_dequantized_once_at_load_by_the_init_op) int4 stores as it
    # was, float32 bit for bit, and no init op dequantizes anything.
    large_dense = [name for name, v in stored.items()
                   if not name.startswith(EMBEDDING + "/") and v.size >= 16384]
    assert large_dense
    for name in large_dense:
        assert stored[name].dtype == np.float32
        np.testing.assert_array_equal(stored[name],
                                      original[name.removesuffix("/serving_opt_variable")])
    assert not any("serving_opt_quantized" in k for k in stored
                   if not k.startswith(EMBEDDING + "/"))
    assert not any("serving_opt_quantized/" in n.name and "dequantize" in n.name
                   for n in _meta_graph(report.output_dir).graph_def.node)
    assert any("--quantize=int4 quantizes embedding tables only" in w
               for w in report.warnings)


def test_int4_packing_is_chunked_and_odd_widths_pad(monkeypatch):
    from serving_opt.stages import quantize as quantize_lib

    monkeypatch.setattr(quantize_lib, "_CHUNK_ROWS", 7)  # rows straddle chunk boundaries
    table = np.random.default_rng(4).standard_normal((50, 9)).astype(np.float32)
    table[5] = 0.0  # an all-zero row keeps a usable scale
    # Rounded best with its peak clipped a little: squared error 0.042 at steps of 0.19,
    # 0.060 at the peak's 0.2.
    table[6] = [0.5, 0.5, 0.5, -0.5, 1.0, -1.0, 0.3, 0.3, 1.4]
    table[7] = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]  # exact at peak / 7
    packed, scales = quantize_lib.quantize_rows_int4(table)
    assert packed.dtype == np.uint8 and packed.shape == (50, 5)
    # Independently: levels of [-7, 7] at the row's scale, low nibbles the first 5
    # columns, high nibbles the last 4 and one padding zero (8).
    levels = np.clip(np.rint(table / scales[:, None]), -7, 7).astype(np.int64) + 8
    levels = np.concatenate([levels, np.full((50, 1), 8)], axis=1)
    np.testing.assert_array_equal(packed, levels[:, :5] | (levels[:, 5:] << 4))
    restored = quantize_lib.dequantize_rows_int4(packed, scales, 9)
    assert restored.shape == table.shape
    assert (np.abs(restored - table) <= _int4_bound(table, scales) * (1 + 1e-5)).all()
    _check_int4_scales(table, scales, restored)
    assert np.array_equal(restored[5], np.zeros(9, np.float32))
    np.testing.assert_array_equal(restored[7], table[7])
    step = 1.4 / 7
    assert scales[6] < step * 0.99
    assert np.square(restored[6] - table[6]).sum() < np.square(
        np.rint(table[6] / step) * step - table[6]).sum()


def test_int4_candidates_are_tables_only():
    from serving_opt.pipeline.attempts import candidates

    assert [c.describe() for c in candidates("auto", "int4")] == [
        "frozen, int4: tables only", "variables kept, int4: tables only"]
    assert [c.describe() for c in candidates("never", "int4")] == [
        "variables kept, int4: tables only"]


@pytest.fixture(scope="module")
def keras_odd_dir(tmp_path_factory) -> str:
    """An odd embedding width (33): int4 pads its rows to an even one."""
    return _keras_embedding_export(tmp_path_factory, "keras_odd", 33, seed=3)


@pytest.mark.in_process
def test_int4_odd_width_keras_embedding_read_then_gathered(keras_odd_dir, tmp_path):
    import tensorflow as tf

    report = optimize(keras_odd_dir, str(tmp_path / "out"),
                      OptimizeOptions(build=BuildOptions(quantize="int4", **FAST_BUILD), **FAST))
    (table,) = [q for q in report.quantized]
    assert table.dequantized == "per request, gathered rows only"
    stored = _checkpoint(report.output_dir)
    packed = stored[f"{table.name}/serving_opt_quantized_int4"]
    assert packed.shape == (20000, 17) and packed.dtype == np.uint8  # 33 -> 17 bytes a row
    assert table.bytes_after == 20000 * 17 + 20000 * 4
    original = _checkpoint(keras_odd_dir)
    float_table = next(v for v in original.values() if np.shape(v) == (20000, 33))
    # Served rows, [batch, 6, 33] (2-D ids: the unpack is rank-independent), within
    # half a step of the float rows (or what their row's scale clips).
    ids = np.random.default_rng(5).integers(0, 20000, size=(16, 6)).astype(np.int32)
    gathered = _gathers_and_ids(report.output_dir, ids)
    assert gathered
    for got_ids, rows in gathered:
        assert rows.shape == got_ids.shape + (33,)
        err = np.abs(rows - float_table[got_ids])
        scales = stored[f"{table.name}/serving_opt_quantized_scale"]
        assert (err <= _int4_bound(float_table, scales)[got_ids] * (1 + 1e-5)
                + 1e-7).all(), err.max()
    before = tf.saved_model.load(keras_odd_dir).signatures["serving_default"](
        ids=tf.constant(ids))
    after = tf.saved_model.load(report.output_dir).signatures["serving_default"](
        ids=tf.constant(ids))
    key = next(iter(before))
    assert after[key].shape == before[key].shape
    assert np.abs(before[key].numpy() - after[key].numpy()).max() <= 0.05


@pytest.mark.parametrize("mode", ["int8", "fp16", "int4"])
@pytest.mark.parametrize("ids_shape", [(5,), (2, 3)])
def test_the_rewritten_gather_serves_the_dequantized_rows(mode, ids_shape):
    """The gather rewrite alone, in plain TensorFlow, on a small table: the rows it serves
    are the stored ones dequantized independently (numpy), for any rank of ids."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2, types_pb2

    from serving_opt.savedmodel.graph import attr, make_node
    from serving_opt.stages import quantize as quantize_lib

    table = np.random.default_rng(7).standard_normal((40, 9)).astype(np.float32)
    table[3] = 0.0
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend([
        make_node("ids", "Placeholder", dtype=attr(type=types_pb2.DT_INT64)),
        make_node("gather", "ResourceGather", ["table", "ids"],
                  dtype=attr(type=types_pb2.DT_FLOAT), Tindices=attr(type=types_pb2.DT_INT64),
                  batch_dims=attr(i=0), validate_indices=attr(b=True))])
    saved, kept, new_nodes = {}, [], []
    qname, sname, dtype = quantize_lib._store("table", table, mode, "rows", saved, kept,
                                              new_nodes)
    nodes = {n.name: n for n in graph_def.node}
    quantize_lib._gather_rows(nodes["gather"], nodes, qname, None if mode == "fp16" else sname,
                              dtype, new_nodes, packed_width=9 if mode == "int4" else 0)
    graph_def.node.extend(new_nodes)
    # Independently: what each stored row means, from the stored arrays alone.
    stored = saved[qname]
    if mode == "int8":
        want_table = stored.astype(np.float32) * saved[sname][:, None]
    elif mode == "fp16":
        want_table = stored.astype(np.float32)
    else:
        nibbles = np.concatenate([stored & 15, stored >> 4], axis=1)[:, :9]
        want_table = (nibbles.astype(np.float32) - 8) * saved[sname][:, None]
    assert np.abs(want_table - table).max() < (0.5 if mode == "int4" else 0.05)  # control
    ids = np.random.default_rng(8).integers(0, 40, size=ids_shape)
    ids.flat[0] = 3  # the all-zero row
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            for name, value in saved.items():
                sess.run(tf.raw_ops.AssignVariableOp(
                    resource=g.get_tensor_by_name(f"{name}:0"), value=value))
            got = sess.run("gather:0", {"ids:0": ids})
    assert got.dtype == np.float32 and got.shape == ids_shape + (9,)
    np.testing.assert_allclose(got, want_table[ids], rtol=1e-6, atol=0)


def test_int8_tables_take_a_scale_per_column_unless_their_rows_differ_in_size():
    from serving_opt.stages import quantize as quantize_lib

    rng = np.random.default_rng(3)
    even = rng.normal(0, 0.1, (5000, 16)).astype(np.float32)
    scales = quantize_lib._column_scales(even)
    assert scales is not None and scales.shape == (16,)
    np.testing.assert_allclose(scales, np.abs(even).max(axis=0) / 127, rtol=1e-6)
    q = quantize_lib._quantize_columns(even, scales)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    # Within half a step of every value.
    assert (np.abs(q * scales - even) <= scales / 2 + 1e-7).all()
    # A few rows a hundred times larger: a column's step would be too coarse for the rest.
    uneven = even.copy()
    uneven[:50] *= 100
    assert quantize_lib._column_scales(uneven) is None


@pytest.mark.parametrize("consumer", ["SparseSegmentMean", "SparseSegmentSum",
                                      "SparseSegmentMean of other rows",
                                      "SparseSegmentMean as TF 1.x wrote it",
                                      "SparseSegmentMean of rows a signature returns",
                                      "Identity"])
def test_column_scales_serve_the_dequantized_rows_after_a_segment_reduction_or_first(
        consumer):
    """A scale per column is applied after a segment sum or mean of the gathered rows (the
    same numbers, fewer to scale) and right after the gather for any other reader. A sum or
    mean that reads the rows back through ``Unique``'s idx reads them gathered in request
    order instead, without ``Unique``."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2, types_pb2

    from serving_opt.savedmodel.graph import attr, make_node, var_handle
    from serving_opt.stages import quantize as quantize_lib

    table = np.random.default_rng(9).normal(0, 0.1, (50, 8)).astype(np.float32)
    scales = quantize_lib._column_scales(table)
    stored = quantize_lib._quantize_columns(table, scales)
    want_rows = stored.astype(np.float32) * scales  # independently, from the stored arrays
    i64, i32 = attr(type=types_pb2.DT_INT64), attr(type=types_pb2.DT_INT32)
    f32 = attr(type=types_pb2.DT_FLOAT)
    reduction = consumer.split()[0]
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend([
        var_handle("q", types_pb2.DT_INT8, table.shape),
        make_node("ids", "Placeholder", dtype=i64),
        make_node("segments", "Placeholder", dtype=i32),
        make_node("picks", "Placeholder", dtype=i32),
        make_node("unique", "Unique", ["ids"], T=i64, out_idx=i32),
        make_node("gather", "ResourceGather", ["table", "unique"], dtype=f32, Tindices=i64,
                  batch_dims=attr(i=0), validate_indices=attr(b=True)),
        make_node("out", "Identity", ["gather"], T=f32) if consumer == "Identity" else
        make_node("out", reduction, ["gather", "picks" if "other" in consumer else "unique:1",
                                     "segments"], T=f32, Tidx=i32,
                  **({} if "1.x" in consumer else {"Tsegmentids": i32}))])
    nodes = {n.name: n for n in graph_def.node}
    new_nodes = []
    quantize_lib._gather_rows(nodes["gather"], nodes, "q", None, types_pb2.DT_INT8, new_nodes,
                              column_scales=scales, outputs=frozenset(
                                  ["gather"] if "signature" in consumer else []))
    graph_def.node.extend(new_nodes)
    in_order = "Segment" in consumer and "other" not in consumer and "signature" not in consumer
    assert (nodes["gather"].op, nodes["out"].op) == \
        (("Identity", "Mul") if consumer != "Identity" else ("Mul", "Identity"))
    unscaled = {n.name: n for n in new_nodes}.get(f"out/{quantize_lib._SCOPE}/unscaled")
    assert consumer == "Identity" or unscaled.op == (
        reduction.replace("Sparse", "") if in_order else reduction)
    if in_order:  # an attr without a default: what TF 1.x's int32 segment ids imply
        assert unscaled.attr["Tindices"].type == types_pb2.DT_INT32
    rows = {n.name: n for n in new_nodes}[f"gather/{quantize_lib._SCOPE}/rows"]
    assert rows.input[1] == ("ids" if in_order else "unique")
    ids = np.array([4, 7, 4, 0, 49, 7], np.int64)
    segments = np.array([0, 0, 1, 1, 1, 2], np.int32)
    picks = np.array([3, 2, 0, 1, 1, 0], np.int32)  # rows of Unique's output, any order
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.raw_ops.AssignVariableOp(resource=g.get_tensor_by_name("q:0"),
                                                 value=stored))
            got = sess.run("out:0", {"ids:0": ids, "segments:0": segments, "picks:0": picks})
    first = np.sort(np.unique(ids, return_index=True)[1])
    unique_rows = want_rows[ids[first]]  # Unique's order: as the ids first appear
    combine = np.sum if reduction == "SparseSegmentSum" else np.mean
    read = unique_rows[picks] if "other" in consumer else want_rows[ids]
    want = unique_rows if consumer == "Identity" else np.stack(
        [combine(read[segments == s], axis=0) for s in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
