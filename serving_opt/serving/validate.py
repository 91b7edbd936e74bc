"""Prove a model in a real serving round trip: load, metadata, answers, load test.

TFX's InfraValidator only checks that requests do not fail. This compares every
answer with the reference model run in-process (the original, when validating an
optimized model), over TF Serving's gRPC API and its REST API (``--protocols``):

1. start the server (``backends``; the local stand-in under the target TensorFlow,
   ``runtime``) and wait until the model status (GetModelStatus, and
   ``GET /v1/models/NAME/versions/V``) reports the version AVAILABLE (END, a dead
   process or the deadline fail, with the log);
2. the metadata's SignatureDefMap (gRPC and REST) must equal the SavedModel's;
3. every signature gets a Predict request; classify/regress signatures also a
   Classify/Regress request; a model with both kinds a MultiInference request (gRPC
   only: REST has no such endpoint); each answer, over each protocol, is compared with
   the reference (same tolerances as the parity gate; REST floats cast back to the
   signature's dtype first);
4. a load phase: N concurrent clients (split between the protocols) for S seconds,
   zero errors required.

The report and the marker name the server that answered (``docker:<image>``,
``binary:<path> <version>``, ``local:serving-opt serve (stand-in) on TensorFlow X``) and
its TensorFlow version; ``require_server="tf_serving"`` refuses to run on the stand-in.

The server is always stopped, on failure and on Ctrl-C too.

This module is the executor (TFX's ``infra_validator/executor``): it decides what
runs in which order and turns the outcomes into a ValidationReport. The jobs live
in their own modules: ``requests`` builds the probes and their expected answers,
``client`` talks gRPC to the server, ``backends`` starts and stops it, ``markers``
writes the VALIDATED / NOT_VALIDATED file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from serving_opt import sandbox as sandbox_lib
from serving_opt.errors import ServingOptError

# The options live in serving_opt.options; importers of this module use them from here too.
from serving_opt.options import (  # noqa: F401
    MAX_CLIENTS,
    MAX_DURATION,
    PROTOCOLS,
    REQUIRE_SERVER,
    ValidateOptions,
    check_options,
    parse_protocols,
)

# Importers of this module (the CLI, the optimizer, tests) use these names from here.
from serving_opt.savedmodel import loader, writer
from serving_opt.serving import backends, client, requests, rest_client
from serving_opt.serving import runtime as runtime_lib
from serving_opt.serving.client import LoadTest
from serving_opt.serving.markers import MARKER_FAILED, MARKER_OK, write_marker

__all__ = [
    "MARKER_FAILED", "MARKER_OK", "Check", "LoadTest", "ValidateOptions", "ValidationReport",
    "resolve_version", "validate", "write_marker",
]

@dataclass(frozen=True)
class Check:
    """One validation check and its outcome.

    Example:
        >>> Check("model AVAILABLE", True, "version 1")
    """

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class ValidationReport:
    """The validation verdict; ``to_dict()`` is the JSON report.

    Example:
        >>> report.ok, report.backend
        (True, 'local')
    """

    ok: bool
    backend: str
    backend_note: str
    address: str
    model_name: str
    model_base: str
    version: int
    reference_dir: str
    checks: tuple[Check, ...]
    load_test: LoadTest | None
    warmup_file: str | None = None
    server_log_tail: str = ""
    failures: tuple[str, ...] = field(default_factory=tuple)
    # What answered: "docker:<image>", "binary:<path> <version>", or
    # "local:serving-opt serve (stand-in) on TensorFlow X"; and that TensorFlow's version.
    server: str = ""
    tensorflow_version: str = ""
    runtime_note: str = ""  # why the stand-in runs this TensorFlow, when not the target
    protocols: tuple[str, ...] = ("grpc",)
    rest_address: str | None = None
    rest_load_test: LoadTest | None = None
    # Other versions in the base: not served, not run (a specific version policy).
    ignored_versions: tuple[int, ...] = ()
    sandbox: str = ""  # how the reference model and the server were isolated
    # Serialized PredictionLogs of the matched probes, for validate() to write (bytes).
    warmup_records: tuple[bytes, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def _versions(model_base: str) -> dict[int, str]:
    """Version -> the directory TF Serving serves for it (``02`` is version 2; when ``2``
    and ``02`` both exist, the one upstream indexes last)."""
    return {v: names[-1] for v, names in writer.version_dirs(model_base).items()
            if os.path.isdir(os.path.join(model_base, names[-1]))}


def version_dir(model_base: str, version: int) -> str:
    """The directory of ``version`` in ``model_base`` as TF Serving names it."""
    return os.path.join(model_base, _versions(model_base).get(version, str(version)))


def resolve_version(model_base: str, version: int | None) -> int:
    """``version`` if the base has it, else (None) the highest version in the base.

    Example:
        >>> resolve_version("build/models/classifier", None)
        1
    """
    if not os.path.isdir(model_base):
        raise ServingOptError(f"model base {model_base} does not exist",
                              "point --model_base at the directory holding version directories")
    versions = sorted(_versions(model_base))
    if version is not None:
        if version not in versions:
            raise ServingOptError(f"version {version} is not in {model_base} (it has {versions})",
                                  "pick an existing --version")
        return version
    if not versions:
        hint = (" (it holds saved_model.pb itself: pass its parent as --model_base)"
                if os.path.exists(os.path.join(model_base, "saved_model.pb")) else "")
        raise ServingOptError(f"no version directories in {model_base}{hint}",
                              "TF Serving serves <base>/<integer version>/saved_model.pb")
    return versions[-1]


def validate(model_base: str, options: ValidateOptions = ValidateOptions(),  # noqa: B008
             progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Serves ``model_base`` and checks load, metadata, every signature's answers and load.

    Never raises for a model that fails validation: the report says why
    (``ok=False``). Raises ServingOptError/UsageError for bad arguments.

    Example:
        >>> validate("build/models/classifier", ValidateOptions(server="local")).ok
        True
    """
    say = progress or (lambda m: None)
    check_options(options)
    model_base = os.path.abspath(model_base)
    version = resolve_version(model_base, options.version)
    model_dir = version_dir(model_base, version)
    reference_dir = options.reference_dir or model_dir
    tags = loader.parse_tags(options.saved_model_tags)
    # A symlink out of a model is never followed: not by the server, not by the warmup
    # file written into assets.extra/, not by the reference run.
    for checked in dict.fromkeys((model_dir, reference_dir)):
        loader.check_model_files(checked)
    if not options.allow_file_ops:
        # A SavedModel is code: refused before the reference run or the server runs it.
        _refuse_host_ops(dict.fromkeys((model_dir, reference_dir)), tags)
    sandboxed = sandbox_lib.require(options.allow_unsandboxed, f"validate {model_dir}")
    if sandboxed and options.allow_unsandboxed and options.server == "docker":
        sandboxed = False  # the Docker client cannot run in a sandbox; the user trusts it
    backend = backends.resolve_backend(options.server, sandboxed=sandboxed)
    if options.require_server == "tf_serving" and backend == "local":
        raise ServingOptError(
            "--require_server=tf_serving: only the local stand-in can run here (no "
            f"{backends.BINARY_NAME} on PATH" + (", and Docker cannot be driven from the "
                                                  "sandbox)" if sandboxed else
                                                  ", no Docker engine answers)")
            + "; nothing was validated",
            "run where tensorflow_model_server is available, or drop --require_server")
    runtime_note = ""
    if backend == "local":
        # Resolved (installed, when asked) here: no sandbox has the network.
        runtime, runtime_note = _local_runtime(options, say)
        if runtime is not None:
            options = dataclasses.replace(options, serving_runtime_python=runtime.python)
    # Absolute paths: the executor runs elsewhere (cwd /tmp, in its sandbox).
    resolved = dataclasses.replace(
        options, server=backend, version=version,
        reference_dir=os.path.abspath(options.reference_dir) if options.reference_dir
        else None,
        examples=os.path.abspath(options.examples) if options.examples else None)
    if sandboxed:
        policy = _sandbox_policy(model_base, resolved)
        report = sandbox_lib.call(
            "serving_opt.serving.validate:execute", model_base, resolved, runtime_note,
            policy=policy, progress=say, env=sandbox_lib.search_path(*binary_dirs(resolved)))
    else:
        report = execute(model_base, resolved, runtime_note, say)
    report = dataclasses.replace(report, sandbox=sandbox_lib.describe(sandboxed))
    if report.ok and options.write_warmup:
        # Written here, not by the process that ran the model: only records whose answers
        # matched, once they did, into the version being validated.
        from serving_opt.serving import warmup

        path = warmup.write_warmup_records(model_dir, report.warmup_records)
        say(f"wrote {path}")
        report = dataclasses.replace(report, warmup_file=path)
    return dataclasses.replace(report, warmup_records=())


def _sandbox_policy(model_base: str, options: ValidateOptions) -> sandbox_lib.Policy:
    """Read: the served base, the reference, the examples, the runtime; write: nothing."""
    read_only = [model_base]
    for path in (options.reference_dir, options.examples):
        if path:
            read_only.append(path)
    read_only += sandbox_lib.interpreter_dirs(options.serving_runtime_python)
    read_only += binary_dirs(options)
    return sandbox_lib.Policy(read_only=tuple(read_only))


def binary_dirs(options: ValidateOptions) -> list[str]:
    """Where ``--server=binary``'s tensorflow_model_server is (its name's directory, then
    the file's own): bound read-only in the sandbox, the first on its PATH."""
    if options.server != "binary":
        return []
    import shutil

    binary = shutil.which(backends.BINARY_NAME)
    if binary is None:
        return []
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(binary)),
                               os.path.dirname(os.path.realpath(binary))]))


def execute(model_base: str, options: ValidateOptions, runtime_note: str = "",
            progress: Callable[[str], None] | None = None) -> ValidationReport:
    """The executor (in the sandbox): serve, probe, compare, load; ``options`` resolved by
    :func:`validate` (the backend, the version, the runtime's interpreter)."""
    say = progress or sandbox_lib.say
    protocols = parse_protocols(options.protocols)
    version, backend = options.version, options.server
    model_dir = version_dir(model_base, version)
    model_name = options.model_name or os.path.basename(model_base.rstrip("/")) or "model"
    reference_dir = options.reference_dir or model_dir
    tags = loader.parse_tags(options.saved_model_tags)
    say(f"preparing requests from the reference model {reference_dir}")
    # Reads and checks the served model too: a bad model fails before any server starts.
    probes, served = requests.build_probes(
        model_dir, reference_dir, model_name, version, tags, examples=options.examples,
        batch_size=options.batch_size, seed=options.seed, atol=options.atol, rtol=options.rtol)
    runtime = _local_runtime(options, say)[0] if backend == "local" else None

    warmup_file = None
    ignored = sorted(v for v in _versions(model_base) if v != version)
    if ignored:
        say(f"serving version {version} only; ignoring version(s) "
            f"{', '.join(map(str, ignored))} of {model_base}")
    # A specific version policy: the server loads (and runs the init op of) this version
    # and no other, whatever else the base holds.
    spec = backends.ServerSpec(model_name=model_name, model_base=model_base, image=options.image,
                               saved_model_tags=options.saved_model_tags,
                               rest_api="rest" in protocols, version=version)
    server = backends.make_server(backend, spec, runtime)
    checks: list[Check] = []
    load_tests: dict[str, LoadTest] = {}
    failures: list[str] = []

    def finish() -> ValidationReport:
        report = _finish(backend, model_name, model_base, version, reference_dir, checks,
                         load_tests, warmup_file, server, failures, protocols, runtime_note,
                         ignored)
        if options.write_warmup and not failures:
            from serving_opt.serving import warmup

            report = dataclasses.replace(report, warmup_records=warmup.records(probes))
        return report

    say(f"starting the {backend} server on {server.address}")
    say(f"  {server.description}" + (f", REST on {server.rest_address}"
                                     if server.rest_address else ""))
    server.start()
    try:
        try:
            if "grpc" in protocols:
                client.wait_until_available(server.address, model_name, version, server,
                                            options.load_deadline, say)
                checks.append(Check("model AVAILABLE", True, f"version {version}"))
            if "rest" in protocols:
                rest_client.wait_until_available(server.rest_address, model_name, version,
                                                 server, options.load_deadline, say)
                checks.append(Check("REST model AVAILABLE", True, f"version {version}"))
        except ServingOptError as e:
            checks.append(Check(("REST " if checks else "") + "model AVAILABLE", False,
                                e.problem))
            failures.append(e.problem)
            return finish()
        say("checking metadata and answers over " + " and ".join(protocols))
        if "grpc" in protocols:
            checks.extend(_answer_checks(server.address, model_name, version, served, probes,
                                         options))
        rest_probes = [r for r in (rest_client.to_rest(p, served) for p in probes) if r]
        if "rest" in protocols:
            checks.extend(_rest_answer_checks(server.rest_address, model_name, version, served,
                                              rest_probes, options))
        failures.extend(f"{c.name}: {c.detail}" for c in checks if not c.ok)
        # Load only a model that answers right: errors under load would just repeat
        # the failures already reported.
        if options.concurrency > 0 and options.duration > 0 and not failures:
            say(f"load phase: {options.concurrency} clients ({', '.join(protocols)}) for "
                f"{options.duration:g} s")
            load_tests.update(_load_phase(server, protocols, probes, rest_probes, options))
            for protocol, load_test in load_tests.items():
                if load_test.errors:
                    failures.append(f"load phase ({protocol}): {load_test.errors} of "
                                    f"{load_test.requests} requests failed "
                                    f"({load_test.first_error})")
        return finish()
    finally:
        server.close()


def _local_runtime(options: ValidateOptions, say) -> tuple:
    """The runtime the local stand-in runs under, and a note when it is not the target."""
    if options.serving_version is not None:
        runtime = runtime_lib.resolve_runtime(options.serving_version,
                                              options.serving_runtime_python, say)
        return runtime, ""
    target = runtime_lib.image_version(options.image) or runtime_lib.DEFAULT_SERVING_VERSION
    runtime = runtime_lib.find_runtime(target, options.serving_runtime_python)
    if runtime is not None:
        return runtime, ""
    current = runtime_lib.current_tf_version()
    note = (f"the stand-in ran TensorFlow {current}, not the target TF Serving's "
            f"{runtime_lib.major_minor(target)} (no runtime for it here; "
            f"--serving_version={target} installs one)")
    say(note)
    return None, note


def _rest_answer_checks(address: str, model_name: str, version: int, served: dict,
                        rest_probes, options: ValidateOptions) -> list[Check]:
    """The metadata check and every probe's answer over REST."""
    checks = []
    try:
        ok, detail = rest_client.check_metadata(address, model_name, version, served,
                                                options.request_timeout)
        checks.append(Check("REST metadata signature_def", ok, detail))
    except rest_client.RestError as e:
        checks.append(Check("REST metadata signature_def", False, str(e)))
    for probe in rest_probes:
        try:
            response = rest_client.call(address, probe, options.request_timeout)
        except rest_client.RestError as e:
            checks.append(Check(probe.name, False, str(e)))
            continue
        problem = probe.check(response)
        checks.append(Check(probe.name, not problem, problem or "answers match the reference"))
    return checks


def _load_phase(server: backends.ServerProcess, protocols: tuple[str, ...], probes,
                rest_probes, options: ValidateOptions) -> dict[str, LoadTest]:
    """Both protocols at once, the clients split between them."""
    import threading

    active = [p for p in protocols if p == "grpc" or rest_probes]
    share = {p: max(1, options.concurrency // len(active)
                    + (1 if i < options.concurrency % len(active) else 0))
             for i, p in enumerate(active)}
    results: dict[str, LoadTest] = {}

    def run(protocol: str) -> None:
        if protocol == "grpc":
            results[protocol] = client.run_load_test(server.address, probes, share[protocol],
                                                     options.duration, options.request_timeout)
        else:
            results[protocol] = rest_client.run_load_test(
                server.rest_address, rest_probes, share[protocol], options.duration,
                options.request_timeout)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in active]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {p: results[p] for p in active if p in results}


def _refuse_host_ops(model_dirs, tags) -> None:
    from serving_opt import untrusted

    for model_dir in model_dirs:
        meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
        untrusted.refuse_host_ops(meta_graph, sorted(loader.serving_signatures(meta_graph)),
                                  "serve")


def _answer_checks(address: str, model_name: str, version: int, served: dict,
                   probes: Sequence[requests.Probe], options: ValidateOptions) -> list[Check]:
    """The metadata check, then one check per probe; a failed call fails only its check."""
    grpc = client.serving_api().grpc
    checks = []
    with client.prediction_service(address) as stub:
        try:
            ok, detail = client.check_metadata(stub, model_name, version, served,
                                               options.request_timeout)
            checks.append(Check("GetModelMetadata signature_def", ok, detail))
        except grpc.RpcError as e:
            checks.append(Check("GetModelMetadata signature_def", False, client.rpc_error(e)))
        for probe in probes:
            try:
                response = client.call(stub, probe, options.request_timeout)
            except grpc.RpcError as e:
                checks.append(Check(probe.name, False, client.rpc_error(e)))
                continue
            problem = probe.check(response)
            checks.append(Check(probe.name, not problem, problem or "answers match the reference"))
    return checks


def _finish(backend: str, model_name: str, model_base: str, version: int, reference_dir: str,
            checks: list[Check], load_tests: dict[str, LoadTest], warmup_file: str | None,
            server: backends.ServerProcess, failures: list[str], protocols: tuple[str, ...],
            runtime_note: str, ignored: Sequence[int] = ()) -> ValidationReport:
    backends.identify(server)
    return ValidationReport(
        ok=not failures,
        backend=backend,
        backend_note=backends.BACKEND_NOTES[backend],
        address=server.address,
        model_name=model_name,
        model_base=model_base,
        version=version,
        reference_dir=reference_dir,
        checks=tuple(checks),
        load_test=load_tests.get("grpc") or load_tests.get("rest"),
        warmup_file=warmup_file,
        # The tail explains a failure; on success it would only be noise in the report.
        server_log_tail=server.log_tail(20) if failures else "",
        failures=tuple(failures),
        server=server.description,
        tensorflow_version=_answering_tf_version(server),
        runtime_note=runtime_note,
        protocols=protocols,
        rest_address=server.rest_address,
        rest_load_test=load_tests.get("rest") if "grpc" in load_tests else None,
        ignored_versions=tuple(ignored),
    )


def _answering_tf_version(server: backends.ServerProcess) -> str:
    """The TensorFlow that answered: the server's own "TensorFlow X" log line when it
    prints one (serve does), else what the backend knows (image tag, --version, the
    interpreter it ran)."""
    import re

    if server.backend == "local":
        match = re.search(r"serving-opt serve: TensorFlow (\S+)", server.log_tail(400))
        if match:
            return match.group(1)
    return server.tf_version
