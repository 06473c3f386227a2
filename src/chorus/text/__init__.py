"""Text front end: normalize -> phonemize (espeak-ng IPA) -> symbol ids.

Training and inference both call :meth:`TextFrontEnd.encode`, so text is always processed the same
way; the symbol table travels inside each checkpoint. Phonemes written inline as ``[[ ... ]]`` (IPA,
as espeak-ng writes it) pass through as they are, for names and words the phonemizer gets wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from chorus.text.caller_warning import warn_caller
from chorus.text.normalize import UnknownCharacterWarning, normalize_text
from chorus.text.phonemize import phonemize
from chorus.text.symbols import SymbolTable
from chorus.text.timestamps import Timestamp, as_written, spoken_words, timestamps, written_units

_INLINE_PHONEMES = re.compile(r"\[\[(.*?)\]\]", re.DOTALL)


def _inline(piece: str) -> tuple[list[str], str | None]:
    """An inline ``[[ ... ]]`` piece's phoneme words, and the written word it captions as where it names one
    (``[[kˈɔːɹəs|Chorus]]``, as SSML's ``<phoneme ph="kˈɔːɹəs">Chorus</phoneme>`` is given)."""
    phonemes, _, label = piece.partition("|")
    return phonemes.split(), " ".join(label.split()) or None


__all__ = [
    "TextFrontEnd",
    "SymbolTable",
    "dropped_characters",
    "normalize_text",
    "phonemize",
    "UnknownCharacterWarning",
]


def dropped_characters(text: str) -> list[str]:
    """The characters of ``text`` with no spoken form, in order, that reading it leaves out (inline
    ``[[ ... ]]`` phonemes are read as written: none of theirs)."""
    dropped: list[str] = []
    for piece in _INLINE_PHONEMES.split(text)[0::2]:  # even indices: text; odd: phonemes
        normalize_text(piece, dropped=dropped)
    return dropped


@dataclass
class TextFrontEnd:
    symbols: SymbolTable = field(default_factory=SymbolTable)
    language: str = "en-us"

    def to_phonemes(self, texts: list[str]) -> list[str]:
        if not any("[[" in t for t in texts):
            return phonemize([normalize_text(t) for t in texts], self.language)
        return [self._with_inline_phonemes(t) for t in texts]

    def _with_inline_phonemes(self, text: str) -> str:
        """Text pieces normalized and phonemized, ``[[ ... ]]`` pieces kept, joined by spaces."""
        pieces = _INLINE_PHONEMES.split(text)  # even indices: text; odd: phonemes
        spoken = [normalize_text(p) for p in pieces[0::2]]
        said = iter(phonemize([s for s in spoken if s], self.language))
        out = []
        for index, piece in enumerate(pieces):
            if index % 2:
                out.append(" ".join(_inline(piece)[0]))
            elif spoken[index // 2]:
                out.append(next(said))
        return " ".join(p for p in out if p)

    def timings(
        self, text: str, frames: list[int], seconds_per_frame: float, symbols: str | None = None
    ) -> tuple[list[Timestamp], list[Timestamp]]:
        """(words, phonemes) with start/end times of ``text`` read with ``frames`` per symbol (the durations
        the model predicted); ``symbols``: the model's input, re-encoded from ``text`` when not given.
        Words are as written ("Dr.", "5:30"), each over the spoken words it was read as, as a caption
        shows them; labelled by their phonemes when those could not be matched to the spoken words."""
        if symbols is None:
            symbols = self.symbols.decode(self.encode([text])[0])
        spoken, alone = self.words(text)  # each word alone lets a group espeak reads as one be shared out
        words, phonemes = timestamps(symbols, frames, seconds_per_frame, spoken, alone)
        if [w.text for w in words] == spoken:
            words = as_written(words, self.written(text))
        return words, phonemes

    def written(self, text: str) -> list[tuple[str, int]]:
        """``text``'s written words with how many of :meth:`words` each was read as
        (:func:`written_units`); inline ``[[ ... ]]`` phonemes stand for themselves, or for the word they name."""
        pieces = _INLINE_PHONEMES.split(text)  # even indices: text; odd: phonemes
        return [
            unit
            for index, piece in enumerate(pieces)
            for unit in (_inline_units(piece) if index % 2 else written_units(piece))
        ]

    def words(self, text: str) -> tuple[list[str], list[str]]:
        """The words of ``text`` as they are read, each with its phonemes read alone (for timestamps):
        normalized words, and inline ``[[ ... ]]`` phonemes labelled by themselves."""
        pieces = _INLINE_PHONEMES.split(text)  # even indices: text; odd: phonemes
        plain = {i: spoken_words(normalize_text(p, warn=False)) for i, p in enumerate(pieces) if not i % 2}
        flat = [word for words in plain.values() for word in words]
        said = iter(phonemize(flat, self.language) if flat else [])
        words: list[str] = []
        alone: list[str] = []
        for index, piece in enumerate(pieces):
            if index % 2:
                phonemes = _inline(piece)[0]
                words += phonemes
                alone += phonemes
            else:
                words += plain[index]
                alone += [next(said) for _ in plain[index]]
        return words, alone

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Symbol ids for each text. Characters without an id are dropped with one warning.

        Raises ``ValueError`` naming the text if nothing speakable is left.
        """
        result = []
        # strict: a phonemizer that lost a line must fail loudly, not hand out a neighbour's ids.
        for text, phonemes in zip(texts, self.to_phonemes(texts), strict=True):
            ids, unknown = self.symbols.encode(phonemes)
            if unknown:
                warn_caller(
                    f"dropped phoneme symbols not in table v{self.symbols.version}: {''.join(sorted(unknown))!r}",
                    UnknownCharacterWarning,
                )
            if not any(self.symbols.symbols[i] not in " ,;:.!?" for i in ids):
                raise ValueError(f"nothing speakable in text {text!r}")
            result.append(ids)
        return result

    def to_dict(self) -> dict:
        return {"language": self.language, "symbols": self.symbols.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> TextFrontEnd:
        return cls(symbols=SymbolTable.from_dict(data["symbols"]), language=data.get("language", "en-us"))


def _inline_units(piece: str) -> list[tuple[str, int]]:
    """An inline ``[[ ... ]]`` piece as written units: its label over all its phoneme words, or each of them."""
    phonemes, label = _inline(piece)
    return [(label, len(phonemes))] if label and phonemes else [(word, 1) for word in phonemes]
