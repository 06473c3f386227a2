"""``chorus memory``: what one training step costs, per category, predicted and measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from chorus.adapters import parse_methods
from chorus.atomic import atomic_write_text
from chorus.cli.common import config_default, config_option, console, fail, user_errors
from chorus.cli.method_options import method_help, method_options, with_method_fields
from chorus.memory.presets import model_config_by_name
from chorus.memory.report import memory_report
from chorus.recipe import DEFAULT_METHOD, AdaptConfig, MemoryOptions
from chorus.training.adapt import trainable_for
from chorus.training.speaker_encoder import SPEAKER_OPTIMIZERS

SPEAKER_PREFIX = "speaker-"


@with_method_fields
def memory(
    method: str = typer.Option(DEFAULT_METHOD, help=method_help()),
    targets: str | None = typer.Option(None, help="Targets of the first method, as for `chorus adapt`."),
    model: str = typer.Option(
        "shipped",
        help="shipped (the shipped base's size), 500m (a 506M-parameter "
        "configuration), a JSON file of AcousticConfig fields, or a speaker encoder: "
        "speaker-{resnet|df-resnet}{depth}[-rev], e.g. speaker-resnet18-rev (--batch crops of --frames).",
    ),
    batch: int = typer.Option(8, min=1, help="Utterances per batch."),
    text_length: int = typer.Option(60, min=1, help="Phonemes per utterance (padded)."),
    frames: int = typer.Option(300, min=1, help="Mel frames per utterance (padded)."),
    optimizer: str | None = typer.Option(
        None,
        help="The acoustic model's: adamw (default), adamw8bit, adamw8bit-torchao; a speaker encoder's: "
        f"{', '.join(SPEAKER_OPTIMIZERS)} (default adam).",
    ),
    keep_text_side: bool = config_option(AdaptConfig, "keep_text_side"),
    precision: str = config_option(MemoryOptions, "precision"),
    checkpointing: bool = config_option(MemoryOptions, "checkpointing"),
    frozen_dtype: str = config_option(MemoryOptions, "frozen_dtype"),
    measure: bool = typer.Option(True, help="Also run one real training step and measure it (CPU)."),
    out: Path | None = typer.Option(None, help="Write the bar chart PNG here (and a .md beside it)."),
    method_fields: dict[str, Any] | None = None,
) -> None:
    """Training memory per category, predicted analytically (any size, on the meta device) and
    measured on a real step: weights, gradients, optimizer states, activations."""
    # Said before the work: matplotlib had refused '.md' after it.
    if out is not None and out.suffix not in ("", ".png"):
        fail(f"--out {out}: the chart's .png (its .md table is written beside it)")
    if model.startswith(SPEAKER_PREFIX):
        acoustic = {
            "--method": method != DEFAULT_METHOD or any(v is not None for v in (method_fields or {}).values()),
            "--targets": targets is not None,
            "--text-length": text_length != 60,
            "--keep-text-side": keep_text_side != config_default(AdaptConfig, "keep_text_side"),
            "--precision": precision != config_default(MemoryOptions, "precision"),
            "--checkpointing": checkpointing != config_default(MemoryOptions, "checkpointing"),
            "--frozen-dtype": frozen_dtype != config_default(MemoryOptions, "frozen_dtype"),
        }
        given = [name for name, differs in acoustic.items() if differs]
        if given:  # they had been dropped without a word
            fail(f"{', '.join(given)}: options of the acoustic model's adaptation, not of a speaker encoder's training")
        _speaker_memory(model[len(SPEAKER_PREFIX) :], batch, frames, optimizer or "adam", measure, _png(out))
        return
    with user_errors():
        config = model_config_by_name(model)
        adapt_config = AdaptConfig(
            methods=parse_methods(method, method_options(method, method_fields or {}, targets)),
            keep_text_side=keep_text_side,
        )
        options = MemoryOptions(
            optimizer=optimizer or MemoryOptions().optimizer,
            precision=precision,
            checkpointing=checkpointing,
            frozen_dtype=frozen_dtype,
        )
        if measure and model == "500m":
            raise ValueError("measuring the 500m configuration needs tens of GB; use --no-measure")
        report = memory_report(
            config,
            trainable=trainable_for(adapt_config),
            batch=batch,
            text_length=text_length,
            frames=frames,
            options=options,
            measure=measure,
            fresh_process=measure,
            out_png=_png(out),
            label=f"{method} on {model}",
        )
    _show(report, out)


def _speaker_memory(name: str, batch: int, frames: int, optimizer: str, measure: bool, out: Path | None) -> None:
    """``chorus memory --model speaker-...``: the speaker encoder's training step (encoder, AAM head, loss)."""
    from chorus.memory.speaker_encoder import encoder_config_by_name, speaker_memory_report

    with user_errors():
        report = speaker_memory_report(
            encoder_config_by_name(name),
            batch=batch,
            frames=frames,
            optimizer=optimizer,
            measure=measure,
            fresh_process=measure,
            out_png=out,
            label=f"speaker encoder {name} ({optimizer})",
        )
    _show(report, out)


def _png(out: Path | None) -> Path | None:
    """Where the chart goes: ``--out`` as given, ``.png`` added when it has no suffix (as the chart is written)."""
    return None if out is None else out.with_suffix(".png")


def _show(report, out: Path | None) -> None:
    """The table on the terminal; with ``--out`` the chart there and the Markdown table beside it."""
    console.print(report.rich_table())
    console.print(f"{report.parameters:,} parameters, {report.trainable_parameters:,} trained")
    if out is not None:
        atomic_write_text(out.with_suffix(".md"), report.markdown())
        console.print(f"chart: {_png(out)}; table: {out.with_suffix('.md')}")
