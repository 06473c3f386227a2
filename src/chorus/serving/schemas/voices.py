"""Voices: what ``voice`` takes (``GET /v1/audio/voices``) and the tenant's voices (``/v1/voices``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
    this_base: bool = Field(
        True,
        description="whether it speaks on this server's base: false for a voice adapted on another base (a server "
        "started with that base speaks it; here speech with it is a 409 voice_of_another_base)",
    )
    card: dict | None = Field(
        None,
        description="GET /v1/voices/{id} only, for a ready voice: how it was made and its scores "
        "(data minutes, steps, held-out loss, similarity to its own clips, automatic transcripts)",
    )


class VoiceName(BaseModel):
    id: str
    kind: Literal["base", "alias", "custom"]
    name: str | None = Field(None, description="a custom voice's display name (GET /v1/voices has its whole record)")
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
    """The base's speakers, then the tenant's voices by id; with ``limit``, one page of them and OpenAI's list
    cursor fields (``after``: the ``last_id`` of the page before)."""

    object: Literal["list"] = "list"
    data: list[BaseVoice | CustomVoice]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["voice.deleted"] = "voice.deleted"
    deleted: Literal[True] = True
