"""A ragged argument that tf.saved_model.save flattens into several signature inputs (flat
values + row splits) is synthesized as one valid ragged tensor, found from the protos
(the wrapper's call into the traced function and its input signature), not from names.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from serving_opt.savedmodel import composite_inputs, inputs, loader  # noqa: E402


class _Ragged(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64),
                                  tf.TensorSpec([None], tf.float32, name="scale")])
    def rank1(self, ids, scale):
        rows = tf.reduce_sum(tf.gather(self.w, tf.clip_by_value(ids, 0, 5)), axis=1)
        return {"sum": rows * scale[:, None]}

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None, None], tf.float32)])
    def rank2(self, x):
        # Every row split is checked: an invalid one fails, as in TF Serving.
        return {"total": tf.reduce_sum(tf.reduce_sum(x, axis=2), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="x"),
                                  tf.TensorSpec([None], tf.int64, name="x_1")])
    def named_alike(self, x, x_1):
        return {"y": x + x_1}


@pytest.fixture(scope="module")
def ragged_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ragged") / "1")
    module = _Ragged()
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.rank1, "rank2": module.rank2,
        "named_alike": module.named_alike})
    meta_graph = loader.find_meta_graph(loader.read_saved_model(path), ["serve"], path)
    return path, meta_graph


def test_the_parts_of_a_ragged_argument_are_found_from_the_graph(ragged_model):
    _, meta_graph = ragged_model
    parts = composite_inputs.ragged_parts(meta_graph, "serving_default")
    assert {a: p.index for a, p in parts.items()} == {"ids": 0, "ids_1": 1}
    assert "scale" not in parts
    rank2 = composite_inputs.ragged_parts(meta_graph, "rank2")
    assert sorted((p.index, a) for a, p in rank2.items()) == [(0, "x"), (1, "x_1"), (2, "x_2")]
    assert len({p.group for p in rank2.values()}) == 1
    # The same names on plain tensors: not ragged (names decide nothing).
    assert composite_inputs.ragged_parts(meta_graph, "named_alike") == {}


@pytest.mark.parametrize("key", ["serving_default", "rank2"])
def test_synthesized_ragged_inputs_run_on_the_original(ragged_model, key):
    path, meta_graph = ragged_model
    signature = tf.saved_model.load(path).signatures[key]
    feeds = inputs.signature_feeds(meta_graph, path, seed=3)(key, 4, 2)
    assert feeds.source == "synthesized"
    for batch in feeds.batches:
        out = signature(**{a: tf.constant(v) for a, v in batch.items()})
        assert all(np.all(np.isfinite(t.numpy())) for t in out.values())
    # Control: the inputs drawn one by one, as before, are not a ragged tensor.
    raw = inputs.inputs_for_signature(meta_graph.graph_def, key, meta_graph.signature_def[key],
                                      inputs.InputSynthesizer(seed=3), batch_size=4)
    with pytest.raises(tf.errors.InvalidArgumentError):
        for batch in raw.batches:
            signature(**{a: tf.constant(v) for a, v in batch.items()})
