"""A posterior encoder for a Piper voice: a recording's latent ``z``, in the space the voice's decoder reads.

VITS trains a posterior encoder (``enc_q``: linear spectrogram -> WaveNet -> a Gaussian over ``z``) beside
the generator, and adapts a voice through it: the decoder learns to render the recording's own latent, and
the flow learns to carry that latent to the text's prior. Piper's export drops ``enc_q``, so Chorus makes
one per base voice by distillation (:mod:`chorus.training.piper_posterior`): the voice speaks sentences,
and the encoder learns to read back the latent each sentence was decoded from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from chorus.models.piper_vits import WaveNet

WEIGHTS, CONFIG = "posterior.safetensors", "posterior.json"


@dataclass(frozen=True)
class PosteriorConfig:
    """Sizes of a :class:`PosteriorEncoder` (VITS's are hidden 192, 16 layers, kernel 5)."""

    inter_channels: int  # the latent's channels: the generator's ``inter_channels``
    hop_length: int  # the generator's samples per latent frame
    n_fft: int = 1024  # Piper's filter_length and win_length
    hidden_channels: int = 192
    kernel_size: int = 5
    n_layers: int = 8  # half of VITS's: a receptive field of 33 frames, and half the CPU time

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1


def linear_spectrogram(audio: torch.Tensor, n_fft: int, hop_length: int) -> torch.Tensor:
    """VITS's input: audio ``[batch, samples]`` (a whole number of hops) -> magnitude ``[batch, n_fft/2+1,
    samples / hop]``, one column per latent frame (reflect-padded by ``(n_fft - hop) / 2`` each side and
    not centred, as VITS frames it)."""
    pad = (n_fft - hop_length) // 2
    padded = F.pad(audio[:, None], (pad, pad), mode="reflect")[:, 0]
    window = torch.hann_window(n_fft, device=audio.device, dtype=audio.dtype)
    spec = torch.stft(padded, n_fft, hop_length, n_fft, window, center=False, return_complex=True)
    return torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-6)


class PosteriorEncoder(nn.Module):
    """Audio -> a Gaussian over the latent each frame was decoded from (VITS's ``PosteriorEncoder``)."""

    def __init__(self, config: PosteriorConfig) -> None:
        super().__init__()
        self.config = config
        self.pre = nn.Conv1d(config.bins, config.hidden_channels, 1)
        self.enc = WaveNet(config.hidden_channels, config.kernel_size, 1, config.n_layers)
        self.proj = nn.Conv1d(config.hidden_channels, 2 * config.inter_channels, 1)

    def forward(
        self, audio: torch.Tensor, frame_lengths: torch.Tensor | None = None, sample: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """audio ``[batch, frames * hop]`` (zero past each item's frames), frame_lengths ``[batch]`` ->
        z, m, logs ``[batch, inter, frames]`` (z drawn from N(m, exp(logs)) unless ``sample`` is False,
        then z = m) and the frame mask ``[batch, 1, frames]``."""
        spec = linear_spectrogram(audio, self.config.n_fft, self.config.hop_length)
        frames = spec.shape[2]
        if frame_lengths is None:
            frame_lengths = torch.full((len(audio),), frames, device=audio.device)
        mask = (torch.arange(frames, device=audio.device)[None] < frame_lengths[:, None]).unsqueeze(1).to(spec)
        # log compresses the spectrogram's range; VITS feeds the magnitude as is and learns the same.
        hidden = self.enc(self.pre(torch.log(spec)) * mask, mask)
        m, logs = (self.proj(hidden) * mask).chunk(2, dim=1)
        z = (m + torch.randn_like(m) * torch.exp(logs)) * mask if sample else m
        return z, m, logs, mask

    def save(self, folder: str | Path, card: dict) -> Path:
        """Weights and sizes (``posterior.safetensors``, ``posterior.json`` with ``card``) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps({"config": asdict(self.config), **card}, indent=1) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> PosteriorEncoder:
        folder = Path(folder)
        meta = json.loads((folder / CONFIG).read_text())
        model = cls(PosteriorConfig(**meta["config"]))
        model.load_state_dict(load_file(folder / WEIGHTS))
        return model.eval()


__all__ = ["PosteriorConfig", "PosteriorEncoder", "linear_spectrogram"]
