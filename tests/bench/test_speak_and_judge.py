"""bench/base.py's speak_and_judge, which the adaptation, many-voice and voice-space benchmarks share: each
utterance is read in the voice given, timed, and judged against its own recording only when asked."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from base import speak_and_judge  # noqa: E402
from chorus.evaluation.report import Judges  # noqa: E402

RATE = 16_000


def tone(hz: float) -> np.ndarray:
    t = np.arange(RATE) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


class Reader:
    """A stand-in for a Synthesizer: a tone per sentence, and which voice each was read in."""

    def __init__(self):
        self.voices = []

    def synthesize(self, text: str, voice: str):
        self.voices.append(voice)
        return SimpleNamespace(audio=tone(150.0), sample_rate=RATE, seconds=0.25)


def test_each_utterance_is_read_in_the_voice_and_judged_against_its_recording_when_asked(tmp_path):
    evaluation = []
    for key in ("a", "b"):
        path = tmp_path / f"{key}.wav"
        sf.write(path, tone(160.0), RATE)
        evaluation.append(SimpleNamespace(text=f"sentence {key}", audio_path=path))
    judges = Judges(whisper=None, speaker=None, naturalness=None, f0_method="dio")
    reader = Reader()

    report = speak_and_judge(reader, "v", evaluation, [], judges, against_recordings=True)
    assert reader.voices == ["v", "v"]
    assert [row.id for row in report.rows] == ["a", "b"]
    assert all(row.rtf == pytest.approx(0.25) for row in report.rows)
    assert all(row.f0_rmse_hz == pytest.approx(10.0, abs=1.0) for row in report.rows)

    plain = speak_and_judge(Reader(), "v", evaluation, [], judges)
    assert all(row.mcd_db is None and row.f0_rmse_hz is None for row in plain.rows)
