"""The HTTP API of the multi-tenant voice server (FastAPI): one router per resource
(:mod:`chorus.serving.routes`: speech, voices, custom voices, jobs, models, health) on a :class:`ServerState` that holds
the engine (one resident base, adapted voices cached on demand), the batcher (concurrent requests in one
forward), the store (voices and jobs per tenant) and the onboarding worker; the routes reach it through
FastAPI dependencies (:mod:`chorus.serving.routes.deps`).

All JSON errors are ``{"error": {"message", "type", "param", "code"}}``, as OpenAI's; the bodies are the
models of :mod:`chorus.serving.schemas`, shown at ``/docs``. ``GET /`` is a web page on these routes
(speak, onboard a voice, follow its job): :mod:`chorus.serving.page`.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware

from chorus.serving.access_log import AccessLogMiddleware, RequestIdFilter
from chorus.serving.batcher import SpeechQueue
from chorus.serving.engine import Engine
from chorus.serving.errors import add_error_handlers
from chorus.serving.head_requests import HeadAsGet
from chorus.serving.header_bound import MAX_HEADER_BYTES, HeaderBound
from chorus.serving.loopback_guard import LoopbackGuard
from chorus.serving.metrics import MetricsMiddleware
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
from chorus.serving.onboarding.job_process import ProcessJobRunner
from chorus.serving.onboarding.job_runner import JobRunner
from chorus.serving.page import add_web_page
from chorus.serving.routes import ROUTERS
from chorus.serving.server import ServerState
from chorus.serving.settings import ServeConfig, ServerSettings
from chorus.serving.store import VoiceStore, new_store
from chorus.serving.tenants import Tenants, check_bind
from chorus.serving.voice_keys import stored_voice_folder

log = logging.getLogger("chorus.serving.api")


# http(s)://localhost, 127.x.x.x or [::1], any port
LOOPBACK_ORIGINS = r"https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?"
# Chorus's own answer headers a script may read (CORS shows only the "safe" ones unless told)
EXPOSED_HEADERS = (
    "X-Request-Id", "X-Sample-Rate", "X-Skipped-Text", "X-Dropped-Characters", "X-Options-Ignored",
    "X-Instructions-Ignored", "Retry-After", "Location", "Content-Length",
    "x-should-retry",  # OpenAI's SDK reads it: in a browser too, a 409 or a full quota is not asked again
)  # fmt: skip


def create_app(
    store: VoiceStore,
    engine: Engine,
    tenants: Tenants | None = None,
    settings: ServerSettings | None = None,
    *,
    jobs: JobRunner | None = None,
    batcher: SpeechQueue | None = None,
    custom_voices: CustomVoiceChecks | None = None,
    loopback_only: bool = False,
) -> FastAPI:
    """The FastAPI app of one server (:class:`ServerState` says what ``jobs`` and ``batcher`` default to).
    Starting it (its lifespan) recovers the store, starts the onboarding worker and resumes interrupted
    jobs; stopping it closes the worker, the batcher and the store. ``loopback_only``: refuse requests to
    another host or from another site (:class:`~.loopback_guard.LoopbackGuard`: what a server without keys
    needs)."""
    server = ServerState(store, engine, tenants, settings, jobs=jobs, batcher=batcher, custom_voices=custom_voices)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await run_in_threadpool(server.start)
            yield
        finally:
            await run_in_threadpool(server.close)

    # FastAPI's own /docs page loads Swagger UI from a CDN; FastAPIOffline serves the same page from its wheel.
    app = FastAPIOffline(
        title="Chorus voice server", lifespan=lifespan, docs_url="/docs", redoc_url=None, openapi_url="/openapi.json"
    )
    app.state.server = server
    if loopback_only:  # inside the log and the metrics: the refusal is counted and logged
        app.add_middleware(LoopbackGuard)
    app.add_middleware(HeaderBound)  # outside the guard, which reads every header
    app.add_middleware(HeadAsGet)  # inside the log and the metrics: they see the HEAD and its bytes sent
    # A page served from another port of this machine (a local web app) may call the API and read its answers
    # and headers; another site's may not (a new user's probe: no preflight was answered). Keys still apply.
    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=LOOPBACK_ORIGINS,
        allow_methods=["GET", "POST", "DELETE", "HEAD"],
        allow_headers=["*"],  # OpenAI's browser SDK sends its own (x-stainless-os, openai-organization ...)
        expose_headers=[*EXPOSED_HEADERS],
        max_age=600,
    )
    app.add_middleware(MetricsMiddleware, metrics=lambda: server.metrics)
    app.add_middleware(AccessLogMiddleware)  # outermost: its time and bytes are the client's
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    add_web_page(app)
    return app


def serve(config: ServeConfig, announce: Callable[[str], None] = print, log_level: str = "info") -> None:
    """Run the server with uvicorn until interrupted (``chorus serve``)."""
    import uvicorn

    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())  # a line logged while a request is handled ends with its id
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s%(request)s"))
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), handlers=[handler])
    tenants = Tenants.load(config.keys)
    check_bind(config.host, tenants)
    # Bound before the store opens and the base loads, so a port another server listens on ends here with
    # nothing started (uvicorn binds after the app's start-up, and had aborted with the job worker running);
    # uvicorn makes it listen once the app has started, so the port refuses connections until it can answer.
    # The price: two servers started on one port within one base load both bind (address reuse lets sockets
    # that do not listen share a port), and the later one fails when uvicorn makes it listen.
    bound = bound_sockets(config.host, config.port)
    created = new_store(config.store, config.database)  # said below: a mistyped --store starts empty
    voice_store = VoiceStore(config.store, config.database, config.cache_dir)
    engine = Engine.load(
        config.base,
        config.vocoder,
        config.device,
        resolve=functools.partial(stored_voice_folder, voice_store),
        cache_bytes=int(config.cache_mb * (1 << 20)),
    )
    # Jobs train in processes of their own: their memory goes back to the system when each ends.
    app = create_app(
        voice_store,
        engine,
        tenants,
        config.settings,
        jobs=ProcessJobRunner(voice_store, config),
        loopback_only=tenants.single_tenant,
    )
    # The base's speakers in the speaker encoder's space, for instant voices: made now, in the background,
    # so the first POST /v1/audio/voices does not wait for it (tens of seconds on a CPU). Instant voices
    # are blends of the Chorus base's speakers: another base has none to make.
    mapping = threading.Thread(
        target=app.state.server.custom_voices.speaker_map, name="chorus-speaker-map", daemon=True
    )
    if engine.base.kind == "chorus":
        mapping.start()
    if tenants.single_tenant:
        announce(
            "no API keys configured: single-tenant mode (tenant 'default', no authentication), "
            f"loopback only ({config.host})"
        )
    else:
        announce(f"{len(tenants.names)} tenant(s) with API keys; requests need 'Authorization: Bearer KEY'")
    announce(
        f"{len(engine.speakers)} speakers (default {engine.default_speaker}); voice store: {config.store} "
        f"(metadata: {voice_store.database_url}); adapter cache {config.cache_mb:g} MB"
    )
    if created is not None:
        announce(f"a new, empty voice store ({created} was not there): if you meant one with voices, check --store")
    announce(f"OpenAI-compatible endpoint: http://{config.host}:{config.port}/v1 (audio.speech), voices at /v1/voices")
    # chorus.access logs each request once, with its tenant, duration and id: uvicorn's own line is off.
    # h11 rather than httptools: it bounds a request head that arrives in pieces, where httptools took a 100 MB
    # header from a client without a key (one that arrives whole is bounded by HeaderBound). Parsing costs
    # nothing beside synthesis. How slowly a client sends is not bounded here (docs/serving.md: a reverse
    # proxy's timeouts).
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=log_level,
            access_log=False,
            http="h11",
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
    )
    try:
        server.run(sockets=bound)
    except KeyboardInterrupt:  # a second Ctrl-C during the stop (uvicorn.run ignores it too)
        pass
    if not server.started:  # its start-up failed, and uvicorn logged why
        _end(mapping, 3)  # uvicorn's exit status for it
    if app.state.server.started:
        # A second Ctrl-C before the app's shutdown makes uvicorn skip it: stop the job (its process ignores
        # the signal and waits for this stop) and close the store here, or the exit would wait out the job.
        app.state.server.close()
    _end(mapping, 0)


def _end(mapping: threading.Thread, status: int) -> None:
    """End the server's process with ``status``."""
    if mapping.is_alive():
        # Stopped within a minute of its start, the speaker map is still in torch's C++ code, and the
        # interpreter's teardown under it aborts the process ("terminate called without an active
        # exception", exit status 134). The server has stopped in order (jobs stopped, store closed): end here.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if status:
        raise SystemExit(status)


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound to ``host:port`` as uvicorn binds them (asyncio's ``create_server``): one per
    address the host name gives (``localhost`` may be 127.0.0.1 and ::1), IPv6 ones IPv6-only, address
    reuse; ``""`` is every interface. A port in use or a host this machine lacks is a ``ValueError`` saying
    so. They do not listen yet: uvicorn makes them listen once the app has started, so until the server
    can answer, a connection is refused rather than left waiting (and TCP health probes fail)."""
    try:
        addresses = dict.fromkeys(
            (family, kind, proto, address[:2])
            for family, kind, proto, _, address in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        )
    except OSError as error:
        raise ValueError(f"cannot bind {host}:{port}: {error}") from None
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses:
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as error:
        for sock in bound:
            sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} on {host} is in use by another process: stop it, or give --port") from None
        raise ValueError(f"cannot bind {host}:{port}: {error.strerror or error}") from None
    return bound
