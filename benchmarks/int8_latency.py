"""Request latency (p50) of a quantized model against the original, side by side: the
part of ``benchmarks/int8_memory.py`` that says whether the memory saved costs time.

Each round is a fresh measuring process (``stages.benchmark.benchmark_in_fresh_process``)
that loads both models and times their requests interleaved, the order flipped every
request, at batch 1 and 32; which of the two is loaded first alternates from round to
round. A round's figure is its p50 ratio (quantized / original); the table gives the
median over the rounds with their spread (lowest, highest), and each model's p50.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from serving_opt.stages import benchmark as benchmark_lib  # noqa: E402

BATCH_SIZES = (1, 32)
TARGET = 1.05  # p50 quantized / original at each batch size


@dataclass(frozen=True)
class LatencyRow:
    """One batch size over the rounds: per round, both models' p50 (ms) and its ratio."""

    batch_size: int
    original_ms: tuple[float, ...]
    quantized_ms: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        return [q / o for o, q in zip(self.original_ms, self.quantized_ms) if o > 0]

    def ratio(self) -> float:
        return _median(self.ratios)


def _median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2 if n else float("nan")


def cpu_name() -> str:
    """The CPU's model name and the vector units the claims depend on (from /proc)."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    units = [u for u, flag in (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"),
                               ("AMX", "amx_tile")) if flag in flags]
    return f"{name} ({', '.join(units) or 'no AVX-512'}; {os.cpu_count()} CPUs)"


def measure(original: str, variants: dict[str, str], examples: str, rounds: int,
            runs: int, signature: str = "serving_default",
            say=print) -> dict[str, list[LatencyRow]]:
    """``rounds`` rounds; in each, per variant, a fresh process timing ``runs`` interleaved
    requests of it and of the original per batch size (fed the rows of the TFRecord
    ``examples``). Variant name -> one :class:`LatencyRow` per batch size."""
    got = {name: {b: ([], []) for b in BATCH_SIZES} for name in variants}
    for r in range(rounds):
        for name, path in variants.items():
            pair = (original, path) if r % 2 == 0 else (path, original)
            report = benchmark_lib.benchmark_in_fresh_process(
                pair[0], pair[1], frozenset({"serve"}), signature,
                schedule=benchmark_lib.BenchmarkSchedule(batch_sizes=BATCH_SIZES, runs=runs,
                                                         loads=1, warmup=20),
                inputs=benchmark_lib.BenchmarkInputs(examples=examples))
            for first, second in zip(report.before, report.after):
                orig, quant = (first, second) if r % 2 == 0 else (second, first)
                got[name][first.batch_size][0].append(orig.p50_ms)
                got[name][first.batch_size][1].append(quant.p50_ms)
            say(f"latency round {r + 1}/{rounds}, {name}: " + ", ".join(
                f"batch {b} {o[-1]:.3f} -> {q[-1]:.3f} ms"
                for b, (o, q) in got[name].items() if o))
    return {name: [LatencyRow(b, tuple(o), tuple(q)) for b, (o, q) in rows.items()]
            for name, rows in got.items()}


def table(rows: list[LatencyRow], name: str, runs: int) -> list[str]:
    """Markdown: the p50s and ratios, the hardware, and whether each meets the target."""
    rounds = len(rows[0].ratios) if rows else 0
    lines = [f"### Request latency, {name} vs the original ({rounds} rounds, each a fresh "
             f"process timing {runs} interleaved requests per model and batch size; "
             f"{cpu_name()})", "",
             f"| batch | original p50 | {name} p50 | {name} / original p50 (median "
             "[lowest, highest] over the rounds) | target |", "|---|---|---|---|---|"]
    for row in rows:
        ratios = row.ratios
        met = row.ratio() <= TARGET
        lines.append(f"| {row.batch_size} | {_median(row.original_ms):.3f} ms | "
                     f"{_median(row.quantized_ms):.3f} ms | **{row.ratio():.2f}x** "
                     f"[{min(ratios):.2f}, {max(ratios):.2f}] | <= {TARGET}x: "
                     f"{'met' if met else 'MISSED'} |")
    return lines


def missed(rows: list[LatencyRow]) -> list[str]:
    """The batch sizes whose median ratio is over the target (empty: met)."""
    return [f"p50 at batch {r.batch_size} {r.ratio():.2f}x > {TARGET}x" for r in rows
            if not r.ratio() <= TARGET]
