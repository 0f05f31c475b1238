"""``realtime_omni_w8``: a vLLM quantization method for int8 thinker weights on CPUs with AVX2.

vLLM's own CPU paths for small weights were measured too slow on a two-core AVX2 machine (README,
docs): its 4-bit kernel turns about one weight per cycle into products, and oneDNN's int8 matmul
limited to AVX2 is slower than fp32. This method stores every decoder linear layer and the output
head as int8 with one scale per output channel, and runs them with ``pipelines/int8/kernel.py``'s kernel,
which streams the weights at memory speed. Activations stay float32 (the model's dtype); the
embeddings, norms and biases are untouched.

A checkpoint says ``"quantization_config": {"quant_method": "realtime_omni_w8"}`` and holds, per
quantized layer, ``<layer>.weight`` (int8 [N, K]) and ``<layer>.weight_scale`` (float32 [N, 1]);
``pipelines/int8/quantize.py`` writes one. ``register()`` makes the method known to vLLM: the thinker
calls it before starting an engine, and the package's ``vllm.general_plugins`` entry point calls
it in every vLLM process (engine cores, ``vllm serve``).
"""

from __future__ import annotations

from typing import Any

NAME = "realtime_omni_w8"
_registered = False


def register() -> None:
    """Make ``realtime_omni_w8`` a quantization method vLLM knows (idempotent, cheap)."""
    global _registered
    if _registered:
        return
    _registered = True
    import torch
    from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, register_weight_loader_v2_supported_method
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.parameter import ChannelQuantScaleParameter, ModelWeightParameter
    from vllm.model_executor.utils import set_weight_attrs

    from pipelines.int8 import kernel as w8

    def finish(layer: torch.nn.Module) -> None:
        """After loading: the kernel's layout (``w8.pack``) and float32 scales [N]."""
        layer.weight = torch.nn.Parameter(w8.pack(layer.weight.data), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(layer.weight_scale.data.reshape(-1).float().contiguous(), requires_grad=False)

    @register_weight_loader_v2_supported_method
    class RealtimeOmniW8LinearMethod(LinearMethodBase):
        def create_weights(
            self,
            layer: torch.nn.Module,
            input_size_per_partition: int,
            output_partition_sizes: list[int],
            input_size: int,
            output_size: int,
            params_dtype: torch.dtype,
            **extra: Any,
        ) -> None:
            loader = extra.pop("weight_loader")
            n = sum(output_partition_sizes)
            layer.logical_widths = output_partition_sizes
            weight = ModelWeightParameter(
                data=torch.empty(n, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0, weight_loader=loader
            )
            layer.register_parameter("weight", weight)
            scale = ChannelQuantScaleParameter(data=torch.empty(n, 1, dtype=torch.float32), output_dim=0, weight_loader=loader)
            layer.register_parameter("weight_scale", scale)

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            finish(layer)

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return w8.linear(x, layer.weight, layer.weight_scale, bias)

    class RealtimeOmniW8HeadMethod(QuantizeMethodBase):
        """The output head (a ``ParallelLMHead``): the same int8 product; it is never an embedding
        (the input embeddings stay float)."""

        def create_weights(
            self,
            layer: torch.nn.Module,
            input_size_per_partition: int,
            output_partition_sizes: list[int],
            input_size: int,
            output_size: int,
            params_dtype: torch.dtype,
            **extra: Any,
        ) -> None:
            loader = extra.pop("weight_loader")
            n = sum(output_partition_sizes)
            weight = torch.nn.Parameter(torch.empty(n, input_size_per_partition, dtype=torch.int8), requires_grad=False)
            scale = torch.nn.Parameter(torch.empty(n, 1, dtype=torch.float32), requires_grad=False)
            for name, param in (("weight", weight), ("weight_scale", scale)):
                layer.register_parameter(name, param)
                set_weight_attrs(param, {"output_dim": 0, "weight_loader": loader})

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            finish(layer)

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return w8.linear(x, layer.weight, layer.weight_scale, bias)

    @register_quantization_config(NAME)
    class RealtimeOmniW8Config(QuantizationConfig):
        def get_name(self) -> str:  # type: ignore[override]
            return NAME

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            return [torch.float32]

        @classmethod
        def get_min_capability(cls) -> int:
            return -1  # a CPU method: no GPU capability asked

        @staticmethod
        def get_config_filenames() -> list[str]:
            return []

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> "RealtimeOmniW8Config":
            return cls()

        def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
            if isinstance(layer, ParallelLMHead):
                return RealtimeOmniW8HeadMethod()
            if isinstance(layer, LinearBase):
                return RealtimeOmniW8LinearMethod()
            return None  # embeddings and the rest stay as they are
