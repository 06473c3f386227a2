"""Single-tenant mode's guard against web pages: requests must name a loopback host, and come from no other site.

Without keys the server asks for no credential and binds to loopback only (:func:`~.tenants.check_bind`), but a
browser on the same machine still reaches it. Any web page may send it "simple" cross-site requests (a form's
multipart POST, ``text/plain`` to Piper's ``POST /``) without a preflight, and through DNS rebinding (a name of
the attacker's that resolves to 127.0.0.1) read the answers too: list, speak with and delete the user's voices.
A probe of the server did both. So, with no keys, a request whose ``Host`` is not a loopback name, or whose
``Origin`` is another site's (``null`` included), is refused with 403 before any route runs. Clients outside a
browser (curl, OpenAI's SDK) send the loopback host they dialled and no ``Origin``; the server's own web page
sends its own origin.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from chorus.serving.errors import error_response
from chorus.serving.tenants import is_loopback


def host_name(value: str) -> str:
    """The host of a ``Host`` header or a URL's netloc, its port, IPv6 brackets and a fully qualified name's
    final dot ("localhost.") left out."""
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return (value.rsplit(":", 1)[0] if value.count(":") == 1 else value).rstrip(".")


def refusal(headers: dict[str, str]) -> str | None:
    """Why a request with these (lower-case) headers may not reach a server without keys; None if it may."""
    host = headers.get("host", "")
    if not is_loopback(host_name(host)):
        return f"this server has no API keys and answers only requests to a loopback host, not {host[:100]!r}"
    origin = headers.get("origin")
    if origin is not None and not is_loopback(host_name(urlsplit(origin).netloc)):
        return f"this server has no API keys and answers no requests from another site ({origin[:100]!r})"
    return None


class LoopbackGuard:
    """ASGI middleware: :func:`refusal`'s requests answered 403 (OpenAI's error shape) before the app sees them."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
            why = refusal(headers)
            if why is not None:
                await error_response(403, why, type="permission_error", code="not_loopback")(scope, receive, send)
                return
        await self.app(scope, receive, send)
