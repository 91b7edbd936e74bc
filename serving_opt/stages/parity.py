"""The parity gate: the optimized model must answer like the original.

Both models are loaded in fresh sessions with the session loader (what TF Serving
uses), every kept signature runs on the same inputs, and every output is compared:
integers, booleans and strings exactly; floats element-wise within
``atol + rtol * |reference|`` (numpy.isclose semantics, NaN equal to NaN).

Errors are behaviour too. When the original refuses the inputs synthesized as its
signature declares them, other ways are tried in order (scalars for inputs of unknown
rank, batch 1, one value per tf.Example feature; the graph's own shapes complete the
signature's from the start) and the first it answers is used, the report's input
source naming it (``synthesized (batch 1)``). When none runs, that is a usage error
naming the last failure (the inputs are wrong, not the model: pass ``--examples``);
an op the runtime lacks is named instead, since no input would do. On the user's own
inputs (``--examples``) a batch the original rejects (an assertion, a bad shape) is
expected to be rejected by the candidate as well: answering it fails the gate, as
does raising where the original answers. Only "raises" is compared, not the message.
When the original rejects every batch of a signature, the inputs are wrong (a usage
error again): there would be no answer left to compare.

Outputs behind discontinuous ops (NMS, TopK, ArgMax, comparisons) are measured
elementwise too, but judged by :mod:`serving_opt.detection.parity_rule`: in lossless work a
changed answer passes only where the tensors feeding the op (fetched in both runs)
agree within the tolerance, a near-tie rounding decided the other way; detections are
matched by class and IoU. Under ``--quantize`` a detection model is judged by
detection agreement.

Defaults: ``atol=1e-5``, ``rtol=1e-4``. Lossless rewrites (batch-norm folding,
constant folding) move float32 results by about 1e-6 relative; a lossy
transform such as ``round_weights`` or ``quantize_weights`` fails by orders of
magnitude, so the defaults separate the two. Loosen them deliberately for lossy
transforms, or pass ``lossy`` (``--quantize``): the rules themselves, tolerance and
lossy, are :mod:`serving_opt.core.gates`'.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from serving_opt.core import gates
from serving_opt.core.gates import DEFAULT_ATOL, DEFAULT_RTOL, LossyGate, ToleranceGate
from serving_opt.detection import parity_rule as discrete_gate
from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel import inputs as inputs_lib
from serving_opt.savedmodel import loader, unbound_variables
from serving_opt.savedmodel.examples import UserInputs
from serving_opt.savedmodel.loader import run_signature


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
    # strings) agree with the original, on the rows that decide (near-ties left out),
    # its 95% interval, the rows counted and the near-tie rows left out.
    agreement: float | None = None
    interval: tuple[float, float] | None = None
    rows: int | None = None
    near_ties: int | None = None
    # The interval straddles the threshold: ``ok`` is the point estimate's word.
    undecided: bool = False


@dataclass(frozen=True)
class ParityReport:
    """The gate's verdict, with per-output numbers and where the inputs came from."""

    ok: bool
    atol: float
    rtol: float
    outputs: tuple[OutputParity, ...]
    input_sources: dict
    batches_run: int

    def failures(self) -> list[OutputParity]:
        return [o for o in self.outputs if not o.ok]

    def undecided(self) -> list[OutputParity]:
        """Outputs whose agreement interval straddles the lossy gate's threshold."""
        return [o for o in self.outputs if o.undecided]

    def summary(self) -> str:
        """One line naming the worst failure, or the number of outputs checked."""
        if self.ok:
            worst = max((o.max_abs_diff for o in self.outputs), default=0.0)
            sigs = len({o.signature for o in self.outputs})
            return (f"parity ok: {len(self.outputs)} outputs of {sigs} signatures match "
                    f"(max abs diff {worst:.2g})" + self.inputs_note())
        parts = []
        for o in self.failures()[:3]:
            parts.append(
                f"{o.signature}/{o.output}: {o.mismatches} of {o.elements} elements differ"
                + (f", max abs diff {o.max_abs_diff:.3g}, max rel diff {o.max_rel_diff:.3g}"
                   if o.max_abs_diff else "")
                + (f" ({o.detail})" if o.detail else "")
            )
        return "parity failed: " + "; ".join(parts)

    def inputs_note(self) -> str:
        """``; inputs: predict synthesized (batch 1)``: the signatures whose inputs were not
        synthesized as declared (the original refused those), or nothing.
        """
        other = [f"{key} {source}" for key, source in sorted(self.input_sources.items())
                 if source != inputs_lib.SYNTHESIZED and inputs_lib.is_synthesized(source)]
        return "; inputs: " + ", ".join(other) if other else ""

    def to_dict(self) -> dict:
        return asdict(self)


_FIX = "pass real inputs with --examples (TFRecord of tf.Example or JSON lines)"
# State the session loader (TF Serving's) left unset: no input can make the model answer.
_LOADER_STATE = re.compile(
    r"Could not find variable|uninitiali[sz]ed|not initiali[sz]ed|Resource \S+ does not "
    r"exist|Container \S+ does not exist|Table not initialized", re.IGNORECASE)


def _why_not(error: BaseException | str, source: str, key: str) -> ServingOptError:
    """Why the original cannot answer, before any advice about inputs: the runtime (an op
    this TensorFlow lacks), the loader (state it left unset), or else the inputs."""
    what = f"the original model cannot run signature {key}"
    if isinstance(error, BaseException):
        missing = loader.missing_op_error(error, what)
        if missing is not None:
            return ServingOptError(
                f"{missing.problem} (the runtime, not the inputs; --serving_version names "
                "the TF Serving release to check against)", missing.fix)
        error = first_line(error)
    if _LOADER_STATE.search(error):
        return ServingOptError(
            f"{what} as the session loader (TF Serving's) loads it, whatever the inputs: the "
            f"restore and init op leave state it reads unset ({error})",
            "re-export it so its checkpoint and init op cover every variable and table the "
            "signatures read: TF Serving fails every request the same way")
    return ServingOptError(
        f"the original model fails on {source} inputs for signature {key}: {error}", _FIX)


def _run_original(session, signature_def, feeds, key: str, batch_size: int,
                  num_batches: int, extra: tuple, modes: Sequence[str]):
    """(inputs, [(feed, outputs or Rejected, fed tensors)]): the original's answers.

    On synthesized inputs it must answer every batch: when it refuses the inputs as the
    signature declares them, each fallback of ``modes`` (:func:`inputs.fallback_modes`:
    scalars, batch 1, one value per feature) is tried in order and the first it answers
    is used, its source saying which. When none runs, the error names the last failure.
    The user's inputs are run as they are; a batch the original rejects is kept as
    :class:`Rejected` (behaviour the candidate must keep), unless it rejects them all.
    """
    sig_inputs = feeds(key, batch_size, num_batches)
    if not inputs_lib.is_synthesized(sig_inputs.source):
        runs: list = []
        for feed in sig_inputs.batches:
            try:
                runs.append((feed, *_run(session, signature_def, feed, extra)))
            except Exception as e:  # noqa: BLE001 - the user's batch: a rejection is kept
                why = _why_not(e, sig_inputs.source, key)
                if why.fix != _FIX:  # not the inputs: no batch would do
                    raise why from e
                runs.append((feed, Rejected(first_line(e)), {}))
        if runs and all(isinstance(r, Rejected) for _, r, _ in runs):
            # Every batch rejected: the inputs are wrong, there is nothing to compare.
            raise _why_not(runs[0][1].error, sig_inputs.source, key)
        return sig_inputs, runs
    tried: list[str] = []
    for mode in (None, *modes):
        if mode is not None:
            sig_inputs = feeds(key, batch_size, num_batches, mode=mode)
        try:
            return sig_inputs, [(feed, *_run(session, signature_def, feed, extra))
                                for feed in sig_inputs.batches]
        except Exception as e:  # noqa: BLE001 - the original refuses these: try the next
            why = _why_not(e, sig_inputs.source, key)
            if why.fix != _FIX:  # not the inputs: no other inputs would do
                raise why from e
            tried.append(sig_inputs.source)
            last = e
    also = f" (tried {', '.join(tried)})" if len(tried) > 1 else ""
    raise ServingOptError(
        f"the original model fails on synthesized inputs for signature {key}{also}: "
        f"{first_line(last)}", _FIX) from last


def _open_reference(reference_dir: str, tags: frozenset[str]):
    """(session, meta_graph) of the original. One whose signatures read variables the
    session loader never restores cannot answer there: its reference is the object-graph
    call (``tf.saved_model.load``), which binds them, behind the same ``run``."""
    sess, meta_graph = loader.load_session(reference_dir, tags)
    unbound = unbound_variables.find(meta_graph, reference_dir)
    if not unbound:
        return sess, meta_graph
    sess.close()
    return _ObjectGraphSession(reference_dir, tags, meta_graph), meta_graph


class _ObjectGraphSession:
    """``run(fetches, feeds)`` over ``tf.saved_model.load``'s signatures, keyed by the
    SignatureDefs' tensor names; any other tensor is not fetchable (KeyError)."""

    def __init__(self, path: str, tags: frozenset[str], meta_graph):
        import tensorflow as tf
        from tensorflow.python.eager import context

        self._eager = context.eager_mode
        with tf.Graph().as_default(), self._eager():
            self._loaded = tf.saved_model.load(path, tags=sorted(tags))
        self._signatures = loader.serving_signatures(meta_graph)

    def run(self, fetches, feed_dict):
        import tensorflow as tf

        fed = set(feed_dict)
        found = next(((key, sig) for key, sig in self._signatures.items()
                      if {t.name for t in sig.inputs.values()} == fed
                      and set(fetches) <= {t.name for t in sig.outputs.values()}), None)
        if found is None:
            raise KeyError(f"no signature feeds {sorted(fed)} and fetches {list(fetches)}")
        name, sig = found
        names = {t.name: alias for alias, t in sig.outputs.items()}
        args = {alias: tf.constant(feed_dict[t.name], dtype=tf.as_dtype(t.dtype))
                for alias, t in sig.inputs.items()}
        with self._eager():
            out = self._loaded.signatures[name](**args)
            return [out[names[f]].numpy() for f in fetches]

    def close(self) -> None:
        self._loaded = None
        gc.collect()


@dataclass(frozen=True)
class Rejected:
    """The original raised on this (user-provided) batch: the candidate must raise too."""

    error: str


@dataclass(frozen=True)
class ParityInputs:
    """What both models are run on: the user's inputs (``--examples``; None: synthesized
    from the signatures), ``num_batches`` batches of ``batch_size`` rows, the synthesis
    ``seed``, and ``shapes`` ({key: {alias: shape}}, ``--input_shapes``) that synthesized
    inputs take.
    """

    user_inputs: UserInputs | None = None
    batch_size: int = 16
    num_batches: int = 2
    seed: int = 0
    shapes: Mapping | None = None


def check_parity(
    reference_dir: str,
    candidate_dir: str,
    tags: frozenset[str],
    signature_keys: Sequence[str],
    *,
    inputs: ParityInputs = ParityInputs(),
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    lossy: LossyGate | None = None,
) -> ParityReport:
    """Runs every signature of both models on the same inputs and compares the outputs."""
    # One model in memory at a time: for a 1 GB model, two at once would double the
    # optimizer's peak. The original's answers are kept (they are small), then compared.
    ref_sess, ref_mg = _open_reference(reference_dir, tags)
    try:
        feeds = inputs_lib.signature_feeds(ref_mg, reference_dir, user=inputs.user_inputs,
                                           seed=inputs.seed, shapes=inputs.shapes)
        runs: dict[str, list] = {}  # key -> [(feed, expected outputs, feeding tensors)]
        sources = {}
        discrete: dict[str, discrete_gate.DiscreteOutputs] = {}
        for key in signature_keys:
            ref_sig = ref_mg.signature_def[key]
            found = discrete_gate.plan(ref_mg.graph_def, ref_sig, key)
            if found is not None:
                discrete[key] = found
            extra = found.feeds if found is not None else ()
            modes = inputs_lib.fallback_modes(ref_mg.graph_def, ref_sig, inputs.batch_size,
                                              (inputs.shapes or {}).get(key))
            sig_inputs, runs[key] = _run_original(ref_sess, ref_sig, feeds, key,
                                                  inputs.batch_size, inputs.num_batches,
                                                  extra, modes)
            sources[key] = sig_inputs.source
        outputs = {key: sorted(ref_mg.signature_def[key].outputs) for key in signature_keys}
    finally:
        ref_sess.close()
        del ref_sess
        gc.collect()

    gate: gates.Gate = lossy or ToleranceGate(atol, rtol)
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
            found = discrete.get(key)
            paired = discrete_gate.candidate_tensors(found, cand_mg.graph_def, cand_sig, key) \
                if found is not None else {}
            batches: list[discrete_gate.Batch] = []
            for feed, expected, ref_feeds in runs[key]:
                try:
                    actual, cand_feeds = _run(cand_sess, cand_sig, feed, tuple(paired.values()))
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
                if found is not None:
                    batches.append(discrete_gate.Batch(
                        expected, actual, ref_feeds,
                        {ref: cand_feeds[cand] for ref, cand in paired.items()
                         if cand in cand_feeds}))
            if failure:
                results.append(OutputParity(key, "*", "", (), 0, 1, 0.0, 0.0, False, failure))
                continue
            if rejected:
                results.append(OutputParity(key, "(errors)", "", (), rejected, 0, 0.0, 0.0,
                                            True, f"{rejected} input batches rejected by both"))
            # An output with no pairs: every batch was rejected, by both models.
            checks = gates.check_signature(key, per_output, gate)
            if found is not None:
                checks = discrete_gate.rejudge(checks, batches, found, gate)
            results.extend(_output_parity(check) for check in checks.values())
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


def _run(session, signature_def, feed: dict, tensors: tuple[str, ...]) -> tuple[dict, dict]:
    """The signature's outputs by alias and, in the same run, ``tensors`` by name.

    A tensor that cannot be fetched (inside a TF1 while loop's frame, say) is not an
    error of the model: the outputs alone are run again and no tensor is returned.
    """
    if tensors:
        try:
            values = run_signature(session, signature_def, feed, tensors=tensors)
        except Exception:  # noqa: BLE001 - the outputs alone decide what the model does
            pass
        else:
            return ({a: values[a] for a in signature_def.outputs},
                    {t: values[t] for t in tensors})
    return run_signature(session, signature_def, feed), {}


def _output_parity(check: gates.OutputCheck) -> OutputParity:
    """The report's line for one output: the gate's measurement and its verdict."""
    return OutputParity(
        signature=check.signature, output=check.output, dtype=check.dtype,
        shape=check.shape, elements=check.elements, mismatches=check.differing,
        max_abs_diff=check.max_abs_diff, max_rel_diff=check.max_rel_diff,
        ok=check.verdict.ok, detail=check.verdict.reason, agreement=check.agreement,
        interval=check.count.interval if check.count is not None else None,
        rows=check.count.rows if check.count is not None else None,
        near_ties=check.count.near_ties if check.count is not None else None,
        undecided=check.verdict.undecided,
    )
