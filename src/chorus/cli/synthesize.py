"""``chorus speakers`` and ``chorus synthesize``: the base model's speakers, and speech from text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from chorus.atomic import atomic_write_text
from chorus.audio.encode import FORMATS, format_for
from chorus.cli.common import (
    BASE_HELP,
    DEVICE_OPTION,
    chosen_base,
    console,
    errors,
    fail,
    parameter_default,
    user_errors,
)
from chorus.models.bundle import load_bundle
from chorus.synthesis import DEFAULT_BASE, Synthesizer, load_base
from chorus.text.timestamps import captions

MODEL_HELP = "Model folder (default: the shipped base)."


def openai_voice(speaker: str | None, speakers: list[str]) -> str | None:
    """``speaker``, or the base speaker an OpenAI voice name ("alloy", "Nova") speaks as, as the server's
    ``/v1/audio/speech`` takes it (its speaker, when this base has it; else the default speaker)."""
    from chorus.serving.settings import OPENAI_VOICE_ALIASES

    if speaker is None or speaker in speakers or speaker.lower() not in OPENAI_VOICE_ALIASES:
        return speaker
    chosen = OPENAI_VOICE_ALIASES[speaker.lower()]
    return chosen if chosen in speakers else None


def speakers(model: Path | None = typer.Option(None, help=MODEL_HELP)) -> None:
    """List the speakers the base model knows."""
    with user_errors():
        bundle = load_bundle(model or DEFAULT_BASE)
    table = Table("index", "speaker", "default")
    for index, name in enumerate(bundle.speakers):
        table.add_row(str(index), name, "yes" if name == bundle.default_speaker else "")
    console.print(table)


def _write_timestamps(path: Path, result) -> None:
    """Word and phoneme times as JSON, or word captions as SRT/VTT, by ``path``'s suffix."""
    kind = path.suffix.lower().lstrip(".")
    if kind == "json":
        document = {
            "words": [vars(w) for w in result.words],
            "phonemes": [vars(p) for p in result.phonemes],
            "sample_rate": result.sample_rate,
        }
        atomic_write_text(path, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    elif kind in ("srt", "vtt"):
        atomic_write_text(path, captions(result.words, kind))
    else:
        raise ValueError(f"--timestamps {path}: give a .json, .srt or .vtt file")


def synthesize(
    text: str | None = typer.Option(
        None, help="Text to speak (any length). Without it: --text-file, or standard input."
    ),
    text_file: Path | None = typer.Option(None, help="File with one utterance per line."),
    speaker: str | None = typer.Option(
        None,
        help="A speaker of the base model, by name or index, or a blend such as 'flite-rms(2)+festival-kal(1)' "
        "(default: the model's default speaker).",
    ),
    voice: Path | None = typer.Option(
        None, help="An adapted voice folder (from `chorus adapt`) to speak with; it says which base it needs."
    ),
    out: Path = typer.Option(
        Path("out.wav"),
        help="Output file ('-': standard output); its suffix gives the format unless --format does. "
        "With --text-file, a folder of 0001.wav, 0002.wav ... named by line number.",
    ),
    audio_format: str | None = typer.Option(
        None, "--format", help=f"Audio format: {', '.join(FORMATS)} (default: by --out's suffix; wav for '-')."
    ),
    sample_rate: int | None = typer.Option(
        None, help="Output sample rate in Hz (default: the model's, 22,050; Opus is written at 8-48 kHz)."
    ),
    sentence_silence: float = typer.Option(
        parameter_default(Synthesizer.synthesize, "sentence_silence"), help="Seconds of silence between sentences."
    ),
    timestamps: Path | None = typer.Option(
        None, help="Write word and phoneme times: FILE.json, or word captions FILE.srt / FILE.vtt."
    ),
    base: str | None = typer.Option(None, help=BASE_HELP),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    vocoder: str | None = typer.Option(
        None,
        help="Vocoder of the Chorus base: griffin-lim, neural (the shipped one), or a folder. Default: the model's.",
    ),
    speed: float = typer.Option(
        parameter_default(Synthesizer.synthesize, "speed"), help="> 1 speaks faster (2: twice as fast), < 1 slower."
    ),
    device: str = DEVICE_OPTION,
) -> None:
    """Speak text with a base speaker or an adapted voice and report the real-time factor.

    echo "Hello there." | chorus synthesize --out - --format mp3 > hello.mp3

    chorus synthesize --base piper-joe --text "Hello there." speaks with Piper's joe voice."""
    if text is not None and text_file is not None:
        fail("give --text or --text-file, not both")
    if text is None and text_file is None:
        if sys.stdin is None or sys.stdin.isatty():
            fail("give --text, --text-file, or text on standard input")
        text = sys.stdin.read()
        if not text.strip():
            fail("standard input is empty: nothing to speak")
    to_stdout = str(out) == "-"
    report = errors if to_stdout else console  # standard output carries the audio
    # WAV unless told otherwise where no file name says: standard output, a folder of clips.
    implicit_wav = to_stdout or (text_file is not None and out.suffix == "")
    with user_errors():
        chosen_format = format_for(None if to_stdout else out, audio_format or ("wav" if implicit_wav else None))
    if text_file is not None:
        if to_stdout:
            fail("--text-file writes one file per line; --out - takes --text or standard input")
        if not text_file.is_file():
            fail(f"{text_file}: no such file")
        numbered = [
            (number, line.strip())
            for number, line in enumerate(text_file.read_text(encoding="utf-8").splitlines(), start=1)
            if line.strip()
        ]
        if not numbered:
            fail(f"{text_file}: no text lines")
        # One clip per line, named by its line number so files map back to the text file.
        folder = out if out.suffix == "" else out.parent / out.stem
        suffix = FORMATS[chosen_format].suffixes[0]
        jobs = [(f"{text_file}:{number}", line, folder / f"{number:04d}{suffix}") for number, line in numbered]
    else:
        jobs = [("--text", text, out)]
    if timestamps is not None and text_file is not None:
        fail("--timestamps goes with --text (or standard input), not --text-file")
    if voice is not None and speaker is not None:
        fail("give --speaker (a base speaker) or --voice (an adapted voice), not both")
    with user_errors():
        tts = load_base(chosen_base(base, model, voice), vocoder, device=device)
        speaker_voice = tts.resolve_speaker(openai_voice(speaker, tts.speakers))  # checked (and a blend parsed) once
        voice_name = tts.load_voice(voice) if voice is not None else None
    table = Table("file", "speaker / voice", "seconds", "RTF", "text")
    written: list[tuple[Path, str]] = []
    for where, line, path in jobs:
        try:
            result = tts.synthesize(line, speaker_voice, speed, voice_name, sentence_silence)
        except ValueError as error:
            report.print(f"skipped {where}: {error}", style="yellow")
            continue
        with user_errors():
            if to_stdout:
                sys.stdout.buffer.write(result.to_bytes(chosen_format, sample_rate))
                sys.stdout.buffer.flush()
            else:
                result.save(path, chosen_format, sample_rate)
            if timestamps is not None:
                _write_timestamps(timestamps, result)
        written.append((path, line))
        table.add_row(
            str(path),
            result.speaker,
            f"{result.duration:.2f}",
            f"{result.real_time_factor:.3f}",
            " ".join(line.split())[:60],
        )
    report.print(table)
    if not written:
        fail("nothing was synthesized (see the skipped lines above)")
    if text_file is not None:
        # id|text beside the clips, so `chorus eval FOLDER` can judge them as they are.
        atomic_write_text(written[0][0].parent / "metadata.csv", "".join(f"{p.stem}|{t}\n" for p, t in written))
