"""Speaking rate and real-time factor.

The rate is measured over the speech itself: leading and trailing silence (``SILENCE_TOP_DB`` below
the peak) is trimmed first, so models that pad differently compare fairly. Words are counted in the
spoken form (``normalize_for_scoring``: "42" is two words), phonemes in espeak-ng's IPA for the text.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np

from chorus.audio.io import SAMPLE_RATE
from chorus.evaluation.asr import normalize_for_scoring
from chorus.evaluation.features import trim_silence
from chorus.text.normalize import normalize_text
from chorus.text.phonemize import phonemize

# espeak-ng writes diphthongs and affricates as two letters; each is one phoneme.
_phoneme_re = re.compile(r"aɪ|aʊ|eɪ|oʊ|ɔɪ|əʊ|tʃ|dʒ|.")


@dataclass(frozen=True)
class SpeakingRate:
    """Counts over ``speech_seconds`` of trimmed audio, and the rates they give."""

    words: int
    phonemes: int
    speech_seconds: float

    @property
    def words_per_second(self) -> float:
        return self.words / self.speech_seconds if self.speech_seconds else float("nan")

    @property
    def phonemes_per_second(self) -> float:
        return self.phonemes / self.speech_seconds if self.speech_seconds else float("nan")


def speech_duration(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Seconds of mono audio ``[samples]`` from the first to the last non-silent frame."""
    return len(trim_silence(audio, sample_rate)) / sample_rate


def count_phonemes(text: str) -> int:
    """Phonemes in espeak-ng's en-us IPA for ``text`` (normalized first); stress, length and
    other modifier marks, diacritics, punctuation and spaces are not phonemes."""
    ipa = phonemize([normalize_text(text, warn=False)])[0]
    # Letters only: modifier letters (ˈ ˌ ː ʰ ʲ ʷ) have category Lm, combining diacritics M*.
    letters = "".join(c for c in ipa if unicodedata.category(c) in ("Ll", "Lu", "Lo"))
    return len(_phoneme_re.findall(letters))


def speaking_rate(audio: np.ndarray, text: str, sample_rate: int = SAMPLE_RATE) -> SpeakingRate:
    """Words and phonemes per second of speech for a clip ``[samples]`` that says ``text``."""
    return SpeakingRate(
        words=len(normalize_for_scoring(text).split()),
        phonemes=count_phonemes(text),
        speech_seconds=speech_duration(audio, sample_rate),
    )


def real_time_factor(synthesis_seconds: float, audio_seconds: float) -> float:
    """Seconds of compute per second of audio produced; below 1 is faster than real time."""
    if audio_seconds <= 0:
        raise ValueError(f"audio_seconds must be positive, got {audio_seconds}")
    return synthesis_seconds / audio_seconds
