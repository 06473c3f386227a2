"""OpenAI's custom voices: consent recordings (``/v1/audio/voice_consents``) and voices from one sample
(``/v1/audio/voices``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
    done or failed, with ``refinement_error``). Chorus's other voices (``type`` "custom": clips uploaded to
    ``POST /v1/voices``, a voice folder added by the operator) have no consent recording and no instant
    voice: their stage is training, adapted or failed, as in ``GET /v1/voices/{id}``."""

    object: Literal["audio.voice"] = "audio.voice"
    id: str
    name: str
    created_at: int
    type: Literal["audio_sample", "custom"] = "audio_sample"
    consent: str | None
    stage: Literal["instant", "adapted", "training", "failed"]
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
