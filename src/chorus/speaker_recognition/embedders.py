"""Speaker embeddings of a recording's windows, by either encoder a speaker check can use: Chorus's own
(:mod:`chorus.speaker_recognition.bundle`) or resemblyzer's pretrained GE2E d-vector encoder (in its wheel).

A window embedding is a unit vector; a recording is scored from several windows (their mean, and each
window for the one-speaker check), so one loud word or one noisy second does not decide.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from chorus.audio.mel import log_mel
from chorus.evaluation.similarity import SpeakerJudge
from chorus.speaker_recognition.bundle import EncoderBundle

MIN_WINDOWS_SECONDS = 1.0  # shorter than this, a recording holds no window to embed


class WindowEmbedder(Protocol):
    """What a speaker check needs of an encoder."""

    name: str
    rate: int  # the sample rate it embeds at

    def windows(self, audio: np.ndarray) -> np.ndarray:
        """``[windows, D]`` unit embeddings of mono ``audio`` ``[samples]`` at ``rate``; ``ValueError``
        when it holds no speech to embed."""
        ...


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


class ResemblyzerEmbedder:
    """resemblyzer's partial utterances: 1.6 s windows at 50 % overlap, all from one forward pass, after
    its own preprocessing (volume to -30 dBFS, long silences cut by webrtcvad)."""

    name = "resemblyzer"
    rate = 16_000

    def __init__(self, device: str = "cpu"):
        self._judge = SpeakerJudge(device)

    def windows(self, audio: np.ndarray) -> np.ndarray:
        encoder = self._judge.encoder
        from resemblyzer import preprocess_wav

        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not np.any(audio):
            raise ValueError("no speech found in the recording (silent)")
        wav = preprocess_wav(audio, source_sr=None)
        if wav.size < MIN_WINDOWS_SECONDS * self.rate:
            raise ValueError("no speech found in the recording (silent or too short)")
        _, partials, _ = encoder.embed_utterance(wav, return_partials=True)
        return _unit(np.asarray(partials, dtype=np.float32))


class ChorusEmbedder:
    """Chorus's encoder on ``window_seconds`` windows every ``hop_seconds`` (one batch)."""

    def __init__(
        self, bundle: EncoderBundle, window_seconds: float = 3.0, hop_seconds: float = 1.5, name: str = "chorus"
    ):
        # The name keys its cohort embeddings and settings: another Chorus encoder ("chorus-v3") has its own.
        self.name = name
        self.bundle = bundle
        self.rate = bundle.mel_config.sample_rate
        self.window, self.hop = int(window_seconds * self.rate), int(hop_seconds * self.rate)

    @torch.no_grad()
    def windows(self, audio: np.ndarray) -> np.ndarray:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size < MIN_WINDOWS_SECONDS * self.rate or not np.any(audio):
            raise ValueError("no speech found in the recording (silent or too short)")
        starts = range(0, max(1, audio.size - self.window + self.hop), self.hop)
        clips = [audio[s : s + self.window] for s in starts if audio[s : s + self.window].size >= self.window // 2]
        mels = [torch.from_numpy(log_mel(clip, self.bundle.mel_config)) for clip in clips or [audio]]
        frames = max(m.shape[0] for m in mels)  # log_mel: [frames, n_mels]
        # Equal-length windows batch as they are; the last, shorter one is embedded alone (no padding
        # in the statistics pooling).
        encoder = self.bundle.encoder.eval()
        full = [m for m in mels if m.shape[0] == frames]
        rows = [encoder(torch.stack(full)).numpy()]
        rows += [encoder(m.unsqueeze(0)).numpy() for m in mels if m.shape[0] != frames]
        return _unit(np.concatenate(rows).astype(np.float32))
