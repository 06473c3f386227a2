"""Log-mel features in the LJSpeech/HiFi-GAN convention, so third-party vocoders fit.

80 bins, n_fft 1024, hop 256, window 1024, fmin 0, fmax 8000, at 22,050 Hz; magnitude spectrum,
natural log clamped at 1e-5 (``log(max(x, 1e-5))``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import librosa
import numpy as np
import torch


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = 22_050
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-5

    def to_dict(self) -> dict:
        return asdict(self)


class MelSpectrogram(torch.nn.Module):
    """Waveform ``[batch, samples]`` (or ``[samples]``) -> log-mel ``[batch, frames, n_mels]``.

    Frames = samples // hop + 1 (centered STFT with reflect padding).
    """

    def __init__(self, config: MelConfig = MelConfig()):
        super().__init__()
        self.config = config
        basis = librosa.filters.mel(
            sr=config.sample_rate, n_fft=config.n_fft, n_mels=config.n_mels, fmin=config.fmin, fmax=config.fmax
        )
        self.register_buffer("mel_basis", torch.from_numpy(basis).float(), persistent=False)
        self.register_buffer("window", torch.hann_window(config.win_length), persistent=False)

    def magnitude(self, audio: torch.Tensor) -> torch.Tensor:
        """Linear magnitude spectrogram ``[batch, n_fft // 2 + 1, frames]``."""
        # Reflect padding needs more than n_fft // 2 samples and torch.stft raises below that; such
        # scraps of audio get zero padding instead, which keeps frames = samples // hop + 1.
        pad_mode = "reflect" if audio.shape[-1] > self.config.n_fft // 2 else "constant"
        spec = torch.stft(
            audio,
            self.config.n_fft,
            self.config.hop_length,
            self.config.win_length,
            self.window,
            center=True,
            pad_mode=pad_mode,
            return_complex=True,
        )
        return spec.abs()

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        squeeze = audio.dim() == 1
        if squeeze:
            audio = audio.unsqueeze(0)
        mel = torch.matmul(self.mel_basis, self.magnitude(audio.float()))
        log_mel = torch.log(torch.clamp(mel, min=self.config.log_floor)).transpose(1, 2)
        return log_mel[0] if squeeze else log_mel


def log_mel(audio: np.ndarray, config: MelConfig = MelConfig()) -> np.ndarray:
    """Convenience for one numpy waveform ``[samples]`` -> ``[frames, n_mels]`` float32."""
    with torch.no_grad():
        mel = MelSpectrogram(config)(torch.from_numpy(np.asarray(audio, dtype=np.float32)))
        return np.ascontiguousarray(mel.numpy())
