"""Where a new voice starts, by Chorus's speaker encoder: the base speaker nearest the clips in the
encoder's space, and a speaker vector mapped from the clips' embedding into the base's speaker space.

The map is learned over the base's own speakers: each says ``SENTENCES`` through the base (Griffin-Lim),
the encoder embeds them, and a ridge regression (closed form; its strength chosen by leave-one-out
error over the speakers) maps a speaker's mean embedding ``[D]`` to its speaker vector
``[speaker_dim]``. A base has a few dozen speakers and the embedding ~128 numbers, so the regression
is under-determined without the ridge. The same space judges where the voice ended:
:func:`similarity_to_clips`, the adapted voice's speech against its own clips.

It sits above :mod:`chorus.synthesis` because the map is made by having the base speak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from chorus.adapters.layer import innermost
from chorus.audio.vocoders import load_vocoder
from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle
from chorus.speaker_recognition.bundle import EncoderBundle
from chorus.synthesis import Synthesizer

SENTENCES = (
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
)
RIDGES = (1e-3, 1e-2, 1e-1, 1.0, 10.0)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True).clip(min=1e-12)


@dataclass
class SpeakerMap:
    """The base's speakers in the encoder's space (``embeddings`` ``[K, D]``, unit rows) and the ridge
    map to their speaker vectors (``weights`` ``[D + 1, speaker_dim]``, the last row the bias)."""

    embeddings: np.ndarray
    weights: np.ndarray
    ridge: float
    leave_one_out_error: float  # mean squared error of a held-out speaker's vector, at ``ridge``

    def nearest(self, embedding: np.ndarray) -> int:
        """The base speaker whose embedding is closest (cosine) to ``embedding`` ``[D]``."""
        return int(np.argmax(self.embeddings @ _unit(embedding)))

    def vector(self, embedding: np.ndarray) -> np.ndarray:
        """The speaker vector ``[speaker_dim]`` the map puts ``embedding`` ``[D]`` at."""
        return (np.append(_unit(embedding), 1.0) @ self.weights).astype(np.float32)


def fit_speaker_map(embeddings: np.ndarray, vectors: np.ndarray, ridges: Sequence[float] = RIDGES) -> SpeakerMap:
    """Ridge regression from ``embeddings`` ``[K, D]`` to ``vectors`` ``[K, S]``, the strength chosen by
    leave-one-out error (the closed form: residual / (1 - leverage))."""
    embeddings = _unit(np.asarray(embeddings, dtype=np.float64))
    vectors = np.asarray(vectors, dtype=np.float64)
    if len(embeddings) < 2:
        raise ValueError(f"a speaker map needs at least 2 base speakers, got {len(embeddings)}")
    x = np.hstack([embeddings, np.ones((len(embeddings), 1))])
    best = None
    for ridge in ridges:
        penalty = ridge * np.eye(x.shape[1])
        penalty[-1, -1] = 0.0  # the bias is not shrunk
        inverse = np.linalg.inv(x.T @ x + penalty)
        weights = inverse @ x.T @ vectors
        leverage = np.einsum("ij,jk,ik->i", x, inverse, x)
        residual = (vectors - x @ weights) / (1 - leverage)[:, None].clip(min=1e-6)
        error = float(np.mean(residual**2))
        if best is None or error < best.leave_one_out_error:
            best = SpeakerMap(embeddings.astype(np.float32), weights.astype(np.float32), ridge, error)
    return best


def speaker_map(bundle: ModelBundle, encoder: EncoderBundle, sentences: Sequence[str] = SENTENCES) -> SpeakerMap:
    """The map of ``bundle``'s speakers through ``encoder`` (each speaker says ``sentences``)."""
    tts = Synthesizer(bundle, load_vocoder("griffin-lim", mel_config=bundle.mel_config))
    embeddings = []
    for speaker in range(len(bundle.speakers)):
        clips = [tts.synthesize(text, speaker) for text in sentences]
        rate = clips[0].sample_rate
        if rate != encoder.mel_config.sample_rate:
            raise ValueError(f"the encoder takes {encoder.mel_config.sample_rate} Hz audio, the base makes {rate} Hz")
        embeddings.append(_unit(encoder.embed([c.audio for c in clips]).mean(0)))
    with torch.no_grad():  # the table itself, under any adapter wrapping it
        vectors = innermost(bundle.model.speaker_embedding).weight.detach().cpu().numpy()
    return fit_speaker_map(np.stack(embeddings), vectors[: len(bundle.speakers)])


def similarity_to_clips(
    bundle: ModelBundle,
    model: AcousticModel,
    adapter: str,
    speaker: int,
    encoder: EncoderBundle,
    texts: Sequence[str],
    clips: Sequence[str | Path],
) -> float | None:
    """How close an adapted voice is to its own clips in the encoder's space: the cosine of the mean
    embedding of ``texts`` spoken by ``model`` with ``adapter`` active (base ``speaker`` underneath,
    Griffin-Lim) to the mean embedding of ``clips``. None where the encoder takes another sample rate."""
    if encoder.mel_config.sample_rate != bundle.mel_config.sample_rate or not texts or not clips:
        return None
    tts = Synthesizer(replace(bundle, model=model), load_vocoder("griffin-lim", mel_config=bundle.mel_config))
    tts.voices["adapted"] = (model, adapter)  # the voice as it is in memory, not reloaded from disk
    spoken = encoder.embed([tts.synthesize(text, speaker, voice="adapted").audio for text in texts]).mean(0)
    return float(_unit(spoken) @ _unit(encoder.embed(list(clips)).mean(0)))
