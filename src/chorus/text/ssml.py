"""The SSML that Chorus reads: what it follows, and the text of what it does not.

SSML is text whose root is ``<speak>``, or text holding an element of an SSML name (``Wait <break
time="1s"/> now.``, ``I <emphasis>mean</emphasis> it``), read as if wrapped in ``<speak>``; other text
with "<" ("x < 5", "a <b> c") is plain. Followed: ``<break time="500ms"/>`` (or ``strength``),
``<say-as interpret-as="characters|spell-out|verbatim|cardinal|number|ordinal|digits|telephone|date">``,
``<phoneme alphabet="ipa" ph="...">``, ``<sub alias="...">``, and ``<p>``/``<s>`` (which only mark
sentences). Any other element (``prosody``, ``emphasis``, ``voice``, a ``say-as`` of another kind ...) is
read as the text it holds, as SSML asks of a processor, and named as ignored; ``desc`` and ``metadata``
hold no speech and are left out. Markup that does not parse and invalid values of followed attributes
(``<break time="fast"/>``) raise :class:`SsmlError` naming them.
"""

from __future__ import annotations

import calendar
import html
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from xml.sax.saxutils import escape as xml_escape

from num2words import num2words

from chorus.text.caller_warning import warn_caller
from chorus.text.normalize import full_year, spoken_cardinal, spoken_date

BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.7, "x-strong": 1.2}
MAX_BREAK_SECONDS = 10.0
SAY_AS = ("characters", "spell-out", "verbatim", "cardinal", "number", "ordinal", "digits", "telephone", "date")
SUPPORTED = ("speak", "break", "say-as", "phoneme", "sub", "p", "s")
# SSML's elements that Chorus does not follow but whose text is speech: read as that text.
READ_AS_TEXT = ("emphasis", "prosody", "voice", "lang", "mark", "audio", "w", "token", "lookup")
# SSML's elements that hold no speech (an audio clip's description, metadata): left out with what they hold.
NOT_READ = ("desc", "metadata", "meta", "lexicon")
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")
_SPEAK_ROOT = re.compile(r"\s*(?:<\?xml[^>]*>\s*)?<speak(?=[\s/>])")
_NAMES = "|".join(re.escape(name) for name in SUPPORTED + READ_AS_TEXT + NOT_READ)
_EMPTY_ELEMENT = re.compile(rf"<(?:{_NAMES})(?=[\s/])[^<>]*/>")
_OPENING_TAG = re.compile(rf"<({_NAMES})(?=[\s>])[^<>]*>")
_CLOSING_TAG = re.compile(rf"</({_NAMES})\s*>")
# In text that is SSML without a <speak> root, a "<" that starts no tag ("x < 5") and a "&" that starts no
# entity of XML's ("Q&A") are the writer's text, not broken markup; HTML's own entities (&mdash;, &nbsp;),
# which XML lacks, are their characters.
_STRAY_MARKUP = re.compile(r"<(?![A-Za-z_/!?])|&(?!(?:#\d+|#x[0-9A-Fa-f]+|amp|lt|gt|quot|apos);)(?:\w+;)?")
# Deeper than any SSML is written; each level costs the reader stack frames (a review: 500 levels of <s> in
# 3,516 characters raised RecursionError, a 500).
MAX_DEPTH = 50


MAX_ORDINAL_DIGITS = 30


class SsmlError(ValueError):
    """SSML this reader cannot follow; the message names the element or attribute."""


class IgnoredSsmlWarning(UserWarning):
    """SSML elements Chorus does not follow were read as the text they hold, without their effect."""


@dataclass(frozen=True)
class Pause:
    seconds: float

    def samples(self, rate: int) -> int:
        """Its length in samples at ``rate``."""
        return int(round(self.seconds * rate))


def is_ssml(text: str) -> bool:
    """Whether ``text`` is SSML: rooted in ``<speak>``, or holding an element of an SSML name, empty
    (``<break/>``) or opened and closed after (``<s>...</s>``); "a <b> c", "x < 5" and a lone "<p>" are not."""
    if _SPEAK_ROOT.match(text) or _EMPTY_ELEMENT.search(text):
        return True
    # Each name's last closing tag, found once: searching for it after each opening tag took quadratic time.
    last_closed = {tag[1]: tag.start() for tag in _CLOSING_TAG.finditer(text)}
    return any(tag.end() <= last_closed.get(tag[1], -1) for tag in _OPENING_TAG.finditer(text))


def parse_ssml(text: str, ignored: list[str] | None = None) -> list[str | Pause]:
    """Text pieces (plain text the normalizer reads, phonemes as ``[[...]]``) and pauses, in order. The
    elements read as their text are named in ``ignored`` when a list is given, else in an
    :class:`IgnoredSsmlWarning`."""
    pieces: list[str | Pause] = []
    _walk(_followed_root(text, ignored), pieces)
    merged: list[str | Pause] = []
    for piece in pieces:  # neighbouring text pieces become one, so sentences split as written
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    return [_tidy(p) if isinstance(p, str) else p for p in merged if isinstance(p, Pause) or p.strip()]


def _followed_root(text: str, ignored: list[str] | None) -> ElementTree.Element:
    """``text``'s ``<speak>`` element, without namespaces, holding only elements Chorus follows."""
    source = text.strip() if _SPEAK_ROOT.match(text) else f"<speak>{_STRAY_MARKUP.sub(_escaped, text)}</speak>"
    try:
        root = ElementTree.fromstring(source)
    except ElementTree.ParseError as error:
        raise SsmlError(f"SSML that does not parse: {error}") from None
    if _depth(root) > MAX_DEPTH:
        raise SsmlError(f"SSML nested more than {MAX_DEPTH} elements deep")
    names: list[str] = []
    root.tag = _local(root.tag)
    _hold(root, _content(root, names))
    names = list(dict.fromkeys(names))  # each once, in the order met
    if ignored is not None:
        ignored += names
    elif names:
        warn_caller(
            f"read the text of SSML Chorus does not follow, without its effect: {', '.join(names)}",
            IgnoredSsmlWarning,
        )
    return root


def _escaped(stray: re.Match) -> str:
    """A stray "<" or "&" of text without a ``<speak>`` root escaped; an HTML entity as its character."""
    if stray[0] in ("<", "&"):
        return "&lt;" if stray[0] == "<" else "&amp;"
    return xml_escape(html.unescape(stray[0]))  # "&mdash;": "—"; one HTML lacks too stays as written


def _depth(root: ElementTree.Element) -> int:
    """How many elements deep ``root`` goes (itself 1), counted without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        element, depth = stack.pop()
        deepest = max(deepest, depth)
        stack += [(child, depth + 1) for child in element]
    return deepest


def _content(element: ElementTree.Element, ignored: list[str]) -> list[str | ElementTree.Element]:
    """What ``element`` holds, in order: its text, and its elements as Chorus follows them (:func:`_followed`)."""
    content: list[str | ElementTree.Element] = [element.text or ""]
    for child in element:
        content += _followed(child, ignored)
        content.append(child.tail or "")
    return content


def _followed(element: ElementTree.Element, ignored: list[str]) -> list[str | ElementTree.Element]:
    """``element`` as Chorus reads it: itself, holding what it follows; else the text it holds (none for
    :data:`NOT_READ`), its name appended to ``ignored``."""
    tag = element.tag = _local(element.tag)
    kind = element.get("interpret-as")
    other_say_as = tag == "say-as" and kind not in SAY_AS  # read as its text, as SSML asks of such a kind
    # HTML's <sub> (a subscript: "H<sub>2</sub>O") has no alias: its text is read.
    plain_sub = tag == "sub" and element.get("alias") is None
    if tag in SUPPORTED and not (other_say_as or plain_sub):
        _hold(element, _content(element, ignored))
        return [element]
    named = "<sub> without an alias" if plain_sub else f"<{tag}>"
    ignored.append(f'<say-as interpret-as="{kind}">' if other_say_as and kind else named)
    return [] if tag in NOT_READ else _content(element, ignored)


def _hold(element: ElementTree.Element, content: list[str | ElementTree.Element]) -> None:
    """Make ``content`` (text and elements, in order) what ``element`` holds."""
    element[:] = []
    element.text = ""
    for item in content:
        if not isinstance(item, str):
            item.tail = ""
            element.append(item)
        elif len(element):
            element[-1].tail = (element[-1].tail or "") + item
        else:
            element.text = (element.text or "") + item


def _tidy(text: str) -> str:
    """One space between words, none before punctuation; line breaks (sentence ends) kept."""
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" ?\n[ \n]*", "\n", text)
    return re.sub(r" (?=[,.;:!?])", "", text).strip()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # without an xmlns


def _walk(element: ElementTree.Element, pieces: list[str | Pause]) -> None:
    tag = element.tag  # local: _followed_root took the namespaces off
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
    elif tag == "sub":  # with its alias: one without is read as its text (_followed)
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
        if not digits.isdecimal():  # not isdigit(): "²" passes that, and int() refuses it
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
