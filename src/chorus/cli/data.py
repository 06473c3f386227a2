"""``chorus data check`` and ``chorus corpus build``: datasets checked, and the offline corpus made."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import typer
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from chorus.cli.common import command_group, console, fail, parameter_default, user_errors
from chorus.corpus.build import RequirementsError, build_corpus, check_requirements
from chorus.corpus.speakers import get_speaker
from chorus.data.check import (
    VOICE_MIN_SPEECH_SECONDS,
    CheckConfig,
    DatasetReport,
    Problem,
    check_dataset,
    format_report,
    tenths_down,
)
from chorus.data.formats import AUDIO_SUFFIXES, needs_transcripts

data_app = command_group(help="Inspect datasets.", no_args_is_help=True)
corpus_app = command_group(help="Build the offline multi-speaker training corpus.", no_args_is_help=True)

LOW_DISK_BYTES = 50_000_000  # under this free on the corpus disk, failed clips are said to be its want of space


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="LJSpeech-style folder, a folder of them, or id|speaker|text metadata."),
    max_problems: int = typer.Option(
        parameter_default(format_report, "max_problems"), help="Problems to list (0 = all)."
    ),
    jobs: int = typer.Option(parameter_default(check_dataset, "jobs"), help="Threads reading audio."),
    listen: bool = typer.Option(
        False,
        help="Also have Whisper listen to each usable clip for its transcript, and flag the ones it does not hear: "
        "another clip's line, or other words (one or two words wrong, or a sentence left out, pass); about half a "
        "second a clip.",
    ),
    one_speaker_check: bool = typer.Option(
        True,
        help="Of one speaker's folder, have the shipped speaker encoder tell whether its clips sound like two people, "
        "as `chorus adapt` does (and refuses them).",
    ),
) -> None:
    """Per speaker: clips, minutes, and every problem with its file and line. Exit 1 if any (a line left for
    Whisper, `id|`, is none), or if `chorus adapt` would refuse one speaker's folder as two people's. Too little
    speech for a voice is said, with exit 0: the same folder may serve pretraining.
    Recordings without transcripts are named as `chorus adapt` takes them: it has Whisper transcribe them."""
    untranscribed = needs_transcripts(root)
    if untranscribed and not (root / "metadata.csv").is_file():
        recordings = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        console.print(
            f"{root}: {len(recordings)} recording(s) and no metadata.csv: `chorus adapt {root}` cuts them at their "
            "silences and has Whisper transcribe them (their rates are checked before that)",
            soft_wrap=True,
        )
        skipped = _skipped_before_transcribing(recordings)
        for line in skipped:
            console.print(f"{line}; `chorus adapt` skips it", soft_wrap=True)
        raise typer.Exit(1 if skipped else 0)
    report = check_dataset(root, progress=console.is_terminal, jobs=jobs)
    unheard = transcripts_not_heard(report) if listen else []
    report = report.with_problems(unheard)
    for renderable in format_report(report, max_problems):
        console.print(renderable)
    others, two_people = report.problems, None
    if listen and not unheard:
        console.print(f"Whisper heard the transcript of each of the {len(report.valid_utterances())} usable clips.")
    if untranscribed:  # lines left for Whisper are no fault: adapt transcribes them
        others = [problem for problem in report.problems if problem.kind != "empty_text"]
        console.print(
            f"Lines with no text (id|): `chorus adapt {root}` has Whisper transcribe those clips.", soft_wrap=True
        )
    if len(report.speakers) == 1:
        trainable = _trainable(report, untranscribed)
        _speech_for_a_voice(report, trainable)
        if one_speaker_check and (two_people := _two_people(report, trainable)):
            console.print(f"`chorus adapt` refuses them: {two_people}.", soft_wrap=True)
        for warning in report.warning_notes().values():
            console.print(f"Note: {warning}.", soft_wrap=True)
    raise typer.Exit(1 if others or two_people else 0)


def _skipped_before_transcribing(recordings: list[Path]) -> list[str]:
    """Why `chorus adapt` would skip each recording it skips before transcribing, as it says it: made below
    the data check's rate ("PATH: recorded at N Hz (minimum ...)", read from its header), or unreadable."""
    from chorus.audio.io import AudioError, load_audio, recorded_rate

    least = CheckConfig().min_sample_rate
    skipped = []
    for path in recordings:
        rate = recorded_rate(path)
        if rate is None:  # no header either reader takes: decoded as adapt would try it, for its error
            try:
                load_audio(path, min_rate=least)
            except AudioError as error:
                skipped.append(str(error))
        elif rate < least:
            skipped.append(f"{path}: recorded at {rate} Hz (minimum {least} Hz)")
    return skipped


def _trainable(report: DatasetReport, untranscribed: bool) -> list:
    """The clips `chorus adapt` trains on: the usable ones and, where lines are left for Whisper (``id|``), the
    clips whose one fault is that empty line (adapt transcribes them first)."""
    if not untranscribed:
        return report.valid_utterances()
    faulty = {p.utterance.key for p in report.problems if p.utterance is not None and p.kind != "empty_text"}
    return [u for u in report.utterances if u.key not in faulty]


def _speech_for_a_voice(report: DatasetReport, clips: list) -> None:
    """Say so when one speaker's ``clips`` (:func:`_trainable`) hold too little speech for `chorus adapt` (not a
    problem of the data as such: the same folder may serve pretraining)."""
    speech = report.speech_seconds(clip.key for clip in clips)
    if speech < VOICE_MIN_SPEECH_SECONDS:
        console.print(
            f"Too little for `chorus adapt`: the usable clips hold {tenths_down(speech)} s of speech, and a voice "
            f"needs {VOICE_MIN_SPEECH_SECONDS:g} s; "
            + ("mend the clips with problems above, or record more." if report.problems else "record more clips."),
            soft_wrap=True,
        )


def _two_people(report: DatasetReport, clips: list) -> str | None:
    """Why `chorus adapt` would refuse one speaker's ``clips`` (:func:`_trainable`) as two people's, or None."""
    from chorus.training.adapt import DataRefused, check_one_speaker  # torch and the speaker encoder: not for --help

    with console.status("listening for a second voice (Chorus's speaker encoder)"):
        try:
            check_one_speaker(report.root, clips, report.narrow_band)
        except DataRefused as refused:  # its reason, and this command's advice (adapt's flag trains anyway)
            return f"{refused.reason} (`chorus adapt --no-one-speaker-check` trains anyway)"
    return None


def transcripts_not_heard(report: DatasetReport) -> list[Problem]:
    """:func:`~chorus.evaluation.transcripts_heard.not_heard` with a progress bar."""
    from chorus.evaluation.transcripts_heard import not_heard

    with Progress(disable=not console.is_terminal, transient=True) as bar:
        task = bar.add_task("listening", total=len(report.valid_utterances()))
        return not_heard(report, advance=lambda: bar.advance(task))


@corpus_app.command("build")
def corpus_build(
    out_dir: Path = typer.Argument(
        ...,
        help="Output folder: train/, heldout/, vocoder/, encoder/, natural/ (a folder per speaker each), voices.json.",
    ),
    scale: float = typer.Option(
        parameter_default(build_corpus, "utterances_scale"),
        help="Multiply every speaker's utterance count (0.1 for a quick try).",
    ),
    jobs: int = typer.Option(parameter_default(build_corpus, "jobs"), help="Speakers synthesized in parallel."),
    install: bool = typer.Option(False, help="apt-get install missing Debian packages of the sources first (root)."),
    speakers: str | None = typer.Option(
        None, help="Comma-separated speaker names to build (default: all); e.g. piper-joe,flite-slt,festival-ked."
    ),
) -> None:
    """Synthesize the offline multi-speaker corpus with each speaker's source (espeak-ng, flite, festival,
    Piper); resumable: re-running skips finished clips."""
    try:
        chosen = [get_speaker(name.strip()) for name in speakers.split(",")] if speakers else None
        check_requirements(chosen, install=install)
    except KeyError as error:
        console.print(error.args[0], style="red")
        raise typer.Exit(2) from error
    except (RequirementsError, subprocess.CalledProcessError) as error:
        console.print(str(error), style="red")
        raise typer.Exit(1) from error
    with user_errors():
        summary = build_corpus(out_dir, utterances_scale=scale, jobs=jobs, speakers=chosen)
    table = Table(title=f"Corpus in {summary.out_dir}")
    for column in ("speaker", "split", "source", "gender", "clips", "minutes", "new", "failed"):
        table.add_column(column, justify="right" if column in ("clips", "minutes", "new", "failed") else "left")
    for speaker in summary.speakers:
        table.add_row(
            speaker.name,
            speaker.split,
            speaker.engine,
            speaker.gender,
            str(speaker.clips),
            f"{speaker.minutes:.1f}",
            str(speaker.written),
            str(speaker.failed),
        )
    table.add_row(
        Text("total", style="bold"),
        "",
        "",
        "",
        Text(str(summary.clips), style="bold"),
        Text(f"{summary.hours * 60:.1f}", style="bold"),
        str(summary.written),
        str(summary.failed),
    )
    console.print(table)
    for speaker in summary.speakers:
        for failure in speaker.failures:
            console.print(f"skipped {failure}", style="yellow")
    console.print(f"{summary.clips} clips, {summary.hours:.2f} h, built in {summary.elapsed_s / 60:.1f} min")
    if summary.failed:
        free = shutil.disk_usage(out_dir).free
        if free < LOW_DISK_BYTES:  # libsndfile says only "System error." when a write fails for want of space
            console.print(f"{out_dir} is on a disk with {free / 1e6:.1f} MB free: clips cannot be written", style="red")
        if not summary.clips:  # nothing on disk at all (a rebuild whose one clip fails again is no failure)
            fail(f"no clip was written ({summary.failed} failed): see the reasons above")
