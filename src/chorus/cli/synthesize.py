"""``chorus speakers`` and ``chorus synthesize``: the base model's speakers, and speech from text."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from chorus.atomic import atomic_write_text
from chorus.audio.io import save_audio
from chorus.cli.common import console, fail, parameter_default, user_errors
from chorus.models.bundle import load_bundle
from chorus.synthesis import DEFAULT_BASE, Synthesizer, load_base

MODEL_HELP = "Model folder (default: the shipped base)."


def speakers(model: Path | None = typer.Option(None, help=MODEL_HELP)) -> None:
    """List the speakers the base model knows."""
    with user_errors():
        bundle = load_bundle(model or DEFAULT_BASE)
    table = Table("index", "speaker", "default")
    for index, name in enumerate(bundle.speakers):
        table.add_row(str(index), name, "yes" if name == bundle.default_speaker else "")
    console.print(table)


def synthesize(
    text: str | None = typer.Option(None, help="Text to speak."),
    text_file: Path | None = typer.Option(None, help="File with one utterance per line."),
    speaker: str | None = typer.Option(
        None, help="A speaker of the base model, by name or index (default: the model's default speaker)."
    ),
    voice: Path | None = typer.Option(None, help="An adapted voice folder (from `chorus adapt`) to speak with."),
    out: Path = typer.Option(
        Path("out.wav"), help="Output WAV; with --text-file, a folder of 0001.wav, 0002.wav ... named by line number."
    ),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    vocoder: str | None = typer.Option(
        None, help="Vocoder: griffin-lim, neural (the shipped one), or a folder. Default: the model's."
    ),
    length_scale: float = typer.Option(
        parameter_default(Synthesizer.synthesize, "length_scale"), help="> 1 speaks slower, < 1 faster."
    ),
) -> None:
    """Speak text with a base speaker or an adapted voice and report the real-time factor."""
    if (text is None) == (text_file is None):
        fail("give exactly one of --text or --text-file")
    if text_file is not None:
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
        jobs = [(f"{text_file}:{number}", line, folder / f"{number:04d}.wav") for number, line in numbered]
    else:
        jobs = [("--text", text, out)]
    if voice is not None and speaker is not None:
        fail("give --speaker (a base speaker) or --voice (an adapted voice), not both")
    with user_errors():
        tts = load_base(model, vocoder)
        speaker_index = tts.resolve_speaker(speaker)
        voice_name = tts.load_voice(voice) if voice is not None else None
    table = Table("file", "speaker / voice", "seconds", "RTF", "text")
    written: list[tuple[Path, str]] = []
    for where, line, path in jobs:
        try:
            result = tts.synthesize(line, speaker_index, length_scale, voice=voice_name)
        except ValueError as error:
            console.print(f"[yellow]skipped {where}: {error}[/]")
            continue
        save_audio(path, result.audio, result.sample_rate)
        written.append((path, line))
        table.add_row(str(path), result.speaker, f"{result.duration:.2f}", f"{result.real_time_factor:.3f}", line[:60])
    console.print(table)
    if not written:
        fail("nothing was synthesized (see the skipped lines above)")
    if text_file is not None:
        # id|text beside the clips, so `chorus eval FOLDER` can judge them as they are.
        atomic_write_text(written[0][0].parent / "metadata.csv", "".join(f"{p.stem}|{t}\n" for p, t in written))
