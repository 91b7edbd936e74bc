"""A ragged or sparse argument that tf.saved_model.save flattens into several signature
inputs (flat values + row splits; indices + values + dense shape) is synthesized as one
valid tensor, its parts found from the protos (the wrapper's call into the traced
function and that function's input signature), not from their names.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from serving_opt.savedmodel import composite_inputs, inputs, loader  # noqa: E402


class _Composite(tf.Module):
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
        return {"total": tf.reduce_sum(tf.reduce_sum(x, axis=2), axis=1)}

    @tf.function(input_signature=[tf.SparseTensorSpec([None, 4], tf.float32)])
    def sparse(self, x):
        # to_dense checks the indices against the dense shape and their order.
        return {"dense": tf.sparse.to_dense(x) * 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="x"),
                                  tf.TensorSpec([None], tf.int64, name="x_1")])
    def named_alike(self, x, x_1):
        return {"y": x + x_1}


@pytest.fixture(scope="module")
def composite_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("composite") / "1")
    module = _Composite()
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.rank1, "rank2": module.rank2, "sparse": module.sparse,
        "named_alike": module.named_alike})
    meta_graph = loader.find_meta_graph(loader.read_saved_model(path), ["serve"], path)
    return path, meta_graph


def _indices(meta_graph, key):
    parts = composite_inputs.composite_parts(meta_graph, key)
    assert len({p.group for p in parts.values()}) <= 1
    return {alias: (p.kind, p.index) for alias, p in parts.items()}


def test_the_parts_of_an_argument_are_found_from_the_graph(composite_model):
    _, meta_graph = composite_model
    ragged, sparse = composite_inputs.RAGGED, composite_inputs.SPARSE
    assert _indices(meta_graph, "serving_default") == {"ids": (ragged, 0), "ids_1": (ragged, 1)}
    assert _indices(meta_graph, "rank2") == {"x": (ragged, 0), "x_1": (ragged, 1),
                                             "x_2": (ragged, 2)}
    assert _indices(meta_graph, "sparse") == {"x": (sparse, 0), "x_1": (sparse, 1),
                                              "x_2": (sparse, 2)}
    # The same names on plain tensors: not parts of anything (names decide nothing).
    assert composite_inputs.composite_parts(meta_graph, "named_alike") == {}


@pytest.mark.parametrize("key", ["serving_default", "rank2", "sparse"])
def test_synthesized_parts_run_on_the_original(composite_model, key):
    path, meta_graph = composite_model
    signature = tf.saved_model.load(path).signatures[key]
    feeds = inputs.signature_feeds(meta_graph, path, seed=3)(key, 4, 2)
    assert feeds.source == "synthesized"
    for batch in feeds.batches:
        out = signature(**{a: tf.constant(v) for a, v in batch.items()})
        assert all(np.all(np.isfinite(t.numpy())) for t in out.values())
    # Control: the parts drawn one by one, as before, are not one tensor.
    raw = inputs.inputs_for_signature(meta_graph.graph_def, key, meta_graph.signature_def[key],
                                      inputs.InputSynthesizer(seed=3), batch_size=4)
    with pytest.raises(tf.errors.InvalidArgumentError):
        for batch in raw.batches:
            signature(**{a: tf.constant(v) for a, v in batch.items()})
