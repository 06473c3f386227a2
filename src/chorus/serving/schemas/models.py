"""``GET /v1/models``: the model names ``/v1/audio/speech`` accepts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# Every name is the same base model; they are OpenAI's speech models, so that clients with a fixed model
# picker work. Any other name is refused as OpenAI refuses it (404 model_not_found), never spoken.
MODEL_NAMES = ("chorus", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(BaseModel):
    """``GET /v1/models``, as OpenAI's: the names ``/v1/audio/speech`` accepts."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
