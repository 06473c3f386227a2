"""``HEAD`` on every ``GET`` route: uptime checkers, load balancers and ``curl -I`` ask with it, and FastAPI's
routes answer only the methods they name (a ``HEAD /`` was a 405 saying ``allow: POST``, Piper's route
being the first on that path)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Answers ``HEAD`` as the ``GET`` of the same path would be answered, without its body: the same
    status and headers (its Content-Length the GET's, as HTTP asks), so a route that only answers ``POST``
    still answers 405. The ``GET`` runs whole, its body made and dropped: every ``GET`` route of this
    server answers small and at once (none streams without end), so a ``HEAD`` ends as soon as its ``GET``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        # A copy: the server reads the method of the scope it made (uvicorn's httptools frames a GET's answer
        # chunked, a HEAD's not), and the middlewares outside log and count the request as the client sent it.
        as_get = {**scope, "method": "GET"}

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}  # more_body kept: the answer ends when the GET's does
            await send(message)

        try:
            await self.app(as_get, receive, headers_only)
        finally:
            # The router names the route it matched on the scope it was given; the metrics count by it.
            if "route" in as_get:
                scope["route"] = as_get["route"]
