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


def check(model_dir: str, tags: str, allow_file_ops: bool) -> None:
    """Raises ServingOptError naming what is wrong with ``model_dir``."""
    from serving_opt.savedmodel import loader, untrusted

    loader.check_model_files(model_dir)
    if not allow_file_ops:
        meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir),
                                            loader.parse_tags(tags), model_dir)
        untrusted.refuse_host_ops(meta_graph, tuple(sorted(meta_graph.signature_def)),
                                  "publish")


def check_in_fresh_process(model_dir: str, tags: str, allow_file_ops: bool,
                           sandboxed: bool = True) -> None:
    """:func:`check` in a new process (in bubblewrap when ``sandboxed``).

    Example:
        >>> check_in_fresh_process("models/clf/.serving-opt-staging-3-x", "serve", False)
    """
    from serving_opt import sandbox

    argv = [sys.executable, "-m", "serving_opt.candidate_check", model_dir, tags,
            "1" if allow_file_ops else "0"]
    command, env = argv, None
    if sandboxed:
        command = sandbox.command(argv, sandbox.Policy(read_only=(model_dir,)))
        env = sandbox.environment()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env,
                          preexec_fn=sandbox.preexec(None) if sandboxed else None)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServingOptError(f"the candidate could not be checked: {tail}",
                              "nothing was published; rerun with --verbosity=1 and report this")
    outcome = json.loads(lines[-1])
    if outcome.get("problem"):
        raise ServingOptError(str(outcome["problem"]), outcome.get("fix"))


def _main(model_dir: str, tags: str, allow_file_ops: str) -> int:
    use_protobufs_only()
    try:
        check(model_dir, tags, allow_file_ops == "1")
    except ServingOptError as e:
        print(json.dumps({"problem": e.problem, "fix": e.fix}))
        return 0
    print(json.dumps({"problem": None}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:4]))
