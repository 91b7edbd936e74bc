"""Routes the static check once could not see: graphs hidden in data, attr placeholders
bound by callers, and an escaping asset name.

1. A ``DatasetFromGraph`` over a serialized tf.data graph held in a string Const: the
   graph is parsed and checked like the model's own; a graph the check cannot read (a
   computed string) refuses the op.
2. Attribute placeholders: a library function's ``PrintV2.output_stream`` or
   ``FixedUnigramCandidateSampler.vocab_file`` bound by the call (``f``'s attr map, a
   placeholder of the caller bound by its own call): judged as bound; unbound is refused.
3. An asset filename leading out of ``assets/`` is refused by the check every command
   runs (``refuse_host_ops``), not only by ``inspect``.

Each model is a real TF export (edited like a crafted model where the route is an edit);
each hostile one is found by ``host_op_uses``, refused by ``refuse_host_ops`` and named
by ``serving-opt inspect``; each benign twin is accepted.
"""

from __future__ import annotations

import os

import pytest
from hostile_models_hidden_routes import (
    build_dataset_from_computed_graph,
    build_dataset_from_graph,
    build_escaping_asset,
    build_print_placeholder,
    build_sampler_placeholder,
    build_tf1_init_op_dataset_from_graph,
    in_memory_dataset,
    nest_in_dataset_from_graph,
    reading_dataset,
    writing_dataset,
)

from serving_opt.cli import main as cli
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import host_ops, loader, untrusted


def _meta_graph(export_dir: str):
    return loader.find_meta_graph(loader.read_saved_model(export_dir), {"serve"})


def _uses(export_dir: str):
    return untrusted.host_op_uses(_meta_graph(export_dir), ["serving_default"])


def _inspect(export_dir: str, capsys) -> tuple[int, str]:
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={export_dir}"])
    out = capsys.readouterr()
    return code, out.out + out.err


def _refused(export_dir: str) -> str:
    with pytest.raises(ServingOptError) as e:
        untrusted.refuse_host_ops(_meta_graph(export_dir), ["serving_default"], "optimize")
    return str(e.value)


# -------------------------------------------------------------------- embedded graphs


def test_dataset_from_graph_reading_a_host_file_is_found_and_named(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    model = build_dataset_from_graph(str(tmp_path / "m" / "1"), reading_dataset(str(secret)))
    uses = _uses(model)
    assert [u.op for u in uses] == ["TextLineDataset"], [u.describe() for u in uses]
    use = uses[0]
    assert use.kind == host_ops.READS_FILES
    assert "inside the graph_def of DatasetFromGraph node 'DatasetFromGraph'" in use.describe()
    assert "signature serving_default" in use.describe()
    assert "TextLineDataset" in _refused(model)
    code, text = _inspect(model, capsys)
    assert code == 1
    assert "file_read_op" in text and "TextLineDataset" in text and "DatasetFromGraph" in text


def test_dataset_from_graph_over_tensors_is_accepted(tmp_path, capsys):
    model = build_dataset_from_graph(str(tmp_path / "m" / "1"), in_memory_dataset)
    assert _uses(model) == []
    untrusted.refuse_host_ops(_meta_graph(model), ["serving_default"], "optimize")
    code, text = _inspect(model, capsys)
    assert code == 0, text


def test_dataset_from_a_graph_the_check_cannot_read_is_refused(tmp_path, capsys):
    model = build_dataset_from_computed_graph(str(tmp_path / "m" / "1"))
    uses = _uses(model)
    assert [(u.op, u.kind) for u in uses] == [("DatasetFromGraph", host_ops.RUNS_GRAPH)]
    assert "StringJoin" in uses[0].reason
    assert "DatasetFromGraph" in _refused(model)
    code, text = _inspect(model, capsys)
    assert code == 1 and "embedded_graph_op" in text


def test_dataset_from_graph_is_never_folded():
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name="d", op="DatasetFromGraph", input=["g"])
    assert host_ops.host_op_kind(node) == host_ops.RUNS_GRAPH


# -------------------------------------------------------------- attribute placeholders


@pytest.mark.parametrize("bound", ["file:///tmp/serving_opt_planted.txt", None])
def test_print_to_a_placeholder_stream_is_found_and_named(tmp_path, capsys, bound):
    model = build_print_placeholder(str(tmp_path / "m" / "1"), bound)
    uses = _uses(model)
    assert [u.op for u in uses] == ["PrintV2"], [u.describe() for u in uses]
    use = uses[0]
    assert use.kind == host_ops.WRITES_FILES
    assert "attr placeholder 'stream'" in use.reason
    assert (bound in use.reason) if bound else ("does not bind it" in use.reason)
    assert "PrintV2" in _refused(model)
    code, text = _inspect(model, capsys)
    assert code == 1 and "file_write_op" in text and "PrintV2" in text


def test_print_to_a_placeholder_bound_to_stderr_is_accepted(tmp_path, capsys):
    model = build_print_placeholder(str(tmp_path / "m" / "1"), "stderr")
    assert _uses(model) == []
    code, text = _inspect(model, capsys)
    assert code == 0, text


def test_sampler_vocab_file_bound_two_calls_up_is_found(tmp_path, capsys):
    model = build_sampler_placeholder(str(tmp_path / "m" / "1"), "/root/.ssh/id_rsa")
    uses = _uses(model)
    assert [u.op for u in uses] == ["FixedUnigramCandidateSampler"], \
        [u.describe() for u in uses]
    assert "'/root/.ssh/id_rsa'" in uses[0].reason
    assert "placeholder 'outer'" in uses[0].reason
    code, text = _inspect(model, capsys)
    assert code == 1 and "FixedUnigramCandidateSampler" in text


@pytest.mark.parametrize("op, attr", [
    ("DecodeProtoV2", "descriptor_source"), ("EncodeProto", "descriptor_source"),
    ("Copy", "debug_ops_spec"), ("CopyHost", "debug_ops_spec"),
    ("PrintV2", "output_stream"), ("FixedUnigramCandidateSampler", "vocab_file"),
])
def test_a_placeholder_on_a_path_attr_counts_until_resolved(op, attr):
    from tensorflow.core.framework import attr_value_pb2, node_def_pb2

    node = node_def_pb2.NodeDef(name="n", op=op)
    node.attr[attr].CopyFrom(attr_value_pb2.AttrValue(placeholder="p"))
    assert host_ops.host_op_kind(node) is not None


# ------------------------------------------------------------------ escaping assets


@pytest.mark.parametrize("filename", ["../../etc/passwd", "/etc/passwd"])
@pytest.mark.parametrize("tf1_collection", [False, True], ids=["asset_file_def", "collection"])
def test_an_escaping_asset_is_refused_by_every_command(tmp_path, capsys, filename,
                                                       tf1_collection):
    model = build_escaping_asset(str(tmp_path / "m" / "1"), filename, tf1_collection)
    uses = _uses(model)
    assert [u.op for u in uses] == ["asset"], [u.describe() for u in uses]
    assert repr(filename) in uses[0].reason
    message = _refused(model)
    assert filename in message and "outside the model" in message
    code, text = _inspect(model, capsys)
    assert code == 1 and "asset_path_escapes" in text


def test_the_escaping_assets_benign_twin_is_accepted(tmp_path):
    model = build_escaping_asset(str(tmp_path / "m" / "1"), "vocab.txt")
    os.makedirs(os.path.join(model, "assets"), exist_ok=True)
    assert _uses(model) == []


def test_a_writing_map_function_in_the_init_ops_embedded_graph_is_found(tmp_path, capsys):
    target = tmp_path / "planted.txt"
    model = build_tf1_init_op_dataset_from_graph(str(tmp_path / "m" / "1"),
                                                 writing_dataset(str(target)))
    uses = _uses(model)
    assert [u.op for u in uses] == ["WriteFile"], [u.describe() for u in uses]
    text = uses[0].describe()
    assert "in function" in text and "inside the graph_def of DatasetFromGraph" in text
    assert "from_graph" in text and "init op" in text
    assert uses[0].signatures == (untrusted.INIT_OP,)
    code, out = _inspect(model, capsys)
    assert code == 1 and "file_write_op" in out and "WriteFile" in out
    assert not target.exists()


def test_the_init_ops_embedded_in_memory_graph_is_accepted(tmp_path):
    model = build_tf1_init_op_dataset_from_graph(str(tmp_path / "m" / "1"),
                                                 in_memory_dataset)
    assert _uses(model) == []


def test_an_embedded_graph_inside_an_embedded_graph_is_read(tmp_path):
    secret = tmp_path / "secret.txt"
    model = build_tf1_init_op_dataset_from_graph(str(tmp_path / "m" / "1"),
                                                 reading_dataset(str(secret)))
    meta_graph = _meta_graph(model)
    nest_in_dataset_from_graph(meta_graph, "embedded_graph")
    uses = untrusted.host_op_uses(meta_graph)
    assert [u.op for u in uses] == ["TextLineDataset"], [u.describe() for u in uses]
    assert uses[0].describe().count("inside the graph_def of DatasetFromGraph") == 2
    assert "node 'nested'" in uses[0].describe()


def test_an_iterator_restored_from_serialized_state_is_refused():
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.node.extend([
        node_def_pb2.NodeDef(name="it", op="IteratorV2"),
        node_def_pb2.NodeDef(name="state", op="Const"),
        node_def_pb2.NodeDef(name="restore", op="DeserializeIterator",
                             input=["it", "state"]),
    ])
    uses = untrusted.host_op_uses(meta_graph)
    assert [(u.op, u.kind) for u in uses] == [("DeserializeIterator", host_ops.RUNS_GRAPH)]


def test_every_call_site_of_a_placeholder_is_judged(tmp_path):
    """One call binds stderr, a second one (a graph-level call nothing runs) a file."""
    model = build_print_placeholder(str(tmp_path / "m" / "1"), "stderr")
    meta_graph = _meta_graph(model)
    printing = next(f.signature.name for f in meta_graph.graph_def.library.function
                    if any(n.op == "PrintV2" for n in f.node_def))
    second = meta_graph.graph_def.node.add(name="second_call", op="StatefulPartitionedCall")
    second.attr["f"].func.name = printing
    second.attr["f"].func.attr["stream"].s = b"file:///tmp/serving_opt_planted.txt"
    uses = untrusted.host_op_uses(meta_graph)
    assert [u.op for u in uses] == ["PrintV2"]
    assert "second_call" in uses[0].reason and "file:///tmp" in uses[0].reason


def test_a_placeholder_in_a_function_only_a_gradient_registration_names_is_refused(tmp_path):
    """Dead, the copy cannot run; registered as a gradient (tf.saved_model.load registers
    it, and nothing binds its placeholder) it is refused."""
    model = build_print_placeholder(str(tmp_path / "m" / "1"), "stderr")
    meta_graph = _meta_graph(model)
    function = next(f for f in meta_graph.graph_def.library.function
                    if any(n.op == "PrintV2" for n in f.node_def))
    copy = meta_graph.graph_def.library.function.add()
    copy.CopyFrom(function)
    copy.signature.name = "uncalled_printer"
    assert untrusted.host_op_uses(meta_graph) == []
    meta_graph.graph_def.library.registered_gradients.add(
        gradient_func="uncalled_printer", registered_op_type="CustomGradient-7")
    uses = untrusted.host_op_uses(meta_graph)
    assert [(u.op, u.function) for u in uses] == [("PrintV2", "uncalled_printer")]
    assert "no node references function uncalled_printer" in uses[0].reason
