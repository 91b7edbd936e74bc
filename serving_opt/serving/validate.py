"""Prove a model in a real serving round trip: load, metadata, answers, load test.

TFX's InfraValidator only checks that requests do not fail. This compares every
answer with the reference model run in-process (the original, when validating an
optimized model), over TF Serving's gRPC API:

1. start the server (``backends``) and wait until GetModelStatus reports the
   version AVAILABLE (END, a dead process or the deadline fail, with the log);
2. GetModelMetadata's SignatureDefMap must equal the SavedModel's;
3. every signature gets a Predict request; classify/regress signatures also a
   Classify/Regress request; a model with both kinds a MultiInference request;
   each answer is compared with the reference (same tolerances as the parity gate);
4. a load phase: N concurrent clients for S seconds, zero errors required.

The server is always stopped, on failure and on Ctrl-C too.

This module is the executor (TFX's ``infra_validator/executor``): it decides what
runs in which order and turns the outcomes into a ValidationReport. The jobs live
in their own modules: ``requests`` builds the probes and their expected answers,
``client`` talks gRPC to the server, ``backends`` starts and stops it, ``markers``
writes the VALIDATED / NOT_VALIDATED file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.serving import backends, client, requests
from serving_opt.serving.client import LoadTest
from serving_opt.serving.markers import MARKER_FAILED, MARKER_OK, write_marker
from serving_opt.stages import loader, parity, writer

# Importers of this module (the CLI, the optimizer, tests) use these names from here.
__all__ = [
    "MARKER_FAILED", "MARKER_OK", "Check", "LoadTest", "ValidateOptions", "ValidationReport",
    "resolve_version", "validate", "write_marker",
]


@dataclass(frozen=True)
class ValidateOptions:
    """Options of ``serving-opt validate``.

    Example:
        >>> ValidateOptions(server="local", concurrency=4, duration=2.0)
    """

    model_name: str | None = None  # default: the model base's directory name
    version: int | None = None  # default: the highest version in the base
    reference_dir: str | None = None  # default: the served version itself
    server: str = "auto"
    image: str = backends.DEFAULT_IMAGE
    examples: str | None = None
    saved_model_tags: str = loader.SERVE_TAG
    concurrency: int = 8
    duration: float = 5.0
    load_deadline: float = 300.0
    atol: float = parity.DEFAULT_ATOL
    rtol: float = parity.DEFAULT_RTOL
    batch_size: int = 8
    request_timeout: float = 30.0
    write_warmup: bool = False
    seed: int = 0
    # Serve (and run as the reference) a model whose signatures touch files or the host.
    allow_file_ops: bool = False


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

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_version(model_base: str, version: int | None) -> int:
    """``version`` if the base has it, else (None) the highest version in the base.

    Example:
        >>> resolve_version("build/models/classifier", None)
        1
    """
    if not os.path.isdir(model_base):
        raise ServingOptError(f"model base {model_base} does not exist",
                              "point --model_base at the directory holding version directories")
    versions = writer.existing_versions(model_base)
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


def validate(model_base: str, options: ValidateOptions = ValidateOptions(),
             progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Serves ``model_base`` and checks load, metadata, every signature's answers and load.

    Never raises for a model that fails validation: the report says why
    (``ok=False``). Raises ServingOptError/UsageError for bad arguments.

    Example:
        >>> validate("build/models/classifier", ValidateOptions(server="local")).ok
        True
    """
    say = progress or (lambda m: None)
    if options.concurrency < 0 or options.duration < 0:
        raise UsageError("--concurrency and --duration must be >= 0",
                         "0 skips the load phase")
    model_base = os.path.abspath(model_base)
    version = resolve_version(model_base, options.version)
    model_dir = os.path.join(model_base, str(version))
    model_name = options.model_name or os.path.basename(model_base.rstrip("/")) or "model"
    reference_dir = options.reference_dir or model_dir
    tags = loader.parse_tags(options.saved_model_tags)
    # A symlink out of a model is never followed: not by the server, not by the warmup
    # file written into assets.extra/, not by the reference run.
    for checked in dict.fromkeys((model_dir, reference_dir)):
        loader.check_model_files(checked)
    if not options.allow_file_ops:
        # A SavedModel is code: refused before the reference run or the server runs it.
        _refuse_host_ops(dict.fromkeys((model_dir, reference_dir)), tags)
    say(f"preparing requests from the reference model {reference_dir}")
    # Reads and checks the served model too: a bad model fails before any server starts.
    probes, served = requests.build_probes(
        model_dir, reference_dir, model_name, version, tags, examples=options.examples,
        batch_size=options.batch_size, seed=options.seed, atol=options.atol, rtol=options.rtol)
    backend = backends.resolve_backend(options.server)

    warmup_file = None
    if options.write_warmup:
        from serving_opt.serving import warmup

        warmup_file = warmup.write_warmup_file(model_dir, probes)
        say(f"wrote {warmup_file}")

    spec = backends.ServerSpec(model_name=model_name, model_base=model_base, image=options.image,
                               saved_model_tags=options.saved_model_tags)
    server = backends.make_server(backend, spec)
    checks: list[Check] = []
    load_test = None
    failures: list[str] = []
    say(f"starting the {backend} server on {server.address}")
    server.start()
    try:
        try:
            client.wait_until_available(server.address, model_name, version, server,
                                        options.load_deadline, say)
            checks.append(Check("model AVAILABLE", True, f"version {version}"))
        except ServingOptError as e:
            checks.append(Check("model AVAILABLE", False, e.problem))
            failures.append(e.problem)
            return _finish(backend, model_name, model_base, version, reference_dir, checks,
                           None, warmup_file, server, failures)
        say("checking metadata and answers")
        checks.extend(_answer_checks(server.address, model_name, version, served, probes,
                                     options))
        failures.extend(f"{c.name}: {c.detail}" for c in checks if not c.ok)
        # Load only a model that answers right: errors under load would just repeat
        # the failures already reported.
        if options.concurrency > 0 and options.duration > 0 and not failures:
            say(f"load phase: {options.concurrency} clients for {options.duration:g} s")
            load_test = client.run_load_test(server.address, probes, options.concurrency,
                                             options.duration, options.request_timeout)
            if load_test.errors:
                failures.append(f"load phase: {load_test.errors} of {load_test.requests} "
                                f"requests failed ({load_test.first_error})")
        return _finish(backend, model_name, model_base, version, reference_dir, checks,
                       load_test, warmup_file, server, failures)
    finally:
        server.close()


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
            checks: list[Check], load_test: LoadTest | None, warmup_file: str | None,
            server: backends.ServerProcess, failures: list[str]) -> ValidationReport:
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
        load_test=load_test,
        warmup_file=warmup_file,
        # The tail explains a failure; on success it would only be noise in the report.
        server_log_tail=server.log_tail(20) if failures else "",
        failures=tuple(failures),
    )
