"""English text normalization: what a reader would say, written out in words.

Numbers, ordinals, currency, percentages, times and common abbreviations are expanded; punctuation
that marks a pause (, ; : . ! ? and dashes) is kept because the phonemizer passes it through and the
acoustic model learns pauses from it. Characters that have no spoken form are dropped with a warning.
"""

from __future__ import annotations

import re
import unicodedata
import warnings

from num2words import num2words

# Abbreviations that are unambiguous when followed by a period. "St." is handled apart because it is
# "Saint" before a capitalized name and "Street" after one; "No." apart because "no." ends sentences.
_ABBREVIATIONS = {
    "mr": "mister",
    "mrs": "missus",
    "ms": "miz",
    "dr": "doctor",
    "prof": "professor",
    "rev": "reverend",
    "gen": "general",
    "col": "colonel",
    "lt": "lieutenant",
    "sgt": "sergeant",
    "capt": "captain",
    "gov": "governor",
    "sen": "senator",
    "rep": "representative",
    "jr": "junior",
    "sr": "senior",
    "co": "company",
    "corp": "corporation",
    "inc": "incorporated",
    "ltd": "limited",
    "vs": "versus",
    "etc": "et cetera",
    "ave": "avenue",
    "mt": "mount",
    "ft": "fort",
    "approx": "approximately",
    "dept": "department",
    "est": "established",
}

_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
}

# Characters kept after normalization: letters, digits have been expanded by then, apostrophes inside
# words, spaces and pause punctuation. Everything else is dropped (with a warning) before phonemizing.
_ALLOWED = re.compile(r"[a-zA-Z' ,;:.!?]")
_PAUSE_DASHES = str.maketrans({"–": " - ", "—": " - ", "…": "...", "“": '"', "”": '"', "‘": "'", "’": "'"})

_abbrev_re = re.compile(r"\b(" + "|".join(_ABBREVIATIONS) + r")\.", re.IGNORECASE)
_number_abbrev_re = re.compile(r"\bno\.(?=\s*\d)", re.IGNORECASE)
_st_re = re.compile(r"\bSt\.", re.IGNORECASE)
# A word that names a street when it comes right before "St.": "Baker", "Main", "5th".
_street_name_re = re.compile(r"\b(?:[A-Z][\w']*|\d+(?:st|nd|rd|th)?)$")
_sentence_start_re = re.compile(r"(?:^|[.!?]['\"]?)\s*$")
_currency_re = re.compile(r"([$£€])\s?(\d[\d,]*)(?:\.(\d+))?\b(?:\s?(million|billion|thousand))?")
_percent_re = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?%")
_ordinal_re = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_time_re = re.compile(r"\b(\d{1,2}):(\d{2})\b(?:\s?([ap])\.?m\.?)?", re.IGNORECASE)
_decimal_re = re.compile(r"\b(\d+)\.(\d+)\b")
# Thousands separators only in groups of three ("1,000"; "1,2" is a list), and no word boundary
# needed, so digits stuck to letters ("MP3", "4K") are read rather than dropped.
_number_re = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+")
_whitespace_re = re.compile(r"\s+")


_MAX_SPOKEN_DIGITS = 30


def _words(value: int | str, **kwargs) -> str:
    """num2words without its hyphens and commas, which would otherwise read as pause cues.

    ``value`` may be a digit string; one longer than anyone reads as a number (and than num2words
    can say: it overflows, and ``int()`` refuses past 4300 digits) is read digit by digit instead.
    """
    if isinstance(value, str):
        if len(value) > _MAX_SPOKEN_DIGITS:
            return " ".join(num2words(int(digit)) for digit in value)
        value = int(value)
    return num2words(value, **kwargs).replace("-", " ").replace(",", "")


def _number(match: re.Match) -> str:
    text = match.group(0)
    digits = text.replace(",", "")
    # Bare four-digit numbers between 1100 and 2099 are nearly always years in running text.
    if len(text) == 4 and 1100 <= int(digits) <= 2099:
        return _words(digits, to="year")
    return _words(digits)


def _currency(match: re.Match) -> str:
    symbol, whole, fraction, scale = match.groups()
    unit, units, sub, subs = _CURRENCIES[symbol]
    whole = whole.replace(",", "")
    significant = whole.lstrip("0")  # compared as text: the amount may be too long for int()
    if scale or (fraction and len(fraction) > 2):
        # "$1.5 million" is one point five million dollars, not one million; "$1.234" has no cents.
        number = _decimal_or_cardinal(f"{whole}.{fraction}" if fraction else whole)
        return f"{number} {scale} {units}" if scale else f"{number} {units}"
    cents = int(fraction.ljust(2, "0")) if fraction else 0
    cents_words = f"{_words(cents)} {sub if cents == 1 else subs}"
    if not significant and cents:
        return cents_words  # "$0.99" is read "ninety nine cents"
    words = f"{_words(whole)} {unit if significant == '1' else units}"
    return f"{words} and {cents_words}" if cents else words


def _time(match: re.Match) -> str:
    hours, minutes, meridiem = int(match.group(1)), int(match.group(2)), match.group(3)
    words = _words(hours)
    if minutes == 0:
        words += " o'clock" if not meridiem else ""
    elif minutes < 10:
        words += " oh " + _words(minutes)
    else:
        words += " " + _words(minutes)
    if meridiem:
        words += " a m" if meridiem.lower() == "a" else " p m"
    return words


def _expand_abbreviation(match: re.Match) -> str:
    words = _ABBREVIATIONS[match.group(1).lower()]
    # The period also ends the text when nothing follows ("... and Co."); otherwise the trailing
    # space keeps "Mr.Smith" two words (runs of spaces are collapsed at the end).
    return words + "." if not match.string[match.end() :].strip() else words + " "


def _saint_or_street(match: re.Match) -> str:
    """Expand "St.": "Saint" before a capitalized name unless a street name precedes it.

    "St. Louis", "Visit St. Paul's" -> Saint; "Baker St. Then", "Main St. and", "on Main St." -> Street.
    """
    before, after = match.string[: match.start()], match.string[match.end() :]
    previous = before.rstrip()
    name = _street_name_re.search(previous) if previous != before else None
    # A capitalized first word of a sentence is no street name ("Visit St. Paul's"); "5th" still is.
    names_street = name is not None and (
        name.group()[0].isdigit() or not _sentence_start_re.search(previous[: name.start()])
    )
    next_is_name = re.match(r"\s*[A-Z]", after) is not None
    if next_is_name and not names_street:
        return "Saint "
    # The period doubled as the sentence end when a new sentence (or nothing) follows.
    return "Street. " if next_is_name or not after.strip() else "Street "


def normalize_text(text: str, *, warn: bool = True) -> str:
    """Return ``text`` as plain spoken English words with pause punctuation.

    >>> normalize_text("Dr. Smith paid $5.50 on May 3rd.")
    'doctor Smith paid five dollars and fifty cents on May third.'
    """
    text = unicodedata.normalize("NFKC", text).translate(_PAUSE_DASHES)
    text = text.replace(" - ", ", ")
    text = _abbrev_re.sub(_expand_abbreviation, text)
    text = _number_abbrev_re.sub("number", text)
    text = _st_re.sub(_saint_or_street, text)
    text = _currency_re.sub(_currency, text)
    text = _percent_re.sub(lambda m: _decimal_or_cardinal(m.group(1)) + " percent", text)
    text = _time_re.sub(_time, text)
    text = _ordinal_re.sub(lambda m: _words(m.group(1), to="ordinal"), text)
    text = _decimal_re.sub(lambda m: _decimal_or_cardinal(m.group(0)), text)
    # Spaces around the words part "MP3" into "MP three"; runs of spaces are collapsed at the end.
    text = _number_re.sub(lambda m: f" {_number(m)} ", text)
    text = text.replace("&", " and ").replace("-", " ").replace('"', " ")
    text = unicodedata.normalize("NFKD", text)
    kept, dropped = [], []
    for char in text:
        if _ALLOWED.match(char) or char.isspace():
            kept.append(char)
        elif unicodedata.combining(char):
            continue  # accents of decomposed letters: "café" -> "cafe"
        else:
            kept.append(" ")
            dropped.append(char)
    if dropped and warn:
        warnings.warn(
            f"dropped characters with no spoken form: {''.join(sorted(set(dropped)))!r}",
            UnknownCharacterWarning,
            stacklevel=2,
        )
    text = "".join(kept)
    text = re.sub(r"\s+([,;:.!?])", r"\1", text)
    return _whitespace_re.sub(" ", text).strip()


def _decimal_or_cardinal(text: str) -> str:
    text = text.replace(",", "")
    if "." in text:
        whole, frac = text.split(".", 1)
        return f"{_words(whole)} point {' '.join(_words(int(d)) for d in frac)}"
    return _words(text)


class UnknownCharacterWarning(UserWarning):
    """Raised (as a warning) when input characters are dropped because they have no spoken form."""
