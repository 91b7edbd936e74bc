"""Serving memory as ``tensorflow_model_server`` holds it: TensorFlow's C++ runtime, a fresh
process, no Python TensorFlow.

TF Serving is a C++ process: it holds the C++ runtime's code pages (shared-library text
the kernel counts in its RSS, ~320 MiB for TensorFlow 2.x) and none of the Python API's
objects (~210 MiB of heap once ``import tensorflow`` has run). Neither of the other ways
this project measures counts that: a process that imports ``tensorflow`` holds the Python
objects, and a child forked from it (``serving_opt.core.measuring``) does not count the code
pages, since Linux does not copy the page-table entries of file-backed mappings at fork.
Both shift every "optimized / original" memory ratio, by different amounts.

So here a fresh ``python -m serving_opt.savedmodel.native_load`` (which never imports the
``tensorflow`` package, nor numpy: ctypes only) loads ``libtensorflow_framework.so.2`` and
``libtensorflow_cc.so.2`` and goes through the stages of a TF Serving load, taking the
memory after each:

* ``interpreter``: Python alone (what this harness adds over the server);
* ``libraries``: TensorFlow's shared libraries loaded, as pip installs them;
* ``runtime``: the C++ runtime loaded, no model yet (a server's fixed cost): the
  libraries less their dynamic-linking tables (see below);
* ``load``: ``TF_LoadSessionFromSavedModel``: the C++ ``LoadSavedModel`` TF Serving's
  own loader calls (graph, restore, init op) with default session options, as TF
  Serving's; it cannot be split into its steps from outside. The C API also imports the
  GraphDef into a ``TF_Graph`` of its own (to look operations up by name): one more
  copy of the graph than the server holds, small for models whose weights are
  variables (all of ours), not for a graph of large constants;
* ``warmup``: ``assets.extra/tf_serving_warmup_requests`` replayed, each record once,
  as TF Serving does before a version is AVAILABLE (absent when the model has no file:
  :attr:`NativeLoad.warmup_records` is 0 then);
* ``first request``: one ``TF_SessionRun`` of the signature's outputs for the given feed
  (numbers or strings, e.g. serialized tf.Examples).

The dynamic-linking tables: pip's ``libtensorflow_cc.so.2`` exports ~1M C++ symbols, and
loading it reads its symbol tables (``.dynstr``, ``.dynsym``, ``.gnu.hash``, versions,
``.rela.plt``: ~120 MiB for TF 2.21) to bind them; those pages then stay resident,
though nothing reads them again. ``tensorflow_model_server`` is one statically linked
binary: it has no such tables (its relocations, ``.rela.dyn``, it has too, and they are
kept here). So once the libraries are loaded, those tables' pages are dropped from this
process (``madvise(MADV_DONTNEED)``: clean, read-only file pages; anything that reads
them again faults them back in, and they count again), and ``runtime`` is measured
after that. ``measure(..., static_runtime=False)`` keeps them, to measure as the pip
libraries load. The peak (the kernel's high-water mark) still includes them for the
moment they were resident, which is below any model's load.

Per stage: the peak so far (``getrusage``: the kernel's VmHWM, file pages included) and
VmRSS, RssAnon and RssFile from ``/proc/self/status`` (0 where it cannot be read). The
measured process is forked from the started one before anything happens in it, so its
peak is its own (see ``_main``), not the calling process's.

The signature and the warmup records are read in the calling process (the
``tensorflow.core`` protobuf classes import the whole runtime: they cannot be used in
the measured one) and handed over as tensor names and plain data (bytes, lists of
bytes): the measured process does not import numpy either.

Trust: this runs a model's graph, unsandboxed. It is for our own benchmark models
(``benchmarks/int8_memory.py``, the tests); running a user's, untrusted model with it
would need the project's sandbox (``serving_opt/sandbox/``), as every other path that
runs a model has.

    result = measure("build/bench/int8_memory/text_1000000x256/int8/1",
                     {"inputs": np.array(serialized_examples, dtype=object)})
    result.peak_rss_bytes, result.steady_rss_bytes, result.runtime_rss_bytes
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# No TensorFlow at import (os only): the measured process imports this module too.
from serving_opt.savedmodel.warmup_replay import MAX_RECORDS, WARMUP_FILENAME

_RESULT = "native_load_result: "  # the prefix of the child's one result line

# TF_DataType (tensorflow/c/tf_datatype.h) by numpy dtype name.
_TF_TYPES = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6,
             "int64": 9, "bool": 10, "uint16": 17, "float16": 19, "uint32": 22,
             "uint64": 23}
_NP_TYPES = {code: name for name, code in _TF_TYPES.items()}
_TF_STRING = 7
_TSTRING_SIZE = 24  # sizeof(TF_TString) (tensorflow/core/platform/ctstring_internal.h)


@dataclass(frozen=True)
class Stage:
    """Memory after one stage: the peak so far (getrusage) and what /proc/self/status
    says is resident now (0s where it cannot be read).
    """

    name: str
    peak_rss_bytes: int
    rss_bytes: int
    rss_anon_bytes: int
    rss_file_bytes: int


@dataclass(frozen=True)
class NativeLoad:
    """One model loaded by TensorFlow's C++ runtime in a fresh process (see the module).

    ``outputs`` (the first request's, by output alias) is only filled when asked for.
    """

    load_seconds: float  # TF_LoadSessionFromSavedModel and the warmup replay
    warmup_seconds: float
    warmup_records: int  # 0: the model has no warmup file (the stage was skipped)
    first_request_seconds: float
    peak_rss_bytes: int  # the process's peak, runtime and interpreter included
    steady_rss_bytes: int  # resident after the first request
    runtime_rss_bytes: int  # resident with the runtime loaded, before any model
    interpreter_rss_bytes: int  # Python alone: this harness's own share
    stages: tuple[Stage, ...]
    outputs: Mapping = field(default_factory=dict, compare=False, repr=False)

    def stage(self, name: str) -> Stage | None:
        """The stage called ``name``, or None (``warmup`` without a warmup file)."""
        return next((s for s in self.stages if s.name == name), None)

    def to_dict(self) -> dict:
        """JSON-able, without the outputs."""
        return {"load_seconds": self.load_seconds, "warmup_seconds": self.warmup_seconds,
                "warmup_records": self.warmup_records,
                "first_request_seconds": self.first_request_seconds,
                "peak_rss_bytes": self.peak_rss_bytes,
                "steady_rss_bytes": self.steady_rss_bytes,
                "runtime_rss_bytes": self.runtime_rss_bytes,
                "interpreter_rss_bytes": self.interpreter_rss_bytes,
                "stages": [list(vars(s).values()) for s in self.stages]}


def tensorflow_dir() -> str:
    """The installed ``tensorflow`` package's directory (the shared libraries are there),
    found without importing it.
    """
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("TensorFlow is not installed: no C++ runtime to load")
    return list(spec.submodule_search_locations)[0]


def measure(model_dir: str, feeds: Mapping, signature: str = "serving_default",
            tags: Iterable[str] = ("serve",), *, return_outputs: bool = False,
            static_runtime: bool = True, timeout: float = 1800.0) -> NativeLoad:
    """Loads ``model_dir`` in a fresh process with TensorFlow's C++ runtime and answers one
    request: ``feeds`` maps ``signature``'s input aliases to arrays (strings as bytes in
    an object array); every output of the signature is fetched.

    Raises RuntimeError with the child's error when the load, the warmup or the request
    fails (TF Serving refuses such a version too). Our own models only: see the module's
    note on trust. ``static_runtime``: the libraries' dynamic-linking tables are dropped
    before the model loads, as a statically linked server never holds them (see the
    module); False measures the libraries as pip's loader leaves them.
    """
    from serving_opt.savedmodel import loader, tf_process

    tags = sorted(tags)
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    if signature not in meta_graph.signature_def:
        raise ValueError(f"{model_dir} has no signature {signature!r}")
    sig = meta_graph.signature_def[signature]
    unknown = sorted(set(feeds) - set(sig.inputs))
    if unknown:
        raise ValueError(f"signature {signature!r} has no inputs {unknown}; it has "
                         f"{sorted(sig.inputs)}")
    aliases = sorted(sig.outputs)
    job = {"tf_dir": tensorflow_dir(), "model": os.path.abspath(model_dir), "tags": tags,
           "feed": _plain_feed({sig.inputs[a].name: v for a, v in feeds.items()}),
           "fetch": [sig.outputs[a].name for a in aliases],
           "warmup": [[(_plain_feed(feed), fetch) for feed, fetch in runs]
                      for runs in _warmup_runs(model_dir, meta_graph)],
           "outputs": return_outputs, "static_runtime": static_runtime}
    with tempfile.TemporaryDirectory(prefix="native-load-") as scratch:
        job_path = os.path.join(scratch, "job.pkl")
        with open(job_path, "wb") as f:
            pickle.dump(job, f)
        # TensorFlow's defaults, as TF Serving runs (not the optimizer's own settings);
        # serving_opt importable from the child whether installed or not.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = tf_process.with_runtime_defaults({
            **os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))})
        # A session of its own: on a timeout the measured process (forked by the one
        # started here) is killed with it, not left holding a model's memory.
        process = subprocess.Popen([sys.executable, "-m", __name__, job_path], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        line = next((x for x in stdout.splitlines() if x.startswith(_RESULT)), None)
        if process.returncode != 0 or line is None:
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"native load of {model_dir} failed: {tail}")
        result = json.loads(line[len(_RESULT):])
        outputs = {}
        if return_outputs:
            with open(job_path + ".out", "rb") as f:
                outputs = dict(zip(aliases, [_array(v) for v in pickle.load(f)]))
    return NativeLoad(
        load_seconds=result["load_seconds"], warmup_seconds=result["warmup_seconds"],
        warmup_records=result["warmup_records"],
        first_request_seconds=result["first_request_seconds"],
        peak_rss_bytes=result["peak_rss_bytes"], steady_rss_bytes=result["steady_rss_bytes"],
        runtime_rss_bytes=result["runtime_rss_bytes"],
        interpreter_rss_bytes=result["interpreter_rss_bytes"],
        stages=tuple(Stage(*s) for s in result["stages"]), outputs=outputs)


def _array(plain: tuple):
    """A numpy array of a plain ``(dtype name, shape, data)``."""
    import numpy as np

    dtype, shape, data = plain
    if dtype == "string":
        return np.array(data, dtype=object).reshape(shape)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _plain_feed(feed: Mapping) -> dict:
    """``feed`` (tensor name -> array-like) as ``(dtype name, shape, data)`` with plain
    Python data (bytes, or a list of bytes for strings), which the measured process reads
    without numpy: numpy's ~15 MiB are not the server's."""
    import numpy as np

    plain = {}
    for name, value in feed.items():
        value = np.asarray(value)
        if value.dtype.kind in "OSU":
            data = [v.encode() if isinstance(v, str) else bytes(v) for v in value.reshape(-1)]
            plain[name] = ("string", value.shape, data)
        else:
            plain[name] = (value.dtype.name, value.shape,
                           np.ascontiguousarray(value).tobytes())
    return plain


def _warmup_runs(model_dir: str, meta_graph) -> list:
    """The model's warmup file as ``(feed by tensor name, fetch names)`` runs, read here
    with TF's protobuf classes, as ``warmup_replay`` reads it (at most its MAX_RECORDS)."""
    path = os.path.join(model_dir, "assets.extra", WARMUP_FILENAME)
    if not os.path.exists(path):
        return []
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    # The replay's own reading of a record (and its refusals), so both replays agree.
    from serving_opt.savedmodel.warmup_replay import _runs

    records = []
    for record in tf.compat.v1.io.tf_record_iterator(path):
        if len(records) >= MAX_RECORDS:
            break
        log = prediction_log_pb2.PredictionLog.FromString(record)
        records.append(_runs(log, meta_graph))
    return records


# --- the measured process: ctypes only --------------------------------------------------


class _Output(ctypes.Structure):
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


def _status_fields() -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon and RssFile in bytes (0s without a readable /proc)."""
    got = {"VmHWM": 0, "VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in got:
                    got[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return got


def _stage(name: str, before: list | None = None) -> list:
    """``[name, peak so far, VmRSS, RssAnon, RssFile]``; the peak never below the one
    ``before`` (the stages' list so far) reached."""
    now = _status_fields()
    # ru_maxrss is in KiB on Linux: the kernel's high-water mark, file pages included.
    # The kernel's RSS counters are cached per thread and lag by a few pages, so a
    # peak read now can be a little below VmRSS read now: the peak is never less.
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, now["VmHWM"],
               now["VmRSS"], *(stage[1] for stage in before or ()))
    return [name, peak, now["VmRSS"], now["RssAnon"], now["RssFile"]]


# Sections only the dynamic linker reads, to bind symbols by name: a statically linked
# server has none of them.
_LINKER_TABLES = frozenset({".dynsym", ".dynstr", ".gnu.hash", ".hash", ".gnu.version",
                            ".gnu.version_r", ".gnu.version_d", ".rela.plt"})
_PAGE = 4096
_MADV_DONTNEED = 4


def linker_table_ranges(path: str, base: int) -> list[tuple[int, int]]:
    """The whole pages of ``path``'s dynamic-linking tables (:data:`_LINKER_TABLES`) in
    its read-only, non-executable segment, as ``(start, end)`` addresses for the library
    loaded at ``base``; merged, sorted. Reads the ELF64 headers; [] for anything else.
    """
    import struct

    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return []
        phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", header,
                                                                          0x36)
        f.seek(phoff)
        programs = [struct.unpack_from("<IIQQQQQQ", f.read(phentsize)) for _ in range(phnum)]
        f.seek(shoff)
        sections = [struct.unpack_from("<IIQQQQ", f.read(shentsize)) for _ in range(shnum)]
        _, _, _, _, names_offset, names_size = sections[shstrndx]
        f.seek(names_offset)
        names = f.read(names_size)
    # PT_LOAD segments that are readable only (no write: nothing relocated in them, so
    # their pages are the file's; no execute: not code).
    read_only = [(vaddr, vaddr + filesz) for kind, flags, _, vaddr, _, filesz, _, _
                 in programs if kind == 1 and flags == 4]
    ranges = []
    for name_at, _, _, addr, _, size in sections:
        name = names[name_at:names.index(b"\0", name_at)].decode()
        if name not in _LINKER_TABLES or not size:
            continue
        if not any(lo <= addr and addr + size <= hi for lo, hi in read_only):
            continue
        start = -(-(base + addr) // _PAGE) * _PAGE
        end = (base + addr + size) // _PAGE * _PAGE
        if end > start:
            ranges.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _release_linker_tables(paths: list[str]) -> None:
    """Drops the resident pages of the loaded libraries' dynamic-linking tables (see the
    module): only where /proc/self/maps shows the library mapped privately, read-only,
    from its start, so the pages are the file's and fault back in when read."""
    try:
        with open("/proc/self/maps") as f:
            maps = [line.split() for line in f]
    except OSError:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for path in paths:
        real = os.path.realpath(path)
        mapped = [(int(a, 16), int(b, 16), perms, int(offset, 16)) for (a, b), perms, offset
                  in ((fields[0].split("-"), fields[1], fields[2]) for fields in maps
                      if len(fields) >= 6 and os.path.realpath(fields[5]) == real)]
        base = next((lo for lo, _, _, offset in mapped if offset == 0), None)
        if base is None:
            continue
        for start, end in linker_table_ranges(path, base):
            inside = any(lo <= start and end <= hi and perms == "r--p"
                         for lo, hi, perms, _ in mapped)
            if inside:
                libc.madvise(start, end - start, _MADV_DONTNEED)


class _Runtime:
    """TensorFlow's C API, through ctypes."""

    def __init__(self, tf_dir: str):
        # The framework library first and global: libtensorflow_cc resolves against it.
        self.paths = [os.path.join(tf_dir, name) for name in (
            "libtensorflow_framework.so.2", "libtensorflow_cc.so.2")]
        ctypes.CDLL(self.paths[0], mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(self.paths[1], mode=ctypes.RTLD_GLOBAL)
        p, i, i64, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
        for name, restype, argtypes in (
                ("TF_NewStatus", p, []), ("TF_GetCode", i, [p]),
                ("TF_Message", ctypes.c_char_p, [p]), ("TF_NewGraph", p, []),
                ("TF_NewSessionOptions", p, []),
                ("TF_LoadSessionFromSavedModel", p,
                 [p, p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), i, p, p, p]),
                ("TF_GraphOperationByName", p, [p, ctypes.c_char_p]),
                ("TF_SessionRun", None, [p, p, ctypes.POINTER(_Output), ctypes.POINTER(p), i,
                                         ctypes.POINTER(_Output), ctypes.POINTER(p), i, p, i,
                                         p, p]),
                ("TF_AllocateTensor", p, [i, ctypes.POINTER(i64), i, size]),
                ("TF_DeleteTensor", None, [p]), ("TF_TensorData", p, [p]),
                ("TF_TensorByteSize", size, [p]), ("TF_TensorType", i, [p]),
                ("TF_NumDims", i, [p]), ("TF_Dim", i64, [p, i]),
                ("TF_StringInit", None, [p]),
                ("TF_StringCopy", None, [p, ctypes.c_char_p, size]),
                ("TF_StringGetDataPointer", p, [p]), ("TF_StringGetSize", size, [p]),
                ("TF_StringDealloc", None, [p])):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib
        self.status = lib.TF_NewStatus()
        self.graph = None
        self.session = None

    def check(self, what: str) -> None:
        if self.lib.TF_GetCode(self.status) != 0:
            raise RuntimeError(f"{what}: {self.lib.TF_Message(self.status).decode()}")

    def load(self, model: str, tags: list[str]) -> None:
        lib = self.lib
        self.graph = lib.TF_NewGraph()
        c_tags = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
        # Default options, as TF Serving's; its own LoadSavedModel: graph, restore, init op.
        self.session = lib.TF_LoadSessionFromSavedModel(
            lib.TF_NewSessionOptions(), None, model.encode(), c_tags, len(tags), self.graph,
            None, self.status)
        self.check(f"loading {model}")

    def _output(self, name: str) -> _Output:
        op, _, index = name.partition(":")
        oper = self.lib.TF_GraphOperationByName(self.graph, op.encode())
        if not oper:
            raise RuntimeError(f"the graph has no operation {op!r}")
        return _Output(oper, int(index or 0))

    def _tensor(self, value: tuple):
        """A TF_Tensor of a plain ``(dtype name, shape, data)`` (see ``_plain_feed``)."""
        dtype, shape, data = value
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        if dtype == "string":
            items = data
            tensor = self.lib.TF_AllocateTensor(_TF_STRING, dims, len(shape),
                                                len(items) * _TSTRING_SIZE)
            base = self.lib.TF_TensorData(tensor)
            for k, item in enumerate(items):
                slot = base + k * _TSTRING_SIZE
                self.lib.TF_StringInit(slot)
                self.lib.TF_StringCopy(slot, item, len(item))
            return tensor, len(items)
        code = _TF_TYPES.get(dtype)
        if code is None:
            raise TypeError(f"no TF type for a {dtype} feed")
        tensor = self.lib.TF_AllocateTensor(code, dims, len(shape), len(data))
        ctypes.memmove(self.lib.TF_TensorData(tensor), data, len(data))
        return tensor, 0

    def _plain(self, tensor) -> tuple:
        """A TF_Tensor as plain ``(dtype name, shape, data)`` (no numpy here)."""
        lib = self.lib
        shape = tuple(lib.TF_Dim(tensor, d) for d in range(lib.TF_NumDims(tensor)))
        data, code = lib.TF_TensorData(tensor), lib.TF_TensorType(tensor)
        if code == _TF_STRING:
            count = 1
            for d in shape:
                count *= d
            return ("string", shape, [
                ctypes.string_at(lib.TF_StringGetDataPointer(data + k * _TSTRING_SIZE),
                                 lib.TF_StringGetSize(data + k * _TSTRING_SIZE))
                for k in range(count)])
        if code not in _NP_TYPES:
            raise TypeError(f"no numpy type for TF type {code}")
        return (_NP_TYPES[code], shape, ctypes.string_at(data, lib.TF_TensorByteSize(tensor)))

    def run(self, feed: Mapping, fetch: list[str]) -> list:
        """One TF_SessionRun: ``feed`` by tensor name, the ``fetch`` tensors, both plain
        ``(dtype name, shape, data)``."""
        lib = self.lib
        names = list(feed)
        made = [self._tensor(feed[n]) for n in names]
        inputs = (_Output * max(1, len(names)))(*[self._output(n) for n in names])
        values = (ctypes.c_void_p * max(1, len(names)))(*[t for t, _ in made])
        outputs = (_Output * max(1, len(fetch)))(*[self._output(n) for n in fetch])
        got = (ctypes.c_void_p * max(1, len(fetch)))()
        try:
            lib.TF_SessionRun(self.session, None, inputs, values, len(names), outputs, got,
                              len(fetch), None, 0, None, self.status)
            self.check("running the session")
            return [self._plain(got[k]) for k in range(len(fetch))]
        finally:
            for k in range(len(fetch)):
                if got[k]:
                    lib.TF_DeleteTensor(got[k])
            for tensor, strings in made:
                # A TString longer than its inline 22 bytes owns a heap copy.
                base = lib.TF_TensorData(tensor)
                for k in range(strings):
                    lib.TF_StringDealloc(base + k * _TSTRING_SIZE)
                lib.TF_DeleteTensor(tensor)


def _child(job_path: str) -> dict:
    """The measured process: the stages of a TF Serving load, with the memory after each."""
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    stages = [_stage("interpreter")]
    runtime = _Runtime(job["tf_dir"])
    if job.get("static_runtime", True):
        stages.append(_stage("libraries", stages))
        _release_linker_tables(runtime.paths)
    stages.append(_stage("runtime", stages))
    start = time.perf_counter()
    runtime.load(job["model"], job["tags"])
    load = time.perf_counter() - start
    stages.append(_stage("load", stages))
    start = time.perf_counter()
    for runs in job["warmup"]:  # one record: one or more runs (MultiInference)
        for feed, fetch in runs:
            runtime.run(feed, fetch)
    warmup = time.perf_counter() - start
    if job["warmup"]:
        stages.append(_stage("warmup", stages))
    start = time.perf_counter()
    outputs = runtime.run(job["feed"], job["fetch"])
    first = time.perf_counter() - start
    stages.append(_stage("first request", stages))
    if job["outputs"]:
        with open(job_path + ".out", "wb") as f:
            pickle.dump(outputs, f)
    # Not the point of this process, and said so if it ever were: no Python TensorFlow,
    # and no numpy (~15 MiB that are not the server's).
    if any(m.split(".")[0] in ("tensorflow", "numpy") for m in sys.modules):
        raise RuntimeError("the native load imported the tensorflow or numpy package")
    return {"load_seconds": load + warmup, "warmup_seconds": warmup,
            "warmup_records": len(job["warmup"]), "first_request_seconds": first,
            "peak_rss_bytes": stages[-1][1], "steady_rss_bytes": stages[-1][2],
            "runtime_rss_bytes": next(s[2] for s in stages if s[0] == "runtime"),
            "interpreter_rss_bytes": stages[0][2],
            "stages": stages}


def _main(job_path: str) -> int:
    """Measures in a child forked here, at once: the kernel keeps the largest RSS a
    process's address spaces had across ``exec`` (``getrusage``'s maxrss is the spawning
    parent's, a whole TensorFlow process, when started through vfork or fork + exec), and
    a fork starts that count afresh, from this small interpreter."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            print(_RESULT + json.dumps(_child(job_path)), flush=True)
            code = 0
        except BaseException:  # noqa: BLE001 - reported on stderr, the exit code says it
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
