"""Probe requests: what validation sends to the server, and the answer each must get.

TFX's InfraValidator builds its requests in ``request_builder``; this is the same
job with one difference: every request carries a check against the answer the
reference model gives in-process, not just "the call did not fail".

For every served signature there is a Predict probe; classify/regress signatures
that take serialized tf.Examples also get a Classify/Regress probe on the same
records; a model with both kinds gets one MultiInference probe for a classify and
a regress signature together. Inputs come from ``--examples`` where they fit and
are synthesized otherwise (``savedmodel.inputs.signature_feeds``, as for parity).

Nothing here talks to a server: the clients (``client``, ``rest_client``) send the
probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving_opt.core import gates
from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel import examples as examples_lib
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader, parse_spec
from serving_opt.serving.api import ServingApi, serving_api


@dataclass(frozen=True)
class Probe:
    """One request to send, and how to check its answer."""

    name: str
    method: str  # "Predict" | "Classify" | "Regress" | "MultiInference"
    request: object
    check: Callable[[object], str]  # returns "" when the answer is right


@dataclass(frozen=True)
class _Served:
    """What every probe of one build shares: the API, whom it addresses, how strictly
    its answer is compared."""

    api: ServingApi
    model_name: str
    version: int
    atol: float
    rtol: float

    def address(self, model_spec, key: str) -> None:
        model_spec.name = self.model_name
        model_spec.signature_name = key
        model_spec.version.value = self.version


def _tensor_proto(value: np.ndarray):
    import tensorflow as tf

    return tf.make_tensor_proto(value)


def _compare(expected, actual, atol: float, rtol: float) -> str:
    """"" when the arrays match within the parity gate's tolerances, else what differs."""
    mismatches, max_abs, _, detail = gates.compare_arrays(
        np.asarray(expected), np.asarray(actual), atol, rtol)
    if mismatches:
        return (f"{mismatches} of {np.asarray(expected).size} elements differ"
                + (f" (max abs diff {max_abs:.3g})" if max_abs else "")
                + (f", {detail}" if detail else ""))
    return ""


@dataclass(frozen=True)
class ProbeInputs:
    """What the probes feed: the user's ``--examples`` file where it fits (None: all
    synthesized), ``batch_size`` rows per request, and the synthesis ``seed``.
    """

    examples: str | None = None
    batch_size: int = 8
    seed: int = 0


def build_probes(model_dir: str, reference_dir: str, model_name: str, version: int,
                 tags: frozenset[str], *, inputs: ProbeInputs = ProbeInputs(),
                 atol: float = gates.DEFAULT_ATOL,
                 rtol: float = gates.DEFAULT_RTOL) -> tuple[list[Probe], dict]:
    """Requests for every signature with expected answers from the reference model.

    Returns ``(probes, served_signature_map)``. Reads the served model too, so a
    model that cannot be read fails here, before any server starts.
    """
    import tensorflow as tf

    api = serving_api()
    served_as = _Served(api, model_name, version, atol, rtol)
    user = examples_lib.read_examples_file(inputs.examples) if inputs.examples else None
    served_mg = loader.find_meta_graph(loader.read_saved_model(model_dir), tags, model_dir)
    sess, ref_mg = loader.load_session(reference_dir, tags)
    probes: list[Probe] = []
    try:
        feeds = inputs_lib.signature_feeds(ref_mg, reference_dir, user=user, seed=inputs.seed)
        keys = sorted(loader.serving_signatures(served_mg))
        example_batches: dict[str, list[bytes]] = {}
        for key in keys:
            ref_sig = ref_mg.signature_def.get(key)
            if ref_sig is None:
                raise ServingOptError(
                    f"signature {key} is served but missing from the reference {reference_dir}",
                    "pass the matching --reference_dir",
                )
            signature_inputs = feeds(key, inputs.batch_size)
            feed = signature_inputs.batches[0]
            try:
                expected = loader.run_signature(sess, ref_sig, feed)
            except tf.errors.OpError as e:  # the model's own failure, not the tool's
                raise ServingOptError(
                    f"the reference model {reference_dir} fails on {signature_inputs.source} "
                    f"inputs for signature {key}: {first_line(e)}",
                    "give --examples it answers; if it fails on every input, so will TF "
                    "Serving: fix or re-export the model") from e

            request = api.predict_pb2.PredictRequest()
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
                    diff = _compare(value, got, atol, rtol)
                    if diff:
                        problems.append(f"{alias}: {diff}")
                if response.model_spec.signature_name != key:
                    problems.append(f"reply names signature {response.model_spec.signature_name!r}")
                return "; ".join(problems)

            probes.append(Probe(f"Predict {key}", "Predict", request, check_predict))

            method = ref_sig.method_name
            example_input = parse_spec.example_input_alias(ref_mg.graph_def, ref_sig)
            if method in (loader.METHOD_CLASSIFY, loader.METHOD_REGRESS) and example_input:
                alias = example_input[0]
                records = [bytes(r) for r in feed[alias]]
                example_batches[key] = records
                probes.append(_example_probe(served_as, key, method, records, expected))
        classify = [k for k in example_batches
                    if ref_mg.signature_def[k].method_name == loader.METHOD_CLASSIFY]
        regress = [k for k in example_batches
                   if ref_mg.signature_def[k].method_name == loader.METHOD_REGRESS]
        if classify and regress:
            # One task of each kind on the classify signature's records: MultiInference
            # requires all tasks to share one input.
            probes.append(_multi_inference_probe(
                served_as, sess, ref_mg, (classify[0], regress[0]),
                example_batches[classify[0]]))
    finally:
        sess.close()
    served = {k: v for k, v in served_mg.signature_def.items()}
    return probes, served


def _classification_check(expected: dict, atol: float, rtol: float):
    def check(result) -> str:
        classifications = result.classifications
        n = len(next(iter(expected.values())))
        if len(classifications) != n:
            return f"{len(classifications)} classifications for {n} examples"
        problems = []
        if "scores" in expected:
            got = np.array([[c.score for c in row.classes] for row in classifications],
                           dtype=np.float32)
            diff = _compare(expected["scores"], got, atol, rtol)
            if diff:
                problems.append(f"scores: {diff}")
        if "classes" in expected:
            got = np.array([[c.label.encode() if isinstance(c.label, str) else c.label
                             for c in row.classes] for row in classifications], dtype=object)
            if got.shape != expected["classes"].shape or not (got == expected["classes"]).all():
                problems.append("class labels differ")
        return "; ".join(problems)
    return check


def _regression_check(expected: dict, atol: float, rtol: float):
    def check(result) -> str:
        values = np.array([r.value for r in result.regressions], dtype=np.float32)
        want = np.asarray(expected["outputs"], dtype=np.float32).reshape(-1)
        diff = _compare(want, values, atol, rtol)
        return f"outputs: {diff}" if diff else ""
    return check


def _example_probe(served: _Served, key: str, method: str, records: list[bytes],
                   expected: dict) -> Probe:
    api, atol, rtol = served.api, served.atol, served.rtol
    if method == loader.METHOD_CLASSIFY:
        request = api.classification_pb2.ClassificationRequest()
        check = _classification_check(expected, atol, rtol)
        name = "Classify"
    else:
        request = api.regression_pb2.RegressionRequest()
        check = _regression_check(expected, atol, rtol)
        name = "Regress"
    served.address(request.model_spec, key)
    for record in records:
        request.input.example_list.examples.add().ParseFromString(record)
    return Probe(f"{name} {key}", name, request, lambda response: check(response.result))


def _multi_inference_probe(served: _Served, sess, ref_mg, keys: tuple[str, str],
                           records: list[bytes]) -> Probe:
    """One classify and one regress task (``keys``) on the same records."""
    atol, rtol = served.atol, served.rtol
    classify_key, regress_key = keys
    request = served.api.inference_pb2.MultiInferenceRequest()
    checks = []
    for key in keys:
        task = request.tasks.add()
        served.address(task.model_spec, key)
        sig = ref_mg.signature_def[key]
        task.method_name = sig.method_name
        alias = next(iter(sig.inputs))
        expected = loader.run_signature(sess, sig, {alias: np.array(records, dtype=object)})
        checks.append(_classification_check(expected, atol, rtol)
                      if sig.method_name == loader.METHOD_CLASSIFY
                      else _regression_check(expected, atol, rtol))
    for record in records:
        request.input.example_list.examples.add().ParseFromString(record)

    def check(response) -> str:
        if len(response.results) != 2:
            return f"{len(response.results)} results for 2 tasks"
        problems = [c(getattr(r, r.WhichOneof("result") or "classification_result"))
                    for c, r in zip(checks, response.results)]
        return "; ".join(p for p in problems if p)

    return Probe(f"MultiInference {classify_key}+{regress_key}", "MultiInference", request,
                 check)
