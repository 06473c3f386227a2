"""A toy adapter method, written outside the library the way a new method is written: one module with
its config (fields with help texts), its wrapper (forward, bank path, merge, memory rule), its test
voices and its registration. ``tests/conftest.py`` imports it, which is the one line a new method adds
to ``chorus/adapters/methods.py``; every test parametrized over the registry then covers it, and so do
injection, voice folders and banks, which know no method.

The method: a learned gain per output feature of a Linear, ``y = base(x) * (1 + g)`` (as (IA)^3
rescales activations), ``g`` zero at first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register


@dataclass
class ToyGainConfig(MethodConfig):
    method = "toy"
    targets: str | list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj"], metadata={"help": f"{TARGETS_HELP}; default: q_proj, v_proj"}
    )
    init: float = field(default=0.0, metadata={"help": "starting gain (0: a fresh voice is the base)"})


class ToyGain(AdapterLayer):
    """Per adapter: a gain ``[out_features]``."""

    method = "toy"
    adapter_attributes = ("gain",)
    mergeable = True

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.gain = nn.ParameterDict()

    def add(self, name: str, config: ToyGainConfig) -> None:
        self.configs[name] = config
        weight = innermost(self).weight
        self.gain[name] = nn.Parameter(
            torch.full((weight.shape[0],), config.init, device=weight.device, dtype=weight.dtype)
        )

    def forward_with(self, name, x):
        """x ``[..., in]`` -> ``[..., out]``."""
        return self.base_layer(x) * (1 + self.gain[name])

    def forward_bank(self, x):
        """x ``[batch, ..., in]`` -> ``[batch, ..., out]`` with each sample's gain (0 for base samples)."""
        y = self.base_layer(x)
        slot, used = self.bank.route(self.bank_index, y.shape[0])
        gain = self.bank["gain"][slot] * used[:, None].to(y.dtype)  # [batch, out]
        return y * (1 + gain.view(y.shape[0], *[1] * (y.dim() - 2), -1))

    def merged_base_tensors(self, name, tensors):
        scale = 1 + self.gain[name]
        merged = {"weight": tensors["weight"] * scale[:, None]}
        if tensors.get("bias") is not None:
            merged["bias"] = tensors["bias"] * scale
        return merged

    def shadow_forward(self, pass_, name, x):
        """base(x) * (1 + g): adding a number saves nothing; the product saves each factor that the
        other's gradient needs."""
        y = pass_.leaf(self.base_layer, x)
        gain = pass_.parameter(self.gain[name])
        return pass_.mul(y, pass_.new(gain.shape, gain.dtype, gain.requires_grad))


def _example(k: int) -> ToyGainConfig:
    """Test voice ``k``: even voices scale queries, values and the mel projection, odd ones the
    attention outputs and the speaker projection; voice 3 only in the second block of each stack."""
    return ToyGainConfig(
        targets=["q_proj", "v_proj", "mel_proj"] if k % 2 == 0 else ["out_proj", "speaker_proj"],
        layers=[1] if k == 3 else None,
    )


register(
    Method(
        "toy",
        ToyGainConfig,
        ((nn.Linear, ToyGain),),
        learning_rate=1e-2,
        summary="a toy: a learned gain per output feature of a Linear",
        example=_example,
    )
)
