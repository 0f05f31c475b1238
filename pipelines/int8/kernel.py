"""int8 weights for the CPU thinker: the kernel, and quantizing to it.

``linear(x, pack(weight), scale, bias)`` is ``x @ (weight * scale[:, None]).T + bias`` for an int8
``weight`` [N, K] with one float scale per output channel. One row (decoding) is multiplied in
float; several rows (prefill) are rounded to int16, a scale per row, and multiplied in integers
(twice the products per instruction; the error that adds is bounded, ``w8_linear.c`` says how).
It runs ``w8_linear.c`` (AVX2 + FMA; see there why), compiled when the project is installed
(``hatch_build.py``) into ``_w8_linear.so`` beside this file and loaded with ctypes; nothing is
compiled at run time. Where it cannot run (the library was not built, or was built from another
version of the source; no AVX2/FMA here), the same product is computed with torch, correct and
slow, and ``kernel_problem()`` says why.

Every tensor is checked before a pointer reaches C: a wrong dtype is a TypeError, a wrong shape, a
non-contiguous weight or a tensor off the CPU a ValueError.

``quantize(w)``: symmetric per-channel int8 (scale = max |w| / 127 of each output channel).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "w8_linear.c"
LIBRARY = Path(__file__).parent / "_w8_linear.so"
REBUILD = "reinstall the project where a C compiler is (gcc; scripts/install adds it), or run `python3 hatch_build.py` in a checkout"

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


def source_tag() -> str:
    """The hash of ``w8_linear.c`` a library built from it carries (``hatch_build.source_tag``)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def _open(library: Path) -> Any:
    """The library's ``w8_linear`` function; RuntimeError when it is missing or stale."""
    if not library.exists():
        raise RuntimeError(f"the int8 kernel was not built when the project was installed (no C compiler then?): {REBUILD}")
    lib = ctypes.CDLL(str(library))
    try:
        tag = (ctypes.c_char * 17).in_dll(lib, "w8_linear_tag").value.decode()
    except ValueError:
        tag = ""
    if tag != source_tag():
        raise RuntimeError(f"the int8 kernel {library.name} was built from another version of w8_linear.c: {REBUILD}")
    fn = lib.w8_linear
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3
    return fn


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

                    _kernel = _open(LIBRARY)
                except (OSError, RuntimeError) as exc:
                    _problem = str(exc)
            if _problem:
                log.warning("int8 thinker weights run on torch's slow path: %s", _problem)
        return _kernel


def kernel_problem() -> str | None:
    """None when the fast kernel runs here, else why not."""
    _load()
    return _problem


def _check(name: str, t: Any, dtype: Any, dims: int | None = None) -> None:
    """``t`` a CPU tensor of ``dtype`` (a TypeError if not), with ``dims`` dimensions (a ValueError)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, not {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, not {t.device}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, not shape {tuple(t.shape)}")


def pack(q: Any) -> Any:
    """int8 [N, K] -> the kernel's layout: [ceil(N/4), 4 * K8] (K8: K rounded up to 8), zero padded.
    Block b holds channels 4b..4b+3; for every 8 inputs, their 4 runs of 8 weights in turn."""
    import torch

    _check("the weight", q, torch.int8, 2)
    n, k = q.shape
    n4, k8 = -(-n // 4) * 4, -(-k // 8) * 8
    padded = torch.zeros(n4, k8, dtype=torch.int8)
    padded[:n, :k] = q
    return padded.view(n4 // 4, 4, k8 // 8, 8).permute(0, 2, 1, 3).reshape(n4 // 4, 4 * k8).contiguous()


def _check_packed(packed: Any) -> tuple[int, int]:
    """``packed`` as ``pack`` returns it: (its blocks of 4 channels, K8)."""
    import torch

    _check("packed", packed, torch.int8, 2)
    if not packed.is_contiguous():
        raise ValueError("packed must be contiguous, as pack() returns it")
    blocks, width = packed.shape
    if width % 32:
        raise ValueError(f"packed's rows must be 4 channels x K8 inputs, K8 a multiple of 8 (pack()'s layout), not {width} bytes")
    return blocks, width // 4


def unpack(packed: Any, n: int, k: int) -> Any:
    """The inverse of ``pack``: int8 [n, k]."""
    blocks, k8 = _check_packed(packed)
    if not (0 <= n <= 4 * blocks and 0 <= k <= k8):
        raise ValueError(f"[{n}, {k}] does not fit packed's {4 * blocks} channels x {k8} inputs")
    return packed.view(blocks, k8 // 8, 4, 8).permute(0, 2, 1, 3).reshape(blocks * 4, k8)[:n, :k]


def linear(x: Any, packed: Any, scale: Any, bias: Any = None) -> Any:
    """``x`` [..., K] float (any float dtype: computed in float32, returned in x's), ``packed`` from
    ``pack`` (int8 [ceil(N/4), 4 * K8]), ``scale`` [N] float32, ``bias`` [N] float or None.
    Each is checked before the kernel gets its pointer; ``x``, ``scale`` and ``bias`` are made
    contiguous where they are not (the weight, the large one, must be)."""
    import torch

    blocks, k8 = _check_packed(packed)
    _check("scale", scale, torch.float32, 1)
    n = scale.shape[0]
    if -(-n // 4) != blocks:
        raise ValueError(f"scale has {n} channels, packed holds {blocks} blocks of 4")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating point torch.Tensor, not {getattr(x, 'dtype', type(x).__name__)}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be on the CPU, not {x.device}")
    shape = x.shape
    k = shape[-1] if shape else -1
    if not k8 - 8 < k <= k8:
        raise ValueError(f"x has {k} inputs; packed's weights take {k8} (K rounded up to 8): K = {max(k8 - 7, 0)}..{k8}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise TypeError(f"bias must be a floating point torch.Tensor, not {getattr(bias, 'dtype', type(bias).__name__)}")
        if bias.device.type != "cpu" or tuple(bias.shape) != (n,):
            raise ValueError(f"bias must be a CPU tensor of shape ({n},), not {tuple(bias.shape)} on {bias.device}")
        bias = bias.to(torch.float32).contiguous()
    scale = scale.contiguous()
    x2 = x.reshape(-1, k).to(torch.float32)
    if k8 != k:
        x2 = torch.nn.functional.pad(x2, (0, k8 - k))
    x2 = x2.contiguous()
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

    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"the weight to quantize must be a floating point torch.Tensor, not {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"the weight to quantize must be [N, K], not shape {tuple(w.shape)}")
    w = w.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()
