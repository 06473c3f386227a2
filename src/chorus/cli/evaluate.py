"""``chorus eval``: judge a folder of synthesized clips, beside the start speaker and Piper joe."""

from __future__ import annotations

from pathlib import Path

import typer

from chorus.cli.common import console, fail, user_errors
from chorus.evaluation.report import Judges, evaluate_folder, report_files, speaker_reference_files


def evaluate(
    audio_dir: Path = typer.Argument(..., help="Folder of <id>.wav clips to judge."),
    metadata: Path | None = typer.Option(None, help="id|text file (default: AUDIO_DIR/metadata.csv)."),
    references: Path | None = typer.Option(None, help="Real clips of the target speaker (same ids: MCD, F0)."),
    out: Path | None = typer.Option(None, help="Write report.md/report.json here (or a .md/.json file)."),
    speaker_encoder: Path | None = typer.Option(
        None, help="Also judge similarity with this Chorus speaker encoder folder, beside resemblyzer."
    ),
    voice: Path | None = typer.Option(
        None, help="The adapted voice that spoke the clips: its start speaker reads the same texts beside them."
    ),
    start_speaker: str | None = typer.Option(None, help="A base speaker to read the same texts beside the clips."),
    model: Path | None = typer.Option(None, help="Base model of the start speaker (default: the shipped one)."),
    piper: bool = typer.Option(True, help="Piper joe reads the same texts beside the clips (if installed)."),
) -> None:
    """Judge synthesized clips: Whisper WER/CER, speaker similarity, predicted MOS (distillmos), MCD, F0 RMSE,
    speaking rate; beside them the same texts read by the voice's start speaker on the base and by Piper joe."""
    from chorus.adapters.voice import CARD_FILE

    # What would fail after minutes of judging is refused first: the voice, its start speaker, the report's files.
    if voice is not None and not (voice / CARD_FILE).is_file():
        fail(f"--voice {voice}: no such voice folder (made by `chorus adapt`)")
    start = start_speaker
    if start is None and voice is not None:
        from chorus.yardsticks import start_speaker_of

        with user_errors():
            start = start_speaker_of(voice)
    if out is not None:
        try:
            report_files(out)
        except ValueError as error:
            fail(f"--out {error}")
    with user_errors():
        judges = Judges()
        if speaker_encoder is not None:
            from chorus.evaluation.similarity import EncoderJudge
            from chorus.speaker_recognition.bundle import load_encoder

            judges = Judges(encoder=EncoderJudge(load_encoder(speaker_encoder)))
        report = evaluate_folder(audio_dir, metadata, references, judges=judges, progress=console.is_terminal)
        if start is not None or piper:
            from chorus.yardsticks import judge_yardsticks

            report.beside = judge_yardsticks(
                [row.text for row in report.rows],
                judges,
                start_speaker=start,
                model=model,
                piper=piper,
                speaker_references=speaker_reference_files(references),
            )
    for table in report.rich_tables():
        console.print(table)
    if out is not None:
        with user_errors():
            for path in report.write(out):
                console.print(f"wrote {path}")
