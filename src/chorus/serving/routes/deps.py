"""What the routes take from FastAPI's dependencies: the server behind the app and the request's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from chorus.serving.errors import ApiError
from chorus.serving.schemas import ErrorBody
from chorus.serving.server import VoiceServer
from chorus.serving.tenants import OPERATOR_TENANT

# What /docs shows for the routes' answers (they are built from these models; errors are ErrorBody).
ERRORS = {status: {"model": ErrorBody} for status in (400, 401, 404, 409, 413, 415, 500)}


def get_server(request: Request) -> VoiceServer:
    return request.app.state.server


Server = Annotated[VoiceServer, Depends(get_server)]


def authenticated(request: Request, server: Server) -> str:
    """The request's tenant, its request spent from the server's and the tenant's rates (401 or 429)."""
    return server.authenticate(request)


Tenant = Annotated[str, Depends(authenticated)]


def is_operator(request: Request, server: VoiceServer) -> bool:
    """Whether the request may see server-wide figures: any request without keys configured, else only the
    operator tenant's key (``tenants.OPERATOR_TENANT``)."""
    if server.tenants.single_tenant:
        return True
    try:
        return server.authenticate(request) == OPERATOR_TENANT
    except ApiError:
        return False
