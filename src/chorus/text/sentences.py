"""Splitting text into the chunks a server synthesizes and streams one by one."""

from __future__ import annotations

import re

_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|\s*\n\s*")
_ABBREVIATION = re.compile(
    r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|vs|etc|e\.g|i\.e|No|Fig|approx)|\b[A-Z])\.$", re.IGNORECASE
)


def split_sentences(text: str, max_chars: int = 300) -> list[str]:
    """Chunks to synthesize and stream one by one: sentences (not after abbreviations), pieces without a
    letter or digit joined to their neighbour, and overlong sentences cut at a comma or a space."""
    pieces = [p.strip() for p in _SENTENCE_BREAK.split(text) if p and p.strip()]
    sentences: list[str] = []
    for piece in pieces:
        if sentences and (not any(c.isalnum() for c in piece) or _ABBREVIATION.search(sentences[-1])):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    if len(sentences) > 1 and not any(c.isalnum() for c in sentences[0]):
        sentences[1] = f"{sentences.pop(0)} {sentences[0]}"
    chunks = []
    for sentence in sentences:
        while len(sentence) > max_chars:
            cut = max(sentence.rfind(", ", 0, max_chars), sentence.rfind(" ", 0, max_chars))
            cut = cut + 1 if cut > 0 else max_chars
            chunks.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            chunks.append(sentence)
    return chunks or [text.strip()]
