"""A request's headers bounded as a whole, however they arrive.

h11 bounds a request head that arrives in pieces (16 KB: ``MAX_HEADER_BYTES``, given to uvicorn), but parses one
that arrives complete in a single read whatever its size: an operator's probe had 17-120 KB of headers sent in one
write parsed and answered (401 without a key, 200 with one). The bound is kept here for every request, after
parsing: what one read can hold is then the most a request's headers cost, and no route sees more.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from chorus.serving.errors import error_response

MAX_HEADER_BYTES = 16 * 1024  # h11's own default for an incomplete head


def header_bytes(scope: Scope) -> int:
    """The bytes of a request's head as sent: its target (path and query) and each ``name: value`` line."""
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    return target + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


class HeaderBound:
    """ASGI middleware: a request whose headers hold more than ``MAX_HEADER_BYTES`` is answered 431 (RFC 6585)
    before any route or key check runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (size := header_bytes(scope)) > MAX_HEADER_BYTES:
            message = f"the request's headers hold {size:,} bytes; at most {MAX_HEADER_BYTES:,}"
            await error_response(431, message, code="headers_too_large")(scope, receive, send)
            return
        await self.app(scope, receive, send)
