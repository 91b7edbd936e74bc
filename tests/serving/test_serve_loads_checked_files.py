"""``serve`` loads a version only after the file checks ``optimize`` runs, and from the
bytes it checked: a symlink or hard link out of the version (another model's files,
/dev/zero) fails that version's load, and a saved_model.pb swapped after the check is
never what runs. Each hostile model's control shows TensorFlow's own loader falls for it.
"""

from __future__ import annotations

import os
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf
from saved_model_io import save_tf1, serving_default
from tensorflow.core.protobuf import meta_graph_pb2

from serving_opt.model_server import servable as servable_lib
from serving_opt.model_server.request_options import RequestOptions
from serving_opt.model_server.servable import LoadOptions, Servable, ServableId
from serving_opt.model_server.warmup import replay_warmup
from serving_opt.savedmodel import checked_load, loader, model_files

v1 = tf.compat.v1
SECRET_WORD = b"other-models-secret"


def _vocab_model(export_dir: str, words: list[str]) -> str:
    """word -> its line in the asset vocab.txt (-1 when absent)."""
    source = os.path.join(os.path.dirname(export_dir), "source")
    os.makedirs(source)
    vocab = os.path.join(source, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(words) + "\n")
    with tf.Graph().as_default() as graph:
        asset = tf.constant(vocab, name="vocab_path")
        graph.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset)
        table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            asset, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), -1)
        word = v1.placeholder(tf.string, [None], name="word")
        ids = tf.identity(table.lookup(word), name="id")
        save_tf1(graph, export_dir, serving_default({"word": word}, {"id": ids}),
                 main_op=v1.tables_initializer(),
                 assets_collection=graph.get_collection(v1.GraphKeys.ASSET_FILEPATHS))
    shutil.rmtree(source)
    return export_dir


def _lookup_with_tensorflow(export_dir: str, word: bytes) -> int:
    """What TensorFlow's own loader (no checks) answers: the control."""
    with tf.Graph().as_default(), v1.Session() as sess:
        v1.saved_model.loader.load(sess, ["serve"], export_dir)
        return int(sess.run("id:0", {"word:0": [word]})[0])


@pytest.fixture
def two_models(tmp_path):
    """(the other model's secret vocab file, a version whose vocab.txt is to be replaced)."""
    other = _vocab_model(str(tmp_path / "other" / "1"), [SECRET_WORD.decode()])
    mine = _vocab_model(str(tmp_path / "mine" / "1"), ["hello"])
    return os.path.join(other, "assets", "vocab.txt"), mine


def _load(path: str, **options) -> Servable:
    return Servable.load(ServableId("m", 1), path, LoadOptions(**options))


def test_a_plain_version_with_an_asset_loads_and_answers(two_models):
    _, mine = two_models
    servable = _load(mine)
    try:
        out = servable.run({"word:0": np.array([b"hello", b"nope"], object)}, ["id:0"])
        assert out[0].value.tolist() == [0, -1]
    finally:
        servable.close()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_asset_linked_to_another_models_file_fails_the_load(two_models, link):
    secret, mine = two_models
    vocab = os.path.join(mine, "assets", "vocab.txt")
    os.unlink(vocab)
    (os.symlink if link == "symlink" else os.link)(secret, vocab)
    # Control: TensorFlow's loader reads the other model's file through the link.
    assert _lookup_with_tensorflow(mine, SECRET_WORD) == 0
    with pytest.raises(servable_lib.ServingStatusError) as info:
        _load(mine)
    assert info.value.code.name == "FAILED_PRECONDITION"
    assert "vocab.txt" in info.value.message
    assert ("symlink" if link == "symlink" else "hard links") in info.value.message
    assert "\n" not in info.value.message


def test_an_asset_linked_to_dev_zero_fails_the_load_not_the_server(two_models):
    _, mine = two_models
    vocab = os.path.join(mine, "assets", "vocab.txt")
    os.unlink(vocab)
    os.symlink("/dev/zero", vocab)  # TF's table init reads it until std::bad_alloc
    with pytest.raises(servable_lib.ServingStatusError) as info:
        _load(mine)
    assert info.value.code.name == "FAILED_PRECONDITION"
    assert "/dev/zero" in info.value.message


@pytest.mark.parametrize("name", ["../../../other/1/assets/vocab.txt",
                                  "vocab.txt\0/../../../../other/1/assets/vocab.txt"])
def test_an_asset_name_not_inside_assets_fails_the_load_even_with_file_ops(two_models,
                                                                          name):
    _, mine = two_models
    sm = loader.read_saved_model(mine)
    assets = sm.meta_graphs[0].collection_def["saved_model_assets"].any_list.value
    for packed in assets:  # TF1's builder lists the asset twice
        asset = meta_graph_pb2.AssetFileDef()
        packed.Unpack(asset)
        asset.filename = name
        packed.Pack(asset)
    with open(os.path.join(mine, "saved_model.pb"), "wb") as f:
        f.write(sm.SerializeToString())
    if "\0" not in name:  # control: TensorFlow's loader feeds the other model's file
        assert _lookup_with_tensorflow(mine, SECRET_WORD) == 0
    with pytest.raises(servable_lib.ServingStatusError) as info:
        _load(mine, allow_file_ops=True)  # past the static check: the loader holds alone
    assert info.value.code.name == "DATA_LOSS"
    assert "assets/ directory" in info.value.message


def _path_model(export_dir: str, hostile: bool) -> str:
    """path -> the file's bytes (hostile: a host op) or b"checked:" + path (benign)."""
    with tf.Graph().as_default() as graph:
        path = v1.placeholder(tf.string, [], name="path")
        out = tf.io.read_file(path) if hostile else tf.strings.join(["checked:", path])
        y = tf.identity(out, name="y")
        save_tf1(graph, export_dir, serving_default({"path": path}, {"y": y}))
    return export_dir


def test_saved_model_pb_swapped_after_the_check_is_not_what_loads(tmp_path, monkeypatch):
    secret = tmp_path / "host" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"the host's secret")
    version = _path_model(str(tmp_path / "m" / "1"), hostile=False)
    hostile = _path_model(str(tmp_path / "hostile" / "1"), hostile=True)
    hostile_pb = open(os.path.join(hostile, "saved_model.pb"), "rb").read()
    # Control: the hostile graph, loaded by TensorFlow, reads the host file.
    with tf.Graph().as_default(), v1.Session() as sess:
        v1.saved_model.loader.load(sess, ["serve"], hostile)
        assert sess.run("y:0", {"path:0": str(secret)}) == b"the host's secret"

    swapped = []
    on_disk_at_load = []
    check = servable_lib.refuse_host_ops
    load = checked_load.load_checked_session

    def check_then_swap(meta_graph_def, export_dir):
        check(meta_graph_def, export_dir)  # passes: the benign graph
        shutil.copyfile(os.path.join(hostile, "saved_model.pb"),
                        os.path.join(export_dir, "saved_model.pb"))
        swapped.append(export_dir)

    def load_and_look(session, meta_graph, saved_model_dir, asset_dir):
        with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
            on_disk_at_load.append(f.read())
        return load(session, meta_graph, saved_model_dir, asset_dir)

    monkeypatch.setattr(servable_lib, "refuse_host_ops", check_then_swap)
    monkeypatch.setattr(checked_load, "load_checked_session", load_and_look)
    servable = _load(version)
    try:
        answer = servable.run({"path:0": np.array(str(secret).encode(), object)}, ["y:0"])
    finally:
        servable.close()
    assert swapped == [version] and on_disk_at_load == [hostile_pb]  # the swap was real
    assert answer[0].value.item() == b"checked:" + str(secret).encode()
    assert not any(n.op == "ReadFile" for n in servable.meta_graph_def.graph_def.node)


@pytest.mark.parametrize("swapped_in", ["fifo", "symlink"])
def test_a_warmup_file_swapped_after_the_checks_is_refused_not_read(two_models, swapped_in):
    secret, mine = two_models
    servable = _load(mine)
    extra = os.path.join(mine, "assets.extra")
    os.makedirs(extra)
    warmup = os.path.join(extra, "tf_serving_warmup_requests")
    # After the load's checks, before the warmup reads it: a FIFO blocks a reader forever.
    os.mkfifo(warmup) if swapped_in == "fifo" else os.symlink(secret, warmup)
    assert os.path.exists(warmup)  # control: the replay's "is there a file" test passes
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(120)  # a replay that opened the FIFO would hang: fail, don't hang
    try:
        with pytest.raises(servable_lib.ServingStatusError) as info:
            replay_warmup(servable, RequestOptions())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        servable.close()
    assert info.value.code.name == "DATA_LOSS"
    assert "tf_serving_warmup_requests" in info.value.message


def _hung(signum, frame):
    raise TimeoutError("the warmup replay blocked on the swapped-in file")


def test_a_version_directory_linked_to_another_models_version_fails_the_load(two_models):
    secret, mine = two_models
    other_version = os.path.dirname(os.path.dirname(secret))
    linked = os.path.join(os.path.dirname(mine), "2")
    os.symlink(other_version, linked)
    assert _lookup_with_tensorflow(linked, SECRET_WORD) == 0  # control: it is the other's
    with pytest.raises(servable_lib.ServingStatusError) as info:
        _load(linked)
    assert info.value.code.name == "FAILED_PRECONDITION"
    assert "outside its model base" in info.value.message


def test_a_saved_model_pb_over_protobufs_limit_fails_the_load_unread(two_models):
    _, mine = two_models
    pb = os.path.join(mine, "saved_model.pb")
    with open(pb, "r+b") as f:  # sparse: nothing is written, nothing may be read
        f.truncate(model_files.MAX_SAVED_MODEL_BYTES + 1)
    assert os.path.getsize(pb) > model_files.MAX_SAVED_MODEL_BYTES  # control
    with pytest.raises(servable_lib.ServingStatusError) as info:
        _load(mine)
    assert info.value.code.name == "DATA_LOSS"
    assert "over protobuf's 2 GiB limit" in info.value.message
