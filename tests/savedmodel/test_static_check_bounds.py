"""The static check's work is bounded by the graph's size, not by its number of paths.

An attr placeholder passed down k calls per level over d levels is bound along k**d
chains of references: a 15 KB graph with 7 ways over 8 levels is 5.7 million chains.
The check resolves each (function, placeholder) once, keeps only the distinct values
that reach it, and refuses the op past a documented work limit instead of guessing.
"""

from __future__ import annotations

import pytest

from serving_opt.cli import main as cli
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import host_ops, untrusted
from serving_opt.savedmodel.untrusted import node_rules as untrusted_nodes
from serving_opt.savedmodel.untrusted import reach as untrusted_graph
from serving_opt.savedmodel.untrusted import saver_shape as untrusted_saver

STDERR = b"stderr"
PLANTED = b"file:///tmp/serving_opt_planted.txt"


def _chain_model(ways: int, levels: int, top: list[bytes | None], hidden: bytes | None = None):
    """A MetaGraphDef whose ``f0`` prints to its attr placeholder ``stream``; ``f<i>``
    calls ``f<i-1>`` ``ways`` times, each call passing its own ``stream`` on, and the
    graph calls ``f<levels-1>`` once per value of ``top`` (None: binds nothing). With
    ``hidden``, the last call in ``f1`` binds that value instead of passing it on."""
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.meta_info_def.tags.append("serve")
    library = meta_graph.graph_def.library
    f0 = library.function.add()
    f0.signature.name = "f0"
    f0.signature.attr.add(name="stream", type="string")
    printer = f0.node_def.add(name="print", op="PrintV2")
    printer.attr["output_stream"].placeholder = "stream"
    for level in range(1, levels):
        function = library.function.add()
        function.signature.name = f"f{level}"
        function.signature.attr.add(name="stream", type="string")
        for way in range(ways):
            call = function.node_def.add(name=f"call{way}", op="StatefulPartitionedCall")
            call.attr["f"].func.name = f"f{level - 1}"
            bound = call.attr["f"].func.attr["stream"]
            if hidden is not None and level == 1 and way == ways - 1:
                bound.s = hidden
            else:
                bound.CopyFrom(attr_value_pb2.AttrValue(placeholder="stream"))
    for index, value in enumerate(top):
        call = meta_graph.graph_def.node.add(name=f"top{index}", op="StatefulPartitionedCall")
        call.attr["f"].func.name = f"f{levels - 1}"
        if value is not None:
            call.attr["f"].func.attr["stream"].s = value
    signature = meta_graph.signature_def["serving_default"]
    signature.outputs["y"].name = "top0:0"
    return meta_graph


def test_seven_ways_over_eight_levels_is_resolved_in_few_steps():
    meta_graph = _chain_model(7, 8, [STDERR, STDERR])
    graph = untrusted_graph._Graph(meta_graph.graph_def)
    bindings = untrusted_nodes._bindings(graph, "f0", "stream")
    assert [value.s for value, _ in bindings] == [STDERR]
    # One step per (reference, distinct value) per function: 7 x 7 + 2, far from 7**8.
    assert graph.binding_work <= 7 * 8 + 2
    assert untrusted.host_op_uses(meta_graph) == []


def test_a_file_binding_among_millions_of_chains_is_found(monkeypatch):
    # The whole check, every (function, placeholder) of the graph, stays within 2,000
    # steps: 5.7 million chains would exhaust any limit.
    monkeypatch.setattr(untrusted_nodes, "_MAX_BINDING_WORK", 2_000)
    meta_graph = _chain_model(7, 8, [STDERR, STDERR, PLANTED])
    uses = untrusted.host_op_uses(meta_graph)
    assert [(u.op, u.function, u.kind) for u in uses] == [
        ("PrintV2", "f0", host_ops.WRITES_FILES)]
    assert "top2" in uses[0].reason and "serving_opt_planted" in uses[0].reason
    with pytest.raises(ServingOptError, match="PrintV2 node 'print' in function f0"):
        untrusted.refuse_host_ops(meta_graph, ["serving_default"], "optimize")


def test_an_unbound_chain_among_millions_is_refused(monkeypatch):
    monkeypatch.setattr(untrusted_nodes, "_MAX_BINDING_WORK", 2_000)
    uses = untrusted.host_op_uses(_chain_model(7, 8, [STDERR, None]))
    assert [u.op for u in uses] == ["PrintV2"]
    assert "top1" in uses[0].reason and "does not bind it" in uses[0].reason


def test_twenty_levels_pass_the_binding_depth_and_are_refused_unresolved(monkeypatch):
    monkeypatch.setattr(untrusted_nodes, "_MAX_BINDING_WORK", 2_000)
    uses = untrusted.host_op_uses(_chain_model(7, 20, [STDERR]))
    assert [u.op for u in uses] == ["PrintV2"]
    assert f"more than {untrusted_nodes._MAX_BINDING_DEPTH} calls up" in uses[0].reason


def test_a_hostile_binding_on_one_of_many_paths_is_found():
    """The control of the memo: only one of 3**4 chains binds a file, deep down."""
    benign = _chain_model(3, 5, [STDERR])
    assert untrusted.host_op_uses(benign) == []
    uses = untrusted.host_op_uses(_chain_model(3, 5, [STDERR], hidden=PLANTED))
    assert [u.op for u in uses] == ["PrintV2"]
    assert "call2 in function f1" in uses[0].reason and "serving_opt_planted" in uses[0].reason


def test_past_the_work_limit_the_op_is_refused_naming_the_limit(monkeypatch):
    """The limit's control: the same benign model, refused rather than guessed."""
    monkeypatch.setattr(untrusted_nodes, "_MAX_BINDING_WORK", 20)
    with pytest.raises(ServingOptError) as e:
        untrusted.refuse_host_ops(_chain_model(7, 8, [STDERR]), ["serving_default"], "optimize")
    assert "more than 20 steps (the check's limit)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_dag_of_shared_name_inputs_is_judged_in_few_steps():
    """A checkpoint file name built from a Pack of one node eight times, level after
    level: 8**16 paths through 16 nodes, judged once each."""
    from tensorflow.core.framework import node_def_pb2

    body = {"prefix": node_def_pb2.NodeDef(name="prefix", op="Placeholder")}
    below = "prefix"
    for level in range(40):
        body[f"p{level}"] = node_def_pb2.NodeDef(name=f"p{level}", op="Pack",
                                                 input=[below] * 8)
        below = f"p{level}"
    names = untrusted_saver._FileNames(body, "prefix")
    assert names.from_prefix("p40") is False  # no such node
    assert names.from_prefix("p39") is False  # past the name depth, never the prefix
    assert names.from_prefix("p15") is True
    assert len(names.memo) <= 2 * 41 * (untrusted_graph._MAX_NAME_DEPTH + 2)


def test_inspect_of_the_seven_by_eight_model_finishes_and_names_the_file(tmp_path, capsys,
                                                                          monkeypatch):
    from tensorflow.core.protobuf import saved_model_pb2

    monkeypatch.setattr(untrusted_nodes, "_MAX_BINDING_WORK", 2_000)
    model = tmp_path / "m" / "1"
    model.mkdir(parents=True)
    saved_model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    saved_model.meta_graphs.add().CopyFrom(_chain_model(7, 8, [STDERR, PLANTED]))
    (model / "saved_model.pb").write_bytes(saved_model.SerializeToString())
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={model}"])
    out = capsys.readouterr()
    assert code == 1
    assert "serving_opt_planted" in out.out and "risks: none found" not in out.out


def _signatures_over_a_chain(nodes: int, signatures: int, cycle: bool = False):
    """A chain of Identity nodes over a WriteFile, every signature fetching its end;
    with ``cycle``, the WriteFile's input is the chain's middle (a loop, like a TF1
    while loop's NextIteration)."""
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_graph = meta_graph_pb2.MetaGraphDef()
    graph_def = meta_graph.graph_def
    graph_def.node.add(name="write", op="WriteFile",
                       input=[f"n{nodes // 2}"] if cycle else [])
    below = "write"
    for index in range(nodes):
        graph_def.node.add(name=f"n{index}", op="Identity", input=[below])
        below = f"n{index}"
    for index in range(signatures):
        meta_graph.signature_def[f"s{index:04d}"].outputs["y"].name = below + ":0"
    return meta_graph


@pytest.mark.parametrize("cycle", [False, True], ids=["chain", "loop"])
def test_many_signatures_over_many_nodes_are_walked_once(monkeypatch, cycle):
    """Which signatures reach a node is one pass over the graph, not one per signature
    (2,000 x 2,000 places: seconds and gigabytes before)."""
    calls = []
    successors = untrusted_graph._Graph.successors

    def counted(self, place):
        calls.append(place)
        return successors(self, place)

    monkeypatch.setattr(untrusted_graph._Graph, "successors", counted)
    uses = untrusted.host_op_uses(_signatures_over_a_chain(2_000, 2_000, cycle))
    assert [(u.op, u.name) for u in uses] == [("WriteFile", "write")]
    assert len(uses[0].signatures) == 2_000
    assert "reached from signature s0000" in uses[0].route
    # Two passes for the masks, one walk for the route, one for what may run at all
    # (dead functions): 4 x 2,001 places, not 4 million.
    assert len(calls) <= 4 * 2_001


def _spare_restores(restores: int, chain: int):
    """``restores`` RestoreV2 ops outside any saver_def, each reading the file name
    placeholder and running (by control input) the end of a ``chain`` of NoOps."""
    from tensorflow.core.protobuf import meta_graph_pb2

    meta_graph = meta_graph_pb2.MetaGraphDef()
    graph_def = meta_graph.graph_def
    graph_def.node.add(name="prefix", op="Placeholder").attr["dtype"].type = 7
    below = "prefix"
    for index in range(chain):
        graph_def.node.add(name=f"c{index}", op="NoOp", input=[f"^{below}"])
        below = f"c{index}"
    for index in range(restores):
        graph_def.node.add(name=f"r{index:04d}", op="RestoreV2",
                           input=["prefix", "prefix", "prefix", f"^{below}"])
    return meta_graph


def test_a_spare_saver_of_tfs_shape_is_still_tolerated():
    """The control: the limit leaves a training script's extra saver alone."""
    assert untrusted.host_op_uses(_spare_restores(2, 10)) == []


def test_thousands_of_spare_savers_over_a_long_chain_are_refused_past_the_limit(monkeypatch):
    read = []
    closure = untrusted_saver._Saver._closure

    def counted(self, root, prefix):
        nodes = closure(self, root, prefix)
        read.append(len(nodes))
        return nodes

    monkeypatch.setattr(untrusted_saver._Saver, "_closure", counted)
    monkeypatch.setattr(untrusted_saver, "_MAX_SPARE_WORK", 10_000)
    uses = untrusted.host_op_uses(_spare_restores(1_000, 1_000))
    assert sum(read) <= 10_000 + 1_003  # the limit, and the one read that crossed it
    assert len(uses) == 1_000 - len(read)
    assert "the check's limit of 10000 nodes read for savers" in uses[0].reason
