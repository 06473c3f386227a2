"""Judging a model's voices side by side: the shared core of ``chorus demo`` and ``bench/base.py``.

Synthesizes a grid of (voice, sentence), runs the judges on every clip, and measures whether two
utterances of the same voice sound more alike than utterances of different voices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from rich.progress import Progress

from chorus.evaluation.report import EvalItem, EvalReport, Judges, evaluate_pairs
from chorus.evaluation.similarity import SpeakerJudge, cosine_similarity


@dataclass
class VoiceClip:
    voice: str
    sentence_index: int
    text: str
    audio: np.ndarray        # [samples] float32
    sample_rate: int
    seconds: float           # synthesis wall time

    @property
    def id(self) -> str:
        return f"{self.voice}/{self.sentence_index:03d}"


def synthesize_grid(speak: Callable[[str, str], tuple[np.ndarray, int, float]], voices: Sequence[str],
                    sentences: Sequence[str], progress: bool = True) -> list[VoiceClip]:
    """Every voice says every sentence. ``speak(text, voice) -> (audio, sample_rate, seconds)``."""
    clips = []
    with Progress(disable=not progress) as bar:
        task = bar.add_task("synthesizing", total=len(voices) * len(sentences))
        for voice in voices:
            for index, text in enumerate(sentences):
                audio, rate, seconds = speak(text, voice)
                clips.append(VoiceClip(voice, index, text, audio, rate, seconds))
                bar.advance(task)
    return clips


def judge_clips(clips: Sequence[VoiceClip], judges: Judges,
                speaker_references: dict[str, Sequence] | None = None, progress: bool = True) -> EvalReport:
    """Run the judges; a clip's voice's real clips (if given) are its speaker-similarity references."""
    speaker_references = speaker_references or {}
    items = [EvalItem(clip.id, clip.audio, clip.text, speaker_references=speaker_references.get(clip.voice, ()),
                      synthesis_seconds=clip.seconds, sample_rate=clip.sample_rate) for clip in clips]
    return evaluate_pairs(items, judges=judges, progress=progress)


@dataclass
class SameVersusDifferent:
    """Mean cosine similarity of d-vectors between clips of the same voice and of different voices."""

    voices: list[str]
    matrix: np.ndarray       # [voices, voices] mean pairwise similarity (diagonal: distinct clips)
    same: float
    different: float


def same_versus_different(clips: Sequence[VoiceClip], judge: SpeakerJudge) -> SameVersusDifferent:
    voices = sorted({clip.voice for clip in clips})
    embeddings = [judge.embed(clip.audio, clip.sample_rate) for clip in clips]
    index = {voice: i for i, voice in enumerate(voices)}
    sums = np.zeros((len(voices), len(voices)))
    counts = np.zeros_like(sums)
    for a in range(len(clips)):
        for b in range(a + 1, len(clips)):
            i, j = index[clips[a].voice], index[clips[b].voice]
            value = cosine_similarity(embeddings[a], embeddings[b])
            for x, y in {(i, j), (j, i)}:
                sums[x, y] += value
                counts[x, y] += 1
    matrix = sums / np.maximum(counts, 1)
    same_mask = np.eye(len(voices), dtype=bool)
    same = float(sums[same_mask].sum() / max(counts[same_mask].sum(), 1))
    different = float(sums[~same_mask].sum() / max(counts[~same_mask].sum(), 1))
    return SameVersusDifferent(voices, matrix, same, different)
