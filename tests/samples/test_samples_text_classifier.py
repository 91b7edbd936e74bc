"""samples.build_text_classifier: the big-embedding Estimator-like text classifier."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import TEXT_CLASSIFIER_DIM, TEXT_CLASSIFIER_VOCAB

from serving_opt import samples

EMBEDDING = "dnn/input_from_feature_columns/input_layer/text_embedding/embedding_weights"
N_CLASSES = len(samples.TEXT_CLASS_NAMES)


@pytest.fixture(scope="module")
def loaded(text_classifier_base):
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        meta_graph = tf.compat.v1.saved_model.load(
            sess, [tf.compat.v1.saved_model.tag_constants.SERVING],
            os.path.join(text_classifier_base, "1"))
    yield graph, sess, meta_graph
    sess.close()


def _run(sess, signature, feed: list[bytes]) -> dict:
    (inp,) = signature.inputs.values()
    return sess.run({k: v.name for k, v in signature.outputs.items()}, {inp.name: feed})


def test_signatures_match_dnn_classifier_export(loaded):
    _, _, meta_graph = loaded
    sigs = meta_graph.signature_def
    assert set(sigs) == {"serving_default", "classification", "predict"}
    for key in ("serving_default", "classification"):
        assert sigs[key].method_name == "tensorflow/serving/classify"
        assert set(sigs[key].inputs) == {"inputs"}
        assert set(sigs[key].outputs) == {"classes", "scores"}
    assert sigs["predict"].method_name == "tensorflow/serving/predict"
    assert set(sigs["predict"].outputs) == {"logits", "probabilities", "class_ids", "classes"}


def test_classify_and_predict_answer_a_batch_of_texts(loaded):
    _, sess, meta_graph = loaded
    texts = [b"w1 w2 w3", b"", b"w4999 never-seen-word", b"w17 w17 w17 w17"]
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t]))}))
        .SerializeToString() for t in texts] + samples.text_examples(
            4, seed=3, vocab_size=TEXT_CLASSIFIER_VOCAB)
    batch = len(examples)

    classify = _run(sess, meta_graph.signature_def["classification"], examples)
    assert classify["scores"].shape == (batch, N_CLASSES)
    np.testing.assert_allclose(classify["scores"].sum(axis=1), 1.0, rtol=1e-5)
    assert classify["classes"].shape == (batch, N_CLASSES)
    assert [c.decode() for c in classify["classes"][0]] == list(samples.TEXT_CLASS_NAMES)

    predict = _run(sess, meta_graph.signature_def["predict"], examples)
    assert predict["logits"].shape == (batch, N_CLASSES)
    np.testing.assert_allclose(predict["probabilities"], classify["scores"], rtol=1e-6)
    assert predict["class_ids"].shape == (batch, 1)
    np.testing.assert_array_equal(predict["class_ids"][:, 0],
                                  predict["logits"].argmax(axis=1))
    assert [c.decode() for c in predict["classes"][:, 0]] == [
        samples.TEXT_CLASS_NAMES[i] for i in predict["class_ids"][:, 0]]
    # The text matters: different word bags give different answers.
    assert len({row.tobytes() for row in predict["logits"]}) > 1


def test_embedding_is_read_through_a_gather(loaded):
    graph, _, _ = loaded
    gathers = [op for op in graph.get_operations()
               if op.type in ("Gather", "GatherV2", "ResourceGather")
               and any(inp.op.name == EMBEDDING for inp in op.inputs)]
    assert gathers, "the embedding table should be read through a (Resource)Gather"
    table = graph.get_operation_by_name(EMBEDDING)
    assert [d.size for d in table.get_attr("shape").dim] == [
        TEXT_CLASSIFIER_VOCAB + samples.TEXT_OOV_BUCKETS, TEXT_CLASSIFIER_DIM]


def test_checkpoint_holds_slots_and_global_step(text_classifier_base):
    variables = dict(tf.train.list_variables(
        os.path.join(text_classifier_base, "1", "variables", "variables")))
    assert variables["global_step"] == []
    trainable = [name for name in variables
                 if not name.endswith("/Adagrad") and name != "global_step"]
    assert EMBEDDING in trainable
    assert len(trainable) == 7  # the table, 3 kernels, 3 biases
    for name in trainable:
        assert variables[f"{name}/Adagrad"] == variables[name]
    assert variables[EMBEDDING] == [TEXT_CLASSIFIER_VOCAB + samples.TEXT_OOV_BUCKETS,
                                    TEXT_CLASSIFIER_DIM]


def test_without_embedding_slots(tmp_path):
    export_dir = samples.build_text_classifier(
        str(tmp_path / "1"), vocab_size=100, embedding_dim=4, optimizer_slots=False)
    variables = dict(tf.train.list_variables(os.path.join(export_dir, "variables", "variables")))
    assert EMBEDDING in variables and f"{EMBEDDING}/Adagrad" not in variables
    assert "dnn/logits/kernel/Adagrad" in variables and "global_step" in variables


def test_topic_texts_are_mostly_their_labels_words():
    texts, labels = samples.topic_texts(2000, np.random.default_rng(0), 1000)
    topics = samples.word_topics(1000)
    own = total = 0
    for text, label in zip(texts, labels):
        ids = [int(w[1:]) for w in text.decode().split() if w.startswith("w")]
        own += sum(topics[i] == label for i in ids)
        total += len(ids)
    # 0.6 drawn from the label's words, plus the 1/20 of the rest that land there.
    assert 0.6 < own / total < 0.7
    lengths = [len(t.split()) for t in texts]
    assert min(lengths) == 0 and max(lengths) == 12


def test_a_trained_classifier_answers_its_texts_topic(tmp_path):
    """``train_examples``: trained as Estimator trains (then exported from a fresh graph),
    so most answers are the label and clear, unlike the random sample's."""
    texts, labels = samples.topic_texts(1000, np.random.default_rng(5), 2000)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t]))}))
        .SerializeToString() for t in texts]
    accuracy = {}
    for train in (0, 100_000):
        export_dir = samples.build_text_classifier(
            str(tmp_path / str(train) / "1"), vocab_size=2000, embedding_dim=16,
            optimizer_slots=False, train_examples=train)
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
            meta_graph = tf.compat.v1.saved_model.load(sess, ["serve"], export_dir)
            got = _run(sess, meta_graph.signature_def["predict"], examples)
        accuracy[train] = np.mean(got["class_ids"].reshape(-1) == labels)
    assert accuracy[0] < 0.15  # chance is 0.05
    assert accuracy[100_000] > 0.5
    variables = dict(tf.train.list_variables(str(tmp_path / "100000" / "1" / "variables" /
                                                 "variables")))
    assert not any("Adam" in name for name in variables)  # the optimizer's slots stay behind


@pytest.mark.parametrize("flag", ["--train_examples=-1", "--vocab_size=0",
                                  "--embedding_dim=0"])
def test_the_samples_cli_refuses_bad_sizes_before_any_work(flag, tmp_path, capsys):
    from serving_opt.samples import cli

    out = tmp_path / "1"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--kind=text_classifier", f"--output_dir={out}", flag])
    assert exit_info.value.code == 2
    assert f"{flag.split('=')[0][2:]} must be >=" in capsys.readouterr().err
    assert not out.exists()


def test_a_negative_training_size_is_refused_by_the_api(tmp_path):
    with pytest.raises(ValueError, match="train_examples must be >= 0"):
        samples.build_text_classifier(str(tmp_path / "1"), train_examples=-1)
    assert not (tmp_path / "1").exists()
