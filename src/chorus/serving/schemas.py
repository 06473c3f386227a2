"""Request and response bodies of the HTTP API as pydantic models: the OpenAPI page (``/docs``) shows
them, and the server builds its JSON answers from them.

A speech body is checked by :func:`parse_speech` rather than by FastAPI's validation, so that each
refusal names its field with OpenAI's words and codes (``input_too_long``, ...), exactly as before.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from chorus.audio.encode import FORMATS
from chorus.serving.errors import ApiError

CONTENT_TYPES = {name: audio_format.content_type for name, audio_format in FORMATS.items()}
MIN_SPEED, MAX_SPEED = 0.25, 4.0
PCM_RATE = 24_000  # OpenAI's raw pcm is 24 kHz, and its clients play it so
MIN_RATE, MAX_RATE = 8_000, 48_000
DEFAULT_FORMAT = "mp3"  # OpenAI's: its clients write what comes back without a format into "speech.mp3"
# Every name is the same base model; they are OpenAI's speech models, so that clients with a fixed model
# picker work. Any other name is refused as OpenAI refuses it (404 model_not_found), never spoken.
MODEL_NAMES = ("chorus", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# What ``instructions`` can ask of this model: its speaking rate. The rest (tone, emotion, accent) is
# ignored and said so in a header, as code written for gpt-4o-mini-tts expects to be spoken, not refused.
_PACE_WORDS = re.compile(
    r"\b(?P<very>very\s+|really\s+|a bit\s+|a little\s+|slightly\s+)?"
    r"(?P<pace>slowly|slower|slow|quickly|quicker|quick|faster|fast|rapidly)\b",
    re.IGNORECASE,
)
_PACE = {"slow": 0.8, "quick": 1.25, "fast": 1.25, "rapid": 1.25}
# Clauses of an instruction: "Speak slowly and calmly." is "Speak slowly" + "calmly".
_CLAUSES = re.compile(r"[.,;:!?\n]+|\s+(?:and|but|then|while)\s+", re.IGNORECASE)
# Words that ask for nothing by themselves ("please speak", "read it").
_FILLER = re.compile(r"^(?:(?:please|speak|talk|read|say|it|this|the|text|voice|in|a|an|with)\s*)*$", re.IGNORECASE)


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``, as OpenAI's ``audio.speech``."""

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
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    instructions: str | None = Field(
        None,
        max_length=4096,
        description="the speaking rate is understood ('speak slowly', 'quickly', 'very fast') and scales speed; "
        "anything else (tone, emotion, accent) is ignored and named in the X-Instructions-Ignored header",
    )
    stream_format: Literal["audio", "sse"] = Field(
        "audio",
        description="audio: the file's bytes; sse: server-sent events speech.audio.delta (base64 audio of "
        "response_format) and speech.audio.done, as OpenAI's",
    )
    sample_rate: int | None = Field(
        None,
        ge=MIN_RATE,
        le=MAX_RATE,
        description="Chorus extension: output rate in Hz (default: the model's, 24 kHz for pcm); sent as X-Sample-Rate",
    )


def parse_speech(body: object, max_text_chars: int) -> SpeechRequest:
    """Validate an OpenAI ``audio.speech`` body; raises :class:`ApiError` (400) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model", "chorus")
    if not isinstance(model, str) or len(model) > 200:
        raise ApiError(400, f"'model' must be a string, one of {', '.join(MODEL_NAMES)}", param="model")
    if model not in MODEL_NAMES:
        raise ApiError(
            404,
            f"The model {model[:80]!r} does not exist: use one of {', '.join(MODEL_NAMES)} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    text = body.get("input")
    if not isinstance(text, str):
        raise ApiError(400, "'input' is required: the text to speak, as a string", param="input")
    if not text.strip():
        raise ApiError(400, "'input' is empty", param="input")
    if len(text) > max_text_chars:
        raise ApiError(
            400,
            f"'input' is {len(text)} characters; at most {max_text_chars} per request",
            param="input",
            code="input_too_long",
        )
    voice = body.get("voice")
    if isinstance(voice, dict):  # OpenAI's custom voice reference {"id": ...}
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise ApiError(400, "'voice' is required: a speaker name or one of your voice ids", param="voice")
    response_format = body.get("response_format", DEFAULT_FORMAT)
    if not isinstance(response_format, str) or response_format not in CONTENT_TYPES:
        shown = response_format if isinstance(response_format, str) else type(response_format).__name__
        raise ApiError(
            400,
            f"unsupported response_format {str(shown)[:40]!r}: use one of {', '.join(CONTENT_TYPES)}",
            param="response_format",
        )
    speed = body.get("speed", 1.0)
    if (
        isinstance(speed, bool)
        or not isinstance(speed, (int, float))
        or not math.isfinite(speed)
        or not MIN_SPEED <= speed <= MAX_SPEED
    ):
        raise ApiError(400, f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}", param="speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise ApiError(400, "stream_format must be 'audio' or 'sse'", param="stream_format")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string", param="instructions")
    if instructions and instructions.strip():
        speed = float(speed) * read_instructions(instructions).pace
        speed = min(MAX_SPEED, max(MIN_SPEED, speed))
    rate = body.get("sample_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE):
        raise ApiError(
            400, f"'sample_rate' must be a whole number of Hz from {MIN_RATE} to {MAX_RATE}", param="sample_rate"
        )
    return SpeechRequest(
        model=model,
        input=text,
        voice=voice,
        response_format=response_format,
        speed=float(speed),
        instructions=instructions,
        stream_format=stream_format,
        sample_rate=rate,
    )


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
    pace = 1.0
    ignored = []
    for clause in _CLAUSES.split(instructions):
        found = list(_PACE_WORDS.finditer(clause))
        for match in found:
            factor = next(f for stem, f in _PACE.items() if match["pace"].lower().startswith(stem))
            degree = (match["very"] or "").split()
            pace *= factor**2 if degree[:1] in (["very"], ["really"]) else factor**0.5 if degree else factor
        rest = _PACE_WORDS.sub(" ", clause).strip()
        if rest and not _FILLER.match(rest):
            ignored.append(" ".join(rest.split()))
    return Instructions(pace=pace, ignored=tuple(ignored))


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every refusal, as OpenAI's."""

    error: ErrorDetail


class BaseVoice(BaseModel):
    """A speaker: a voice the base model knows (``type`` "base"). The class name stays ``BaseVoice``
    because it names the OpenAPI schema clients see."""

    id: str
    object: Literal["voice"] = "voice"
    type: Literal["base"] = "base"
    name: str
    status: Literal["ready"] = "ready"
    default: bool
    resident: Literal[True] = True


class CustomVoice(BaseModel):
    """An adapted voice of the tenant; ``resident``: loaded in the model now."""

    id: str
    object: Literal["voice"] = "voice"
    type: Literal["custom"] = "custom"
    name: str
    status: str
    created: int
    updated: int
    method: str | None
    size_bytes: int | None
    job_id: str | None
    error: str | None
    resident: bool
    stage: Literal["adapted", "instant", "training", "failed"] = Field(
        ...,
        description="adapted: its own trained voice; instant: a voice from one sample, speaking as its instant "
        "voice (see audio.voice's instant) while it is refined, or after its refinement "
        "failed (error says why); training / failed: an upload of clips, not speaking yet / not at all",
    )
    instant: str | None = Field(None, description="the base speaker or blend an instant voice speaks as")
    card: dict | None = Field(
        None,
        description="GET /v1/voices/{id} only, for a ready voice: how it was made and its scores "
        "(data minutes, steps, held-out loss, similarity to its own clips, automatic transcripts)",
    )


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


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(BaseModel):
    """``GET /v1/models``, as OpenAI's: the names ``/v1/audio/speech`` accepts."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceName(BaseModel):
    id: str
    kind: Literal["base", "alias", "custom"]
    stage: Literal["adapted", "instant"] | None = Field(
        None,
        description="a custom voice's: adapted (its own trained voice) or instant (a voice from one sample, "
        "speaking as its instant voice while it is refined or after its refinement failed: "
        "GET /v1/audio/voices/{id} gives the refinement's state)",
    )


class AudioVoices(BaseModel):
    """``GET /v1/audio/voices``: every name ``voice`` takes (``voices``, the shape voice pickers read),
    each with its kind, and what every alias speaks as."""

    object: Literal["list"] = "list"
    voices: list[str]
    data: list[VoiceName]
    aliases: dict[str, str]


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BaseVoice | CustomVoice]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["voice.deleted"] = "voice.deleted"
    deleted: Literal[True] = True


class VoiceConsent(BaseModel):
    """OpenAI's ``audio.voice_consent``: a consent recording, checked (it reads the server's phrase)."""

    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    id: str
    name: str
    language: str
    created_at: int


class ConsentPhrases(BaseModel):
    """``GET /v1/audio/voice_consents/phrases`` (Chorus's): the phrase a consent recording must read, per
    language (primary BCP 47 subtag: ``en``), and the bounds of a sample for ``POST /v1/audio/voices``."""

    object: Literal["audio.voice_consent.phrases"] = "audio.voice_consent.phrases"
    phrases: dict[str, str]
    min_sample_seconds: float
    max_file_bytes: int


class VoiceConsentList(BaseModel):
    """``GET /v1/audio/voice_consents``: oldest first, ``limit`` at a time, ``after`` an id."""

    object: Literal["list"] = "list"
    data: list[VoiceConsent]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VoiceConsentDeleted(BaseModel):
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    deleted: Literal[True] = True


class AudioVoice(BaseModel):
    """OpenAI's ``audio.voice``: a custom voice made from a sample (``type`` "audio_sample"), with Chorus's
    ``stage`` (instant, then adapted) and ``refinement`` (the background adaptation: queued, running,
    done or failed, with ``refinement_error``)."""

    object: Literal["audio.voice"] = "audio.voice"
    id: str
    name: str
    created_at: int
    type: Literal["audio_sample"] = "audio_sample"
    consent: str | None
    stage: Literal["instant", "adapted"]
    instant: str | None = Field(
        None,
        description="what it speaks as at stage instant: from its POST, a blend of the base speakers nearest "
        "the sample by Chorus's speaker encoder; once its refinement has transcribed the sample, the base "
        "speaker that fits the sample best by mel loss",
    )
    refinement: str | None
    refinement_error: str | None = None


class AudioVoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: Literal[True] = True


class Job(BaseModel):
    """An onboarding job: ``progress`` from 0 to 1 (training steps done of the recipe's at most)."""

    id: str
    object: Literal["voice.job"] = "voice.job"
    voice: str
    status: str
    progress: float
    message: str | None
    error: str | None
    created: int
    updated: int


class CreatedJob(Job):
    """The answer to an upload (202): the job, and what the upload held."""

    clips: int
    seconds: float


class Onboarding(BaseModel):
    queued: int
    running: bool


class Liveness(BaseModel):
    """``/healthz`` without the operator's key (when keys are configured): alive or not, nothing more.
    ``degraded``: serving, but the store cannot take writes."""

    status: Literal["ok", "starting", "degraded"]


class Health(BaseModel):
    status: Literal["ok", "starting", "degraded"]
    store_problem: str | None = None  # why the store cannot take writes, when degraded
    base_voices: int
    resident_voices: int
    resident_bytes: int
    tenancy: Literal["single", "keys"]
    onboarding: Onboarding
