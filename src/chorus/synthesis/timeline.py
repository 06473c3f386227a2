"""Where each sentence goes in the answer: the silences between sentences, SSML breaks, and timestamps
shifted to where their sentence starts. The library and the server lay out every answer through here,
so the same text gives the same samples from ``chorus synthesize`` and from ``/v1/audio/speech``."""

from __future__ import annotations

import numbers

import numpy as np

from chorus.synthesis.result import SynthesisResult
from chorus.text.sentences import speech_pieces
from chorus.text.ssml import Pause
from chorus.text.timestamps import Timestamp

SENTENCE_SILENCE = 0.2  # seconds between sentences
# A longer pause is a mistake, not a choice, and each second of it is held in memory as samples (99,999 s: 8 GB).
MAX_SENTENCE_SILENCE = 10.0


def layout(
    text: str, max_chars: int = 300, sentence_silence: float = SENTENCE_SILENCE, skipped: list[str] | None = None
) -> list[str | Pause]:
    """What to read of ``text``, in order: its sentences (chunks of at most ``max_chars``) with a pause of
    ``sentence_silence`` seconds between two of them, and SSML ``<break>`` pauses in place of that
    silence where they stand (raises ``SsmlError`` for SSML it cannot follow). SSML elements Chorus does
    not follow are read as their text and chunks with nothing to say are left out
    (:func:`chorus.text.sentences.speech_pieces`): both named in ``skipped``, else warned of."""
    if isinstance(sentence_silence, bool) or not isinstance(sentence_silence, numbers.Real):
        raise TypeError(f"sentence_silence is a number of seconds, got {type(sentence_silence).__name__}")
    if not 0 <= sentence_silence <= MAX_SENTENCE_SILENCE:
        raise ValueError(f"sentence_silence must be 0 to {MAX_SENTENCE_SILENCE:g} seconds, got {sentence_silence}")
    parts: list[str | Pause] = []
    for piece in speech_pieces(text, max_chars, skipped):
        if isinstance(piece, str) and parts and isinstance(parts[-1], str) and sentence_silence:
            parts.append(Pause(sentence_silence))
        parts.append(piece)
    return parts


def silence(pause: Pause, rate: int) -> np.ndarray:
    """A pause as samples ``[samples]`` at ``rate``."""
    return np.zeros(pause.samples(rate), dtype=np.float32)


class Timeline:
    """An answer assembled in order: audio of sentences and pauses, each sentence's timestamps shifted to
    where it starts."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.parts: list[np.ndarray] = []
        self.words: list[Timestamp] = []
        self.phonemes: list[Timestamp] = []
        self.seconds = 0.0  # synthesis time of the sentences
        self.speaker = ""
        self._samples = 0

    def pause(self, pause: Pause) -> None:
        self._append(silence(pause, self.sample_rate))

    def sentence(self, result: SynthesisResult) -> None:
        shift = self._samples / self.sample_rate
        self.words += [w.shifted(shift) for w in result.words]
        self.phonemes += [p.shifted(shift) for p in result.phonemes]
        self.seconds += result.seconds
        self.speaker = result.speaker
        self._append(result.audio)

    def _append(self, audio: np.ndarray) -> None:
        self.parts.append(audio)
        self._samples += len(audio)

    def result(self, text: str = "") -> SynthesisResult:
        """Everything so far as one result."""
        audio = np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)
        return SynthesisResult(audio, self.sample_rate, self.seconds, self.speaker, self.words, self.phonemes, text)
