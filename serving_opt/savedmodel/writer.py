"""Writing a servable SavedModel and publishing it as a version TF Serving can pick up.

The MetaGraph is assembled directly (what ``saved_model.Builder`` does inside)
rather than through the Builder, because the Builder re-reads each asset from the
path baked into its graph constant at export time, a path that usually no longer
exists, and it cannot write an init op under ``__saved_model_init_op``. Signatures,
asset wiring and the init op are copied from the source verbatim.

A version appears atomically: everything is written to a hidden staging directory
inside the model base (TF Serving ignores names that are not integers) and renamed
to ``<base>/<version>`` only after the parity gate passed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from serving_opt.errors import ServingOptError, UsageError, storage_error
from serving_opt.savedmodel import loader, model_files
from serving_opt.savedmodel import staging as staging_lib
from serving_opt.savedmodel.graph import PROTOBUF_LIMIT_BYTES, ServingGraph

STAGING_PREFIX = ".serving-opt-staging-"


# TF Serving reads version directory names as int64 (FileSystemStoragePathSource).
MAX_VERSION = 2**63 - 1
_VERSION_NAME = re.compile(r"[0-9]+")


def parse_version(name: str) -> int | None:
    """The version a directory name stands for: ASCII digits within int64, else None.

    ``str.isdigit`` is not enough: it accepts "²" (int() fails) and "٣" (int() gives 3).
    """
    if not _VERSION_NAME.fullmatch(name):
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


# strings::safe_strto64, which TF Serving's FileSystemStoragePathSource parses child
# names with: C isspace() around, an optional '-' (no '+'), ASCII digits.
_C_SPACE = " \t\n\v\f\r"
_SERVED_VERSION = re.compile(r"-?[0-9]+")


def served_version(name: str) -> int | None:
    """The version TF Serving reads a child directory name of a model base as, or None.

    ``02``, ``007`` and `` 7`` are versions 2, 7 and 7 to TF Serving
    (file_system_storage_path_source.cc, ParseVersionNumber = strings::safe_strto64);
    ``+3``, ``٣``, ``0x10`` and names beyond int64 are not versions.
    """
    stripped = name.strip(_C_SPACE)
    if not _SERVED_VERSION.fullmatch(stripped):
        return None
    value = int(stripped)
    return value if -MAX_VERSION - 1 <= value <= MAX_VERSION else None


def version_dirs(base: str) -> dict[int, list[str]]:
    """Every entry of ``base`` TF Serving reads as a version, by version; each list in
    the order upstream indexes them (sorted names), so the last one is the one served.
    """
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    found: dict[int, list[str]] = {}
    for name in names:
        version = served_version(name)
        if version is not None:
            found.setdefault(version, []).append(name)
    return found


def existing_versions(base: str) -> list[int]:
    """Integer version directories in a model base, sorted.

    Only directories named by a version in canonical form (``3``, not ``03``) count, so
    ``os.path.join(base, str(version))`` is each one's path; files and other names are
    not versions. :func:`version_dirs` has every name TF Serving reads as a version.
    """
    if not os.path.isdir(base):
        return []
    versions = []
    for name in os.listdir(base):
        version = parse_version(name)
        if version is not None and str(version) == name and \
                os.path.isdir(os.path.join(base, name)):
            versions.append(version)
    return sorted(versions)


def next_version(base: str) -> int:
    """One more than the highest version TF Serving reads in ``base`` (1 for a new base).

    Any entry TF Serving reads as a version takes it (``02`` is version 2, `` 7`` is 7), a
    plain file included: the next version is always free and always the one served.
    """
    taken = version_dirs(base)
    version = max([0, *taken]) + 1
    if version > MAX_VERSION:
        raise ServingOptError(f"{base} already holds version {MAX_VERSION}, the largest "
                              "TF Serving reads", "pass --version=N for a free N")
    return version


def check_version(version) -> None:
    """Refuses a version TF Serving cannot read: negative or beyond int64."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ServingOptError(f"version {version!r} is not an integer",
                              "pass --version=N with 0 <= N < 2**63")
    if version < 0:
        raise ServingOptError(f"version {version} is negative", "pass --version=N with N >= 0")
    if version > MAX_VERSION:
        raise ServingOptError(
            f"version {version} is out of range (TF Serving reads versions as int64)",
            f"pass --version=N with N <= {MAX_VERSION}",
        )


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what ``path`` resolves to, None if it does not exist: the same
    directory reached through a bind mount, a symlink or another spelling is equal here,
    where comparing realpath strings sees two directories."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _ancestors(path: str) -> list[str]:
    """``path`` and every directory above it, symlinks resolved (realpath), nearest first."""
    current = os.path.realpath(path)
    chain = [current]
    while os.path.dirname(current) != current:
        current = os.path.dirname(current)
        chain.append(current)
    return chain


def check_not_source(input_dir: str, output_base: str, version: int | None = None) -> None:
    """Refuses an output that is, or would replace, the model being read, however reached.

    Compares (st_dev, st_ino), not path strings, so no bind mount, symlink or alias name
    can make the target the source: the output base (or a directory above it) must not
    be ``input_dir`` (UsageError), and no directory TF Serving reads as ``version`` in the
    output base (``3``, ``03``: overwriting replaces them all) may be ``input_dir`` or
    contain it (ServingOptError). Hard links cannot join directories, and a file of the
    target linked to a source file is safe: a version is replaced by rename, never written
    into. A missing ``input_dir`` passes: the reader says what is wrong with it.
    """
    source = _identity(input_dir)
    if source is None:
        return
    for directory in _ancestors(output_base):
        if _identity(directory) == source:
            raise UsageError(
                f"--output_base {output_base} is inside --input_dir {input_dir}"
                + ("" if os.path.realpath(directory) == os.path.realpath(input_dir)
                   else f" ({directory} is the same directory)"),
                "write to a separate model base (e.g. the parent of the version directory)",
            )
    if version is None:
        return
    names = version_dirs(output_base).get(version, [])
    source_chain = [_identity(d) for d in _ancestors(input_dir)]
    for name in names:
        target = os.path.join(output_base, name)
        identity = _identity(target)
        if identity is None or identity not in source_chain:
            continue
        same = identity == source
        raise ServingOptError(
            f"version directory {target} is the input model {input_dir}"
            + ("" if same else " or contains it")
            + (f" (TF Serving reads {name!r} as version {version})" if name != str(version)
               else "")
            + "; writing it would destroy the source",
            "pick another --version or --output_base",
        )


def check_target(base: str, version: int, overwrite: bool = False,
                 source: str | None = None) -> str:
    """Fails early when the version exists (under any name TF Serving reads as it: ``02``
    is version 2) and overwriting was not asked for, or when it is (or contains)
    ``source``, the model being read, however reached (:func:`check_not_source`).
    """
    check_version(version)
    target = os.path.join(base, str(version))
    if source is not None:
        check_not_source(source, base, version)
    names = version_dirs(base).get(version, [])
    if os.path.lexists(target) and str(version) not in names:
        names.append(str(version))  # unreadable base listing: the name itself still counts
    if names and not overwrite:
        taken = os.path.join(base, names[-1])
        alias = f" (TF Serving reads {names[-1]!r} as version {version})" \
            if names[-1] != str(version) else ""
        raise ServingOptError(
            f"version directory {taken} already exists{alias}",
            f"pick another --version (next free: {next_version(base)}) or pass --overwrite",
        )
    if os.path.exists(base) and not os.path.isdir(base):
        raise ServingOptError(f"--output_base {base} is a file", "point it at a directory")
    return target


def check_writable(base: str) -> None:
    """Fails (one line) unless a staging directory can be made in ``base``.

    Probes by making and removing a hidden directory in ``base`` or, when it does not
    exist yet, in its nearest existing parent (permissions, read-only filesystems and
    ``root`` all behave as they will for the real write).
    """
    probe_dir = os.path.abspath(base)
    while not os.path.lexists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    if not os.path.isdir(probe_dir):
        raise ServingOptError(f"--output_base {base} cannot be made: {probe_dir} is a file",
                              "point --output_base at a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}probe-", dir=probe_dir))
    except OSError as e:
        raise ServingOptError(
            f"--output_base {base} is not writable ({probe_dir}: {e.strerror or e})",
            "pick a writable --output_base or fix its permissions",
        ) from e


def make_staging_dir(base: str, version: int) -> str:
    """A hidden directory inside ``base`` (same filesystem, so the final rename is atomic)."""
    # Claimed by this process (an owner record beside it): a later run removes it if
    # this one is killed, never while this one lives (stages/staging.py).
    return staging_lib.make_claimed_dir(base, f"{STAGING_PREFIX}{version}-")


def build_meta_graph(graph: ServingGraph):
    """The MetaGraphDef TF Serving's loader reads: graph, signatures, init op, assets."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.python.framework import meta_graph as meta_graph_lib

    mg = meta_graph_pb2.MetaGraphDef()
    mg.meta_info_def.tags.extend(sorted(graph.tags))
    mg.meta_info_def.tensorflow_version = tf.__version__
    mg.meta_info_def.tensorflow_git_version = tf.version.GIT_VERSION
    mg.graph_def.CopyFrom(graph.graph_def)
    # Attributes equal to their defaults are dropped, so older TF (Serving) releases that
    # do not know newer attributes can still load the model, as Builder(strip_default_attrs).
    meta_graph_lib.strip_graph_default_valued_attrs(mg)
    mg.meta_info_def.stripped_op_list.CopyFrom(
        meta_graph_lib.stripped_op_list_for_graph(mg.graph_def)
    )
    for key, sig in graph.signature_defs.items():
        mg.signature_def[key].CopyFrom(sig)
    if graph.init_op:
        # tf.saved_model.load reads a model without an object graph (what is written
        # here) through load_v1_in_v2, which turns every SignatureDef, the init-op one
        # included, into a function of its inputs; an init op fed asset paths then fails
        # to load ("depends on a placeholder which is not an input"). TF Serving and the
        # session loader find the init op in the main_op collection just the same.
        signature_form = graph.init_op_source == "signature" and not graph.asset_file_defs
        if signature_form:
            init_sig = mg.signature_def[loader.INIT_OP_SIGNATURE_KEY]
            source = graph.init_op_signature
            if source is not None and loader.INIT_OP_SIGNATURE_KEY in source.outputs and \
                    source.outputs[loader.INIT_OP_SIGNATURE_KEY].name.split(":")[0] \
                    == graph.init_op:
                init_sig.CopyFrom(source)
            else:
                init_sig.outputs[loader.INIT_OP_SIGNATURE_KEY].name = graph.init_op
        elif not graph.collections.get(loader.MAIN_OP_COLLECTION):
            key = (loader.LEGACY_INIT_OP_COLLECTION if graph.init_op_source == "legacy_init_op"
                   else loader.MAIN_OP_COLLECTION)
            mg.collection_def[key].node_list.value.append(graph.init_op)
    if graph.saver_def is not None:
        mg.saver_def.CopyFrom(graph.saver_def)
    for key, col in graph.collection_defs.items():
        mg.collection_def[key].CopyFrom(col)
    for key, names in graph.collections.items():
        if names:
            mg.collection_def[key].node_list.value.extend(names)
    for asset in graph.asset_file_defs:
        mg.asset_file_def.add().CopyFrom(asset)
        mg.collection_def[loader.ASSET_FILEPATHS_COLLECTION].node_list.value.append(
            asset.tensor_info.name
        )
        mg.collection_def[loader.SAVED_MODEL_ASSETS_COLLECTION].any_list.value.add().Pack(asset)
    return mg


def write_saved_model(graph: ServingGraph, export_dir: str) -> str:
    """Writes ``graph`` as a SavedModel into the (empty or new) ``export_dir``.

    Copies ``assets/`` and ``assets.extra/`` (warmup requests) from the source model.
    A full disk (or quota, or a read-only filesystem) is a one-line
    :class:`~serving_opt.errors.DiskFullError` naming the model base ``export_dir`` is
    staged in; the caller discards ``export_dir``.
    """
    try:
        return _write_saved_model(graph, export_dir)
    except OSError as e:  # shutil.Error (copytree) is one too
        full = storage_error(e, export_dir)
        if full is None:
            raise
        raise full from e


def _write_saved_model(graph: ServingGraph, export_dir: str) -> str:
    from tensorflow.core.protobuf import saved_model_pb2

    meta_graph = build_meta_graph(graph)
    size = meta_graph.ByteSize()
    if size >= PROTOBUF_LIMIT_BYTES - 1:  # the SavedModel around it needs a few bytes more
        raise ServingOptError(
            f"the optimized MetaGraph is {size / 2**30:.2f} GiB, over protobuf's 2 GiB limit",
            "keep variables for this model (--freeze=never)",
        )
    # Copying follows symlinks: refuse any leading out of the model (checked when the
    # model was read too; again here, right before the copy).
    if graph.source_dir:
        model_files.check_model_files(graph.source_dir)
    os.makedirs(export_dir, exist_ok=True)
    for sub in ("assets", "assets.extra"):
        src = os.path.join(graph.source_dir, sub)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(export_dir, sub), dirs_exist_ok=True)
    for asset in graph.asset_file_defs:
        copied = loader.safe_asset_path(export_dir, asset.filename)
        if not copied:
            raise ServingOptError(
                f"asset filename {asset.filename!r} escapes the assets directory",
                "re-export the model; asset filenames must be relative names inside assets/",
            )
        source = loader.safe_asset_path(graph.source_dir, asset.filename) \
            if graph.source_dir else None
        if not os.path.isfile(copied) and not (source and not os.path.lexists(source)):
            # Declared but absent in the source too: published declared the same way
            # (the loaders only build its path; inspect rates whether an op reads it).
            raise ServingOptError(
                f"asset {asset.filename} is declared by the model but missing from "
                f"{os.path.join(graph.source_dir, 'assets')}",
                "restore the asset file in the source model",
            )
    variables = os.path.join(export_dir, "variables")
    if graph.variables_dir:
        # A checkpoint written by this run (large variables kept) sits in a scratch
        # directory of the same model base: linked, not copied, however big it is.
        own = STAGING_PREFIX in os.path.basename(os.path.dirname(
            os.path.abspath(graph.variables_dir)))
        shutil.copytree(graph.variables_dir, variables, dirs_exist_ok=True,
                        copy_function=_link_or_copy if own else shutil.copy2)
    os.makedirs(variables, exist_ok=True)
    saved_model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    saved_model.meta_graphs.add().CopyFrom(meta_graph)
    tmp = os.path.join(export_dir, "saved_model.pb.tmp")
    with open(tmp, "wb") as f:
        f.write(saved_model.SerializeToString())
    os.replace(tmp, os.path.join(export_dir, "saved_model.pb"))
    return export_dir


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def publish(staging_dir: str, base: str, version: int, overwrite: bool = False) -> str:
    """Renames the finished staging directory to ``<base>/<version>``.

    With ``overwrite`` an existing version is moved aside first and deleted after the
    rename, so the directory TF Serving sees is always complete. Every other name TF
    Serving reads as the same version (``02`` for 2) is moved aside too, right after
    the rename, so the new directory is the only version ``version``. Directories are
    only renamed and then unlinked, never written into: a file of the old version that
    is a hard link of another file (the source's, say) is left as it is.
    """
    target = check_target(base, version, overwrite)
    aliases = [name for name in version_dirs(base).get(version, []) if name != str(version)]
    old = None
    if os.path.lexists(target) or aliases:
        try:
            old = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}old-{version}-", dir=base)
        except OSError as e:
            full = storage_error(e, base)
            if full is None:
                raise
            raise full from e
    if os.path.lexists(target):
        os.rename(target, os.path.join(old, "model"))
    os.rename(staging_dir, target)
    staging_lib.release(staging_dir)
    staging_lib.published.append(target)
    for number, name in enumerate(aliases):
        os.rename(os.path.join(base, name), os.path.join(old, f"alias-{number}"))
    if old:
        shutil.rmtree(old, ignore_errors=True)
    return target


def discard(staging_dir: str | None) -> None:
    """Removes a staging directory after a failure; never touches a published version."""
    if staging_dir and os.path.basename(staging_dir).startswith(STAGING_PREFIX):
        shutil.rmtree(staging_dir, ignore_errors=True)
        staging_lib.release(staging_dir)


# Constants above this size are stored as one broadcast zero in a structure copy.
_STRUCTURE_COPY_MIN_BYTES = 4096


def structure_copy(saved_model_dir: str, copy_dir: str) -> str:
    """A copy of a SavedModel with every large constant stored as one broadcast zero.

    Same graph, signatures, init op, assets (linked) and checkpoint (linked), a few
    kilobytes instead of the weights: for checks about loading, not about numbers.
    A TensorProto holding fewer values than its shape repeats the last one, so shapes
    and dtypes are unchanged.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = loader.read_saved_model(saved_model_dir)
    for meta_graph in saved_model.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes.extend(function.node_def)
        for node in nodes:
            # Numbers only: string constants are names (a saver's tensor_names, ...).
            if node.op == "Const" and node.attr["value"].tensor.ByteSize() > \
                    _STRUCTURE_COPY_MIN_BYTES and node.attr["dtype"].type != types_pb2.DT_STRING:
                _compact_zero(node.attr["value"].tensor)
    os.makedirs(copy_dir)
    for sub in ("assets", "assets.extra", "variables"):
        src = os.path.join(saved_model_dir, sub)
        if os.path.isdir(src):
            os.symlink(os.path.abspath(src), os.path.join(copy_dir, sub))
    with open(os.path.join(copy_dir, "saved_model.pb"), "wb") as f:
        f.write(saved_model_pb2.SavedModel.SerializeToString(saved_model))
    return copy_dir


def _compact_zero(tensor) -> None:
    from tensorflow.python.framework import dtypes

    dtype = dtypes.as_dtype(tensor.dtype)
    shape = type(tensor.tensor_shape)()
    shape.CopyFrom(tensor.tensor_shape)
    field = {dtypes.float32: "float_val", dtypes.float64: "double_val",
             dtypes.int32: "int_val", dtypes.int64: "int64_val", dtypes.bool: "bool_val",
             dtypes.string: "string_val", dtypes.float16: "half_val",
             dtypes.bfloat16: "half_val", dtypes.int8: "int_val", dtypes.uint8: "int_val",
             dtypes.int16: "int_val"}.get(dtype)
    if field is None:
        return  # rare dtypes keep their bytes
    tensor.Clear()
    tensor.dtype = dtype.as_datatype_enum
    tensor.tensor_shape.CopyFrom(shape)
    getattr(tensor, field).append(b"" if field == "string_val" else 0)
