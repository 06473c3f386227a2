"""Splitting text into the chunks that are synthesized (and streamed) one by one.

Sentences come from pysbd (rule-based, the Golden Rules of sentence boundaries: abbreviations,
initials, decimals, ellipses, quotes); line breaks also end a chunk. The model reads one chunk at a
time, so a sentence longer than ``max_chars`` is cut at a comma, else at a space. A chunk with nothing
this reader can say (another script: "你好。") is left out and named, so the rest is still spoken.
"""

from __future__ import annotations

import functools
import numbers
import re
import warnings

from chorus.text.caller_warning import warn_caller
from chorus.text.normalize import UnknownCharacterWarning, address_spans, normalize_text
from chorus.text.ssml import Pause, is_ssml, parse_ssml

_LINE_BREAK = re.compile(r"\s*\n\s*")


@functools.cache
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str, max_chars: int = 300) -> list[str]:
    """The chunks of ``text``: its sentences, in order, none longer than ``max_chars`` characters.

    A piece without a letter or digit ("...", "--") joins its neighbour rather than being spoken alone.
    ``ValueError`` for ``max_chars`` under 1 (no chunk fits: it had cut empty chunks forever, memory growing).
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, numbers.Integral) or max_chars < 1:
        raise ValueError(f"max_chars must be a whole number of characters, at least 1, got {max_chars!r}")
    sentences: list[str] = []
    for line in _LINE_BREAK.split(text):
        if not line.strip():
            continue
        end = None  # where the line's last piece ended
        addresses = address_spans(line)
        for piece in _segmenter().segment(line):
            piece = piece.strip()
            if not piece:
                continue
            start = line.find(piece, end or 0)
            # pysbd cuts at a "?" inside an address ("example.com/find?q=1"): no sentence ends there.
            if sentences and end is not None and start == end and any(a < start < b for a, b in addresses):
                sentences[-1] += piece
            elif sentences and not any(c.isalnum() for c in piece):
                sentences[-1] = f"{sentences[-1]} {piece}"
            else:
                sentences.append(piece)
            end = start + len(piece) if start >= 0 else None
    if len(sentences) > 1 and not any(c.isalnum() for c in sentences[0]):
        first = sentences.pop(0)  # popped before the join is made (written in one line, the target moved)
        sentences[0] = f"{first} {sentences[0]}"
    chunks = []
    for sentence in sentences:
        while len(sentence) > max_chars:
            cut = sentence.rfind(", ", 0, max_chars)
            cut = cut if cut > 0 else sentence.rfind(" ", 0, max_chars)
            cut = cut + 1 if cut > 0 else max_chars
            chunks.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            chunks.append(sentence)
    return chunks or [text.strip()]


class UnspeakableTextWarning(UserWarning):
    """A chunk of the text was left out because nothing in it can be said (another script, only symbols)."""


def is_speakable(chunk: str) -> bool:
    """Whether ``chunk`` holds anything to say: a word once normalized, or inline ``[[ ... ]]`` phonemes."""
    if "[[" in chunk:
        return True
    with warnings.catch_warnings():  # the chunk's own reading names what it drops; asking is silent
        warnings.simplefilter("ignore", UnknownCharacterWarning)
        return any(c.isalpha() for c in normalize_text(chunk, warn=False))


def speech_pieces(text: str, max_chars: int = 300, skipped: list[str] | None = None) -> list[str | Pause]:
    """What to read, in order: the chunks of plain text, or of SSML (:func:`chorus.text.ssml.is_ssml`) its
    text's chunks and its ``<break>`` pauses (:mod:`chorus.text.ssml`; raises ``SsmlError``).

    Chunks with nothing to say, and SSML elements read as their text without their effect, are named in
    ``skipped`` when a list is given (the server names them in a header), else in a warning
    (:class:`UnspeakableTextWarning`, :class:`~chorus.text.ssml.IgnoredSsmlWarning`).
    """
    if not is_ssml(text):
        chunks: list[str | Pause] = list(split_sentences(text, max_chars))
    else:
        chunks = []
        for piece in parse_ssml(text, skipped):
            chunks += [piece] if isinstance(piece, Pause) else split_sentences(piece, max_chars)
    pieces: list[str | Pause] = []
    left_out: list[str] = []
    for chunk in chunks:  # each chunk normalized once to ask
        (pieces if isinstance(chunk, Pause) or is_speakable(chunk) else left_out).append(chunk)
    if left_out and skipped is not None:
        skipped += left_out
    elif left_out:
        warn_caller(f"left out text with nothing to say in it: {' '.join(left_out)[:200]!r}", UnspeakableTextWarning)
    return pieces


# The speeds every path takes (library, CLI, server), as OpenAI's API: beyond them a sentence is a blur or
# minutes of one stretched vowel (speed 1e-4 is 860,000 frames). Here, where no torch is imported, so that the
# server's request schema and the CLI's options can bound a speed before any model is loaded.
MIN_SPEED, MAX_SPEED = 0.25, 4.0

# Characters of normalized text per second of speech at speed 1: the base's default-table speakers average
# 15.6-18.0 on the benchmark sentences and reach 22.8 on the fastest one (Piper joe: 17.9, at most 21.5).
# The estimate takes a little more than the fastest, so it errs short and never refuses what would fit.
CHARACTERS_PER_SECOND = 24.0


# What the normalizer's length misses (a probe: 4,096 characters estimated at 2.8 s spoke for 715 s, at speed
# 0.25): inline phonemes, which it drops, last about two characters' time each (12-15 phonemes a second); a
# word with no vowel is spelled out letter by letter ("bcdfg": "bee see dee ef gee"), about five each.
CHARACTERS_PER_PHONEME = 2
CHARACTERS_PER_SPELLED_LETTER = 5
_INLINE_PHONEMES = re.compile(r"\[\[([^|]*?)(?:\|.*?)?\]\]", re.DOTALL)  # [^|]: "[[||" x 1,024 backtracked 0.3 s
_SPELLED = re.compile(r"\b[b-df-hj-np-tv-xz]{2,}\b", re.IGNORECASE)
_PHONEME_MARKS = set("ˈˌ \n\t")  # stress and spaces: no time of their own


def estimated_seconds(pieces: list[str | Pause], speed: float = 1.0) -> float:
    """About how long ``pieces`` (:func:`speech_pieces`) last when spoken at ``speed``: their pauses plus
    their text as it is read out (numbers and symbols spelled out by the normalizer, inline phonemes and words
    spelled letter by letter counted as they last) at :data:`CHARACTERS_PER_SECOND`. Cheap enough to bound a
    request before any synthesis."""
    pauses = sum(piece.seconds for piece in pieces if isinstance(piece, Pause))
    characters = sum(_read_characters(piece) for piece in pieces if isinstance(piece, str))
    return pauses + characters / CHARACTERS_PER_SECOND / speed


def _read_characters(piece: str) -> int:
    """How many characters of normalized text ``piece`` lasts as long as."""
    phonemes = sum(len([c for c in inline if c not in _PHONEME_MARKS]) for inline in _INLINE_PHONEMES.findall(piece))
    said = normalize_text(_INLINE_PHONEMES.sub(" ", piece), warn=False)
    spelled = sum(len(word) for word in _SPELLED.findall(said))
    return len(said) + (CHARACTERS_PER_SPELLED_LETTER - 1) * spelled + CHARACTERS_PER_PHONEME * phonemes
