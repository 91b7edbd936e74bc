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
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.serving import backends
from serving_opt.stages import inputs as inputs_lib
from serving_opt.stages import loader, parity, writer

STATE_AVAILABLE = 30
STATE_END = 50
MARKER_OK = "VALIDATED"
MARKER_FAILED = "NOT_VALIDATED"


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


@dataclass(frozen=True)
class Check:
    """One validation check and its outcome."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class LoadTest:
    """The load phase's numbers."""

    concurrency: int
    seconds: float
    requests: int
    errors: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    first_error: str = ""


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


_BACKEND_NOTES = {
    "docker": "TF Serving (Docker image)",
    "binary": "TF Serving (tensorflow_model_server binary)",
    "local": "serving-opt's local TF-Serving-compatible server (a stand-in, not TF Serving)",
}


def _grpc():
    import grpc
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    return (grpc, classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
            inference_pb2, model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc,
            regression_pb2)


def wait_until_available(address: str, model_name: str, version: int,
                         server: backends.ServerProcess | None, deadline_s: float,
                         say: Callable[[str], None] = lambda m: None) -> None:
    """Polls GetModelStatus until ``version`` is AVAILABLE; raises on END/exit/deadline.

    Example:
        >>> wait_until_available("127.0.0.1:8500", "clf", 1, None, 60)
    """
    grpc, _, _, status_pb2, _, model_grpc, *_ = _grpc()
    channel = grpc.insecure_channel(address)
    stub = model_grpc.ModelServiceStub(channel)
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    try:
        while time.monotonic() < deadline:
            if server is not None and server.exit_code() is not None:
                log = server.log_tail(200)
                failure = load_failure(log)
                if failure:
                    raise ServingOptError(
                        f"the server failed to load {model_name} version {version}: {failure}",
                        f"fix the model; full server log: {server.log_path}",
                    )
                raise ServingOptError(
                    f"the {server.backend} server exited with code {server.exit_code()} "
                    f"before version {version} became AVAILABLE: {_last_line(log)}",
                    f"see its log: {server.log_path}",
                )
            request = status_pb2.GetModelStatusRequest()
            request.model_spec.name = model_name
            try:
                response = stub.GetModelStatus(request, timeout=5)
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
                time.sleep(0.5)
                continue
            for status in response.model_version_status:
                if status.version != version:
                    continue
                if status.state == STATE_AVAILABLE:
                    return
                if status.state == STATE_END:
                    message = status.status.error_message or "unloaded"
                    raise ServingOptError(
                        f"the server failed to load {model_name} version {version}: {message}",
                        "fix the model; the server log has details"
                        + (f" ({server.log_path})" if server else ""),
                    )
                last = f"version {version} state {status.state}"
            time.sleep(0.5)
    finally:
        channel.close()
    raise ServingOptError(
        f"{model_name} version {version} was not AVAILABLE within {deadline_s:.0f} s ({last})",
        "raise --load_deadline, or check the server log"
        + (f" ({server.log_path})" if server else ""),
    )


def load_failure(log: str) -> str | None:
    """The load error in a TF Serving log ("Loading servable: {...} failed: ..."), one line.

    Example:
        >>> load_failure("E Loading servable: {name: m version: 1} failed: NOT_FOUND: x")
        'NOT_FOUND: x'
    """
    lines = log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if "Loading servable" in line and "failed:" in line:
            head = line.split("failed:", 1)[1].strip()
            tail = [ln.strip() for ln in lines[i + 1:i + 12]
                    if ln.strip() and not ln.strip().startswith(("[[", "Detected at", "Node:"))
                    and "serving-opt serve:" not in ln]
            cause = tail[-1] if tail else ""
            return f"{head} {cause}".strip() if cause and cause not in head else head
    return None


def _prediction_channel(grpc, address: str):
    """A channel with TF Serving's message limit (INT32_MAX) both ways, not gRPC's 4 MiB."""
    return grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 2**31 - 1),
        ("grpc.max_send_message_length", 2**31 - 1)])


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


@dataclass(frozen=True)
class _Probe:
    """One request to send, and how to check its answer."""

    name: str
    method: str  # "Predict" | "Classify" | "Regress" | "MultiInference"
    request: object
    check: Callable[[object], str]  # returns "" when the answer is right


def _tensor_proto(value: np.ndarray):
    import tensorflow as tf

    return tf.make_tensor_proto(value)


def _compare(expected, actual, atol: float, rtol: float) -> str:
    mismatches, max_abs, _, detail = parity.compare_arrays(
        np.asarray(expected), np.asarray(actual), atol, rtol)
    if mismatches:
        return (f"{mismatches} of {np.asarray(expected).size} elements differ"
                + (f" (max abs diff {max_abs:.3g})" if max_abs else "")
                + (f", {detail}" if detail else ""))
    return ""


def build_probes(model_dir: str, reference_dir: str, model_name: str, version: int,
                 tags: frozenset[str], options: ValidateOptions) -> tuple[list[_Probe], dict]:
    """Requests for every signature with expected answers from the reference model.

    Returns ``(probes, served_signature_map)``.
    """
    import tensorflow as tf

    (_, classification_pb2, _, _, inference_pb2, _, predict_pb2, _,
     regression_pb2) = _grpc()
    user = inputs_lib.read_examples_file(options.examples) if options.examples else None
    served_mg = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    sess, ref_mg = loader.load_session(reference_dir, tags)
    probes: list[_Probe] = []
    try:
        synth = inputs_lib.InputSynthesizer(
            inputs_lib.model_vocabulary(ref_mg, reference_dir), options.seed)
        keys = sorted(loader.serving_signatures(served_mg))
        example_batches: dict[str, list[bytes]] = {}
        for key in keys:
            ref_sig = ref_mg.signature_def.get(key)
            if ref_sig is None:
                raise ServingOptError(
                    f"signature {key} is served but missing from the reference {reference_dir}",
                    "pass the matching --reference_dir",
                )
            feed = inputs_lib.inputs_for_signature(
                ref_mg.graph_def, key, ref_sig, synth, user, options.batch_size, 1
            ).batches[0]
            expected = parity.run_signature(sess, ref_sig, feed)

            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = key
            request.model_spec.version.value = version
            for alias, value in feed.items():
                request.inputs[alias].CopyFrom(_tensor_proto(value))

            def check_predict(response, expected=expected, key=key):
                problems = []
                for alias, value in expected.items():
                    if alias not in response.outputs:
                        problems.append(f"output {alias} missing")
                        continue
                    got = tf.make_ndarray(response.outputs[alias])
                    diff = _compare(value, got, options.atol, options.rtol)
                    if diff:
                        problems.append(f"{alias}: {diff}")
                if response.model_spec.signature_name != key:
                    problems.append(f"reply names signature {response.model_spec.signature_name!r}")
                return "; ".join(problems)

            probes.append(_Probe(f"Predict {key}", "Predict", request, check_predict))

            method = ref_sig.method_name
            example_input = inputs_lib.example_input_alias(ref_mg.graph_def, ref_sig)
            if method in (loader.METHOD_CLASSIFY, loader.METHOD_REGRESS) and example_input:
                alias = example_input[0]
                records = [bytes(r) for r in feed[alias]]
                example_batches[key] = records
                probes.append(_example_probe(
                    key, method, records, expected, model_name, version, options,
                    classification_pb2, regression_pb2))
        classify = [k for k in example_batches
                    if ref_mg.signature_def[k].method_name == loader.METHOD_CLASSIFY]
        regress = [k for k in example_batches
                   if ref_mg.signature_def[k].method_name == loader.METHOD_REGRESS]
        if classify and regress:
            probes.append(_multi_inference_probe(
                sess, ref_mg, classify[0], regress[0], example_batches[classify[0]],
                model_name, version, options, inference_pb2))
    finally:
        sess.close()
    served = {k: v for k, v in served_mg.signature_def.items()}
    return probes, served


def _classification_check(expected: dict, options: ValidateOptions):
    def check(result) -> str:
        classifications = result.classifications
        n = len(next(iter(expected.values())))
        if len(classifications) != n:
            return f"{len(classifications)} classifications for {n} examples"
        problems = []
        if "scores" in expected:
            got = np.array([[c.score for c in row.classes] for row in classifications],
                           dtype=np.float32)
            diff = _compare(expected["scores"], got, options.atol, options.rtol)
            if diff:
                problems.append(f"scores: {diff}")
        if "classes" in expected:
            got = np.array([[c.label.encode() if isinstance(c.label, str) else c.label
                             for c in row.classes] for row in classifications], dtype=object)
            if got.shape != expected["classes"].shape or not (got == expected["classes"]).all():
                problems.append("class labels differ")
        return "; ".join(problems)
    return check


def _regression_check(expected: dict, options: ValidateOptions):
    def check(result) -> str:
        values = np.array([r.value for r in result.regressions], dtype=np.float32)
        want = np.asarray(expected["outputs"], dtype=np.float32).reshape(-1)
        diff = _compare(want, values, options.atol, options.rtol)
        return f"outputs: {diff}" if diff else ""
    return check


def _example_probe(key, method, records, expected, model_name, version, options,
                   classification_pb2, regression_pb2) -> _Probe:
    if method == loader.METHOD_CLASSIFY:
        request = classification_pb2.ClassificationRequest()
        check = _classification_check(expected, options)
        name = "Classify"
    else:
        request = regression_pb2.RegressionRequest()
        check = _regression_check(expected, options)
        name = "Regress"
    request.model_spec.name = model_name
    request.model_spec.signature_name = key
    request.model_spec.version.value = version
    for record in records:
        request.input.example_list.examples.add().ParseFromString(record)
    return _Probe(f"{name} {key}", name, request, lambda response: check(response.result))


def _multi_inference_probe(sess, ref_mg, classify_key, regress_key, records, model_name,
                           version, options, inference_pb2) -> _Probe:
    request = inference_pb2.MultiInferenceRequest()
    checks = []
    for key in (classify_key, regress_key):
        task = request.tasks.add()
        task.model_spec.name = model_name
        task.model_spec.signature_name = key
        task.model_spec.version.value = version
        sig = ref_mg.signature_def[key]
        task.method_name = sig.method_name
        alias = next(iter(sig.inputs))
        expected = parity.run_signature(sess, sig, {alias: np.array(records, dtype=object)})
        checks.append(_classification_check(expected, options)
                      if sig.method_name == loader.METHOD_CLASSIFY
                      else _regression_check(expected, options))
    for record in records:
        request.input.example_list.examples.add().ParseFromString(record)

    def check(response) -> str:
        if len(response.results) != 2:
            return f"{len(response.results)} results for 2 tasks"
        problems = [c(getattr(r, r.WhichOneof("result") or "classification_result"))
                    for c, r in zip(checks, response.results)]
        return "; ".join(p for p in problems if p)

    return _Probe(f"MultiInference {classify_key}+{regress_key}", "MultiInference", request,
                  check)


def _metadata_check(stub, get_model_metadata_pb2, model_name, version, served: dict,
                    timeout: float) -> Check:
    from tensorflow_serving.apis import get_model_metadata_pb2 as md

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model_name
    request.model_spec.version.value = version
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=timeout)
    signature_map = md.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    got = {k: v.SerializeToString(deterministic=True)
           for k, v in signature_map.signature_def.items()}
    want = {k: v.SerializeToString(deterministic=True) for k, v in served.items()}
    if got == want:
        return Check("GetModelMetadata signature_def", True, f"{len(got)} signatures match")
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return Check("GetModelMetadata signature_def", False,
                 f"missing {missing}, extra {extra}, different {differ}")


def _call(stub, probe: _Probe, timeout: float):
    return getattr(stub, probe.method)(probe.request, timeout=timeout)


def run_load_test(address: str, probes: list[_Probe], concurrency: int, seconds: float,
                  timeout: float) -> LoadTest:
    """``concurrency`` clients send the probes round robin for ``seconds``.

    Example:
        >>> run_load_test("127.0.0.1:8500", probes, 8, 2.0, 30).errors
        0
    """
    grpc, *_rest = _grpc()
    prediction_grpc = _rest[6]
    channel = _prediction_channel(grpc, address)
    stub = prediction_grpc.PredictionServiceStub(channel)
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    first_error: list[str] = []
    stop_at = time.monotonic() + seconds

    def client(i: int) -> None:
        n = i
        while time.monotonic() < stop_at:
            probe = probes[n % len(probes)]
            n += 1
            start = time.perf_counter()
            try:
                _call(stub, probe, timeout)
            except grpc.RpcError as e:
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{probe.name}: {e.code().name}: {e.details()}")
                continue
            latencies[i].append((time.perf_counter() - start) * 1000.0)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    elapsed = time.monotonic() - start
    channel.close()
    flat = [x for lat in latencies for x in lat]
    total = len(flat) + sum(errors)
    return LoadTest(
        concurrency=concurrency,
        seconds=round(elapsed, 3),
        requests=total,
        errors=sum(errors),
        requests_per_second=total / elapsed if elapsed > 0 else 0.0,
        p50_ms=float(np.percentile(flat, 50)) if flat else 0.0,
        p99_ms=float(np.percentile(flat, 99)) if flat else 0.0,
        first_error=first_error[0] if first_error else "",
    )


def resolve_version(model_base: str, version: int | None) -> int:
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
    say(f"preparing requests from the reference model {reference_dir}")
    # Reads and checks the served model too: a bad model fails before any server starts.
    probes, served = build_probes(model_dir, reference_dir, model_name, version, tags, options)
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
            wait_until_available(server.address, model_name, version, server,
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
        if options.concurrency > 0 and options.duration > 0 and not failures:
            say(f"load phase: {options.concurrency} clients for {options.duration:g} s")
            load_test = run_load_test(server.address, probes, options.concurrency,
                                      options.duration, options.request_timeout)
            if load_test.errors:
                failures.append(f"load phase: {load_test.errors} of {load_test.requests} "
                                f"requests failed ({load_test.first_error})")
        return _finish(backend, model_name, model_base, version, reference_dir, checks,
                       load_test, warmup_file, server, failures)
    finally:
        server.close()


def _answer_checks(address, model_name, version, served, probes, options) -> list[Check]:
    (grpc, _, get_model_metadata_pb2, _, _, _, _, prediction_grpc, _) = _grpc()
    channel = _prediction_channel(grpc, address)
    stub = prediction_grpc.PredictionServiceStub(channel)
    checks = []
    try:
        try:
            checks.append(_metadata_check(stub, get_model_metadata_pb2, model_name, version,
                                          served, options.request_timeout))
        except grpc.RpcError as e:
            checks.append(Check("GetModelMetadata signature_def", False,
                                f"{e.code().name}: {e.details()}"))
        for probe in probes:
            try:
                response = _call(stub, probe, options.request_timeout)
            except grpc.RpcError as e:
                checks.append(Check(probe.name, False, f"{e.code().name}: {e.details()}"))
                continue
            problem = probe.check(response)
            checks.append(Check(probe.name, not problem, problem or "answers match the reference"))
    finally:
        channel.close()
    return checks


def _finish(backend, model_name, model_base, version, reference_dir, checks, load_test,
            warmup_file, server, failures) -> ValidationReport:
    return ValidationReport(
        ok=not failures,
        backend=backend,
        backend_note=_BACKEND_NOTES[backend],
        address=server.address,
        model_name=model_name,
        model_base=model_base,
        version=version,
        reference_dir=reference_dir,
        checks=tuple(checks),
        load_test=load_test,
        warmup_file=warmup_file,
        server_log_tail=server.log_tail(20) if failures else "",
        failures=tuple(failures),
    )


def write_marker(report: ValidationReport, directory: str) -> str:
    """Writes VALIDATED or NOT_VALIDATED (InfraValidator's blessing, our names) and
    removes the other one, so a pipeline never reads a stale verdict.

    Example:
        >>> write_marker(report, "build/validation")
        'build/validation/VALIDATED'
    """
    os.makedirs(directory, exist_ok=True)
    name = MARKER_OK if report.ok else MARKER_FAILED
    other = MARKER_FAILED if report.ok else MARKER_OK
    stale = os.path.join(directory, other)
    if os.path.exists(stale):
        os.remove(stale)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f"{report.model_name} version {report.version} via {report.backend}\n")
    return path
