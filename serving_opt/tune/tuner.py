"""``tune()``: measure the session, propose a small grid, prove on a real server, decide.

0. **check** (here, before anything runs): options, the version, the signature, the
   static check of the graph (a SavedModel is code), ``--examples``,
   ``--current_parameters_file``, the output directory;
1. **measure** the session alone, per batch size and thread setting (``profile``), and
   read the grid off its curves (``grid``);
2. **prove** TF Serving's default, upstream's batching defaults, every grid setting and
   the user's current file, each on a server of its own under every workload;
3. **decide**: TF Serving's default, upstream's batching defaults and the measured best
   (started from its deployment set exactly; its batching file alone too when it needs
   thread flags) in ``--rounds`` interleaved rounds (``decide``); the measured best is
   recommended only when it beats upstream's defaults by more than the interval over
   the rounds, else upstream's defaults are.

Steps 1-3 run the model, so they run in one sandboxed worker (``serving_opt.sandbox``);
what comes back is the report, as data. ``outputs.write`` then writes the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable

from serving_opt import sandbox as sandbox_lib
from serving_opt.errors import UsageError
from serving_opt.savedmodel import loader, model_files
from serving_opt.serving import backends
from serving_opt.serving import runtime as runtime_lib
from serving_opt.tune import decide, grid, hardware, load, payloads, prove
from serving_opt.tune import profile as profile_lib
from serving_opt.tune.options import TuneOptions, check_options
from serving_opt.tune.prove import ProvenPoint
from serving_opt.tune.report import (
    AGAIN_LABEL,
    CURRENT_LABEL,
    DEFAULT_LABEL,
    GRID_LABEL,
    UPSTREAM_LABEL,
    Recommendation,
    TuneReport,
)
from serving_opt.tune.settings import (
    PARAMETERS_FILENAME,
    BatchingSettings,
    ServingSettings,
    ThreadSettings,
    cores,
    tf_serving_default,
    upstream_batching,
)

MAX_AUTO_BOUND = 512
CONTAINER_PARAMETERS = f"/config/{PARAMETERS_FILENAME}"


def tune(model_base: str, options: TuneOptions | None = None,
         progress: Callable[[str], None] | None = None,
         output_dir: str | None = None) -> TuneReport:
    """Tunes TF Serving's batching and threads for the model in ``model_base``.

    Raises UsageError/ServingOptError before any work for bad options or a model that
    cannot run; otherwise returns the report (``report.ok`` False when no setting met
    the objective). With ``output_dir``, also writes the deployment files there
    (``report.outputs`` names them).
    """
    say = progress or (lambda m: None)
    options = options or TuneOptions()
    check_options(options)
    model_base = os.path.abspath(model_base)
    from serving_opt.serving import validate

    version = validate.resolve_version(model_base, options.model.version)
    model_dir = validate.version_dir(model_base, version)
    model_files.check_model_files(model_dir)
    tags = loader.parse_tags(options.model.saved_model_tags)
    if not tags:
        raise UsageError("--saved_model_tags is empty", "e.g. --saved_model_tags=serve")
    meta_graph = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    signatures = loader.serving_signatures(meta_graph)
    if options.model.signature_name not in signatures:
        raise UsageError(f"--signature_name={options.model.signature_name} is not a signature of "
                         f"{model_dir} (it has {', '.join(sorted(signatures)) or 'none'})",
                         "pass one of those")
    if not options.trust.allow_file_ops:
        from serving_opt.savedmodel import untrusted

        untrusted.refuse_host_ops(meta_graph, sorted(signatures), "serve")
    examples = os.path.abspath(options.model.examples) if options.model.examples else None
    if examples:
        from serving_opt.savedmodel import examples as examples_lib

        examples_lib.read_examples_file(examples)
    current = read_current_parameters(options.serving.current_parameters_file)
    if output_dir is not None:
        from serving_opt.tune import outputs

        outputs.prepare(output_dir)
    sandboxed = sandbox_lib.require(options.trust.allow_unsandboxed, f"tune {model_dir}")
    if sandboxed and options.trust.allow_unsandboxed and options.serving.server == "docker":
        sandboxed = False  # the Docker client cannot run in a sandbox; the user trusts it
    options = dataclasses.replace(
        options, model=dataclasses.replace(options.model, examples=examples),
        serving=dataclasses.replace(options.serving, image=options.serving.docker_image()))
    backend = backends.resolve_backend(options.serving.server, sandboxed=sandboxed,
                                       image=options.serving.image,
                                       docker_network=options.serving.docker_network)
    # Resolved (installed, when asked) here: no sandbox has the network.
    runtime, runtime_note = local_runtime(options, say) if backend == "local" else (None, "")
    started = time.monotonic()
    if sandboxed:
        binaries = _binary_dirs(backend)
        read_only = [model_base, *([examples] if examples else []), *binaries,
                     *sandbox_lib.interpreter_dirs(runtime.python if runtime else None)]
        report = sandbox_lib.call(
            "serving_opt.tune.tuner:execute", model_base, version, options, backend, current,
            policy=sandbox_lib.Policy(read_only=tuple(read_only),
                                      timeout_seconds=options.trust.sandbox_timeout_seconds),
            progress=say,
            # The worker imports TensorFlow as it starts and forks a process per thread
            # setting to profile: the server's environment must be its own from the start.
            env={**sandbox_lib.search_path(*binaries), **backends.runtime_env(backend)},
            runtime=runtime)
    else:
        report = execute(model_base, version, options, backend, current, say, runtime)
    report = dataclasses.replace(report, sandbox=sandbox_lib.describe(sandboxed),
                                 seconds=round(time.monotonic() - started, 1),
                                 notes=(*report.notes, *([runtime_note] if runtime_note
                                                         else ())))
    if output_dir is not None:
        from serving_opt.tune import outputs

        report = dataclasses.replace(report, outputs=outputs.write(report, output_dir))
    return report


def local_runtime(options: TuneOptions, say: Callable[[str], None] = lambda m: None,
                  ) -> tuple[runtime_lib.Runtime | None, str]:
    """The TensorFlow runtime the local stand-in (and the profile) run under, as validate
    chooses it, and a note when it is not the target's (None: this interpreter).

    ``--serving_version`` is resolved (installed once when missing; call it outside the
    sandbox, which has no network); without it, the default target's runtime is used
    only when it is already here.
    """
    return runtime_lib.stand_in_runtime(options.serving.serving_version,
                                        options.serving.serving_runtime_python,
                                        options.serving.image, say)


def read_current_parameters(path: str | None) -> BatchingSettings | None:
    """``--current_parameters_file`` as BatchingSettings; UsageError naming the problem."""
    if not path:
        return None
    from serving_opt.model_server.batching import read_batching_parameters
    from serving_opt.model_server.status import ServingStatusError

    if not os.path.isfile(path):
        raise UsageError(f"--current_parameters_file={path} does not exist", "check the path")
    try:
        values = read_batching_parameters(path)
    except ServingStatusError as e:
        raise UsageError(f"--current_parameters_file={path}: {e.message}",
                         "fix the file (TF Serving would refuse it too)") from None
    settings = BatchingSettings(
        max_batch_size=values.get("max_batch_size", BatchingSettings.max_batch_size),
        batch_timeout_micros=values.get("batch_timeout_micros", 0),
        max_enqueued_batches=values.get("max_enqueued_batches", 10),
        num_batch_threads=values.get("num_batch_threads", 0),
        allowed_batch_sizes=tuple(values.get("allowed_batch_sizes", ())),
        pad_variable_length_inputs=bool(values.get("pad_variable_length_inputs", False)))
    return settings


def _binary_dirs(backend: str) -> list[str]:
    if backend != "binary":
        return []
    import shutil

    binary = shutil.which(backends.BINARY_NAME)
    if binary is None:
        return []
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(binary)),
                               os.path.dirname(os.path.realpath(binary))]))


# --------------------------------------------------------------- in the worker


def plan(options: TuneOptions, cpus: int) -> profile_lib.ProfilePlan:
    """What the profile measures for ``options``: one request's rows times 1, 2, 4, ...
    and the clients' rows and half of them, up to the bound; TensorFlow's default threads
    and ``--tensorflow_*_op_parallelism``'s."""
    r = options.workload.rows_per_request
    n = options.workload.clients
    if options.search.max_batch_size_bound:
        bound = options.search.max_batch_size_bound
    else:
        want = 2 * n * r if n else 0
        if options.workload.rate:
            # What arrives in half the SLO could share a batch.
            want = max(want, int(options.workload.rate * options.workload.slo_p99_ms / 2000.0) * r)
        bound = min(MAX_AUTO_BOUND * r, max(32, want, r))
    sizes = {r * 2 ** j for j in range(0, 21) if r * 2 ** j <= bound}
    if n:
        sizes |= {x for x in (n * r, max(1, n // 2) * r) if x <= bound}
    sizes.add(bound)
    search = options.search
    intra = search.intra_op if search.intra_op is not None else ((0, 1) if cpus > 1 else (0,))
    inter = search.inter_op if search.inter_op is not None else (0,)
    threads = tuple(dict.fromkeys(ThreadSettings(a, b) for a in intra for b in inter))
    if DEFAULT_THREADS not in threads:
        # TF Serving's default and upstream's batching defaults run with TensorFlow's own
        # threads: the report's curves show them beside the rest.
        threads = (DEFAULT_THREADS, *threads)
    return profile_lib.ProfilePlan(
        batch_sizes=tuple(sorted(sizes)), thread_settings=threads,
        seconds=options.budget.profile_seconds, max_latency_s=options.workload.slo_p99_ms / 1000.0,
        tags=tuple(sorted(loader.parse_tags(options.model.saved_model_tags))),
        examples=options.model.examples, seed=options.budget.seed)


@dataclasses.dataclass
class _Run:
    """What the steps of one run share (in the worker)."""

    model_base: str
    version: int
    options: TuneOptions
    backend: str
    say: Callable[[str], None]
    name: str
    spec: backends.ServerSpec
    protocols: tuple[str, ...]
    payloads: tuple
    generator: load.Generator
    runtime: runtime_lib.Runtime | None = None  # the local stand-in's TensorFlow

    def launch(self, settings: ServingSettings,
               deployed: prove.Deployed | None = None) -> backends.ServerProcess:
        """Starts (does not wait for) a server with ``settings``, under the run's runtime."""
        return prove.launch(self.backend, self.spec, settings, self.runtime, self.say,
                            deployed)

    def load_for(self, workload: str) -> load.Load:
        o, b = self.options.workload, self.options.budget
        if workload == "closed":
            return load.Load("closed", clients=o.clients, duration=b.duration,
                             warmup=b.warmup, timeout=b.request_timeout, seed=b.seed)
        return load.Load("open", rate=o.rate, duration=b.duration, warmup=b.warmup,
                         timeout=b.request_timeout, seed=b.seed)

    def measure(self, target: load.Target, what: load.Load, label: str) -> load.LoadResult:
        result = self.generator.run(target, what,
                                    timeout=what.warmup + what.duration + what.timeout + 120)
        prove.check_answers(result, label)
        return result

    @contextlib.contextmanager
    def serve(self, settings: ServingSettings, started=None,
              deployed: prove.Deployed | None = None):
        """A server with ``settings`` (``deployed``: exactly that deployment set),
        AVAILABLE and warm: its first requests (Grappler on the first run, each new
        shape's kernels) answered before anything counts."""
        with prove.running(self.backend, self.spec, settings, self.runtime,
                           self.options.serving.load_deadline, self.say, started,
                           deployed) as server:
            for target in self.targets(server).values():
                self.generator.run(target, load.Load(
                    "closed", clients=max(1, min(self.options.workload.clients or 4, 4)),
                    duration=max(0.5, self.options.budget.warmup), warmup=0.0,
                    timeout=max(self.options.budget.request_timeout, 120.0)))
            yield server

    def targets(self, server) -> dict[str, load.Target]:
        return payloads.targets(server.address, server.rest_address, self.name, self.version,
                                self.payloads, self.options.workload.rows_per_request)


DEFAULT_THREADS = ThreadSettings()
ALONE_LABEL = "measured best's batching file alone (default threads)"


def execute(model_base: str, version: int, options: TuneOptions, backend: str,
            current: BatchingSettings | None = None,
            progress: Callable[[str], None] | None = None,
            runtime: runtime_lib.Runtime | None = None) -> TuneReport:
    """Steps 1-3 (see the module doc), where the model may run (the sandbox); ``runtime``:
    the TensorFlow the local stand-in and the profile run under (None: this one)."""
    say = progress or sandbox_lib.say
    from serving_opt.serving import validate

    model_dir = validate.version_dir(model_base, version)
    name = options.model.model_name or os.path.basename(model_base.rstrip("/")) or "model"
    cpus = cores()
    protocols = tuple(p for p in ("grpc", "rest") if p in options.serving.protocols)
    workload = options.workload
    objective = grid.Objective(workload.slo_p99_ms, workload.clients, workload.rate,
                               workload.rows_per_request, options.search.max_reject_fraction,
                               options.search.padding, options.budget.seed)
    the_plan = dataclasses.replace(plan(options, cpus),
                                   env=tuple(sorted(backends.runtime_env(backend).items())))
    say(f"1/3 measuring {model_dir} as TF Serving runs it: batch sizes "
        f"{', '.join(map(str, the_plan.batch_sizes))}, threads "
        f"{'; '.join(t.describe() for t in the_plan.thread_settings)} "
        f"({options.budget.profile_seconds:g} s per point, a fresh process per thread setting)")
    # Profiled under the server's TensorFlow: the curves are that server's.
    model_profile = profile_lib.profile(model_dir, options.model.signature_name, the_plan, say,
                                        runtime=runtime)
    candidates, grid_notes = grid.candidates(model_profile, objective, cpus)
    for note in grid_notes:
        say(f"  {note}")
    built = payloads.build(model_dir, name, version, options.model.signature_name,
                           options.workload.rows_per_request, the_plan.tags, options.model.examples,
                           options.budget.seed)
    spec = backends.ServerSpec(model_name=name, model_base=model_base, image=options.serving.image,
                               docker_network=options.serving.docker_network,
                               saved_model_tags=options.model.saved_model_tags,
                               rest_api="rest" in protocols, version=version,
                               allow_file_ops=options.trust.allow_file_ops)
    with load.Generator() as generator:  # one process for every load point
        run = _Run(model_base, version, options, backend, say, name, spec, protocols, built,
                   generator, runtime)
        points, server = prove_all(run, candidates, objective, current)
        measured_best = recommend(points, objective, protocols[0], name)
        decision = decide_rounds(run, measured_best, points, objective, cpus)
    recommendation = final_recommendation(measured_best, decision, points, objective, name)
    ceiling_batch, ceiling, ceiling_how, ceiling_threads = _ceiling(model_profile)
    report = TuneReport(
        model_base=model_base, model_dir=model_dir, model_name=name, version=version,
        signature=options.model.signature_name, objective=objective, backend=backend,
        backend_note=backends.BACKEND_NOTES[backend], server=server[0],
        tensorflow_version=server[1], cores=cpus, profile=model_profile,
        grid=tuple(grid_notes), proven=tuple(points), recommendation=recommendation,
        decision=decision, ceiling_rows_per_second=ceiling, ceiling_batch_size=ceiling_batch,
        ceiling_how=ceiling_how, ceiling_threads=ceiling_threads,
        # Measured here, in the environment the server ran TensorFlow with.
        hardware=hardware.here(model_profile.kernels, model_profile.env))
    from serving_opt.tune import findings

    return dataclasses.replace(report, findings=findings.findings(report),
                               notes=findings.notes(report))


def prove_all(run, candidates: list[ServingSettings], objective: grid.Objective,
              current: BatchingSettings | None = None,
              ) -> tuple[list[ProvenPoint], tuple[str, str]]:
    """Step 2: TF Serving's default, upstream's batching defaults and the user's current
    file on every protocol, each grid setting on the primary one, every workload; then
    (``--recheck``) upstream's defaults again. The points, and what answered."""
    o = run.options
    primary = run.protocols[0]
    to_prove: list[tuple[str, ServingSettings, tuple[str, ...]]] = [
        (DEFAULT_LABEL, tf_serving_default(DEFAULT_THREADS), run.protocols),
        (UPSTREAM_LABEL, upstream_batching(DEFAULT_THREADS), run.protocols)]
    to_prove += [(f"{GRID_LABEL} #{i + 1}", settings, (primary,))
                 for i, settings in enumerate(candidates)]
    if current is not None:
        to_prove.append((CURRENT_LABEL, ServingSettings(current, DEFAULT_THREADS),
                         run.protocols))
    if o.budget.recheck:
        # Upstream's defaults once more, last: how far the machine itself moved while
        # everything above was measured (a difference below that is noise).
        to_prove.append((AGAIN_LABEL, upstream_batching(DEFAULT_THREADS), (primary,)))
    run.say(f"2/3 proving {len(to_prove)} settings on the server, {o.budget.duration:g} s per load "
            "point")
    points: list[ProvenPoint] = []
    answered = ("", "")
    for label, settings, protocols in to_prove:
        with run.serve(settings) as server:
            targets = run.targets(server)
            for workload in objective.workloads():
                for protocol in protocols:
                    m = run.measure(targets[protocol], run.load_for(workload), label)
                    points.append(ProvenPoint(label, settings, workload, protocol, m))
                    run.say(f"  {label} ({settings.describe()}) {workload}/{protocol}: "
                            f"{_measured(m)}")
            answered = (server.description, server.tf_version)
    return points, answered


def decide_rounds(run, best: Recommendation | None, points: list[ProvenPoint],
                  objective: grid.Objective, cpus: int) -> decide.Decision | None:
    """Step 3: TF Serving's default and upstream's batching defaults against the
    measured best, started from its deployment set exactly (the batching file's text
    and the flags tune writes), and its batching file alone when the best needs thread
    flags; all servers up at once and measured in ``--rounds`` interleaved rounds on the
    primary workload and protocol. None when the best is upstream's defaults or nothing
    met the SLO."""
    o = run.options
    upstream = upstream_batching(DEFAULT_THREADS)
    if best is None or best.settings == upstream or o.budget.rounds < 1:
        return None
    winner = next((p.label for p in points if p.settings == best.settings
                   and p.label != AGAIN_LABEL), GRID_LABEL)
    as_written = prove.Deployed(best.parameters_text, best.flags)
    contenders = [(DEFAULT_LABEL, tf_serving_default(DEFAULT_THREADS), None),
                  (UPSTREAM_LABEL, upstream, None), (winner, best.settings, as_written)]
    if winner == DEFAULT_LABEL:
        contenders = contenders[1:]
    alone = None
    if (best.settings.batching is not None and best.settings.threads != DEFAULT_THREADS
            and best.settings.batching != BatchingSettings()):  # else alone is upstream's
        # The batching file as written, without the thread flags next to it.
        alone = ALONE_LABEL
        contenders.append((alone, ServingSettings(best.settings.batching, DEFAULT_THREADS),
                           prove.Deployed(best.parameters_text, tuple(
                               f for f in best.flags
                               if not f.startswith("--tensorflow_")))))
    workload = objective.workloads()[0]
    protocol = run.protocols[0]
    run.say(f"3/3 deciding: {', '.join(label for label, _, _ in contenders)} in {o.budget.rounds} "
            f"interleaved rounds of {o.budget.duration:g} s ({workload}/{protocol})")
    rows: dict[str, list[float]] = {label: [] for label, _, _ in contenders}
    p99: dict[str, list[float]] = {label: [] for label, _, _ in contenders}
    share = 0.0
    with contextlib.ExitStack() as stack:
        # Every server starts (imports, loads) at once; then each is awaited and warmed.
        started = []
        for _, settings, deployed in contenders:
            server = run.launch(settings, deployed)
            stack.callback(server.stop)  # stopping twice is harmless
            started.append(server)
        targets = {label: run.targets(stack.enter_context(
                       run.serve(settings, server, deployed)))[protocol]
                   for (label, settings, deployed), server in zip(contenders, started)}
        for i in range(o.budget.rounds):
            for label in decide.order(i, list(targets)):
                m = run.measure(targets[label], run.load_for(workload), label)
                rows[label].append(m.rows_per_second)
                p99[label].append(m.p99_ms)
                # The generator's own processor time, as a share of the machine's cores.
                share = max(share, m.client_cpu_per_request * m.requests_per_second
                            / max(1, cpus))
                run.say(f"  round {i + 1} {label}: {_measured(m)}")
    made = decide.Decision(workload, protocol, UPSTREAM_LABEL, winner, alone,
                           {k: tuple(v) for k, v in rows.items()},
                           {k: tuple(v) for k, v in p99.items()}, round(share, 4))
    run.say(f"  {winner} against {UPSTREAM_LABEL}: {made.vs_upstream.describe()}")
    return made


def final_recommendation(best: Recommendation | None, decision: decide.Decision | None,
                         points: list[ProvenPoint], objective: grid.Objective,
                         model_name: str) -> Recommendation | None:
    """The measured best when it beat upstream's defaults by more than the noise (the
    decision's interval above 1), else upstream's defaults when they met the SLO."""
    if best is not None and best.settings.batching == BatchingSettings():
        # Upstream's defaults measured best: their file leaves num_batch_threads to the
        # server (a thread per core of whatever machine serves), not this machine's count.
        best = dataclasses.replace(best, parameters_text=upstream_parameters_text())
    if best is None or decision is None:
        return best
    interval = decision.vs_upstream.describe()
    if decision.tuned_wins:
        return dataclasses.replace(best, basis=f"{best.basis}; {interval} upstream's "
                                   "batching defaults")
    upstream_ok = all(_meets(p, objective) for p in points
                      if p.label == UPSTREAM_LABEL and p.protocol == decision.protocol)
    if not upstream_ok or not any(p.label == UPSTREAM_LABEL for p in points):
        return dataclasses.replace(best, basis=f"{best.basis}; {interval} upstream's batching "
                                   "defaults, which missed the p99 SLO")
    settings = upstream_batching(DEFAULT_THREADS)
    return Recommendation(
        settings, upstream_parameters_text(),
        settings.flags(f"/models/{model_name}", model_name, CONTAINER_PARAMETERS),
        "upstream's batching defaults: tuning found nothing better on this hardware (the "
        f"measured best, {decision.tuned_label}, was {interval} upstream's defaults: not "
        "above the noise)")


def upstream_parameters_text() -> str:
    """Upstream's defaults as a parameters file: the same as ``--enable_batching`` with no
    file, num_batch_threads left to the server (one per core of the machine it runs on).
    """
    text = BatchingSettings().text_proto()
    lines = [line for line in text.splitlines() if not line.startswith("num_batch_threads")]
    return "\n".join(["# upstream's batching defaults: the same as --enable_batching without "
                      "a file (num_batch_threads: the server's, one per core)", *lines]) + "\n"


def _measured(m: load.LoadResult) -> str:
    text = f"{m.rows_per_second:,.0f} rows/s, p99 {m.p99_ms:.1f} ms"
    if m.errors:
        text += f", errors {m.errors}"
    return text


def _ceiling(model_profile) -> tuple[int, float, str, ThreadSettings | None]:
    """The most rows/s one session run alone did: (batch size, rows/s, how, threads)."""
    best: tuple[int, float, str, ThreadSettings | None] = (1, 0.0, "", None)
    for curve in model_profile.curves:
        for n in curve.batch_sizes:
            rows = curve.rows_per_second(n)
            if rows > best[1]:
                best = (n, rows, f"batch {n}, threads {curve.threads.describe()}",
                        curve.threads)
    return best


def recommend(points: list[ProvenPoint], objective: grid.Objective, protocol: str,
              model_name: str) -> Recommendation | None:
    """The proven setting that measured best within the SLO on every workload (ranked on
    the primary workload and protocol); None when none did."""
    workload = objective.workloads()[0]
    meets: dict[str, ProvenPoint] = {}
    labels = []
    for point in points:
        if point.protocol != protocol or point.label == AGAIN_LABEL:
            continue
        if point.label not in labels:
            labels.append(point.label)
        ok = all(_meets(p, objective) for p in points
                 if p.label == point.label and p.protocol == protocol)
        if ok and point.workload == workload:
            meets[point.label] = point
    if not meets:
        return None

    def key(point: ProvenPoint) -> tuple:
        m = point.measured
        if workload == "closed":
            return (-m.rows_per_second, m.p99_ms)
        return (m.p99_ms, -m.rows_per_second)

    winner = min(meets.values(), key=key)
    basis = f"measured best of {len(labels)} proven settings within the p99 SLO"
    settings = winner.settings
    parameters = settings.batching.text_proto() if settings.batching is not None else ""
    flags = settings.flags(f"/models/{model_name}", model_name,
                           CONTAINER_PARAMETERS if settings.batching is not None else None)
    return Recommendation(settings, parameters, flags, basis)


def _meets(point: ProvenPoint, objective: grid.Objective) -> bool:
    m = point.measured
    if m.requests == 0 or m.ok == 0:
        return False
    if m.rejected / m.requests > objective.max_reject_fraction:
        return False
    if m.ok < m.requests * (1 - objective.max_reject_fraction) - 0.5:
        return False  # other errors (deadline, internal) are failures too
    return math.isfinite(m.p99_ms) and m.p99_ms <= objective.slo_p99_ms
