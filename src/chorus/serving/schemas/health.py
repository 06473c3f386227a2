"""``GET /healthz``: liveness for anyone, the details for the operator."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


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
