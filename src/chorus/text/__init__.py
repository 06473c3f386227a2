"""Text front end: normalize -> phonemize (espeak-ng IPA) -> symbol ids.

Training and inference both call :meth:`TextFrontEnd.encode`, so text is always processed the same
way; the symbol table travels inside each checkpoint.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from chorus.text.normalize import UnknownCharacterWarning, normalize_text
from chorus.text.phonemize import phonemize
from chorus.text.symbols import SymbolTable

__all__ = ["TextFrontEnd", "SymbolTable", "normalize_text", "phonemize", "UnknownCharacterWarning"]


@dataclass
class TextFrontEnd:
    symbols: SymbolTable = field(default_factory=SymbolTable)
    language: str = "en-us"

    def to_phonemes(self, texts: list[str]) -> list[str]:
        return phonemize([normalize_text(t) for t in texts], self.language)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Symbol ids for each text. Characters without an id are dropped with one warning.

        Raises ``ValueError`` naming the text if nothing speakable is left.
        """
        result = []
        # strict: a phonemizer that lost a line must fail loudly, not hand out a neighbour's ids.
        for text, phonemes in zip(texts, self.to_phonemes(texts), strict=True):
            ids, unknown = self.symbols.encode(phonemes)
            if unknown:
                warnings.warn(
                    f"dropped phoneme symbols not in table v{self.symbols.version}: {''.join(sorted(unknown))!r}",
                    UnknownCharacterWarning,
                    stacklevel=2,
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
