"""The last static check before publishing, in a fresh process that parses and runs nothing.

What a sandboxed worker wrote is a model like any other: before the rename that
publishes it, it is checked as the source was (no link or special file, no host op,
no saver or asset route the loaders would not take; ``untrusted``). The check runs in
a process of its own, inside bubblewrap with only that directory visible, that imports
TensorFlow's protocol buffer modules and nothing else of TensorFlow: a second of
work and ~20 MiB instead of a full TensorFlow import in the optimizer's own process,
which never needs one when the pipeline runs in its worker.

    check_in_fresh_process("/models/clf/.serving-opt-staging-run-x/.serving-opt-staging-3-y",
                           "serve", allow_file_ops=False)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import types

from serving_opt.errors import ServingOptError


def use_protobufs_only() -> None:
    """Makes ``tensorflow.core...._pb2`` importable without running TensorFlow's package
    initialiser. Only for a process that will never import TensorFlow itself."""
    if "tensorflow" in sys.modules:
        return
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ServingOptError("TensorFlow is not installed", "pip install tensorflow")
    package = types.ModuleType("tensorflow")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = package


_TOP_FILES = ("saved_model.pb", "saved_model.pbtxt", "fingerprint.pb")
_SHARD = re.compile(r"variables\.data-(\d{5})-of-(\d{5})")


def extra_files(model_dir: str, saved_model) -> list[str]:
    """What ``model_dir`` holds beyond a SavedModel's files, relative, sorted: the ones
    TF Serving reads are ``saved_model.pb`` (or ``.pbtxt``), ``fingerprint.pb``,
    ``variables/variables.index`` and its data shards, the assets the MetaGraphs declare,
    ``assets.extra/tf_serving_warmup_requests`` and, with ``--output_format=graphdef``,
    the frozen GraphDef. Anything else was written by someone else (a model run in the
    sandbox can write into its candidate) and is never published.
    """
    from serving_opt.options import GRAPH_DEF_NAME
    from serving_opt.serving.warmup import WARMUP_FILENAME

    allowed = {*_TOP_FILES, GRAPH_DEF_NAME, "variables/variables.index",
               f"assets.extra/{WARMUP_FILENAME}"}
    for meta_graph in saved_model.meta_graphs:
        for asset in meta_graph.asset_file_def:
            allowed.add("assets/" + os.path.normpath(asset.filename))
    extra = []
    for root, dirs, files in os.walk(model_dir):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            relative = os.path.relpath(os.path.join(root, name), model_dir)
            shard = _SHARD.fullmatch(name) if root == os.path.join(model_dir, "variables") \
                else None
            if relative in allowed or (shard and int(shard[1]) < int(shard[2])):
                continue
            extra.append(relative)
    return sorted(extra)


def check(model_dir: str, tags: str, allow_file_ops: bool) -> list[str]:
    """Raises ServingOptError naming what is wrong with ``model_dir``; returns the files
    it holds beyond a SavedModel's (:func:`extra_files`), for the caller to remove."""
    from serving_opt.savedmodel import loader, model_files, untrusted

    model_files.check_model_files(model_dir)
    saved_model = loader.read_saved_model(model_dir)
    if not allow_file_ops:
        meta_graph = loader.find_meta_graph(saved_model, loader.parse_tags(tags), model_dir)
        untrusted.refuse_host_ops(meta_graph, tuple(sorted(meta_graph.signature_def)),
                                  "publish")
    return extra_files(model_dir, saved_model)


def remove_extra_files(model_dir: str, extra: list[str]) -> None:
    """Removes what :func:`extra_files` named (files, links, then emptied directories),
    never following a link; the model must be a closed directory nothing writes into."""
    for relative in extra:
        path = os.path.join(model_dir, relative)
        if os.path.commonpath([os.path.realpath(os.path.dirname(path)),
                               os.path.realpath(model_dir)]) != os.path.realpath(model_dir):
            raise ServingOptError(f"{path} is outside the candidate {model_dir}", "report this")
        if os.path.lexists(path):
            os.unlink(path)
    for root, dirs, _files in os.walk(model_dir, topdown=False):
        for name in dirs:
            directory = os.path.join(root, name)
            if not os.path.islink(directory) and not os.listdir(directory) \
                    and os.path.relpath(directory, model_dir) not in ("variables",):
                os.rmdir(directory)


def check_in_fresh_process(model_dir: str, tags: str, allow_file_ops: bool,
                           sandboxed: bool = True) -> list[str]:
    """:func:`check` in a new process (in bubblewrap when ``sandboxed``); returns the
    files beyond a SavedModel's (:func:`extra_files`).
    """
    from serving_opt import sandbox

    argv = [sys.executable, "-m", "serving_opt.pipeline.candidate_check", model_dir, tags,
            "1" if allow_file_ops else "0"]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process = (sandbox.popen(argv, sandbox.Policy(read_only=(model_dir,)), **pipes)
               if sandboxed else subprocess.Popen(argv, **pipes))
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        sandbox.release(process)
    done = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"the candidate could not be checked: {tail}",
                              "nothing was published; rerun with --verbosity=1 and report this")
    outcome = json.loads(lines[-1])
    if outcome.get("problem"):
        raise ServingOptError(str(outcome["problem"]), outcome.get("fix"))
    return [str(path) for path in outcome.get("extra", [])]


def _main(model_dir: str, tags: str, allow_file_ops: str) -> int:
    use_protobufs_only()
    try:
        extra = check(model_dir, tags, allow_file_ops == "1")
    except ServingOptError as e:
        print(json.dumps({"problem": e.problem, "fix": e.fix}))
        return 0
    print(json.dumps({"problem": None, "extra": extra}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:4]))
