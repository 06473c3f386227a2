"""Speaker similarity judge: cosine between resemblyzer d-vectors.

resemblyzer's pretrained GE2E speaker encoder ships inside its wheel (``pretrained.pt``), so
``VoiceEncoder("cpu")`` works offline. An utterance embedding is a unit-length 256-d vector; a
speaker is represented by the re-normalized mean of the embeddings of several real clips, which
is steadier than any single clip.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import soxr

from chorus.audio.io import SAMPLE_RATE

ENCODER_SAMPLE_RATE = 16_000
EMBEDDING_SIZE = 256


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two embeddings ``[256]``, in [-1, 1]."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def mean_embedding(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """The speaker d-vector ``[256]``: mean of utterance embeddings, scaled back to unit length."""
    if not len(embeddings):
        raise ValueError("no embeddings to average")
    mean = np.mean(np.stack(embeddings), axis=0)
    return (mean / np.linalg.norm(mean)).astype(np.float32)


class SpeakerJudge:
    """Speaker embeddings and similarities; the encoder loads on first use (17 MB, ~0.1 s)."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._encoder = None

    @property
    def encoder(self):
        """The ``resemblyzer.VoiceEncoder``, loaded once."""
        if self._encoder is None:
            with warnings.catch_warnings():
                # Deprecation notices from resemblyzer's own imports (webrtcvad's pkg_resources, for
                # which setuptools<81 is pinned; an old scipy.ndimage path) are noise to our users.
                warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
                warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"resemblyzer\.")
                from resemblyzer import VoiceEncoder

            self._encoder = VoiceEncoder(self.device, verbose=False)
        return self._encoder

    def embed(self, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """Unit-length d-vector ``[256]`` (float32) of mono audio ``[samples]`` at ``sample_rate``.

        Raises ValueError if nothing is left once long silences are removed.
        """
        encoder = self.encoder  # imports resemblyzer (and filters its import warning) first
        from resemblyzer import preprocess_wav

        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not np.any(audio):  # digital silence: resemblyzer's volume normalization would divide by zero
            raise ValueError("no speech found in the clip (silent or too short)")
        # Resample with soxr here rather than in preprocess_wav, which would go through librosa.
        if sample_rate != ENCODER_SAMPLE_RATE and audio.size:
            audio = soxr.resample(audio, sample_rate, ENCODER_SAMPLE_RATE, quality="HQ")
        # Already at 16 kHz (source_sr=None: no resampling), preprocess_wav still does what the
        # encoder was trained on: volume normalization to -30 dBFS, removal of long silences (webrtcvad).
        wav = preprocess_wav(audio, source_sr=None)
        if wav.size == 0:
            raise ValueError("no speech found in the clip (silent or too short)")
        return np.asarray(encoder.embed_utterance(wav), dtype=np.float32)

    similarity = staticmethod(cosine_similarity)

    def reference_embedding(self, reference_clips: Sequence[np.ndarray], sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """The speaker d-vector ``[256]`` of real clips (each ``[samples]`` at ``sample_rate``)."""
        return mean_embedding([self.embed(clip, sample_rate) for clip in reference_clips])

    def similarity_to_references(
        self, audio: np.ndarray, reference_clips: Sequence[np.ndarray], sample_rate: int = SAMPLE_RATE
    ) -> float:
        """Cosine of ``audio``'s d-vector to the mean d-vector of ``reference_clips`` (same rate)."""
        return cosine_similarity(self.embed(audio, sample_rate), self.reference_embedding(reference_clips, sample_rate))


class EncoderJudge:
    """The same judge's interface on Chorus's own speaker encoder (:mod:`chorus.speaker_recognition.bundle`):
    ``embed(audio, sample_rate)`` is its unit-length embedding; similarity is the cosine."""

    def __init__(self, bundle):
        self.bundle = bundle  # an EncoderBundle

    def embed(self, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not np.any(audio):
            raise ValueError("no speech found in the clip (silent or too short)")
        rate = self.bundle.mel_config.sample_rate
        if sample_rate != rate:
            audio = soxr.resample(audio, sample_rate, rate, quality="HQ")
        return self.bundle.embed([audio])[0]

    similarity = staticmethod(cosine_similarity)

    def reference_embedding(self, reference_clips: Sequence[np.ndarray], sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """The speaker's mean embedding of real clips (each ``[samples]`` at ``sample_rate``), unit length."""
        return mean_embedding([self.embed(clip, sample_rate) for clip in reference_clips])
