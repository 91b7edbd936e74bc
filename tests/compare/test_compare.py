"""serving-opt compare: both models on every example of sharded TFRecords, on Beam's
DirectRunner, checked against an independent numpy computation over the same examples."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("apache_beam")

import tensorflow as tf  # noqa: E402

from serving_opt import samples
from serving_opt.compare import CompareOptions, compare, format_report  # noqa: E402
from serving_opt.core import gates  # noqa: E402
from serving_opt.errors import ServingOptError  # noqa: E402
from serving_opt.options import BuildOptions, GateOptions, InputOptions, MeasureOptions
from serving_opt.savedmodel import loader
from serving_opt.savedmodel.loader import run_signature  # noqa: E402


def write_shards(directory: str, records: list[bytes], shards: int) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"part-{s:02d}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for r in records[s::shards]:
                w.write(r)
        paths.append(path)
    return paths


def keyed(paths: list[str], records: list[bytes], shards: int) -> tuple[list[str], list[bytes]]:
    """The keys compare gives (``<shard>:<index>``), in the same order as the records."""
    keys, ordered = [], []
    for s, path in enumerate(paths):
        for i, r in enumerate(records[s::shards]):
            keys.append(f"{path}:{i}")
            ordered.append(r)
    return keys, ordered


def answers(model_dir: str, signature: str, records: list[bytes]) -> dict:
    """The model's outputs for ``records``, in one session run per 500 records."""
    sess, mg = loader.load_session(model_dir)
    try:
        sig = mg.signature_def[signature]
        alias = next(iter(sig.inputs))
        parts = [run_signature(sess, sig, {alias: np.array(records[i:i + 500], dtype=object)})
                 for i in range(0, len(records), 500)]
    finally:
        sess.close()
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def output(report, signature: str, name: str):
    return next(o for o in report.outputs if o.signature == signature and o.output == name)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    records = samples.sample_examples(3000, seed=7)
    paths = write_shards(str(tmp_path_factory.mktemp("examples")), records, 4)
    keys, ordered = keyed(paths, records, 4)
    return os.path.dirname(paths[0]) + "/part-*.tfrecord", keys, ordered


@pytest.mark.golden
def test_identical_models_match_on_every_example(classifier_dir, shards):
    pattern, keys, _ = shards
    report = compare(classifier_dir, classifier_dir, pattern)
    assert report.ok, format_report(report)
    assert report.examples == len(keys) == 3000 and report.shards == 4
    assert {o.signature for o in report.outputs} == {"serving_default", "classification",
                                                     "predict"}
    for o in report.outputs:
        assert o.examples == 3000 and o.mismatches == 0 and not o.worst
    assert output(report, "predict", "probabilities").top1_agreement == 1.0
    assert "OK" in format_report(report)


def perturb(model_dir: str, destination: str, variable: str, delta: float) -> str:
    """A copy of the model with one element of one variable changed in its checkpoint."""
    shutil.copytree(model_dir, destination)
    prefix = os.path.join(destination, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    values = [reader.get_tensor(n) for n in names]
    index = names.index(variable)
    changed = values[index].copy()
    changed.flat[0] += delta
    values[index] = changed
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=values)
    return destination


def test_perturbed_weight_found_exactly(classifier_dir, shards, tmp_path):
    pattern, keys, records = shards
    weights = [n for n in tf.train.load_checkpoint(
        os.path.join(classifier_dir, "variables", "variables")).get_variable_to_shape_map()
        if n.startswith("logits_layer") and "kernel" in n]
    candidate = perturb(classifier_dir, str(tmp_path / "perturbed"), weights[0], 0.5)
    report = compare(classifier_dir, candidate, pattern,
                     CompareOptions(signatures=("predict",), worst_k=5, batch_size=128))
    assert not report.ok
    b, c = answers(classifier_dir, "predict", records), answers(candidate, "predict", records)
    for name in ("probabilities", "logits"):
        got = output(report, "predict", name)
        ref, cand = b[name].astype(np.float64), c[name].astype(np.float64)
        close = np.isclose(cand, ref, atol=gates.DEFAULT_ATOL, rtol=gates.DEFAULT_RTOL)
        diff = np.abs(cand - ref)
        assert got.mismatches == int((~close).sum()) > 0
        assert got.mismatched_examples == int((~close).any(axis=1).sum())
        # Float32 kernels round a row slightly differently at other batch sizes (compare
        # batches by 128, this test by 500): a few float32 ulps of the largest value.
        ulps = 4 * float(np.finfo(np.float32).eps) * max(1.0, float(np.abs(ref).max()))
        assert got.max_abs_diff == pytest.approx(diff.max(), abs=ulps)
        assert got.mean_abs_diff == pytest.approx(diff.mean(), rel=1e-6)
        assert sum(got.histogram.values()) == diff.size
        row = diff.max(axis=1)
        order = sorted((i for i in range(len(keys)) if row[i] > 0),
                       key=lambda i: (-row[i], keys[i]))[:5]
        assert [k for k, _ in got.worst] == [keys[i] for i in order]
        assert [s for _, s in got.worst] == pytest.approx([row[i] for i in order])
    probs = output(report, "predict", "probabilities")
    agree = b["probabilities"].argmax(1) == c["probabilities"].argmax(1)
    assert probs.top1_agreement == pytest.approx(agree.mean())
    moved = {(x, y): n for x, y, n in probs.confusion}
    assert sum(moved.values()) == len(records)
    ids = output(report, "predict", "class_ids")
    assert ids.mismatches == int((b["class_ids"] != c["class_ids"]).sum())
    text = format_report(report)
    assert "DIFFERENT" in text and probs.worst[0][0] in text


def lossy_verdict(b: dict, c: dict, gate: gates.LossyGate) -> set[str]:
    """The outputs the lossy gate must refuse, from both models' answers computed here:
    probabilities/scores by top-1 agreement and max error, integer and string outputs by
    the share of rows that differ, other floats (logits) never (gates.LossyGate)."""
    failing = set()
    for name, ref in b.items():
        cand = c[name]
        rows = len(ref)
        if ref.dtype.kind == "f":
            if name in gates.PROBABILITY_OUTPUTS:
                agreement = float((ref.argmax(1) == cand.argmax(1)).mean())
                error = float(np.abs(ref.astype(np.float64) - cand).max())
                if agreement < gate.min_top1_agreement or error > gate.max_probability_error:
                    failing.add(name)
        else:
            differing = int((ref != cand).reshape(rows, -1).any(axis=1).sum())
            if differing / rows > 1 - gate.min_top1_agreement:
                failing.add(name)
    return failing


# The embedding table only, kept a variable and gathered quantized: no weight is
# dequantized at load, so a refusal by a gate is final (no retry with fewer weights
# quantized). Judged on top-1 alone (max_probability_error=1).
TABLE_INT8 = dict(build=BuildOptions(quantize="int8", quantize_min_elements=100_000,
                                     freeze_max_bytes=512 * 1024),
                  measure=MeasureOptions(benchmark_runs=0, cold_start=False))
TABLE_INT8_GATE = dict(max_probability_error=1.0)


@pytest.fixture(scope="module")
def table_int8_candidate(text_classifier_base, tmp_path_factory) -> tuple[str, str]:
    """The text classifier with its table int8, published with the gate off: a lossy
    candidate whose answers compare must count (source, candidate version directory)."""
    from serving_opt import sandbox
    from serving_opt.options import TrustOptions
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    source = os.path.join(text_classifier_base, "1")
    # In process (no sandbox: a candidate to compare is the subject, and the sandboxed
    # optimize below builds the same one).
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "switched off by the test")
        published = optimize(source, str(tmp_path_factory.mktemp("probe")), OptimizeOptions(
            gate=GateOptions(min_top1_agreement=0.0, **TABLE_INT8_GATE),
            trust=TrustOptions(allow_unsandboxed=True), **TABLE_INT8)).output_dir
    return source, published


def test_quantized_candidate_agreement_counted(table_int8_candidate, tmp_path):
    from conftest import TEXT_CLASSIFIER_VOCAB

    source, published = table_int8_candidate
    records = samples.text_examples(2000, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB)
    paths = write_shards(str(tmp_path / "text"), records, 3)
    _, ordered = keyed(paths, records, 3)
    report = compare(source, published, str(tmp_path / "text" / "part-*"),
                     CompareOptions(signatures=("predict",)))
    b, c = answers(source, "predict", ordered), answers(published, "predict", ordered)
    agree = int((b["probabilities"].argmax(1) == c["probabilities"].argmax(1)).sum())
    got = output(report, "predict", "probabilities")
    assert got.top1_rows == 2000
    assert got.top1_agreement == agree / 2000
    assert output(report, "predict", "class_ids").top1_agreement == \
        float((b["class_ids"] == c["class_ids"]).mean())
    # Float32 kernels round a row slightly differently at other batch sizes: a few ulps
    # of a probability (<= 1), so the difference of two is known to ~1e-7 absolute.
    assert got.max_abs_diff == pytest.approx(
        np.abs(b["probabilities"].astype(np.float64) - c["probabilities"]).max(), abs=1e-6)
    # The verdict itself, for the default lossy gate and for one loose enough to pass.
    assert not any(e["baseline_only"] or e["candidate_only"] for e in report.errors)
    for gate in (gates.LossyGate(), gates.LossyGate(min_top1_agreement=0.9,
                                                      max_probability_error=1.0)):
        expected = {f"predict/{name}" for name in lossy_verdict(b, c, gate)}
        assert {f.split(":")[0] for f in report.failures(gate)} == expected, gate
    assert report.failures(gates.LossyGate(min_top1_agreement=0.9,
                                            max_probability_error=1.0)) == []


def test_missing_empty_and_malformed_shards_named(classifier_dir, tmp_path):
    with pytest.raises(ServingOptError, match="matches no files"):
        compare(classifier_dir, classifier_dir, str(tmp_path / "nothing-*.tfrecord"))

    good = write_shards(str(tmp_path / "a"), samples.sample_examples(20), 1)[0]
    empty = tmp_path / "a" / "part-99.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(ServingOptError, match=f"shard {empty} is empty"):
        compare(classifier_dir, classifier_dir, str(tmp_path / "a" / "part-*"))

    # A TFRecord cut in the middle of a record.
    data = open(good, "rb").read()
    cut = tmp_path / "b" / "part-00.tfrecord"
    cut.parent.mkdir()
    cut.write_bytes(data[:len(data) - 30])
    with pytest.raises(ServingOptError, match=f"shard {cut} record 19 is truncated"):
        compare(classifier_dir, classifier_dir, str(cut))

    # Valid framing, but a record that is not a tf.Example.
    bad = tmp_path / "c" / "part-00.tfrecord"
    bad.parent.mkdir()
    with tf.io.TFRecordWriter(str(bad)) as w:
        w.write(samples.sample_examples(1)[0])
        w.write(b"\xff\xff\xff not a proto")
    # Read by the pipeline's shard reader, in process: how a reader's error reaches the
    # user through the sandboxed pipeline is the truncated record's run above.
    from serving_opt.compare import pipeline as pipeline_lib

    with pytest.raises(RuntimeError, match=f"shard {bad} record 1 is not a serialized "
                                           "tf.Example"):
        list(pipeline_lib.ReadShard().process(str(bad)))

    junk = tmp_path / "d" / "part-00.tfrecord"
    junk.parent.mkdir()
    junk.write_bytes(b"hello, this is text and not records\n")
    with pytest.raises(ServingOptError, match=f"shard {junk} is neither a TFRecord"):
        compare(classifier_dir, classifier_dir, str(junk))


def test_cli_two_workers_and_beam_args(classifier_dir, shards, tmp_path, capsys):
    from serving_opt.cli.main import main

    pattern, _, _ = shards
    report_path = tmp_path / "compare.json"
    code = main(["serving-opt", "compare", f"--baseline={classifier_dir}",
                 f"--candidate={classifier_dir}", f"--examples={pattern}",
                 "--signatures=predict", "--direct_num_workers=2", f"--report={report_path}",
                 "--", "--direct_running_mode=multi_processing"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3000 examples from 4 shard(s)" in out and "2 workers" in out
    import json

    assert json.loads(report_path.read_text())["examples"] == 3000


def test_missing_beam_is_one_clear_line(monkeypatch):
    import builtins

    from serving_opt.compare import require_beam

    real = builtins.__import__

    def no_beam(name, *args, **kwargs):
        if name == "apache_beam" or name.startswith("apache_beam."):
            raise ImportError("No module named 'apache_beam'", name="apache_beam")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_beam)
    with pytest.raises(ServingOptError, match=r"pip install serving-opt\[beam\]"):
        require_beam()


def test_optimize_compare_examples_gate(classifier_dir, shards, tmp_path):
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    pattern, _, _ = shards
    report = optimize(classifier_dir, str(tmp_path / "models"), OptimizeOptions(
        gate=GateOptions(compare_examples=pattern),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False)))
    assert os.path.isdir(report.output_dir)
    assert any(s.name == "compare" and "3000 examples: ok" in s.note for s in report.stages)


def robust_top1(probabilities: np.ndarray, margin: float = 1e-5) -> np.ndarray:
    """Rows whose top class leads the runner-up by more than ``margin``: their top-1 is
    the same at any batch size (float32 rounding moves a probability by ~1e-7)."""
    top2 = np.sort(probabilities, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] > margin


def test_optimize_refuses_what_compare_finds_and_publishes_nothing(table_int8_candidate,
                                                                   tmp_path):
    """The parity gate sees rows the int8 table answers like the float one; the
    --compare_examples shards hold rows whose top-1 class it flips: optimize refuses."""
    from conftest import TEXT_CLASSIFIER_VOCAB

    from serving_opt.errors import ParityError
    from serving_opt.pipeline.optimizer import OptimizeOptions, optimize

    # First run (the fixture), gate off: the candidate, to find which rows it flips; the
    # second builds the same candidate (TABLE_INT8), so a refusal is final.
    source, candidate = table_int8_candidate
    records = samples.text_examples(2000, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB)
    b, c = answers(source, "predict", records), answers(candidate, "predict", records)
    robust = robust_top1(b["probabilities"]) & robust_top1(c["probabilities"])
    same = b["probabilities"].argmax(1) == c["probabilities"].argmax(1)
    flipped = [r for r, s, ok in zip(records, same, robust) if ok and not s]
    agreeing = [r for r, s, ok in zip(records, same, robust) if ok and s]
    assert flipped, "int8 flips no row of 2000: pick another seed"
    parity_examples = write_shards(str(tmp_path / "parity"), agreeing[:256], 1)[0]
    evaluation = flipped + agreeing[256:356]
    write_shards(str(tmp_path / "eval"), evaluation, 2)
    pattern = str(tmp_path / "eval" / "part-*")
    # What the gate must say about the evaluation set, computed here for every signature
    # (all three take serialized tf.Examples).
    gate = gates.LossyGate()
    expected = set()
    for signature in ("classification", "predict", "serving_default"):
        expected |= {f"{signature}/{name}" for name in lossy_verdict(
            answers(source, signature, evaluation), answers(candidate, signature, evaluation),
            gate)}
    assert {"predict/probabilities", "predict/class_ids", "serving_default/scores"} <= expected

    base = tmp_path / "models"
    with pytest.raises(ParityError) as failure:
        optimize(source, str(base), OptimizeOptions(
            inputs=InputOptions(examples=parity_examples),
            gate=GateOptions(compare_examples=pattern, min_top1_agreement=gate.min_top1_agreement,
                             **TABLE_INT8_GATE),
            **TABLE_INT8))
    report = failure.value.report
    assert report.parity is not None and report.parity.ok  # parity passed; compare refused
    stages = {s.name: s.note for s in report.stages}
    assert stages["compare"].startswith(f"{len(evaluation)} examples: ")
    problem = failure.value.problem
    assert problem.startswith(f"compare on {pattern}: ") and "nothing was published" in problem
    assert any(f"{name}: " in problem for name in expected), problem
    assert not report.published and report.output_dir is None
    assert os.listdir(base) == []  # no version, no staging or scratch directory left


def test_shard_errors_come_before_the_sandboxed_pipeline_starts(classifier_dir, tmp_path,
                                                                 monkeypatch):
    """A missing, empty or unreadable --examples is a usage error: named here, with no
    worker started (no TensorFlow or Beam import in a sandbox for it)."""
    from serving_opt import sandbox as sandbox_lib

    def no_worker(*args, **kwargs):
        raise AssertionError("a sandboxed worker was started")

    monkeypatch.setattr(sandbox_lib, "call", no_worker)
    with pytest.raises(ServingOptError, match="matches no files"):
        compare(classifier_dir, classifier_dir, str(tmp_path / "nothing-*.tfrecord"))
    empty = tmp_path / "part-0.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(ServingOptError, match=f"shard {empty} is empty"):
        compare(classifier_dir, classifier_dir, str(tmp_path / "part-*"))
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"{not json\n")
    with pytest.raises(ServingOptError, match=f"shard {junk} line 1 is not valid JSON"):
        compare(classifier_dir, classifier_dir, str(junk))
