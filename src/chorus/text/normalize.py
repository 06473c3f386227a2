"""English text normalization: what a reader would say, written out in words.

Numbers, ordinals, fractions, ranges, ratios, multipliers, currency (with its K / M / B scales),
percentages, units, times, dates, decades, phone numbers, comparison signs, Roman numerals after a name
or a numbered noun, e-mail addresses, URLs and common abbreviations are expanded; punctuation
that marks a pause (, ; : . ! ? and dashes) is kept because the phonemizer passes it through and the
acoustic model learns pauses from it. Latin letters keep their accents, because espeak-ng reads
"café", "résumé" and "crème brûlée" better with them than without. Characters that have no spoken form
are dropped with a warning.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from num2words import num2words

from chorus.text.caller_warning import warn_caller

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
    "apt": "apartment",
    "blvd": "boulevard",
    "ext": "extension",
    "e.g": "for example",
    "i.e": "that is",
}

_MONTHS = "January February March April May June July August September October November December".split()
_MONTH_ABBREVIATIONS = {m[:3].lower(): m for m in _MONTHS} | {"sept": "September"}

# Units read after a number: (singular, plural). Case matters where it tells units apart (mW, MW).
_UNITS = {
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "m": ("meter", "meters"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "g": ("gram", "grams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "ft": ("foot", "feet"),
    "mi": ("mile", "miles"),
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "l": ("liter", "liters"),
    "L": ("liter", "liters"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°": ("degree", "degrees"),
    "KB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "Hz": ("hertz", "hertz"),
    "kHz": ("kilohertz", "kilohertz"),
    "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "kW": ("kilowatt", "kilowatts"),
    "ms": ("millisecond", "milliseconds"),
    "min": ("minute", "minutes"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
}
# Signs that compare two things, said as words; a tag ("<break/>") is left as it is.
_COMPARISONS = {
    "<": "less than",
    ">": "greater than",
    "<=": "less than or equal to",
    ">=": "greater than or equal to",
    "\u2264": "less than or equal to",
    "\u2265": "greater than or equal to",
    "!=": "not equal to",
    "\u2260": "not equal to",
    "=": "equals",
}
# Nouns that number what follows them: a Roman numeral after one is a cardinal ("World War II": two).
# After any other capitalized word it is a monarch's or a pope's ordinal ("Henry VIII": the eighth).
_NUMBERED_NOUNS = {
    "War", "Chapter", "Part", "Volume", "Act", "Scene", "Book", "Phase", "Type", "Class", "Level", "Article",
    "Section", "Appendix", "Super Bowl", "Episode", "Season", "Stage", "Title", "Round", "Grade",
}  # fmt: skip
# Names monarchs and popes reign under: a Roman numeral after one is an ordinal ("Henry VIII": the eighth).
# A list, not any capitalized word: "Give IV fluids", "Using VI" and sequels ("Rocky II") are no reigns.
_REGNAL_NAMES = {
    "Alexander", "Alfonso", "Anne", "Benedict", "Boniface", "Catherine", "Charles", "Christian", "Clement",
    "Constantine", "Edward", "Elizabeth", "Ferdinand", "Francis", "Frederick", "George", "Gregory", "Gustav",
    "Harald", "Henry", "Innocent", "Ivan", "James", "John", "Juan", "Leo", "Louis", "Mary", "Napoleon",
    "Nicholas", "Olav", "Paul", "Peter", "Philip", "Pius", "Richard", "Victor", "Wilhelm", "William",
}  # fmt: skip
_ROMAN_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
_FRACTION_NAMES = {2: ("half", "halves"), 4: ("quarter", "quarters")}
# Number pairs written with a slash that are said as two numbers, not as a fraction. Improper ones
# ("24/7", "50/50", "20/20") are caught by rule; these are the proper-looking ones.
_SLASH_NAMES = {"9/11", "7/11", "1/10"}

# Scales written after an amount: "$1.5B", "$20M", "$3K", "€2bn".
_SCALES = {
    "K": "thousand",
    "k": "thousand",
    "M": "million",
    "m": "million",
    "B": "billion",
    "bn": "billion",
    "T": "trillion",
    "tn": "trillion",
}

_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "sen", "sen"),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}

# Characters kept after normalization: letters, digits have been expanded by then, apostrophes inside
# words, spaces and pause punctuation. Everything else is dropped (with a warning) before phonemizing.
_ALLOWED = re.compile(r"[a-zA-Z' ,;:.!?]")
# A dash between two numbers is a range ("5–10 minutes"), not a pause.
_number_dash_re = re.compile(r"(?<=\d)\s?[–—]\s?(?=\d)")
_PAUSE_DASHES = str.maketrans({"–": " - ", "—": " - ", "…": "...", "“": '"', "”": '"', "‘": "'", "’": "'"})
_minus_sign_re = re.compile(r"\u2212\s?(?=\.?\d)")  # U+2212 before an amount: "−7", "3 − 2" (minus two)

_abbrev_re = re.compile(r"\b(" + "|".join(re.escape(a) for a in _ABBREVIATIONS) + r")\.", re.IGNORECASE)
_url_re = re.compile(r"\b(?:https?://|www\.)[^\s<>\"']*[^\s<>\"'.,;:!?)]", re.IGNORECASE)
_email_re = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_iso_date_re = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_slash_date_re = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b")
_month_day_re = re.compile(
    r"\b(" + "|".join(_MONTHS) + r"|(?:" + "|".join(_MONTH_ABBREVIATIONS) + r")\.?)\s+(\d{1,2})(?:st|nd|rd|th)?\b(?!:)",
    re.IGNORECASE,
)
_month_abbrev_re = re.compile(r"\b(" + "|".join(_MONTH_ABBREVIATIONS) + r")\.", re.IGNORECASE)
# A number with a country code, its groups apart by spaces or dots: "+1 800 555 0199", "+44 20 7946 0958".
_international_phone_re = re.compile(r"(?<![\w+])\+(\d{1,3})((?:[ .]\d{1,4}){2,})(?![\d-]|\.\d)")
_phone_re = re.compile(r"(?<![\d-])(?:(\+?1)[-. ])?(?:\((\d{3})\)\s?|(\d{3})[-. ])?(\d{3})-(\d{4})(?![\d-])")
# A minus sign before an amount: "-5", "-3.5%", "-$20", "-.5" (not inside a word, a range or a date).
_negative_re = re.compile(r"(?<![\w-])-(?=[" + "".join(_CURRENCIES) + r"]?\.?\d)")
_percent_range_re = re.compile(r"(?<=\d%)\s?-\s?(?=\d)")  # "5%-10%": five percent to ten percent
_unit_names = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))  # longest first: "km/h"
# Each amount starts where no digit, nor a digit and a comma, is before it: tried from inside a run of digits,
# the scan to its end made 4,096 digits take seconds (a review; quadratic in the run's length).
_AMOUNT = r"(?<!\d)(?<!\d,)(\d[\d,]*(?:\.\d+)?)"  # "5%,10%": the second is an amount of its own
_unit_re = re.compile(_AMOUNT + r"\s?(" + _unit_names + r")(?![\w/])")
# A unit per unit ("2 mg/kg", "5 m/s" is not listed: only pairs of listed units): "milligrams per kilogram".
_per_unit_re = re.compile(_AMOUNT + r"\s?(" + _unit_names + r")/(" + _unit_names + r")(?![\w/])")
# Three or more dotted numbers: a version ("2.0.1": two point zero point one) or, four of at most three
# digits, an IPv4 address ("10.0.0.1": ten dot zero dot zero dot one).
_dotted_re = re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}(?![\d.]\d)")
# Vulgar fraction characters ("½", "⅔"); NFKC writes each as digits around a fraction slash (U+2044).
_vulgar_fraction_re = re.compile(r"[\u00bc-\u00be\u2150-\u215e\u2189]")
# At most 30 digits a number (_MAX_SPOKEN_DIGITS): a longer run is read digit by digit, as _number reads it,
# never through int() and num2words (which overflow: a probe's 308-digit numerator was a 500).
_fraction_slash_re = re.compile(r"(?:\b(\d{1,30})\s+)?\b(\d{1,30})\u2044(\d{1,30})\b")
_mixed_fraction_re = re.compile(r"\b(\d{1,30})\s+(\d{1,30})/(\d{1,30})\b")
_fraction_re = re.compile(r"\b(\d{1,30})/(\d{1,30})\b")
# What is left of a hyphen between two numbers once dates and phone numbers are read: a range or a score.
_range_re = re.compile(r"(?<=\d)-(?=\d)")
_times_re = re.compile(r"\b(\d+(?:\.\d+)?)[x×](?!\w|\.\w)")  # "1.5x faster", "by 2x."
_by_re = re.compile(r"\b(\d+)\s?[x×]\s?(\d+)\b")  # "3x3 grid", "1920×1080"
_number_sign_re = re.compile(r"#(?=\d)")
_sharp_re = re.compile(r"\b([A-G])#(?!\w)")  # "C#", "F#": the languages, and the notes
_plus_plus_re = re.compile(r"\b([A-Za-z])\+\+(?![\w+])")  # "C++", "g++", "A++"
_dot_net_re = re.compile(r"\.NET\b")
# A comparison sign, or a tag whose brackets are no signs: "<" right before a letter (or "/") and a ">" later.
_OPERAND = re.compile(r"[(]?(?:[-+]?\$?\d[\d,.]*%?|[A-Za-z])[)]?[.,;:!?]?|[A-Za-z]?\d[\d,.]*%?")  # "5", "-3.5%", "x"
_comparison_re = re.compile(r"<[A-Za-z/][^<>]*>|[<>!]=|[<>=\u2264\u2265\u2260]")
# A Roman numeral after a capitalized word, or after "Super Bowl" (validated: "IIII" and "XXL" are none;
# the lookbehind keeps the numeral from matching empty).
_roman_re = re.compile(
    r"\b(Super Bowl|[A-Z][a-z]+)\s+(?=[IVXLCDM])"
    r"(M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3}))(?<=[IVXLCDM])\b"
)
# N:M that is a ratio, by the word before or after it; other N:M are times ("3:15").
_ratio_re = re.compile(
    r"\b(?:((?:ratio|odds) of)\s+)?(?<!:)(\d+):(\d+)\b(?!:\d)(\s+(?:aspect\s+)?(?:ratios?|odds)\b)?", re.IGNORECASE
)
# A number from 1000 to 1099 is a year too after "in", "since" or "until", where the clause ends or goes on
# as after a date ("in 1066, ...", "in 1066 the Normans ..."): not before a unit or a count ("in 1024 bytes",
# "from 1024 to 2048", "1080p"). Later years are years wherever they stand (see _number).
_early_year_re = re.compile(
    r"\b((?:in|since|until)\s+)(10\d\d)(?=\s*(?:[.,;:!?)]|$)|\s+(?:the|a|an|and|when|after|before|during)\b|\s+[A-Z])"
)
_decade_re = re.compile(r"(?:\b(\d{2})|')?(\d0)s\b")
_number_abbrev_re = re.compile(r"\bno\.(?=\s*\d)", re.IGNORECASE)
_st_re = re.compile(r"\bSt\.", re.IGNORECASE)
# A word that names a street when it comes right before "St.": "Baker", "Main", "5th".
_street_name_re = re.compile(r"\b(?:[A-Z][\w']*|\d+(?:st|nd|rd|th)?)$")
_sentence_start_re = re.compile(r"(?:^|[.!?]['\"]?)\s*$")
_currency_re = re.compile(
    "(["
    + "".join(_CURRENCIES)
    + r"])\s?(\d[\d,]*)(?:\.(\d+))?(?:\s?(million|billion|thousand|trillion)\b|(bn|tn|[KkMmBT])\b|\b)"
)
_percent_re = re.compile(_AMOUNT + r"\s?%")
_ordinal_re = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_time_re = re.compile(r"\b(\d{1,2})(?::(\d{2})(?!\d)(?:\s?([ap])\.?m\b\.?)?|\s?([ap])\.?m\b\.?)", re.IGNORECASE)
_decimal_re = re.compile(r"\b(\d+)\.(\d+)\b")
_leading_point_re = re.compile(r"(?<![\w.])\.(?=\d)")  # ".75 cups", "-.5%": a zero before the point
# Thousands grouped by spaces, as SI style writes them ("1 000 000", "10 000"); see grouped_numbers().
_spaced_thousands_re = re.compile(
    r"(?<![\d.,])\d{1,3}(?:[ \u00a0\u2009\u202f]\d{3})+(?!\d|,\d|[ \u00a0\u2009\u202f]\d)"
)
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
    if len(digits) > 2 and digits.startswith("0"):
        return _digits(digits)  # a code ("Agent 007", "PIN 0042"): its zeros are said; "Chapter 01" is one
    # Bare four-digit numbers between 1100 and 2099 are nearly always years in running text.
    if len(text) == 4 and 1100 <= int(digits) <= 2099:
        return _words(digits, to="year")
    return _words(digits)


def _currency(match: re.Match) -> str:
    symbol, whole, fraction, scale, scale_letter = match.groups()
    scale = scale or _SCALES.get(scale_letter or "")
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


def _spell(text: str) -> str:
    """``text`` said character by character: digits as words, ``.`` as "dot", ``/`` as "slash", a query's
    ``?`` and ``=`` by their names (so an address never ends a sentence where it has a question mark)."""
    said = {".": " dot ", "/": " slash ", "@": " at ", "-": " dash ", "_": " underscore ", ":": " colon ",
            "?": " question mark ", "=": " equals ", "&": " and ", "#": " hash "}  # fmt: skip
    out = []
    for part in re.split(r"([./@_:?=&#-])", text):
        if part in said:
            out.append(said[part])
        elif part.isdecimal():  # not isdigit(): "፩" and "²" are digits int() cannot read
            out.append(" ".join(_words(int(d)) for d in part) if len(part) > 4 else _words(part))
        elif part:
            out.append(part)
    return " ".join("".join(out).split())


def _url(match: re.Match) -> str:
    address = re.sub(r"^(?:https?://)", "", match.group(0), flags=re.IGNORECASE)
    spoken = _spell(address.rstrip("/"))
    return " " + re.sub(r"^www\b", "w w w", spoken, flags=re.IGNORECASE) + " "


def _email(match: re.Match) -> str:
    return f" {_spell(match.group(0))} "


def _digits(text: str) -> str:
    return " ".join(_words(int(d)) for d in text)


def _international_phone(match: re.Match) -> str:
    """ "+1 800 555 0199" -> "plus one, eight zero zero, five five five, zero one nine nine"; fewer than 7 or
    more than 15 digits (E.164's most) is no phone number and is left as it is."""
    country, rest = match.groups()
    groups = [country, *rest.replace(".", " ").split()]
    if not 7 <= len("".join(groups)) <= 15:
        return match.group(0)
    return "plus " + ", ".join(_digits(group) for group in groups)


def _phone(match: re.Match) -> str:
    """Phone numbers digit by digit, a pause between the groups: 555-1234 -> "five five five, one two three four";
    a country code said ("+1 800-555-0199": "plus one, eight zero zero, ...")."""
    country, area = match.group(1), match.group(2) or match.group(3)
    said = ["plus one" if country.startswith("+") else "one"] if country else []
    groups = ([area] if area else []) + [match.group(4), match.group(5)]
    return ", ".join(said + [_digits(g) for g in groups])


def spoken_date(month: int, day: int, year: str | None) -> str:
    """A date as said: "March fifth, twenty twenty four" (``ValueError`` for a month or day out of range)."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise ValueError
    spoken = f"{_MONTHS[month - 1]} {_words(day, to='ordinal')}"
    return f"{spoken}, {_words(year, to='year')}" if year else spoken


def full_year(year: str) -> str:
    """A year of 2 digits as 4 (under 50: this century; else the last), one of 4 as it is."""
    return year if len(year) == 4 else ("20" + year if int(year) < 50 else "19" + year)


def _iso_date(match: re.Match) -> str:
    year, month, day = match.groups()
    try:
        return spoken_date(int(month), int(day), year)
    except ValueError:
        return match.group(0)


def _slash_date(match: re.Match) -> str:
    month, day, year = match.groups()  # US order, as the rest of the front end is en-us
    year = full_year(year)
    try:
        return spoken_date(int(month), int(day), year)
    except ValueError:
        return match.group(0)


def _month_day(match: re.Match) -> str:
    month = match.group(1).rstrip(".")
    name = next((m for m in _MONTHS if m.lower() == month.lower()), None) or _MONTH_ABBREVIATIONS[month.lower()]
    day = int(match.group(2))
    return f"{name} {_words(day, to='ordinal')}" if 1 <= day <= 31 else match.group(0)


def _unit(match: re.Match) -> str:
    """ "5 km" and, with a second unit, "2 mg/kg": "two milligrams per kilogram"."""
    number, unit, *per = match.groups()
    singular, plural = _UNITS[unit]
    said = f"{_decimal_or_cardinal(number)} {singular if number == '1' else plural}"
    return f"{said} per {_UNITS[per[0]][0]}" if per else said


def _dotted(match: re.Match) -> str:
    parts = match.group(0).split(".")
    address = len(parts) == 4 and all(len(part) <= 3 for part in parts)
    return " " + (" dot " if address else " point ").join(_words(part) for part in parts) + " "  # "v1.2.3"


def _fraction_words(numerator: int, denominator: int) -> str:
    if denominator in _FRACTION_NAMES:
        one, many = _FRACTION_NAMES[denominator]
    else:
        one = _words(denominator, to="ordinal")
        many = one + "s"
    return f"{_words(numerator)} {one if numerator == 1 else many}"


def _fraction_or_over(numerator: int, denominator: int) -> str:
    """ "three quarters"; "one over two hundred" where the denominator has no everyday name."""
    if denominator < 2 or denominator > 100:
        return f"{_words(numerator)} over {_words(denominator)}"
    return _fraction_words(numerator, denominator)


def _whole_and_fraction(whole: int, numerator: int, denominator: int) -> str:
    if numerator == 1 and denominator == 2:
        return f"{_words(whole)} and a half"
    return f"{_words(whole)} and {_fraction_words(numerator, denominator)}"


def _fraction(match: re.Match) -> str:
    numerator, denominator = int(match.group(1)), int(match.group(2))
    if match.group(0) in _SLASH_NAMES or (numerator >= denominator > 1):
        return f"{_words(numerator)} {_words(denominator)}"  # "24/7", "50/50", "9/11"
    return _fraction_or_over(numerator, denominator)


def _mixed_fraction(match: re.Match) -> str:
    whole, numerator, denominator = (int(g) for g in match.groups())
    if not 0 < numerator < denominator <= 100:
        return match.group(0)
    return _whole_and_fraction(whole, numerator, denominator)


def _fraction_slash(match: re.Match) -> str:
    """ "1⁄2", "2 3⁄4" (and so "½", "2¾"): a fraction slash always writes a fraction, "1⁄10" and "5⁄4" too."""
    whole, numerator, denominator = match.groups()
    fraction = _fraction_or_over(int(numerator), int(denominator))
    if whole is None:
        return fraction
    if 0 < int(numerator) < int(denominator) <= 100:
        return _whole_and_fraction(int(whole), int(numerator), int(denominator))
    return f"{_words(whole)} {fraction}"


def _ratio(match: re.Match) -> str:
    """ "a 3:1 ratio", "odds of 100:1": "three to one"; any other N:M is left to the time rule."""
    before, first, second, after = match.groups()
    if not (before or after):
        return match.group(0)
    return f"{before or ''} {_words(first)} to {_words(second)}{after or ''}"


def _comparison(match: re.Match) -> str:
    """ "x < 5", "a >= b", "> 3", "1 = 1" in words: a sign with a number or a one-letter name beside it, on
    either side, apart by spaces or digits ("x<5" too; not "=": "?id=5" is a query). Anything else is left as
    it is: "Settings > Privacy" and a quote's ">" are no comparisons, nor are "a<b", "=>" or a tag."""
    sign = match.group(0)
    if sign not in _COMPARISONS:
        return sign  # a tag
    text = match.string
    before, after = text[max(0, match.start() - 1) : match.start()], text[match.end() : match.end() + 1]
    apart = all(side == "" or side.isspace() or side.isdigit() for side in (before, after))
    tight = (
        sign != "=" and any(side.isdigit() for side in (before, after)) and any(s.isalpha() for s in (before, after))
    )
    # The words either side, from a window: splitting all the text at each sign was quadratic in the signs.
    left = text[max(0, match.start() - 40) : match.start()].split()[-1:]
    right = text[match.end() : match.end() + 40].split()[:1]
    if (apart or tight) and any(_OPERAND.fullmatch(side[0]) for side in (left, right) if side):
        return f" {_COMPARISONS[sign]} "
    return sign


def _roman_value(numeral: str) -> int:
    """The value of a valid Roman numeral: a digit before a larger one is subtracted ("IX": 9)."""
    values = [_ROMAN_DIGITS[letter] for letter in numeral]
    return sum(-value if value < following else value for value, following in zip(values, [*values[1:], 0]))


def _roman(match: re.Match) -> str:
    """ "World War II" -> "World War two", "Henry VIII" -> "Henry the eighth". A single letter only after a
    numbered noun and not before a lower-case word ("Part I."; "Part I think", "Then I", "Appendix C" stay),
    and a monarch's numeral only of I, V and X after a regnal name (regnal numbers stay under 40; "John
    Smith MD" is no king)."""
    word, numeral = match.groups()
    value = _roman_value(numeral)
    goes_on = re.match(r"\s+[a-z]", match.string[match.end() :])  # "Part I think": the pronoun
    if word in _NUMBERED_NOUNS and (len(numeral) > 1 or (numeral in "IVX" and not goes_on)):
        return f"{word} {_words(value)}"
    if word in _REGNAL_NAMES and set(numeral) <= set("IVX") and (len(numeral) > 1 or not goes_on):
        return f"{word} the {_words(value, to='ordinal')}"
    return match.group(0)


def _decade(match: re.Match) -> str:
    century, decade = match.group(1), match.group(2)
    words = _words(century + decade, to="year") if century else _words(decade)
    last = words.split()[-1]
    plural = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return " ".join(words.split()[:-1] + [plural])


def _time(match: re.Match) -> str:
    """5:30 pm, 7:00, 9am. The period of "a.m." that also ends the sentence is kept as its end."""
    hours, minutes, meridiem = int(match.group(1)), int(match.group(2) or 0), match.group(3) or match.group(4)
    if match.group(2) is None and hours > 12:
        return match.group(0)
    words = _words(hours)
    if minutes == 0:
        words += " o'clock" if not meridiem else ""
    elif minutes < 10:
        words += " oh " + _words(minutes)
    else:
        words += " " + _words(minutes)
    if meridiem:
        words += " a m" if meridiem.lower() == "a" else " p m"
    rest = match.string[match.end() :]
    if match.group(0).endswith(".") and (not rest.strip() or re.match(r"\s+[A-Z]", rest)):
        words += "."
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


def normalize_text(text: str, *, warn: bool = True, dropped: list[str] | None = None, remember: bool = True) -> str:
    """Return ``text`` as plain spoken English words with pause punctuation. Characters with no spoken form
    are left out: appended to ``dropped`` when a list is given (the server names them in a header), else
    warned of (:class:`UnknownCharacterWarning`) if ``warn``. ``remember``: keep the result for the next
    caller of the same text (a sentence's later steps); False for texts read once (a sentence's prefixes).

    >>> normalize_text("Dr. Smith paid $5.50 on May 3rd.")
    'doctor Smith paid five dollars and fifty cents on May third.'
    """
    spoken, unspoken = (_spoken if remember else _spoken.__wrapped__)(text)
    if dropped is not None:
        dropped += unspoken
    elif unspoken and warn:
        # In the order they came, so a reader finds them in the text.
        warn_caller(
            f"dropped characters with no spoken form: {''.join(dict.fromkeys(unspoken))!r}", UnknownCharacterWarning
        )
    return spoken


# A sentence is read by several steps of one request (the characters it drops, its phonemes, its words'
# timestamps): each takes the same normalized text from here instead of normalizing it again.
@functools.lru_cache(maxsize=256)
def _spoken(text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` normalized (:func:`normalize_text`), and the characters with no spoken form it left out."""
    # Grouped thousands before NFKC, which makes their thin and no-break spaces plain ones.
    text = _spaced_thousands_re.sub(
        lambda m: re.sub(r"\D", "", m.group(0)) if _is_one_number(m.group(0)) else m.group(0), text
    )
    text = _minus_sign_re.sub("-", text)
    # Before NFKC, which writes "2½" as "21⁄2": the whole number is kept apart ("2 1⁄2").
    text = _vulgar_fraction_re.sub(lambda m: " " + unicodedata.normalize("NFKC", m.group(0)), text)
    text = _number_dash_re.sub("-", unicodedata.normalize("NFKC", text)).translate(_PAUSE_DASHES)
    text = text.replace(" - ", ", ")
    # Before addresses, which would leave "<https://...>" as "< ... >" signs; "=" in a query is left alone.
    text = _comparison_re.sub(_comparison, text)
    # Addresses first: they hold dots, slashes and digits that the rules below would read apart.
    text = _url_re.sub(_url, text)
    text = _email_re.sub(_email, text)
    text = _iso_date_re.sub(_iso_date, text)
    text = _slash_date_re.sub(_slash_date, text)
    text = _international_phone_re.sub(_international_phone, text)
    text = _phone_re.sub(_phone, text)
    text = _month_day_re.sub(_month_day, text)
    text = _month_abbrev_re.sub(lambda m: _MONTH_ABBREVIATIONS[m.group(1).lower()] + " ", text)
    text = _abbrev_re.sub(_expand_abbreviation, text)
    text = _number_abbrev_re.sub("number", text)
    text = _st_re.sub(_saint_or_street, text)
    text = _roman_re.sub(_roman, text)
    # Spaces around ".NET": its period would otherwise join it to the word before ("F# .NET": "F.NET").
    text = _dot_net_re.sub(" dot net ", text)
    text = _sharp_re.sub(r"\1 sharp", text)
    text = _plus_plus_re.sub(r"\1 plus plus", text)
    # The sign before the amount rules: "-$20" and "-3.5%" would lose it once read as words.
    text = _percent_range_re.sub(" to ", text)
    text = _negative_re.sub("minus ", text)
    text = _leading_point_re.sub("0.", text)  # before the amounts, units and percentages read the digits
    text = _fraction_slash_re.sub(_fraction_slash, text)  # before units would read its denominator
    text = _currency_re.sub(_currency, text)
    text = _number_sign_re.sub("number ", text)
    text = _percent_re.sub(lambda m: _decimal_or_cardinal(m.group(1)) + " percent", text)
    text = _ratio_re.sub(_ratio, text)
    text = _time_re.sub(_time, text)
    text = _dotted_re.sub(_dotted, text)
    text = _per_unit_re.sub(_unit, text)
    text = _unit_re.sub(_unit, text)
    text = _by_re.sub(lambda m: f"{m.group(1)} by {m.group(2)}", text)
    text = _times_re.sub(lambda m: _decimal_or_cardinal(m.group(1)) + " times", text)
    text = _range_re.sub(" to ", text)
    text = _mixed_fraction_re.sub(_mixed_fraction, text)
    text = _fraction_re.sub(_fraction, text)
    text = _decade_re.sub(_decade, text)
    text = _ordinal_re.sub(lambda m: _words(m.group(1), to="ordinal"), text)
    text = _decimal_re.sub(lambda m: _decimal_or_cardinal(m.group(0)), text)
    text = _early_year_re.sub(lambda m: m.group(1) + _words(m.group(2), to="year"), text)
    # Spaces around the words part "MP3" into "MP three"; runs of spaces are collapsed at the end.
    text = _number_re.sub(lambda m: f" {_number(m)} ", text)
    text = text.replace("&", " and ").replace("-", " ").replace('"', " ")
    kept, unspoken = [], []
    for char in unicodedata.normalize("NFC", text):
        if _ALLOWED.match(char) or char.isspace() or _is_latin_letter(char):
            kept.append(char)
        elif unicodedata.combining(char):
            continue  # a mark left over after composing ("e" + three acute accents)
        else:
            kept.append(" ")
            unspoken.append(char)
    # Runs of spaces collapsed first: "\s+" before a stop, tried at each space of a long run (a character with no
    # spoken form is a space; NFKC writes "ﷺ" as 18), took 51 s for 4,096 of them (a probe).
    text = _whitespace_re.sub(" ", "".join(kept))
    text = re.sub(r" ([,;:.!?])", r"\1", text)
    return text.strip(), tuple(unspoken)


def _is_latin_letter(char: str) -> bool:
    """A Latin letter with or without accents ("é", "ñ", "ø", "ß"); espeak-ng reads them."""
    return char.isalpha() and unicodedata.name(char, "").startswith("LATIN ")


def _is_one_number(digits: str) -> bool:
    """Whether digit groups with spaces between are one number: with thin or no-break spaces (typographic
    grouping) always; with plain spaces only where a later group is "000" ("1 000 000", "10 000"), so that
    "Rooms 101 102 103" and "912 345 678" stay apart."""
    groups = re.split(r"[ \u00a0\u2009\u202f]", digits)
    return any(space in digits for space in "\u00a0\u2009\u202f") or "000" in groups[1:]


def grouped_numbers(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds numbers grouped by spaces that are read as one ("1 000 000"): (start, end) each."""
    return [m.span() for m in _spaced_thousands_re.finditer(text) if _is_one_number(m.group(0))]


def address_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds a web address or an e-mail address (start, end): read whole, as one word each."""
    return [m.span() for pattern in (_url_re, _email_re) for m in pattern.finditer(text)]


def spoken_cardinal(number: str) -> str:
    """``"-1234.5"`` as a cardinal ("minus one thousand two hundred and thirty four point five"), never a year;
    longer than anyone reads as a number, digit by digit (as :func:`normalize_text` reads such runs)."""
    sign = "minus " if number.startswith("-") else ""
    return sign + _decimal_or_cardinal(number.lstrip("-"))


def _decimal_or_cardinal(text: str) -> str:
    text = text.replace(",", "")
    if "." in text:
        whole, frac = text.split(".", 1)
        return f"{_words(whole)} point {' '.join(_words(int(d)) for d in frac)}"
    return _words(text)


class UnknownCharacterWarning(UserWarning):
    """Raised (as a warning) when input characters are dropped because they have no spoken form."""
