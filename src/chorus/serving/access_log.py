"""Each HTTP request's id, and its one line in the access log.

A request keeps the ``X-Request-Id`` its client sent when that is a plain token (letters, digits and
``._:-``, at most 128 characters: nothing a log line could be split or forged on), else gets a new one
(``req_`` and 32 hex digits, as OpenAI names theirs); the answer carries it back in ``X-Request-Id``.
When its answer has ended (a stream's last byte included) the request logs one line on ``chorus.access``:
client, method, path (as sent, percent-encoded), status, duration, bytes sent (``-`` for an internal
error's answer, which Starlette sends from outside), tenant (``-`` where its key named none) and id.
``chorus serve`` turns uvicorn's own access log off, so a request is one line. Log records made while
a request is handled, in its task or the thread pool calls it makes (not the batcher's thread, which
serves many requests at once), carry its id (:class:`RequestIdFilter`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar
from urllib.parse import quote_from_bytes

REQUEST_ID_HEADER = "x-request-id"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# What a logged path keeps as it is: printable ASCII but the quote and backslash that would end or escape its field.
_PATH_SAFE = "".join(chr(c) for c in range(33, 127) if chr(c) not in '"\\')

access_log = logging.getLogger("chorus.access")
current_request_id: ContextVar[str | None] = ContextVar("chorus_request_id", default=None)


def logged_path(scope) -> str:
    """The request's path as its client sent it (``raw_path``, still percent-encoded: ``%0A`` stays three
    characters, never a line break), with anything else that is not printable ASCII or that would end the
    quoted field percent-encoded."""
    return quote_from_bytes(scope.get("raw_path") or scope.get("path", "").encode(), safe=_PATH_SAFE)


def request_id_of(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a plain token, else a new id."""
    return given if given is not None and _TOKEN.fullmatch(given) else f"req_{uuid.uuid4().hex}"


class AccessLogMiddleware:
    """Gives every HTTP request its id (``request.state.request_id`` and the answer's ``X-Request-Id``) and
    logs its line when its answer has ended. ASGI, so a streamed answer is timed to its last byte."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == REQUEST_ID_HEADER.encode()), None)
        request_id = request_id_of(given.decode("latin-1") if given is not None else None)
        scope.setdefault("state", {})["request_id"] = request_id
        # An exception is answered outside this middleware (Starlette's outermost one): 500, bytes unknown.
        started, status, sent = time.perf_counter(), [500], [None]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)
            if message["type"] == "http.response.start":
                sent[0] = 0
            elif message["type"] == "http.response.body":
                sent[0] += len(message.get("body", b""))

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)
            client = scope.get("client")
            access_log.info(
                '%s "%s %s" %d %.1f ms %s B tenant=%s request_id=%s',
                f"{client[0]}:{client[1]}" if client else "-",
                scope.get("method", ""),
                logged_path(scope),
                status[0],
                (time.perf_counter() - started) * 1000,
                "-" if sent[0] is None else sent[0],
                scope["state"].get("tenant") or "-",
                request_id,
            )


class RequestIdFilter(logging.Filter):
    """Sets ``record.request`` to `` [request_id]`` for a record made while a request is handled (the
    access line names its id already), else to ``""``: for a handler whose format ends in
    ``%(request)s``."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_id.get()
        record.request = f" [{request_id}]" if request_id and record.name != access_log.name else ""
        return True
