"""``GET /v1/models`` and ``GET /v1/models/{model_id}``: what OpenAI clients look up before they speak."""

from __future__ import annotations

from fastapi import APIRouter

from chorus.serving.routes.deps import ERRORS, Tenant
from chorus.serving.schemas.models import MODEL_NAMES, ModelCard, ModelList, model_not_found

router = APIRouter()


@router.get("/v1/models", responses={200: {"model": ModelList}, **ERRORS})
def list_models(tenant: Tenant):
    # The names /v1/audio/speech accepts (any other is a 404 model_not_found there).
    return ModelList(data=[ModelCard(id=name) for name in MODEL_NAMES]).model_dump()


@router.get("/v1/models/{model_id}", responses={200: {"model": ModelCard}, **ERRORS})
def retrieve_model(model_id: str, tenant: Tenant):
    # OpenAI's models.retrieve: an item of the list, or the refusal /v1/audio/speech gives that name.
    if model_id not in MODEL_NAMES:
        raise model_not_found(model_id)
    return ModelCard(id=model_id).model_dump()
