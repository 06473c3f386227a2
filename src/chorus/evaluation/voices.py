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
    audio: np.ndarray  # [samples] float32
    sample_rate: int
    seconds: float  # synthesis wall time

    @property
    def id(self) -> str:
        return f"{self.voice}/{self.sentence_index:03d}"


def synthesize_grid(
    speak: Callable[[str, str], tuple[np.ndarray, int, float]],
    voices: Sequence[str],
    sentences: Sequence[str],
    progress: bool = True,
) -> list[VoiceClip]:
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


def judge_clips(
    clips: Sequence[VoiceClip],
    judges: Judges,
    speaker_references: dict[str, Sequence] | None = None,
    progress: bool = True,
) -> EvalReport:
    """Run the judges; a clip's voice's real clips (if given) are its speaker-similarity references."""
    speaker_references = speaker_references or {}
    items = [
        EvalItem(
            clip.id,
            clip.audio,
            clip.text,
            speaker_references=speaker_references.get(clip.voice, ()),
            synthesis_seconds=clip.seconds,
            sample_rate=clip.sample_rate,
        )
        for clip in clips
    ]
    return evaluate_pairs(items, judges=judges, progress=progress)


@dataclass
class SameVersusDifferent:
    """Mean cosine similarity of d-vectors between clips of the same voice and of different voices."""

    voices: list[str]
    matrix: np.ndarray  # [voices, voices] mean pairwise similarity (diagonal: distinct clips)
    same: float  # NaN when no pair exists
    different: float
    silent_clips: int = 0  # clips the speaker judge found no speech in (left out of every pair)


def _embed_or_none(judge: SpeakerJudge, clip: VoiceClip) -> np.ndarray | None:
    try:
        return judge.embed(clip.audio, clip.sample_rate)
    except ValueError:  # no speech in the clip: it cannot count for or against either side
        return None


def same_versus_different(clips: Sequence[VoiceClip], judge: SpeakerJudge) -> SameVersusDifferent:
    voices = sorted({clip.voice for clip in clips})
    embeddings = [_embed_or_none(judge, clip) for clip in clips]
    index = {voice: i for i, voice in enumerate(voices)}
    sums = np.zeros((len(voices), len(voices)))
    counts = np.zeros_like(sums)
    for a in range(len(clips)):
        for b in range(a + 1, len(clips)):
            if embeddings[a] is None or embeddings[b] is None:
                continue
            i, j = index[clips[a].voice], index[clips[b].voice]
            value = cosine_similarity(embeddings[a], embeddings[b])
            for x, y in {(i, j), (j, i)}:
                sums[x, y] += value
                counts[x, y] += 1
    matrix = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    same_mask = np.eye(len(voices), dtype=bool)

    def mean(mask: np.ndarray) -> float:
        return float(sums[mask].sum() / counts[mask].sum()) if counts[mask].sum() else float("nan")

    return SameVersusDifferent(voices, matrix, mean(same_mask), mean(~same_mask), sum(e is None for e in embeddings))
