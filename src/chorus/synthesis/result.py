"""What synthesis gives back: audio with its sample rate, timing, and word and phoneme timestamps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chorus.atomic import atomic_write
from chorus.audio.encode import encode_whole, format_for, format_named
from chorus.text.timestamps import Timestamp


# eq=False: two results are compared by their audio (np.array_equal(a.audio, b.audio)), which == on arrays cannot.
@dataclass(eq=False)
class SynthesisResult:
    """Speech made from ``text``: ``audio`` ``[samples]`` float32 in [-1, 1] at ``sample_rate`` Hz (the
    base's), by ``speaker`` (the name of who spoke: a speaker, a blend or an adapted voice); ``seconds`` the
    wall time spent making it (compute, not the audio's length: that is :attr:`duration`); ``words`` and
    ``phonemes`` the start and end of each, in seconds from the start of the audio, from the durations the
    model predicted."""

    audio: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate: int
    seconds: float  # wall time spent synthesizing
    speaker: str
    words: list[Timestamp] = field(default_factory=list)  # start/end of every spoken word
    phonemes: list[Timestamp] = field(default_factory=list)  # start/end of every phoneme symbol
    text: str = ""

    def to_bytes(self, audio_format: str = "wav", sample_rate: int | None = None) -> bytes:
        """The audio as one file of ``audio_format`` (wav, flac, mp3, opus, aac, pcm; any case, or a suffix
        such as "ogg"), at ``sample_rate`` (default: the model's; Opus takes 8-48 kHz in five steps)."""
        return encode_whole(self.audio, self.sample_rate, format_named(audio_format), sample_rate)

    def save(self, path: str | Path, audio_format: str | None = None, sample_rate: int | None = None) -> Path:
        """Write the audio to ``path``, in ``audio_format`` or the one its suffix names; returns the path."""
        path = Path(path)
        data = self.to_bytes(format_for(path, audio_format), sample_rate)
        atomic_write(path, lambda temp: Path(temp).write_bytes(data))
        return path

    to_file = save

    @property
    def duration(self) -> float:
        """The audio's length in seconds."""
        return len(self.audio) / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Synthesis time / audio duration; below 1 is faster than real time."""
        return self.seconds / max(self.duration, 1e-9)
