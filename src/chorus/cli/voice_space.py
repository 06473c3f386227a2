"""``chorus voice-space train|fit``: a voice as a short vector that generates its adapter."""

from __future__ import annotations

from pathlib import Path

import typer

from chorus.adapters.hypernetwork import VoiceSpace
from chorus.adapters.voice import trained_on
from chorus.cli.common import (
    OVERWRITE_HELP,
    command_group,
    config_default,
    console,
    overwrite_help,
    parameter_default,
    refuse_output_folder,
    user_errors,
    voice_space_kind,
)
from chorus.cli.method_options import method_help
from chorus.corpus.virtual import with_virtual_speakers
from chorus.models.bundle import load_bundle
from chorus.synthesis import DEFAULT_BASE
from chorus.training.voice_space_training import VoiceSpaceConfig, fit_voice, train_voice_space

space_app = command_group(
    help="A voice space: a voice as a short vector that generates its adapter.", no_args_is_help=True
)
MODEL_HELP = "Base model folder (default: the shipped base)."


@space_app.command("train")
def voice_space_train(
    root: Path = typer.Argument(..., help="A folder of speaker folders (LJSpeech-style) to learn the space from."),
    out: Path = typer.Option(..., help="A new folder for voice_space.safetensors + voice_space.json."),
    overwrite: bool = typer.Option(False, help=overwrite_help("voice space")),
    dim: int = typer.Option(config_default(VoiceSpaceConfig, "dim"), help="Numbers per voice."),
    method: str = typer.Option(
        config_default(VoiceSpaceConfig, "method"), help=method_help(" The adapter the space generates.", full=False)
    ),
    steps: int = typer.Option(
        config_default(VoiceSpaceConfig, "steps"), help="Updates; each takes one clip of every voice."
    ),
    virtual: int = typer.Option(
        0,
        help="Also learn over this many new virtual speakers, made from ROOT's "
        "speakers with sox (in OUT-voices/, beside links to ROOT's speakers): "
        "speakers the base never heard, which widen the space; each step then "
        "costs more.",
    ),
    virtual_minutes: float = typer.Option(1.0, help="Audio of each virtual speaker."),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    threads: int = typer.Option(config_default(VoiceSpaceConfig, "threads"), help="CPU threads."),
) -> None:
    """Learn a voice space over many voices (each gets a vector; a shared hypernetwork makes adapters)."""
    refuse_output_folder(out, root, overwrite, voice_space_kind())
    with user_errors():
        config = VoiceSpaceConfig(method=method, dim=dim, steps=steps, threads=threads)
        if virtual:
            root = with_virtual_speakers(root, out.with_name(out.name + "-voices"), virtual, minutes=virtual_minutes)
            console.print(f"{virtual} virtual speakers in {root}")
        space, history = train_voice_space(root, load_bundle(model or DEFAULT_BASE), out, config)
    console.print(
        f"voice space: {out} (dim {space.dim}); mean held-out mel L1 {history[0]['val_mel']:.3f} -> "
        f"{min(h['val_mel'] for h in history):.3f}"
    )


@space_app.command("fit")
def voice_space_fit(
    data: Path = typer.Argument(..., help="One speaker's LJSpeech-style folder (24 s of speech or more)."),
    space: Path = typer.Option(..., help="A voice space folder (`chorus voice-space train`)."),
    out: Path = typer.Option(..., help="Voice folder to write."),
    steps: int = typer.Option(
        parameter_default(fit_voice, "steps"),
        help="Most steps (it stops earlier once the held-out loss stops improving).",
    ),
    init: str = typer.Option(
        parameter_default(fit_voice, "init"),
        help="Where the vector starts: nearest (the training speaker whose d-vector is "
        "closest to the clips'), embedding (the clips' d-vector through a linear map) "
        "or mean (the space's center).",
    ),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    threads: int = typer.Option(parameter_default(fit_voice, "threads"), help="CPU threads."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """A new voice as a point of a voice space: only its vector learns. Writes a normal voice folder."""
    refuse_output_folder(out, data, overwrite)
    with user_errors():
        voice_space, _, _ = VoiceSpace.load(space)
        result = fit_voice(
            data, load_bundle(model or DEFAULT_BASE), voice_space, out, steps=steps, init=init, threads=threads
        )
    card = result.card
    if result.start_voice:
        console.print(f"started from the nearest training voice: {result.start_voice}")
    console.print(
        f"voice: {result.voice_dir} ({trained_on(card, 1)}, {voice_space.dim} numbers, "
        f"{card.train_seconds:.0f} s; held-out mel L1 {card.metrics['validation_mel_l1_start']:.3f} -> "
        f"{card.metrics['validation_mel_l1_best']:.3f})"
    )
