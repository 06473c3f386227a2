"""Every refusal's body, as OpenAI's: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every refusal, as OpenAI's."""

    error: ErrorDetail
