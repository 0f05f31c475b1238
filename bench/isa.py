"""Run the benchmarks as on a CPU with AVX2 and no AVX-512 (``--isa avx2``), on a machine that has
more: the product must be real time on AVX2 alone, and some machines here have AVX-512.

``environment("avx2")`` is what a server process started by a benchmark gets: vLLM loads its AVX2
kernel library (torch's AVX-512 report patched, see ``isa_avx2/sitecustomize.py``), ATen dispatches
AVX2 kernels (``ATEN_CPU_CAPABILITY``), oneDNN and MKL stop at AVX2, CTranslate2 (Whisper) runs its
AVX2 code. onnxruntime (Piper, Smart Turn) has no such switch: its AVX-512 kernels stay, so the
talker's figures are a little better than on a real AVX2 machine. Memory bandwidth and clock are the
machine's own. ``describe()`` names the CPU and the flags that matter, for every figure reported.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).parent / "isa_avx2"
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx_vnni")


def environment(isa: str | None) -> dict[str, str]:
    """Environment variables (to add to ``os.environ``) that make a process behave as on ``isa``."""
    if isa in (None, "native"):
        return {}
    if isa != "avx2":
        raise ValueError(f"unknown ISA {isa!r}: native or avx2")
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2",
        "REALTIME_OMNI_BENCH_ISA": "avx2",
    }


def describe(isa: str | None = None) -> dict[str, object]:
    """The CPU, its flags that matter, and the ISA the benchmark ran as."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": model,
        "flags": [f for f in FLAGS if f in flags],
        "ran_as": isa or os.environ.get("REALTIME_OMNI_BENCH_ISA") or "native",
        "cores": os.cpu_count(),
    }
