"""Where ``chorus synthesize`` speaks to: each utterance, with its own voice, sentence by sentence into one
file or standard output (a pause between utterances), or alone into its clip in a folder; then the words'
times and captions. Each sentence's audio is written as it is made and none of it is kept."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from chorus.atomic import atomic_write, atomic_write_text
from chorus.audio.encode import FORMATS, AudioWriter, format_for
from chorus.cli.common import errors, skipped
from chorus.cli.synthesis_input import Utterance
from chorus.synthesis import Synthesizer
from chorus.synthesis.voices import Blend, Speaker
from chorus.text.ssml import Pause
from chorus.text.timestamps import Timestamp, captions

STDOUT = Path("-")
Job = tuple[Utterance, list[str | Pause]]  # an utterance and its layout: sentences and the pauses between
T = TypeVar("T")


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
    given_format: str | None = None  # --format: every file takes it, whatever its suffix

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
        speaker = self._speaker_of(utterance, pieces)
        if speaker is None:
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

    def _speaker_of(self, utterance: Utterance, pieces: list[str | Pause]) -> Speaker | Blend | None:
        """Who speaks ``utterance``: its own speaker (a --json-input line's), else the command's; None, with a
        message, where it has nothing to say or names no speaker of the base."""
        if not any(isinstance(p, str) for p in pieces):
            errors.print(
                f"skipped {utterance.where}: nothing speakable in text {utterance.text[:80]!r}", style="yellow"
            )
            return None
        if utterance.speaker is None:
            return self.speaker
        try:
            return self.tts.resolve_speaker(utterance.speaker)
        except (KeyError, ValueError) as error:
            skipped(utterance.where, error.args[0] if error.args else error)
            return None

    def alone(self, path: Path, utterance: Utterance, pieces: list[str | Pause]) -> bool:
        """``utterance`` alone into the file ``path``; whether anything was spoken (else no file is left). A
        --json-input line's own ``output_file`` is in the format its suffix names, as --out is (unless --format
        was given; with no suffix, the command's); an unknown suffix skips the line, saying so."""
        audio_format = self.audio_format
        if utterance.out is not None and utterance.out.suffix:
            try:
                audio_format = format_for(utterance.out, self.given_format)
            except ValueError as error:
                skipped(utterance.where, error)
                return False

        def write(file: BinaryIO, seekable: bool) -> None:
            writer = AudioWriter(file, audio_format, self.tts.sample_rate, self.sample_rate, seekable)
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
        try:
            file = temp.open("w+b")
        except OSError as error:  # named by the file asked for, not by its temporary twin
            raise OSError(f"cannot write {path}: {error.strerror}") from None
        with file:
            done.append(write(file, True))

    atomic_write(path, into)
    return done[0]


def into_folder(speech: Speech, jobs: Iterable[Job], folder: Path, by_line: bool, report: Console) -> bool:
    """Each utterance alone into its clip in ``folder``, named by its line number (or into a --json-input
    line's own ``output_file``), and ``metadata.csv`` beside the clips; whether anything was spoken."""
    suffix = FORMATS[speech.audio_format].suffixes[0]
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
    return bool(written)


def into_one(
    speech: Speech, jobs: Iterable[Job], out: Path, by_line: bool, report: Console, timed: bool
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
        spoken = _into_file(out, write)
    except _NothingSpoken:
        return Spoken() if elsewhere else None
    if elsewhere and out != STDOUT:  # the other lines' file, named as theirs were: a program reads every path
        report.print(str(out), soft_wrap=True)
    return spoken


def write_timestamps(path: Path, spoken: Spoken, sample_rate: int, caption_words: int) -> None:
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
