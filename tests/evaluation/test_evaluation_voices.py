"""Judging voices side by side (the core of `chorus demo` and bench/base.py)."""

from __future__ import annotations

import math

import numpy as np

from chorus.audio.io import load_audio
from chorus.evaluation.similarity import SpeakerJudge
from chorus.evaluation.voices import VoiceClip, same_versus_different, synthesize_grid


def test_same_voice_is_more_alike_than_different_voices_and_silence_is_left_out(two_voice_corpus):
    clips = []
    for voice in ("m3", "f2"):
        for index in range(3):
            audio = load_audio(two_voice_corpus / voice / "wavs" / f"u{index}.wav")
            clips.append(VoiceClip(voice, index, "", audio, 22_050, 0.1))
    clips.append(VoiceClip("m3", 9, "", np.zeros(22_050, dtype=np.float32), 22_050, 0.1))
    result = same_versus_different(clips, SpeakerJudge())
    assert result.voices == ["f2", "m3"]
    assert result.same > result.different + 0.1
    assert result.silent_clips == 1
    assert math.isclose(result.matrix[0, 1], result.matrix[1, 0])


def test_synthesize_grid_covers_every_voice_and_sentence():
    def speak(text, voice):
        return np.full(100, len(voice), dtype=np.float32), 22_050, 0.01

    clips = synthesize_grid(speak, ["a", "bb"], ["one", "two", "three"], progress=False)
    assert [(c.voice, c.sentence_index) for c in clips] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("bb", 0),
        ("bb", 1),
        ("bb", 2),
    ]
    assert clips[4].id == "bb/001" and clips[4].audio[0] == 2
