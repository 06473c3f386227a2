"""Chorus's own speaker encoder: log-mels -> a unit-length speaker embedding.

    log-mel [batch, frames, n_mels] -> [batch, 1, n_mels, frames]
      -> stem conv -> stage 1 .. stage 4 (each: a strided transition conv, then residual blocks)
      -> [batch, C * n_mels / 8, frames / 8] -> attentive statistics pooling -> linear -> embedding

Two trunks ("Memory-Efficient Training for Deep Speaker Embedding Learning", Liu et al.):

* ``resnet``: basic residual blocks (two 3x3 convs), ``depth`` 10, 18, 34 or 50 (blocks per stage
  from :data:`STAGE_BLOCKS`; 50 is ResNet-34's layout with more blocks in the third stage, not
  ResNet-50's bottlenecks);
* ``df-resnet``: depth first (DF-ResNet): more, cheaper blocks (1x1 expand, depthwise 3x3, 1x1
  project), ``depth`` 56, 110 or 179.

``reversible`` makes every stage's blocks a reversible coupling (:mod:`chorus.models.reversible`):
the channels split in two halves, ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)``, F and G each a block of
the trunk on half the channels; backward recomputes the blocks' inputs from their outputs, so a
stage keeps only its output (one tensor, which the next layer saves as its input too: stored once):
activation memory does not grow with the number of blocks. Only the
transitions (which change the shape) keep theirs. Normalization is GroupNorm in every variant: it
has no running statistics, so recomputing a block in backward computes exactly what forward did
(BatchNorm would update its statistics twice), and one choice for all keeps the comparison fair.

Training head: additive angular margin softmax (AAM, ArcFace): ``s * cos(theta + m)`` for the true
speaker, ``s * cos(theta)`` for the others. A trained encoder is saved, loaded and used to embed
clips by :mod:`chorus.speaker_recognition.bundle`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.reversible import reversible_halves

STAGE_BLOCKS = {
    "resnet": {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 14, 3)},
    "df-resnet": {56: (3, 3, 9, 3), 110: (3, 3, 27, 3), 179: (3, 3, 51, 3)},
}


@dataclass
class SpeakerEncoderConfig:
    """Sizes of the speaker encoder. ``channels``: the four stages' widths (even: a reversible stage
    splits them in two); ``groups``: GroupNorm groups (dividing every width, and every half-width)."""

    arch: str = "resnet"
    depth: int = 18
    reversible: bool = False
    channels: tuple[int, int, int, int] = (16, 32, 64, 128)
    embedding_dim: int = 128
    n_mels: int = 80
    groups: int = 4
    pooling_hidden: int = 128

    def __post_init__(self) -> None:
        self.channels = tuple(self.channels)
        if self.arch not in STAGE_BLOCKS:
            raise ValueError(f"unknown speaker encoder arch {self.arch!r}; known: {', '.join(STAGE_BLOCKS)}")
        if self.depth not in STAGE_BLOCKS[self.arch]:
            depths = ", ".join(map(str, STAGE_BLOCKS[self.arch]))
            raise ValueError(f"{self.arch} depth {self.depth} is not one of {depths}")
        if len(self.channels) != 4 or any(c <= 0 or c % (2 * self.groups) for c in self.channels):
            raise ValueError(
                f"channels {self.channels}: four stage widths, each a multiple of 2 x groups ({2 * self.groups})"
            )
        if self.n_mels % 8:
            raise ValueError(f"n_mels must be a multiple of 8 (three stride-2 transitions), got {self.n_mels}")

    @property
    def stage_blocks(self) -> tuple[int, ...]:
        return STAGE_BLOCKS[self.arch][self.depth]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["channels"] = list(self.channels)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SpeakerEncoderConfig:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown SpeakerEncoderConfig fields: {sorted(unknown)}")
        return cls(**data)


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels)


class BasicBranch(nn.Module):
    """conv3x3 -> norm -> ReLU -> conv3x3 -> norm, ``[batch, C, F, T]`` in and out (a ResNet block's residual)."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = _norm(channels, groups)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = _norm(channels, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))


class DepthFirstBranch(nn.Module):
    """1x1 expand (2x) -> depthwise 3x3 -> 1x1 project, each normalized: a cheap block, so depth is
    spent instead of width (DF-ResNet). ``[batch, C, F, T]`` in and out."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        hidden = 2 * channels
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.norm1 = _norm(hidden, groups)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.norm2 = _norm(hidden, groups)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.norm3 = _norm(channels, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.expand(x)))
        x = F.relu(self.norm2(self.depthwise(x)))
        return self.norm3(self.project(x))


BRANCHES = {"resnet": BasicBranch, "df-resnet": DepthFirstBranch}


class ResidualBlock(nn.Module):
    """``relu(x + branch(x))``."""

    def __init__(self, arch: str, channels: int, groups: int):
        super().__init__()
        self.branch = BRANCHES[arch](channels, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.branch(x))


class ReversibleBlock(nn.Module):
    """F and G of a reversible coupling, each a branch of the trunk on half the channels."""

    def __init__(self, arch: str, channels: int, groups: int):
        super().__init__()
        self.branch_f = BRANCHES[arch](channels // 2, groups)
        self.branch_g = BRANCHES[arch](channels // 2, groups)

    def f(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch_f(x)

    def g(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch_g(x)


class Stage(nn.Module):
    """A strided transition (the shape changes: its activations are kept) and ``blocks`` blocks at one width."""

    def __init__(self, arch: str, in_channels: int, channels: int, blocks: int, stride: int, groups: int, rev: bool):
        super().__init__()
        self.transition = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False),
            _norm(channels, groups),
            nn.ReLU(),
        )
        block = ReversibleBlock if rev else ResidualBlock
        self.blocks = nn.ModuleList(block(arch, channels, groups) for _ in range(blocks))
        self.reversible = rev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.transition(x)
        if not self.reversible:
            for block in self.blocks:
                x = block(x)
            return x
        return reversible_halves(tuple(self.blocks), x, dim=1)


class AttentiveStatisticsPooling(nn.Module):
    """Attention weights over time, then the weighted mean and standard deviation of every channel:
    ``[batch, channels, frames]`` -> ``[batch, 2 * channels]`` (Okabe et al. 2018)."""

    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.attention = nn.Sequential(nn.Conv1d(channels, hidden, 1), nn.Tanh(), nn.Conv1d(hidden, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.attention(x), dim=-1)
        mean = (weights * x).sum(-1)
        variance = (weights * x.pow(2)).sum(-1) - mean.pow(2)
        return torch.cat([mean, variance.clamp(min=1e-6).sqrt()], dim=1)


class SpeakerEncoder(nn.Module):
    """Log-mels ``[batch, frames, n_mels]`` -> unit-length embeddings ``[batch, embedding_dim]``."""

    def __init__(self, config: SpeakerEncoderConfig):
        super().__init__()
        self.config = config
        c = config.channels
        self.stem = nn.Sequential(nn.Conv2d(1, c[0], 3, padding=1, bias=False), _norm(c[0], config.groups), nn.ReLU())
        strides = (1, 2, 2, 2)
        inputs = (c[0], *c[:3])
        self.stages = nn.ModuleList(
            Stage(config.arch, i, o, n, s, config.groups, config.reversible)
            for i, o, n, s in zip(inputs, c, config.stage_blocks, strides)
        )
        pooled = c[3] * (config.n_mels // 8)
        self.pooling = AttentiveStatisticsPooling(pooled, config.pooling_hidden)
        self.embedding = nn.Linear(2 * pooled, config.embedding_dim)
        # Centred over the batch (running statistics at inference), as ECAPA-TDNN's last batch norm: the
        # pooled statistics of ReLU features share one large positive direction, so without it every
        # clip's embedding starts at cosine ~0.99 to every other's (measured, ResNet-18 at init) and the
        # AAM loss sat at chance over 600 steps at 252 speakers.
        self.center = nn.BatchNorm1d(config.embedding_dim, affine=False)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        mel = mel - mel.mean(dim=1, keepdim=True)  # each clip's mean spectrum out: the channel, not the voice
        x = self.stem(mel.transpose(1, 2).unsqueeze(1))  # [batch, C, n_mels, frames]
        for stage in self.stages:
            x = stage(x)
        x = x.flatten(1, 2)  # [batch, C * n_mels / 8, frames / 8]
        return F.normalize(self.center(self.embedding(self.pooling(x))), dim=-1)


class AdditiveAngularMargin(nn.Module):
    """AAM softmax head: logits ``scale * cos(theta + margin)`` for the true class, ``scale * cos(theta)``
    for the rest; embeddings ``[batch, dim]`` (unit length), labels ``[batch]`` -> loss (mean CE)."""

    def __init__(self, dim: int, n_classes: int, margin: float = 0.2, scale: float = 30.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_classes, dim) * 0.01)
        self.margin, self.scale = margin, scale

    def logits(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        cosine = F.linear(embeddings, F.normalize(self.weight, dim=-1)).clamp(-1 + 1e-7, 1 - 1e-7)
        if labels is None:
            return self.scale * cosine
        target = torch.cos(torch.acos(cosine.gather(1, labels[:, None])) + self.margin)
        return self.scale * cosine.scatter(1, labels[:, None], target)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(embeddings, labels), labels)


class SpeakerClassifier(nn.Module):
    """What one training step runs: the encoder and its AAM head, log-mels ``[batch, frames, n_mels]``
    and speaker labels ``[batch]`` -> the loss (a scalar)."""

    def __init__(self, encoder: SpeakerEncoder, n_speakers: int, margin: float = 0.2, scale: float = 30.0):
        super().__init__()
        self.encoder = encoder
        self.head = AdditiveAngularMargin(encoder.config.embedding_dim, n_speakers, margin, scale)

    def forward(self, mel: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(mel), labels)
