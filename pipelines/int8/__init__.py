"""The int8 thinker: weight-only int8 matmuls for CPUs with AVX2 and FMA.

- ``w8_linear.c``: the kernel, compiled at install (``hatch_build.py`` at the root) into
  ``_w8_linear.so``; ``kernel.py``: loading it and calling it, its inputs checked first (with torch's
  slow path where it cannot run);
- ``vllm_method.py``: the vLLM quantization method (``realtime_omni_w8``) that runs it, registered in
  every vLLM process through the package's ``vllm.general_plugins`` entry point (cheap: it imports
  vLLM and ``vllm_quant.py``, the method's config and its two layer methods, only when it registers);
- ``quantize.py``: the writer that turns an fp32 checkpoint into int8 weights once.
"""

NAME = "realtime_omni_w8"  # the quantization method's name: what a checkpoint's config says, what vLLM registers
