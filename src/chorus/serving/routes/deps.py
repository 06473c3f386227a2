"""What the routes take from FastAPI's dependencies: the server behind the app and the request's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from chorus.serving.errors import ApiError, in_bytes
from chorus.serving.json_body import BodyError, loads_bounded
from chorus.serving.schemas.errors import ErrorBody
from chorus.serving.server import ServerState
from chorus.serving.tenants import OPERATOR_TENANT

# What /docs shows for the routes' answers (they are built from these models; errors are ErrorBody).
ERRORS = {status: {"model": ErrorBody} for status in (400, 401, 404, 409, 413, 415, 500)}


def get_server(request: Request) -> ServerState:
    return request.app.state.server


Server = Annotated[ServerState, Depends(get_server)]


def authenticated(request: Request, server: Server) -> str:
    """The request's tenant, its request spent from the server's and the tenant's rates (401 or 429)."""
    return server.authenticate(request)


Tenant = Annotated[str, Depends(authenticated)]


def is_operator(request: Request, server: ServerState) -> bool:
    """Whether the request may see server-wide figures: any request without keys configured, else only the
    operator tenant's key (``tenants.OPERATOR_TENANT``)."""
    if server.tenants.single_tenant:
        return True
    try:
        return server.authenticate(request) == OPERATOR_TENANT
    except ApiError:
        return False


def content_type(request: Request) -> str:
    """The request's media type, lower case, without its parameters ("application/json")."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body: 413 past ``limit`` bytes, by its Content-Length or as it arrives."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is over {in_bytes(limit)}", type="request_too_large")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over {in_bytes(limit)}", type="request_too_large")
    return body


async def read_json(request: Request, limit: int) -> object:
    """The request's JSON body: 415 for another content type, 413 past ``limit`` bytes, 400 if malformed."""
    if content_type(request) != "application/json":
        given = request.headers.get("content-type", "")
        raise ApiError(415, f"expected Content-Type application/json, got {given[:60] or 'none'!r}")
    body = await read_body(request, limit)
    try:
        return loads_bounded(body)
    except BodyError as error:
        raise ApiError(400, str(error)) from None
