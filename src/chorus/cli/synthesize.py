"""``chorus speakers`` and ``chorus synthesize``: the base model's speakers, and speech from text.

``synthesize`` writes each sentence's audio as it is made, into its file or to standard output, and keeps
none of it (memory stays flat however long the text; timestamps keep only their words, with offsets). Text
comes from ``--text``, ``--text-file`` (one clip per line) or standard input: read to its end, or line by
line as each line arrives, an utterance each (as Piper reads it). Long text shows a progress bar on
standard error. Piper's own flags are aliases (``--output_file``, ``--output-raw``, ``--output_dir``,
``--json-input``, ``--length_scale``, ``--noise_scale``, ``-m``, ``-c``, ``-q`` ...), so a command line written
for ``piper`` runs here.

The command reads its options as one :class:`SynthesizeOptions` and runs named steps on it: Piper's
spellings, the text (:mod:`chorus.cli.synthesis_input`), where the audio goes, the voice, the progress bar,
then the speaking and writing (:mod:`chorus.cli.synthesis_output`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from chorus.audio.encode import FORMATS, MAX_RATE, MIN_RATE, format_for, output_rate
from chorus.cli.common import (
    BASE_HELP,
    DEVICE_OPTION,
    chosen_base,
    console,
    errors,
    fail,
    parameter_default,
    skipped,
    user_errors,
)
from chorus.cli.option_fields import given_option, option, takes_options
from chorus.cli.synthesis_input import Utterance, utterances
from chorus.cli.synthesis_output import (
    STDOUT,
    Job,
    Speech,
    into_folder,
    into_one,
    write_timestamps,
)
from chorus.synthesis import Synthesizer, load_base
from chorus.synthesis.timeline import MAX_SENTENCE_SILENCE, layout
from chorus.synthesis.voices import Blend, Speaker
from chorus.text.sentences import MAX_SPEED, MIN_SPEED  # the speeds `chorus serve` and OpenAI's API take
from chorus.text.ssml import SsmlError

MODEL_HELP = "Model folder (default: the shipped base); a Piper voice file (voice.onnx) is taken as --base FILE."
# A bar for text of more sentences than this: shorter text is spoken before a bar would say anything.
PROGRESS_MIN_SENTENCES = 3


def speakers(
    model: Path | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    base: str | None = typer.Option(None, help=BASE_HELP),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print JSON for scripts: [{"index": 0, "name": ..., "default": true, "openai_names": [...]}, ...].',
    ),
) -> None:
    """List the speakers the base model knows (a Piper base has one: its own voice), and which of OpenAI's voice
    names (alloy, echo, ...; --speaker takes them too) speaks as each."""
    from chorus.synthesis.bases import base_speakers
    from chorus.synthesis.voices import OPENAI_VOICE_ALIASES, openai_voice

    with user_errors():  # as `synthesize` reads --base: "chorus", a wrong name and a Piper voice file alike
        names, default = base_speakers(chosen_base(base, model))
    aliases = {name: [] for name in names}
    for alias in OPENAI_VOICE_ALIASES:
        aliases[openai_voice(alias, names) or default].append(alias)
    if as_json:
        rows = [
            {"index": index, "name": name, "default": name == default, "openai_names": aliases[name]}
            for index, name in enumerate(names)
        ]
        print(json.dumps(rows, indent=2))  # plain print: rich would colour and wrap what a script parses
        return
    table = Table("index", "speaker", "default", "OpenAI's names")
    for index, name in enumerate(names):
        table.add_row(str(index), name, "yes" if name == default else "", ", ".join(aliases[name]))
    console.print(table)


@dataclass(frozen=True)
class SynthesizeOptions:
    """The command line of ``chorus synthesize``, one field an option (in the order --help lists them)."""

    # As espeak-ng, say and gtts-cli take it: `chorus synthesize "Hello there."` (or unquoted, words joined).
    words: list[str] | None = given_option(
        typer.Argument(None, metavar="TEXT", show_default=False, help="Text to speak, as --text takes it.")
    )
    text: str | None = option(None, help="Text to speak (any length). Without it: --text-file, or standard input.")
    text_file: Path | None = option(
        None,
        help="File with one utterance per line, each into its clip in a folder: --output-dir, or --out's name "
        "without its suffix (--out lines.wav: lines/0001.wav ...).",
    )
    speaker: str | None = option(
        None,
        "--speaker",
        "-s",
        help="A speaker of the base model, by name or index, or a blend such as 'flite-rms(2)+festival-kal(1)' "
        "(default: the model's default speaker).",
    )
    voice: Path | None = option(
        None, help="An adapted voice folder (from `chorus adapt`) to speak with; it says which base it needs."
    )
    out: Path | None = option(
        None,
        "--out",
        "--output-file",
        "--output_file",
        "-f",
        help="Output file (default out.wav; '-': standard output), written as each sentence is made; its "
        "suffix gives the format unless --format does. With --text-file, a folder of 0001.wav, 0002.wav ... "
        "named by line number.",
    )
    output_dir: Path | None = option(
        None,
        "--output-dir",
        "--output_dir",
        "-d",
        help="A folder of one clip per utterance, named by line number (0001.wav ...), and metadata.csv (id|text "
        "of the clips written, replaced): the lines of --text-file, or of standard input as they arrive (each path "
        "printed when written, as Piper does).",
    )
    output_raw: bool = option(
        False,
        "--output-raw",
        "--output_raw",
        help="Raw 16-bit mono PCM to standard output, each line of standard input spoken as it arrives "
        "(Piper's flag: --out - --format pcm --line-by-line).",
    )
    line_by_line: bool = option(
        False,
        "--line-by-line",
        help="Speak each line of standard input as it arrives, as one utterance, into the output (implied by "
        "--output-raw, --output-dir and --json-input). Without it standard input is read to its end first.",
    )
    json_input: bool = option(
        False,
        "--json-input",
        "--json_input",
        help='Standard input is Piper\'s JSON lines: {"text": ..., "speaker": NAME or "speaker_id": N, '
        '"output_file": PATH} (speaker and output_file optional), each spoken as it arrives.',
    )
    audio_format: str | None = option(
        None, "--format", help=f"Audio format: {', '.join(FORMATS)} (default: by --out's suffix; wav for '-')."
    )
    sample_rate: int | None = option(
        None,
        min=MIN_RATE,
        max=MAX_RATE,
        help="Output sample rate in Hz, 8,000-48,000 (default: the model's, 22,050; Opus is written at 8-48 kHz).",
    )
    sentence_silence: float = option(
        parameter_default(Synthesizer.synthesize, "sentence_silence"),
        "--sentence-silence",
        "--sentence_silence",
        min=0.0,
        max=MAX_SENTENCE_SILENCE,
        help=f"Seconds of silence between sentences (and between utterances in one output), at most "
        f"{MAX_SENTENCE_SILENCE:g}.",
    )
    timestamps: Path | None = option(
        None, help="Write word and phoneme times: FILE.json, or word captions FILE.srt / FILE.vtt."
    )
    caption_words: int = option(1, min=1, help="Words per SRT/VTT caption cue (1: a cue for each word as it is said).")
    base: str | None = option(None, help=BASE_HELP)
    model: Path | None = option(None, "--model", "-m", help=MODEL_HELP)
    config: Path | None = option(
        None,
        "--config",
        "-c",
        help="A Piper voice's .onnx.json kept elsewhere than beside its .onnx (Piper's flag; default: the .onnx's "
        "name + .json).",
    )
    vocoder: str | None = option(
        None,
        help="Vocoder of the Chorus base: griffin-lim, neural (the shipped one), or a folder. Default: the model's.",
    )
    speed: float | None = option(
        None,
        min=MIN_SPEED,
        max=MAX_SPEED,
        help=f"> 1 speaks faster (2: twice as fast), < 1 slower (default 1; {MIN_SPEED:g}-{MAX_SPEED:g}, as OpenAI's).",
    )
    length_scale: float | None = option(
        None,
        "--length-scale",
        "--length_scale",
        min=1 / MAX_SPEED,
        max=1 / MIN_SPEED,
        help="Piper's pace: durations times this (1 / --speed; on a Piper base, times the voice's own).",
    )
    noise_scale: float | None = option(
        None,
        "--noise-scale",
        "--noise_scale",
        help="A Piper base's generator noise (default: the voice's). The Chorus base has none: ignored, with a warning.",
    )
    noise_w: float | None = option(
        None,
        "--noise-w",
        "--noise_w",
        "--noise-w-scale",
        "--noise_w_scale",
        help="A Piper base's phoneme-duration noise (default: the voice's). Ignored on the Chorus base, with a warning.",
    )
    quiet: bool = option(False, "--quiet", "-q", help="No progress bar and no report; warnings still show.")
    device: str = given_option(DEVICE_OPTION)


@takes_options(SynthesizeOptions)
def synthesize(options: SynthesizeOptions) -> None:
    """Speak text with a base speaker or an adapted voice and report the real-time factor.

    chorus synthesize "Hello there." --out hello.wav

    echo "Hello there." | chorus synthesize --out - --format mp3 > hello.mp3

    chorus synthesize --base piper-joe --text "Hello there." speaks with Piper's joe voice."""
    options = _piper_spellings(options)
    said, by_line = _text(options)
    destination = _destination(options)
    tts, speaker, voice = _voice(options)
    jobs, total = _laid_out(said, by_line, options.sentence_silence)
    bar, advance = _progress_bar(total, options.quiet)
    table = Table("file", "speaker / voice", "seconds", "RTF", "text")
    speech = Speech(
        tts,
        speaker,
        voice,
        options.speed,
        options.sentence_silence,
        destination.audio_format,
        options.sample_rate,
        advance,
        table,
        given_format=options.audio_format,
    )
    with bar, user_errors():
        done = _speak(speech, jobs, destination, by_line, options)
    if not done:
        fail("nothing was synthesized: no line was spoken (a line skipped is named above)")
    if not options.quiet:
        # Line by line, standard output is Piper's list of files written, read by a program: the table is not one.
        (errors if by_line else destination.report).print(table)


def _piper_spellings(options: SynthesizeOptions) -> SynthesizeOptions:
    """``options`` in Chorus's spellings: a Piper voice file given as --model is --base, --length-scale is
    1 / --speed, --output-raw is --out - --format pcm, the text as an argument is --text; ``speed`` is set
    (its default where not given). Two spellings of one thing that disagree fail."""
    from chorus.synthesis.bases.piper import claims as piper_claims

    base, model, speed = options.base, options.model, options.speed
    if model is not None and piper_claims(str(model)):
        if base is not None:
            fail("give --base or a Piper voice file as --model, not both")
        base, model = str(model), None
    if options.length_scale is not None:
        if speed is not None:
            fail("give --speed or --length-scale (1 / speed), not both")
        speed = 1.0 / options.length_scale
    speed = parameter_default(Synthesizer.synthesize, "speed") if speed is None else speed
    if options.words and options.text is not None:
        fail("give the text once: as an argument or as --text")
    text = " ".join(options.words) if options.words else options.text
    out, audio_format = options.out, options.audio_format and options.audio_format.lower()  # MP3 is mp3
    if options.output_raw:
        if out is not None or options.output_dir is not None:
            fail("--output-raw writes to standard output: not with --out or --output-dir")
        if audio_format not in (None, "pcm"):
            fail("--output-raw writes raw pcm: not with --format")
        out, audio_format = STDOUT, "pcm"
    if out is not None and options.output_dir is not None:
        fail("give --out (one file) or --output-dir (a clip per line), not both")
    return dataclasses.replace(
        options, words=None, text=text, base=base, model=model, speed=speed, out=out, audio_format=audio_format
    )


def _text(options: SynthesizeOptions) -> tuple[Iterable[Utterance], bool]:
    """The utterances to speak, and whether they are standard input's lines, each spoken as it arrives
    (--line-by-line, implied by --json-input, --output-raw and --output-dir)."""
    if options.text is not None and options.text_file is not None:
        fail("give --text or --text-file, not both")
    from_stdin = options.text is None and options.text_file is None
    if (options.json_input or options.line_by_line) and not from_stdin:
        fail("--json-input and --line-by-line read standard input: not with --text or --text-file")
    implied = options.json_input or options.output_raw or options.output_dir is not None
    by_line = from_stdin and (options.line_by_line or implied)
    return utterances(options.text, options.text_file, by_line, options.json_input), by_line


@dataclass(frozen=True)
class _Destination:
    """Where the audio goes: the one output ``out`` (a file, or standard output), or with ``folder`` a clip
    per utterance in it; in ``audio_format``; ``report``: where written paths and the report are printed."""

    out: Path
    folder: Path | None
    audio_format: str
    report: Console


def _destination(options: SynthesizeOptions) -> _Destination:
    """One output for everything, or a folder of one clip per line (--output-dir, or --out beside
    --text-file), and the format: the one given, else by the file's suffix."""
    out = options.out or Path("out.wav")
    if options.text_file is not None and out == STDOUT:
        fail("--text-file writes one file per line; --out - takes --text or standard input")
    folder = options.output_dir
    if folder is None and options.text_file is not None:
        folder = out if out.suffix == "" else out.parent / out.stem
        if out.suffix:  # a file was named: say where its clips go instead (a new user looked for it)
            errors.print(f"--text-file speaks each line into its own clip: into {folder}/, not {out}")
    to_stdout = folder is None and out == STDOUT
    # WAV unless told otherwise where no file name says: standard output, a folder of clips.
    implicit_wav = to_stdout or (folder is not None and (options.output_dir is not None or out.suffix == ""))
    with user_errors():
        chosen_format = format_for(
            None if implicit_wav else out, options.audio_format or ("wav" if implicit_wav else None)
        )
    if options.timestamps is not None and (folder is not None or options.json_input):
        fail("--timestamps goes with one output (--text or standard input into --out), not a clip per line")
    if (
        options.sample_rate is not None
        and (written := output_rate(chosen_format, options.sample_rate)) != options.sample_rate
    ):
        errors.print(f"note: {chosen_format} takes no {options.sample_rate} Hz: written at {written} Hz")
    report = errors if to_stdout else console  # standard output carries the audio
    return _Destination(out, folder, chosen_format, report)


def _voice(options: SynthesizeOptions) -> tuple[Synthesizer, Speaker | Blend, str | None]:
    """The base (--base or --model, else the one --voice was adapted on), the speaker of every utterance
    that names none (checked, and a blend parsed, once), and the adapted voice's name (None: a base speaker)."""
    if options.voice is not None and options.speaker is not None:
        fail("give --speaker (a base speaker) or --voice (an adapted voice), not both")
    if options.voice is not None and not options.voice.exists():
        # OpenAI's `voice` is Chorus's --speaker: "alloy" or a speaker's name given here is no typo of a path.
        name = str(options.voice)
        hint = "" if "/" in name else f"; for a speaker of the base or an OpenAI voice name, give --speaker {name}"
        fail(f"--voice {name}: no such voice folder (made by `chorus adapt`){hint}")
    with user_errors():
        base = chosen_base(options.base, options.model, options.voice)
        tts = load_base(base, options.vocoder, device=options.device, config=options.config)
        speaker = tts.resolve_speaker(options.speaker)
        voice = tts.load_voice(options.voice) if options.voice is not None else None
        _set_noise(tts, options.noise_scale, options.noise_w)
    return tts, speaker, voice


def _laid_out(said: Iterable[Utterance], by_line: bool, sentence_silence: float) -> tuple[Iterable[Job], int]:
    """Each utterance with its layout, and how many sentences there are: laid out first where the whole text is
    known, so the bar knows; standard input's lines as each arrives (then 0: no bar). An utterance whose SSML
    Chorus cannot follow is skipped with its reason, as any other bad line is: the others are spoken."""

    def laid(utterance: Utterance) -> Job | None:
        try:
            return utterance, layout(utterance.text, sentence_silence=sentence_silence)
        except SsmlError as error:
            skipped(utterance.where, error)
            return None

    if by_line:
        return (job for u in said if (job := laid(u)) is not None), 0
    jobs = [job for u in said if (job := laid(u)) is not None]
    return jobs, sum(isinstance(p, str) for _, pieces in jobs for p in pieces)


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


def _speak(
    speech: Speech, jobs: Iterable[Job], destination: _Destination, by_line: bool, options: SynthesizeOptions
) -> bool:
    """Every utterance into its clip in the folder, or into the one output and then its timestamps; whether
    anything was spoken."""
    if destination.folder is not None:
        return into_folder(speech, jobs, destination.folder, by_line, destination.report)
    timed = options.timestamps is not None
    spoken = into_one(speech, jobs, destination.out, by_line, destination.report, timed)
    if spoken is not None and options.timestamps is not None:
        write_timestamps(options.timestamps, spoken, speech.tts.sample_rate, options.caption_words)
    return spoken is not None


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
    try:
        tts.base.settings = dataclasses.replace(tts.base.settings, **changes)
    except ValueError as error:
        fail(str(error).replace("noise_scale", "--noise-scale").replace("noise_w", "--noise-w"))
