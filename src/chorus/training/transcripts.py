"""Onboarding without transcripts: recordings of any common format and length become an LJSpeech-style
folder, each clip transcribed by Whisper (faster-whisper, the shipped tiny.en; nothing downloaded).

A folder needs this when it has audio but no ``metadata.csv``, or a ``metadata.csv`` whose lines
leave the text empty (``id|``). Long recordings are cut at their silences into clips of at most
``max_seconds`` (a stretch of speech longer than that is cut where it is quietest). The voice card
records how many transcripts were automatic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import librosa
import numpy as np

from chorus.audio.io import SAMPLE_RATE, AudioError, load_audio, save_audio
from chorus.data.formats import AUDIO_SUFFIXES, audio_path, metadata_lines
from chorus.evaluation.asr import WhisperJudge


@dataclass(frozen=True)
class AutoTranscripts:
    folder: Path  # the LJSpeech-style folder to train on
    clips: int
    automatic: int  # clips whose transcript Whisper wrote
    seconds: float


def split_at_silences(
    audio: np.ndarray, sample_rate: int, max_seconds: float = 12.0, min_seconds: float = 1.0, top_db: float = 35.0
) -> list[np.ndarray]:
    """Clips of ``audio`` ``[samples]``: stretches of speech between silences, joined while they fit in
    ``max_seconds``; a longer stretch is cut at its quietest 20 ms. Pieces under ``min_seconds`` join
    a neighbour."""
    limit = int(max_seconds * sample_rate)
    spans = [list(s) for s in librosa.effects.split(audio, top_db=top_db, frame_length=1024, hop_length=256)]
    if not spans:
        return []
    pieces: list[list[int]] = []
    for start, end in spans:
        while end - start > limit:  # one stretch too long: cut at its quietest window in the last half
            window = int(0.02 * sample_rate)
            search = audio[start + limit // 2 : start + limit]
            energy = np.convolve(search**2, np.ones(window), mode="valid")
            cut = start + limit // 2 + int(np.argmin(energy)) + window // 2
            pieces.append([start, cut])
            start = cut
        if pieces and end - pieces[-1][0] <= limit and start - pieces[-1][1] < int(0.6 * sample_rate):
            pieces[-1][1] = end  # a short pause inside a sentence: one clip
        else:
            pieces.append([start, end])
    merged: list[list[int]] = []
    for start, end in pieces:
        if merged and (end - start < min_seconds * sample_rate) and end - merged[-1][0] <= limit:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    pad = int(0.1 * sample_rate)
    return [audio[max(0, s - pad) : min(len(audio), e + pad)] for s, e in merged if e - s >= 0.3 * sample_rate]


def auto_transcribe(
    folder: str | Path,
    out: str | Path,
    judge: WhisperJudge | None = None,
    max_seconds: float = 12.0,
    progress: bool = True,
) -> AutoTranscripts:
    """Write ``out`` (``metadata.csv`` + ``wavs/``) from ``folder``: its transcripts where it has them,
    Whisper's for the rest. Raises ``ValueError`` if no audio is found."""
    from rich.progress import Progress

    folder, out = Path(folder), Path(out)
    judge = judge or WhisperJudge(beam_size=5)
    metadata = folder / "metadata.csv"
    if metadata.is_file():
        wavs = folder / "wavs"
        given = [(audio_path(wavs, utt_id), text) for utt_id, text in metadata_lines(metadata)]
    else:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        given = [(p, "") for p in files]
    if not given:
        raise ValueError(f"{folder}: no audio files ({', '.join(AUDIO_SUFFIXES)}) and no metadata.csv")
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    lines, automatic, seconds = [], 0, 0.0
    with Progress(disable=not progress) as bar:
        task = bar.add_task("transcribing", total=len(given))
        for path, text in given:
            try:
                audio = load_audio(path, SAMPLE_RATE)
            except AudioError as error:
                print(f"skipped {error}")
                bar.advance(task)
                continue
            clips = [audio] if text else split_at_silences(audio, SAMPLE_RATE, max_seconds)
            for number, clip in enumerate(clips):
                utt_id = path.stem if len(clips) == 1 else f"{path.stem}-{number:03d}"
                words = text or judge.transcribe(clip, SAMPLE_RATE)
                if not words.strip():
                    continue  # Whisper heard no words: nothing to learn from
                automatic += not text
                save_audio(out / "wavs" / f"{utt_id}.wav", clip, SAMPLE_RATE)
                lines.append(f"{utt_id}|{' '.join(words.split())}")
                seconds += len(clip) / SAMPLE_RATE
            bar.advance(task)
    if not lines:
        raise ValueError(f"{folder}: Whisper heard no words in any recording")
    (out / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return AutoTranscripts(out, len(lines), automatic, round(seconds, 1))
