"""Dynamic batching: concurrent requests in many voices become one forward of the acoustic model.

Requests ``(text, voice, speed)`` from any number of threads or asyncio tasks wait in queues, one per
tenant; a worker thread takes up to ``max_batch`` of them, waiting at most ``max_wait_ms`` after the oldest
one arrived, and hands them to :meth:`Engine.synthesize <chorus.serving.engine.Engine.synthesize>` as one batch (the
library's one synthesis path, :mod:`chorus.synthesis.forward`, says how voices share a forward). The
batcher only queues and groups.

Which requests go first is fair by work across tenants (start-time fair queueing): every sentence costs its
characters, each tenant's next sentence carries a virtual start tag (where its previous one ended, or the
present virtual time if the tenant had nothing queued), and a batch takes the lowest tags first. A tenant
with one sentence waiting goes ahead of another's backlog of long ones, whatever the order they came in.
Two bounds keep that one sentence from waiting behind the backlog's padding and bulk (server settings
``max_batch_ms``, ``batch_pad_ratio``): no row joins a batch whose first row it would pad to more than
``pad_ratio`` times its length, and a batch stops growing once its estimated time (learned from the batches
run) would pass ``max_batch_ms``. On a CPU rows cost time in proportion to their padded length with next to
no gain from batching (``bench/README.md``), so the bounds cost little throughput there.
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

from chorus.serving.engine import Engine, EngineVoice, SentenceRequest
from chorus.serving.settings import ServerSettings
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
# What a row costs besides its characters, in characters: text front end, vocoder start, the row's share of
# the batch's fixed work. On the shipped base, one CPU thread: 17 ms for 6 characters, 107 ms for 167.
ROW_COST_CHARS = 25
# How fast the batch time estimate follows the measured batches (an exponential moving average's weight).
ESTIMATE_WEIGHT = 0.2
# The most one batch's measurement may count, as a multiple of the estimate: a batch's time also holds
# loading its voices into the cache (maybe from an object store), which is not its rows' cost.
ESTIMATE_CLIP = 3.0


@dataclass
class _Pending:
    request: SentenceRequest
    future: Future
    arrived: float

    @property
    def cost(self) -> float:
        """The sentence's work, in characters: its length (slower speech is longer) plus a row's own."""
        return len(self.request.text) / max(self.request.speed, 0.25) + ROW_COST_CHARS


class Batcher:
    """Gathers concurrent requests into batches for one :class:`Engine` (one worker thread).

    ``max_batch``: most rows per forward; ``max_wait_ms``: longest a request waits for company after
    it arrives (a request that waited longer while the worker was busy goes in the next batch at
    once). ``max_batch_ms`` and ``pad_ratio`` (None: unbounded) bound a batch's estimated time and its
    padding (see the module's docstring). Use as a context manager or call :meth:`close`. :meth:`held`
    and :meth:`wait_queued` make a batch's makeup deterministic (tests, benchmarks): requests gathered
    while held go out together, as far as the bounds let them.

    Fair across tenants by work: each tenant's requests wait in a queue of their own, taken by virtual
    start tag, so one tenant's hundreds of sentences delay another's one by a batch at most, not by all of
    them.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        merge: bool | str = "auto",
        max_batch_ms: float | None = None,
        pad_ratio: float | None = None,
    ):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"need max_batch >= 1 and max_wait_ms >= 0, got {max_batch}, {max_wait_ms}")
        if (max_batch_ms is not None and max_batch_ms <= 0) or (pad_ratio is not None and pad_ratio < 1):
            raise ValueError(f"need max_batch_ms > 0 and pad_ratio >= 1, got {max_batch_ms}, {pad_ratio}")
        self.engine = engine
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_seconds = None if max_batch_ms is None else max_batch_ms / 1000.0
        self.pad_ratio = pad_ratio
        self.merge = merge
        self.stats = BatcherStats()
        # Seconds per padded character of work (rows x the longest row's cost), from the batches run; None
        # until one has run (a test may set it).
        self.seconds_per_cost: float | None = None
        self._queues: dict[str, deque[_Pending]] = {}  # by tenant, in the order they started waiting
        self._tags: dict[str, float] = {}  # each waiting tenant's next sentence's virtual start
        self._finish: dict[str, float] = {}  # where each tenant's last sentence taken ends, in virtual time
        self._virtual = 0.0  # the start tag of the last sentence taken
        self._waiting = 0
        self._wake = threading.Condition()
        self._closed = False
        self._holds = 0
        self._worker = threading.Thread(target=self._run, name="chorus-batcher", daemon=True)
        self._worker.start()

    @classmethod
    def of_server(cls, engine: Engine, settings: ServerSettings) -> Batcher:
        """A server's batcher (``chorus serve``'s, a Ray replica's): its sizes and bounds from ``settings``.
        The time bound applies on a CPU only: its estimate (rows x the longest row) is a CPU's cost, where
        a GPU runs a batch in about the time of its longest row."""
        on_cpu = engine.base.device.type == "cpu"
        return cls(
            engine,
            max_batch=settings.max_batch,
            max_wait_ms=settings.max_wait_ms,
            max_batch_ms=settings.max_batch_ms if on_cpu else None,
            pad_ratio=settings.batch_pad_ratio,
        )

    def submit(self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = "") -> Future:
        """Queue a request of ``tenant``; the future gives a :class:`SentenceResult` or raises its error
        (:class:`~chorus.serving.engine.UnknownVoice`, ``ValueError`` for unspeakable text, ...)."""
        future: Future = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("this batcher is closed")
            if tenant not in self._queues:  # it starts waiting: no earlier than now in virtual time
                self._queues[tenant] = deque()
                self._tags[tenant] = max(self._finish.get(tenant, 0.0), self._virtual)
            self._queues[tenant].append(_Pending(SentenceRequest(text, voice, speed), future, time.perf_counter()))
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
            return self._take()

    def _take(self) -> list[_Pending]:
        """The next batch, lowest start tags first, within the bounds (at least one row)."""
        batch: list[_Pending] = []
        passed: set[str] = set()  # tenants whose next sentence does not fit this batch
        while len(batch) < self.max_batch:
            tenant = min((t for t in self._queues if t not in passed), key=self._tags.__getitem__, default=None)
            if tenant is None:
                break
            queue = self._queues[tenant]
            if queue[0].future.cancelled():  # a stream cut short: dropped, not charged to its tenant
                queue.popleft()
                self._waiting -= 1
                if not queue:
                    del self._queues[tenant], self._tags[tenant]
                continue
            if batch and not self._fits(batch, queue[0]):
                passed.add(tenant)  # keeps its tag: it goes first in a later batch; others' may still fit
                continue
            start = self._tags[tenant]
            pending = queue.popleft()
            self._waiting -= 1
            self._virtual = max(self._virtual, start)
            self._finish[tenant] = self._tags[tenant] = start + pending.cost
            if not queue:
                del self._queues[tenant], self._tags[tenant]
            batch.append(pending)
        # A tenant that stopped waiting and whose last sentence ends before now starts at now anyway.
        for tenant in [t for t, end in self._finish.items() if end <= self._virtual and t not in self._queues]:
            del self._finish[tenant]
        return batch

    def _fits(self, batch: list[_Pending], pending: _Pending) -> bool:
        """Whether ``pending`` may join ``batch``: not padding its first row past ``pad_ratio`` times its
        length, and not taking the batch's estimated time past ``max_batch_ms``."""
        if self.pad_ratio is not None and pending.cost > self.pad_ratio * batch[0].cost:
            return False
        if self.max_batch_seconds is None or self.seconds_per_cost is None:
            return True
        longest = max(max(p.cost for p in batch), pending.cost)
        return self.seconds_per_cost * (len(batch) + 1) * longest <= self.max_batch_seconds

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [p for p in batch if p.future.set_running_or_notify_cancel()]  # drop cancelled ones
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = self.engine.synthesize([p.request for p in batch], merge=self.merge)
            except Exception as error:  # noqa: BLE001 - a bug must not kill the worker or strand callers
                results = [error] * len(batch)
            done = time.perf_counter()
            if not all(isinstance(result, Exception) for result in results):  # a batch that ran, not one refused
                measured = (done - started) / (len(batch) * max(p.cost for p in batch))
                estimate = self.seconds_per_cost
                if estimate is None:
                    self.seconds_per_cost = measured
                else:  # a batch that also loaded a voice (or met a busy CPU) moves the estimate by a bounded step
                    measured = min(measured, ESTIMATE_CLIP * estimate)
                    self.seconds_per_cost = (1 - ESTIMATE_WEIGHT) * estimate + ESTIMATE_WEIGHT * measured
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
