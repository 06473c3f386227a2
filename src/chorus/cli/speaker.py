"""``chorus speaker``: Chorus's own speaker encoder: train, embed, verify, evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

from chorus.cli.common import (
    DEVICE_OPTION,
    command_group,
    config_default,
    console,
    fail,
    interrupt_said,
    user_errors,
)
from chorus.speaker_recognition.bundle import SHIPPED_ENCODER, load_encoder
from chorus.speaker_recognition.encoder import STAGE_BLOCKS, SpeakerEncoderConfig
from chorus.training.progress import step_progress
from chorus.training.speaker_encoder import SPEAKER_OPTIMIZERS, SpeakerTrainConfig, checkpoint_folder

speaker_app = command_group(help="Chorus's speaker encoder: train one, embed clips, verify and evaluate trials.")
ENCODER_HELP = "Encoder folder (default: the one shipped with Chorus)."
# verify's exit status for "different speakers", so that scripts can branch on it (cmp and diff's 1); an error is 2.
DIFFERENT_SPEAKERS = 1
# Speech a clip must hold for its voice to be told (the server's speaker check judges windows of 1.6-3 s).
MIN_SPEECH_SECONDS = 1.0


def _encoder(folder: Path | None, device: str = "cpu", needs_threshold: bool = False):
    """The encoder ``folder`` holds (default: the shipped one); ``needs_threshold``: one whose threshold was
    calibrated (verify's verdict uses it; embed and eval, which do not, take a run's checkpoint too)."""
    folder = folder or SHIPPED_ENCODER
    if not (folder / "config.json").is_file():
        fail(
            f"{folder}: no speaker encoder here; train one with `chorus speaker train CORPUS --out DIR` and pass --encoder DIR"
        )
    with user_errors():
        bundle = load_encoder(folder, device)
    if needs_threshold and "calibration" not in bundle.info:  # a run's checkpoint: it had verified at 0.5
        fail(
            f"{folder}: an encoder whose threshold was never calibrated (a training checkpoint: a run calibrates its "
            "encoder when it ends); give a finished run's folder"
        )
    return bundle


def _check_speaking(files: list[Path], rate: int) -> None:
    """Check that every file holds speech before any is embedded: an empty, silent or noise-only clip has no
    voice to embed (its unit vector had scored 'same speaker' against another), and a file that cannot be
    read ends the command before the work, not after it. Each clip is let go once checked: the embedding
    reads the files again, so a thousand clips are never in memory together."""
    from chorus.audio.io import load_audio
    from chorus.audio.speech_activity import speech_activity

    problems = []
    with step_progress("reading clips", len(files) > 20) as bar:
        task = bar.add_task("clips", total=len(files), status="")
        for file in bar.track(files, task_id=task):
            try:
                audio = load_audio(file, rate)
            except (OSError, ValueError, RuntimeError) as error:
                problems.append(str(error) if str(file) in str(error) else f"{file}: {error}")
                continue
            heard = speech_activity(audio, rate).speech_seconds if audio.size else 0.0
            if heard < MIN_SPEECH_SECONDS:
                problems.append(
                    f"{file}: {heard:.1f} s of speech heard; at least {MIN_SPEECH_SECONDS:g} s is needed to tell a voice"
                )
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        fail("cannot tell: " + "; ".join(problems[:10]) + more)


@speaker_app.command()
def train(
    corpus: Path = typer.Argument(..., help="A folder of speaker folders (LJSpeech-style), e.g. corpus_out/train."),
    out: Path = typer.Option(..., help="Encoder folder to write."),
    arch: str = typer.Option("resnet", help=f"Trunk: {', '.join(STAGE_BLOCKS)}."),
    depth: int = typer.Option(18, help="resnet: 10, 18, 34, 50; df-resnet: 56, 110, 179."),
    reversible: bool = typer.Option(False, "--reversible", help="Reversible stages: no block activations kept."),
    optimizer: str = typer.Option("adam", help=f"{', '.join(SPEAKER_OPTIMIZERS)}."),
    steps: int = typer.Option(config_default(SpeakerTrainConfig, "steps"), help="Training steps."),
    threads: int = typer.Option(config_default(SpeakerTrainConfig, "threads"), help="CPU threads."),
    seed: int = typer.Option(config_default(SpeakerTrainConfig, "seed"), help="Random seed."),
    augment_share: float = typer.Option(
        config_default(SpeakerTrainConfig, "augment_share"),
        help="Share of training crops given a random room, noise, microphone and channel on the fly (0: none).",
    ),
    augment_copies: int = typer.Option(
        config_default(SpeakerTrainConfig, "augment_copies"),
        help="Fixed augmented copies of each clip made before training (the older recipe).",
    ),
    checkpoint_every: int = typer.Option(
        config_default(SpeakerTrainConfig, "checkpoint_every"), help="Steps between checkpoints (OUT/checkpoint)."
    ),
    resume: Path | None = typer.Option(
        None,
        help="Continue from this checkpoint (a run folder or its checkpoint/) up to --steps in all, with its own "
        "network and margins (--arch/--depth/--reversible are the run's).",
    ),
    init: Path | None = typer.Option(
        None,
        help="Start from this checkpoint's encoder and AAM head (same speakers; its architecture, not "
        "--arch/--depth/--reversible) with a fresh optimizer and schedule, the margin on from the first step.",
    ),
    device: str = DEVICE_OPTION,
    workers: int = typer.Option(
        config_default(SpeakerTrainConfig, "workers"),
        help="Processes making the training crops while the steps run (0: the training process itself).",
    ),
    max_minutes: float | None = typer.Option(
        None, help="Wall-clock budget of the steps: plan the schedules over the steps that fit, at most --steps."
    ),
) -> None:
    """Train a speaker encoder; its threshold is calibrated on clips held out of every speaker.
    OUT also gets the checkpoint (checkpoint/) and the loss curve (loss.csv, loss.png)."""
    from chorus.training.speaker_encoder import train_speaker_encoder

    with user_errors(), interrupt_said():
        if init is not None and resume is not None:
            fail("give --resume (the same run, on) or --init (a new run from its weights), not both")
        encoder = SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible)
        margins = {"margin_start": 0.0, "margin_full": 0.0} if init is not None else {}
        if init is not None:
            encoder = load_encoder(checkpoint_folder(init)).encoder.config
        if resume is not None:  # the run's own network and margins, not the options' defaults: a run started with
            # --init had been refused on resume (its encoder came from the init, its margins were 0)
            saved = _saved_recipe(resume)
            encoder = SpeakerEncoderConfig.from_dict(saved["encoder"])
            margins = {name: saved[name] for name in ("margin_start", "margin_full")}
        config = SpeakerTrainConfig(
            corpus=str(corpus),
            out=str(out),
            encoder=encoder,
            optimizer=optimizer,
            steps=steps,
            threads=threads,
            seed=seed,
            augment_share=augment_share,
            augment_copies=augment_copies,
            checkpoint_every=checkpoint_every,
            device=device,
            workers=workers,
            max_minutes=max_minutes,
            # From a trained head the classes are already apart: the margin's warm-up is not needed.
            **margins,
        )
        folder = train_speaker_encoder(config, resume=resume, init=init)
    info = load_encoder(folder).info
    console.print(
        f"encoder: {folder} ({info['speakers']} speakers, {info['steps']} steps in {info['train_seconds']:.0f} s; "
        f"held-out EER {100 * info['calibration']['eer']:.1f}%)"
    )


def _saved_recipe(resume: Path) -> dict:
    """The recipe saved in the checkpoint ``resume`` names (a run folder or its checkpoint/)."""
    from chorus.training.checkpoint import load_training_state

    state = load_training_state(checkpoint_folder(resume))
    if state is None:
        raise ValueError(f"{resume}: no speaker encoder checkpoint to start from")
    return state.meta["config"]


@speaker_app.command()
def embed(
    files: list[Path] = typer.Argument(..., help="Audio files, one embedding each."),
    out: Path = typer.Option(..., help="FILE.npy (an [N, D] array, rows in the order given) or FILE.json."),
    encoder: Path | None = typer.Option(None, help=ENCODER_HELP),
    device: str = DEVICE_OPTION,
) -> None:
    """Embed audio files: one unit-length row per file, in the order given."""
    if out.suffix not in (".npy", ".json"):
        fail(f"--out {out}: give a .npy or .json file")
    if out.is_dir() or not out.parent.is_dir():  # said before the work, not after it
        fail(f"--out {out}: {'a folder' if out.is_dir() else f'no folder {out.parent} to write it in'}")
    bundle = _encoder(encoder, device)
    _check_speaking(files, bundle.mel_config.sample_rate)
    with user_errors():
        embeddings = bundle.embed(files)
        if out.suffix == ".npy":
            np.save(out, embeddings)
        else:
            out.write_text(json.dumps({"files": [str(f) for f in files], "embeddings": embeddings.tolist()}))
    console.print(f"{len(files)} embedding(s) of {embeddings.shape[1]} numbers: {out}")


@speaker_app.command()
def verify(
    a: Path = typer.Argument(..., help="One clip (the reference: a consent, an enrollment)."),
    b: Path = typer.Argument(..., help="Another clip (the one to check)."),
    encoder: Path | None = typer.Option(
        None, help="Judge by this encoder's plain cosine and its own threshold instead of the server's check."
    ),
    device: str = DEVICE_OPTION,
) -> None:
    """Whether two clips are the same speaker, judged as the server's consent check judges a consent and a
    sample: resemblyzer and Chorus's consent encoder, each normalized against the shipped cohort heard
    through the clips' channel, summed, against the threshold calibrated for that channel class.
    Exit status, as cmp and diff give theirs: 0 same speaker, 1 different speakers, 2 trouble (cannot tell)."""
    if encoder is not None:
        bundle = _encoder(encoder, device, needs_threshold=True)
        _check_speaking([a, b], bundle.mel_config.sample_rate)
        with user_errors():
            first, second = bundle.embed([a, b])
        score, same = bundle.verify(first, second)
        verdict = "same speaker" if same else "different speakers"
        console.print(f"score {score:.3f} (threshold {bundle.threshold:.3f}): {verdict}")
        raise typer.Exit(0 if same else DIFFERENT_SPEAKERS)
    if device != "cpu":  # it had been taken and dropped: the fused check's embedders run on the CPU
        fail(f"--device {device}: the server's check runs on the CPU; --device applies with --encoder")
    from chorus.audio.io import SAMPLE_RATE, load_audio
    from chorus.speaker_recognition.voice_match import (
        A_PART_DIFFERS,
        UnusableRecording,
        describe_class,
        fused_consent_match,
    )

    with user_errors():
        first, second = load_audio(a), load_audio(b)
    try:
        check = fused_consent_match()
        verdict = check.match(first, SAMPLE_RATE, second, SAMPLE_RATE)
    except UnusableRecording as error:
        fail(f"cannot tell: {error}")
    except Exception as error:  # noqa: BLE001 - exit 1 means "different speakers": trouble must not read as it
        fail(f"cannot tell: {type(error).__name__}: {error}")
    threshold = check.settings.threshold_for(verdict.threshold_key)
    console.print(
        f"score {verdict.score:.2f} (threshold {threshold:.2f} for {describe_class(verdict.threshold_key)}; "
        "resemblyzer + Chorus consent encoder, cohort-normalized)"
    )
    if verdict.accepted:
        console.print("same speaker")
        raise typer.Exit(0)
    if verdict.reason == A_PART_DIFFERS:  # the whole clips match; a part of the second does not (a new user's probe)
        fail(
            "cannot tell: the clips score as one speaker, but part of the second does not match the rest or the "
            "first: another voice in it, or too little speech in that part to tell (clips of 10 s or more are "
            "judged surely)"
        )
    console.print("different speakers")
    raise typer.Exit(DIFFERENT_SPEAKERS)


@speaker_app.command("eval")
def evaluate(
    trials: Path = typer.Argument(
        ..., help="Trials file: lines 'LABEL A B' (1 same, 0 different; paths relative to it)."
    ),
    encoder: Path | None = typer.Option(None, help=ENCODER_HELP),
    p_target: float = typer.Option(0.01, help="Prior of a target trial for minDCF."),
    device: str = DEVICE_OPTION,
) -> None:
    """Equal error rate and minDCF of a trials file (VoxCeleb's format)."""
    from chorus.speaker_recognition.verification import read_trials, score_trials

    if not 0 < p_target < 1:  # before the trials are scored: 0 and 1 had given nan, 1.5 a meaningless 1.000
        fail(f"--p-target {p_target:g}: the prior of a same-speaker trial lies strictly between 0 and 1")
    bundle = _encoder(encoder, device)
    with user_errors():
        scores = score_trials(bundle, read_trials(trials), p_target)
    console.print(
        f"{scores.trials} trials ({scores.targets} same speaker): EER {100 * scores.eer:.2f}%, "
        f"minDCF(p={p_target:g}) {scores.min_dcf:.3f}, EER threshold {scores.eer_threshold:.3f}"
    )
