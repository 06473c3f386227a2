"""Limits per tenant and for the whole server: request rates (token buckets), onboarding jobs at once,
stored voices and bytes.

A request over a limit is a 429 with a message naming the limit (``Retry-After`` where waiting helps:
the rate and the jobs; stored voices free up only when the tenant deletes some). Counts of jobs and
voices come from the store, so they hold across restarts and across servers sharing one store.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from chorus.serving.errors import ApiError, in_bytes
from chorus.serving.settings import Limits
from chorus.serving.store import QuotaReached, VoiceStatus, VoiceStore

# A job slot frees when a job ends: minutes for a voice from a few minutes of audio.
JOB_RETRY_SECONDS = 60
SERVER = "*"  # the bucket of all tenants together (no tenant id has a '*')


class RateLimiter:
    """Token buckets by name (a tenant, or :data:`SERVER` for all of them): ``per_minute`` tokens each,
    refilled continuously, so bursts up to ``per_minute`` pass."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, time)
        self._lock = threading.Lock()

    def take(self, *buckets: tuple[str, int, str]) -> None:
        """Spend one request from each ``(name, per_minute, whose)`` bucket, or from none of them: ``ApiError``
        429 with ``Retry-After`` naming the first bucket that is empty (``whose`` ends the message: "for this
        key", "on this server"). All or none, so a request refused by one bucket costs the others nothing."""
        with self._lock:
            now = self.clock()
            refilled = {}
            for name, per_minute, _ in buckets:
                tokens, then = self._buckets.get(name, (float(per_minute), now))
                refilled[name] = min(float(per_minute), tokens + (now - then) * per_minute / 60.0)
            for name, per_minute, whose in buckets:
                if refilled[name] < 1.0:
                    self._buckets.update({n: (tokens, now) for n, tokens in refilled.items()})
                    wait = max(1, math.ceil((1.0 - refilled[name]) * 60.0 / per_minute))
                    raise _busy(f"over {per_minute} requests a minute {whose}", wait, "rate_limit_exceeded")
            self._buckets.update({n: (tokens - 1.0, now) for n, tokens in refilled.items()})


class CheckSlots:
    """Turns for the checks of a consent or a sample (:class:`~.settings.ConsentSettings`): at most ``running``
    at once on this server, at most ``waiting`` more queued for a turn, at most ``per_tenant`` of all those places
    one tenant's; another is refused at once (429 with ``Retry-After``) rather than queued without end, holding its
    decoded audio. A client that hung up while queued gets no check when its turn comes."""

    RETRY_SECONDS = 5  # a check takes a few seconds of CPU

    def __init__(self, running: int, waiting: int, per_tenant: int | None = None):
        if running < 1 or waiting < 0 or (per_tenant is not None and per_tenant < 1):
            raise ValueError(
                f"checks at once and per tenant must be 1 or more and waiting 0 or more, not {running}, "
                f"{per_tenant} and {waiting}"
            )
        self.running, self.waiting = running, waiting
        self.per_tenant = per_tenant or running + waiting
        self._queued = 0
        self._tenants: dict[str, int] = {}  # tenant -> its checks running or queued
        self._turns: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        """The turns of the running event loop. An ``asyncio.Semaphore`` binds to the first loop that waits on
        it, and an app may outlive its loop (each ``TestClient`` runs its own): a new loop starts new turns."""
        loop = asyncio.get_running_loop()
        if self._turns is None or self._loop is not loop:
            self._turns, self._loop = asyncio.Semaphore(self.running), loop
        return self._turns

    @asynccontextmanager
    async def turn(self, tenant: str, gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[None]:
        """Hold one of ``tenant``'s turns for the body of the ``async with`` (``ApiError`` 429 when none is free
        and the queue is full, or the tenant holds its share). ``gone`` (``Request.is_disconnected``) is asked
        once a queued request's turn comes: a client that hung up while it waited is answered 499 and its turn
        passed on, not spent on seconds of CPU."""
        turns = self._semaphore()
        if turns.locked() and self._queued >= self.waiting:
            raise _busy("the server is checking as many recordings as it can at once", self.RETRY_SECONDS, "busy")
        held = self._tenants.get(tenant, 0)
        if held >= self.per_tenant:
            raise _busy(
                f"{held} of your recordings are being checked or waiting (at most {self.per_tenant} at once)",
                self.RETRY_SECONDS,
                "busy",
            )
        queued = turns.locked()
        self._tenants[tenant] = held + 1
        try:
            self._queued += 1
            try:
                await turns.acquire()
            finally:
                self._queued -= 1
            try:
                if queued and gone is not None and await gone():
                    raise ApiError(
                        499, "the client closed the connection while it waited for a turn", code="client_gone"
                    )
                yield
            finally:
                turns.release()
        finally:
            if self._tenants[tenant] == 1:
                del self._tenants[tenant]
            else:
                self._tenants[tenant] -= 1


def check_rate(rate: RateLimiter, tenant: str, limits: Limits, keyed: bool = True) -> None:
    """Spend one of ``tenant``'s requests and one of the server's, or neither (``ApiError`` 429): a tenant's
    refused requests leave the server's budget to the others. ``keyed``: the server has API keys (without,
    its one tenant's limit is no key's)."""
    rate.take(
        (tenant, limits.of(tenant).requests_per_minute, "for this key" if keyed else "for this server's single tenant"),
        (SERVER, limits.requests_per_minute, "on this server (all keys together)"),
    )


def check_onboarding(store: VoiceStore, tenant: str, limits: Limits, queued_here: int) -> None:
    """Refuse a new onboarding job over ``tenant``'s limits or the server's (``ApiError`` 429)."""
    if queued_here >= limits.queued_jobs:
        raise _busy(
            f"{queued_here} onboarding jobs are waiting on this server (at most {limits.queued_jobs})",
            JOB_RETRY_SECONDS,
            "too_many_jobs",
        )
    own = limits.of(tenant)
    active = store.active_jobs(tenant)
    if active >= own.active_jobs:
        raise _busy(
            f"{active} of your onboarding jobs are queued or running (at most {own.active_jobs})",
            JOB_RETRY_SECONDS,
            "too_many_jobs",
        )
    # Failed voices are left out: this upload may be the one that replaces one. The job's own transaction
    # counts exactly, with the voice being replaced left out (VoiceStore.create_job).
    voices = sum(voice.status != VoiceStatus.FAILED for voice in store.list_voices(tenant))
    if voices >= own.voices:
        raise _full(f"you keep {voices} voices (at most {own.voices}); delete some to make room")
    stored = store.stored_bytes(tenant)
    if stored >= own.voice_bytes:
        raise _full(
            f"your voices take {in_bytes(stored)} (at most {in_bytes(own.voice_bytes)}); delete some to make room"
        )
    everyone = store.stored_bytes()
    if everyone >= limits.voice_bytes:
        raise _full(
            f"this server's voices take {in_bytes(everyone)} (at most {in_bytes(limits.voice_bytes)}); ask its operator"
        )


def quota_reached(error: QuotaReached) -> ApiError:
    """The 429 of a limit that ``VoiceStore.create_job`` found reached in its transaction."""
    if error.what == "jobs":
        return _busy(str(error), JOB_RETRY_SECONDS, "too_many_jobs")
    return _full(str(error), "consent_quota_exceeded" if error.what == "consents" else "voice_quota_exceeded")


def _busy(message: str, retry_after: int, code: str) -> ApiError:
    """429 where waiting helps: ``Retry-After`` says how long."""
    return ApiError(
        429,
        f"{message}; retry in {retry_after} s",
        type="rate_limit_error",
        code=code,
        headers={"Retry-After": str(retry_after)},
    )


def _full(message: str, code: str = "voice_quota_exceeded") -> ApiError:
    return ApiError(429, message, type="insufficient_quota", code=code)
