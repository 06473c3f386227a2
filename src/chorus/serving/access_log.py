"""Each HTTP request's id, and its one line in the access log.

A request keeps the ``X-Request-Id`` its client sent when that is a plain token (letters, digits and
``._:-``, at most 128 characters: nothing a log line could be split or forged on), else gets a new one
(``req_`` and 32 hex digits, as OpenAI names theirs); the answer carries it back in ``X-Request-Id``.
When its answer has ended (a stream's last byte included) the request logs one line on ``chorus.access``:
client, method, path, status, duration, bytes sent, tenant (``-`` where its key named none) and id.
``chorus serve`` turns uvicorn's own access log off, so a request is one line. Log records made while
a request is handled, in its task or a thread it hands work to, carry its id (:class:`RequestIdFilter`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar

REQUEST_ID_HEADER = "x-request-id"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

access_log = logging.getLogger("chorus.access")
current_request_id: ContextVar[str | None] = ContextVar("chorus_request_id", default=None)


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
        started, status, sent = time.perf_counter(), [500], [0]  # 500: what uvicorn answers for an exception

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            elif message["type"] == "http.response.body":
                sent[0] += len(message.get("body", b""))
            await send(message)

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)
            client = scope.get("client")
            access_log.info(
                '%s "%s %s" %d %.1f ms %d B tenant=%s request_id=%s',
                f"{client[0]}:{client[1]}" if client else "-",
                scope.get("method", ""),
                scope.get("path", ""),
                status[0],
                (time.perf_counter() - started) * 1000,
                sent[0],
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
