"""``chorus adapt`` and ``chorus adapt-many``: new voices from a few minutes of recordings."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from chorus.adapters import parse_methods
from chorus.adapters.voice import trained_on
from chorus.cli.common import (
    BASE_HELP,
    DEVICE_OPTION,
    OVERWRITE_HELP,
    chosen_base,
    config_default,
    config_option,
    console,
    fail,
    given_options,
    logged_loss,
    output_folder_problem,
    refuse_output_folder,
    user_errors,
)
from chorus.cli.method_options import method_help, method_options, with_method_fields
from chorus.data.formats import Utterance, needs_transcripts
from chorus.models.bundle import load_bundle
from chorus.recipe import DEFAULT_METHOD, AdaptConfig, MemoryOptions
from chorus.synthesis.bases.chorus import model_folder
from chorus.synthesis.bases.piper import claims as piper_claims
from chorus.synthesis.bases.piper import is_joe
from chorus.training.adapt import adapt as run_adapt
from chorus.training.adapt import check_adaptation_data, left_out_notes, say_left_out
from chorus.training.adapt_many import ManyVoicesConfig, speaker_folders
from chorus.training.adapt_many import adapt_many as run_adapt_many
from chorus.training.piper_adapt import PLACEMENTS, RECIPES, PiperAdaptConfig, adapt_piper

TARGETS_HELP = (
    "Comma-separated module names/suffixes for the first method, or a regex (full match) if it starts with ^."
)
MODEL_HELP = "Base model folder (default: the shipped base)."
# What `chorus adapt` takes for one kind of base only (its parameters' names; a method's own options too).
CHORUS_BASE_ONLY = (
    "method", "targets", "keep_text_side", "speaker_encoder", "optimizer", "checkpointing", "reversible", "precision",
    "frozen_dtype",
)  # fmt: skip
PIPER_BASE_ONLY = ("placement", "recipe", "posterior")


@with_method_fields
def adapt(
    context: typer.Context,
    data: Path = typer.Argument(..., help="One speaker's LJSpeech-style folder (1-10 minutes of clips)."),
    out: Path = typer.Option(..., help="Voice folder to write, e.g. voices/NAME."),
    base: str | None = typer.Option(
        None,
        help=BASE_HELP + " On a Piper base the voice is adapted by its own recipe (chorus.training.piper_adapt): "
        "--placement, --steps, --learning-rate, --max-minutes and --threads apply.",
    ),
    placement: str = typer.Option(
        config_default(PiperAdaptConfig, "placement"),
        help=f"With a Piper --base: where the voice's adapters go ({', '.join(PLACEMENTS)}), or full: every weight "
        "trains, and the voice folder holds a whole generator (the baseline; spoken beside the base, not in it).",
    ),
    recipe: str = typer.Option(
        config_default(PiperAdaptConfig, "recipe"),
        help=f"With a Piper --base: {', '.join(RECIPES)} (chorus.training.piper_adapt says how each learns).",
    ),
    posterior: Path | None = typer.Option(
        None,
        help="With a Piper --base: a posterior encoder folder (scripts/distill_posterior.py makes one for any "
        "Piper voice; default: the one shipped for piper-joe).",
    ),
    method: str = typer.Option(DEFAULT_METHOD, help=method_help()),
    targets: str | None = typer.Option(None, help=TARGETS_HELP),
    steps: int | None = typer.Option(
        None,
        min=1,
        help=f"Most optimizer steps (default: {config_default(AdaptConfig, 'steps')} on the Chorus base, where "
        f"early stopping usually ends sooner; {config_default(PiperAdaptConfig, 'steps')} on a Piper base).",
    ),
    learning_rate: float | None = typer.Option(None, help="Default: per method."),
    keep_text_side: bool = config_option(AdaptConfig, "keep_text_side"),
    speaker_encoder: Path | None = config_option(AdaptConfig, "speaker_encoder"),
    one_speaker_check: bool = config_option(AdaptConfig, "one_speaker_check"),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
    keep_transcribed: Path | None = typer.Option(
        None,
        help="Recordings without transcripts: keep the clips and Whisper's transcripts in this new folder "
        "(metadata.csv to read and mend, then adapt from it again).",
    ),
    max_minutes: float = typer.Option(
        config_default(AdaptConfig, "max_minutes"), help="Wall-clock budget of the training loop."
    ),
    optimizer: str = config_option(MemoryOptions, "optimizer"),
    checkpointing: bool = config_option(MemoryOptions, "checkpointing"),
    reversible: bool = config_option(MemoryOptions, "reversible"),
    precision: str = config_option(MemoryOptions, "precision"),
    frozen_dtype: str = config_option(MemoryOptions, "frozen_dtype"),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    threads: int = typer.Option(config_default(AdaptConfig, "threads"), help="CPU threads."),
    device: str = DEVICE_OPTION,
    method_fields: dict[str, Any] | None = None,
) -> None:
    """Learn a new voice from a few minutes of one speaker's recordings; writes a voice folder that records its
    base (chorus synthesize --voice then speaks it on that base)."""
    refuse_output_folder(out, data, overwrite)
    kept = keep_transcribed.resolve() if keep_transcribed is not None else None
    if kept is not None and (kept.is_relative_to(out.resolve()) or out.resolve().is_relative_to(kept)):
        # Inside the voice, the swap deletes them; the voice inside them is read as a recording next time.
        fail(f"--keep-transcribed {keep_transcribed} and --out {out} must be apart, neither inside the other")
    with user_errors():
        spec = chosen_base(base, model)
    on_piper = spec is not None and piper_claims(str(spec))
    _refuse_the_other_bases_options(context, on_piper, method_fields or {})
    if on_piper:
        if keep_transcribed is not None:
            fail("--keep-transcribed goes with the Chorus base: a Piper base adapts from transcribed recordings only")
        piper_config = dict(recipe=recipe, posterior=str(posterior) if posterior else None)
        clips, notes = _piper_clips(data, one_speaker_check)
        adapt_on_piper(
            clips, out, str(spec), placement, steps, learning_rate, max_minutes, threads, device, piper_config, notes
        )
        return
    with user_errors():
        config = AdaptConfig(
            methods=parse_methods(method, method_options(method, method_fields or {}, targets)),
            steps=config_default(AdaptConfig, "steps") if steps is None else steps,
            learning_rate=learning_rate,
            keep_text_side=keep_text_side,
            speaker_encoder=str(speaker_encoder) if speaker_encoder else None,
            one_speaker_check=one_speaker_check,
            max_minutes=max_minutes,
            threads=threads,
            memory=MemoryOptions(
                optimizer=optimizer,
                checkpointing=checkpointing,
                reversible=reversible,
                precision=precision,
                frozen_dtype=frozen_dtype,
            ),
        )
        bundle = load_bundle(model_folder(spec), device)
        result = run_adapt(
            data, bundle, out, config, keep_transcribed=keep_transcribed, in_place=True, keep_on_interrupt=True
        )
    _report_voice(result, data, out, keep_transcribed, model)
    if result.stopped == "interrupted":  # kept, and said; the exit status is still an interrupt's (a script stops)
        console.print("interrupted: the voice above is the best of the steps taken")
        raise typer.Exit(130)


def _refuse_the_other_bases_options(context: typer.Context, on_piper: bool, method_fields: dict[str, Any]) -> None:
    """End the command where its user gave an option the chosen base has no use for (one kind of base's options
    had been dropped without a word on the other)."""
    ignored = given_options(context, *(CHORUS_BASE_ONLY + tuple(method_fields)) if on_piper else PIPER_BASE_ONLY)
    if not ignored:
        return
    if on_piper:
        takes = (
            "the Chorus base's adapter and training options; a Piper base takes --placement, --recipe, --posterior, "
            "--steps, --learning-rate, --max-minutes and --threads"
        )
    else:
        takes = "a Piper base's options (with --base piper-joe or a voice.onnx); the Chorus base takes --method and its options"
    fail(f"{', '.join(ignored)}: {takes}")


def _report_voice(result, data: Path, out: Path, keep_transcribed: Path | None, model: Path | None) -> None:
    """What ``chorus adapt`` made on the Chorus base (the shipped one, or the ``model`` folder), how to speak with
    it, and where Whisper's transcripts are."""
    card = result.card
    console.print(
        f"voice: {result.voice_dir}  ({trained_on(card, 1)}, {card.steps} steps in "
        f"{card.train_seconds:.0f} s, {card.trainable_parameters:,} trained parameters, held-out mel L1 "
        f"{card.metrics['validation_mel_l1_start']:.3f} -> {card.metrics['validation_mel_l1_best']:.3f}; "
        f"{card.notes['stopped']})"
    )
    # Quoted as a shell reads them: a path with a space ran as two arguments (a new user's probe).
    on = f" --model {shlex.quote(str(model))}" if model is not None else ""  # it speaks on the model it was made on
    voice = shlex.quote(str(result.voice_dir))
    console.print(f'speak with it: chorus synthesize --voice {voice}{on} --text "Hello."', soft_wrap=True)
    if keep_transcribed is not None and (keep_transcribed / "metadata.csv").is_file() and needs_transcripts(data):
        console.print(
            f"Whisper's transcripts: {keep_transcribed / 'metadata.csv'} (mend any, then: chorus adapt "
            f"{shlex.quote(str(keep_transcribed))} --out {shlex.quote(str(out))} --overwrite)",
            soft_wrap=True,
        )


def _piper_clips(data: Path, one_speaker_check: bool) -> tuple[list[Utterance], dict[str, str]]:
    """The clips a Piper base adapts from (its recipe checks no data of its own): the data checked as on the
    Chorus base (one speaker, enough speech, transcripts that fit, one person's voice), its usable clips, and
    the card's account of what was left out (said as it is on the Chorus base)."""
    if needs_transcripts(data):
        fail(f"{data}: every clip needs its transcript (id|text in metadata.csv) to adapt on a Piper base")
    with user_errors():
        config = AdaptConfig(one_speaker_check=one_speaker_check)
        report = check_adaptation_data(data, config, progress=console.is_terminal)
    say_left_out(report)
    return report.valid_utterances(), left_out_notes(report)


def adapt_on_piper(
    data: Path | list[Utterance],
    out: Path,
    spec: str,
    placement: str,
    steps: int | None,
    learning_rate: float | None,
    max_minutes: float,
    threads: int,
    device: str,
    options: dict | None = None,
    notes: dict[str, str] | None = None,
) -> None:
    """``chorus adapt --base PIPER``: the Piper recipe (:func:`~chorus.training.piper_adapt.adapt_piper`) on the
    base's generator; the voice folder records the base's name and sha256, its card ``notes`` too."""
    from chorus.synthesis.bases import open_base

    with user_errors():
        config = PiperAdaptConfig(
            placement=placement,
            steps=config_default(PiperAdaptConfig, "steps") if steps is None else steps,
            learning_rate=learning_rate,
            max_minutes=max_minutes,
            threads=threads,
            **(options or {}),
        )
        piper = open_base(spec, device=device)
        result = adapt_piper(  # in place: the base was loaded for this voice alone
            data,
            piper.model,
            out,
            config,
            piper.sha256,
            progress=True,
            base_name=piper.name,
            notes=notes,
            in_place=True,
        )
    card = result.card
    loss = f"loss {logged_loss(card.metrics['loss_start'], card.metrics['loss_end'], card.steps, config.log_every)}"
    console.print(
        f"voice: {result.voice_dir}  (on {piper.name}; {trained_on(card, 1)}, {card.steps} steps in "
        f"{card.train_seconds:.0f} s, {card.trainable_parameters:,} trained parameters, {loss}; "
        f"{card.notes['stopped']})"
    )
    voice = shlex.quote(str(result.voice_dir))
    # A voice file's base is recorded by its name alone: the hint gives its path (it had said only --voice).
    on = "" if is_joe(spec) else f" --base {shlex.quote(str(Path(spec).resolve()))}"
    console.print(f'speak with it: chorus synthesize --voice {voice}{on} --text "Hello."', soft_wrap=True)


@with_method_fields
def adapt_many(
    root: Path = typer.Argument(..., help="A folder of speaker folders (LJSpeech-style), one per new voice."),
    out: Path = typer.Option(Path("voices"), help="Each voice is written to OUT/<its folder name>."),
    method: str = typer.Option(
        config_default(ManyVoicesConfig, "adapt").methods.spec,
        help=method_help(" Many voices share one base.", full=False),
    ),
    targets: str | None = typer.Option(None, help=TARGETS_HELP),
    steps: int = typer.Option(config_default(ManyVoicesConfig, "steps"), help="Updates every voice gets."),
    clips_per_voice: int = typer.Option(
        config_default(ManyVoicesConfig, "clips_per_voice"), help="Clips of each voice in every (mixed-voice) batch."
    ),
    learning_rate: float | None = typer.Option(None, help="Default: per method."),
    keep_text_side: bool = config_option(AdaptConfig, "keep_text_side"),
    one_speaker_check: bool = config_option(AdaptConfig, "one_speaker_check"),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
    optimizer: str = config_option(MemoryOptions, "optimizer"),
    model: Path | None = typer.Option(None, help=MODEL_HELP),
    threads: int = typer.Option(config_default(AdaptConfig, "threads"), help="CPU threads."),
    device: str = DEVICE_OPTION,
    method_fields: dict[str, Any] | None = None,
) -> None:
    """Adapt many voices in one job (mixed-voice batches through batched adapters); each voice is
    exported as a standalone voice folder. A voice whose data fails its checks does not stop the others."""
    if out.resolve().is_relative_to(root.resolve()):
        fail(f"--out {out} is the recordings' folder ({root}) or inside it, where voices would be read with them")
    with user_errors():
        problems = [output_folder_problem(out / f.name, f, overwrite) for f in speaker_folders(root)]
    if any(problems):
        found = [p for p in problems if p]
        listed = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        fail(f"{len(found)} voice folder(s) in the way: {listed}")
    with user_errors():
        config = ManyVoicesConfig(
            adapt=AdaptConfig(
                methods=parse_methods(method, method_options(method, method_fields or {}, targets)),
                learning_rate=learning_rate,
                keep_text_side=keep_text_side,
                one_speaker_check=one_speaker_check,
                threads=threads,
                memory=MemoryOptions(optimizer=optimizer),
            ),
            steps=steps,
            clips_per_voice=clips_per_voice,
        )
        bundle = load_bundle(model_folder(model), device)
        result = run_adapt_many(root, bundle, out, config)
    table = Table("voice", "status", "minutes", "held-out mel L1", "folder or reason")
    for outcome in result.outcomes:
        if outcome.status == "ok":
            table.add_row(
                Text(outcome.name),  # Text: a folder's name or a reason is no markup
                "ok",
                f"{outcome.data_minutes:.1f}",
                f"{outcome.validation_mel_l1_start:.3f} -> {outcome.validation_mel_l1_best:.3f}",
                Text(outcome.voice_dir),
            )
        else:
            table.add_row(Text(outcome.name), Text("failed", style="red"), "", "", Text(outcome.message))
    console.print(table)
    trained = sum(o.status == "ok" for o in result.outcomes)
    console.print(
        f"{trained} voice(s) in {result.setup_seconds + result.train_seconds:.0f} s "
        f"({result.steps} steps each; training {result.train_seconds:.0f} s); "
        f"summary in {out}/adapt-many.json"
    )
    failed = len(result.outcomes) - trained
    if failed:  # the others are written; a script still learns that not every voice was made
        console.print(f"{failed} voice(s) failed (above): exit status 1")
        raise typer.Exit(1)
