"""``GET /v1/models`` and ``GET /v1/models/{model_id}``: the model names ``/v1/audio/speech`` accepts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from chorus.serving.errors import ApiError

# Every name is the same base model; they are OpenAI's speech models, so that clients with a fixed model
# picker work. Any other name is refused as OpenAI refuses it (404 model_not_found), never spoken.
MODEL_NAMES = ("chorus", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class ModelCard(BaseModel):
    """A model, as OpenAI's ``models.retrieve`` and each item of its ``models.list`` give it."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(BaseModel):
    """``GET /v1/models``, as OpenAI's: the names ``/v1/audio/speech`` accepts."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_not_found(name: str) -> ApiError:
    """OpenAI's refusal of a model it does not have: the same for a speech request's ``model`` as for
    ``GET /v1/models/{model_id}``, so a client handles both with one ``NotFoundError``."""
    return ApiError(
        404,
        f"The model {name[:80]!r} does not exist: use one of {', '.join(MODEL_NAMES)} (GET /v1/models)",
        param="model",
        code="model_not_found",
    )
