"""Limits per tenant: a request rate (token bucket), onboarding jobs at once, stored voices and bytes.

A request over a limit is a 429 with a message naming the limit (``Retry-After`` where waiting helps:
the rate and the jobs; stored voices free up only when the tenant deletes some). Counts of jobs and
voices come from the store, so they hold across restarts and across servers sharing one store.
"""

from __future__ import annotations

import math
import threading
import time

from chorus.serving.errors import ApiError
from chorus.serving.settings import TenantLimits
from chorus.serving.store import VoiceStore

# A job slot frees when a job ends: minutes for a voice from a few minutes of audio.
JOB_RETRY_SECONDS = 60


class RateLimiter:
    """One token bucket per tenant: ``per_minute`` tokens, refilled continuously."""

    def __init__(self, per_minute: int, clock=time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, time)
        self._lock = threading.Lock()

    def take(self, tenant: str) -> None:
        """Spend one request of ``tenant``'s; ``ApiError`` 429 with ``Retry-After`` when none is left."""
        rate = self.per_minute / 60.0
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.get(tenant, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - then) * rate)
            if tokens < 1.0:
                self._buckets[tenant] = (tokens, now)
                wait = max(1, math.ceil((1.0 - tokens) / rate))
                raise _busy(f"over {self.per_minute} requests a minute for this key", wait, "rate_limit_exceeded")
            self._buckets[tenant] = (tokens - 1.0, now)


def check_onboarding(store: VoiceStore, tenant: str, limits: TenantLimits, queued_here: int) -> None:
    """Refuse a new onboarding job over ``tenant``'s limits or the server's queue (``ApiError`` 429)."""
    if queued_here >= limits.queued_jobs:
        raise _busy(
            f"{queued_here} onboarding jobs are waiting on this server (at most {limits.queued_jobs})",
            JOB_RETRY_SECONDS,
            "too_many_jobs",
        )
    active = store.active_jobs(tenant)
    if active >= limits.active_jobs:
        raise _busy(
            f"{active} of your onboarding jobs are queued or running (at most {limits.active_jobs})",
            JOB_RETRY_SECONDS,
            "too_many_jobs",
        )
    voices = store.list_voices(tenant)
    if len(voices) >= limits.voices:
        raise _full(f"you keep {len(voices)} voices (at most {limits.voices}); delete some to make room")
    stored = sum(v.size_bytes or 0 for v in voices)
    if stored >= limits.voice_bytes:
        raise _full(f"your voices take {stored} bytes (at most {limits.voice_bytes}); delete some to make room")


def _busy(message: str, retry_after: int, code: str) -> ApiError:
    """429 where waiting helps: ``Retry-After`` says how long."""
    return ApiError(
        429,
        f"{message}; retry in {retry_after} s",
        type="rate_limit_error",
        code=code,
        headers={"Retry-After": str(retry_after)},
    )


def _full(message: str) -> ApiError:
    return ApiError(429, message, type="insufficient_quota", code="voice_quota_exceeded")
