"""Asset filenames are judged as TensorFlow's C++ layer opens them.

The loaders feed ``<model>/assets/<filename>``; the kernel's open(2) ends the path at
the first NUL and resolves ``..`` after following symlinks. A name that Python reads as
a file inside ``assets/`` (``../../x\\0/../../model/assets/vocab.txt``) makes the model
read ``<model>/../x``: the static check every command runs refuses it, and ``inspect``
reports it, without ever opening it.
"""

from __future__ import annotations

import os

import pytest
from hostile_models_hidden_routes import build_escaping_asset

from serving_opt.cli import main as cli
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader, untrusted
from serving_opt.savedmodel.asset_paths import asset_path_problem

# The name: Python normalises it to /model/assets/vocab.txt; C++ opens ../../x.
NUL_NAME = "../../x\0/../../model/assets/vocab.txt"
LONG_NAME = "a/" * 3000 + "../" * 3001 + "etc/passwd"
HOSTILE = {
    "nul": NUL_NAME,
    "nul_at_end": "vocab.txt\0",
    "dotdot": "../../etc/passwd",
    "dotdot_inside": "sub/../vocab.txt",
    "absolute": "/etc/passwd",
    "long": LONG_NAME,
    "empty": "",
    "the_directory": "./",
}


def _meta_graph(export_dir: str):
    return loader.find_meta_graph(loader.read_saved_model(export_dir), {"serve"})


@pytest.mark.parametrize("name", ["vocab.txt", "sub/vocab.txt", "./vocab.txt", "a..b",
                                  "vocab\u00e9.txt"])
def test_a_file_inside_assets_has_no_problem(name):
    assert asset_path_problem(name) == ""
    assert loader.safe_asset_path("/m/1", name).startswith("/m/1/assets/")


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_name_leaving_assets_as_cpp_reads_it_has_a_problem(name):
    assert asset_path_problem(name)
    assert loader.safe_asset_path("/m/1", name) == ""


def test_pythons_own_normalisation_would_have_kept_the_nul_name_inside():
    """The control: Python's view of the name (the old rule) is a file in assets/."""
    assets = "/model/assets"
    assert os.path.normpath(os.path.join(assets, NUL_NAME)) == "/model/assets/vocab.txt"


@pytest.mark.parametrize("tf1_collection", [False, True], ids=["asset_file_def", "collection"])
@pytest.mark.parametrize("key", ["nul", "long", "dotdot_inside"])
def test_every_command_refuses_the_asset_in_one_line(tmp_path, capsys, key, tf1_collection):
    model = build_escaping_asset(str(tmp_path / "m" / "1"), HOSTILE[key], tf1_collection)
    uses = untrusted.host_op_uses(_meta_graph(model))
    assert [u.op for u in uses] == [untrusted.ESCAPING_ASSET], [u.describe() for u in uses]
    with pytest.raises(ServingOptError) as e:
        untrusted.refuse_host_ops(_meta_graph(model), ["serving_default"], "optimize")
    message = str(e.value)
    assert "outside the model" in message and "\0" not in message
    assert len(message) < 1000  # a 12,000-character name is shown cut
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={model}"])
    out = capsys.readouterr()
    assert code == 1 and "asset_path_escapes" in out.out
    assert "\0" not in out.out + out.err


def test_the_nul_name_makes_tensorflow_read_a_file_outside_the_model(tmp_path):
    """The control: loaded by TF's own loader, no check, the table holds the words of
    ``<model>/../x``, not of the model's vocabulary."""
    import tensorflow as tf

    model = build_escaping_asset(str(tmp_path / "m" / "1"), NUL_NAME)
    (tmp_path / "m" / "x").write_text("planted_secret\n")
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], model)
        signature = meta_graph.signature_def["serving_default"]
        ids = session.run(signature.outputs["ids"].name,
                          {signature.inputs["words"].name: [b"planted_secret", b"a"]})
    assert list(ids) == [0, -1]


def test_the_clean_twin_is_accepted_and_reads_its_asset(tmp_path):
    model = build_escaping_asset(str(tmp_path / "m" / "1"), "vocab.txt")
    assert untrusted.host_op_uses(_meta_graph(model)) == []
    session, meta_graph = loader.load_session(model)
    try:
        signature = meta_graph.signature_def["serving_default"]
        ids = session.run(signature.outputs["ids"].name,
                          {signature.inputs["words"].name: [b"a", b"b", b"zz"]})
    finally:
        session.close()
    assert list(ids) == [0, 1, -1]


def test_an_asset_declaration_that_is_not_utf8_is_refused(tmp_path, capsys):
    """C++ and Python parsers refuse a proto3 string that is not UTF-8; packed in the
    assets collection's Any, it cannot be read, so it cannot be judged: refused."""
    from saved_model_io import edit_saved_model

    model = build_escaping_asset(str(tmp_path / "m" / "1"), "vocab.txt", tf1_collection=True)

    def garble(meta_graph):
        packed = meta_graph.collection_def["saved_model_assets"].any_list.value[0]
        packed.value = packed.value.replace(b"vocab.txt", b"voc\xff\xfe.txt")

    edit_saved_model(model, garble)
    uses = untrusted.host_op_uses(_meta_graph(model))
    # The table's reader is no longer fed a declared asset either.
    assert {u.op for u in uses} == {untrusted.UNREADABLE_ASSET, "InitializeTableFromTextFileV2"}
    with pytest.raises(ServingOptError, match="refusing to optimize"):
        untrusted.refuse_host_ops(_meta_graph(model), ["serving_default"], "optimize")
    code = cli.main(["serving-opt", "inspect", f"--saved_model_dir={model}"])
    out = capsys.readouterr()
    assert code == 1 and "no AssetFileDef the check can read" in out.out
    assert "internal error" not in out.err


@pytest.mark.parametrize("op, value", [
    ("DecodeProtoV2", b"local://\0/etc/passwd"),  # C++ compares the whole string
    ("DecodeProtoV2", b"\0bytes://"),
    ("FixedUnigramCandidateSampler", b"\0/etc/passwd"),
    ("FixedUnigramCandidateSampler", b"\xff/etc/passwd"),
    ("PrintV2", b"file:///tmp/x\0.txt"),
])
def test_a_path_attr_with_a_nul_or_bad_bytes_counts_as_a_file(op, value):
    """The other strings C++ hands to open(2): judged on their bytes, never cleared
    by what Python's comparison of the decoded text would say about a prefix."""
    from tensorflow.core.framework import attr_value_pb2

    from serving_opt.savedmodel import host_ops
    assert host_ops.conditional_kind(op, attr_value_pb2.AttrValue(s=value)) is not None


@pytest.mark.parametrize("op, value", [
    ("DecodeProtoV2", b"local://"), ("PrintV2", b"stderr"), ("PrintV2", b"stderr\0x"),
    ("FixedUnigramCandidateSampler", b""),
])
def test_a_path_attr_cpp_never_opens_is_harmless(op, value):
    """The control: the same check clears values C++ never opens as a file (a stream
    name with a NUL is no stream C++ knows, and no "file://")."""
    from tensorflow.core.framework import attr_value_pb2

    from serving_opt.savedmodel import host_ops
    assert host_ops.conditional_kind(op, attr_value_pb2.AttrValue(s=value)) is None
