"""What ``chorus synthesize`` speaks: the utterances of ``--text``, of ``--text-file`` (one a line) or of
standard input, read to its end or line by line as each line arrives (plain or Piper's JSON lines)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from chorus.cli.common import fail, skipped


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


def utterances(text: str | None, text_file: Path | None, by_line: bool, json_input: bool) -> Iterable[Utterance]:
    """The utterances of ``text``, else of the lines of ``text_file``, else of standard input (``by_line``:
    as its lines arrive, each read only when the one before is spoken; ``json_input``: Piper's JSON lines)."""
    if text is not None:
        return [Utterance("--text", text)]
    if text_file is not None:
        return _file_lines(text_file)
    if sys.stdin is None or sys.stdin.isatty():
        fail("give --text, --text-file, or text on standard input")
    if by_line:
        return _stdin_lines(json_input)
    try:
        whole = _decoded(_stdin().read())
    except ValueError as error:
        fail(f"standard input: {error}")
    if not whole.strip():
        fail("standard input is empty: nothing to speak")
    return [Utterance("standard input", whole)]


def _file_lines(path: Path) -> list[Utterance]:
    """An utterance per non-blank line of ``path``, numbered by its line."""
    if not path.is_file():
        fail(f"{path}: {'a folder, not a text file' if path.is_dir() else 'no such file'}")
    try:
        text = _decoded(path.read_bytes())
    except ValueError as error:
        fail(f"{path}: {error}")
    lines = [
        Utterance(f"{path}:{number}", line.strip(), number)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not lines:
        fail(f"{path}: no text lines")
    return lines


def _stdin() -> BinaryIO | TextIO:
    """Standard input as bytes where it has them: decoding is :func:`_decoded`'s, the same in any locale
    (Python's own decoding of standard input either raises or keeps bad bytes as lone surrogates)."""
    return getattr(sys.stdin, "buffer", sys.stdin)


def _decoded(raw: bytes | str) -> str:
    """``raw`` as text: UTF-8, a leading byte-order mark dropped; raises ``ValueError`` naming the first byte
    that is not UTF-8."""
    if isinstance(raw, str):
        return raw.removeprefix("\ufeff")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[error.start]:02x} at position {error.start})") from None


def _stdin_lines(json_input: bool) -> Iterator[Utterance]:
    """Standard input's lines as they arrive (readline: nothing waits for more input than one line), one
    utterance each; blank lines are skipped, and so is a bad --json-input line, with a message."""
    stdin = _stdin()
    # read(0) is the stream's own empty value (b"" or ""): what readline returns at its end.
    for number, raw in enumerate(iter(stdin.readline, stdin.read(0)), start=1):
        where = f"standard input:{number}"
        try:
            line = _decoded(raw)
        except ValueError as error:
            skipped(where, error)
            continue
        if not line.strip():
            continue
        if not json_input:
            yield Utterance(where, line.strip(), number)
            continue
        try:
            yield _json_line(line, where, number)
        except ValueError as error:
            skipped(where, error)


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
