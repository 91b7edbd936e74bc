"""One loaded model version: a TF session over the SavedModel's serving MetaGraph.

Loading mirrors TF Serving's SavedModelBundle: the MetaGraph of the configured tag set
(TF1 and TF2 SavedModels alike) is imported, its variables restored, its asset paths fed
and its init op run. A SavedModel is code: the version first gets every file check that
``optimize`` runs (model_files.check_model_files), and the graph is imported from the
saved_model.pb bytes that the static check read (savedmodel.checked_load), never from a
second read of the path. Reading errors use the C++ loader's codes and texts, since
GetModelStatus shows them to users.

Running mirrors ``Session::Run`` in C++: feeds go straight to the C API, so a wrong shape
fails in whatever kernel trips and a wrong dtype fails with TF's own
"Expects arg[0] to be float but string is provided" - Python's ``Session.run`` would
instead check placeholder shapes and cast values client-side, hiding what the real server
answers. One exception: a feed that reaches a convolution (:data:`RANK_ABORTING_OPS`)
whose rank differs from its placeholder's is refused before the run, because oneDNN's
convolution kernels (``TF_ENABLE_ONEDNN_OPTS``, TF's default on AVX-512 CPUs) abort the
whole process on one (a failed CHECK in tensor_format.h) where Eigen's fail the request.
The graph decides, not the CPU: every other feed runs, as TF Serving runs it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from serving_opt.model_server.status import (
    ServingStatusError,
    failed_precondition,
    from_tf_error,
    invalid_argument,
    not_found,
    unimplemented,
)

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"


@dataclass(frozen=True, order=True)
class ServableId:
    """A model name and version, printed like C++ ``ServableId::DebugString``."""

    name: str
    version: int

    def __str__(self) -> str:
        return f"{{name: {self.name} version: {self.version}}}"


@dataclass(frozen=True)
class LoadOptions:
    """How a version is loaded.

    ``session_config`` is an optional ``tf.compat.v1.ConfigProto`` (threads, ...).
    """

    tags: tuple[str, ...] = ("serve",)
    session_config: Any = field(default=None, compare=False)
    # A version with host ops (serving_opt.savedmodel.untrusted) fails to load unless set.
    allow_file_ops: bool = False
    # --prefer_tflite_model: a version with model.tflite is served by tflite.py, with
    # this many interpreters (--num_tflite_pools * --num_tflite_interpreters_per_pool).
    prefer_tflite_model: bool = False
    tflite_interpreters: int = 1


class Fetched(NamedTuple):
    """One fetched tensor with the dtype of the graph tensor it came from."""

    value: np.ndarray
    dtype: int  # tensorflow.DataType enum


def read_saved_model(export_dir: str):
    """Reads ``saved_model.pb``/``.pbtxt`` with the C++ reader's error codes and texts.

    The file is read only as a regular file (a symlink only to one, as TF Serving follows
    links) within protobuf's 2 GiB limit (model_files.read_model_file): a FIFO would hang the
    load and a link to /dev/zero would be read until memory runs out; both fail the load
    with DATA_LOSS instead, upstream's code for a file it cannot parse.
    """
    import grpc
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    pb_path = os.path.join(export_dir, SAVED_MODEL_PB)
    pbtxt_path = os.path.join(export_dir, SAVED_MODEL_PBTXT)
    if os.path.lexists(pb_path):
        data = _read_model_file(pb_path)
        try:
            saved_model.ParseFromString(data)
        except message.DecodeError:
            raise ServingStatusError(
                grpc.StatusCode.DATA_LOSS, f"Can't parse {pb_path} as binary proto"
            ) from None
        return saved_model
    if os.path.lexists(pbtxt_path):
        text = _read_model_file(pbtxt_path).decode("utf-8", errors="replace")
        try:
            text_format.Parse(text, saved_model)
        except text_format.ParseError:
            raise ServingStatusError(
                grpc.StatusCode.DATA_LOSS, f"Can't parse {pbtxt_path} as text proto"
            ) from None
        return saved_model
    raise not_found(
        "Could not find SavedModel .pb or .pbtxt at supplied export directory path: "
        f"{export_dir}. Check that the directory exists and that you have the right "
        "permissions for accessing it."
    )


def _read_model_file(path: str) -> bytes:
    import grpc

    from serving_opt.savedmodel import model_files

    try:
        return model_files.read_model_file(path)
    except model_files.UnsafeModelFile as e:
        raise _unsafe_file_status(e) from None
    except OSError as e:
        raise ServingStatusError(grpc.StatusCode.DATA_LOSS,
                                 f"Can't read {path}: {e.strerror or e}") from None


def _unsafe_file_status(error) -> ServingStatusError:
    import grpc

    return ServingStatusError(grpc.StatusCode.DATA_LOSS, error.reason)


def refuse_host_ops(meta_graph_def, export_dir: str) -> None:
    """A SavedModel is code: the version fails to load (FAILED_PRECONDITION, the whole
    story in one line) when the static check finds a host op, before anything runs.
    """
    from serving_opt.errors import ServingOptError
    from serving_opt.savedmodel import loader, untrusted

    try:
        untrusted.refuse_host_ops(meta_graph_def,
                                  sorted(loader.serving_signatures(meta_graph_def)), "serve")
    except ServingOptError as e:
        raise failed_precondition(
            f"{export_dir}: {e.problem}; pass --allow_file_ops only for a model you trust "
            "(serving-opt inspect lists every host op)") from e


TF_TEXT_PACKAGE = "tensorflow-text"


def load_custom_op_libraries() -> list[str]:
    """Registers the ops of the op libraries TF Serving links in (TensorFlow Text), by
    importing them when installed; returns the modules imported.
    """
    import importlib.util

    loaded = []
    if importlib.util.find_spec("tensorflow_text") is not None:
        import tensorflow_text  # noqa: F401 - registers ConstrainedSequence, ... (side effect)

        loaded.append("tensorflow_text")
    return loaded


def with_custom_op_hint(error: ServingStatusError) -> ServingStatusError:
    """A load error for an op this TensorFlow does not know says which package TF
    Serving's build links that may provide it (TensorFlow Text), when it is not installed.
    """
    import importlib.util

    if "Op type not registered" not in error.message or importlib.util.find_spec(
            "tensorflow_text") is not None:
        return error
    return ServingStatusError(
        error.code,
        f"{error.message}\nTF Serving links TensorFlow Text's ops; if this is one of them, "
        f"install the `{TF_TEXT_PACKAGE}` package matching this TensorFlow (pip install "
        "'serving-opt[text]') and restart the server")


def check_model_files(export_dir: str) -> None:
    """optimize's file checks (model_files.check_model_files), with the model base as the
    version's parent: a FIFO, device or socket (or a link to one) that TensorFlow's
    restore or the init op would block on fails the load with DATA_LOSS; a symlink out of
    the version (another model's files, /dev/zero), a version directory linked out of its
    base, or an asset hard-linked outside the model base with FAILED_PRECONDITION.
    """
    from serving_opt.errors import ServingOptError
    from serving_opt.savedmodel import model_files

    base = os.path.dirname(os.path.abspath(export_dir))
    real_base, real = os.path.realpath(base), os.path.realpath(export_dir)
    if os.path.commonpath([real_base, real]) != real_base:
        # A version linked to another model's version would load that model's files.
        raise failed_precondition(
            f"{export_dir} is a symlink to {real}, outside its model base {base}; symlinks "
            "out of a model are never followed; replace the link with a copy of the version")
    try:
        model_files.check_model_files(export_dir, base=base)
    except model_files.UnsafeModelFile as e:
        raise _unsafe_file_status(e) from None
    except ServingOptError as e:
        raise failed_precondition(f"{export_dir}: {e.one_line()}") from None


def check_bundle_directory(export_dir: str) -> None:
    """TF Serving's checks before loading a version (``LoadSessionBundleOrSavedModelBundle``).

    A legacy SessionBundle (``export.meta``) is UNIMPLEMENTED; a directory with neither
    ``saved_model.pb`` nor ``saved_model.pbtxt`` is NOT_FOUND, with upstream's texts.
    """
    if os.path.exists(os.path.join(export_dir, "export.meta")):
        raise unimplemented("Session Bundle is deprecated and removed.")
    if not any(
        os.path.exists(os.path.join(export_dir, name))
        for name in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT)
    ):
        raise not_found(
            "Specified file path does not appear to contain a SavedModel bundle (should have "
            f"a file called `saved_model.pb`)\nSpecified file path: {export_dir}"
        )


def find_meta_graph(saved_model, tags: Sequence[str]):
    """The MetaGraphDef whose tag set equals ``tags`` exactly (C++ ``FindMetaGraphDef``)."""
    wanted = set(tags)
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == wanted:
            return meta_graph
    raise not_found(
        f"Could not find meta graph def matching supplied tags: {{ {' '.join(tags)} }}. "
        "To inspect available tag-sets in the SavedModel, please use the SavedModel CLI: "
        "`saved_model_cli`"
    )


@functools.lru_cache(maxsize=1)
def onednn_kernels_on() -> bool:
    """Whether this process's TensorFlow runs oneDNN's kernels (TF's default on x86 CPUs
    with AVX-512 VNNI and newer, unless ``TF_ENABLE_ONEDNN_OPTS=0``).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without the query: go by the switch alone
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower() not in ("0", "false")
    return bool(_pywrap_util_port.IsMklEnabled())


# Ops whose oneDNN kernels fail a CHECK (the process aborts) on an input of the wrong
# rank: found by running each common op with a wrongly ranked input under
# TF_ENABLE_ONEDNN_OPTS=1 (TF 2.21): Conv2D, Conv3D and DepthwiseConv2dNative abort;
# pooling, batch norm, MatMul, BatchMatMul, Einsum, BiasAdd, element-wise ops, reductions,
# Transpose, Concat and Conv2DBackpropInput fail the request. Fused, quantized and
# oneDNN-rewritten forms of a convolution carry its name.
RANK_ABORTING_OPS = re.compile(r"Conv[23]D|DepthwiseConv2d")


class RankAbortingOps:
    """Which op of :data:`RANK_ABORTING_OPS` a fed tensor's value can reach: through the
    graph's edges, or into a function call when a function of the library holds one (a
    call is not followed inside)."""

    def __init__(self, graph_def) -> None:
        self._nodes = {node.name: node for node in graph_def.node}
        self._consumers: dict[str, list] = {}
        for node in graph_def.node:
            for name in node.input:
                if not name.startswith("^"):
                    self._consumers.setdefault(name.split(":")[0], []).append(node)
        self._functions = {f.signature.name for f in graph_def.library.function}
        self._in_functions = next(
            (n.op for f in graph_def.library.function for n in f.node_def
             if RANK_ABORTING_OPS.search(n.op)), None)
        self._any = self._in_functions or next(
            (n.op for n in graph_def.node if RANK_ABORTING_OPS.search(n.op)), None)
        self._reached: dict[str, str | None] = {}

    def reached_from(self, tensor: str) -> str | None:
        """The op a value fed to ``tensor`` ("x:0") can reach, or None."""
        start = tensor.split(":")[0]
        if not self._any:
            return None
        if start not in self._reached:  # racing threads compute the same answer
            self._reached[start] = self._search(start)
        return self._reached[start]

    def _search(self, start: str) -> str | None:
        seen, todo = {start}, [start]
        while todo:
            node = self._nodes.get(todo.pop())
            if node is None:
                continue
            if RANK_ABORTING_OPS.search(node.op):
                return node.op
            if self._in_functions and (node.op in self._functions or any(
                    value.func.name or value.list.func for value in node.attr.values())):
                return self._in_functions
            for consumer in self._consumers.get(node.name, ()):
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    todo.append(consumer.name)
        return None


def _canonical_tensor_name(name: str) -> str:
    # C++ ParseTensorName reads "x" as "x:0"; Graph.get_tensor_by_name insists on the index.
    return name if ":" in name else f"{name}:0"


class Servable:
    """A loaded SavedModel version. Thread-safe: TF sessions run concurrently."""

    def __init__(self, servable_id: ServableId, path: str, session, meta_graph_def) -> None:
        self.id = servable_id
        self.path = path
        self.meta_graph_def = meta_graph_def
        self._session = session
        self._graph = session.graph
        # (name, is feed) -> (TF_Output, dtype enum, declared rank or None)
        self._outputs: dict[tuple[str, bool], tuple[Any, int, int | None]] = {}
        self._outputs_lock = threading.Lock()
        self.batching = None  # a batching.BatchingSession once enable_batching ran
        self._asset_dir = ""  # the private copies of the assets (loader.pin_assets)
        self._rank_aborting = RankAbortingOps(meta_graph_def.graph_def)

    def enable_batching(self, scheduler) -> None:
        """Wraps the session for batching (upstream ``WrapSessionForBatching``).

        Runs whose feeds and fetches are a SignatureDef's tensors then go through
        ``scheduler`` and may share one session run with concurrent runs (batching.py).
        """
        from serving_opt.model_server.batching import BatchingSession

        self.batching = BatchingSession(scheduler, self.signature_defs, self.run_direct)

    @property
    def signature_defs(self) -> Mapping[str, Any]:
        """Every SignatureDef of the serving MetaGraph, ``__saved_model_init_op`` included."""
        return self.meta_graph_def.signature_def

    @classmethod
    def load(cls, servable_id: ServableId, path: str, options: LoadOptions) -> Servable:
        """Loads ``path`` into a new graph and session; raises ServingStatusError."""
        import tensorflow as tf

        from serving_opt.savedmodel import checked_load, model_files

        # Reading first gives the C++ loader's messages for the common failures; TF's
        # Python loader would raise OSError/RuntimeError with different wording.
        # saved_model.pb is read once: the graph built is the one checked here, not what
        # the path holds by the time a second reader opens it.
        check_bundle_directory(path)
        meta_graph_def = find_meta_graph(read_saved_model(path), options.tags)
        check_model_files(path)
        if not options.allow_file_ops:
            refuse_host_ops(meta_graph_def, path)
        graph = tf.Graph()
        session = tf.compat.v1.Session(graph=graph, config=options.session_config)
        if not all(hasattr(session, a) for a in ("_call_tf_sessionrun", "_extend_graph")):
            session.close()
            raise unimplemented(
                f"TensorFlow {tf.__version__} lacks the Session internals the local server "
                "runs requests through (Session._call_tf_sessionrun); use TensorFlow 2.15-2.21"
            )
        asset_dir = tempfile.mkdtemp(prefix="serving-opt-assets-")
        try:
            checked_load.load_checked_session(session, meta_graph_def, path, asset_dir)
            # The loader built the graph after the session was created: push it to the C
            # session once, then freeze it so request threads never mutate it.
            session._extend_graph()  # the C-API path needs the full graph
            graph.finalize()
        except BaseException as e:
            session.close()
            shutil.rmtree(asset_dir, ignore_errors=True)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(e, model_files.UnsafeModelFile):
                raise _unsafe_file_status(e) from None
            raise with_custom_op_hint(from_tf_error(e)) from e
        servable = cls(servable_id, path, session, meta_graph_def)
        servable._asset_dir = asset_dir  # a model with --allow_file_ops may read them later
        return servable

    def _tf_output(self, name: str, feed: bool) -> tuple[Any, int, int | None]:
        key = (name, feed)
        cached = self._outputs.get(key)
        if cached is not None:
            return cached
        try:
            tensor = self._graph.get_tensor_by_name(_canonical_tensor_name(name))
        except (KeyError, ValueError):
            # The texts DirectSession gives when a signature names a missing tensor.
            if feed:
                raise not_found(f"FeedInputs: unable to find feed output {name}") from None
            raise not_found(f"FetchOutputs node {name}: not found") from None
        entry = (tensor._as_tf_output(), tensor.dtype.as_datatype_enum, tensor.shape.rank)
        with self._outputs_lock:
            self._outputs[key] = entry
        return entry

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None = None,
    ) -> list[Fetched]:
        """``Session::Run`` through the batcher when batching is on, else :meth:`run_direct`."""
        self._check_ranks(feeds)
        if self.batching is not None:
            return self.batching.run(feeds, fetches, timeout_ms)
        return self.run_direct(feeds, fetches, timeout_ms)

    def _check_ranks(self, feeds: Mapping[str, np.ndarray]) -> None:
        for name, value in feeds.items():
            op = self._rank_aborting.reached_from(name)
            if op is None:
                continue
            try:
                rank = self._tf_output(name, True)[2]
            except ServingStatusError:
                continue  # a missing feed: run_direct answers it with TF's text, as before
            if rank is not None and np.ndim(value) != rank:
                got = ",".join(str(d) for d in np.shape(value))
                raise invalid_argument(
                    f"input {name} must be {rank}-dimensional, not [{got}]: refused before "
                    f"the run because the model's {op} aborts the server on a wrongly "
                    "ranked input under oneDNN's kernels"
                )

    def run_direct(
        self,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None = None,
    ) -> list[Fetched]:
        """``Session::Run`` with feeds and fetches by tensor name, no client-side checks.

        ``timeout_ms`` becomes ``RunOptions.timeout_in_ms`` (how TF Serving enforces a
        client's gRPC deadline). Raises ServingStatusError with TF's code and message.
        """
        import tensorflow as tf
        from tensorflow.python.client import pywrap_tf_session

        feed_dict = {self._tf_output(name, True)[0]: value for name, value in feeds.items()}
        outputs = [self._tf_output(name, False) for name in fetches]
        options = None
        if timeout_ms is not None and timeout_ms > 0:
            run_options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_ms))
            options = pywrap_tf_session.TF_NewBufferFromString(run_options.SerializeToString())
        try:
            values = self._session._call_tf_sessionrun(  # private on purpose: see module doc
                options, feed_dict, [out for out, _, _ in outputs], [], None
            )
        except tf.errors.OpError as e:
            raise from_tf_error(e) from None
        finally:
            if options is not None:
                pywrap_tf_session.TF_DeleteBuffer(options)
        return [Fetched(np.asarray(v), dtype) for v, (_, dtype, _) in zip(values, outputs)]

    def close(self) -> None:
        """Releases the session (the unload step). Safe to call twice.

        With batching, queued runs are run first and the queues removed.
        """
        batching, self.batching = self.batching, None
        if batching is not None:
            batching.close()
        self._session.close()
        if self._asset_dir:
            shutil.rmtree(self._asset_dir, ignore_errors=True)
