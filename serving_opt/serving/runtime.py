"""The target runtime: the TensorFlow release the production TF Serving runs.

TF Serving releases track TensorFlow releases one to one (TF Serving 2.N runs TF 2.N),
and a graph written by a newer TensorFlow can use ops or attributes an older server
cannot load. Two jobs here:

  * ``resolve_runtime(version)``: a Python interpreter running TensorFlow ``version``,
    so ``validate``'s local backend runs ``serving-opt serve`` under the production
    server's TensorFlow. In order: the current interpreter when its TensorFlow has
    that version (major.minor); an interpreter given explicitly (``--serving_runtime_python``
    or ``$SERVING_OPT_RUNTIME_<X>_<Y>``, e.g. ``SERVING_OPT_RUNTIME_2_15``); a venv
    already in the cache; else a venv created once into the cache
    (``$SERVING_OPT_CACHE`` or ``~/.cache/serving-opt``, under ``runtimes/tf-X/``) with
    ``tensorflow-cpu==X``, grpcio, absl-py, numpy, pysimdjson and ``tensorflow-serving-api==X``
    (``--no-deps``: it would pull the full ``tensorflow`` over ``tensorflow-cpu``).
    This package is not installed there: the server runs with it on ``PYTHONPATH``.
  * ``op_registry(runtime)`` and ``check_graph(...)``: the op registry of that
    TensorFlow (op names and attr names, dumped as JSON by a small script run in the
    runtime's interpreter and cached beside it), and the check ``optimize`` runs on the
    graph it wrote: every op of the graph and its functions must be registered there,
    every attr of every node must be one the op declares (attrs still at their default
    value were already stripped by the writer, as TF does for compatibility).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from serving_opt.errors import ServingOptError

# The TensorFlow that TF Serving's current release (the docker default image) runs.
# The release a version flag is checked against, and its default, are options.
from serving_opt.options import DEFAULT_SERVING_VERSION, check_version  # noqa: E402, F401

ENV_CACHE = "SERVING_OPT_CACHE"
ENV_RUNTIME_PREFIX = "SERVING_OPT_RUNTIME_"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_VERSION_SCRIPT = "import tensorflow as tf; print(tf.__version__)"
_REGISTRY_SCRIPT = r"""
import json, sys
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
buf = c_api.TF_GetAllOpList()
try:
    data = c_api.TF_GetBuffer(buf)
finally:
    c_api.TF_DeleteBuffer(buf)
ops = op_def_pb2.OpList.FromString(data)
json.dump({"tensorflow": tf.__version__,
           "ops": {o.name: sorted(a.name for a in o.attr) for o in ops.op}}, sys.stdout)
"""


class TargetRuntimeError(ServingOptError):
    """The model uses an op or attr the target TensorFlow does not have (not retried:
    keeping variables does not change the ops a model uses)."""


@dataclass(frozen=True)
class Runtime:
    """A Python interpreter running one TensorFlow release."""

    python: str
    tf_version: str
    source: str  # "current interpreter" | "given interpreter" | "cached venv" | "new venv"
    directory: str  # where its registry is cached

    @property
    def is_current(self) -> bool:
        return self.source == "current interpreter"

    def env(self, base: dict | None = None) -> dict:
        """The environment to run ``serving_opt`` in this interpreter (PYTHONPATH)."""
        env = dict(os.environ if base is None else base)
        if not self.is_current:
            parts = [_PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                       if p]
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return env


def major_minor(version: str) -> str:
    """``2.20.0`` -> ``2.20``."""
    return ".".join(version.split(".")[:2])


def image_version(image: str) -> str | None:
    """The TF Serving release of a ``tensorflow/serving:<tag>`` image, if the tag says."""
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    match = re.match(r"^(\d+\.\d+(?:\.\d+)?)", tag)
    return match.group(1) if match else None


def target_version(serving_version: str | None, image: str | None = None) -> str:
    """The TF Serving release a model is made for: ``--serving_version``, else the
    Docker image's tag when it names one, else the current release.

    >>> target_version(None, "tensorflow/serving:2.21.0")
    '2.21.0'
    >>> target_version("2.15.1", "tensorflow/serving:2.21.0")
    '2.15.1'
    """
    return serving_version or (image_version(image) if image else None) \
        or DEFAULT_SERVING_VERSION


def cache_root() -> str:
    """``$SERVING_OPT_CACHE`` or ``~/.cache/serving-opt``."""
    return os.path.abspath(os.environ.get(ENV_CACHE)
                           or os.path.join(os.path.expanduser("~"), ".cache", "serving-opt"))


def runtime_dir(version: str) -> str:
    return os.path.join(cache_root(), "runtimes", f"tf-{version}")


def env_var(version: str) -> str:
    """The variable naming an interpreter for ``version``: ``SERVING_OPT_RUNTIME_2_15``."""
    return ENV_RUNTIME_PREFIX + major_minor(version).replace(".", "_")


def current_tf_version() -> str:
    """This interpreter's TensorFlow version, without importing TensorFlow when it is not
    imported yet (the optimizer's own process runs none when it sandboxes the work)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and getattr(tf, "__version__", None):
        return tf.__version__
    from importlib import metadata

    for distribution in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    import tensorflow as tf

    return tf.__version__


def _same_release(found: str, wanted: str) -> bool:
    """TF Serving 2.N runs TensorFlow 2.N: releases are told apart by major.minor."""
    return major_minor(found) == major_minor(wanted)


def _interpreter_version(python: str) -> str:
    try:
        result = subprocess.run([python, "-c", _VERSION_SCRIPT], capture_output=True,
                                text=True, timeout=300, check=False,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except OSError as e:
        raise ServingOptError(f"cannot run the runtime interpreter {python}: {e.strerror}",
                              "point it at a python with TensorFlow installed") from e
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"{python} cannot import TensorFlow: {last}",
                              "point the runtime at a python with TensorFlow installed")
    return result.stdout.strip().splitlines()[-1]


def find_runtime(version: str, python: str | None = None) -> Runtime | None:
    """A runtime for ``version`` that needs no download, or None."""
    version = check_version(version)
    given = python or os.environ.get(env_var(version))
    if given:
        found = _interpreter_version(given)
        if major_minor(found) != major_minor(version):
            raise ServingOptError(
                f"the runtime interpreter {given} runs TensorFlow {found}, not {version}",
                f"point --serving_runtime_python (or ${env_var(version)}) at a TensorFlow "
                f"{major_minor(version)} python")
        return Runtime(os.path.abspath(given) if os.sep in given else given, found,
                       "given interpreter", runtime_dir(found))
    current = current_tf_version()
    if _same_release(current, version):
        return Runtime(sys.executable, current, "current interpreter", runtime_dir(current))
    directory = runtime_dir(version)
    venv_python = os.path.join(directory, "venv", "bin", "python")
    if os.path.exists(os.path.join(directory, ".installed")) and os.path.exists(venv_python):
        with open(os.path.join(directory, ".installed")) as f:
            found = f.read().strip() or version
        return Runtime(venv_python, found, "cached venv", directory)
    return None


def resolve_runtime(version: str, python: str | None = None,
                    progress: Callable[[str], None] | None = None) -> Runtime:
    """A runtime for ``version``: found (see ``find_runtime``), else installed once."""
    runtime = find_runtime(version, python)
    if runtime is not None:
        return runtime
    return install_runtime(version, progress or (lambda m: None))


def install_runtime(version: str, say: Callable[[str], None]) -> Runtime:
    """Creates ``runtimes/tf-X/venv`` with TensorFlow X and what ``serve`` needs."""
    directory = runtime_dir(version)
    venv = os.path.join(directory, "venv")
    python = os.path.join(venv, "bin", "python")
    os.makedirs(directory, exist_ok=True)
    say(f"installing the TensorFlow {version} runtime into {venv} (once; about 500 MB)")
    if not os.path.exists(python):
        _run_step([sys.executable, "-m", "venv", venv], "create the venv", version, venv)
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--progress-bar", "off"]
    say(f"  pip install tensorflow-cpu=={version} grpcio absl-py numpy pysimdjson")
    _run_step([*pip, f"tensorflow-cpu=={version}", "grpcio", "absl-py", "numpy", "pysimdjson"],
              f"install tensorflow-cpu=={version}", version, venv)
    # tensorflow-serving-api requires the full `tensorflow`, which would install a second
    # TensorFlow over tensorflow-cpu: its real dependencies (grpcio, protobuf) are here.
    say(f"  pip install --no-deps tensorflow-serving-api=={major_minor(version)}.*")
    _run_step([*pip, "--no-deps", f"tensorflow-serving-api=={major_minor(version)}.*"],
              "install tensorflow-serving-api", version, venv)
    found = _interpreter_version(python)
    with open(os.path.join(directory, ".installed"), "w") as f:
        f.write(found + "\n")
    say(f"TensorFlow {found} runtime ready: {python}")
    return Runtime(python, found, "new venv", directory)


def _run_step(command: list[str], what: str, version: str, venv: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as e:
        raise ServingOptError(f"cannot {what} for the TensorFlow {version} runtime: {e}",
                              "check the python installation") from e
    if result.returncode == 0:
        return
    lines = [ln.strip() for ln in (result.stderr + result.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
    offline = any(w in " ".join(lines) for w in ("NewConnectionError", "Temporary failure in "
                                                  "name resolution", "Network is unreachable",
                                                  "No matching distribution"))
    hint = ("no package index reachable (offline?), or no such release: "
            if offline else "")
    raise ServingOptError(
        f"cannot {what} for the TensorFlow {version} runtime: {hint}{errors[0]}",
        f"retry online, or point --serving_runtime_python (or ${env_var(version)}) at a python "
        f"with TensorFlow {major_minor(version)}; {venv} can be deleted")


def op_registry(runtime: Runtime) -> dict[str, frozenset[str]]:
    """Op name -> attr names of the runtime's TensorFlow, cached as JSON beside it."""
    path = os.path.join(runtime.directory, "op_registry.json")
    data = None
    if os.path.exists(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
        if data is not None and data.get("tensorflow") != runtime.tf_version:
            data = None
    if data is None:
        result = subprocess.run([runtime.python, "-c", _REGISTRY_SCRIPT], capture_output=True,
                                text=True, timeout=600, check=False,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise ServingOptError(
                f"cannot read TensorFlow {runtime.tf_version}'s op registry: {last}",
                f"check {runtime.python}")
        data = json.loads(result.stdout)
        os.makedirs(runtime.directory, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    return {name: frozenset(attrs) for name, attrs in data["ops"].items()}


def check_graph(graph_def, registry: dict[str, frozenset[str]], tf_version: str) -> int:
    """Raises ServingOptError on the first op or attr ``registry`` does not have.

    Checks the graph's nodes and its function library's nodes; attrs whose name starts
    with ``_`` are TensorFlow's internal annotations, not part of an op's definition.
    A call of a library function is an op named after the function. Returns the number
    of nodes checked.
    """
    functions = {f.signature.name for f in graph_def.library.function}
    places = [("graph", graph_def.node)] + [
        (f"function {f.signature.name}", f.node_def) for f in graph_def.library.function]
    checked = 0
    for where, nodes in places:
        for node in nodes:
            checked += 1
            if node.op in functions:
                continue
            attrs = registry.get(node.op)
            if attrs is None:
                raise TargetRuntimeError(
                    f"op {node.op} (node {node.name}, {where}) is not in TensorFlow "
                    f"{tf_version}'s op registry: TF Serving {major_minor(tf_version)} cannot "
                    "load this model; nothing was published",
                    f"serve it with a newer TF Serving (--serving_version), or build the model "
                    f"without {node.op}")
            unknown = sorted(a for a in node.attr if not a.startswith("_") and a not in attrs)
            if unknown:
                raise TargetRuntimeError(
                    f"attr {unknown[0]} of op {node.op} (node {node.name}, {where}) is not "
                    f"known to TensorFlow {tf_version}: TF Serving {major_minor(tf_version)} "
                    "cannot load this model; nothing was published",
                    "serve it with a newer TF Serving (--serving_version), or leave that attr "
                    "at its default")
    return checked


def stand_in_runtime(serving_version: str | None, python: str | None, image: str,
                     say: Callable[[str], None] = lambda m: None) -> tuple[Runtime | None, str]:
    """The TensorFlow the local stand-in runs under (None: this interpreter), and a note
    when it is not the target TF Serving's: validate's and tune's one rule.

    ``serving_version`` is resolved, installed once when missing (so call this outside
    the sandbox, which has no network); without it the target is the Docker image's
    release, used only when its runtime is already here.
    """
    if serving_version is not None:
        return resolve_runtime(serving_version, python, say), ""
    target = target_version(None, image)
    runtime = find_runtime(target, python)
    if runtime is not None:
        return runtime, ""
    note = (f"the stand-in ran TensorFlow {current_tf_version()}, not the target TF "
            f"Serving's {major_minor(target)} (no runtime for it here; "
            f"--serving_version={target} installs one)")
    say(note)
    return None, note
