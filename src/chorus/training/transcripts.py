"""Onboarding without transcripts: recordings of any common format and length become an LJSpeech-style
folder, each clip transcribed by Whisper (faster-whisper, the shipped tiny.en; nothing downloaded).

A folder needs this when it has audio but no ``metadata.csv``, or a ``metadata.csv`` whose lines
leave the text empty (``id|``). Long recordings are cut at their silences into clips of at most
``max_seconds`` (a stretch of speech longer than that is cut where it is quietest). The voice card
records how many transcripts were automatic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chorus.audio.io import SAMPLE_RATE, AudioError, load_audio, save_audio
from chorus.audio.silences import split_at_silences
from chorus.data.check import CheckConfig
from chorus.data.formats import AUDIO_SUFFIXES, read_metadata
from chorus.evaluation.asr import WhisperJudge


@dataclass(frozen=True)
class AutoTranscripts:
    folder: Path  # the LJSpeech-style folder to train on
    clips: int
    automatic: int  # clips whose transcript Whisper wrote
    seconds: float  # of every clip written
    automatic_seconds: float = 0.0  # of those Whisper transcribed
    # Each line of the folder's metadata.csv ("<folder>/metadata.csv:<n>") by where its clip came from: the given
    # metadata.csv's line, or the recording's file (and which part of it), so what is said of a line names the
    # user's own (the written folder is temporary, and its lines are numbered otherwise).
    sources: dict[str, str] = field(default_factory=dict)


def auto_transcribe(
    folder: str | Path,
    out: str | Path,
    judge: WhisperJudge | None = None,
    max_seconds: float = 12.0,
    progress: bool = True,
    min_sample_rate: int = CheckConfig().min_sample_rate,
) -> AutoTranscripts:
    """Write ``out`` (``metadata.csv`` + ``wavs/``) from ``folder``: its transcripts where it has them,
    Whisper's for the rest. A recording that cannot be read, or was made below ``min_sample_rate`` (the
    data check's: the clips written here are at the model's rate, so the check could no longer tell), is
    skipped and said so. Raises ``ValueError`` if no audio is found, or none is usable."""
    from rich.progress import Progress

    folder, out = Path(folder), Path(out)
    judge = judge or WhisperJudge(beam_size=5)
    metadata = folder / "metadata.csv"
    lines, skipped, sources, automatic, seconds, automatic_seconds = [], [], {}, 0, 0.0, 0.0
    if metadata.is_file():  # its lines read as the data check reads them, and its problems said (not dropped)
        utterances, problems = read_metadata(folder, speaker=folder.resolve().name)  # "." has no name of its own
        for problem in problems:
            skipped.append(f"{problem.source}: {problem.message}")
            print(f"skipped {skipped[-1]}")
        given = [(u.audio_path, u.text, u.source) for u in utterances]
    else:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        given = [(p, "", str(p)) for p in files]
    if not given and not skipped:
        raise ValueError(f"{folder}: no audio files ({', '.join(AUDIO_SUFFIXES)}) and no metadata.csv")
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    written: set[str] = set()  # ids written: a/take1.wav and b/take1.wav (or x.wav and x.flac) are two clips
    with Progress(disable=not progress) as bar:
        task = bar.add_task("transcribing", total=len(given))
        for path, text, source in given:
            try:
                audio = load_audio(path, SAMPLE_RATE, min_rate=min_sample_rate)
            except AudioError as error:
                print(f"skipped {error}")
                skipped.append(str(error))
                bar.advance(task)
                continue
            clips = [audio] if text else split_at_silences(audio, SAMPLE_RATE, max_seconds)
            for number, clip in enumerate(clips):
                utt_id = path.stem if len(clips) == 1 else f"{path.stem}-{number:03d}"
                utt_id = _unique(utt_id, written)
                written.add(utt_id)
                words = text or judge.transcribe(clip, SAMPLE_RATE)
                if not words.strip():
                    continue  # Whisper heard no words: nothing to learn from
                automatic += not text
                save_audio(out / "wavs" / f"{utt_id}.wav", clip, SAMPLE_RATE)
                lines.append(f"{utt_id}|{' '.join(words.split())}")
                part = f" (part {number + 1} of {len(clips)})" if len(clips) > 1 else ""
                sources[f"{out / 'metadata.csv'}:{len(lines)}"] = source + part
                seconds += len(clip) / SAMPLE_RATE
                automatic_seconds += 0.0 if text else len(clip) / SAMPLE_RATE
            bar.advance(task)
    if not lines:
        more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        why = f"skipped {'; '.join(skipped[:3])}{more}" if skipped else "Whisper heard no words in any recording"
        raise ValueError(f"{folder}: no usable recording ({why})")
    (out / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return AutoTranscripts(out, len(lines), automatic, round(seconds, 1), round(automatic_seconds, 1), sources)


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``name-3`` ... the first not in ``taken``."""
    unique, count = name, 1
    while unique in taken:
        count += 1
        unique = f"{name}-{count}"
    return unique
