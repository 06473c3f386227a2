"""Piper's HTTP API: ``POST /``, as ``python -m piper.http_server`` answers it, so a client written for a Piper
server speaks through Chorus unchanged.

The body is JSON ``{"text", "voice", "speaker", "speaker_id", "length_scale", "noise_scale",
"noise_w_scale"}`` (piper1-gpl's fields; only ``text`` is required), or the text itself as ``text/plain``
(the older rhasspy/piper server's; its ``GET /?text=`` form is not taken: ``GET /`` is the web page). The answer is one whole WAV at the model's rate, with its true sizes, as
Piper's is. ``voice`` or ``speaker`` name what OpenAI's route calls ``voice`` (a speaker, a blend, one of the
tenant's voices); ``speaker_id`` is a base speaker by index; ``length_scale`` is 1 / speed. The request goes
through the speech route's own checks and synthesis (:func:`~chorus.serving.routes.speech.check_speech`),
so the same text and voice give the same samples from both routes. The server's noise is the voice's own:
``noise_scale`` and ``noise_w_scale`` are named in ``X-Options-Ignored``, not followed.
"""

from __future__ import annotations

import codecs
from email.message import Message

from fastapi import APIRouter, Request

from chorus.serving.errors import ApiError
from chorus.serving.json_body import BodyError, loads_bounded
from chorus.serving.routes.deps import ERRORS, Server, Tenant, content_type, read_body
from chorus.serving.routes.speech import check_speech, spoken
from chorus.serving.schemas.speech import MAX_SPEED, MIN_SPEED, parse_speech

router = APIRouter()

FIELDS = ("text", "voice", "speaker", "speaker_id", "length_scale", "noise_scale", "noise_w_scale")
IGNORED = ("noise_scale", "noise_w_scale")  # the voice's own noise is used
# The charsets a text/plain body may name (codecs' names): Unicode's and the single-byte Latin ones.
TEXT_ENCODINGS = frozenset(
    {"utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "ascii"}
    | {"iso8859-1", "iso8859-15", "cp1252"}
)
_BYTE_ORDER_MARKS = {
    "utf-16": (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE),
    "utf-32": (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE),
}


@router.post(
    "/",
    summary="Piper's HTTP API: text in, one WAV out",
    responses={200: {"content": {"audio/wav": {}}}, **ERRORS},
)
async def piper_speech(request: Request, tenant: Tenant, server: Server):
    settings = server.settings
    fields = await _piper_fields(request, settings.max_json_bytes)
    text = fields.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "'text' is required: the text to speak, as a string", param="text")
    voice = _voice(fields, server.engine.speakers, server.engine.default_speaker)
    asked = {"input": text, "voice": voice, "response_format": "wav", "speed": _speed(fields.get("length_scale"))}
    try:
        body = parse_speech(asked | {"stream": False}, settings.max_text_chars)
        answer = await spoken(request, server, await check_speech(body, tenant, server))
    except ApiError as error:
        named = "speaker" if fields.get("speaker") is not None and fields.get("speaker_id") is None else "voice"
        raise _in_piper_words(error, named) from None
    # Piper's own precedence: speaker_id over speaker; the voice's own noise over the request's.
    overridden = ["speaker"] if fields.get("speaker_id") is not None and fields.get("speaker") is not None else []
    ignored = overridden + [name for name in IGNORED if fields.get(name) is not None]
    if ignored:
        answer.headers["X-Options-Ignored"] = ", ".join(ignored)
    return answer


def _in_piper_words(error: ApiError, voice_field: str = "voice") -> ApiError:
    """The speech route's refusal, naming this route's fields: its 'input' is Piper's 'text', its 'voice' the
    field the request named who speaks in (``voice_field``: 'speaker' or 'voice')."""
    if error.param == "input":
        error.param = "text"
        error.message = error.message.replace("'input'", "'text'")
    elif error.param == "voice":
        error.param = voice_field
    return error


async def _piper_fields(request: Request, limit: int) -> dict:
    """The body's fields: a JSON object's (unknown fields refused by name), or ``{"text": ...}`` for text."""
    kind = content_type(request)
    body = await read_body(request, limit)
    if kind in ("text/plain", ""):
        charset = _charset(request)
        try:
            return {"text": _decoded(body, charset)}
        except UnicodeError:  # a decoding error, or a codec that refuses its input in its own way (idna)
            raise ApiError(400, f"the text is not {charset}", param="text") from None
    if kind != "application/json":
        raise ApiError(415, f"expected Content-Type application/json or text/plain, got {kind[:60]!r}")
    try:
        fields = loads_bounded(body)
    except BodyError as error:
        raise ApiError(400, str(error)) from None
    if not isinstance(fields, dict):
        raise ApiError(400, "the request body must be a JSON object with a 'text'")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(map(repr, unknown))}: Piper's are {', '.join(FIELDS)}")
    return fields


def _charset(request: Request) -> str:
    """The text encoding a ``text/plain`` body says it is in (its ``charset``, read as email reads a header's
    parameters: quoting kept apart), UTF-8 where it names none, a UTF-8 byte order mark dropped; 415 for one that
    is no text encoding Chorus takes."""
    header = Message()
    header["content-type"] = request.headers.get("content-type", "text/plain")
    given = header.get_content_charset() or "utf-8"
    try:
        name = codecs.lookup(given).name
    except LookupError:
        name = ""
    if name not in TEXT_ENCODINGS:
        raise ApiError(415, f"charset {given[:40]!r} is not one this server reads: send UTF-8", param="text")
    return "utf-8-sig" if name == "utf-8" else name


def _decoded(body: bytes, charset: str) -> str:
    """``body`` as text in ``charset``. UTF-16 or UTF-32 without a byte order mark is big-endian (RFC 2781
    4.3); Python's codecs would read it in this machine's order, little-endian here."""
    if charset in _BYTE_ORDER_MARKS and not body.startswith(_BYTE_ORDER_MARKS[charset]):
        charset += "-be"
    return body.decode(charset)


def _speed(length_scale: object) -> float:
    """Piper's ``length_scale`` (durations times it) as the speech route's speed."""
    if length_scale is None:
        return 1.0
    low, high = 1 / MAX_SPEED, 1 / MIN_SPEED
    if isinstance(length_scale, bool) or not isinstance(length_scale, int | float) or not low <= length_scale <= high:
        raise ApiError(400, f"'length_scale' must be a number from {low:g} to {high:g}", param="length_scale")
    return 1 / length_scale


def _voice(fields: dict, speakers: list[str], default: str) -> str:
    """Who speaks: ``speaker_id`` (a base speaker by index) over ``speaker`` over ``voice``, else the
    base's default speaker."""
    index = fields.get("speaker_id")
    if fields.get("voice") is not None and (index is not None or fields.get("speaker") is not None):
        # In Piper, "voice" is a model and "speaker" one of its speakers; here both name who speaks.
        raise ApiError(400, "give 'voice' (a speaker or one of your voices) or 'speaker' / 'speaker_id', not both")
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(speakers):
            raise ApiError(
                400, f"'speaker_id' must be a whole number from 0 to {len(speakers) - 1}", param="speaker_id"
            )
        return speakers[index]
    for name in ("speaker", "voice"):
        value = fields.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise ApiError(400, f"'{name}' must be a string: a speaker or one of your voices", param=name)
            return value
    return default
