"""Refusals as OpenAI-shaped JSON: ``{"error": {"message", "type", "param", "code"}}`` with a status.

:class:`ApiError` is what the routes raise, :class:`UploadError` what the upload checks raise (here, low,
so that every room may raise it); :func:`synthesis_error` maps what the engine and the store
raise during speech to one; :func:`add_error_handlers` makes every error (an upload refused, an unknown
route, a failed validation, a bug) such a body, never a stack trace.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from chorus.adapters.voice import BaseMismatch, VoiceError
from chorus.serving.engine import UnknownVoice
from chorus.serving.store import (
    InvalidId,
    JobNotFound,
    VoiceCorrupted,
    VoiceNotFound,
    VoiceNotReady,
    outage_errors,
)

log = logging.getLogger("chorus.serving.errors")


def in_bytes(size: int) -> str:
    """A size as a refusal names it, readable and exact, in the binary units the limits are set in (10 MiB is
    ``10 << 20``): "38.1 MiB (40,000,403 bytes)" (a probe's user had read "the upload is 40000403 bytes; at most
    10551296"). The unit is chosen after rounding: 1,048,500 bytes is "1.0 MiB", not "1023.9 KiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if round(size / scale, 1) >= 1:
            return f"{size / scale:.1f} {unit} ({size:,} bytes)"
    return f"{size:,} byte{'' if size == 1 else 's'}"


class ApiError(Exception):
    """A refusal sent to the client as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


class UploadError(ValueError):
    """An upload refused, with the HTTP status to answer (400 bad content, 413 too large, 415 not audio/zip)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    if status == 409 or type == "insufficient_quota":
        # OpenAI's SDK retries a 409 and every 429 (twice, by default) unless told not to: a conflict or a full
        # quota answers the same however often it is asked (a probe's client sent each three times).
        headers = {**(headers or {}), "x-should-retry": "false"}
    return JSONResponse(
        {"error": {"message": message, "type": type, "param": param, "code": code}}, status_code=status, headers=headers
    )


def type_for(status: int) -> str:
    """OpenAI's error type for an HTTP status."""
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        409: "conflict_error",
        413: "request_too_large",
        415: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")


def voice_not_found(voice_id: str, close: list[str] | None = None) -> ApiError:
    # The same words whether the voice never existed or belongs to another tenant; ``close`` holds only
    # names the asking tenant may use.
    hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    return ApiError(
        404, f"voice {voice_id[:80]!r} not found{hint}", type="not_found_error", param="voice", code="voice_not_found"
    )


def not_a_stored_voice(voice_id: str, what: str) -> ApiError:
    """A speaker or an alias named where a stored voice is asked for (its record, its deletion)."""
    return ApiError(
        400,
        f"{voice_id!r} is {what}, not a stored voice: it has no record to show or delete (GET /v1/audio/voices "
        "lists every name speech takes)",
        param="voice",
        code="not_a_stored_voice",
    )


def synthesis_error(error: BaseException, voice: str) -> ApiError:
    """What the client is told when speaking ``voice`` raised ``error``."""
    if isinstance(error, UnknownVoice):
        return voice_not_found(voice)
    if isinstance(error, VoiceNotReady):
        return ApiError(
            409,
            f"voice {voice!r} is not ready (GET /v1/voices/{voice} says why)",
            type="conflict_error",
            param="voice",
            code="voice_not_ready",
        )
    if isinstance(error, VoiceCorrupted):
        return ApiError(
            409,
            f"voice {voice!r} failed its checksum and is marked failed; upload it again",
            type="conflict_error",
            param="voice",
            code="voice_corrupted",
        )
    if isinstance(error, BaseMismatch):  # names the two bases, no path: what the client needs to act
        return ApiError(
            409,
            f"voice {voice!r} was made on base {error.made_on}, not on this server's base {error.this}: a server "
            "started with its base speaks it, or adapt it again on this one",
            type="conflict_error",
            param="voice",
            code="voice_of_another_base",
        )
    if isinstance(error, VoiceError):  # a folder this base cannot load; its message names server paths
        log.warning("voice %r could not be loaded: %s", voice, error)
        return ApiError(
            409,
            f"voice {voice!r} cannot be loaded on this server's base model (see the server log)",
            type="conflict_error",
            param="voice",
            code="voice_unloadable",
        )
    if isinstance(error, (ValueError, TypeError)):  # e.g. nothing speakable in the text
        log.info("speech refused: %s", error)
        return ApiError(400, str(error)[:300], param="input")
    log.error("synthesis failed", exc_info=error)
    return ApiError(500, "synthesis failed (see the server log)", type="server_error")


# What a full, read-only or vanished disk raises: SQLite's messages and the errno of file writes.
_SQLITE_STORAGE = ("readonly", "read-only", "disk is full", "disk i/o error", "unable to open")
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO}


def storage_fault(error: BaseException) -> str | None:
    """The storage problem ``error`` is (read-only, full, I/O), or None for any other error."""
    if isinstance(error, sqlite3.OperationalError) and any(m in str(error).lower() for m in _SQLITE_STORAGE):
        return f"database: {error}"
    if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
        return f"files: {os.strerror(error.errno)}"
    return None


OUTAGE_RETRY_SECONDS = 15


def add_error_handlers(app: FastAPI) -> None:
    """Every error ``app`` meets becomes an OpenAI-shaped JSON body; a storage fault is a 503 (the
    store cannot take writes; reads go on)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return error_response(error.status, error.message, error.type, error.param, error.code, error.headers)

    @app.exception_handler(UploadError)
    async def upload_error(request: Request, error: UploadError):
        return error_response(error.status, str(error), type_for(error.status))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, error: ClientDisconnect):
        # No one reads the answer; counted as nginx counts a client that closed its request (499), not as a
        # server error with a traceback (a client that hung up mid-upload had been two tracebacks and a 500).
        log.info("client closed %s %s before its request was read", request.method, request.url.path)
        return error_response(499, "the client closed the connection before its request was read", code="client_gone")

    @app.exception_handler(InvalidId)
    async def invalid_id(request: Request, error: InvalidId):
        return error_response(400, str(error))

    @app.exception_handler(VoiceNotFound)
    @app.exception_handler(JobNotFound)
    async def not_found(request: Request, error: KeyError):
        return error_response(404, str(error.args[0]) if error.args else "not found", "not_found_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        message = error.detail if isinstance(error.detail, str) else "request refused"
        if error.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path[:100]}"
        return error_response(error.status_code, message, type_for(error.status_code), headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in error.errors()]
        return error_response(400, "; ".join(parts)[:500] or "invalid request")

    # Registered for the error types themselves (not left to the catch-all), so the answer is a plain
    # response: the catch-all runs where the server also re-raises the error.
    @app.exception_handler(sqlite3.OperationalError)
    @app.exception_handler(OSError)
    async def storage_error(request: Request, error: Exception):
        fault = storage_fault(error)
        if fault is None:
            log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=error)
            return error_response(500, "internal server error (logged on the server)", "server_error")
        log.warning("storage fault in %s %s: %s", request.method, request.url.path, fault)
        return error_response(
            503,
            f"the voice store cannot take writes right now ({fault}); reading and speaking still work, try again later",
            "server_error",
            code="storage_unavailable",
            headers={"Retry-After": "30"},
        )

    async def store_outage(request: Request, error: Exception):
        # The details (hosts, buckets, the driver's words) go to the log only.
        log.warning("voice store unreachable in %s %s: %r", request.method, request.url.path, error)
        return error_response(
            503,
            "the voice store cannot be reached right now; try again later",
            "server_error",
            code="store_unavailable",
            headers={"Retry-After": str(OUTAGE_RETRY_SECONDS)},
        )

    for outage in outage_errors():
        app.add_exception_handler(outage, store_outage)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception):
        # Answered outside the access log's middleware (Starlette's outermost one): the id is said here.
        request_id = getattr(request.state, "request_id", None)
        log.error("unhandled error in %s %s (request %s)", request.method, request.url.path, request_id, exc_info=error)
        if request_id is None:
            return error_response(500, "internal server error (logged on the server)", "server_error")
        return error_response(
            500,
            f"internal server error (logged on the server with request id {request_id})",
            "server_error",
            headers={"X-Request-Id": request_id},
        )
