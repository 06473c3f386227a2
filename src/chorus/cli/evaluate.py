"""``chorus eval``: judge a folder of synthesized clips."""

from __future__ import annotations

from pathlib import Path

import typer

from chorus.cli.common import console, user_errors
from chorus.evaluation.report import evaluate_folder


def evaluate(
    audio_dir: Path = typer.Argument(..., help="Folder of <id>.wav clips to judge."),
    metadata: Path | None = typer.Option(None, help="id|text file (default: AUDIO_DIR/metadata.csv)."),
    references: Path | None = typer.Option(None, help="Real clips of the target speaker (same ids: MCD, F0)."),
    out: Path | None = typer.Option(None, help="Write report.md/report.json here (or a .md/.json file)."),
    speaker_encoder: Path | None = typer.Option(
        None, help="Also judge similarity with this Chorus speaker encoder folder, beside resemblyzer."
    ),
) -> None:
    """Judge synthesized clips: Whisper WER/CER, speaker similarity, predicted MOS (distillmos), MCD, F0 RMSE,
    speaking rate."""
    with user_errors():
        judges = None
        if speaker_encoder is not None:
            from chorus.evaluation.report import Judges
            from chorus.evaluation.similarity import EncoderJudge
            from chorus.models.speaker_encoder import load_encoder

            judges = Judges(encoder=EncoderJudge(load_encoder(speaker_encoder)))
        report = evaluate_folder(audio_dir, metadata, references, judges=judges, progress=console.is_terminal)
    for table in report.rich_tables():
        console.print(table)
    if out is not None:
        with user_errors():
            for path in report.write(out):
                console.print(f"wrote {path}")
