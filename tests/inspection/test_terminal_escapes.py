"""Names from a model never drive the terminal: every command's human output escapes them.

A signature key, node, op, tag, asset or attr value holding ``ESC ] 0 ; title BEL``
(window title), ``ESC [ 2 J`` (clear screen), ``ESC [ 32 m`` (green), a carriage return,
a backspace, C1's CSI (U+009B) or a bidi override (U+202E) is printed escaped
(``\\x1b``, ``\\u202e``); JSON output stays JSON (``json.dumps`` escapes them).
"""

from __future__ import annotations

import json

import pytest

from serving_opt import inspection
from serving_opt.cli import main as cli

NASTY = "\x1b]0;pwned\x07\x1b[2J\x1b[32mOK\r\b\u202e\x9b\x7f"
KEY = "sig" + NASTY
NODE = "node" + NASTY
OP = "Op" + NASTY
TAG = "tag" + NASTY
ASSET = "vocab" + NASTY + ".txt"
STREAM = "file:///tmp/serving_opt_planted" + NASTY


def _hostile_model(model_dir) -> str:
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    meta_graph = saved_model.meta_graphs.add()
    meta_graph.meta_info_def.tags.extend(["serve", TAG])
    meta_graph.meta_info_def.tensorflow_version = "2.21" + NASTY
    graph_def = meta_graph.graph_def
    x = graph_def.node.add(name=NODE, op="Placeholder")
    x.attr["dtype"].type = 1
    function = graph_def.library.function.add()
    function.signature.name = OP
    printer = function.node_def.add(name="print" + NASTY, op="PrintV2")
    printer.attr["output_stream"].s = STREAM.encode()
    call = graph_def.node.add(name="call" + NASTY, op=OP, input=[NODE])
    asset = graph_def.node.add(name="asset" + NASTY, op="Const")
    asset.attr["dtype"].type = 7
    meta_graph.asset_file_def.add(filename=ASSET).tensor_info.name = asset.name + ":0"
    signature = meta_graph.signature_def[KEY]
    signature.method_name = "tensorflow/serving/predict" + NASTY
    signature.inputs["in" + NASTY].name = NODE + ":0"
    signature.outputs["out" + NASTY].name = call.name + ":0"
    model_dir.mkdir(parents=True)
    (model_dir / "saved_model.pb").write_bytes(saved_model.SerializeToString())
    return str(model_dir)


def _controls(text: str) -> list[str]:
    return sorted({c for c in text if (ord(c) < 0x20 and c not in "\n\t")
                   or 0x7f <= ord(c) <= 0x9f or c == "\u202e"})


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory) -> str:
    return _hostile_model(tmp_path_factory.mktemp("escapes") / "m" / "1")


def test_the_model_carries_the_raw_names_into_the_report(hostile_model):
    """The control: without escaping, the table would print these characters."""
    report = inspection.inspect_saved_model(hostile_model)
    (meta_graph,) = report.meta_graphs
    assert [s.key for s in meta_graph.signatures] == [KEY]
    assert TAG in meta_graph.tags and meta_graph.assets[0].filename == ASSET
    assert any(op == OP for op, _ in meta_graph.graph_def_ops)
    assert any(NASTY in r.message for r in report.risks)


def test_inspect_prints_no_control_character(hostile_model, capsys):
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={hostile_model}"])
    out = capsys.readouterr()
    assert code == 1  # the PrintV2 to a file is a risk
    assert _controls(out.out) == [] and _controls(out.err) == []
    escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[32mOK\\r\\x08\\u202e\\x9b\\x7f"
    for name in (KEY, NODE, OP, TAG, ASSET):
        assert name.replace(NASTY, escaped) in out.out, name
    assert "file_write_op" in out.out and escaped in out.err


def test_inspect_json_stays_json_with_the_names_intact(hostile_model, capsys):
    cli.main(["serving-opt", "inspect", f"--saved_model_dir={hostile_model}", "--json"])
    out = capsys.readouterr()
    assert _controls(out.out) == []
    data = json.loads(out.out)
    assert [s["key"] for s in data["meta_graphs"][0]["signatures"]] == [KEY]


def test_an_error_line_naming_the_models_tags_is_escaped(hostile_model, capsys):
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={hostile_model}",
                     "--saved_model_tags=gpu"])
    out = capsys.readouterr()
    assert code == 1 and "has no MetaGraph tagged gpu" in out.err
    assert _controls(out.err) == [] and "tag\\x1b]0;pwned" in out.err


def test_inspect_of_a_frozen_graph_prints_no_control_character(tmp_path, capsys):
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name=NODE, op="Placeholder")
    x.attr["dtype"].type = 1
    graph_def.node.add(name="out" + NASTY, op=OP, input=[NODE])
    graph_def.node.add(name="w" + NASTY, op="WriteFile", input=[NODE, NODE])
    path = tmp_path / "frozen.pb"
    path.write_bytes(graph_def.SerializeToString())
    cli.main(["serving-opt", "inspect", f"--saved_model_dir={path}"])
    out = capsys.readouterr()
    assert "node\\x1b]0;pwned" in out.out  # the candidate input, named, escaped
    assert _controls(out.out) == [] and _controls(out.err) == []
