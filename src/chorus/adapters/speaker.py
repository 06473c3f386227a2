"""Speaker projection: a new voice as one learned speaker vector (and optionally a projection update).

The base model conditions every layer on ``speaker_proj(speaker vector)``. A voice adapted this way
replaces the embedding-table lookup by its own vector (``speaker_dim`` numbers, 64 in the shipped
base); with ``train_projection`` it also learns a full-rank delta of ``speaker_proj``. Every Chorus
voice carries such a vector (it is the voice's conditioning); with other methods it stays fixed at
its starting value (``train_vector=False``), the closest speaker's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register


@dataclass
class SpeakerConfig(MethodConfig):
    """train_vector: learn the voice's speaker vector; train_projection: also learn a delta of the
    projection from speaker vectors to the model width (more capacity, ``speaker_dim x d_model`` more
    numbers)."""

    method = "speaker"
    targets: str | list[str] | None = field(
        default=None,
        metadata={"help": f"{TARGETS_HELP}; default: speaker_embedding, and speaker_proj with train_projection"},
    )
    train_vector: bool = field(
        default=True,
        metadata={
            "help": "learn the voice's speaker vector (else it stays at its starting value, the closest speaker's)"
        },
    )
    train_projection: bool = field(
        default=False,
        metadata={"help": "also learn a delta of the speaker projection (speaker_dim x d_model more numbers)"},
    )

    def __post_init__(self) -> None:
        if self.targets is None:
            self.targets = ["speaker_embedding"] + (["speaker_proj"] if self.train_projection else [])
        super().__post_init__()

    def trains(self) -> bool:
        return self.train_vector or self.train_projection


class SpeakerVector(AdapterLayer):
    """Wraps the speaker embedding table: with a voice active, every row gets the voice's vector."""

    method = "speaker"
    adapter_attributes = ("speaker_vector",)

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.speaker_vector = nn.ParameterDict()

    def add(self, name: str, config: SpeakerConfig) -> None:
        self.configs[name] = config
        table = innermost(self).weight
        # Start from the average speaker; trainers may overwrite it with the closest speaker's vector.
        self.speaker_vector[name] = nn.Parameter(table.detach().mean(0).clone())

    def adapter_parameters(self, name):
        config = self.configs.get(name)
        return super().adapter_parameters(name) if config is None or config.train_vector else []

    def forward_with(self, name, ids: torch.Tensor) -> torch.Tensor:
        """ids ``[batch]`` (ignored) -> ``[batch, speaker_dim]``."""
        vector = self.speaker_vector[name]
        return vector.expand(*ids.shape, vector.shape[-1])

    def forward_bank(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``[batch]`` -> ``[batch, speaker_dim]``: the sample's voice vector, or the table row where
        the sample's voice has none."""
        slot, used = self.bank.route(self.bank_index, ids.shape[0])
        vector = self.bank["speaker_vector"][slot]  # [batch, speaker_dim]
        vector = vector.view(ids.shape[0], *[1] * (ids.dim() - 1), -1).expand(*ids.shape, -1)
        return torch.where(used.view(-1, *[1] * ids.dim()), vector, self.base_layer(ids))

    def shadow_forward(self, pass_, name, ids):
        """ids ``[batch]`` -> ``[batch, speaker_dim]``: the voice's vector expanded, a view of the
        parameter (what reads it saves no activation); the embedding table is not read at all."""
        vector = pass_.parameter(self.speaker_vector[name])
        return vector.view(*ids.shape, vector.shape[-1])


class ProjectionDelta(AdapterLayer):
    """A full-rank additive update of a Linear layer (weight and bias), zero at first; mergeable."""

    method = "speaker"
    adapter_attributes = ("projection_weight_delta", "projection_bias_delta")
    mergeable = True

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.projection_weight_delta = nn.ParameterDict()
        self.projection_bias_delta = nn.ParameterDict()

    def add(self, name: str, config: SpeakerConfig) -> None:
        self.configs[name] = config
        base = innermost(self)
        self.projection_weight_delta[name] = nn.Parameter(torch.zeros_like(base.weight))
        self.projection_bias_delta[name] = nn.Parameter(torch.zeros_like(base.bias))

    def forward_with(self, name, x: torch.Tensor) -> torch.Tensor:
        """x ``[..., in]`` -> ``[..., out]``."""
        return self.base_layer(x) + x @ self.projection_weight_delta[name].T + self.projection_bias_delta[name]

    def forward_bank(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[batch, ..., in]`` -> ``[batch, ..., out]`` with each sample's weight and bias delta."""
        y = self.base_layer(x)
        batch = x.shape[0]
        slot, used = self.bank.route(self.bank_index, batch)
        keep = used.to(x.dtype)[:, None]  # zeroed deltas give base rows +0
        weight = self.bank["projection_weight_delta"][slot] * keep[:, None]  # [batch, out, in]
        bias = (self.bank["projection_bias_delta"][slot] * keep).unsqueeze(1)  # [batch, 1, out]
        delta = torch.baddbmm(bias, x.reshape(batch, -1, x.shape[-1]), weight.transpose(1, 2))  # [batch, n, out]
        return y + delta.view(y.shape)

    def merged_base_tensors(self, name, tensors):
        return {
            "weight": tensors["weight"] + self.projection_weight_delta[name],
            "bias": tensors["bias"] + self.projection_bias_delta[name],
        }

    def shadow_forward(self, pass_, name, x):
        """x ``[..., in]`` -> ``[..., out]``: base(x) + x @ W_delta.T + b_delta."""
        delta = pass_.matmul_transposed(x, self.projection_weight_delta[name])
        delta = pass_.elementwise(delta, pass_.parameter(self.projection_bias_delta[name]))
        return pass_.elementwise(pass_.leaf(self.base_layer, x), delta)


def _example(k: int) -> SpeakerConfig:
    """Test voice ``k``: even voices also learn the projection; voice 4 keeps its vector fixed."""
    return SpeakerConfig(train_projection=k % 2 == 0, train_vector=k != 4)


register(
    Method(
        "speaker",
        SpeakerConfig,
        ((nn.Embedding, SpeakerVector), (nn.Linear, ProjectionDelta)),
        learning_rate=1e-2,
        summary="a new speaker vector (optionally a projection update)",
        example=_example,
    )
)
