"""Onboarding jobs: ``GET /v1/jobs/{id}``, ``POST /v1/jobs/{id}/cancel`` and the 202 of ``POST /v1/voices``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


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
    """The answer to an upload (202): the job, and what the upload held: the clips kept, their seconds, and
    each clip left out as ``"name: why"`` (unreadable, too short or long, silent, no speech heard)."""

    clips: int
    seconds: float
    left_out: list[str] = []
