"""``realtime_omni_w8``: a vLLM quantization method for int8 thinker weights on CPUs with AVX2.

vLLM's own CPU paths for small weights were measured too slow on a two-core AVX2 machine (README,
docs): its 4-bit kernel turns about one weight per cycle into products, and oneDNN's int8 matmul
limited to AVX2 is slower than fp32. This method stores every decoder linear layer and the output
head as int8 with one scale per output channel, and runs them with ``pipelines/int8/kernel.py``'s kernel,
which streams the weights at memory speed. Activations stay float32 (the model's dtype); the
embeddings, norms and biases are untouched.

A checkpoint says ``"quantization_config": {"quant_method": "realtime_omni_w8"}`` and holds, per
quantized layer, ``<layer>.weight`` (int8 [N, K]) and ``<layer>.weight_scale`` (float32 [N, 1]);
``pipelines/int8/quantize.py`` writes one. Its classes are ``vllm_quant.py``'s (one a job: the config,
the linear layers' method, the head's). ``register()`` makes the method known to vLLM: the thinker
calls it before starting an engine, and the package's ``vllm.general_plugins`` entry point calls
it in every vLLM process (engine cores, ``vllm serve``).
"""

from __future__ import annotations

import threading

from pipelines.int8 import NAME

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Make ``realtime_omni_w8`` a quantization method vLLM knows (idempotent; imports vLLM on the
    first call only, through ``vllm_quant``: its config and its two methods)."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.model_executor.layers.linear import (
            register_weight_loader_v2_supported_method,
        )
        from vllm.model_executor.layers.quantization import register_quantization_config

        from pipelines.int8 import vllm_quant

        register_weight_loader_v2_supported_method(vllm_quant.RealtimeOmniW8LinearMethod)
        register_quantization_config(NAME)(vllm_quant.RealtimeOmniW8Config)
        _registered = True
