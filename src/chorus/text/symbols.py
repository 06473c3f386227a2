"""The phoneme symbol table: IPA characters and pause punctuation mapped to integer ids.

The table is versioned and saved inside every checkpoint, so a model is always fed the ids it was
trained with even if this module's default inventory grows later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAD = "_"
WORD_BOUNDARY = " "
PUNCTUATION = ",;:.!?"
# espeak-ng's en-us IPA output (phonemizer, with stress) uses these characters; a few extras from
# other English accents are included so en-gb text does not drop symbols.
IPA = "abdefhijklmnoprstuvwxzæçðøħŋœɐɑɒɔɕɖəɘɚɛɜɝɞɟɡɣɤɥɨɪɫɬɭɮɯɰɱɲɳɴɵɸɹɺɻɽɾʀʁʂʃʈʉʊʋʌʍʎʏʐʑʒʔʕʙʝʟʰʲʷˈˌːˑ̩̃θχᵻ"
SYMBOL_TABLE_VERSION = 1


@dataclass(frozen=True)
class SymbolTable:
    """Maps phoneme characters to ids. Id 0 is padding and never produced by :meth:`encode`."""

    symbols: tuple[str, ...] = field(default_factory=lambda: (PAD, WORD_BOUNDARY, *PUNCTUATION, *IPA))
    version: int = SYMBOL_TABLE_VERSION

    def __post_init__(self) -> None:
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError("symbol table has duplicate symbols")
        if self.symbols[0] != PAD:
            raise ValueError(f"symbol 0 must be the padding symbol {PAD!r}")

    @property
    def ids(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, phonemes: str) -> tuple[list[int], set[str]]:
        """Return the ids of ``phonemes`` and the set of characters that had no id (dropped)."""
        table = self.ids
        ids, unknown = [], set()
        for char in phonemes:
            if char in table and char != PAD:
                ids.append(table[char])
            else:
                unknown.add(char)
        return ids, unknown

    def decode(self, ids: list[int]) -> str:
        return "".join(self.symbols[i] for i in ids)

    def to_dict(self) -> dict:
        return {"version": self.version, "symbols": list(self.symbols)}

    @classmethod
    def from_dict(cls, data: dict) -> SymbolTable:
        """Rebuild a table saved by :meth:`to_dict`; raises ``ValueError`` for anything else."""
        if not isinstance(data, dict) or not {"symbols", "version"} <= data.keys():
            raise ValueError("malformed symbol table: needs a dict with 'symbols' and 'version'")
        symbols, version = data["symbols"], data["version"]
        # encode() maps one character to one id, so every symbol must be a single character; a bare
        # string would otherwise be split into characters and silently accepted.
        if not isinstance(symbols, list) or not all(isinstance(s, str) and len(s) == 1 for s in symbols):
            raise ValueError("malformed symbol table: 'symbols' must be a list of single characters")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"malformed symbol table: 'version' must be an integer, got {version!r}")
        if not symbols:
            raise ValueError("malformed symbol table: no symbols")
        return cls(symbols=tuple(symbols), version=version)
