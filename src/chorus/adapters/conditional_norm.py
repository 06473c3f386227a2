"""Conditional layer norm (AdaSpeech, Chen et al., 2021): per-voice scale and bias of each LayerNorm.

AdaSpeech predicts the scale and bias from a speaker embedding with small linear layers; for one
voice that prediction is a constant, so a voice here stores the two vectors directly (as deltas on
the base norm's weight and bias, zero at first). Linear in the normalized input, so mergeable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register


@dataclass
class ConditionalNormConfig(MethodConfig):
    method = "cln"
    targets: str | list[str] = field(
        default_factory=lambda: ["norm1", "norm2", "norm"],
        metadata={"help": f"{TARGETS_HELP}; default: norm1, norm2, norm"},
    )


class ConditionalLayerNorm(AdapterLayer):
    method = "cln"
    adapter_attributes = ("norm_scale", "norm_shift")
    mergeable = True

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.norm_scale = nn.ParameterDict()
        self.norm_shift = nn.ParameterDict()

    def add(self, name: str, config: ConditionalNormConfig) -> None:
        base = innermost(self)
        if base.weight is None or base.bias is None:
            raise TypeError("conditional layer norm needs a LayerNorm with elementwise_affine=True and a bias")
        self.configs[name] = config
        self.norm_scale[name] = nn.Parameter(torch.zeros_like(base.weight))
        self.norm_shift[name] = nn.Parameter(torch.zeros_like(base.bias))

    def forward_with(self, name, x: torch.Tensor) -> torch.Tensor:
        """x ``[..., dim]`` -> ``[..., dim]``: base(x) + normalized(x) * scale + shift."""
        base = innermost(self)
        normalized = F.layer_norm(x, base.normalized_shape, None, None, base.eps)
        return self.base_layer(x) + normalized * self.norm_scale[name] + self.norm_shift[name]

    def forward_bank(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[batch, ..., dim]`` -> ``[batch, ..., dim]`` with each sample's scale and shift."""
        base = innermost(self)
        normalized = F.layer_norm(x, base.normalized_shape, None, None, base.eps)
        slot, used = self.bank.route(self.bank_index, x.shape[0])
        shape = (x.shape[0],) + (1,) * (x.dim() - 1 - len(base.normalized_shape)) + tuple(base.normalized_shape)
        keep = used.view(-1, *[1] * len(base.normalized_shape)).to(x.dtype)
        scale = (self.bank["norm_scale"][slot] * keep).view(shape)
        shift = (self.bank["norm_shift"][slot] * keep).view(shape)
        return self.base_layer(x) + normalized * scale + shift

    def merged_base_tensors(self, name, tensors):
        return {"weight": tensors["weight"] + self.norm_scale[name], "bias": tensors["bias"] + self.norm_shift[name]}

    def shadow_forward(self, pass_, name, x):
        """x ``[..., dim]`` -> ``[..., dim]``: base(x) + layer_norm(x) * scale + shift. The plain
        normalization is a second layer norm node (its own mean and std), kept for the scale's gradient."""
        normalized = pass_.layer_norm(x, len(innermost(self).normalized_shape))
        scaled = pass_.mul(normalized, pass_.parameter(self.norm_scale[name]))
        shifted = pass_.elementwise(scaled, pass_.parameter(self.norm_shift[name]))
        return pass_.elementwise(pass_.leaf(self.base_layer, x), shifted)


def _example(k: int) -> ConditionalNormConfig:
    """Test voice ``k``: odd voices leave the decoder's norms alone."""
    return ConditionalNormConfig(exclude=r"decoder\..*" if k % 2 else None)


register(
    Method(
        "cln",
        ConditionalNormConfig,
        ((nn.LayerNorm, ConditionalLayerNorm),),
        learning_rate=3e-3,
        summary="per-voice scale and bias of every layer norm (AdaSpeech)",
        example=_example,
    )
)
