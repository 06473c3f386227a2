"""Sentences the offline corpus reads, shipped in ``chorus/resources/text`` (sources in its SOURCE.txt).

Three public sources, already filtered to short sentences (4-14 words, at most 90 characters):
CMU ARCTIC prompts, LJ Speech transcripts and the Harvard sentences. Twenty Harvard sentences are
reserved for benchmarks and never appear in any speaker's text.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

TEXT_DIR = Path(__file__).resolve().parent.parent / "resources" / "text"

_NON_WORD = re.compile(r"[^a-z']+")


def sentence_key(text: str) -> str:
    """Case- and punctuation-blind form of ``text``, so near-identical copies count as the same sentence."""
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def _read_lines(name: str) -> list[str]:
    path = TEXT_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: corpus text file missing from the installed package")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _read_tsv(name: str) -> list[tuple[str, str]]:
    rows = []
    for number, line in enumerate(_read_lines(name), start=1):
        utt_id, sep, text = line.partition("\t")
        if not sep or not text.strip():
            raise ValueError(f"{TEXT_DIR / name}:{number}: expected '<id>\\t<text>'")
        rows.append((utt_id.strip(), text.strip()))
    return rows


@functools.cache
def benchmark_sentences() -> list[str]:
    """The 20 benchmark sentences (Harvard), excluded from every speaker's text."""
    return _read_lines("benchmark_sentences.txt")


@functools.cache
def _training_sentences() -> tuple[tuple[str, str], ...]:
    harvard = [
        (f"harvard_{index // 10 + 1:02d}_{index % 10 + 1:02d}", text)
        for index, text in enumerate(_read_lines("harvard_sentences.txt"))
    ]
    rows = _read_tsv("cmu_arctic_prompts.tsv") + harvard + _read_tsv("ljspeech_short.tsv")
    reserved = {sentence_key(text) for text in benchmark_sentences()}
    kept, seen_ids, seen_text = [], set(), set(reserved)
    for utt_id, text in rows:
        key = sentence_key(text)
        # One copy of each sentence; benchmark sentences are seeded into `seen_text` so they never pass.
        if key in seen_text:
            continue
        if utt_id in seen_ids:
            raise ValueError(f"{TEXT_DIR}: sentence id {utt_id!r} appears twice")
        seen_text.add(key)
        seen_ids.add(utt_id)
        kept.append((utt_id, text))
    return tuple(kept)


def training_sentences() -> list[tuple[str, str]]:
    """All ``(id, text)`` pairs speakers may read: ARCTIC, Harvard, then LJ Speech, benchmark sentences removed."""
    return list(_training_sentences())
