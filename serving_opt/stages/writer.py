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

from serving_opt.errors import ServingOptError
from serving_opt.graph import PROTOBUF_LIMIT_BYTES, ServingGraph
from serving_opt.stages import loader
from serving_opt.stages import staging as staging_lib

STAGING_PREFIX = ".serving-opt-staging-"


# TF Serving reads version directory names as int64 (FileSystemStoragePathSource).
MAX_VERSION = 2**63 - 1
_VERSION_NAME = re.compile(r"[0-9]+")


def parse_version(name: str) -> int | None:
    """The version a directory name stands for: ASCII digits within int64, else None.

    ``str.isdigit`` is not enough: it accepts "²" (int() fails) and "٣" (int() gives 3).

    Example:
        >>> parse_version("12"), parse_version("²"), parse_version("99999999999999999999")
        (12, None, None)
    """
    if not _VERSION_NAME.fullmatch(name):
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


def existing_versions(base: str) -> list[int]:
    """Integer version directories in a model base, sorted.

    Only directories named by a version in canonical form (``3``, not ``03``) count;
    files and other names are not versions.

    Example:
        >>> existing_versions("/models/clf")
        [1, 2]
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
    """One more than the highest version name taken in ``base`` (1 for a new base).

    Any entry named like a version takes it, a plain file included: the next version
    is always free.

    Example:
        >>> next_version("/models/new")
        1
    """
    if not os.path.isdir(base):
        return 1
    taken = [v for v in map(parse_version, os.listdir(base)) if v is not None]
    version = max(taken) + 1 if taken else 1
    if version > MAX_VERSION:
        raise ServingOptError(f"{base} already holds version {MAX_VERSION}, the largest "
                              "TF Serving reads", "pass --version=N for a free N")
    return version


def check_version(version) -> None:
    """Refuses a version TF Serving cannot read: negative or beyond int64.

    Example:
        >>> check_version(2**63)
        Traceback (most recent call last):
        ServingOptError: version 9223372036854775808 is out of range ...
    """
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


def check_target(base: str, version: int, overwrite: bool = False,
                 source: str | None = None) -> str:
    """Fails early when the version directory exists and overwriting was not asked for,
    or when it is (or contains) ``source``, the model being read.

    Example:
        >>> check_target("/models/clf", 3)
        '/models/clf/3'
    """
    check_version(version)
    target = os.path.join(base, str(version))
    if source is not None:
        src = os.path.realpath(source)
        dst = os.path.realpath(target)
        if src == dst or src.startswith(dst + os.sep):
            raise ServingOptError(
                f"version directory {target} is the input model {source}"
                + ("" if src == dst else " or contains it")
                + "; writing it would destroy the source",
                "pick another --version or --output_base",
            )
    if os.path.lexists(target) and not overwrite:
        raise ServingOptError(
            f"version directory {target} already exists",
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

    Example:
        >>> check_writable("/models/clf")
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
    """A hidden directory inside ``base`` (same filesystem, so the final rename is atomic).

    Example:
        >>> make_staging_dir("/models/clf", 3)
        '/models/clf/.serving-opt-staging-3-k2j4x'
    """
    # Claimed by this process (an owner record beside it): a later run removes it if
    # this one is killed, never while this one lives (stages/staging.py).
    return staging_lib.make_claimed_dir(base, f"{STAGING_PREFIX}{version}-")


def build_meta_graph(graph: ServingGraph):
    """The MetaGraphDef TF Serving's loader reads: graph, signatures, init op, assets.

    Example:
        >>> sorted(build_meta_graph(optimized).signature_def)
        ['classification', 'predict', 'serving_default']
    """
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

    Example:
        >>> write_saved_model(optimized, "/models/clf/.staging")
        '/models/clf/.staging'
    """
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
        loader.check_model_files(graph.source_dir)
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
        if not os.path.isfile(copied):
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
    rename, so the directory TF Serving sees is always complete.

    Example:
        >>> publish("/models/clf/.serving-opt-staging-3-x", "/models/clf", 3)
        '/models/clf/3'
    """
    target = check_target(base, version, overwrite)
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}old-{version}-", dir=base)
        os.rename(target, os.path.join(old, "model"))
    os.rename(staging_dir, target)
    staging_lib.release(staging_dir)
    staging_lib.published.append(target)
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

    Example:
        >>> structure_copy("models/clf/1", "/tmp/check/1")
        '/tmp/check/1'
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
