"""What ``chorus synthesize`` speaks: the utterances of ``--text``, of ``--text-file`` (one a line) or of
standard input, read to its end or line by line as each line arrives (plain or Piper's JSON lines)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from chorus.cli.common import errors, fail


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
    whole = sys.stdin.read()
    if not whole.strip():
        fail("standard input is empty: nothing to speak")
    return [Utterance("standard input", whole)]


def _file_lines(path: Path) -> list[Utterance]:
    """An utterance per non-blank line of ``path``, numbered by its line."""
    if not path.is_file():
        fail(f"{path}: no such file")
    lines = [
        Utterance(f"{path}:{number}", line.strip(), number)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if line.strip()
    ]
    if not lines:
        fail(f"{path}: no text lines")
    return lines


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
