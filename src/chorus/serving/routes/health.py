"""``GET /healthz`` (liveness for anyone; details for the operator) and ``GET /metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chorus.serving.errors import ApiError
from chorus.serving.routes.deps import Server, is_operator
from chorus.serving.schemas.errors import ErrorBody
from chorus.serving.schemas.health import Health, Liveness, Onboarding
from chorus.serving.tenants import OPERATOR_TENANT

router = APIRouter()


@router.get("/healthz", responses={200: {"model": Health | Liveness}})
def healthz(request: Request, server: Server):
    problem = server.store_problem() if server.started else None
    status = "starting" if not server.started else "degraded" if problem else "ok"
    if not is_operator(request, server):
        return Liveness(status=status).model_dump()
    engine = server.engine
    stats = engine.stats()
    return Health(
        status=status,
        store_problem=problem,
        base_voices=len(engine.speakers),
        resident_voices=stats.resident_voices,
        resident_bytes=stats.resident_bytes,
        tenancy="single" if server.tenants.single_tenant else "keys",
        onboarding=Onboarding(queued=server.jobs.queued, running=server.jobs.running is not None),
    ).model_dump()


@router.get("/metrics", responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})
def metrics(request: Request, server: Server):
    if not server.tenants.single_tenant and server.authenticate(request) != OPERATOR_TENANT:
        raise ApiError(
            403,
            f"/metrics needs the operator's key (tenant {OPERATOR_TENANT!r})",
            type="permission_error",
        )
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)
