"""int8 weights for the CPU thinker: a prepared fp32 checkpoint -> a ``realtime_omni_w8`` one.

The thinker's fp32 weights are 2.5 GB read for every token it writes; on two cores that is the
whole cost of decoding. This writes every linear layer of the decoder and the output head as int8
with one scale per output channel (symmetric: max |w| / 127), the format ``pipelines/int8/vllm_method.py``
runs. Embeddings, norms and biases stay as they are. Deterministic: the same input gives the same
bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized(name: str) -> bool:
    """Whether the checkpoint tensor ``name`` is one this method stores as int8."""
    return name.endswith(".weight") and (name == "lm_head.weight" or any(f".{p}." in name for p in LINEAR))


def quantize_checkpoint(src: Path, out: Path) -> None:
    """``src`` (config.json, model.safetensors, tokenizer files) -> ``out``, int8."""
    from safetensors.torch import load_file, save_file

    from pipelines.int8 import NAME
    from pipelines.int8.kernel import quantize

    tensors = load_file(src / "model.safetensors")
    written = {}
    for name, w in tensors.items():
        if not quantized(name):
            written[name] = w
            continue
        q, scale = quantize(w)
        written[name] = q
        written[f"{name}_scale"] = scale[:, None].contiguous()  # <layer>.weight_scale, [N, 1]
    save_file(written, out / "model.safetensors")
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json", "prepared.json"):
            shutil.copy(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": NAME}
    (out / "config.json").write_text(json.dumps(config, indent=1))
