"""A small Vocos vocoder (Siuzdak, 2023, "Vocos: closing the gap between time-domain and
Fourier-based neural vocoders"), sized for CPU.

The network never runs at audio rate: a ConvNeXt stack works on mel frames and a linear head
predicts, per frame, the STFT's log-magnitude and phase for ``n_fft // 2 + 1`` bins; one
``torch.istft`` makes the waveform. That is why it is ~100x cheaper than HiFi-GAN-like upsamplers.
Phase is predicted as an angle and used through cos/sin, so its 2-pi wrap costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from chorus.audio.mel import MelConfig
from chorus.audio.vocoders.base import Vocoder, register_vocoder


@dataclass(frozen=True)
class VocosConfig:
    """Default: ~2.1M parameters. The original Vocos is dim 512 / intermediate 1536 (13.5M)."""

    dim: int = 192
    intermediate_dim: int = 576
    num_layers: int = 8
    kernel_size: int = 7
    # exp() of the predicted log-magnitude is capped: an early huge prediction would otherwise
    # produce inf audio and NaN gradients.
    max_magnitude: float = 100.0


class ConvNeXtBlock(nn.Module):
    """``[batch, dim, frames]`` -> same: depthwise conv (time context), then a per-frame MLP."""

    def __init__(self, dim: int, intermediate_dim: int, kernel_size: int, layer_scale: float):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        # Small residual scale at init keeps the deep stack close to identity early in training.
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)  # [batch, frames, dim]
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).transpose(1, 2)


@register_vocoder("vocos")
class Vocos(Vocoder):
    """Log-mel ``[batch, frames, n_mels]`` -> audio ``[batch, frames * hop_length]``."""

    config_class = VocosConfig

    def __init__(self, config: VocosConfig = VocosConfig(), mel_config: MelConfig = MelConfig()):
        super().__init__(config, mel_config)
        dim = config.dim
        self.embed = nn.Conv1d(mel_config.n_mels, dim, config.kernel_size, padding=config.kernel_size // 2)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.ModuleList(
            ConvNeXtBlock(dim, config.intermediate_dim, config.kernel_size, 1.0 / config.num_layers)
            for _ in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, mel_config.n_fft + 2)  # log-magnitude and phase, n_fft // 2 + 1 each
        self.register_buffer("window", torch.hann_window(mel_config.win_length), persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # As the reference implementation: truncated normal, std 0.02, for convs and linears.
        if isinstance(module, (nn.Conv1d, nn.Linear)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    def spectrum(self, log_mel: torch.Tensor) -> torch.Tensor:
        """``log_mel [batch, frames, n_mels]`` -> complex STFT ``[batch, n_fft // 2 + 1, frames]``."""
        x = self.embed(log_mel.transpose(1, 2))  # [batch, dim, frames]
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        log_magnitude, phase = self.head(self.final_norm(x.transpose(1, 2))).transpose(1, 2).chunk(2, dim=1)
        magnitude = log_magnitude.exp().clamp(max=self.config.max_magnitude)
        return torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))

    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        spec = self.spectrum(log_mel)
        m = self.mel_config
        return torch.istft(
            spec, m.n_fft, m.hop_length, m.win_length, self.window, center=True, length=spec.shape[-1] * m.hop_length
        )
