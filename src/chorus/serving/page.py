"""The web page of the server: ``GET /`` and its files at ``GET /web/{name}`` (``serving/web/``: plain
HTML, CSS and JavaScript, no build step). They need no key: the page sends the key typed into it with
each API call."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from chorus.serving.errors import ApiError

WEB_DIR = Path(__file__).parent / "web"
WEB_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page runs only its own script and style and calls only this server (no CDN, no inline code);
# synthesized audio plays from blob: URLs.
WEB_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def add_web_page(app: FastAPI) -> None:
    """Add ``GET /`` and ``GET /web/{name}`` to ``app``."""

    def web_file(name: str) -> Response:
        try:
            content = (WEB_DIR / name).read_bytes()
        except OSError:
            raise ApiError(
                404, f"the web page file {name!r} is missing from this installation", type="not_found_error"
            ) from None
        return Response(
            content,
            media_type=WEB_FILES[name],
            headers={
                "Cache-Control": "no-cache",
                "Content-Security-Policy": WEB_CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )

    @app.get("/", include_in_schema=False)
    def web_page():
        return web_file("index.html")

    @app.get("/web/{name}", include_in_schema=False)
    def web_asset(name: str):
        if name not in WEB_FILES:
            raise ApiError(404, f"no web page file {name[:80]!r}", type="not_found_error")
        return web_file(name)
