"""The parity gate: the optimized model must answer like the original.

Both models are loaded in fresh sessions with the session loader (what TF Serving
uses), every kept signature runs on the same inputs, and every output is compared:
integers, booleans and strings exactly; floats element-wise within
``atol + rtol * |reference|`` (numpy.isclose semantics, NaN equal to NaN).

Errors are behaviour too. On synthesized inputs an error of the original is a usage
error (the inputs are wrong, not the model: pass ``--examples``). On the user's own
inputs (``--examples``) a batch the original rejects (an assertion, a bad shape) is
expected to be rejected by the candidate as well: answering it fails the gate, as
does raising where the original answers. Only "raises" is compared, not the message.
When the original rejects every batch of a signature, the inputs are wrong (a usage
error again): there would be no answer left to compare.

Defaults: ``atol=1e-5``, ``rtol=1e-4``. Lossless rewrites (batch-norm folding,
constant folding) move float32 results by about 1e-6 relative; a lossy
transform such as ``round_weights`` or ``quantize_weights`` fails by orders of
magnitude, so the defaults separate the two. Loosen them deliberately for lossy
transforms.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
# The lossy gate (--quantize). Top-1 agreement is the verdict: 99.5% of rows keep
# their class (flips happen on near ties). The probability bound is a guard against a
# broken table (errors of 0.3 and more): measured here, int8 moves the worst of 10240
# probabilities of a confident 20-class text classifier by 0.03 (its mean by 1e-3),
# fp16 by 0.002.
DEFAULT_MIN_TOP1_AGREEMENT = 0.995
DEFAULT_MAX_PROBABILITY_ERROR = 0.05
# Outputs a classifier's answer is read from: gated on top-1 agreement and max error.
PROBABILITY_OUTPUTS = frozenset({"probabilities", "scores", "probs", "predictions"})


@dataclass(frozen=True)
class LossyGate:
    """What "same answers" means for lossy work (quantized weights).

    Probabilities/scores outputs: the row's top-1 class must agree in at least
    ``min_top1_agreement`` of the rows, and no value may move more than
    ``max_probability_error``. Integer and string outputs (class ids, class names):
    at least ``min_top1_agreement`` of the elements equal. Other float outputs
    (logits, embeddings) are reported, not gated.
    """

    min_top1_agreement: float = DEFAULT_MIN_TOP1_AGREEMENT
    max_probability_error: float = DEFAULT_MAX_PROBABILITY_ERROR


@dataclass(frozen=True)
class OutputParity:
    """How one output of one signature compares, over all batches."""

    signature: str
    output: str
    dtype: str
    shape: tuple[int, ...]
    elements: int
    mismatches: int
    max_abs_diff: float
    max_rel_diff: float
    ok: bool
    detail: str = ""
    # Lossy gate only: fraction of rows whose top-1 class (or elements, for ints and
    # strings) agree with the original.
    agreement: float | None = None


@dataclass(frozen=True)
class ParityReport:
    """The gate's verdict, with per-output numbers and where the inputs came from.

    Example:
        >>> report.ok
        True
    """

    ok: bool
    atol: float
    rtol: float
    outputs: tuple[OutputParity, ...]
    input_sources: dict
    batches_run: int

    def failures(self) -> list[OutputParity]:
        return [o for o in self.outputs if not o.ok]

    def summary(self) -> str:
        """One line naming the worst failure, or the number of outputs checked.

        Example:
            >>> report.summary()
            'parity ok: 7 outputs of 3 signatures match (max abs diff 4.8e-07)'
        """
        if self.ok:
            worst = max((o.max_abs_diff for o in self.outputs), default=0.0)
            sigs = len({o.signature for o in self.outputs})
            return (f"parity ok: {len(self.outputs)} outputs of {sigs} signatures match "
                    f"(max abs diff {worst:.2g})")
        parts = []
        for o in self.failures()[:3]:
            parts.append(
                f"{o.signature}/{o.output}: {o.mismatches} of {o.elements} elements differ"
                + (f", max abs diff {o.max_abs_diff:.3g}, max rel diff {o.max_rel_diff:.3g}"
                   if o.max_abs_diff else "")
                + (f" ({o.detail})" if o.detail else "")
            )
        return "parity failed: " + "; ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def _rejects_inputs(source: str, key: str, error: str) -> ServingOptError:
    return ServingOptError(
        f"the original model fails on {source} inputs for signature {key}: {error}",
        "pass real inputs with --examples (TFRecord of tf.Example or JSON lines)",
    )


@dataclass(frozen=True)
class Rejected:
    """The original raised on this (user-provided) batch: the candidate must raise too."""

    error: str


def run_signature(session, signature_def, feed_by_alias: dict,
                  output_aliases: Sequence[str] | None = None) -> dict:
    """Runs one signature in a session: feeds and fetches keyed by alias.

    Example:
        >>> run_signature(sess, sig, {"images": batch})["scores"].shape
        (16, 4)
    """
    feeds = {signature_def.inputs[a].name: v for a, v in feed_by_alias.items()}
    aliases = list(output_aliases or sorted(signature_def.outputs))
    fetches = [signature_def.outputs[a].name for a in aliases]
    values = session.run(fetches, feeds)
    return dict(zip(aliases, values))


def compare_arrays(reference, candidate, atol: float, rtol: float):
    """(mismatches, max_abs_diff, max_rel_diff, detail) for two arrays.

    Example:
        >>> compare_arrays(np.array([1.0, 2.0]), np.array([1.0, 2.5]), 1e-5, 1e-4)[:2]
        (1, 0.5)
    """
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    if reference.shape != candidate.shape:
        return reference.size or 1, 0.0, 0.0, f"shape {candidate.shape} != {reference.shape}"
    if reference.dtype != candidate.dtype:
        return reference.size or 1, 0.0, 0.0, f"dtype {candidate.dtype} != {reference.dtype}"
    if reference.dtype.kind in "fc":
        ref = reference.astype(np.float64)
        cand = candidate.astype(np.float64)
        close = np.isclose(cand, ref, atol=atol, rtol=rtol, equal_nan=True)
        finite = np.isfinite(ref) & np.isfinite(cand)
        diff = np.where(finite, np.abs(cand - ref), 0.0)
        rel = np.where(finite & (ref != 0), diff / np.maximum(np.abs(ref), 1e-30), 0.0)
        return (int((~close).sum()), float(diff.max(initial=0.0)),
                float(rel.max(initial=0.0)), "")
    equal = reference == candidate
    return int((~np.asarray(equal)).sum()), 0.0, 0.0, ""


def check_parity(
    reference_dir: str,
    candidate_dir: str,
    tags: frozenset[str],
    signature_keys: Sequence[str],
    *,
    user_inputs: inputs_lib.UserInputs | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    batch_size: int = 16,
    num_batches: int = 2,
    seed: int = 0,
    lossy: LossyGate | None = None,
) -> ParityReport:
    """Runs every signature of both models on the same inputs and compares the outputs.

    Example:
        >>> check_parity("build/sample/1", "build/optimized/1", frozenset({"serve"}),
        ...              ["serving_default"]).ok
        True
    """
    # One model in memory at a time: for a 1 GB model, two at once would double the
    # optimizer's peak. The original's answers are kept (they are small), then compared.
    ref_sess, ref_mg = loader.load_session(reference_dir, tags)
    try:
        feeds = inputs_lib.signature_feeds(ref_mg, reference_dir, user=user_inputs, seed=seed)
        runs: dict[str, list] = {}  # key -> [(feed, expected outputs)]
        sources = {}
        for key in signature_keys:
            ref_sig = ref_mg.signature_def[key]
            sig_inputs = feeds(key, batch_size, num_batches)
            sources[key] = sig_inputs.source
            runs[key] = []
            for feed in sig_inputs.batches:
                try:
                    runs[key].append((feed, run_signature(ref_sess, ref_sig, feed)))
                except Exception as e:  # the original itself rejects these inputs
                    if user_inputs is not None:
                        # The user's batch: a rejection is behaviour the candidate keeps.
                        runs[key].append((feed, Rejected(first_line(e))))
                        continue
                    raise _rejects_inputs(sig_inputs.source, key, first_line(e)) from e
            if runs[key] and all(isinstance(r, Rejected) for _, r in runs[key]):
                # Every batch rejected: the inputs are wrong, there is nothing to compare.
                raise _rejects_inputs(sig_inputs.source, key, runs[key][0][1].error)
        outputs = {key: sorted(ref_mg.signature_def[key].outputs) for key in signature_keys}
    finally:
        ref_sess.close()
        del ref_sess
        gc.collect()

    cand_sess, cand_mg = loader.load_session(candidate_dir, tags)
    results: list[OutputParity] = []
    batches_run = 0
    try:
        for key in signature_keys:
            cand_sig = cand_mg.signature_def.get(key)
            if cand_sig is None:
                results.append(OutputParity(key, "*", "", (), 0, 1, 0.0, 0.0, False,
                                            "signature missing from the optimized model"))
                continue
            per_output: dict[str, list] = {a: [] for a in outputs[key]}
            failure = ""
            rejected = 0
            for feed, expected in runs[key]:
                try:
                    actual = run_signature(cand_sess, cand_sig, feed)
                except Exception as e:
                    if isinstance(expected, Rejected):
                        rejected += 1
                        batches_run += 1
                        continue
                    failure = f"the optimized model fails where the original answers: " \
                              f"{first_line(e)}"
                    break
                if isinstance(expected, Rejected):
                    failure = "the optimized model answers an input the original rejects " \
                              f"({expected.error})"
                    break
                batches_run += 1
                for alias in per_output:
                    per_output[alias].append((expected[alias], actual.get(alias)))
            if failure:
                results.append(OutputParity(key, "*", "", (), 0, 1, 0.0, 0.0, False, failure))
                continue
            if rejected:
                results.append(OutputParity(key, "(errors)", "", (), rejected, 0, 0.0, 0.0,
                                            True, f"{rejected} input batches rejected by both"))
            for alias, pairs in per_output.items():
                if not pairs:
                    continue  # every batch was rejected, by both models
                results.append(_summarize(key, alias, pairs, atol, rtol) if lossy is None
                               else _summarize_lossy(key, alias, pairs, lossy))
    finally:
        cand_sess.close()
    return ParityReport(
        ok=all(r.ok for r in results),
        atol=atol,
        rtol=rtol,
        outputs=tuple(results),
        input_sources=sources,
        batches_run=batches_run,
    )


def _summarize(signature: str, alias: str, pairs: list, atol: float, rtol: float) -> OutputParity:
    mismatches = elements = 0
    max_abs = max_rel = 0.0
    details = []
    shape: tuple[int, ...] = ()
    dtype = ""
    for expected, actual in pairs:
        expected = np.asarray(expected)
        shape, dtype = expected.shape, expected.dtype.name
        elements += expected.size
        if actual is None:
            mismatches += expected.size or 1
            details.append("output missing")
            continue
        m, a, r, detail = compare_arrays(expected, actual, atol, rtol)
        mismatches += m
        max_abs, max_rel = max(max_abs, a), max(max_rel, r)
        if detail:
            details.append(detail)
    return OutputParity(
        signature=signature,
        output=alias,
        dtype=dtype,
        shape=tuple(int(d) for d in shape),
        elements=elements,
        mismatches=mismatches,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        ok=mismatches == 0,
        detail="; ".join(dict.fromkeys(details)),
    )


def _summarize_lossy(signature: str, alias: str, pairs: list, gate: LossyGate) -> OutputParity:
    """The lossy gate's verdict on one output (see LossyGate)."""
    exact = _summarize(signature, alias, pairs, 0.0, 0.0)
    if exact.detail and "differ" not in exact.detail:  # shape/dtype/missing: a real break
        return exact
    rows = agree = 0
    for expected, actual in pairs:
        expected, actual = np.asarray(expected), np.asarray(actual)
        if expected.dtype.kind in "fc":
            if expected.ndim < 2 or expected.shape[-1] < 2:
                continue  # not per-class rows
            e = expected.reshape(-1, expected.shape[-1])
            a = actual.reshape(-1, actual.shape[-1])
            rows += e.shape[0]
            agree += int((e.argmax(axis=1) == a.argmax(axis=1)).sum())
        else:
            rows += expected.size
            agree += int((expected == actual).sum())
    is_float = exact.dtype.startswith(("float", "complex", "bfloat"))
    # Float rows are scored for every output (logits too), gated for probabilities only.
    gated = rows > 0 and (not is_float or alias.lower() in PROBABILITY_OUTPUTS)
    agreement = agree / rows if rows else None
    ok, detail = True, ""
    if gated and agreement < gate.min_top1_agreement:
        ok, detail = False, f"agreement {agreement:.4f} < {gate.min_top1_agreement}"
    elif gated and is_float and exact.max_abs_diff > gate.max_probability_error:
        ok, detail = False, (f"max abs diff {exact.max_abs_diff:.3g} > "
                             f"{gate.max_probability_error}")
    elif not gated:
        detail = "reported, not gated (lossy)"
    return OutputParity(
        signature=signature, output=alias, dtype=exact.dtype, shape=exact.shape,
        elements=exact.elements, mismatches=exact.mismatches,
        max_abs_diff=exact.max_abs_diff, max_rel_diff=exact.max_rel_diff, ok=ok,
        detail=detail, agreement=agreement,
    )
