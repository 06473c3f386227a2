"""``GET /v1/models``: what OpenAI clients look up before they speak."""

from __future__ import annotations

from fastapi import APIRouter

from chorus.serving.routes.deps import ERRORS, Tenant
from chorus.serving.schemas import MODEL_NAMES, ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", responses={200: {"model": ModelList}, **ERRORS})
def list_models(tenant: Tenant):
    # Any model name is accepted by /v1/audio/speech; these are the ones clients offer.
    return ModelList(data=[ModelCard(id=name) for name in MODEL_NAMES]).model_dump()
