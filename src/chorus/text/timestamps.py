"""Word and phoneme start/end times from the durations the acoustic model predicts for its symbols.

The model reads one IPA character per symbol and expands each to a number of frames; a space
separates words. A word's span runs from its first symbol's start to its last symbol's end
(punctuation and spaces between words belong to no word). Words are labelled with the normalized
text's words when the phonemizer kept them one for one, else with their phonemes; captions then show
them as written (:func:`as_written`: "Dr." over "doctor", "5:30" over "five thirty").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from chorus.text.normalize import grouped_numbers, normalize_text

# A pause after a word that ends with a stop is a sentence's end (sentences are laid out with 0.2 s between
# them by default); "Dr." inside a sentence is followed by no pause.
SENTENCE_PAUSE = 0.1  # seconds
_SENTENCE_END = re.compile(r"[.!?…][\"'”’»)\]]*$")

_PUNCTUATION = set(",;:.!?")
_STRESS = set("ˈˌ")  # marks the next phoneme: joined to it
_SUFFIX_MARKS = set("ːˑ̩̃")  # length and diacritics: joined to the phoneme before
_WORD = re.compile(r"[\w'’-]+")


@dataclass(frozen=True)
class Timestamp:
    """When a word or phoneme ``text`` is said: from ``start`` to ``end``, in seconds from the start of the
    audio."""

    text: str
    start: float  # seconds from the start of the audio
    end: float

    def shifted(self, seconds: float) -> Timestamp:
        """The same, ``seconds`` later (a sentence's timestamps placed where it starts in a longer answer)."""
        return Timestamp(self.text, round(self.start + seconds, 4), round(self.end + seconds, 4))


def timestamps(
    symbols: str,
    frames: list[int],
    seconds_per_frame: float,
    words: list[str],
    word_phonemes: list[str] | None = None,
) -> tuple[list[Timestamp], list[Timestamp]]:
    """(words, phonemes) of one utterance.

    ``symbols``: the model's input, one character per symbol; ``frames[i]``: frames of symbol ``i``;
    ``words``: the normalized text's words (:func:`spoken_words`); ``word_phonemes``: each word
    phonemized alone. espeak reads some words as one group ("of a" -> ``ʌvə``): with ``word_phonemes``
    such a group is shared among its words in proportion to their phonemes; without them, or when the
    groups cannot be matched to the words, words are labelled by their phonemes.
    """
    if len(symbols) != len(frames):
        raise ValueError(f"{len(symbols)} symbols but {len(frames)} durations")
    phonemes, groups, current = [], [], []
    elapsed = 0
    for symbol, count in zip(symbols, frames):
        start, elapsed = elapsed, elapsed + int(count)
        if symbol == " " or symbol in _PUNCTUATION:
            if current:
                groups.append(current)
                current = []
            continue
        stamp = Timestamp(symbol, round(start * seconds_per_frame, 4), round(elapsed * seconds_per_frame, 4))
        if current and (current[-1].text[-1] in _STRESS or symbol in _SUFFIX_MARKS):
            stamp = Timestamp(current[-1].text + symbol, current[-1].start, stamp.end)
            current[-1] = phonemes[-1] = stamp
        else:
            phonemes.append(stamp)
            current.append(stamp)
    if current:
        groups.append(current)
    if len(words) == len(groups):
        return [Timestamp(w, g[0].start, g[-1].end) for w, g in zip(words, groups)], phonemes
    shared = None
    if word_phonemes and len(word_phonemes) == len(words):
        shared = (_share_groups if len(groups) <= len(words) else _join_groups)(groups, words, word_phonemes)
    if shared is None:
        shared = [Timestamp("".join(p.text for p in g), g[0].start, g[-1].end) for g in groups]
    return shared, phonemes


def spoken_words(normalized_text: str) -> list[str]:
    """The words of normalized text, as the phonemizer reads them (punctuation dropped)."""
    return _WORD.findall(normalized_text)


def written_units(text: str) -> list[tuple[str, int]]:
    """``text``'s written words (runs of non-space) with how many of its spoken words
    (:func:`spoken_words` of :func:`normalize_text`) each was read as, in order.

    A written word ends a unit where the text up to it reads as the start of the whole text's reading;
    written words the normalizer reads only together ("$5 million", "(555) 123-4567", "St. Louis") are
    one unit, spaces kept. "5:30 pm." is two: "5:30" (five thirty) and "pm." (p m), as the text up to
    "5:30" reads "five thirty" either way. A word said as nothing (a dash, an emoji) is a unit of none.
    """
    whole = spoken_words(normalize_text(text, warn=False))
    numbers = grouped_numbers(text)  # "1 000 000": one unit, though "1" alone reads as the start of "one million"
    units: list[tuple[str, int]] = []
    start, said = None, 0
    for token in re.finditer(r"\S+", text):
        start = token.start() if start is None else start
        if any(a <= token.start() and token.end() < b for a, b in numbers):
            continue
        # Each prefix is read once, so the normalizer does not keep it; the whole text is read already.
        prefix = text[: token.end()]
        read = whole if prefix == text else spoken_words(normalize_text(prefix, warn=False, remember=False))
        if len(read) >= said and whole[: len(read)] == read:
            units.append((text[start : token.end()], len(read) - said))
            start, said = None, len(read)
    return units


def as_written(words: list[Timestamp], units: list[tuple[str, int]]) -> list[Timestamp]:
    """Spoken ``words`` as the written words they were read from: a unit of :func:`written_units` spans its
    spoken words' times; one said as nothing joins the unit before it (the first unit: the one after)."""
    if sum(count for _, count in units) != len(words):
        raise ValueError(f"{len(words)} spoken words but the written units hold {sum(c for _, c in units)}")
    joined: list[tuple[str, int]] = []
    for text, count in units:
        if joined and (count == 0 or joined[-1][1] == 0):
            space = "" if text[:1] in _PUNCTUATION else " "  # "[[tʃˈɔːɹəs]]." captions "tʃˈɔːɹəs.", not "... ."
            joined[-1] = (f"{joined[-1][0]}{space}{text}", joined[-1][1] + count)
        else:
            joined.append((text, count))
    result, position = [], 0
    for text, count in joined:
        if count:
            span = words[position : position + count]
            result.append(Timestamp(" ".join(text.split()), span[0].start, span[-1].end))
            position += count
    return result


def _size(phonemes: str) -> int:
    return sum(1 for c in phonemes if c not in _STRESS and c not in _SUFFIX_MARKS and not c.isspace())


def _runs(targets: list[int], sizes: list[int]) -> list[tuple[int, int]]:
    """``sizes`` cut, in order, into ``len(targets)`` runs of one or more, whose sums best match ``targets`` (the
    least total mismatch, by dynamic programming): each run's (start, stop). There are at least as many sizes as
    targets: the callers are chosen by the counts (:func:`timestamps`)."""
    n_targets, n_sizes = len(targets), len(sizes)
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    # cost[t][i]: the best mismatch of the first t targets over the first i sizes; last[t][i]: where run t-1 starts.
    cost = np.full((n_targets + 1, n_sizes + 1), np.inf)
    last = np.zeros((n_targets + 1, n_sizes + 1), dtype=int)
    cost[0][0] = 0.0
    for t in range(1, n_targets + 1):
        for i in range(t, n_sizes - (n_targets - t) + 1):
            for start in range(t - 1, i):
                value = cost[t - 1][start] + abs(prefix[i] - prefix[start] - targets[t - 1])
                if value < cost[t][i]:
                    cost[t][i], last[t][i] = value, start
    if not np.isfinite(cost[n_targets][n_sizes]):  # no targets for some sizes
        return None
    runs, i = [], n_sizes
    for t in range(n_targets, 0, -1):
        start = int(last[t][i])
        runs.append((start, i))
        i = start
    return runs[::-1]


def _share_groups(groups: list[list[Timestamp]], words: list[str], word_phonemes: list[str]) -> list[Timestamp] | None:
    """Words over phoneme groups when some groups hold several words: every group takes a run of one
    or more words, in order (:func:`_runs`: their phonemes best matching the groups' sizes); a group then
    splits its phonemes among its words by their sizes."""
    sizes = [max(1, _size(p)) for p in word_phonemes]
    runs = _runs([len(g) for g in groups], sizes)
    result = []
    for group, (first, stop) in zip(groups, runs):
        members = range(first, stop)
        share, taken = sum(sizes[i] for i in members), 0
        for position, i in enumerate(members):
            rest = len(members) - position - 1
            count = len(group) - taken if rest == 0 else round(len(group) * sizes[i] / share)
            count = max(1, min(count, len(group) - taken - rest))
            if count <= 0:
                return None
            part = group[taken : taken + count]
            result.append(Timestamp(words[i], part[0].start, part[-1].end))
            taken += count
    return result


def _join_groups(groups: list[list[Timestamp]], words: list[str], word_phonemes: list[str]) -> list[Timestamp]:
    """Words over phoneme groups when some words are read as several groups (NFKC makes "Brand™" "BrandTM", which
    espeak reads "brand T M"): every word takes a run of one or more groups, in order (:func:`_runs`: their sizes
    best matching the words' phonemes read alone)."""
    runs = _runs([max(1, _size(p)) for p in word_phonemes], [len(g) for g in groups])
    return [
        Timestamp(word, groups[first][0].start, groups[stop - 1][-1].end) for word, (first, stop) in zip(words, runs)
    ]


def _clock(seconds: float, separator: str) -> str:
    millis = int(round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}{separator}{millis % 1000:03d}"


def captions(words: list[Timestamp], kind: str, words_per_caption: int = 1) -> str:
    """SRT (``kind="srt"``) or WebVTT (``"vtt"``) captions of ``words``, ``words_per_caption`` a cue: by
    default one cue for each word (as written, :func:`as_written`), from when it is said to when it ends,
    so a player shows each word as it is heard; more words a cue for captions read as lines, a cue never
    running on past a sentence's end (:func:`_cues`)."""
    if kind not in ("srt", "vtt"):
        raise ValueError(f"captions are 'srt' or 'vtt', not {kind!r}")
    if words_per_caption < 1:
        raise ValueError(f"words_per_caption must be >= 1, got {words_per_caption}")
    separator = "," if kind == "srt" else "."
    lines = ["WEBVTT", ""] if kind == "vtt" else []
    for number, cue in enumerate(_cues(words, words_per_caption), start=1):
        if kind == "srt":
            lines.append(str(number))
        lines.append(f"{_clock(cue[0].start, separator)} --> {_clock(cue[-1].end, separator)}")
        lines += [" ".join(w.text for w in cue), ""]
    return "\n".join(lines)


def _cues(words: list[Timestamp], most: int) -> list[list[Timestamp]]:
    """``words`` cut into cues of at most ``most`` words, a new one after each sentence's end (a new user's
    probe: "over the lazy dog. It" ran across the pause between two sentences)."""
    cues: list[list[Timestamp]] = []
    for index, word in enumerate(words):
        if not cues or len(cues[-1]) == most or _ends_sentence(words[index - 1], word):
            cues.append([])
        cues[-1].append(word)
    return cues


def _ends_sentence(word: Timestamp, following: Timestamp) -> bool:
    return bool(_SENTENCE_END.search(word.text)) and following.start - word.end >= SENTENCE_PAUSE
