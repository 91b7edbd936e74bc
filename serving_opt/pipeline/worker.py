"""optimize's sandboxed worker: the job it is sent, what it may touch, and what it runs.

This process never imports TensorFlow when it sandboxes the work: it resolves the target
runtime (:func:`resolve_target`, which may need the network no sandbox has), starts one
bubblewrap worker (:func:`policy`, :func:`env`), and sends it a :class:`WorkerJob`; the
worker reads the model (the static check first), builds, proves, measures and validates
the candidate (``optimizer.build_in_worker``) and returns its staging directory and report.

    worker = sandbox.Worker(policy(run), run.work_dir, run.say, preload="optimize",
                            env=env(run))
    staging, report = worker.call("serving_opt.pipeline.optimizer:build_in_worker", job(run))
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from serving_opt import sandbox as sandbox_lib
from serving_opt.pipeline import plan as plan_lib
from serving_opt.pipeline.plan import Plan
from serving_opt.pipeline.run import Run


@dataclass(frozen=True)
class WorkerJob:
    """What the sandboxed worker needs to build, prove and measure the candidate."""

    input_dir: str
    output_base: str
    plan: Plan
    steps: tuple[str, ...]
    stages: tuple
    warnings: tuple[str, ...]
    work_dir: str
    target_registry: object


def job(run: Run) -> WorkerJob:
    """The job, every path absolute: the worker runs elsewhere (cwd /tmp, in its sandbox)."""

    def absolute(path: str | None) -> str | None:
        return os.path.abspath(path) if path and "://" not in path else path

    plan = run.plan
    options = plan.options
    inputs = dataclasses.replace(options.inputs, examples=absolute(options.inputs.examples))
    gate = dataclasses.replace(options.gate,
                               compare_examples=absolute(options.gate.compare_examples))
    plan = dataclasses.replace(
        plan, options=dataclasses.replace(options, inputs=inputs, gate=gate),
        validate=dataclasses.replace(plan.validate, inputs=inputs) if plan.validate else None)
    return WorkerJob(os.path.abspath(run.input_dir), os.path.abspath(run.output_base), plan,
                     run.steps, tuple(run.stages), tuple(run.warnings), run.work_dir,
                     run.target_registry)


def policy(run: Run) -> sandbox_lib.Policy:
    """Read: the model, the user's example files, the target runtime; write: the work dir,
    up to :func:`sandbox.write_limit` of the input model's size (its candidates, each
    about the input's size or less, and their scratch)."""
    plan = run.plan
    read_only = [run.input_dir]
    if plan.inputs.examples:
        read_only.append(plan.inputs.examples)
    if plan.gate.compare_examples:
        read_only.extend(sandbox_lib.glob_files(plan.gate.compare_examples))
    if plan.validate is not None:
        from serving_opt.serving import validate as validate_lib

        read_only.extend(sandbox_lib.interpreter_dirs(
            plan.validate.target.serving_runtime_python))
        read_only.extend(validate_lib.binary_dirs(plan.validate))
    from serving_opt.savedmodel import loader

    return sandbox_lib.Policy(read_only=tuple(read_only), writable=(run.work_dir,),
                              memory_bytes=plan.trust.sandbox_memory_bytes,
                              write_bytes=sandbox_lib.write_limit(loader.dir_size(run.input_dir)),
                              timeout_seconds=timeout_seconds(plan))


def timeout_seconds(plan: Plan) -> float:
    """The worker's wall-clock limit: ``--sandbox_timeout_seconds``, else an hour for the
    build and proofs plus four times the measuring budget (each candidate measures within
    ``--measure_seconds``, a confirmation too) and the serving validation's load deadline.
    """
    if plan.trust.sandbox_timeout_seconds is not None:
        return float(plan.trust.sandbox_timeout_seconds)
    measure = plan.measure.measure_seconds or 0.0
    validate = plan.validate.serving.load_deadline if plan.validate is not None else 0.0
    return 3600.0 + 4 * float(measure) + float(validate or 0.0)


def env(run: Run) -> dict:
    """A tensorflow_model_server outside /usr on the worker's PATH (--server=binary)."""
    if run.plan.validate is None:
        return {}
    from serving_opt.serving import validate as validate_lib

    return sandbox_lib.search_path(*validate_lib.binary_dirs(run.plan.validate))


def resolve_target(run: Run, sandboxed: bool) -> None:
    """Before any sandbox starts: the target runtime (installed if asked, which needs the
    network) and its op registry; the validate backend (docker cannot be driven from a
    sandbox: its client needs the Docker socket, which is root on the host)."""
    from serving_opt.serving import runtime as runtime_lib

    version, python = run.plan.target.serving_version, run.plan.target.serving_runtime_python
    target = plan_lib.target_version(run.plan)
    runtime = runtime_lib.resolve_runtime(version, python, run.say) if version \
        else runtime_lib.find_runtime(target, python)
    if runtime is not None:
        run.target_registry = (runtime.tf_version, runtime.source,
                               runtime_lib.op_registry(runtime))
    validate = run.plan.validate
    if validate is None:
        return
    from serving_opt.serving import backends

    backend = backends.resolve_backend(validate.serving.server, sandboxed=sandboxed,
                                       image=validate.serving.image,
                                       docker_network=validate.serving.docker_network)
    if backend == "local" and runtime is not None and version is not None:
        validate = dataclasses.replace(validate, target=dataclasses.replace(
            validate.target, serving_runtime_python=runtime.python))
    run.plan = dataclasses.replace(run.plan, validate=dataclasses.replace(
        validate, serving=dataclasses.replace(validate.serving, server=backend)))
