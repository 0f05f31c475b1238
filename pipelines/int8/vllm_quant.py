"""The classes behind ``realtime_omni_w8`` (``vllm_method.py`` says what the method is and registers
them): the quantization config, which gives each layer its method; the linear layers' method; the
output head's. Importing this module imports vLLM; ``vllm_method.register()`` does, only when asked.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    ModelWeightParameter,
)
from vllm.model_executor.utils import set_weight_attrs

from pipelines.int8 import NAME
from pipelines.int8 import kernel as w8


class _Int8Product:
    """What both methods do once the weights are loaded: pack them for the kernel, and run it."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """The kernel's layout (``w8.pack``) and float32 scales [N]."""
        weight, scale = layer.get_parameter("weight"), layer.get_parameter("weight_scale")
        layer.weight = torch.nn.Parameter(w8.pack(weight.data), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale.data.reshape(-1).float().contiguous(), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return w8.linear(x, layer.weight, layer.weight_scale, bias)


class RealtimeOmniW8LinearMethod(_Int8Product, LinearMethodBase):
    """A decoder linear layer (fused or not): int8 [N, K] weights and float32 [N, 1] scales, loaded
    by vLLM's sharding-aware loader (v2)."""

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
        setattr(layer, "logical_widths", output_partition_sizes)  # as vLLM's own linear methods set it
        weight = ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0, weight_loader=loader
        )
        layer.register_parameter("weight", weight)
        scale = ChannelQuantScaleParameter(data=torch.empty(n, 1, dtype=torch.float32), output_dim=0, weight_loader=loader)
        layer.register_parameter("weight_scale", scale)


class RealtimeOmniW8HeadMethod(_Int8Product, QuantizeMethodBase):
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


class RealtimeOmniW8Config(QuantizationConfig):
    """The checkpoint's ``quantization_config``: which layers run int8 (the linear layers and the
    head) and which stay as they are (embeddings, norms)."""

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
    def from_config(cls, config: dict[str, Any]) -> RealtimeOmniW8Config:
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, ParallelLMHead):
            return RealtimeOmniW8HeadMethod()
        if isinstance(layer, LinearBase):
            return RealtimeOmniW8LinearMethod()
        return None  # embeddings and the rest stay as they are
