"""``POST /v1/audio/speech`` and ``/v1/audio/speech/captioned``: the body, as OpenAI's ``audio.speech``, and
the captioned answer.

:class:`SpeechRequest`'s fields and validators state every constraint of the body; :func:`parse_speech`
runs them and turns the first failure into the refusal OpenAI's clients expect, naming its field with
OpenAI's words and codes (``model_not_found``, ``input_too_long``, ...). FastAPI does not validate the
body itself: its refusals would name no field the OpenAI way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from chorus.audio.encode import FORMATS, MAX_RATE, MIN_RATE
from chorus.serving.errors import ApiError
from chorus.serving.schemas.models import MODEL_NAMES, model_not_found
from chorus.text.sentences import MAX_SPEED, MIN_SPEED

CONTENT_TYPES = {name: audio_format.content_type for name, audio_format in FORMATS.items()}
PCM_RATE = 24_000  # OpenAI's raw pcm is 24 kHz, and its clients play it so
MAX_INSTRUCTIONS_CHARS = 4096
_REQUIRED = ("input", "voice")  # null there is refused as missing; any other field sent as null takes its default
DEFAULT_FORMAT = "mp3"  # OpenAI's: its clients write what comes back without a format into "speech.mp3"
# What ``instructions`` can ask of this model: its speaking rate. The rest (tone, emotion, accent) is
# ignored and said so in a header, as code written for gpt-4o-mini-tts expects to be spoken, not refused.
# A pace is a word ("slowly", "very fast", "slower than usual") or a factor ("twice as fast", "3x slower",
# "half speed", "20% faster"): a factor read as a word would be taken for "fast" and its number named as ignored.
_WAY = r"slowly|slower|slow|quickly|quicker|quick|faster|fast|rapidly"
_NUMBER = r"\d+(?:\.\d+)?"
_MULTIPLE = r"0*[1-9]\d*(?:[.,]\d+)?|0*[.,]\d*[1-9]\d*"  # a number, not zero ("0x slower" asks for no pace)
_PACE_WORDS = re.compile(
    r"\b(?:"
    # "twice as fast", "3x slower", "three times slower", "half as fast"; or of a speed: "double speed", "half the pace"
    r"(?P<times>twice|thrice|double|half|(?P<word>two|three|four|five|six|ten)\s+times"
    rf"|(?P<n>{_MULTIPLE})\s*(?:x|×|times))\s+"
    rf"(?:(?:as\s+)?(?P<way>{_WAY})(?:\s+as\s+(?:usual|normal|before))?|(?:the\s+)?(?:speed|pace|rate|tempo))"
    rf"|(?P<percent>{_NUMBER})\s*(?:%|percent|per\s+cent)\s*(?P<change>{_WAY})"  # "20% faster (than usual)"
    r"(?:\s+than\s+(?:usual|normal|normally|before))?"
    r"|(?P<very>very\s+|really\s+|a bit\s+|a little\s+|slightly\s+)?"
    rf"(?P<pace>{_WAY})(?:\s+than\s+(?:usual|normal|normally|before))?"  # "slower than usual" is "slower"
    r")\b",
    re.IGNORECASE,
)
_PACE = {"slow": 0.8, "quick": 1.25, "fast": 1.25, "rapid": 1.25}
_TIMES = {"twice": 2.0, "double": 2.0, "half": 0.5, "thrice": 3.0, "two": 2.0, "three": 3.0, "four": 4.0}
_TIMES |= {"five": 5.0, "six": 6.0, "ten": 10.0}  # past 4, as fast as it goes
# Clauses of an instruction: "Speak slowly and calmly." is "Speak slowly" + "calmly"; "1.5x speed" and "1,5x
# speed" (a decimal comma) are one.
_CLAUSES = re.compile(r"(?:[;:!?\n]|[.,](?!\d))+|\s+(?:and|but|then|while)\s+", re.IGNORECASE)
# Words that ask for nothing by themselves ("please speak", "read it").
_FILLER = re.compile(r"^(?:(?:please|speak|talk|read|say|it|this|the|text|voice|in|a|an|with|at)\s*)*$", re.IGNORECASE)
# A pace word after a negation in its clause ("Do not speak slowly", "You cannot speak quickly"): no request
# for that pace, and this model cannot follow "not slowly" any better than a tone: the whole clause is ignored.
# A negation after the pace word negates something else ("Speak slowly without pauses", "with no emotion").
_NEGATION = re.compile(r"\b(?:not|no|never|cannot|dont|avoid|without)\b|n't\b", re.IGNORECASE)


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``, as OpenAI's ``audio.speech``."""

    # (The docstring is the OpenAPI schema's description.) Strict: JSON's types as they are, no "1.0" for a
    # number, no true for 1, no 22050.5 for a rate. Validated with the context {"max_text_chars": n},
    # ``input`` is at most n characters.
    model_config = ConfigDict(strict=True)

    model: str = Field(
        "chorus", max_length=200, description="one of GET /v1/models ('chorus', 'tts-1', ...): the same base model"
    )
    input: str = Field(..., min_length=1, description="the text to speak")
    voice: str = Field(
        ...,
        min_length=1,
        description='a speaker name or one of your voice ids (OpenAI\'s {"id": ...} form is accepted too)',
    )
    response_format: Literal["wav", "flac", "mp3", "opus", "aac", "pcm"] = Field(
        DEFAULT_FORMAT,
        description="mp3 unless asked (OpenAI's default); pcm: 16-bit little-endian mono at X-Sample-Rate (24 kHz unless sample_rate says otherwise); "
        "opus in Ogg; several sentences stream (chunked) as each is made, except flac, sent whole",
    )
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    instructions: str | None = Field(
        None,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="the speaking rate is understood ('speak slowly', 'quickly', 'very fast', 'twice as fast', "
        "'half speed', '20% slower') and scales speed (within its bounds); "
        "anything else (tone, emotion, accent) is ignored and named in the X-Instructions-Ignored header",
    )
    stream_format: Literal["audio", "sse"] = Field(
        "audio",
        description="audio: the file's bytes; sse: server-sent events speech.audio.delta (base64 audio of "
        "response_format) and speech.audio.done, as OpenAI's",
    )
    stream: bool = Field(
        True,
        description="Chorus extension: false sends the file whole once it is made (a WAV then states its true "
        "length, with a Content-Length) instead of streaming several sentences as each is made",
    )
    sample_rate: int | None = Field(
        None,
        ge=MIN_RATE,
        le=MAX_RATE,
        description="Chorus extension: output rate in Hz (default: the model's, 24 kHz for pcm); sent as X-Sample-Rate",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, body: object) -> object:
        """An optional field sent as null takes its default, as when left out (clients that serialize unset
        options as null: JavaScript's, some SDKs' defaults)."""
        if isinstance(body, dict):
            return {k: v for k, v in body.items() if not (v is None and k in cls.model_fields and k not in _REQUIRED)}
        return body

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        if model not in MODEL_NAMES:
            raise PydanticCustomError("model_not_found", "no such model")
        return model

    @field_validator("input")
    @classmethod
    def _speakable_length(cls, text: str, info: ValidationInfo) -> str:
        if not text.strip():
            raise PydanticCustomError("input_empty", "only white space")
        limit = (info.context or {}).get("max_text_chars")
        if limit is not None and len(text) > limit:
            raise PydanticCustomError("input_too_long", "over {limit} characters", {"limit": limit})
        return text

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_reference(cls, voice: object) -> object:
        """OpenAI's custom voice reference ``{"id": ...}`` names the voice by its id; spaces around a name
        (a copied "nova ") are no part of it. Any other object stays one, to be refused as one (not as a
        voice left out)."""
        if isinstance(voice, dict) and isinstance(voice.get("id"), str):
            voice = voice["id"]
        return voice.strip() if isinstance(voice, str) else voice


def _shown(value: object) -> str:
    """A refused value as a message quotes it: a string's first 40 characters, else its type's name."""
    return repr((value if isinstance(value, str) else type(value).__name__)[:40])


def _json_type(value: object) -> str:
    """A value's type as JSON names it, for a refusal to say what was sent instead ("not an integer")."""
    if isinstance(value, bool):  # before int: True is an int to Python
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def _wrong_type(error: ErrorDetails) -> bool:
    """Whether a string field was sent as another type; null there (:data:`_REQUIRED`) is no value, as if left
    out, and is refused as missing."""
    return error["type"] == "string_type" and error["input"] is not None


def _model_refused(error: ErrorDetails) -> ApiError:
    if error["type"] == "model_not_found":  # as OpenAI answers an unknown model
        return model_not_found(error["input"])
    return ApiError(400, f"'model' must be a string, one of {', '.join(MODEL_NAMES)}", param="model")


def _input_refused(error: ErrorDetails) -> ApiError:
    if error["type"] in ("string_too_short", "input_empty"):
        return ApiError(400, "'input' is empty", param="input")
    if error["type"] == "input_too_long":
        return ApiError(
            400,
            f"'input' is {len(error['input'])} characters; at most {error['ctx']['limit']} per request",
            param="input",
            code="input_too_long",
        )
    if _wrong_type(error):
        return ApiError(
            400, f"'input' must be a string (the text to speak), not {_json_type(error['input'])}", param="input"
        )
    return ApiError(400, "'input' is required: the text to speak, as a string", param="input")


def _voice_refused(error: ErrorDetails) -> ApiError:
    if _wrong_type(error):
        return ApiError(
            400,
            "'voice' must be a string (a speaker name or one of your voice ids) or OpenAI's "
            f'{{"id": "..."}}, not {_json_type(error["input"])}',
            param="voice",
        )
    return ApiError(400, "'voice' is required: a speaker name or one of your voice ids", param="voice")


def _instructions_refused(error: ErrorDetails) -> ApiError:
    if error["type"] == "string_too_long":
        message = f"'instructions' is {len(error['input'])} characters; at most {MAX_INSTRUCTIONS_CHARS}"
    else:
        message = "'instructions' must be a string"
    return ApiError(400, message, param="instructions")


# Each field's refusal, given its failure (pydantic's ErrorDetails), in the order the fields are checked:
# a body failing on several fields is answered for the first of them ("": the body itself).
_REFUSALS: dict[str, Callable[[ErrorDetails], ApiError]] = {
    "": lambda _: ApiError(400, "the request body must be a JSON object"),
    "model": _model_refused,
    "input": _input_refused,
    "voice": _voice_refused,
    "response_format": lambda error: ApiError(
        400,
        f"unsupported response_format {_shown(error['input'])}: use one of {', '.join(CONTENT_TYPES)}",
        param="response_format",
    ),
    "speed": lambda _: ApiError(400, f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}", param="speed"),
    "stream_format": lambda _: ApiError(400, "stream_format must be 'audio' or 'sse'", param="stream_format"),
    "stream": lambda _: ApiError(400, "'stream' must be true or false", param="stream"),
    "instructions": _instructions_refused,
    "sample_rate": lambda _: ApiError(
        400, f"'sample_rate' must be a whole number of Hz from {MIN_RATE} to {MAX_RATE}", param="sample_rate"
    ),
}
_ORDER = list(_REFUSALS)


def _field(error: ErrorDetails) -> str:
    return str(error["loc"][0]) if error["loc"] else ""


def _refusal(error: ValidationError) -> ApiError:
    """The answer to a body :class:`SpeechRequest` refused: its first failing field's (:data:`_REFUSALS`)."""
    first = min(error.errors(), key=lambda e: _ORDER.index(_field(e)))
    return _REFUSALS[_field(first)](first)


def parse_speech(body: object, max_text_chars: int) -> SpeechRequest:
    """An OpenAI ``audio.speech`` body as a :class:`SpeechRequest`, its ``speed`` scaled by the pace its
    ``instructions`` ask for (within the speed's bounds); raises :class:`ApiError` (400, or 404 for an
    unknown model) naming the field."""
    try:
        request = SpeechRequest.model_validate(body, context={"max_text_chars": max_text_chars})
    except ValidationError as error:
        raise _refusal(error) from None
    if request.stream_format == "sse" and not request.stream:
        raise ApiError(400, "stream_format 'sse' is a stream: leave out 'stream': false", param="stream")
    if request.instructions and request.instructions.strip():
        speed = request.speed * read_instructions(request.instructions).pace
        request = request.model_copy(update={"speed": min(MAX_SPEED, max(MIN_SPEED, speed))})
    return request


@dataclass(frozen=True)
class Instructions:
    """What this model does with ``instructions``: ``pace`` scales the speed; ``ignored`` lists the clauses
    it cannot follow (tone, emotion, accent), in the order written."""

    pace: float = 1.0
    ignored: tuple[str, ...] = ()


def read_instructions(instructions: str) -> Instructions:
    """The speaking rate ``instructions`` ask for, and the clauses this model cannot follow.

    >>> read_instructions("Speak slowly and calmly.")
    Instructions(pace=0.8, ignored=('calmly',))
    """
    factors: list[float] = []  # each pace asked for
    # In the order written: (a clause that asks a pace, or None; what of a clause this model cannot follow; the
    # word that joined it to the one before, or None after punctuation).
    clauses: list[tuple[str | None, str, str | None]] = []
    text = instructions.replace("\u2019", "'")  # a phone keyboard's "don’t" is "don't"
    start, joined_by = 0, None
    for separator in [*_CLAUSES.finditer(text), None]:
        clause = text[start : separator.start() if separator else len(text)]
        said = " ".join(clause.split())
        matches = list(_PACE_WORDS.finditer(clause))
        if matches and _NEGATION.search(clause, 0, matches[-1].start()):
            clauses.append((None, said, joined_by))
        else:
            asked = [_factor(match) for match in matches]
            factors += asked
            rest = " ".join(_PACE_WORDS.sub(" ", clause).split())
            clauses.append((said if asked else None, "" if not rest or _FILLER.match(rest) else rest, joined_by))
        if separator is not None:
            start, joined_by = separator.end(), separator.group().strip().lower() or None
            joined_by = joined_by if joined_by and joined_by.isalpha() else None
    if any(f < 1 for f in factors) and any(f > 1 for f in factors):
        # "Speak slowly, then quickly": one request is spoken at one pace, so neither is taken, and both named.
        return Instructions(ignored=_rejoined(clauses, paces_too=True))
    return Instructions(pace=math.prod(factors, start=1.0), ignored=_rejoined(clauses))


def _rejoined(clauses: list[tuple[str | None, str, str | None]], paces_too: bool = False) -> tuple[str, ...]:
    """The clauses not followed (with ``paces_too``, the clauses that asked a pace as well, whole), those a word
    joined kept together as written: "a cheerful and positive tone" is one (it had been named "a cheerful;
    positive tone")."""
    ignored: list[str] = []
    previous_kept = False
    for paced, rest, joined_by in clauses:
        said = paced if paces_too and paced else rest
        if said and previous_kept and paced is None and joined_by:
            ignored[-1] = f"{ignored[-1]} {joined_by} {said}"
        elif said:
            ignored.append(said)
        previous_kept = bool(said) and paced is None
    return tuple(ignored)


def _factor(match: re.Match) -> float:
    """The speed a pace phrase asks for ("slowly" 0.8, "very fast" 1.25 squared, "a bit faster" its root,
    "twice as fast" or "double speed" 2, "half speed" or "twice as slow" 0.5, "20% slower" 0.8), within the
    bounds of ``speed`` ("10x faster" is as fast as it goes: 4)."""
    if match["times"]:
        times = _TIMES.get((match["word"] or match["times"]).lower()) or float(match["n"].replace(",", "."))
        factor = times if match["way"] is None or _word_pace(match["way"]) > 1 else 1 / times
    elif match["percent"]:
        change = float(match["percent"]) / 100
        factor = 1 + change if _word_pace(match["change"]) > 1 else 1 - change
    else:
        factor = _word_pace(match["pace"])
        degree = (match["very"] or "").split()
        factor = factor**2 if degree[:1] in (["very"], ["really"]) else factor**0.5 if degree else factor
    return min(MAX_SPEED, max(MIN_SPEED, factor))


def _word_pace(word: str) -> float:
    """The speed a pace word asks for: "slowly" 0.8, "faster" 1.25."""
    return next(f for stem, f in _PACE.items() if word.lower().startswith(stem))


class Timing(BaseModel):
    text: str
    start: float = Field(..., description="seconds from the start of the audio")
    end: float


class CaptionedSpeech(BaseModel):
    """``POST /v1/audio/speech/captioned``: the audio and its word and phoneme timestamps."""

    audio: str = Field(..., description="the audio file (response_format), base64")
    response_format: str
    sample_rate: int
    duration: float
    words: list[Timing]
    phonemes: list[Timing]
