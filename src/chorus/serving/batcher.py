"""Dynamic batching: concurrent requests in many voices become one forward of the acoustic model.

Requests ``(text, voice, speed)`` from any number of threads or asyncio tasks wait in one queue; a
worker thread takes up to ``max_batch`` of them, waiting at most ``max_wait_ms`` after the oldest one
arrived, and runs them as one batch (:func:`synthesize_batch`):

* only speakers: the plain base model, each row with its own speaker id;
* one adapted voice for every row: its adapter active for the whole batch, or merged into the base
  weights (``merge_adapter`` ... ``unmerge_all``) when all its methods merge and the batch is large
  enough for the merge to pay;
* anything else: the voice bank (:mod:`chorus.adapters.bank`) of the distinct adapted voices, each
  row routed to its own voice by gather + batched matmul, ``BASE`` rows to the base with their
  speaker id.

Rows of different speeds share the forward (``length_scale`` per row). The log-mels are then vocoded,
rows of equal length together (so no padding ever reaches the vocoder). A request that cannot be
served (unspeakable text, unknown voice, broken voice folder, bad speed) fails alone; if a batched
forward itself fails, its rows are retried one by one so only the culprit fails.

The benchmark's baselines (``bench/serving_baselines.py``) run on the same pieces: :func:`check_request`,
:func:`infer_mels` and :func:`vocode_mels`.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Self

import numpy as np
import torch

from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.inject import (
    active_adapter,
    merge_adapter,
    set_active,
    unmerge_all,
)
from chorus.adapters.layer import BASE
from chorus.serving.engine import Engine, VoiceHandle
from chorus.synthesis import SynthesisResult

MERGE_MIN_BATCH = 8  # below this a merge + unmerge costs more than the adapter math it saves


@dataclass(frozen=True)
class Request:
    text: str
    voice: str
    speed: float = 1.0  # 2.0 speaks twice as fast (length_scale = 1 / speed)


@dataclass
class ServedResult(SynthesisResult):
    """A :class:`~chorus.synthesis.SynthesisResult` (``speaker`` is the voice id) plus how it was made.

    ``mel``: the raw log-mel ``[frames, n_mels]``; ``batch_size``: rows in its forward; ``path``:
    ``"base"``, ``"active"``, ``"merged"``, ``"bank"`` or ``"split"`` (blends of speakers beside adapted
    voices: two forwards); ``seconds``: from submission to result.
    """

    mel: torch.Tensor | None = None
    frames: list[int] | None = None  # frames of each input symbol: the durations the model predicted
    batch_size: int = 1
    path: str = ""


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

    def submit(self, text: str, voice: str, speed: float = 1.0, tenant: str = "") -> Future: ...

    async def synthesize_async(self, text: str, voice: str, speed: float = 1.0, tenant: str = "") -> ServedResult: ...

    def close(self, timeout: float | None = None) -> None: ...


# -- one batch ---------------------------------------------------------------------------------
def _encode(engine: Engine, texts: list[str]) -> list[list[int] | Exception]:
    """Symbol ids per text; one unspeakable text does not spoil the others."""
    try:
        return list(engine.bundle.front_end.encode(texts))
    except Exception:  # noqa: BLE001 - one text is bad: encode each to find which
        return [_encode_one(engine, text) for text in texts]


def _encode_one(engine: Engine, text: str) -> list[int] | Exception:
    try:
        return engine.bundle.front_end.encode([text])[0]
    except Exception as error:  # noqa: BLE001 - reported to that request
        return error


def check_request(request: Request) -> None:
    if not isinstance(request.text, str):
        raise TypeError(f"text must be a string, got {type(request.text).__name__}")
    if not isinstance(request.voice, str):
        raise TypeError(f"voice must be a string, got {type(request.voice).__name__}")
    if (
        isinstance(request.speed, bool)
        or not isinstance(request.speed, numbers.Real)
        or not math.isfinite(request.speed)
        or request.speed <= 0
    ):
        raise ValueError(f"speed must be a positive number, got {request.speed!r}")


class RowOutput(NamedTuple):
    """One row of a forward: its raw log-mel ``[frames, n_mels]`` and the frames of each input symbol
    (the durations the model predicted, for timestamps)."""

    mel: torch.Tensor
    frames: list[int]


def infer_mels(model, ids: list[list[int]], speakers: list[int | torch.Tensor], speeds: list[float]) -> list[RowOutput]:
    """One forward: ids per row -> a :class:`RowOutput` per row. A speaker is a row of the table or a
    vector ``[speaker_dim]`` (a blend)."""
    device = model.mel_mean.device
    if any(isinstance(s, torch.Tensor) for s in speakers):
        if not all(isinstance(s, torch.Tensor) for s in speakers):
            raise ValueError("a forward takes speaker rows or blend vectors, not both")
        condition = {"speaker_vectors": torch.stack([s.to(device) for s in speakers])}
    else:
        condition = {"speaker_ids": torch.tensor(speakers, device=device)}
    lengths = torch.tensor([len(seq) for seq in ids])
    phonemes = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
    for row, seq in enumerate(ids):
        phonemes[row, : len(seq)] = torch.tensor(seq)
    scales = [1.0 / s for s in speeds]
    # The model scales durations elementwise, so a [batch, 1] tensor gives each row its own speed.
    length_scale = scales[0] if len(set(scales)) == 1 else torch.tensor(scales, device=device).unsqueeze(1)
    with torch.no_grad():
        out = model.infer(
            phonemes.to(device),
            lengths.to(device),
            length_scale=length_scale,
            **condition,
        )
        mels = model.denormalize_mel(out.mel)
    return [
        RowOutput(mels[row, : int(mask.sum())].clone(), [int(d) for d in out.durations[row, : len(ids[row])].tolist()])
        for row, mask in enumerate(out.frame_mask)
    ]


def vocode_mels(vocoder, mels: list[torch.Tensor]) -> list[np.ndarray]:
    """Audio per mel; mels of the same length go through the vocoder together (no padding)."""
    audio: list[np.ndarray | None] = [None] * len(mels)
    groups: dict[int, list[int]] = {}
    for row, mel in enumerate(mels):
        groups.setdefault(mel.shape[0], []).append(row)
    with torch.no_grad():
        for rows in groups.values():
            batch = vocoder(torch.stack([mels[row] for row in rows])).float().cpu().numpy()
            for row, wave in zip(rows, batch):
                peak = float(np.abs(wave).max()) if wave.size else 0.0
                if peak > 0.99:  # as Synthesizer.synthesize: scale rather than clip
                    wave = wave * (0.99 / peak)
                audio[row] = wave.astype(np.float32)
    return audio


def _vocode_one(vocoder, mel: torch.Tensor) -> np.ndarray | Exception:
    try:
        return vocode_mels(vocoder, [mel])[0]
    except Exception as error:  # noqa: BLE001 - reported to that request
        return error


def _forward(
    engine: Engine, handles: list[VoiceHandle], ids: list[list[int]], speeds: list[float], merge: bool | str
) -> tuple[list[torch.Tensor], str]:
    """The batch's mels and the path taken; the caller holds the engine lock."""
    model = engine.model
    blends = [row for row, h in enumerate(handles) if h.speaker_vector is not None]
    if blends and len(blends) < len(handles):
        # Blends feed vectors instead of table rows, which would bypass an adapted voice's own speaker
        # vector: they run as a forward of their own, on the bare base.
        rest = [row for row in range(len(handles)) if row not in set(blends)]
        mels: list[RowOutput | None] = [None] * len(handles)
        for rows in (blends, rest):
            part, path = _forward(
                engine, [handles[r] for r in rows], [ids[r] for r in rows], [speeds[r] for r in rows], merge
            )
            for row, mel in zip(rows, part):
                mels[row] = mel
        return mels, "split"
    if blends:
        with active_adapter(model, None):
            return infer_mels(model, ids, [h.speaker_vector for h in handles], speeds), "base"
    speakers = [h.speaker_id for h in handles]
    adapters = list(dict.fromkeys(h.adapter for h in handles))
    if adapters == [None]:
        with active_adapter(model, None):
            return infer_mels(model, ids, speakers, speeds), "base"
    if len(adapters) == 1:
        name, mergeable = adapters[0], handles[0].mergeable
        if mergeable and (merge is True or (merge == "auto" and len(ids) >= MERGE_MIN_BATCH)):
            merge_adapter(model, name)
            try:
                return infer_mels(model, ids, speakers, speeds), "merged"
            finally:
                unmerge_all(model)
                set_active(model, None)  # merge_adapter activated it
        with active_adapter(model, name):
            return infer_mels(model, ids, speakers, speeds), "active"
    bank = pack_bank(model, [a for a in adapters if a is not None])
    try:
        with banked(model, bank, [BASE if h.adapter is None else h.adapter for h in handles]):
            return infer_mels(model, ids, speakers, speeds), "bank"
    finally:
        bank.remove()


def synthesize_batch(
    engine: Engine, requests: Sequence[Request], merge: bool | str = "auto", vocode: bool = True
) -> list[ServedResult | Exception]:
    """Serve ``requests`` in one forward of the acoustic model (see the module docstring); returns a
    result or the exception for each request, in order. ``merge``: ``"auto"`` merges a single
    mergeable voice for batches of at least :data:`MERGE_MIN_BATCH` rows, True always, False never.
    ``vocode=False`` leaves ``audio`` empty (for timing the acoustic model alone)."""
    started = time.perf_counter()
    results: list[ServedResult | Exception | None] = [None] * len(requests)
    live = []
    for index, request in enumerate(requests):
        try:
            check_request(request)
            live.append(index)
        except Exception as error:  # noqa: BLE001 - reported to that request
            results[index] = error
    encoded = _encode(engine, [requests[i].text for i in live])
    ids = {}
    for index, seq in zip(live, encoded):
        if isinstance(seq, Exception):
            results[index] = seq
        else:
            ids[index] = seq
    with engine.using(requests[i].voice for i in ids) as (handles, errors):
        rows = []
        for index in ids:
            voice = requests[index].voice
            if voice in errors:
                results[index] = errors[voice]
            else:
                rows.append(index)
        groups, done = ([rows] if rows else []), []
        while groups:
            group = groups.pop()
            try:
                mels, path = _forward(
                    engine,
                    [handles[requests[i].voice] for i in group],
                    [ids[i] for i in group],
                    [float(requests[i].speed) for i in group],
                    merge,
                )
            except Exception as error:  # noqa: BLE001 - isolate the failing row
                if len(group) == 1:
                    results[group[0]] = error
                else:
                    groups.extend([i] for i in group)
                continue
            done.append((group, mels, path))
    # The vocoder does not touch the acoustic model: it runs outside the engine's lock.
    for group, mels, path in done:
        audio: list[np.ndarray | Exception] = [np.zeros(0, np.float32)] * len(mels)
        if vocode:
            filtered = [engine.synthesizer.postfilter(row.mel) for row in mels]  # as Synthesizer does
            try:
                audio = vocode_mels(engine.vocoder, filtered)
            except Exception:  # noqa: BLE001 - vocode each row to find the failing one
                audio = [_vocode_one(engine.vocoder, mel) for mel in filtered]
        for index, row, wave in zip(group, mels, audio):
            results[index] = (
                wave
                if isinstance(wave, Exception)
                else ServedResult(
                    wave,
                    engine.sample_rate,
                    0.0,
                    requests[index].voice,
                    mel=row.mel,
                    frames=row.frames,
                    batch_size=len(group),
                    path=path,
                )
            )
    elapsed = time.perf_counter() - started
    for result in results:
        if isinstance(result, ServedResult):
            result.seconds = elapsed
    return results


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

    def submit(self, text: str, voice: str, speed: float = 1.0, tenant: str = "") -> Future:
        """Queue a request of ``tenant``; the future gives a :class:`ServedResult` or raises its error
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
        self, text: str, voice: str, speed: float = 1.0, timeout: float | None = None, tenant: str = ""
    ) -> ServedResult:
        """Blocking: speak ``text`` in ``voice`` (a speaker name or an adapted voice id)."""
        return self.submit(text, voice, speed, tenant).result(timeout)

    async def synthesize_async(self, text: str, voice: str, speed: float = 1.0, tenant: str = "") -> ServedResult:
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
                results = synthesize_batch(self.engine, [p.request for p in batch], merge=self.merge)
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
