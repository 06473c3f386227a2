"""``chorus speakers`` and ``chorus synthesize``: the base model's speakers, and speech from text.

``synthesize`` writes each sentence's audio as it is made, into its file or to standard output, and keeps
none of it (memory stays flat however long the text; timestamps keep only their words, with offsets). Text
comes from ``--text``, ``--text-file`` (one clip per line) or standard input: read to its end, or line by
line as each line arrives, an utterance each (as Piper reads it). Long text shows a progress bar on
standard error. Piper's own flags are aliases (``--output_file``, ``--output-raw``, ``--output_dir``,
``--json-input``, ``--length_scale``, ``--noise_scale``, ``-m``, ``-q`` ...), so a command line written
for ``piper`` runs here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from chorus.atomic import atomic_write, atomic_write_text
from chorus.audio.encode import FORMATS, AudioWriter, format_for
from chorus.cli.common import (
    BASE_HELP,
    DEVICE_OPTION,
    chosen_base,
    console,
    errors,
    fail,
    parameter_default,
    user_errors,
)
from chorus.models.bundle import load_bundle
from chorus.synthesis import DEFAULT_BASE, Synthesizer, load_base
from chorus.synthesis.timeline import layout
from chorus.synthesis.voices import Blend, Speaker
from chorus.text.ssml import Pause
from chorus.text.timestamps import Timestamp, captions

MODEL_HELP = "Model folder (default: the shipped base); a Piper voice file (voice.onnx) is taken as --base FILE."
# A bar for text of more sentences than this: shorter text is spoken before a bar would say anything.
PROGRESS_MIN_SENTENCES = 3
STDOUT = Path("-")


def openai_voice(speaker: str | None, speakers: list[str]) -> str | None:
    """``speaker``, or the base speaker an OpenAI voice name ("alloy", "Nova") speaks as, as the server's
    ``/v1/audio/speech`` takes it (its speaker, when this base has it; else the default speaker)."""
    from chorus.serving.settings import OPENAI_VOICE_ALIASES

    if speaker is None or speaker in speakers or speaker.lower() not in OPENAI_VOICE_ALIASES:
        return speaker
    chosen = OPENAI_VOICE_ALIASES[speaker.lower()]
    return chosen if chosen in speakers else None


def speakers(
    model: Path | None = typer.Option(None, help=MODEL_HELP), base: str | None = typer.Option(None, help=BASE_HELP)
) -> None:
    """List the speakers the base model knows (a Piper base has one: its own voice)."""
    from chorus.synthesis.bases.piper import claims as piper_claims

    with user_errors():
        spec = chosen_base(base, model)
        if spec is not None and piper_claims(str(spec)):
            tts = load_base(spec)
            names, default = tts.speakers, tts.base.default_speaker
        else:
            bundle = load_bundle(spec or DEFAULT_BASE)
            names, default = bundle.speakers, bundle.default_speaker
    table = Table("index", "speaker", "default")
    for index, name in enumerate(names):
        table.add_row(str(index), name, "yes" if name == default else "")
    console.print(table)


@dataclass(frozen=True)
class Utterance:
    """One text to speak. ``where`` names it in messages ("--text", "lines.txt:3", "standard input:2");
    ``number`` its line (a clip in a folder is named by it); ``speaker`` a --json-input line's own (None:
    --speaker's); ``out`` its own file (a --json-input line's ``output_file``; None: the command's output)."""

    where: str
    text: str
    number: int = 1
    speaker: str | None = None
    out: Path | None = None


@dataclass
class Spoken:
    """What one output holds so far: its samples (at the model's rate: where the next sentence starts), and
    with ``timed`` (--timestamps) the words and phonemes spoken into it, each shifted to where its sentence
    starts in the output (a few numbers a word: all that grows with the text)."""

    timed: bool = False
    samples: int = 0
    words: list[Timestamp] = field(default_factory=list)
    phonemes: list[Timestamp] = field(default_factory=list)


@dataclass(frozen=True)
class Speech:
    """How every utterance is spoken and written: the synthesizer, the voice, pace and silence, the output's
    format and rate, the ``progress`` callback (one call per sentence made) and the report's table."""

    tts: Synthesizer
    speaker: Speaker | Blend  # resolved once, before any work
    voice: str | None
    speed: float
    sentence_silence: float
    audio_format: str
    sample_rate: int | None
    progress: Callable[[], None]
    table: Table

    def into(
        self,
        writer: AudioWriter,
        spoken: Spoken,
        label: str,
        utterance: Utterance,
        pieces: list[str | Pause],
        final: bool,
    ) -> bool:
        """Speak ``pieces`` into ``writer`` (the output ``label`` names in the report), each sentence written
        as it is made, after a pause if the output already holds audio; ``final``: nothing follows in this
        output (a WAV to a pipe can then state its length). Returns whether anything was spoken; a sentence the
        model cannot read ends the utterance with a message, what was spoken of it kept."""
        if not any(isinstance(p, str) for p in pieces):
            errors.print(
                f"skipped {utterance.where}: nothing speakable in text {utterance.text[:80]!r}", style="yellow"
            )
            return False
        try:
            speaker = self.speaker
            if utterance.speaker is not None:
                speaker = self.tts.resolve_speaker(openai_voice(utterance.speaker, self.tts.speakers))
        except (KeyError, ValueError) as error:
            errors.print(f"skipped {utterance.where}: {error.args[0] if error.args else error}", style="yellow")
            return False
        if spoken.samples and self.sentence_silence:
            pieces = [Pause(self.sentence_silence), *pieces]
        rate = self.tts.sample_rate
        started, seconds, name = spoken.samples, 0.0, ""
        try:
            for index, result in enumerate(self.tts.stream_pieces(pieces, speaker, self.speed, self.voice)):
                if result.text:
                    seconds, name = seconds + result.seconds, result.speaker
                if result.text and spoken.timed:
                    shift = spoken.samples / rate
                    spoken.words += [w.shifted(shift) for w in result.words]
                    spoken.phonemes += [p.shifted(shift) for p in result.phonemes]
                writer.write(result.audio, last=final and index == len(pieces) - 1)
                spoken.samples += len(result.audio)
                if result.text:
                    self.progress()
        except ValueError as error:
            errors.print(f"{'cut short' if name else 'skipped'} {utterance.where}: {error}", style="yellow")
        if not name:
            return False
        duration = (spoken.samples - started) / rate
        text = " ".join(utterance.text.split())[:60]
        self.table.add_row(label, name, f"{duration:.2f}", f"{seconds / duration:.3f}", text)
        return True

    def alone(self, path: Path, utterance: Utterance, pieces: list[str | Pause]) -> bool:
        """``utterance`` alone into the file ``path``; whether anything was spoken (else no file is left)."""

        def write(file: BinaryIO, seekable: bool) -> None:
            writer = AudioWriter(file, self.audio_format, self.tts.sample_rate, self.sample_rate, seekable)
            if not self.into(writer, Spoken(), str(path), utterance, pieces, final=True):
                raise _NothingSpoken()  # before close: not even a header goes out
            writer.close()

        try:
            _into_file(path, write)
        except _NothingSpoken:
            return False
        return True


class _NothingSpoken(Exception):
    """An output into which nothing was spoken: its file is not written (the temporary one is removed)."""


T = TypeVar("T")


def _into_file(path: Path, write: Callable[[BinaryIO, bool], T]) -> T:
    """``write(file, seekable)`` into standard output as it is (a pipe, maybe: never seeked), or into a
    temporary file beside ``path`` that replaces it once complete (:func:`~chorus.atomic.atomic_write`: a
    reader never sees half a file, and a failed or stopped command leaves none without its true sizes)."""
    if path == STDOUT:
        try:
            return write(sys.stdout.buffer, False)
        except BrokenPipeError:
            # The reader left (a player closed, `head -c`): stop, as a Unix filter does, without a traceback
            # (and without the one Python would print flushing standard output at exit).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(1) from None
    done: list[T] = []

    def into(temp: Path) -> None:
        with temp.open("w+b") as file:
            done.append(write(file, True))

    atomic_write(path, into)
    return done[0]


def _write_timestamps(path: Path, spoken: Spoken, sample_rate: int, caption_words: int) -> None:
    """Word and phoneme times as JSON, or word captions as SRT/VTT (``caption_words`` words a cue), by
    ``path``'s suffix."""
    kind = path.suffix.lower().lstrip(".")
    if kind == "json":
        document = {
            "words": [vars(w) for w in spoken.words],
            "phonemes": [vars(p) for p in spoken.phonemes],
            "sample_rate": sample_rate,
        }
        atomic_write_text(path, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    elif kind in ("srt", "vtt"):
        atomic_write_text(path, captions(spoken.words, kind, caption_words))
    else:
        raise ValueError(f"--timestamps {path}: give a .json, .srt or .vtt file")


def _json_line(line: str, where: str, number: int) -> Utterance:
    """A line of Piper's ``--json-input``: ``{"text": ..., "speaker": NAME or "speaker_id": N, "output_file":
    PATH}``, ``text`` required; ``ValueError`` saying what is wrong with it."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a JSON object ({error.msg})") from None
    if not isinstance(item, dict) or not isinstance(item.get("text"), str):
        raise ValueError('a --json-input line is an object with a "text" string')
    speaker = item.get("speaker_id", item.get("speaker"))
    out = item.get("output_file")
    return Utterance(
        where, item["text"], number, None if speaker is None else str(speaker), None if out is None else Path(out)
    )


def _stdin_lines(json_input: bool) -> Iterator[Utterance]:
    """Standard input's lines as they arrive (readline: nothing waits for more input than one line), one
    utterance each; blank lines are skipped, and so is a bad --json-input line, with a message."""
    for number, line in enumerate(iter(sys.stdin.readline, ""), start=1):
        if not line.strip():
            continue
        where = f"standard input:{number}"
        if not json_input:
            yield Utterance(where, line.strip(), number)
            continue
        try:
            yield _json_line(line, where, number)
        except ValueError as error:
            errors.print(f"skipped {where}: {error}", style="yellow")


def _progress_bar(total: int, quiet: bool) -> tuple[Progress | nullcontext, Callable[[], None]]:
    """A bar of ``total`` sentences on standard error (never on standard output, which may carry the audio),
    and the call that advances it; none for short text or ``--quiet``."""
    if quiet or total <= PROGRESS_MIN_SENTENCES:
        return nullcontext(), lambda: None
    bar = Progress(
        TextColumn("speaking"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sentences"),
        TimeRemainingColumn(),
        console=errors,
    )
    task = bar.add_task("speaking", total=total)
    return bar, lambda: bar.advance(task)


def synthesize(
    text: str | None = typer.Option(
        None, help="Text to speak (any length). Without it: --text-file, or standard input."
    ),
    text_file: Path | None = typer.Option(None, help="File with one utterance per line."),
    speaker: str | None = typer.Option(
        None,
        "--speaker",
        "-s",
        help="A speaker of the base model, by name or index, or a blend such as 'flite-rms(2)+festival-kal(1)' "
        "(default: the model's default speaker).",
    ),
    voice: Path | None = typer.Option(
        None, help="An adapted voice folder (from `chorus adapt`) to speak with; it says which base it needs."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "--output-file",
        "--output_file",
        "-f",
        help="Output file (default out.wav; '-': standard output), written as each sentence is made; its "
        "suffix gives the format unless --format does. With --text-file, a folder of 0001.wav, 0002.wav ... "
        "named by line number.",
    ),
    output_dir: Path | None = typer.Option(
        None,
        "--output-dir",
        "--output_dir",
        "-d",
        help="A folder of one clip per utterance, named by line number (0001.wav ...): the lines of --text-file, "
        "or of standard input as they arrive (each path printed when written, as Piper does).",
    ),
    output_raw: bool = typer.Option(
        False,
        "--output-raw",
        "--output_raw",
        help="Raw 16-bit mono PCM to standard output, each line of standard input spoken as it arrives "
        "(Piper's flag: --out - --format pcm --line-by-line).",
    ),
    line_by_line: bool = typer.Option(
        False,
        "--line-by-line",
        help="Speak each line of standard input as it arrives, as one utterance, into the output (implied by "
        "--output-raw, --output-dir and --json-input). Without it standard input is read to its end first.",
    ),
    json_input: bool = typer.Option(
        False,
        "--json-input",
        "--json_input",
        help='Standard input is Piper\'s JSON lines: {"text": ..., "speaker": NAME or "speaker_id": N, '
        '"output_file": PATH} (speaker and output_file optional), each spoken as it arrives.',
    ),
    audio_format: str | None = typer.Option(
        None, "--format", help=f"Audio format: {', '.join(FORMATS)} (default: by --out's suffix; wav for '-')."
    ),
    sample_rate: int | None = typer.Option(
        None, help="Output sample rate in Hz (default: the model's, 22,050; Opus is written at 8-48 kHz)."
    ),
    sentence_silence: float = typer.Option(
        parameter_default(Synthesizer.synthesize, "sentence_silence"),
        "--sentence-silence",
        "--sentence_silence",
        help="Seconds of silence between sentences (and between utterances in one output).",
    ),
    timestamps: Path | None = typer.Option(
        None, help="Write word and phoneme times: FILE.json, or word captions FILE.srt / FILE.vtt."
    ),
    caption_words: int = typer.Option(
        1, min=1, help="Words per SRT/VTT caption cue (1: a cue for each word as it is said)."
    ),
    base: str | None = typer.Option(None, help=BASE_HELP),
    model: Path | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    vocoder: str | None = typer.Option(
        None,
        help="Vocoder of the Chorus base: griffin-lim, neural (the shipped one), or a folder. Default: the model's.",
    ),
    speed: float | None = typer.Option(None, help="> 1 speaks faster (2: twice as fast), < 1 slower (default 1)."),
    length_scale: float | None = typer.Option(
        None,
        "--length-scale",
        "--length_scale",
        help="Piper's pace: durations times this (1 / --speed; on a Piper base, times the voice's own).",
    ),
    noise_scale: float | None = typer.Option(
        None,
        "--noise-scale",
        "--noise_scale",
        help="A Piper base's generator noise (default: the voice's). The Chorus base has none: ignored, with a warning.",
    ),
    noise_w: float | None = typer.Option(
        None,
        "--noise-w",
        "--noise_w",
        "--noise-w-scale",
        "--noise_w_scale",
        help="A Piper base's phoneme-duration noise (default: the voice's). Ignored on the Chorus base, with a warning.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no report; warnings still show."),
    device: str = DEVICE_OPTION,
) -> None:
    """Speak text with a base speaker or an adapted voice and report the real-time factor.

    echo "Hello there." | chorus synthesize --out - --format mp3 > hello.mp3

    chorus synthesize --base piper-joe --text "Hello there." speaks with Piper's joe voice."""
    from chorus.synthesis.bases.piper import claims as piper_claims

    # Piper's spellings, as Chorus's options.
    if model is not None and piper_claims(str(model)):
        if base is not None:
            fail("give --base or a Piper voice file as --model, not both")
        base, model = str(model), None
    if length_scale is not None:
        if speed is not None:
            fail("give --speed or --length-scale (1 / speed), not both")
        if length_scale <= 0:
            fail(f"--length-scale must be positive, got {length_scale}")
        speed = 1.0 / length_scale
    speed = parameter_default(Synthesizer.synthesize, "speed") if speed is None else speed
    if output_raw:
        if out is not None or output_dir is not None:
            fail("--output-raw writes to standard output: not with --out or --output-dir")
        if audio_format not in (None, "pcm"):
            fail("--output-raw writes raw pcm: not with --format")
        out, audio_format = STDOUT, "pcm"
    if out is not None and output_dir is not None:
        fail("give --out (one file) or --output-dir (a clip per line), not both")

    # Where the text comes from.
    if text is not None and text_file is not None:
        fail("give --text or --text-file, not both")
    from_stdin = text is None and text_file is None
    if (json_input or line_by_line) and not from_stdin:
        fail("--json-input and --line-by-line read standard input: not with --text or --text-file")
    by_line = from_stdin and (line_by_line or json_input or output_raw or output_dir is not None)
    utterances: Iterable[Utterance]
    if from_stdin:
        if sys.stdin is None or sys.stdin.isatty():
            fail("give --text, --text-file, or text on standard input")
        if by_line:
            utterances = _stdin_lines(json_input)
        else:
            text = sys.stdin.read()
            if not text.strip():
                fail("standard input is empty: nothing to speak")
            utterances = [Utterance("standard input", text)]
    elif text_file is not None:
        if not text_file.is_file():
            fail(f"{text_file}: no such file")
        utterances = [
            Utterance(f"{text_file}:{number}", line.strip(), number)
            for number, line in enumerate(text_file.read_text(encoding="utf-8").splitlines(), start=1)
            if line.strip()
        ]
        if not utterances:
            fail(f"{text_file}: no text lines")
    else:
        utterances = [Utterance("--text", text)]

    # Where the audio goes: one output for everything, or a folder of one clip per line.
    out = out or Path("out.wav")
    if text_file is not None and out == STDOUT:
        fail("--text-file writes one file per line; --out - takes --text or standard input")
    folder = output_dir
    if folder is None and text_file is not None:
        folder = out if out.suffix == "" else out.parent / out.stem
    to_stdout = folder is None and out == STDOUT
    report = errors if to_stdout or output_raw else console  # standard output carries the audio
    # WAV unless told otherwise where no file name says: standard output, a folder of clips.
    implicit_wav = to_stdout or (folder is not None and (output_dir is not None or out.suffix == ""))
    with user_errors():
        chosen_format = format_for(None if implicit_wav else out, audio_format or ("wav" if implicit_wav else None))
    if timestamps is not None and (folder is not None or json_input):
        fail("--timestamps goes with one output (--text or standard input into --out), not a clip per line")
    if voice is not None and speaker is not None:
        fail("give --speaker (a base speaker) or --voice (an adapted voice), not both")

    with user_errors():
        tts = load_base(chosen_base(base, model, voice), vocoder, device=device)
        speaker_voice = tts.resolve_speaker(openai_voice(speaker, tts.speakers))  # checked (and a blend parsed) once
        voice_name = tts.load_voice(voice) if voice is not None else None
        _set_noise(tts, noise_scale, noise_w)

    # Laid out first where the whole text is known, so the bar knows how many sentences there are.
    jobs: Iterable[tuple[Utterance, list[str | Pause]]]
    if by_line:
        jobs = ((u, layout(u.text, sentence_silence=sentence_silence)) for u in utterances)
        total = 0
    else:
        jobs = [(u, layout(u.text, sentence_silence=sentence_silence)) for u in utterances]
        total = sum(isinstance(p, str) for _, pieces in jobs for p in pieces)
    bar, advance = _progress_bar(total, quiet)
    table = Table("file", "speaker / voice", "seconds", "RTF", "text")
    speech = Speech(tts, speaker_voice, voice_name, speed, sentence_silence, chosen_format, sample_rate, advance, table)
    with bar, user_errors():
        if folder is not None:
            suffix = FORMATS[chosen_format].suffixes[0]
            written = []
            for utterance, pieces in jobs:
                path = utterance.out or folder / f"{utterance.number:04d}{suffix}"
                if speech.alone(path, utterance, pieces):
                    written.append((path, utterance.text))
                    if by_line:  # as Piper prints it: a program reading the lines knows each file is ready
                        report.print(str(path), soft_wrap=True)
            rows = [(path, line) for path, line in written if path.parent == folder]
            if rows:  # id|text beside the clips, so `chorus eval FOLDER` can judge them as they are
                atomic_write_text(folder / "metadata.csv", "".join(f"{p.stem}|{t}\n" for p, t in rows))
            done = bool(written)
        else:
            spoken = _speak_into_one(speech, jobs, out, by_line, report, timed=timestamps is not None)
            if spoken is not None and timestamps is not None:
                _write_timestamps(timestamps, spoken, tts.sample_rate, caption_words)
            done = spoken is not None
    if not quiet:
        report.print(table)
    if not done:
        fail("nothing was synthesized (see the skipped lines above)")


def _speak_into_one(
    speech: Speech,
    jobs: Iterable[tuple[Utterance, list[str | Pause]]],
    out: Path,
    by_line: bool,
    report: Console,
    timed: bool,
) -> Spoken | None:
    """Every utterance into the one output ``out`` (standard output or a file), one after another, a pause
    between them (a --json-input line with its own ``output_file`` goes there instead, its path printed);
    what the output holds (its timestamps kept if ``timed``), or None if nothing was spoken into it or
    elsewhere (then no file is left)."""
    jobs = jobs if by_line else list(jobs)
    elsewhere = False

    def write(file: BinaryIO, seekable: bool) -> Spoken:
        nonlocal elsewhere
        writer = AudioWriter(file, speech.audio_format, speech.tts.sample_rate, speech.sample_rate, seekable)
        spoken = Spoken(timed)
        for index, (utterance, pieces) in enumerate(jobs):
            if utterance.out is not None:
                if speech.alone(utterance.out, utterance, pieces):
                    elsewhere = True
                    report.print(str(utterance.out), soft_wrap=True)
                continue
            final = not by_line and index == len(jobs) - 1
            speech.into(writer, spoken, str(out), utterance, pieces, final)
        if not spoken.samples:
            raise _NothingSpoken()  # before close: not even a header goes out
        writer.close()
        return spoken

    try:
        return _into_file(out, write)
    except _NothingSpoken:
        return Spoken() if elsewhere else None


def _set_noise(tts: Synthesizer, noise_scale: float | None, noise_w: float | None) -> None:
    """Piper's noise scales on a Piper base; on the Chorus base a warning that they are ignored: it samples no
    noise (durations and spectra are predicted, not drawn), and Piper's scripts pass them on every call, so
    ignoring keeps those scripts running where refusing would stop them."""
    if noise_scale is None and noise_w is None:
        return
    if tts.base.kind != "piper":
        errors.print(
            "warning: --noise-scale and --noise-w set a Piper base's sampling noise; the Chorus base draws none "
            "(its durations and spectra are predicted): ignored"
        )
        return
    changes = {k: v for k, v in (("noise_scale", noise_scale), ("noise_w", noise_w)) if v is not None}
    tts.base.settings = dataclasses.replace(tts.base.settings, **changes)
