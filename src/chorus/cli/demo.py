"""``chorus demo``: the main job end to end (:mod:`chorus.demo`), printed as two tables."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import typer
from rich.table import Table

from chorus.adapters.voice import trained_on
from chorus.cli.common import (
    BASE_HELP,
    DEVICE_OPTION,
    chosen_base,
    config_default,
    console,
    logged_loss,
    refuse_output_folder,
    user_errors,
)
from chorus.demo import DemoConfig, SpeakersResult, adapt_sample_voice, sample_voice, speak_base_speakers
from chorus.synthesis import load_base
from chorus.training.piper_adapt import PiperAdaptConfig, check_target_and_posterior


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _print_speakers(spoken: SpeakersResult, out: Path) -> None:
    """How each base speaker read the sentences, and how alike they sound."""
    table = Table("speaker", "WER %", "MOS", "RTF", "transcript of the first sentence")
    for score in spoken.scores:
        table.add_row(
            score.speaker,
            f"{100 * score.wer:.1f}",
            "n/a" if score.mos is None else f"{score.mos:.2f}",
            f"{score.real_time_factor:.3f}",
            score.first_transcript,
        )
    console.print(table)
    similarity = spoken.similarity
    # One speaker (a Piper base) makes no pair of two ("nan" had been printed).
    different = "none (one speaker)" if math.isnan(similarity.different) else f"{similarity.different:.3f}"
    same = "none" if math.isnan(similarity.same) else f"{similarity.same:.3f}"
    pairs = f"same speaker {same}, different speakers {different}"
    console.print(
        f"speaker similarity (resemblyzer): {pairs}"
        + (f" ({similarity.silent_clips} clip(s) had no speech)" if similarity.silent_clips else "")
    )
    console.print(f"clips and report.md in {out}/")


def demo(
    out: Path = typer.Option(Path("demo"), help="Folder for the clips and report.md."),
    speakers: str | None = typer.Option(
        None, help="Comma-separated speakers of the base model (default: its four showcase speakers)."
    ),
    sentences: int = typer.Option(
        config_default(DemoConfig, "sentences"), help="Sentences per speaker (from the held-out benchmark set)."
    ),
    voice_sentences: int = typer.Option(
        config_default(DemoConfig, "voice_sentences"),
        help="Benchmark sentences the new voice and its start speaker are judged on.",
    ),
    base: str | None = typer.Option(None, help=BASE_HELP),
    model: Path | None = typer.Option(None, help="Chorus model folder (default: the shipped base)."),
    adapt_method: str = typer.Option(
        config_default(DemoConfig, "adapt_method"),
        help="Method of the new voice from the shipped sample ('' to skip adaptation).",
    ),
    adapt_steps: int = typer.Option(
        config_default(DemoConfig, "adapt_steps"), help="Most adaptation steps for the new voice."
    ),
    posterior: Path | None = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="On a Piper voice file: its posterior encoder (scripts/distill_posterior.py); piper-joe's ships.",
    ),
    device: str = DEVICE_OPTION,
) -> None:
    """The main job: speak unseen sentences in base speakers, adapt a new voice from a 1-minute sample,
    speak with it, and judge everything (WER, similarity, predicted MOS, RTF, what the voice cost)."""
    config = DemoConfig(
        speakers=speakers.split(",") if speakers else None,
        sentences=sentences,
        voice_sentences=voice_sentences,
        adapt_method=adapt_method,
        adapt_steps=adapt_steps,
        posterior=str(posterior) if posterior else None,
    )
    with user_errors():
        tts = load_base(chosen_base(base, model), device=device)
        sample = sample_voice(tts)
        if adapt_method:  # the new voice replaces the demo's own from an earlier run, never anything else
            refuse_output_folder(out / "voices" / sample.name, sample, overwrite=True)
        if posterior is not None and (tts.base.kind == "chorus" or not adapt_method):
            raise ValueError(
                "--posterior goes with a Piper base's adaptation (--base VOICE.onnx), which this run has not"
            )
        if adapt_method and tts.base.kind != "chorus":  # said before the base speaks, not after it
            check_target_and_posterior(sample, tts.base.sha256, PiperAdaptConfig(posterior=config.posterior))
        spoken = speak_base_speakers(tts, out, config)
    _print_speakers(spoken, out)
    if not adapt_method:
        return
    recipe = adapt_method if tts.base.kind == "chorus" else "the Piper recipe"
    console.print(f"\nAdapting a new voice from {sample} (held out of pretraining) with {recipe}", style="bold")
    with user_errors():
        voice = adapt_sample_voice(tts, spoken, out, config)
    card = voice.card
    table = Table("cost / result", "value")
    metrics = card.metrics
    clips = (
        f", {metrics['training_clips']} clips (+{metrics['held_out_clips']} held out)"
        if "training_clips" in metrics
        else ""
    )
    table.add_row("data", f"{trained_on(card)}{clips}")
    table.add_row("training", f"{card.steps} steps in {card.train_seconds:.0f} s on the CPU")
    table.add_row(
        "trained parameters", f"{card.trainable_parameters:,} ({100 * voice.parameter_fraction:.2f}% of the base)"
    )
    table.add_row(
        "voice artifact",
        f"{voice.artifact_bytes / 1024:.1f} KB ({100 * voice.artifact_fraction:.2f}% of the base's weights)",
    )
    table.add_row("peak memory (process RSS)", f"{voice.peak_rss_bytes / 2**20:.0f} MB")
    if "validation_mel_l1_start" in metrics:  # the Chorus recipe holds clips out; the Piper recipe logs its loss
        table.add_row(
            "held-out mel L1", f"{metrics['validation_mel_l1_start']:.3f} -> {metrics['validation_mel_l1_best']:.3f}"
        )
    else:
        log_every = config_default(PiperAdaptConfig, "log_every")
        table.add_row("training loss", logged_loss(metrics["loss_start"], metrics["loss_end"], card.steps, log_every))
    piper = voice.piper_mos is not None
    table.add_row(
        f"WER over {voice.sentences} sentences",
        f"{percent(voice.wer)} (start speaker {voice.start_speaker} on the base: {percent(voice.start_wer)}"
        + (f"; Piper joe: {percent(voice.piper_wer)})" if piper else ")"),
    )
    table.add_row(
        "predicted MOS (distillmos)",
        f"{number(voice.mos)} (start speaker on the base: {number(voice.start_mos)}"
        + (f"; Piper joe: {number(voice.piper_mos)})" if piper else ")"),
    )
    table.add_row("similarity to the real sample", f"{voice.similarity:.3f}")
    console.print(table)
    console.print(
        f"voice folder: {voice.voice_dir}; speak with it: chorus synthesize --voice "
        f'{shlex.quote(str(voice.voice_dir))} --text "..."'
    )
