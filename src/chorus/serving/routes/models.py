"""``GET /v1/models``: what OpenAI clients look up before they speak."""

from __future__ import annotations

from fastapi import APIRouter

from chorus.serving.routes.deps import ERRORS, Tenant
from chorus.serving.schemas.models import MODEL_NAMES, ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", responses={200: {"model": ModelList}, **ERRORS})
def list_models(tenant: Tenant):
    # The names /v1/audio/speech accepts (any other is a 404 model_not_found there).
    return ModelList(data=[ModelCard(id=name) for name in MODEL_NAMES]).model_dump()
