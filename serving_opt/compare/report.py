"""The comparison's report: per output numbers, the verdict, and the tables people read.

The pipeline (``compare.pipeline``) writes one JSON line per signature output;
:func:`report_from_lines` turns them into a :class:`CompareReport`, which judges each
output with the gates' rules (``serving_opt.core.gates``: the tolerance rule, or the lossy
rule for quantized candidates) and :func:`format_report` lays out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from serving_opt.compare.options import CompareOptions
from serving_opt.compare.stats import histogram_labels
from serving_opt.core import gates


@dataclass(frozen=True)
class OutputComparison:
    """One output of one signature over every example (see stats.OutputStats)."""

    signature: str
    output: str
    dtype: str
    examples: int
    elements: int
    mismatches: int
    mismatched_examples: int
    max_abs_diff: float
    mean_abs_diff: float
    max_rel_diff: float
    mean_rel_diff: float
    histogram: dict  # bucket label ("0", "<=1e-06", ">1") -> elements
    top1_agreement: float | None = None  # classifiers: probabilities/scores or class ids
    top1_rows: int = 0
    confusion: tuple = ()  # (baseline class, candidate class, rows), every pair seen
    worst: tuple = ()  # (example key, score): max abs diff, or differing elements
    detail: str = ""  # why the answers could not be compared (shape, dtype, missing)
    kind: str = gates.Kind.VALUES.value  # gates.Kind: how the lossy gate judges it

    def check(self) -> gates.OutputCheck:
        """The output as the gates measure it. Integers and strings agree by examples
        (all of an example's values equal; for class ids, their top-1 agreement);
        classifiers' probabilities by their top-1 class.
        """
        kind = gates.Kind(self.kind)
        agreement = self.top1_agreement
        if kind is gates.Kind.DISCRETE:
            agreement = (self.examples - self.mismatched_examples) / self.examples \
                if self.examples else None
        return gates.OutputCheck(
            signature=self.signature, output=self.output, kind=kind, dtype=self.dtype,
            elements=self.elements, differing=self.mismatches,
            max_abs_diff=self.max_abs_diff, max_rel_diff=self.max_rel_diff,
            agreement=agreement, broken=self.detail)


@dataclass(frozen=True)
class CompareReport:
    """The comparison's verdict. ``ok``: no element mismatched under atol/rtol and no
    batch was rejected by one model only."""

    ok: bool
    baseline: str
    candidate: str
    examples_pattern: str
    shards: int
    examples: int
    runner: str
    workers: int
    atol: float
    rtol: float
    outputs: tuple[OutputComparison, ...]
    errors: tuple[dict, ...]  # per signature: rejected batches (both / one model only)
    skipped: dict  # signature -> why it was not compared
    seconds: float
    examples_per_second: float

    def failures(self, lossy: gates.LossyGate | None = None) -> list[str]:
        """What fails the gate: the tolerance rule (atol/rtol), or with ``lossy`` the
        lossy gate's (top-1 agreement and max probability error for classifier outputs).
        """
        gate: gates.Gate = lossy or gates.ToleranceGate(self.atol, self.rtol)
        out = []
        for e in self.errors:
            if e["baseline_only"] or e["candidate_only"]:
                out.append(f"{e['signature']}: {e['baseline_only'] + e['candidate_only']} "
                           f"examples rejected by one model only ({e['first_error']})")
        for o in self.outputs:
            verdict = gate.judge(o.check())
            if verdict.ok:
                continue
            out.append(f"{o.signature}/{o.output}: " + (
                verdict.reason or f"{o.mismatches} of {o.elements} elements in "
                                  f"{o.mismatched_examples} of {o.examples} examples differ "
                                  f"(max abs diff {o.max_abs_diff:.3g})"))
        return out

    def summary(self) -> str:
        if self.ok:
            worst = max((o.max_abs_diff for o in self.outputs), default=0.0)
            return (f"compare ok: {self.examples} examples, {len(self.outputs)} outputs "
                    f"match (max abs diff {worst:.2g})")
        return "compare: " + "; ".join(self.failures()[:3])


def report_from_lines(lines: list[dict], baseline: str, candidate: str, pattern: str,
                      shards: int, options: CompareOptions, skipped: dict,
                      seconds: float) -> CompareReport:
    """The report from the pipeline's result lines (``pipeline.result_line``)."""
    labels = histogram_labels()
    count = next((line["examples"] for line in lines if line["kind"] == "count"), 0)
    outputs, errors = [], []
    for line in lines:
        if line["kind"] == "errors":
            errors.append({k: v for k, v in line.items() if k != "kind"})
        elif line["kind"] == "output":
            top1 = line["top1_agree"] / line["top1_rows"] if line["top1_rows"] else None
            outputs.append(OutputComparison(
                signature=line["signature"], output=line["output"], dtype=line["dtype"],
                examples=line["examples"], elements=line["elements"],
                mismatches=line["mismatches"],
                mismatched_examples=line["mismatched_examples"],
                max_abs_diff=line["max_abs_diff"], mean_abs_diff=line["mean_abs_diff"],
                max_rel_diff=line["max_rel_diff"], mean_rel_diff=line["mean_rel_diff"],
                histogram=dict(zip(labels, line["histogram"])), top1_agreement=top1,
                top1_rows=line["top1_rows"],
                confusion=tuple(tuple(c) for c in line["confusion"]),
                worst=tuple(tuple(w) for w in line["worst"]),
                detail="; ".join(line["details"]), kind=line["output_kind"]))
    outputs.sort(key=lambda o: (o.signature, o.output))
    errors.sort(key=lambda e: e["signature"])
    report = CompareReport(
        ok=True, baseline=baseline, candidate=candidate, examples_pattern=pattern,
        shards=shards, examples=count, runner=options.runner,
        workers=options.direct_num_workers, atol=options.atol, rtol=options.rtol,
        outputs=tuple(outputs), errors=tuple(errors), skipped=dict(skipped),
        seconds=round(seconds, 3),
        examples_per_second=round(count / seconds, 1) if seconds > 0 else 0.0)
    return dataclasses.replace(report, ok=not report.failures())


def _g(x: float) -> str:
    return f"{x:.3g}"


def format_report(report: CompareReport) -> str:
    """The report as aligned tables: one row per output, then histograms, the worst
    examples and the classes that moved.
    """
    from serving_opt.core.rendering import table

    head = (f"compare {report.baseline} (baseline) vs {report.candidate} (candidate)\n"
            f"  {report.examples} examples from {report.shards} shard(s) of "
            f"{report.examples_pattern}; {report.runner}"
            + (f", {report.workers} workers" if report.workers > 1 else "")
            + f"; {report.seconds:.1f} s ({report.examples_per_second:.0f} examples/s)\n"
            f"  tolerances: atol={report.atol:g}, rtol={report.rtol:g}")
    rows = []
    for o in report.outputs:
        rows.append([o.signature, o.output, o.examples, o.mismatches, o.mismatched_examples,
                     _g(o.max_abs_diff), _g(o.mean_abs_diff), _g(o.max_rel_diff),
                     "-" if o.top1_agreement is None else f"{o.top1_agreement:.4%}"])
    parts = [head, "", table(["signature", "output", "examples", "mismatches",
                              "examples differing", "max abs", "mean abs", "max rel",
                              "top-1 agreement"], rows, indent="  ")]
    differing = [o for o in report.outputs if any(
        v for k, v in o.histogram.items() if k != "0")]
    if differing:
        labels = list(differing[0].histogram)
        parts += ["", "  abs diff histogram (elements)",
                  table(["signature/output"] + labels,
                        [[f"{o.signature}/{o.output}"] + [o.histogram[k] for k in labels]
                         for o in differing], indent="  ")]
    worst = [(o, w) for o in report.outputs for w in o.worst[:3]]
    if worst:
        parts += ["", "  worst examples (first 3 per output; all in the JSON report)",
                  table(["signature/output", "example", "score"],
                        [[f"{o.signature}/{o.output}", k, _g(s)] for o, (k, s) in worst],
                        indent="  ")]
    moved = [(o, c) for o in report.outputs for c in o.confusion if c[0] != c[1]]
    if moved:
        moved.sort(key=lambda oc: -oc[1][2])
        parts += ["", "  classes that moved (baseline -> candidate; top 10)",
                  table(["signature/output", "baseline", "candidate", "examples"],
                        [[f"{o.signature}/{o.output}", b, c, n] for o, (b, c, n)
                         in moved[:10]], indent="  ")]
    for e in report.errors:
        parts.append(f"  {e['signature']}: rejected by both {e['both']}, baseline only "
                     f"{e['baseline_only']}, candidate only {e['candidate_only']} examples"
                     + (f" ({e['first_error']})" if e["first_error"] else ""))
    for key, why in report.skipped.items():
        parts.append(f"  skipped {key}: {why}")
    parts += ["", "  result: " + ("OK, the candidate answers like the baseline" if report.ok
                                  else "DIFFERENT: " + "; ".join(report.failures()[:3]))]
    return "\n".join(parts)
