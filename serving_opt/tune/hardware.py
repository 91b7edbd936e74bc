"""The machine a tune ran on: part of its result.

Batching gains depend on the CPU: the same model gained very differently from batching
on an AVX-512 machine and on an AVX2 one, and TensorFlow picks oneDNN's or Eigen's
kernels by the CPU and ``TF_ENABLE_ONEDNN_OPTS``. So the report names the CPU model, its
vector extensions, the kernels the server's TensorFlow ran and the cores, and warns
that the recommendation holds for that hardware only.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from serving_opt.tune.settings import cores

# /proc/cpuinfo flag -> the name people know, from the oldest that matters to TensorFlow's
# kernels to the newest. Only those present are listed.
EXTENSIONS = (
    ("sse4_2", "SSE4.2"), ("avx", "AVX"), ("avx2", "AVX2"), ("fma", "FMA"),
    ("f16c", "F16C"), ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX-512F"),
    ("avx512bw", "AVX-512BW"), ("avx512vl", "AVX-512VL"), ("avx512_vnni", "AVX-512-VNNI"),
    ("avx512_bf16", "AVX-512-BF16"), ("avx512_fp16", "AVX-512-FP16"),
    ("amx_tile", "AMX-TILE"), ("amx_bf16", "AMX-BF16"), ("amx_int8", "AMX-INT8"),
)
# The ones whose presence changes which kernels run and how batching pays.
_HEADLINE = ("AVX2", "FMA", "AVX-VNNI", "AVX-512F", "AVX-512-VNNI", "AVX-512-BF16", "AMX-BF16",
             "AMX-INT8")


@dataclass(frozen=True)
class Hardware:
    """The CPU, its vector extensions, the kernels TensorFlow ran, and the cores.

    ``kernels`` is what the server's TensorFlow reported ("oneDNN" or "Eigen", "" when
    unknown); ``onednn_opts`` the ``TF_ENABLE_ONEDNN_OPTS`` it ran with (None: unset,
    TensorFlow's own choice by CPU).
    """

    cpu_model: str
    extensions: tuple[str, ...]
    cores: int  # the CPUs this process may run on (what TF Serving sizes its pools by)
    cpus: int  # the machine's online CPUs
    kernels: str = ""
    onednn_opts: str | None = None
    machine: str = ""  # x86_64, aarch64, ...

    @property
    def avx512(self) -> bool:
        return any(x.startswith("AVX-512") for x in self.extensions)

    def describe(self) -> str:
        """One line: ``AMD EPYC, 2 cores, AVX2 FMA (no AVX-512), Eigen kernels (...)``."""
        cores_text = (f"{self.cores} cores" if self.cores == self.cpus
                      else f"{self.cores} of {self.cpus} cores")
        headline = [x for x in self.extensions if x in _HEADLINE]
        vector = " ".join(headline) if headline else "no AVX2"
        if self.extensions and not self.avx512 and self.machine in ("", "x86_64"):
            vector += " (no AVX-512)"
        kernels = f"{self.kernels or 'unknown'} kernels"
        switch = ("TF_ENABLE_ONEDNN_OPTS unset" if self.onednn_opts is None
                  else f"TF_ENABLE_ONEDNN_OPTS={self.onednn_opts}")
        return f"{self.cpu_model}, {cores_text}, {vector}, {kernels} ({switch})"

    def warning(self) -> str:
        """The sentence every report carries: this result is this hardware's."""
        return (f"the recommendation holds for this hardware only ({self.cpu_model}, "
                f"{self.cores} cores, {self.kernels or 'unknown'} kernels): batching gains "
                "differ between CPUs (AVX-512 against AVX2, oneDNN against Eigen) and core "
                "counts; tune again on the machines that will serve")


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    model, found = "", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not found:  # x86; arm64 says Features
                    found = set(value.split())
                if model and found:
                    break
    except OSError:  # not Linux: the platform module's answer only
        pass
    return model, found


def here(kernels: str = "", env: tuple[tuple[str, str | None], ...] = (),
         cpuinfo: str = "/proc/cpuinfo") -> Hardware:
    """This machine, with the kernels and the environment the server ran TensorFlow with
    (the profile's ``kernels`` and ``env``).
    """
    model, found = _cpuinfo(cpuinfo)
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    extensions = tuple(name for flag, name in EXTENSIONS if flag in found)
    given = dict(env)
    onednn = (given["TF_ENABLE_ONEDNN_OPTS"] if "TF_ENABLE_ONEDNN_OPTS" in given
              else os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
    return Hardware(cpu_model=model, extensions=extensions, cores=cores(),
                    cpus=os.cpu_count() or cores(), kernels=kernels, onednn_opts=onednn,
                    machine=platform.machine())
