"""int8 weights with float activations (W8A32) for the CPU thinker: the kernel, and quantizing to it.

``linear(x, pack(weight), scale, bias)`` is ``x @ (weight * scale[:, None]).T + bias`` for an int8
``weight`` [N, K] with one float scale per output channel. It runs ``kernels/w8_linear.c`` (AVX2 +
FMA; see there why), compiled once with the machine's C compiler into the cache
(``$REALTIME_OMNI_HOME/kernels``) and loaded with ctypes. Where it cannot run (no compiler, no
AVX2/FMA), the same product is computed with torch, correct and slow, and ``kernel_problem()``
says why.

``quantize(w)``: symmetric per-channel int8 (scale = max |w| / 127 of each output channel).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "w8_linear.c"
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11"]

_lock = threading.Lock()
_kernel: Any = None
_problem: str | None = None


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build(cache: Path | None = None) -> Path:
    """The compiled kernel (built once per source and flags; the file name carries their hash)."""
    from pipelines.paths import home

    source = SOURCE.read_bytes()
    tag = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    out = (cache or home() / "kernels") / f"w8_linear-{tag}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the int8 kernel; install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        done = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(part)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"building the int8 kernel failed: {done.stderr.strip()[-2000:]}")
        os.replace(part, out)  # atomic: a concurrent builder's file is as good as ours
    return out


def _load() -> Any:
    """The kernel's function, or None (and ``_problem`` says why)."""
    global _kernel, _problem
    with _lock:
        if _kernel is None and _problem is None:
            missing = {"avx2", "fma"} - _cpu_flags()
            if missing:
                _problem = f"this CPU lacks {', '.join(sorted(missing))}"
            else:
                try:
                    import torch  # noqa: F401  (its libgomp first: the kernel shares torch's OpenMP runtime)

                    fn = ctypes.CDLL(str(build())).w8_linear
                    fn.restype = ctypes.c_int
                    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3
                    _kernel = fn
                except (OSError, RuntimeError) as exc:
                    _problem = str(exc)
            if _problem:
                log.warning("int8 thinker weights run on torch's slow path: %s", _problem)
        return _kernel


def kernel_problem() -> str | None:
    """None when the fast kernel runs here, else why not."""
    _load()
    return _problem


def pack(q: Any) -> Any:
    """int8 [N, K] -> the kernel's layout: [ceil(N/4), 4 * K8] (K8: K rounded up to 8), zero padded.
    Block b holds channels 4b..4b+3; for every 8 inputs, their 4 runs of 8 weights in turn."""
    import torch

    n, k = q.shape
    n4, k8 = -(-n // 4) * 4, -(-k // 8) * 8
    padded = torch.zeros(n4, k8, dtype=torch.int8)
    padded[:n, :k] = q
    return padded.view(n4 // 4, 4, k8 // 8, 8).permute(0, 2, 1, 3).reshape(n4 // 4, 4 * k8).contiguous()


def unpack(packed: Any, n: int, k: int) -> Any:
    """The inverse of ``pack``: int8 [n, k]."""
    blocks, width = packed.shape
    k8 = width // 4
    return packed.view(blocks, k8 // 8, 4, 8).permute(0, 2, 1, 3).reshape(blocks * 4, k8)[:n, :k]


def linear(x: Any, packed: Any, scale: Any, bias: Any = None) -> Any:
    """``x`` [..., K] float, ``packed`` from ``pack`` (int8), ``scale`` [N] float32, ``bias`` [N] or None."""
    import torch

    shape = x.shape
    k, k8, n = shape[-1], packed.shape[1] // 4, scale.shape[0]
    x2 = x.reshape(-1, k).to(torch.float32)
    if k8 != k:
        x2 = torch.nn.functional.pad(x2, (0, k8 - k))
    x2 = x2.contiguous()
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    fn = _load()
    if fn is None:
        y = torch.nn.functional.linear(x2, unpack(packed, n, k8).to(torch.float32) * scale[:, None], bias)
    else:
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)
        if x2.shape[0] and fn(x2.data_ptr(), packed.data_ptr(), scale.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(), x2.shape[0], k8, n):
            raise MemoryError("the int8 kernel could not allocate its buffer")
    return y.reshape(*shape[:-1], n).to(x.dtype)


def quantize(w: Any) -> tuple[Any, Any]:
    """[N, K] float -> (int8 [N, K], float32 scales [N])."""
    import torch

    w = w.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()
