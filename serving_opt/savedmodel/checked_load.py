"""Loading a SavedModel from the bytes that were checked, not from its path again.

TF's SavedModel loader reads ``saved_model.pb`` itself, and the init op opens assets by
path: whatever the version directory holds by then (a swapped file, a new symlink) is
what loads. Here the graph comes from the MetaGraphDef the caller read and checked, and
each asset is read without following a link and fed from a private copy.
"""

from __future__ import annotations

import errno
import os
import stat

from serving_opt.savedmodel import loader, model_files


def _open_beneath(root: str, relative: str) -> int:
    """An fd of the regular file ``root/relative``, reached without following a symlink
    at any step (a path swapped for a link after the checks is refused, not followed)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    parts = relative.split("/")
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def _not_regular(path: str, what: str) -> model_files.UnsafeModelFile:
    return model_files.UnsafeModelFile(
        path, f"{path} {what}, not a regular file inside the version",
        "replace it with the file itself (copy the model again or re-export it)")


def copy_beneath(root: str, relative: str, target: str) -> None:
    """Copies the regular file ``root/relative`` to ``target`` (a new file), reached
    without following a symlink at any step and opened without blocking; raises
    model_files.UnsafeModelFile for a link or a special file, FileNotFoundError when absent."""
    source = os.path.join(root, relative)
    try:
        fd = _open_beneath(root, relative)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            raise _not_regular(source, "is reached through a symlink or is a special "
                                       "file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(source, f"is {model_files.file_kind(mode)}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "xb") as out, os.fdopen(os.dup(fd), "rb") as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    finally:
        os.close(fd)


def pin_assets(meta_graph, saved_model_dir: str, private_dir: str) -> dict[str, str]:
    """Copies the MetaGraph's assets into ``private_dir`` and returns the loader's feeds
    (asset tensor name -> the copy's path), so TensorFlow's C++ file layer opens the
    bytes checked here, not whatever the model's path names when the init op runs.

    Each asset is read as the C++ layer would read its name: a name with a NUL byte (C++
    cuts the path there), an absolute one or one with ``..`` that leaves ``assets/``, or
    one that reaches a symlink or a special file on its way, is refused
    (model_files.UnsafeModelFile).
    """
    feeds = {}
    for asset in loader.asset_file_defs(meta_graph):
        name = asset.filename
        relative = os.path.normpath(name) if name and "\0" not in name else ""
        if not relative or os.path.isabs(relative) or relative.split("/")[0] in ("..", "."):
            raise model_files.UnsafeModelFile(
                os.path.join(saved_model_dir, "assets"),
                f"asset filename {name!r} of {saved_model_dir} does not name a file inside "
                "its assets/ directory",
                "re-export the model (assets are files inside assets/)")
        target = os.path.join(private_dir, "assets", relative)
        feeds[asset.tensor_info.name] = target
        if os.path.exists(target):
            continue  # one file, fed to more than one tensor
        try:
            copy_beneath(saved_model_dir, "assets/" + relative, target)
        except FileNotFoundError:
            continue  # TF's init op fails on the missing copy, with TF's own NOT_FOUND
    return feeds


def load_checked_session(session, meta_graph, saved_model_dir: str, asset_dir: str):
    """Builds ``session``'s graph from ``meta_graph`` (the MetaGraphDef that was read and
    checked), restores its variables from ``saved_model_dir`` and runs its init op with
    the assets pinned in ``asset_dir`` (:func:`pin_assets`): TF's own loader would read
    ``saved_model.pb`` from disk again, and load whatever is there by then.

    The steps and their order are TF's SavedModelLoader's (load_graph, restore_variables,
    run_init_ops), which serve relied on before. Raises TensorFlow's errors.
    """
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl

    with session.graph.as_default():
        saver = tf.compat.v1.train.import_meta_graph(meta_graph)
        if saver is not None:
            # The version directory as resolved now: a link swapped for it later is moot.
            saver.restore(session, os.path.join(os.path.realpath(saved_model_dir),
                                                "variables", "variables"))
        feeds = pin_assets(meta_graph, saved_model_dir, asset_dir)
        init_op = loader_impl.get_init_op(meta_graph)
        if init_op is not None:
            session.run(fetches=[init_op], feed_dict=feeds)
