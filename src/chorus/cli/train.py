"""``chorus pretrain`` and ``chorus train-vocoder``: the base model and the neural vocoder."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from chorus.cli.common import (
    DEVICE_OPTION,
    config_default,
    console,
    fail,
    given_options,
    interrupt_said,
    parameter_default,
    user_errors,
)
from chorus.models.config import AcousticConfig
from chorus.training.pretrain import PretrainConfig
from chorus.training.pretrain import pretrain as run_pretrain
from chorus.training.vocoder import VocoderTrainConfig, train_vocoder_command
from chorus.training.vocoder import train_vocoder as run_train_vocoder


def pretrain(
    data: list[Path] = typer.Argument(
        ...,
        help="Corpus roots, each a folder of LJSpeech-style speaker folders: corpus_out/train, or corpus_out/train "
        "corpus_out/natural for a base that also hears natural-sounding speakers.",
    ),
    out: Path = typer.Option(Path("runs/base"), help="Run folder (features, checkpoint/, log.csv, loss.png)."),
    steps: int = typer.Option(
        config_default(PretrainConfig, "steps"), help="Total optimizer steps (a resumed run continues to this)."
    ),
    max_frames: int = typer.Option(
        config_default(PretrainConfig, "max_frames"), help="Padded mel frames per batch and process."
    ),
    anneal_from: int | None = typer.Option(
        None, help="From this step the learning rate falls linearly to 0 at --steps (also on resume)."
    ),
    config: Path | None = typer.Option(None, help="JSON file with AcousticConfig fields (new runs only)."),
    default_speaker: str | None = typer.Option(None, help="Speaker used when none is asked for."),
    init_from: Path | None = typer.Option(
        None,
        help="Start a new run from this base's weights (a folder with config.json, e.g. src/chorus/assets/base): "
        "its speakers keep their vectors, new corpus speakers start at their mean; optimizer and schedule afresh.",
    ),
    learning_rate: float | None = typer.Option(
        None,
        help=f"Peak learning rate, reached after the warmup (default {config_default(PretrainConfig, 'learning_rate'):g}; "
        "a resumed run keeps its own).",
    ),
    warmup_steps: int | None = typer.Option(
        None,
        help=f"Linear warmup steps (default {config_default(PretrainConfig, 'warmup_steps')}; a resumed run keeps its own).",
    ),
    alignment_prior_steps: int | None = typer.Option(
        None,
        help=f"Steps over which the diagonal alignment prior fades out (default "
        f"{config_default(PretrainConfig, 'alignment_prior_steps')}; 0 with --init-from: that base aligns already; "
        "a resumed run keeps its own).",
    ),
    threads: int = typer.Option(config_default(PretrainConfig, "threads"), help="CPU threads per process."),
    device: str = DEVICE_OPTION,
) -> None:
    """Pretrain (or resume) the multi-speaker base model. Run under `torchrun` for DDP."""
    schedule = {
        "learning_rate": learning_rate,
        "warmup_steps": warmup_steps,
        "alignment_prior_steps": alignment_prior_steps,
    }
    saved = out / "checkpoint" / "config.json"
    if saved.is_file():
        if config is not None or init_from is not None:
            option = "--config" if config is not None else "--init-from"
            fail(f"{option} applies to a new run: {out} holds one, whose model is fixed (give another --out)")
        schedule, init_from = _as_begun(saved, default_speaker, schedule)
    else:
        if config is not None and init_from is not None:
            fail("--config and --init-from: a warm start takes its model's sizes from the base it starts from")
        if init_from is not None and not (init_from / "config.json").is_file():
            fail(f"--init-from {init_from}: no base there (a folder with config.json and model.safetensors)")
        if schedule["alignment_prior_steps"] is None and init_from is not None:
            schedule["alignment_prior_steps"] = 0
    schedule = {
        name: config_default(PretrainConfig, name) if value is None else value for name, value in schedule.items()
    }
    if schedule["learning_rate"] <= 0:
        fail(f"--learning-rate {schedule['learning_rate']:g}: must be positive")
    with user_errors():
        # A resumed run's model is its checkpoint's, a warm start's its base's (pretraining reads them).
        model_config = AcousticConfig.from_dict(json.loads(config.read_text())) if config else AcousticConfig()
        recipe = PretrainConfig(
            data=[str(folder) for folder in data],
            out=str(out),
            model=model_config,
            steps=steps,
            max_frames=max_frames,
            anneal_from=anneal_from,
            threads=threads,
            device=device,
            default_speaker=default_speaker,
            init_from=None if init_from is None else str(init_from),
            **schedule,
        )
        with interrupt_said():
            checkpoint = run_pretrain(recipe)
    console.print(f"checkpoint: {checkpoint}")


def _as_begun(saved: Path, default_speaker: str | None, schedule: dict) -> tuple[dict, str | None]:
    """A run to resume keeps what it began with (its checkpoint's ``saved`` config.json): its default speaker, its
    schedule (``schedule``'s values given on the command line must match) and its warm start; returns the
    schedule and the warm start's base. Each had been dropped unsaid: a resumed warm start went back to a new
    run's learning rate and alignment prior."""
    run = saved.parent.parent
    with user_errors():
        document = json.loads(saved.read_text())
    began = document.get("info", {}).get("recipe", {})
    if default_speaker is not None and default_speaker != document.get("default_speaker"):
        fail(
            f"--default-speaker: {run} holds a run whose default speaker is {document.get('default_speaker')} "
            "(fixed when it began)"
        )
    for name, value in schedule.items():
        if value is not None and began.get(name, value) != value:
            fail(
                f"--{name.replace('_', '-')} {value:g}: {run} holds a run begun with {began[name]:g}, which it keeps "
                "(--steps and --anneal-from may change on resume)"
            )
    return {name: began.get(name) if value is None else value for name, value in schedule.items()}, began.get(
        "init_from"
    )


def train_vocoder(
    context: typer.Context,
    data: list[Path] = typer.Argument(
        ...,
        help="Folders of LJSpeech-style speaker folders (any **/wavs/*.wav), e.g. corpus_out/train corpus_out/vocoder.",
    ),
    out: Path = typer.Option(Path("runs/vocoder"), help="Run folder; the trained vocoder is saved here."),
    steps: int = typer.Option(
        parameter_default(run_train_vocoder, "steps"), help="Total steps (a resumed run continues to this)."
    ),
    resume: bool = typer.Option(True, help="Continue from OUT's checkpoint if there is one."),
    threads: int = typer.Option(parameter_default(run_train_vocoder, "threads"), help="CPU threads."),
    init_from: Path | None = typer.Option(None, help="Fine-tune this saved vocoder (its architecture)."),
    aligned_model: Path | None = typer.Option(
        None, help="Feed the vocoder this acoustic model's teacher-forced mels of the clips (GTA fine-tuning)."
    ),
    aligned_clips: int = typer.Option(
        config_default(VocoderTrainConfig, "aligned_clips_per_voice"),
        help="With --aligned-model: clips per speaker forced through it.",
    ),
    aligned_fraction: float = typer.Option(
        config_default(VocoderTrainConfig, "aligned_fraction"),
        help="With --aligned-model: share of each batch from its forced mels (the rest: the data's own mels).",
    ),
    learning_rate: float | None = typer.Option(
        None, help=f"Peak learning rate (default {config_default(VocoderTrainConfig, 'learning_rate'):g})."
    ),
    adversarial: bool = typer.Option(
        False,
        help="Train against multi-period and multi-resolution discriminators (HiFi-GAN / Vocos): ~0.8 s a step at 1 thread, 2.5x the time.",
    ),
    weights_only: bool = typer.Option(
        False, help="Checkpoints keep weights, not optimizer states (a third the size: small enough to commit)."
    ),
) -> None:
    """Train the Vocos-style neural vocoder on real (or corpus) audio, or fine-tune one on an acoustic
    model's output (--init-from + --aligned-model), so it fits the spectra that model makes."""
    unused = [] if aligned_model is not None else given_options(context, "aligned_clips", "aligned_fraction")
    if unused:  # they had been ignored without a word, and the run trained on the data's own mels alone
        fail(f"{', '.join(unused)}: options of GTA fine-tuning, which --aligned-model MODEL turns on")
    with user_errors(), interrupt_said():
        result = train_vocoder_command(
            data,
            out,
            steps,
            resume,
            threads,
            init_from,
            aligned_model,
            aligned_clips,
            learning_rate,
            adversarial,
            weights_only,
            aligned_fraction,
        )
    loss = f", loss {result.losses['loss']:.3f}" if result.losses else ""
    console.print(
        f"vocoder at step {result.step}{loss} ({result.steps_per_second:.2f} steps/s) saved in {out}; "
        f"curves in {out / 'loss.png'}, samples in {out / 'samples'}; "
        f"use it with load_vocoder({str(out)!r})",
        soft_wrap=True,
    )
