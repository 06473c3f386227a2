"""Dynamic batching: concurrent requests in many voices become one forward of the acoustic model.

Requests ``(text, voice, speed)`` from any number of threads or asyncio tasks wait in queues, one per
tenant; a worker thread takes up to ``max_batch`` of them, one from each tenant in turn, waiting at most
``max_wait_ms`` after the oldest one arrived, and hands them to :meth:`Engine.speak
<chorus.serving.engine.Engine.speak>` as one batch (the library's one synthesis path,
:mod:`chorus.synthesis.forward`, says how voices share a forward). The batcher only queues and groups.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, Self

from chorus.serving.engine import Engine, EngineVoice, Request
from chorus.synthesis.forward import SentenceResult


@dataclass
class BatcherStats:
    """Counters for metrics: ``batch_sizes`` maps a batch size to how many batches had it."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    batches: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    paths: Counter = field(default_factory=Counter)
    busy_seconds: float = 0.0  # worker time spent in batches

    @property
    def mean_batch_size(self) -> float:
        return sum(size * count for size, count in self.batch_sizes.items()) / max(self.batches, 1)


class SpeechQueue(Protocol):
    """Where a server sends speech requests: a :class:`Batcher`, or the Ray app's remote one."""

    stats: BatcherStats

    def submit(self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = "") -> Future: ...

    async def synthesize_async(
        self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = ""
    ) -> SentenceResult: ...

    def close(self, timeout: float | None = None) -> None: ...


# -- the batcher -------------------------------------------------------------------------------
@dataclass
class _Pending:
    request: Request
    future: Future
    arrived: float


class Batcher:
    """Gathers concurrent requests into batches for one :class:`Engine` (one worker thread).

    ``max_batch``: most rows per forward; ``max_wait_ms``: longest a request waits for company after
    it arrives (a request that waited longer while the worker was busy goes in the next batch at
    once). Use as a context manager or call :meth:`close`. :meth:`held` and :meth:`wait_queued` make
    a batch's makeup deterministic (tests, benchmarks): requests gathered while held go out together.

    Fair across tenants: each tenant's requests wait in a queue of their own, and a batch takes one from
    each tenant in turn (the turn goes on from batch to batch), so one tenant's hundreds of sentences
    delay another's one by a batch at most, not by all of them.
    """

    def __init__(self, engine: Engine, max_batch: int = 16, max_wait_ms: float = 5.0, merge: bool | str = "auto"):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"need max_batch >= 1 and max_wait_ms >= 0, got {max_batch}, {max_wait_ms}")
        self.engine = engine
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.merge = merge
        self.stats = BatcherStats()
        self._queues: dict[str, deque[_Pending]] = {}  # by tenant, in turn order
        self._waiting = 0
        self._wake = threading.Condition()
        self._closed = False
        self._holds = 0
        self._worker = threading.Thread(target=self._run, name="chorus-batcher", daemon=True)
        self._worker.start()

    def submit(self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = "") -> Future:
        """Queue a request of ``tenant``; the future gives a :class:`SentenceResult` or raises its error
        (:class:`~chorus.serving.engine.UnknownVoice`, ``ValueError`` for unspeakable text, ...)."""
        future: Future = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("this batcher is closed")
            self._queues.setdefault(tenant, deque()).append(
                _Pending(Request(text, voice, speed), future, time.perf_counter())
            )
            self._waiting += 1
            self.stats.requests += 1
            self._wake.notify_all()  # the worker, and any wait_queued
        return future

    def synthesize(
        self, text: str, voice: EngineVoice | str, speed: float = 1.0, timeout: float | None = None, tenant: str = ""
    ) -> SentenceResult:
        """Blocking: speak ``text`` in ``voice`` (typed, or a speaker's name, a blend or an adapted voice's key)."""
        return self.submit(text, voice, speed, tenant).result(timeout)

    async def synthesize_async(
        self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = ""
    ) -> SentenceResult:
        """The same for asyncio; cancelling the awaiting task drops the request if it has not started."""
        return await asyncio.wrap_future(self.submit(text, voice, speed, tenant))

    @contextmanager
    def held(self) -> Iterator[None]:
        """While the block runs, no batch starts (one already running finishes); requests queue up. When it
        ends they go out at once, ``max_batch`` at a time, without waiting ``max_wait_ms`` for company."""
        with self._wake:
            self._holds += 1
        try:
            yield
        finally:
            with self._wake:
                self._holds -= 1
                self._wake.notify_all()

    def wait_queued(self, count: int, timeout: float | None = None) -> bool:
        """Block until at least ``count`` requests wait in the queue (True) or ``timeout`` passes (False)."""
        with self._wake:
            return self._wake.wait_for(lambda: self._waiting >= count, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish the queued ones, stop the worker."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._worker.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _next_batch(self) -> list[_Pending] | None:
        with self._wake:
            while (not self._waiting or self._holds) and not self._closed:
                self._wake.wait()
            if not self._waiting:
                return None
            deadline = min(queue[0].arrived for queue in self._queues.values()) + self.max_wait
            while self._waiting < self.max_batch and not self._closed:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._wake.wait(remaining)
            batch: list[_Pending] = []
            while len(batch) < self.max_batch and self._waiting:
                tenant = next(iter(self._queues))  # whose turn it is
                queue = self._queues.pop(tenant)
                batch.append(queue.popleft())
                self._waiting -= 1
                if queue:
                    self._queues[tenant] = queue  # to the back of the turn
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [p for p in batch if p.future.set_running_or_notify_cancel()]  # drop cancelled ones
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = self.engine.speak([p.request for p in batch], merge=self.merge)
            except Exception as error:  # noqa: BLE001 - a bug must not kill the worker or strand callers
                results = [error] * len(batch)
            done = time.perf_counter()
            self.stats.batches += 1
            self.stats.batch_sizes[len(batch)] += 1
            self.stats.busy_seconds += done - started
            for pending, result in zip(batch, results):
                if isinstance(result, Exception):
                    self.stats.failed += 1
                    pending.future.set_exception(result)
                else:
                    self.stats.completed += 1
                    self.stats.paths[result.path] += 1
                    result.seconds = done - pending.arrived
                    pending.future.set_result(result)
