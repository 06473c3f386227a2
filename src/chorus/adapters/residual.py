"""Residual bottleneck adapters (Houlsby et al., 2019): ``y + up(relu(down(y)))`` after a sub-layer.

Placed after attention and feed-forward blocks of the encoder and decoder and inside the variance
predictors. ``up`` starts at zero, so a fresh adapter is a no-op. Nonlinear, so never merged.

Each adapter's ``down`` and ``up`` are the weight and bias of a Linear (``adapter_down.weight``,
``adapter_down.bias`` ...), kept as parameters (:class:`AdapterTensors`) and applied with
``F.linear`` rather than as two layers per voice, so resident voices cost little Python heap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from chorus.adapters.layer import AdapterLayer, AdapterTensors, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register
from chorus.models.acoustic import ConvFeedForward, MultiHeadAttention

DEFAULT_TARGETS = ["attn", "ff", "duration_predictor.norm2", "pitch.predictor.norm2", "energy.predictor.norm2"]


@dataclass
class ResidualAdapterConfig(MethodConfig):
    """bottleneck: hidden width of each adapter. 12 keeps a voice under 1% of the shipped base when the
    adapters sit in the decoder only (``chorus adapt``'s default, which keeps the base's text side); in
    every block (``--no-keep-text-side``) 6 does."""

    method = "residual"
    targets: str | list[str] = field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        metadata={"help": f"{TARGETS_HELP}; default: {', '.join(DEFAULT_TARGETS)}"},
    )
    bottleneck: int = field(default=12, metadata={"help": "hidden width of each adapter"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bottleneck <= 0:
            raise ValueError(f"bottleneck must be positive, got {self.bottleneck}")


def output_features(layer: nn.Module) -> tuple[int, int]:
    """(feature size, feature axis) of a supported layer's output."""
    if isinstance(layer, nn.Conv1d):
        return layer.out_channels, 1
    if isinstance(layer, nn.Linear):
        return layer.out_features, -1
    if isinstance(layer, nn.LayerNorm):
        return layer.normalized_shape[-1], -1
    if isinstance(layer, MultiHeadAttention):
        return innermost(layer.out_proj).out_features, -1
    if isinstance(layer, ConvFeedForward):
        return innermost(layer.conv2).out_channels, -1
    raise TypeError(f"no known output size for {type(layer).__name__}")


class ResidualAdapter(AdapterLayer):
    """Per adapter: down weight ``[bottleneck, features]`` and bias ``[bottleneck]``, up weight
    ``[features, bottleneck]`` and bias ``[features]``."""

    method = "residual"
    adapter_attributes = ("adapter_down", "adapter_up")

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.adapter_down = AdapterTensors("weight", "bias")
        self.adapter_up = AdapterTensors("weight", "bias")
        self.features, self.axis = output_features(innermost(base_layer))

    def add(self, name: str, config: ResidualAdapterConfig) -> None:
        self.configs[name] = config
        reference = next(innermost(self).parameters())
        kwargs = dict(device=reference.device, dtype=reference.dtype)
        # down as nn.Linear initializes itself (weight kaiming uniform, bias uniform within
        # 1/sqrt(features)); up zero, so a fresh adapter is a no-op.
        down_weight = torch.empty(config.bottleneck, self.features, **kwargs)
        down_bias = torch.empty(config.bottleneck, **kwargs)
        nn.init.kaiming_uniform_(down_weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(self.features)
        nn.init.uniform_(down_bias, -bound, bound)
        self.adapter_down[name] = {"weight": down_weight, "bias": down_bias}
        self.adapter_up[name] = {
            "weight": torch.zeros(self.features, config.bottleneck, **kwargs),
            "bias": torch.zeros(self.features, **kwargs),
        }

    def forward_with(self, name, *args, **kwargs):
        """Same shapes as the wrapped layer; features on the last axis (channels for Conv1d)."""
        y = self.base_layer(*args, **kwargs)
        h = y.transpose(1, -1) if self.axis == 1 else y  # [..., features]
        down, up = self.adapter_down[name], self.adapter_up[name]
        hidden = torch.relu(F.linear(h, down["weight"], down["bias"]))  # [..., bottleneck]
        h = h + F.linear(hidden, up["weight"], up["bias"])
        return h.transpose(1, -1) if self.axis == 1 else h

    def forward_bank(self, *args, **kwargs):
        """Same shapes as the wrapped layer. Bottlenecks padded with zero rows (bias 0) stay 0 through the
        ReLU and meet zero columns of ``up``: exact."""
        y = self.base_layer(*args, **kwargs)
        h = y.transpose(1, -1) if self.axis == 1 else y  # [batch, ..., features]
        batch = h.shape[0]
        slot, used = self.bank.route(self.bank_index, batch)
        rows = h.reshape(batch, -1, self.features)  # [batch, n, features]
        down = torch.baddbmm(
            self.bank["adapter_down.bias"][slot].unsqueeze(1),
            rows,
            self.bank["adapter_down.weight"][slot].transpose(1, 2),
        )  # [batch, n, bottleneck]
        keep = used.to(h.dtype)[:, None]  # zeroing the gathered up projection gives base rows +0
        up = torch.baddbmm(
            (self.bank["adapter_up.bias"][slot] * keep).unsqueeze(1),
            torch.relu(down),
            (self.bank["adapter_up.weight"][slot] * keep[:, None]).transpose(1, 2),
        )
        h = h + up.view(h.shape)  # up [batch, n, features]
        return h.transpose(1, -1) if self.axis == 1 else h

    def shadow_forward(self, pass_, name, x):
        """Same shapes as the wrapped layer: y + up(relu(down(y))) on the feature axis."""
        y = pass_.leaf(self.base_layer, x)
        if self.axis == 1:  # a Conv1d's channels move last and back: transposed views, nothing saved
            batch, channels, length = y.shape
            y = y.view(batch, length, channels)
        down, up = self.adapter_down[name], self.adapter_up[name]
        hidden = pass_.relu(pass_.linear(y, down["weight"], down["bias"]))
        out = pass_.elementwise(y, pass_.linear(hidden, up["weight"], up["bias"]))
        return out.view(batch, channels, length) if self.axis == 1 else out


def _example(k: int) -> ResidualAdapterConfig:
    """Test voice ``k``: bottlenecks 2-4; voices 1 and 4 adapt the first block of each stack only."""
    return ResidualAdapterConfig(bottleneck=2 + k % 3, layers=[0] if k % 3 == 1 else None)


register(
    Method(
        "residual",
        ResidualAdapterConfig,
        tuple((t, ResidualAdapter) for t in (MultiHeadAttention, ConvFeedForward, nn.Linear, nn.Conv1d, nn.LayerNorm)),
        learning_rate=2e-3,
        summary="bottleneck adapters after attention, feed-forward and predictors",
        example=_example,
    )
)
