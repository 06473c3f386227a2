"""The SSML that Chorus reads, and a clear refusal of the rest.

Text that starts with ``<speak`` is SSML. Understood: ``<break time="500ms"/>`` (or ``strength``),
``<say-as interpret-as="characters|spell-out|verbatim|cardinal|number|ordinal|digits|telephone|date">``,
``<phoneme alphabet="ipa" ph="...">``, ``<sub alias="...">``, and ``<p>``/``<s>`` (which only mark
sentences). Any other element (``prosody``, ``emphasis``, ``voice``, ``audio`` ...) is refused with
:class:`SsmlError` naming it, never silently dropped.
"""

from __future__ import annotations

import calendar
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from num2words import num2words

from chorus.text.normalize import full_year, spoken_cardinal, spoken_date

BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.7, "x-strong": 1.2}
MAX_BREAK_SECONDS = 10.0
SAY_AS = ("characters", "spell-out", "verbatim", "cardinal", "number", "ordinal", "digits", "telephone", "date")
SUPPORTED = ("speak", "break", "say-as", "phoneme", "sub", "p", "s")
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")


MAX_ORDINAL_DIGITS = 30


class SsmlError(ValueError):
    """SSML this reader cannot follow; the message names the element or attribute."""


@dataclass(frozen=True)
class Pause:
    seconds: float

    def samples(self, rate: int) -> int:
        """Its length in samples at ``rate``."""
        return int(round(self.seconds * rate))


def is_ssml(text: str) -> bool:
    return text.lstrip().startswith("<speak")


def parse_ssml(text: str) -> list[str | Pause]:
    """Text pieces (plain text the normalizer reads, phonemes as ``[[...]]``) and pauses, in order."""
    try:
        root = ElementTree.fromstring(text.strip())
    except ElementTree.ParseError as error:
        raise SsmlError(f"SSML that does not parse: {error}") from None
    if _local(root.tag) != "speak":
        raise SsmlError(f"SSML must be one <speak> element, not <{_local(root.tag)}>")
    pieces: list[str | Pause] = []
    _walk(root, pieces)
    merged: list[str | Pause] = []
    for piece in pieces:  # neighbouring text pieces become one, so sentences split as written
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    return [_tidy(p) if isinstance(p, str) else p for p in merged if isinstance(p, Pause) or p.strip()]


def _tidy(text: str) -> str:
    """One space between words, none before punctuation; line breaks (sentence ends) kept."""
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" ?\n[ \n]*", "\n", text)
    return re.sub(r" (?=[,.;:!?])", "", text).strip()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # without an xmlns


def _walk(element: ElementTree.Element, pieces: list[str | Pause]) -> None:
    tag = _local(element.tag)
    if tag not in SUPPORTED:
        raise SsmlError(f"SSML <{tag}> is not supported; Chorus reads <{'>, <'.join(SUPPORTED)}>")
    if tag == "break":
        pieces.append(Pause(_break_seconds(element)))
    elif tag == "say-as":
        pieces.append(" " + _say_as(element) + " ")
    elif tag == "phoneme":
        if element.get("alphabet", "ipa") != "ipa":
            raise SsmlError(f"SSML <phoneme alphabet={element.get('alphabet')!r}>: only 'ipa' is read")
        if not element.get("ph"):
            raise SsmlError("SSML <phoneme> needs a ph attribute")
        written = " ".join("".join(element.itertext()).split()).replace("|", " ")
        pieces.append(f" [[{element.get('ph')}|{written}]] " if written else f" [[{element.get('ph')}]] ")
    elif tag == "sub":
        if element.get("alias") is None:
            raise SsmlError("SSML <sub> needs an alias attribute")
        pieces.append(" " + element.get("alias") + " ")
    else:
        pieces.append(element.text or "")
        for child in element:
            _walk(child, pieces)
            pieces.append(child.tail or "")
        if tag in ("p", "s"):
            pieces.append("\n")  # a sentence (or paragraph) ends here
        return
    if tag == "break" and (element.text or "").strip():
        raise SsmlError("SSML <break> takes no text")


def _break_seconds(element: ElementTree.Element) -> float:
    time, strength = element.get("time"), element.get("strength")
    if time is not None:
        match = _TIME.match(time)
        if match is None:
            raise SsmlError(f"SSML <break time={time!r}>: give milliseconds or seconds, e.g. '500ms' or '1.5s'")
        seconds = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
    elif strength is not None:
        if strength not in BREAK_STRENGTHS:
            raise SsmlError(f"SSML <break strength={strength!r}>: one of {', '.join(BREAK_STRENGTHS)}")
        seconds = BREAK_STRENGTHS[strength]
    else:
        seconds = BREAK_STRENGTHS["medium"]
    if seconds > MAX_BREAK_SECONDS:
        raise SsmlError(f"SSML <break> of {seconds:g} s: at most {MAX_BREAK_SECONDS:g} s")
    return seconds


def _say_as(element: ElementTree.Element) -> str:
    kind = element.get("interpret-as")
    content = "".join(element.itertext()).strip()
    if kind not in SAY_AS:
        raise SsmlError(f"SSML <say-as interpret-as={kind!r}>: Chorus reads {', '.join(SAY_AS)}")
    if kind in ("characters", "spell-out", "verbatim"):
        return " ".join(c for c in content if not c.isspace())
    if kind in ("digits", "telephone"):
        groups = re.findall(r"\d+", content)
        return ", ".join(" ".join(num2words(int(d)) for d in group) for group in groups)
    digits = content.replace(",", "")
    if kind in ("cardinal", "number"):
        if not re.fullmatch(r"-?\d+(?:\.\d+)?", digits):
            raise SsmlError(f"SSML <say-as interpret-as='{kind}'>: {content!r} is not a number")
        return spoken_cardinal(digits)  # spelled here: digits left to the normalizer may read as a year
    if kind == "ordinal":
        if not digits.isdigit():
            raise SsmlError(f"SSML <say-as interpret-as='ordinal'>: {content!r} is not a whole number")
        if len(digits) > MAX_ORDINAL_DIGITS:  # num2words overflows; nobody says a longer ordinal anyway
            raise SsmlError(f"SSML <say-as interpret-as='ordinal'>: at most {MAX_ORDINAL_DIGITS} digits")
        return num2words(int(digits), to="ordinal").replace("-", " ")
    return _date(content, element.get("format", "mdy"))


def _date(content: str, layout: str) -> str:
    """A date read out ("March fifth, twenty twenty four"): spelled here, so that captions show it as said rather
    than as the ISO form the normalizer reads it from."""
    parts = re.findall(r"\d+", content)
    if sorted(layout) != sorted("mdy") or len(parts) != 3:
        raise SsmlError(f"SSML <say-as interpret-as='date' format={layout!r}>: {content!r} is not a date in it")
    value = dict(zip(layout, parts))
    if len(value["y"]) not in (2, 4):
        raise SsmlError(f"SSML <say-as interpret-as='date' format={layout!r}>: {content!r}: a year has 2 or 4 digits")
    year = full_year(value["y"])
    month, day = int(value["m"]), int(value["d"])
    # Stricter than text's dates, which the calendar does not check: markup that says "a date" must be one.
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(max(int(year), 1), month)[1]):
        raise SsmlError(
            f"SSML <say-as interpret-as='date' format={layout!r}>: {content!r} is not a date (month {month}, day {day})"
        )
    return spoken_date(month, day, year)
