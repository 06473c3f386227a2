"""Splitting text into the chunks that are synthesized (and streamed) one by one.

Sentences come from pysbd (rule-based, the Golden Rules of sentence boundaries: abbreviations,
initials, decimals, ellipses, quotes); line breaks also end a chunk. The model reads one chunk at a
time, so a sentence longer than ``max_chars`` is cut at a comma, else at a space.
"""

from __future__ import annotations

import functools
import re

_LINE_BREAK = re.compile(r"\s*\n\s*")


@functools.cache
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str, max_chars: int = 300) -> list[str]:
    """The chunks of ``text``: its sentences, in order, none longer than ``max_chars`` characters.

    A piece without a letter or digit ("...", "--") joins its neighbour rather than being spoken alone.
    """
    sentences: list[str] = []
    for line in _LINE_BREAK.split(text):
        if not line.strip():
            continue
        for piece in _segmenter().segment(line):
            piece = piece.strip()
            if not piece:
                continue
            if sentences and not any(c.isalnum() for c in piece):
                sentences[-1] = f"{sentences[-1]} {piece}"
            else:
                sentences.append(piece)
    if len(sentences) > 1 and not any(c.isalnum() for c in sentences[0]):
        sentences[1] = f"{sentences.pop(0)} {sentences[0]}"
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
