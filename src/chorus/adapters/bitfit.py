"""BitFit (Ben Zaken et al., 2022): learn only the biases.

The learned biases are kept as per-voice deltas beside the frozen ones (zero at first), so base
voices stay bit-identical and many voices can share one model; merging adds them in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.registry import Method, MethodConfig, register


@dataclass
class BitFitConfig(MethodConfig):
    method = "bitfit"


class BiasDelta(AdapterLayer):
    method = "bitfit"
    adapter_attributes = ("bias_delta",)
    mergeable = True

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.bias_delta = nn.ParameterDict()
        self.axis = 1 if isinstance(innermost(base_layer), nn.Conv1d) else -1

    @classmethod
    def cannot_wrap(cls, layer: nn.Module) -> str | None:
        return None if getattr(layer, "bias", None) is not None else "it has no bias"

    def add(self, name: str, config: BitFitConfig) -> None:
        base = innermost(self)
        self.configs[name] = config
        self.bias_delta[name] = nn.Parameter(torch.zeros_like(base.bias))

    def forward_with(self, name, x, *args, **kwargs):
        """Same shapes as the wrapped layer; the bias is added on its output-feature axis."""
        delta = self.bias_delta[name]
        return self.base_layer(x, *args, **kwargs) + (delta[:, None] if self.axis == 1 else delta)

    def forward_bank(self, x, *args, **kwargs):
        """Same shapes as the wrapped layer; each sample's bias delta on the output-feature axis."""
        y = self.base_layer(x, *args, **kwargs)
        slot, used = self.bank.route(self.bank_index, y.shape[0])
        delta = self.bank["bias_delta"][slot]  # [batch, *bias shape]
        delta = delta * used.view(-1, *[1] * (delta.dim() - 1)).to(y.dtype)
        if self.axis == 1:
            return y + delta.view(*delta.shape, *[1] * (y.dim() - 2))
        return y + delta.view(delta.shape[0], *[1] * (y.dim() - delta.dim()), *delta.shape[1:])

    def merged_base_tensors(self, name, tensors):
        bias = tensors["bias"]
        return {"bias": bias + self.bias_delta[name].to(bias.dtype)}

    def bank_merged_tensors(self, slot, tensors):
        bias = tensors["bias"]
        return {"bias": bias + self.bank["bias_delta"][slot].to(bias.dtype)}

    def shadow_forward(self, pass_, name, x):
        # base(x) + delta: an addition saves nothing; the float32 delta promotes a bf16 output.
        return pass_.elementwise(pass_.leaf(self.base_layer, x), pass_.parameter(self.bias_delta[name]))


def _example(k: int) -> BitFitConfig:
    """Test voice ``k``: odd voices leave the encoder's biases alone."""
    return BitFitConfig(exclude=r"encoder\..*" if k % 2 else None)


register(
    Method(
        "bitfit",
        BitFitConfig,
        ((nn.Linear, BiasDelta), (nn.Conv1d, BiasDelta), (nn.LayerNorm, BiasDelta)),
        learning_rate=3e-3,
        summary="per-voice deltas of every bias",
        example=_example,
    )
)
