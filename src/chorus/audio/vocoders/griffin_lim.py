"""Griffin-Lim: the vocoder that needs no weights, so it is always available.

1. log-mel -> linear magnitude: the pseudo-inverse of the mel filterbank, clamped at 0, then a few
   projected-gradient steps on ``min ||M S - mel||^2, S >= 0``. The clamp alone leaves a visible mel
   mismatch (the pseudo-inverse has negative lobes); the steps cost a few 80 x 513 matmuls.
2. Optional sharpening ``S ** power`` with each frame's energy kept.
3. magnitude -> waveform: fast Griffin-Lim (Perraudin, Balazs & Sondergaard, 2013, "A fast
   Griffin-Lim algorithm"), momentum 0.99, starting from zero phase so output is deterministic.

Each iteration is one inverse STFT and one STFT. The inverse is a hand-written overlap-add because
``torch.istft`` recomputes its window envelope every call and is ~3x slower on CPU here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chorus.audio.mel import MelConfig, MelSpectrogram
from chorus.audio.vocoders.base import Vocoder, register_vocoder


@dataclass(frozen=True)
class GriffinLimConfig:
    """``n_iter``: phase iterations; about 0.7 ms each per 3 s of audio on one core, and quality
    stops improving noticeably past ~32 with momentum. ``momentum``: 0 is plain Griffin-Lim.
    ``nnls_iter``: magnitude refinement steps (0 keeps the clamped pseudo-inverse).
    ``power``: magnitude exponent; 1.2-1.5 sharpens harmonics of over-smoothed *predicted* mels
    (Tacotron used 1.5) but moves the output away from ground-truth mels, hence off by default."""

    n_iter: int = 32
    momentum: float = 0.99
    nnls_iter: int = 10
    power: float = 1.0


@register_vocoder("griffin-lim")
class GriffinLim(Vocoder):
    """Log-mel ``[batch, frames, n_mels]`` -> audio ``[batch, frames * hop_length]``, no weights."""

    config_class = GriffinLimConfig
    needs_weights = False

    def __init__(self, config: GriffinLimConfig = GriffinLimConfig(), mel_config: MelConfig = MelConfig()):
        super().__init__(config, mel_config)
        # The exact filterbank the features were made with, so inversion matches them.
        basis = MelSpectrogram(mel_config).mel_basis
        self.register_buffer("mel_basis", basis, persistent=False)
        self.register_buffer("mel_pinv", torch.linalg.pinv(basis), persistent=False)
        # 1 / Lipschitz constant of the least-squares gradient: the largest step that never overshoots.
        self.nnls_step = 1.0 / float(torch.linalg.matrix_norm(basis, ord=2) ** 2)
        n_fft, win_length = mel_config.n_fft, mel_config.win_length
        left = (n_fft - win_length) // 2  # torch.stft centers a short window the same way
        window = F.pad(torch.hann_window(win_length), (left, n_fft - win_length - left))
        self.register_buffer("window", window, persistent=False)

    def magnitude(self, log_mel: torch.Tensor) -> torch.Tensor:
        """``log_mel [batch, frames, n_mels]`` -> linear magnitude ``[batch, n_fft // 2 + 1, frames]``."""
        mel = log_mel.float().exp().transpose(1, 2)
        spec = (self.mel_pinv @ mel).clamp(min=0)
        for _ in range(self.config.nnls_iter):
            gradient = self.mel_basis.T @ (self.mel_basis @ spec - mel)
            spec = (spec - self.nnls_step * gradient).clamp(min=0)
        if self.config.power != 1.0:
            sharp = spec.pow(self.config.power)
            energy_ratio = spec.square().sum(1, keepdim=True) / sharp.square().sum(1, keepdim=True).clamp(min=1e-20)
            spec = sharp * energy_ratio.sqrt()
        return spec

    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        magnitude = self.magnitude(log_mel)
        frames, hop = magnitude.shape[-1], self.mel_config.hop_length
        # Window-squared overlap-add, the inverse STFT's normaliser; None selects torch.istft.
        envelope = (None if self.mel_config.n_fft % hop
                    else self._overlap_add(self.window.square().expand(1, frames, -1))[0])
        # Iterate on (frames - 1) * hop samples: the length whose centered STFT has exactly `frames` frames.
        inner_length = (frames - 1) * hop
        phase = torch.ones_like(magnitude, dtype=torch.complex64)
        previous = torch.zeros_like(phase)
        # Perraudin's t_n = c_n + a (c_n - c_{n-1}) divided by (1 + a): same phase, as librosa writes it.
        beta = self.config.momentum / (1.0 + self.config.momentum)
        for _ in range(self.config.n_iter):
            rebuilt = self._stft(self._istft(magnitude * phase, envelope, inner_length))
            phase = torch.sgn(rebuilt - beta * previous)
            previous = rebuilt
        return self._istft(magnitude * phase, envelope, frames * hop)

    def _stft(self, audio: torch.Tensor) -> torch.Tensor:
        """``[batch, samples]`` -> complex ``[batch, n_fft // 2 + 1, samples // hop + 1]``."""
        # Zero padding rather than reflect: also works for clips shorter than half a window.
        return torch.stft(audio, self.mel_config.n_fft, self.mel_config.hop_length, window=self.window,
                          center=True, pad_mode="constant", return_complex=True)

    def _istft(self, spec: torch.Tensor, envelope: torch.Tensor | None, length: int) -> torch.Tensor:
        """Complex ``[batch, n_fft // 2 + 1, frames]`` -> ``[batch, length]``, as ``torch.istft(center=True)``."""
        n_fft = self.mel_config.n_fft
        if envelope is None:
            return torch.istft(spec, n_fft, self.mel_config.hop_length, window=self.window, center=True,
                               length=length)
        frames = torch.fft.irfft(spec.transpose(1, 2), n=n_fft) * self.window
        start = n_fft // 2
        return self._overlap_add(frames)[:, start:start + length] / envelope[start:start + length].clamp(min=1e-11)

    def _overlap_add(self, frames: torch.Tensor) -> torch.Tensor:
        """``[batch, count, n_fft]`` -> ``[batch, (count - 1) * hop + n_fft]``; needs hop | n_fft.

        Cutting each frame into n_fft / hop chunks turns overlap-add into that many shifted adds.
        """
        hop = self.mel_config.hop_length
        overlap = self.mel_config.n_fft // hop
        batch, count = frames.shape[:2]
        chunks = frames.reshape(batch, count, overlap, hop)
        signal = frames.new_zeros(batch, count + overlap - 1, hop)
        for k in range(overlap):
            signal[:, k:k + count] += chunks[:, :, k]
        return signal.flatten(1)
