"""Prove a model in a real serving round trip: load, metadata, answers, load test.

TFX's InfraValidator only checks that requests do not fail. This compares every
answer with the reference model run in-process (the original, when validating an
optimized model), over TF Serving's gRPC API and its REST API (``--protocols``):

1. start the server (a runner, ``backends``; the local stand-in under the target
   TensorFlow, ``runtime``) and wait until the model status (GetModelStatus, and
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
runs in which order and turns the outcomes into a ValidationReport. :func:`validate`
resolves (version, backend, runtime, sandbox) and runs :func:`execute` in a sandbox;
``execute`` starts the runner and holds one client per protocol. The jobs live in their
own modules: ``requests`` builds the probes and their expected answers, ``clients`` is
the client interface (``client`` gRPC, ``rest_client`` REST), ``backends`` the runners,
``results`` the report types, ``markers`` writes the VALIDATED / NOT_VALIDATED file,
``warmup`` the warmup records.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

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
from serving_opt.savedmodel import loader, model_files, tf_process, writer
from serving_opt.serving import backends, requests, warmup
from serving_opt.serving import runtime as runtime_lib
from serving_opt.serving.clients import ModelServerClient
from serving_opt.serving.grpc_client import GrpcClient
from serving_opt.serving.markers import MARKER_FAILED, MARKER_OK, write_marker
from serving_opt.serving.process import ServerProcess
from serving_opt.serving.rest_client import RestClient
from serving_opt.serving.results import Check, LoadTest, ValidationReport

# Importers of this module (the CLI, the optimizer, tests) use these names from here.
__all__ = [
    "MARKER_FAILED", "MARKER_OK", "Check", "LoadTest", "ValidateOptions", "ValidationReport",
    "resolve_version", "validate", "write_marker",
]


def _versions(model_base: str) -> dict[int, str]:
    """Version -> the directory TF Serving serves for it (``02`` is version 2; when ``2``
    and ``02`` both exist, the one upstream indexes last)."""
    return {v: names[-1] for v, names in writer.version_dirs(model_base).items()
            if os.path.isdir(os.path.join(model_base, names[-1]))}


def version_dir(model_base: str, version: int) -> str:
    """The directory of ``version`` in ``model_base`` as TF Serving names it."""
    return os.path.join(model_base, _versions(model_base).get(version, str(version)))


def resolve_version(model_base: str, version: int | None) -> int:
    """``version`` if the base has it, else (None) the highest version in the base."""
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


# One client per protocol; validation never asks which one it holds.
CLIENTS: dict[str, type[ModelServerClient]] = {"grpc": GrpcClient, "rest": RestClient}


@dataclass(frozen=True)
class Target:
    """What one execution serves and judges, resolved once from the options."""

    model_base: str
    model_name: str
    version: int
    model_dir: str
    reference_dir: str
    tags: frozenset[str]
    backend: str  # concrete: docker, binary or local
    protocols: tuple[str, ...]
    ignored: tuple[int, ...]  # other versions in the base: not served
    runtime_note: str = ""


@dataclass(frozen=True)
class Outcome:
    """What the checks found: every check, the failures, the load phase per protocol."""

    checks: tuple[Check, ...]
    failures: tuple[str, ...] = ()
    load_tests: Mapping[str, LoadTest] = field(default_factory=dict)


def validate(model_base: str, options: ValidateOptions = ValidateOptions(),  # noqa: B008
             progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Serves ``model_base`` and checks load, metadata, every signature's answers and load.

    Never raises for a model that fails validation: the report says why
    (``ok=False``). Raises ServingOptError/UsageError for bad arguments.
    """
    say = progress or (lambda m: None)
    check_options(options)
    model_base = os.path.abspath(model_base)
    version = resolve_version(model_base, options.version)
    model_dir = version_dir(model_base, version)
    # Sandboxed, this process imports no TensorFlow (unless it writes the warmup file):
    # the executor checks the model statically, then runs it, in its sandbox.
    sandboxed = sandbox_lib.require(options.trust.allow_unsandboxed, f"validate {model_dir}")
    if sandboxed and options.trust.allow_unsandboxed and options.serving.server == "docker":
        sandboxed = False  # the Docker client cannot run in a sandbox; the user trusts it
    resolved, runtime_note = _resolve(options, version, sandboxed, say)
    if sandboxed:
        report = sandbox_lib.call(
            "serving_opt.serving.validate:execute", model_base, resolved, runtime_note,
            policy=_sandbox_policy(model_base, resolved), progress=say,
            env=sandbox_lib.search_path(*binary_dirs(resolved)))
    else:
        report = execute(model_base, resolved, runtime_note, say)
    report = dataclasses.replace(report, sandbox=sandbox_lib.describe(sandboxed))
    if report.ok and options.serving.write_warmup:
        report = _write_warmup(report, model_dir, say)
    return dataclasses.replace(report, warmup_records=())


def execute(model_base: str, options: ValidateOptions, runtime_note: str = "",
            progress: Callable[[str], None] | None = None) -> ValidationReport:
    """The executor (in the sandbox): serve, probe, compare, load; ``options`` resolved by
    :func:`validate` (the backend, the version, the runtime's interpreter)."""
    say = progress or sandbox_lib.say
    tf_process.quiet_tensorflow_import()
    target = _target(model_base, options, runtime_note)
    _admit(target.model_dir, options)
    say(f"preparing requests from the reference model {target.reference_dir}")
    # Reads and checks the served model too: a bad model fails before any server starts.
    probes, served = requests.build_probes(
        target.model_dir, target.reference_dir, target.model_name, target.version,
        target.tags,
        inputs=requests.ProbeInputs(examples=options.inputs.examples,
                                    batch_size=options.serving.batch_size,
                                    seed=options.inputs.seed),
        atol=options.tolerance.atol, rtol=options.tolerance.rtol)
    runtime = _local_runtime(options, say)[0] if target.backend == "local" else None
    if target.ignored:
        say(f"serving version {target.version} only; ignoring version(s) "
            f"{', '.join(map(str, target.ignored))} of {model_base}")
    server = backends.make_server(target.backend, _server_spec(target, options), runtime)
    say(f"starting the {target.backend} server on {server.address}")
    say(f"  {server.description}" + (f", REST on {server.rest_address}"
                                     if server.rest_address else ""))
    with server:
        outcome = _serve(server, target, probes, served, options, say)
        report = _report(target, server, outcome)  # while its whole log is still there
    if options.serving.write_warmup and report.ok:
        report = dataclasses.replace(report, warmup_records=warmup.records(probes))
    return report


def _serve(server: ServerProcess, target: Target, probes: Sequence[requests.Probe],
           served: dict, options: ValidateOptions, say: Callable[[str], None]) -> Outcome:
    """Against the running server, one client per protocol: AVAILABLE, then metadata and
    answers; then, for a model that answers right, the load phase."""
    with ExitStack() as stack:
        clients = [stack.enter_context(CLIENTS[p](
            server.endpoints[p], target.model_name, target.version,
            options.serving.request_timeout))
            for p in target.protocols]
        checks = _wait_until_available(clients, server, target.version,
                                       options.serving.load_deadline)
        if not checks[-1].ok:
            return Outcome(tuple(checks), failures=(checks[-1].detail,))
        say("checking metadata and answers over " + " and ".join(target.protocols))
        sendable = {client.protocol: client.prepare(probes, served) for client in clients}
        for client in clients:
            checks += _answer_checks(client, served, sendable[client.protocol])
        failures = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
        # Load only a model that answers right: errors under load would just repeat
        # the failures already reported.
        if failures or not (options.serving.concurrency > 0 and options.serving.duration > 0):
            return Outcome(tuple(checks), tuple(failures))
        say(f"load phase: {options.serving.concurrency} clients "
            f"({', '.join(target.protocols)}) for {options.serving.duration:g} s")
        load_tests = _load_phase(clients, sendable, options)
        failures += [f"load phase ({protocol}): {lt.errors} of {lt.requests} requests failed "
                     f"({lt.first_error})" for protocol, lt in load_tests.items() if lt.errors]
        return Outcome(tuple(checks), tuple(failures), load_tests)


def _wait_until_available(clients: Sequence[ModelServerClient], server: ServerProcess,
                          version: int, deadline_s: float) -> list[Check]:
    """A check per client until one fails. The first client's failure is the model's
    ("model AVAILABLE", whatever the protocol); a later one's is its protocol's (one API
    saw the version, this one did not)."""
    checks: list[Check] = []
    for client in clients:
        try:
            client.wait_until_available(server, deadline_s)
        except ServingOptError as e:
            name = client.available_check if checks else "model AVAILABLE"
            return checks + [Check(name, False, e.problem)]
        checks.append(Check(client.available_check, True, f"version {version}"))
    return checks


def _answer_checks(client: ModelServerClient, served: dict, probes: Sequence) -> list[Check]:
    """The metadata check, then one check per probe; a failed call fails only its check."""
    try:
        ok, detail = client.check_metadata(served)
        checks = [Check(client.metadata_check, ok, detail)]
    except client.errors as e:
        checks = [Check(client.metadata_check, False, client.describe(e))]
    for probe in probes:
        try:
            response = client.call(probe)
        except client.errors as e:
            checks.append(Check(probe.name, False, client.describe(e)))
            continue
        problem = probe.check(response)
        checks.append(Check(probe.name, not problem, problem or "answers match the reference"))
    return checks


def _load_phase(clients: Sequence[ModelServerClient], sendable: Mapping[str, list],
                options: ValidateOptions) -> dict[str, LoadTest]:
    """Every protocol with something to send at once, the clients split between them."""
    active = [c for c in clients if sendable[c.protocol]]
    if not active:
        return {}
    n, extra = divmod(options.serving.concurrency, len(active))
    share = {c.protocol: max(1, n + (1 if i < extra else 0)) for i, c in enumerate(active)}
    results: dict[str, LoadTest] = {}

    def run(client: ModelServerClient) -> None:
        results[client.protocol] = client.run_load_test(
            sendable[client.protocol], share[client.protocol], options.serving.duration)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in active]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {c.protocol: results[c.protocol] for c in active if c.protocol in results}


def _report(target: Target, server: ServerProcess, outcome: Outcome) -> ValidationReport:
    """The report of one execution: what was served, by what, and what it found."""
    server.identify()
    loads = outcome.load_tests
    return ValidationReport(
        ok=not outcome.failures,
        backend=target.backend,
        backend_note=server.note,
        address=server.address,
        model_name=target.model_name,
        model_base=target.model_base,
        version=target.version,
        reference_dir=target.reference_dir,
        checks=outcome.checks,
        load_test=loads.get("grpc") or loads.get("rest"),
        warmup_file=None,
        # The tail explains a failure; on success it would only be noise in the report.
        server_log_tail=server.log_tail(20) if outcome.failures else "",
        failures=outcome.failures,
        server=server.description,
        tensorflow_version=server.answering_tf_version(),
        runtime_note=target.runtime_note,
        protocols=target.protocols,
        rest_address=server.rest_address,
        rest_load_test=loads.get("rest") if "grpc" in loads else None,
        ignored_versions=target.ignored,
    )


def _target(model_base: str, options: ValidateOptions, runtime_note: str) -> Target:
    """The executor's view of ``options`` resolved by :func:`validate`."""
    version = options.version
    model_dir = version_dir(model_base, version)
    return Target(
        model_base=model_base,
        model_name=options.serving.model_name or os.path.basename(model_base.rstrip("/"))
        or "model",
        version=version,
        model_dir=model_dir,
        reference_dir=options.reference_dir or model_dir,
        tags=loader.parse_tags(options.inputs.saved_model_tags),
        backend=options.serving.server,
        protocols=parse_protocols(options.serving.protocols),
        ignored=tuple(sorted(v for v in _versions(model_base) if v != version)),
        runtime_note=runtime_note,
    )


def _server_spec(target: Target, options: ValidateOptions) -> backends.ServerSpec:
    """A specific version policy: the server loads (and runs the init op of) this version
    and no other, whatever else the base holds."""
    return backends.ServerSpec(model_name=target.model_name, model_base=target.model_base,
                               image=options.serving.image,
                               saved_model_tags=options.inputs.saved_model_tags,
                               rest_api="rest" in target.protocols, version=target.version,
                               allow_file_ops=options.trust.allow_file_ops,
                               docker_network=options.serving.docker_network)


def _admit(model_dir: str, options: ValidateOptions) -> None:
    """The static checks before anything runs the model or its reference."""
    reference_dir = options.reference_dir or model_dir
    # A symlink out of a model is never followed: not by the server, not by the warmup
    # file written into assets.extra/, not by the reference run.
    for checked in dict.fromkeys((model_dir, reference_dir)):
        model_files.check_model_files(checked)
    if not options.trust.allow_file_ops:
        # A SavedModel is code: refused before the reference run or the server runs it.
        _refuse_host_ops(dict.fromkeys((model_dir, reference_dir)),
                         loader.parse_tags(options.inputs.saved_model_tags))


def _resolve(options: ValidateOptions, version: int, sandboxed: bool,
             say: Callable[[str], None]) -> tuple[ValidateOptions, str]:
    """``options`` as the executor runs them (the concrete backend, the version, the local
    runtime's interpreter, absolute paths: it runs elsewhere, cwd /tmp, in its sandbox),
    and the runtime note."""
    backend = backends.resolve_backend(options.serving.server, sandboxed=sandboxed,
                                       image=options.serving.image,
                                       docker_network=options.serving.docker_network)
    if options.serving.require_server == "tf_serving" and backend == "local":
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
            options = dataclasses.replace(options, target=dataclasses.replace(
                options.target, serving_runtime_python=runtime.python))
    examples = options.inputs.examples
    return dataclasses.replace(
        options, version=version,
        serving=dataclasses.replace(options.serving, server=backend),
        inputs=dataclasses.replace(options.inputs,
                                   examples=os.path.abspath(examples) if examples else None),
        reference_dir=os.path.abspath(options.reference_dir) if options.reference_dir
        else None), runtime_note


def _write_warmup(report: ValidationReport, model_dir: str,
                  say: Callable[[str], None]) -> ValidationReport:
    """Written here, not by the process that ran the model: only records whose answers
    matched, once they did, into the version being validated."""
    tf_process.quiet_tensorflow_import()  # for its TFRecord writer
    path = warmup.write_warmup_records(model_dir, report.warmup_records)
    say(f"wrote {path}")
    return dataclasses.replace(report, warmup_file=path)


def _sandbox_policy(model_base: str, options: ValidateOptions) -> sandbox_lib.Policy:
    """Read: the served base, the reference, the examples, the runtime; write: nothing."""
    read_only = [model_base]
    for path in (options.reference_dir, options.inputs.examples):
        if path:
            read_only.append(path)
    read_only += sandbox_lib.interpreter_dirs(options.target.serving_runtime_python)
    read_only += binary_dirs(options)
    # A model can block for ever: an hour for the probes and load test, plus the load.
    timeout = options.trust.sandbox_timeout_seconds or 3600.0 + options.serving.load_deadline
    return sandbox_lib.Policy(read_only=tuple(read_only), timeout_seconds=timeout)


def binary_dirs(options: ValidateOptions) -> list[str]:
    """Where ``--server=binary``'s tensorflow_model_server is (its name's directory, then
    the file's own): bound read-only in the sandbox, the first on its PATH."""
    return backends.binary_dirs() if options.serving.server == "binary" else []


def _local_runtime(options: ValidateOptions, say) -> tuple:
    """The runtime the local stand-in runs under, and a note when it is not the target."""
    return runtime_lib.stand_in_runtime(options.target.serving_version,
                                        options.target.serving_runtime_python,
                                        options.serving.image, say)


def _refuse_host_ops(model_dirs, tags) -> None:
    from serving_opt.savedmodel import untrusted

    for model_dir in model_dirs:
        meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
        untrusted.refuse_host_ops(meta_graph, sorted(loader.serving_signatures(meta_graph)),
                                  "serve")
