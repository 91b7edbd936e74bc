"""Reading SavedModels: the proto on disk, the serving MetaGraph, and live sessions.

Everything that opens a user's model goes through here, so every way a model can
be unreadable (missing, not a SavedModel, truncated, wrong tags) is turned into
one clear :class:`~serving_opt.errors.ServingOptError` in one place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel.model_files import check_special_files, read_model_file

SERVE_TAG = "serve"
INIT_OP_SIGNATURE_KEY = "__saved_model_init_op"
MAIN_OP_COLLECTION = "saved_model_main_op"
LEGACY_INIT_OP_COLLECTION = "legacy_init_op"
TABLE_INITIALIZER_COLLECTION = "table_initializer"
ASSET_FILEPATHS_COLLECTION = "asset_filepaths"
SAVED_MODEL_ASSETS_COLLECTION = "saved_model_assets"

METHOD_CLASSIFY = "tensorflow/serving/classify"
METHOD_REGRESS = "tensorflow/serving/regress"
METHOD_PREDICT = "tensorflow/serving/predict"


def parse_tags(tags: str | Iterable[str]) -> frozenset[str]:
    """Parses ``--saved_model_tags`` ("serve" or "serve,gpu") into a tag set.
    """
    if isinstance(tags, str):
        tags = tags.split(",")
    return frozenset(t.strip() for t in tags if t.strip())


def check_saved_model_dir(path: str) -> bool:
    """Refuses (ServingOptError) a path that is not a SavedModel directory: missing, a
    file, or without ``saved_model.pb``/``.pbtxt``; True when it has the binary one.
    Only the file system: the caller's cheap check before any work.
    """
    if not os.path.exists(path):
        raise ServingOptError(
            f"SavedModel directory {path} does not exist",
            "check the path (a SavedModel directory contains saved_model.pb)",
        )
    if not os.path.isdir(path):
        raise ServingOptError(
            f"{path} is a file, not a SavedModel directory",
            "pass the directory that contains saved_model.pb",
        )
    # lexists: a dangling link named saved_model.pb is refused as a link, not "missing".
    use_pb = os.path.lexists(os.path.join(path, "saved_model.pb"))
    if not use_pb and not os.path.lexists(os.path.join(path, "saved_model.pbtxt")):
        hint = _version_dir_hint(path)
        raise ServingOptError(
            f"no saved_model.pb in {path}",
            hint or "point at the directory written by tf.saved_model.save / "
            "Estimator.export_saved_model / model.export",
        )
    return use_pb


def read_saved_model(path: str):
    """Reads and parses ``saved_model.pb`` (or ``.pbtxt``) under ``path``.

    Raises ServingOptError with a one-line explanation for every unreadable case: the
    file is read only as a regular file within protobuf's 2 GiB limit (read_model_file).
    """
    use_pb = check_saved_model_dir(path)
    pb_path = os.path.join(path, "saved_model.pb")
    pbtxt_path = os.path.join(path, "saved_model.pbtxt")
    # Read (bounded) before TensorFlow is imported: a bad file fails in milliseconds.
    chosen = pb_path if use_pb else pbtxt_path
    try:
        data = read_model_file(chosen)
    except OSError as e:
        raise ServingOptError(f"cannot read {chosen}: {e.strerror or e}",
                              "check the file's permissions") from e
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    if use_pb:
        try:
            saved_model.ParseFromString(data)
        except message.DecodeError as e:
            raise ServingOptError(
                f"{pb_path} is corrupt or truncated ({len(data)} bytes, {e})",
                "re-export the model or copy it again",
            ) from e
    else:
        try:
            text_format.Parse(data.decode("utf-8", errors="replace"), saved_model)
        except text_format.ParseError as e:
            raise ServingOptError(
                f"{pbtxt_path} is not a valid text SavedModel ({e})",
                "re-export the model",
            ) from e
    if not saved_model.meta_graphs:
        raise ServingOptError(
            f"{path}/saved_model.pb holds no MetaGraph (an empty or truncated file)",
            "re-export the model",
        )
    return saved_model


def _version_dir_hint(path: str) -> str | None:
    """Users often pass the model base (holding 1/, 2/...) instead of a version."""
    try:
        versions = sorted(
            (int(n) for n in os.listdir(path) if n.isascii() and n.isdigit()  # not "²"
             and os.path.exists(os.path.join(path, n, "saved_model.pb"))),
        )
    except OSError:
        return None
    if versions:
        latest = os.path.join(path, str(versions[-1]))
        return f"it looks like a model base with versions {versions}; pass a version, e.g. {latest}"
    return None


def find_meta_graph(saved_model, tags: Iterable[str], path: str = "the SavedModel"):
    """Returns the MetaGraphDef whose tag set equals ``tags``."""
    wanted = frozenset(tags)
    available = []
    for meta_graph in saved_model.meta_graphs:
        have = frozenset(meta_graph.meta_info_def.tags)
        if have == wanted:
            return meta_graph
        available.append(",".join(sorted(have)) or "<no tags>")
    raise ServingOptError(
        f"{path} has no MetaGraph tagged {','.join(sorted(wanted)) or '<no tags>'} "
        f"(it has: {'; '.join(available)})",
        _tags_fix(available[0]) if available else "re-export the model",
    )


def _tags_fix(tags: str) -> str:
    if tags == "<no tags>":  # an empty value is the empty set, as saved_model_cli's --tag_set ''
        return "pass --saved_model_tags='' (the empty tag set)"
    return f"pass --saved_model_tags={tags}"


def is_tf2(meta_graph) -> bool:
    """True for object-graph SavedModels whose signatures call functions (tf.saved_model.save)."""
    return bool(meta_graph.object_graph_def.nodes) and bool(
        meta_graph.graph_def.library.function
    )


@dataclass(frozen=True)
class InitOp:
    """The init op of a MetaGraph and where it was declared.

    ``source`` is ``"__saved_model_init_op"`` (the TF2 pseudo signature), ``"main_op"``
    (the ``saved_model_main_op`` collection) or ``"legacy_init_op"``.
    """

    name: str
    source: str


def find_init_op(meta_graph) -> InitOp | None:
    """The node TF Serving runs after restoring, and where it was declared; None if none.

    The precedence is the C++ loader's (``GetInitOp`` in loader_util.cc): the init-op
    signature, then the main_op collection, then legacy_init_op.
    """
    sig = meta_graph.signature_def.get(INIT_OP_SIGNATURE_KEY)
    if sig is not None and INIT_OP_SIGNATURE_KEY in sig.outputs:
        return InitOp(sig.outputs[INIT_OP_SIGNATURE_KEY].name.split(":")[0],
                      INIT_OP_SIGNATURE_KEY)
    # Like the C++ loader: a main_op collection, when present, wins even if empty;
    # legacy_init_op is consulted only without one.
    for key, source in ((MAIN_OP_COLLECTION, "main_op"), (LEGACY_INIT_OP_COLLECTION,
                                                          "legacy_init_op")):
        col = meta_graph.collection_def.get(key)
        if col is None:
            continue
        if len(col.node_list.value) != 1:
            return None
        return InitOp(col.node_list.value[0].split(":")[0], source)
    return None


def init_op_name(meta_graph) -> str | None:
    """The node TF Serving runs after restoring: init-op signature, main_op, or legacy_init_op.

    The precedence is the C++ loader's (``GetInitOp`` in loader_util.cc).
    """
    init_op = find_init_op(meta_graph)
    return init_op.name if init_op else None


def serving_signatures(meta_graph) -> dict:
    """The signature_def map without the init-op pseudo signature."""
    return {k: v for k, v in meta_graph.signature_def.items() if k != INIT_OP_SIGNATURE_KEY}


def select_signatures(meta_graph, keys: Sequence[str] | None) -> list[str]:
    """Validates ``--signatures`` against the model; None or empty means all."""
    available = sorted(serving_signatures(meta_graph))
    if not keys:
        if not available:
            raise ServingOptError(
                "the MetaGraph has no signatures to serve",
                "export the model with at least one signature (e.g. serving_default)",
            )
        return available
    missing = [k for k in keys if k not in available]
    if missing:
        raise ServingOptError(
            f"signature(s) {', '.join(missing)} not in the model (it has: {', '.join(available)})",
            "fix --signatures",
        )
    return list(dict.fromkeys(keys))


def safe_asset_path(saved_model_dir: str, filename: str) -> str:
    """``<dir>/assets/<filename>``, or "" when the name escapes the assets directory.

    A name the C++ file layer would read outside ``assets/`` (a NUL byte, an absolute
    name, ``..``: :func:`asset_paths.asset_path_problem`) is never opened or fed here.
    """
    from serving_opt.savedmodel.asset_paths import asset_path_problem

    if asset_path_problem(filename):
        return ""
    assets = os.path.normpath(os.path.join(saved_model_dir, "assets"))
    path = os.path.normpath(os.path.join(assets, filename))
    return path if path.startswith(assets + os.sep) else ""


@dataclass(frozen=True)
class AssetFile:
    """One asset wired into the graph: the tensor fed with its path at load time."""

    filename: str
    tensor_name: str
    path: str
    size_bytes: int


def asset_files(meta_graph, saved_model_dir: str) -> list[AssetFile]:
    """Assets declared in the MetaGraph (AssetFileDef, or the TF1 saved_model_assets collection)."""
    out = []
    for asset in asset_file_defs(meta_graph):
        path = safe_asset_path(saved_model_dir, asset.filename)
        size = os.path.getsize(path) if path and os.path.isfile(path) else -1
        out.append(AssetFile(asset.filename, asset.tensor_info.name, path, size))
    return out


def asset_file_defs(meta_graph) -> list:
    """The MetaGraph's AssetFileDefs, else those of the TF1 saved_model_assets collection
    (the loader's precedence)."""
    from tensorflow.core.protobuf import meta_graph_pb2

    defs = list(meta_graph.asset_file_def)
    if not defs:
        col = meta_graph.collection_def.get(SAVED_MODEL_ASSETS_COLLECTION)
        if col is not None:
            for any_value in col.any_list.value:
                asset = meta_graph_pb2.AssetFileDef()
                any_value.Unpack(asset)
                defs.append(asset)
    return defs


def load_session(saved_model_dir: str, tags: Iterable[str] = (SERVE_TAG,), config=None):
    """Loads a SavedModel into a fresh graph and session, the way TF Serving does.

    Restores variables, feeds asset paths and runs the init op. Returns
    ``(session, meta_graph_def)``; the caller closes the session.
    """
    import tensorflow as tf

    # Parse first: TF's own loader reports a missing tag or corrupt file as a long traceback.
    find_meta_graph(read_saved_model(saved_model_dir), tags, saved_model_dir)
    # TF's loader opens variables/ and the assets fed to the init op: a FIFO there would
    # block the restore forever (lstat only; links out are check_model_files' business).
    check_special_files(saved_model_dir)
    graph = tf.Graph()
    sess = tf.compat.v1.Session(graph=graph, config=config)
    try:
        with graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(sess, list(tags), saved_model_dir)
    except Exception as e:
        sess.close()
        missing = missing_op_error(e, f"TensorFlow could not load {saved_model_dir}")
        if missing is not None:
            raise missing from e
        raise ServingOptError(
            f"TensorFlow could not load {saved_model_dir}: {root_cause(e)}",
            "check that the model loads with saved_model_cli show/run",
        ) from e
    return sess, meta_graph


# TF's wrappers put the reason after this ("Restoring from checkpoint failed. This is most
# likely due to a mismatch ... Original error:\n\n<the reason>"); wrappers can nest.
_ORIGINAL_ERROR = re.compile(r"Original error:\s*", re.IGNORECASE)
_NOT_REGISTERED = re.compile(r"Op type not registered '([^']+)' in binary running on")
_NO_KERNEL = re.compile(r"No OpKernel was registered to support Op '([^']+)'"
                        r"(?: used by \{\{node ([^}]+)\}\})?")
_DEVICES = re.compile(r"Registered devices: \[([^\]]*)\]")


def root_cause(e: BaseException) -> str:
    """The innermost reason of a TensorFlow error, on one line: the text after the last
    "Original error:" of the wrappers (the restore's "Restoring from checkpoint failed
    ... Original error:" says nothing by itself), read like :func:`first_line`.
    """
    text = str(e)
    parts = _ORIGINAL_ERROR.split(text)
    inner = parts[-1].strip() if len(parts) > 1 else ""
    return first_line(RuntimeError(inner)) if inner else first_line(e)


def missing_op_error(e: BaseException, what: str) -> ServingOptError | None:
    """The one-line error for a model that uses an op this TensorFlow lacks, naming the op
    and the runtime, or None when ``e`` is about something else.

    Two ways TF says it: "Op type not registered 'X' in binary running on ..." (a custom
    op, or one removed from TensorFlow: the graph does not even import), and "No OpKernel
    was registered to support Op 'X'" (the op is known, but no kernel for this machine's
    devices: BoostedTrees ops in TF 2.16+; raised by the first run, often the restore).
    """
    text = str(e)
    cause = e.__cause__ or e.__context__
    while cause is not None and not (_NOT_REGISTERED.search(text) or _NO_KERNEL.search(text)):
        text, cause = str(cause), cause.__cause__ or cause.__context__
    runtime = f"TensorFlow {_tf_version()} (this runtime)"
    fix = ("optimize and serve it with a TensorFlow and TF Serving that have the op (the "
           "version the model was exported with, or a build with its custom-op library "
           "loaded), or re-export the model without it")
    found = _NOT_REGISTERED.search(text)
    if found is not None:
        return ServingOptError(
            f"{what}: the model uses op {found.group(1)}, which {runtime} does not register "
            "(a custom op, or one removed from TensorFlow)", fix)
    found = _NO_KERNEL.search(text)
    if found is not None:
        node = f" (node {found.group(2)})" if found.group(2) else ""
        devices = _DEVICES.search(text)
        on = f" for {devices.group(1)}" if devices and devices.group(1) else ""
        return ServingOptError(
            f"{what}: the model uses op {found.group(1)}{node}, which {runtime} registers "
            f"without a kernel{on}, so it cannot run", fix)
    return None


def _tf_version() -> str:
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - every caller has TensorFlow
        return "?"
    return tf.__version__



def run_signature(session, signature_def, feed_by_alias: dict,
                  output_aliases: Sequence[str] | None = None,
                  tensors: Sequence[str] = ()) -> dict:
    """Runs one signature in a session: feeds and fetches keyed by alias; ``tensors``
    (graph tensors by name) are fetched in the same run, keyed by their names.
    """
    feeds = {signature_def.inputs[a].name: v for a, v in feed_by_alias.items()}
    aliases = list(output_aliases or sorted(signature_def.outputs))
    fetches = [signature_def.outputs[a].name for a in aliases] + list(tensors)
    values = session.run(fetches, feeds)
    return dict(zip(aliases + list(tensors), values))


def dir_size(path: str) -> int:
    """Total bytes of regular files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                total += os.path.getsize(full)
    return total
