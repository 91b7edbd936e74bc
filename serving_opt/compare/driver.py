"""The driver of ``serving-opt compare``: checks, plans, runs the pipeline, reports.

``compare()`` runs where it is called: it reads both models' signatures, refuses host
ops, and starts :func:`execute` in the sandbox for local runners (outside it for remote
ones, whose workers run the models elsewhere). ``execute()`` lists the shards, tells
their format (``serving_opt.savedmodel.examples``), plans each signature's feeding, runs
the Beam pipeline (``compare.pipeline``) and turns its result lines into the report
(``compare.report``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence

from serving_opt.compare.options import CompareOptions
from serving_opt.compare.report import CompareReport, report_from_lines
from serving_opt.errors import ServingOptError, UsageError, first_line
from serving_opt.savedmodel import examples as examples_lib

_DEFAULT_OPTIONS = CompareOptions()


def require_beam() -> None:
    """Raises the one-line error when Apache Beam is not installed."""
    try:
        import apache_beam  # noqa: F401
        import google_crc32c  # noqa: F401
    except ImportError as e:
        raise ServingOptError(
            f"serving-opt compare runs on Apache Beam, which is not installed ({e.name} "
            "missing)", "pip install serving-opt[beam]") from None


# --- reading the models' signatures in the driver -----------------------------------------

def _meta_graph(model_dir: str, tags: frozenset):
    from serving_opt.savedmodel import loader

    if "://" not in model_dir:
        return loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    from apache_beam.io.filesystems import FileSystems

    scratch = tempfile.mkdtemp(prefix="serving-opt-pb-")
    try:
        for name in ("saved_model.pb", "saved_model.pbtxt"):
            path = model_dir.rstrip("/") + "/" + name
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type="uncompressed") as src, \
                        open(os.path.join(scratch, name), "wb") as dst:
                    shutil.copyfileobj(src, dst)
                break
        return loader.find_meta_graph(loader.read_saved_model(scratch), tags, model_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _match_shards(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as e:  # noqa: BLE001 - Beam's BeamIOError for a missing directory
        raise ServingOptError(f"--examples={pattern}: cannot list it ({first_line(e)})",
                              "check the path and your access to it") from None
    return _checked_shards(pattern, {m.path: m.size_in_bytes for m in found})


def _checked_shards(pattern: str, sizes: dict[str, int]) -> list[str]:
    """The matched shards, sorted, once none is missing or empty (path -> bytes)."""
    if not sizes:
        raise ServingOptError(f"--examples={pattern} matches no files",
                              "check the pattern (a glob, e.g. /data/eval-*.tfrecord)")
    for path, size in sizes.items():
        if size == 0:
            raise ServingOptError(f"shard {path} is empty (0 bytes)",
                                  "remove the empty shard or narrow --examples")
    return sorted(sizes)


def _check_local_shards(pattern: str, files: list[str]) -> None:
    """The pipeline's own checks of a local ``--examples`` (it matches, no shard is
    empty, the first is a format it reads), here, before the sandboxed worker starts: a
    usage error costs no TensorFlow or Beam import. ``files``: what the pattern matched."""
    shards = _checked_shards(pattern, {f: os.path.getsize(f) for f in files})
    with open(shards[0], "rb") as f:
        _kind_of(f, shards[0])


def _input_kind(shard: str) -> tuple[str, set]:
    """("tfrecord", {}) or ("json", aliases of the first request) from the first shard."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(shard) as f:
        return _kind_of(f, shard)


def _kind_of(f, shard: str) -> tuple[str, set]:
    """:func:`_input_kind` of the open shard ``f``."""
    head = examples_lib.read_exact(f, examples_lib.HEAD_BYTES)
    kind = examples_lib.examples_format(head)
    if kind == "tfrecord":
        return "tfrecord", set()
    if kind == "json":
        line, newline, _ = head.partition(b"\n")
        if not newline and hasattr(f, "readline"):
            line += f.readline()
        try:
            return "json", set(json.loads(line))
        except (ValueError, TypeError):
            raise ServingOptError(f"shard {shard} line 1 is not valid JSON",
                                  "write one JSON request per line") from None
    raise ServingOptError(
        f"shard {shard} is neither a TFRecord nor JSON lines (starts with {head[:8]!r})",
        "write TFRecords of serialized tf.Example, or one JSON request per line")


def _plans(meta_graph, candidate_mg, keys: Sequence[str], explicit: bool, kind: str,
           aliases: set):
    from tensorflow.python.framework import dtypes

    from serving_opt.compare.pipeline import SignaturePlan
    from serving_opt.savedmodel import parse_spec

    plans, skipped = [], {}
    for key in keys:
        sig = meta_graph.signature_def[key]
        if key not in candidate_mg.signature_def:
            raise ServingOptError(f"signature {key} is missing from the candidate",
                                  "compare models with the same signatures, or pass "
                                  "--signatures")
        dtype_of = {a: ("object" if i.dtype == dtypes.string.as_datatype_enum
                        else dtypes.as_dtype(i.dtype).as_numpy_dtype.__name__)
                    for a, i in sig.inputs.items()}
        example = None
        reason = ""
        if kind == "tfrecord":
            found = parse_spec.example_input_alias(meta_graph.graph_def, sig)
            if found is None:
                reason = "it does not take serialized tf.Examples"
            else:
                example = found[0]
        elif not aliases <= set(sig.inputs):
            reason = f"its inputs ({', '.join(sorted(sig.inputs))}) do not take the " \
                     f"requests' ({', '.join(sorted(aliases))})"
        if reason:
            if explicit:
                raise UsageError(f"signature {key} cannot be compared on these examples: "
                                 f"{reason}", "pass examples it takes, or drop it from "
                                 "--signatures")
            skipped[key] = reason
            continue
        plans.append(SignaturePlan(key, example, tuple(sorted(dtype_of.items())),
                                   tuple(sorted(sig.outputs))))
    if not plans:
        raise ServingOptError(
            "no signature takes these examples ("
            + "; ".join(f"{k}: {r}" for k, r in skipped.items()) + ")",
            "pass TFRecords of tf.Example for classify/regress/predict-on-examples "
            "signatures, or JSON lines of the signature's inputs")
    return tuple(plans), skipped


# Runners Beam knows only by their module path (the [dask] extra).
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_RUNNER_PATHS = {"dask": DASK_RUNNER}


def _runner(name: str) -> str:
    return _RUNNER_PATHS.get(name.lower().removesuffix("runner"), name)


def _dask_cluster_given(options: CompareOptions) -> bool:
    return any(a.startswith(("--dask_client_address", "--dask_scheduler_file"))
               for a in options.pipeline_args)


def _is_local(options: CompareOptions) -> bool:
    """Whether the runner runs the models on this machine: then in the sandbox."""
    return options.runner.lower().removesuffix("runner") in ("direct", "prism", "interactive")


def _check_local_dask(options: CompareOptions) -> None:
    """Dask without a cluster's address starts one here (:func:`_dask_args`), outside the
    sandbox: its workers need a /proc of their own and sockets the sandbox does not give."""
    if _runner(options.runner) == DASK_RUNNER and not _dask_cluster_given(options) \
            and not options.allow_unsandboxed:
        raise UsageError(
            "--runner=DaskRunner without --dask_client_address would start a Dask cluster "
            "on this machine, outside the sandbox that runs models; nothing was run",
            "pass --dask_client_address=HOST:PORT of the cluster that runs the models, use "
            "--direct_num_workers for DirectRunner's sandboxed processes, or pass "
            "--allow_unsandboxed for models you trust")


@contextlib.contextmanager
def _dask_args(options: CompareOptions, shards: int):
    """The Dask runner's extra arguments: one partition per shard (its default packs 128
    items in one, so a few shards would run on one worker) and, with no cluster given, a
    LocalCluster of ``direct_num_workers`` processes on loopback."""
    if _runner(options.runner) != DASK_RUNNER:
        yield []
        return
    args = [] if any(a.startswith(("--dask_npartitions", "--dask_partition_size"))
                     for a in options.pipeline_args) else [f"--dask_npartitions={shards}"]
    if _dask_cluster_given(options):
        yield args
        return
    from distributed import LocalCluster

    with LocalCluster(n_workers=options.direct_num_workers, threads_per_worker=1,
                      processes=True, dashboard_address=None) as cluster:
        yield [*args, f"--dask_client_address={cluster.scheduler_address}"]


def _pipeline_options(options: CompareOptions, more: Sequence[str] = ()):
    from apache_beam.options.pipeline_options import PipelineOptions

    args = [f"--runner={_runner(options.runner)}"]
    extra = [*options.pipeline_args, *more]
    if options.direct_num_workers > 1 and _runner(options.runner) != DASK_RUNNER:
        args.append(f"--direct_num_workers={options.direct_num_workers}")
        if not any(a.startswith("--direct_running_mode") for a in extra):
            # Threads would share one Python interpreter; processes use every core.
            args.append("--direct_running_mode=multi_processing")
    return PipelineOptions(args + extra)


def _results_dir(pipeline_options) -> tuple[str, bool]:
    """Where the job writes its small result file: under --temp_location when given (a
    remote runner's workers cannot write to this machine), else a local temp dir."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    temp = pipeline_options.view_as(GoogleCloudOptions).temp_location
    if temp:
        return temp.rstrip("/") + f"/serving-opt-compare-{uuid.uuid4().hex}", False
    return tempfile.mkdtemp(prefix="serving-opt-compare-"), True


def _pipeline_failure(e: BaseException) -> ServingOptError:
    from serving_opt.compare.pipeline import MARK_CLOSE, MARK_OPEN

    text = str(e)
    start = text.find(MARK_OPEN)
    if start >= 0:
        end = text.find(MARK_CLOSE, start)
        message = text[start + len(MARK_OPEN):end if end > 0 else None].strip()
        problem, _, fix = message.partition("; ")
        return ServingOptError(problem, fix or None)
    return ServingOptError(f"the comparison pipeline failed: {first_line(e)}",
                           "rerun with --verbosity=1 for the runner's traceback")


def compare(baseline: str, candidate: str, examples: str,
            options: CompareOptions = _DEFAULT_OPTIONS,
            progress: Callable[[str], None] | None = None) -> CompareReport:
    """Compares two SavedModels' answers on every example matching ``examples``."""
    require_beam()
    say = progress or (lambda _m: None)
    if options.batch_size < 1 or options.worst_k < 0 or options.direct_num_workers < 1:
        raise UsageError("--batch_size and --direct_num_workers must be >= 1, --worst_k >= 0",
                         "e.g. --batch_size=256")
    _check_local_dask(options)
    from serving_opt import sandbox as sandbox_lib
    from serving_opt.savedmodel import loader, untrusted

    tags = loader.parse_tags(options.saved_model_tags)
    base_mg = _meta_graph(baseline, tags)
    cand_mg = _meta_graph(candidate, tags)
    keys = loader.select_signatures(base_mg, options.signatures)
    if not options.allow_file_ops:
        untrusted.refuse_host_ops(base_mg, keys, "compare")
        untrusted.refuse_host_ops(cand_mg, [k for k in keys if k in cand_mg.signature_def],
                                  "compare")
    del base_mg, cand_mg
    local_runner = _is_local(options)
    sandboxed = local_runner and sandbox_lib.require(options.allow_unsandboxed,
                                                     f"compare {candidate}")
    if not sandboxed:
        return execute(baseline, candidate, examples, options, say)
    if "://" in examples:
        raise ServingOptError(
            f"--examples={examples} needs the network, which the sandbox running the models "
            "does not have; nothing was run",
            "copy the shards to a local directory, or pass --allow_unsandboxed for models "
            "you trust")
    files = sandbox_lib.glob_files(examples)
    _check_local_shards(examples, files)
    # Absolute paths: the pipeline runs elsewhere (cwd /tmp, in its sandbox); the report
    # names the paths as the user gave them.
    given = {"baseline": baseline, "candidate": candidate, "examples_pattern": examples}
    baseline, candidate = os.path.abspath(baseline), os.path.abspath(candidate)
    examples = os.path.abspath(examples)
    # The matched shards one by one, never their directory (a secret or a socket beside
    # them stays outside).
    policy = sandbox_lib.Policy(read_only=(baseline, candidate, *files),
                                memory_bytes=options.sandbox_memory_bytes,
                                timeout_seconds=options.sandbox_timeout_seconds)
    report = sandbox_lib.call("serving_opt.compare.driver:execute", baseline, candidate, examples,
                              options, policy=policy, progress=say)
    import dataclasses

    return dataclasses.replace(report, **given)


def execute(baseline: str, candidate: str, examples: str, options: CompareOptions,
            progress: Callable[[str], None] | None = None) -> CompareReport:
    """The pipeline itself (in the sandbox for local runners): both models on every example."""

    from serving_opt import sandbox as sandbox_lib
    from serving_opt.savedmodel import loader

    say = progress or sandbox_lib.say
    tags = loader.parse_tags(options.saved_model_tags)
    base_mg = _meta_graph(baseline, tags)
    cand_mg = _meta_graph(candidate, tags)
    keys = loader.select_signatures(base_mg, options.signatures)
    shards = _match_shards(examples)
    kind, aliases = _input_kind(shards[0])
    plans, skipped = _plans(base_mg, cand_mg, keys, bool(options.signatures), kind, aliases)
    del base_mg, cand_mg

    with _dask_args(options, len(shards)) as more:
        pipeline_options = _pipeline_options(options, more)
        say(f"comparing {len(plans)} signature(s) on {len(shards)} shard(s) with "
            f"{options.runner}" + (f" ({options.direct_num_workers} workers)"
                                   if options.direct_num_workers > 1 else ""))
        lines, seconds = _run(pipeline_options, shards, plans, baseline, candidate, tags,
                              options)
    return report_from_lines(lines, baseline, candidate, examples, len(shards), options,
                             skipped, seconds)


def _run(pipeline_options, shards, plans, baseline, candidate, tags, options):
    """Runs the pipeline; its result lines and the seconds it took."""
    import apache_beam as beam

    from serving_opt.compare import pipeline as pl

    results_dir, local_results = _results_dir(pipeline_options)
    results = results_dir.rstrip("/") + "/results.jsonl"
    tag_tuple = tuple(sorted(tags))
    start = time.perf_counter()
    try:
        p = beam.Pipeline(options=pipeline_options)
        pl.build(p, shards,
                 pl.SavedModelHandler(baseline, tag_tuple, plans, "baseline"),
                 pl.SavedModelHandler(candidate, tag_tuple, plans, "candidate"),
                 batch_size=options.batch_size, atol=options.atol, rtol=options.rtol,
                 worst_k=options.worst_k, results_prefix=results)
        try:
            result = p.run()
            try:
                result.wait_until_finish()
            finally:
                # The Dask runner leaves its client connected; once the cluster stops, it
                # would retry for 30 s.
                client = getattr(result, "client", None)
                if client is not None:
                    client.close()
        except ServingOptError:
            raise
        except Exception as e:  # noqa: BLE001 - the runner wraps the worker's error
            raise _pipeline_failure(e) from e
        seconds = time.perf_counter() - start
        return _read_results(results), seconds
    finally:
        if local_results:
            shutil.rmtree(results_dir, ignore_errors=True)


def _read_results(path: str) -> list[dict]:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type="uncompressed") as f:
        lines = [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
    if "://" in path:
        FileSystems.delete([path])
    return lines
