"""The ``chorus`` command line. Thin: parses arguments, calls the library, prints."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Chorus: many voices on one text-to-speech model.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)
data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)
corpus_app = typer.Typer(help="Build the offline multi-speaker training corpus.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(corpus_app, name="corpus")
console = Console()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)  # paths stay copyable
    raise typer.Exit(2)


@contextmanager
def _user_errors():
    """Bad input (files, configs, names) ends the command with its message, not a traceback."""
    try:
        yield
    except KeyError as error:
        _fail(str(error.args[0]) if error.args else repr(error))
    except (ValueError, OSError) as error:
        _fail(str(error))


@app.command()
def pretrain(
    data: Path = typer.Argument(..., help="Corpus root: a folder of LJSpeech-style speaker folders."),
    out: Path = typer.Option(Path("runs/base"), help="Run folder (features, checkpoint/, log.csv, loss.png)."),
    steps: int = typer.Option(30_000, help="Total optimizer steps (a resumed run continues to this)."),
    max_frames: int = typer.Option(4_800, help="Padded mel frames per batch and process."),
    config: Optional[Path] = typer.Option(None, help="JSON file with AcousticConfig fields (new runs only)."),
    default_speaker: Optional[str] = typer.Option(None, help="Voice used when none is asked for."),
    threads: int = typer.Option(2, help="CPU threads per process."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:1 ..."),
) -> None:
    """Pretrain (or resume) the multi-speaker base model. Run under `torchrun` for DDP."""
    from chorus.models.config import AcousticConfig
    from chorus.training.pretrain import PretrainConfig, pretrain as run_pretrain

    with _user_errors():
        model_config = AcousticConfig.from_dict(json.loads(config.read_text())) if config else AcousticConfig()
        recipe = PretrainConfig(data=str(data), out=str(out), model=model_config, steps=steps,
                                max_frames=max_frames, threads=threads, device=device,
                                default_speaker=default_speaker)
        checkpoint = run_pretrain(recipe)
    console.print(f"checkpoint: {checkpoint}")


@app.command()
def speakers(model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base).")) -> None:
    """List the base model's voices."""
    from chorus.training.checkpoint import load_bundle
    from chorus.synthesis import DEFAULT_BASE

    with _user_errors():
        bundle = load_bundle(model or DEFAULT_BASE)
    table = Table("index", "voice", "default")
    for index, name in enumerate(bundle.speakers):
        table.add_row(str(index), name, "yes" if name == bundle.default_speaker else "")
    console.print(table)


@app.command()
def synthesize(
    text: Optional[str] = typer.Option(None, help="Text to speak."),
    text_file: Optional[Path] = typer.Option(None, help="File with one utterance per line."),
    speaker: Optional[str] = typer.Option(None, help="Voice name or index (default: the model's default voice)."),
    out: Path = typer.Option(Path("out.wav"), help="Output WAV; with --text-file, a folder of 0001.wav, 0002.wav ... named by line number."),
    model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base)."),
    vocoder: Optional[str] = typer.Option(
        None, help="Vocoder: griffin-lim, neural (the shipped one), or a folder. Default: the model's."),
    length_scale: float = typer.Option(1.0, help="> 1 speaks slower, < 1 faster."),
) -> None:
    """Speak text with a base voice and report the real-time factor."""
    from chorus.atomic import atomic_write_text
    from chorus.audio.io import save_audio
    from chorus.synthesis import load_base

    if (text is None) == (text_file is None):
        _fail("give exactly one of --text or --text-file")
    if text_file is not None:
        if not text_file.is_file():
            _fail(f"{text_file}: no such file")
        numbered = [(number, line.strip()) for number, line in
                    enumerate(text_file.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]
        if not numbered:
            _fail(f"{text_file}: no text lines")
        # One clip per line, named by its line number so files map back to the text file.
        folder = out if out.suffix == "" else out.parent / out.stem
        jobs = [(f"{text_file}:{number}", line, folder / f"{number:04d}.wav") for number, line in numbered]
    else:
        jobs = [("--text", text, out)]
    with _user_errors():
        tts = load_base(model, vocoder)
        speaker_index = tts.resolve_speaker(speaker)
    table = Table("file", "voice", "seconds", "RTF", "text")
    written: list[tuple[Path, str]] = []
    for where, line, path in jobs:
        try:
            result = tts.synthesize(line, speaker_index, length_scale)
        except ValueError as error:
            console.print(f"[yellow]skipped {where}: {error}[/]")
            continue
        save_audio(path, result.audio, result.sample_rate)
        written.append((path, line))
        table.add_row(str(path), result.speaker, f"{result.duration:.2f}", f"{result.real_time_factor:.3f}",
                      line[:60])
    console.print(table)
    if not written:
        _fail("nothing was synthesized (see the skipped lines above)")
    if text_file is not None:
        # id|text beside the clips, so `chorus eval FOLDER` can judge them as they are.
        atomic_write_text(written[0][0].parent / "metadata.csv", "".join(f"{p.stem}|{t}\n" for p, t in written))


@data_app.command("check")
def data_check(
    root: Path = typer.Argument(..., help="LJSpeech-style folder, a folder of them, or id|speaker|text metadata."),
    max_problems: int = typer.Option(50, help="Problems to list (0 = all)."),
    jobs: int = typer.Option(1, help="Threads reading audio."),
) -> None:
    """Per speaker: clips, minutes, and every problem with its file and line. Exit 1 if any."""
    from chorus.data.check import data_check_command

    raise typer.Exit(data_check_command(root, max_problems, jobs))


@corpus_app.command("build")
def corpus_build(
    out_dir: Path = typer.Argument(..., help="Output folder: train/<voice>/, heldout/<voice>/, voices.json."),
    scale: float = typer.Option(1.0, help="Multiply every voice's utterance count (0.1 for a quick try)."),
    jobs: int = typer.Option(2, help="Voices synthesized in parallel."),
    install: bool = typer.Option(False, help="apt-get install missing Debian packages first (root)."),
) -> None:
    """Synthesize the offline multi-speaker corpus (resumable: re-running skips finished clips)."""
    from chorus.corpus.build import corpus_build_command

    corpus_build_command(out_dir, scale, jobs, install)


@app.command("eval")
def evaluate(
    audio_dir: Path = typer.Argument(..., help="Folder of <id>.wav clips to judge."),
    metadata: Optional[Path] = typer.Option(None, help="id|text file (default: AUDIO_DIR/metadata.csv)."),
    references: Optional[Path] = typer.Option(None, help="Real clips of the target voice (same ids: MCD, F0)."),
    out: Optional[Path] = typer.Option(None, help="Write report.md/report.json here (or a .md/.json file)."),
) -> None:
    """Judge synthesized clips: Whisper WER/CER, speaker similarity, MCD, F0 RMSE, speaking rate."""
    from chorus.evaluation.report import eval_command

    with _user_errors():
        eval_command(audio_dir, metadata, references, out)


@app.command("train-vocoder")
def train_vocoder(
    data: Path = typer.Argument(..., help="Folder of LJSpeech-style speaker folders (any **/wavs/*.wav)."),
    out: Path = typer.Option(Path("runs/vocoder"), help="Run folder; the trained vocoder is saved here."),
    steps: int = typer.Option(20_000, help="Total steps (a resumed run continues to this)."),
    resume: bool = typer.Option(True, help="Continue from OUT's checkpoint if there is one."),
    threads: int = typer.Option(1, help="CPU threads."),
) -> None:
    """Train the Vocos-style neural vocoder on real (or corpus) audio."""
    from chorus.training.vocoder import train_vocoder_command

    with _user_errors():
        train_vocoder_command(data, out, steps, resume, threads)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo"), help="Folder for the clips and report.md."),
    voices: Optional[str] = typer.Option(None, help="Comma-separated voices (default: four showcase voices)."),
    sentences: int = typer.Option(3, help="Sentences per voice (from the held-out benchmark set)."),
    model: Optional[Path] = typer.Option(None, help="Model folder (default: the shipped base)."),
) -> None:
    """The main job: speak unseen sentences in several base voices and judge them (WER, similarity, RTF)."""
    from chorus.audio.io import save_audio
    from chorus.corpus.text import benchmark_sentences
    from chorus.evaluation.report import Judges
    from chorus.evaluation.voices import judge_clips, same_versus_different, synthesize_grid
    from chorus.synthesis import load_base

    with _user_errors():
        tts = load_base(model)
    chosen = voices.split(",") if voices else tts.bundle.info.get("showcase_speakers", tts.speakers[:4])
    for voice in chosen:
        if voice not in tts.speakers:
            _fail(f"unknown voice {voice!r}; see `chorus speakers`")
    texts = benchmark_sentences()[:sentences]

    def speak(text: str, voice: str):
        result = tts.synthesize(text, voice)
        return result.audio, result.sample_rate, result.seconds

    clips = synthesize_grid(speak, chosen, texts)
    for clip in clips:
        save_audio(out / f"{clip.voice}_{clip.sentence_index:03d}.wav", clip.audio, clip.sample_rate)
    judges = Judges(reference=False)
    report = judge_clips(clips, judges)
    table = Table("voice", "WER %", "RTF", "transcript of the first sentence")
    for voice in chosen:
        rows = [r for r in report.rows if r.id.startswith(voice + "/")]
        edits = sum(r.word_edits for r in rows)
        words = sum(r.reference_words for r in rows)
        rtf = sum(r.synthesis_seconds for r in rows) / sum(r.audio_seconds for r in rows)
        table.add_row(voice, f"{100 * edits / words:.1f}", f"{rtf:.3f}", rows[0].transcript or "")
    console.print(table)
    similarity = same_versus_different(clips, judges.speaker)
    console.print(f"speaker similarity (resemblyzer): same voice {similarity.same:.3f}, "
                  f"different voices {similarity.different:.3f}"
                  + (f" ({similarity.silent_clips} clip(s) had no speech)" if similarity.silent_clips else ""))
    report.write(out / "report.md")
    console.print(f"clips and report.md in {out}/")
