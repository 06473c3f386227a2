"""Subsets of a dataset as LJSpeech-style folders of links (benchmarks: 1, 3, 10 minutes of a speaker)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import soundfile as sf

from chorus.data.formats import Utterance


def first_minutes(utterances: Sequence[Utterance], minutes: float) -> list[Utterance]:
    """The first utterances, in order, until they add up to at least ``minutes`` (or run out)."""
    chosen, total = [], 0.0
    for utterance in utterances:
        if total >= minutes * 60:
            break
        chosen.append(utterance)
        total += sf.info(str(utterance.audio_path)).duration
    return chosen


def write_subset(utterances: Sequence[Utterance], folder: str | Path) -> Path:
    """``folder`` (replaced) as an LJSpeech-style folder: ``metadata.csv`` and ``wavs/`` of symbolic
    links to the original files, so a subset costs no audio copies."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "wavs").mkdir(parents=True)
    for utterance in utterances:
        (folder / "wavs" / utterance.audio_path.name).symlink_to(Path(utterance.audio_path).resolve())
    write_metadata(utterances, folder)
    return folder


def write_metadata(utterances: Sequence[Utterance], folder: str | Path) -> None:
    """``folder/metadata.csv`` (``id|text`` lines) for audio files named ``wavs/<id>.wav`` in ``folder``."""
    (Path(folder) / "metadata.csv").write_text("".join(f"{u.audio_path.stem}|{u.text}\n" for u in utterances))
