"""Request and response bodies of the HTTP API as pydantic models: the OpenAPI page (``/docs``) shows
them, and the server builds its JSON answers from them.

A speech body is checked by :func:`parse_speech` rather than by FastAPI's validation, so that each
refusal names its field with OpenAI's words and codes (``input_too_long``, ...), exactly as before.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from chorus.serving.errors import ApiError

CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
MIN_SPEED, MAX_SPEED = 0.25, 4.0


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``, as OpenAI's ``audio.speech``."""

    model: str = Field("chorus", max_length=200, description="any name is accepted, e.g. 'chorus' or 'tts-1'")
    input: str = Field(..., min_length=1, description="the text to speak")
    voice: str = Field(
        ...,
        min_length=1,
        description='a speaker name or one of your voice ids (OpenAI\'s {"id": ...} form is accepted too)',
    )
    response_format: Literal["wav", "pcm", "flac"] = Field(
        "wav",
        description="pcm: 16-bit little-endian mono at X-Sample-Rate; several sentences stream (chunked), "
        "except flac, sent whole",
    )
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    stream_format: Literal["audio"] = Field("audio", description="no server-sent events")


def parse_speech(body: object, max_text_chars: int) -> SpeechRequest:
    """Validate an OpenAI ``audio.speech`` body; raises :class:`ApiError` (400) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model", "chorus")
    if not isinstance(model, str) or len(model) > 200:
        raise ApiError(400, "'model' must be a string (any name is accepted, e.g. 'chorus')", param="model")
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
    response_format = body.get("response_format", "wav")
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
    if stream_format != "audio":
        raise ApiError(400, "only stream_format 'audio' is supported (no server-sent events)", param="stream_format")
    return SpeechRequest(
        model=model,
        input=text,
        voice=voice,
        response_format=response_format,
        speed=float(speed),
        stream_format=stream_format,
    )


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


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BaseVoice | CustomVoice]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["voice.deleted"] = "voice.deleted"
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
