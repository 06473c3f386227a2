"""The HTTP API of the multi-tenant voice server (FastAPI): routes only; the work is the engine's (one
resident base, adapted voices cached on demand), the batcher's (concurrent requests in one forward),
the store's (voices and jobs per tenant) and the onboarding worker's (:mod:`chorus.serving.jobs`).

Routes (all JSON errors are ``{"error": {"message", "type", "param", "code"}}``, as OpenAI's):

* ``POST /v1/audio/speech`` -- OpenAI-compatible: ``{"model", "input", "voice", "response_format",
  "speed"}``; ``wav`` | ``pcm`` (16-bit little-endian mono at the model's rate, see ``X-Sample-Rate``)
  | ``flac``. Text of several sentences is streamed (chunked) sentence by sentence as each is made;
  a streamed WAV's header says "unknown length" (sizes 0xFFFFFFFF). FLAC is sent whole.
* ``GET /v1/voices``, ``GET /v1/voices/{id}``, ``DELETE /v1/voices/{id}`` -- the tenant's voices
  (with status) and the base voices.
* ``POST /v1/voices`` -- onboarding: multipart ``name``, ``consent``, optional ``id``, then either
  files ``clips`` + field ``transcripts`` or one ``archive`` (LJSpeech-style zip); answers 202 with
  the job. ``GET /v1/jobs/{id}`` -- its status, progress and error.
* ``GET /healthz``; ``GET /metrics`` (Prometheus).
* ``GET /`` -- a web page on these routes (speak, onboard a voice, follow its job); see :func:`_add_web_page`.

A tenant sees only its own voices: another tenant's voice is a 404 with the same message as one that
does not exist. An adapted voice reaches the engine as ``<tenant>/<voice id>@<weights sha256 prefix>``,
so voices of different tenants never share a cache entry and a voice uploaded again under the same id
is a new entry, never the stale one.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
import json
import logging
import math
import re
import struct
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus.adapters.inject import adapter_names, remove_adapter
from chorus.adapters.voice import VoiceError
from chorus.models.bundle import ModelBundle
from chorus.serving.batcher import Batcher
from chorus.serving.engine import Engine, UnknownVoice
from chorus.serving.jobs import (
    JobRunner,
    UploadError,
    UploadLimits,
    parse_transcripts,
    prepare_archive,
    prepare_clips,
)
from chorus.serving.store import (
    InvalidId,
    JobNotFound,
    JobRecord,
    VoiceConflict,
    VoiceCorrupted,
    VoiceNotFound,
    VoiceNotReady,
    VoiceRecord,
    VoiceStatus,
    VoiceStore,
    check_id,
)
from chorus.serving.tenants import Tenants, Unauthorized, check_bind
from chorus.training.adapt import AdaptConfig

log = logging.getLogger("chorus.serving.api")

CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
MIN_SPEED, MAX_SPEED = 0.25, 4.0
JOB_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class ServerSettings:
    """Limits and knobs of one server."""

    max_text_chars: int = 2_000
    max_json_bytes: int = 64 << 10
    max_chunk_chars: int = 300            # a sentence longer than this is cut at a comma or space
    max_batch: int = 16
    max_wait_ms: float = 5.0
    upload: UploadLimits = field(default_factory=UploadLimits)
    adapt: AdaptConfig = field(default_factory=lambda: AdaptConfig(method="lora", steps=300, threads=1))
    jobs_dir: Path | None = None          # default: <store root>/.jobs (local store) or beside its database
    progress_interval: float = 1.0


class ApiError(Exception):
    """A refusal sent to the client as ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


def _error_response(status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                    code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _type_for(status: int) -> str:
    return {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 409: "conflict_error",
            413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")


# -- audio encoding ------------------------------------------------------------------------------
def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 16-bit mono PCM WAV header; ``data_bytes=None`` writes 0xFFFFFFFF sizes ("unknown length", for streams)."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", data))


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def encode_whole(audio: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    if response_format == "pcm":
        return pcm16(audio)
    if response_format == "wav":
        data = pcm16(audio)
        return wav_header(sample_rate, len(data)) + data
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(audio, -1.0, 1.0), sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


# -- text ----------------------------------------------------------------------------------------
_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|\s*\n\s*")
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|vs|etc|e\.g|i\.e|No|Fig|approx)|\b[A-Z])\.$",
                           re.IGNORECASE)


def split_sentences(text: str, max_chars: int = 300) -> list[str]:
    """Chunks to synthesize and stream one by one: sentences (not after abbreviations), pieces without a
    letter or digit joined to their neighbour, and overlong sentences cut at a comma or a space."""
    pieces = [p.strip() for p in _SENTENCE_BREAK.split(text) if p and p.strip()]
    sentences: list[str] = []
    for piece in pieces:
        if sentences and (not any(c.isalnum() for c in piece) or _ABBREVIATION.search(sentences[-1])):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    if len(sentences) > 1 and not any(c.isalnum() for c in sentences[0]):
        sentences[1] = f"{sentences.pop(0)} {sentences[0]}"
    chunks = []
    for sentence in sentences:
        while len(sentence) > max_chars:
            cut = max(sentence.rfind(", ", 0, max_chars), sentence.rfind(" ", 0, max_chars))
            cut = cut + 1 if cut > 0 else max_chars
            chunks.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            chunks.append(sentence)
    return chunks or [text.strip()]


@dataclass(frozen=True)
class SpeechRequest:
    input: str
    voice: str
    response_format: str
    speed: float
    model: str


def parse_speech(body: object, settings: ServerSettings) -> SpeechRequest:
    """Validate an OpenAI ``audio.speech`` body; raises :class:`ApiError` (400) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model", "chorus")
    if not isinstance(model, str) or len(model) > 200:
        raise ApiError(400, "'model' must be a string (any name is accepted, e.g. 'chorus')", param="model")
    text = body.get("input")
    if not isinstance(text, str):
        raise ApiError(400, "'input' is required: the text to speak, as a string", param="input")
    if not text.strip():
        raise ApiError(400, "'input' is empty", param="input")
    if len(text) > settings.max_text_chars:
        raise ApiError(400, f"'input' is {len(text)} characters; at most {settings.max_text_chars} per request",
                       param="input", code="input_too_long")
    voice = body.get("voice")
    if isinstance(voice, dict):   # OpenAI's custom voice reference {"id": ...}
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise ApiError(400, "'voice' is required: a base voice name or one of your voice ids", param="voice")
    response_format = body.get("response_format", "wav")
    if response_format not in CONTENT_TYPES:
        shown = response_format if isinstance(response_format, str) else type(response_format).__name__
        raise ApiError(400, f"unsupported response_format {str(shown)[:40]!r}: use one of {', '.join(CONTENT_TYPES)}",
                       param="response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed) \
            or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ApiError(400, f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}", param="speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format != "audio":
        raise ApiError(400, "only stream_format 'audio' is supported (no server-sent events)", param="stream_format")
    return SpeechRequest(text, voice, response_format, float(speed), model)


# -- metrics -------------------------------------------------------------------------------------
class Metrics:
    """Prometheus metrics of one server, in a registry of its own."""

    def __init__(self, server: VoiceServer):
        self.registry = CollectorRegistry()
        self.requests = Counter("chorus_http_requests", "HTTP requests by route template, method and status",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("chorus_http_request_seconds", "Time to the end of the response, by route",
                                 ["route"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.audio_seconds = Counter("chorus_speech_audio_seconds", "Seconds of audio synthesized",
                                     registry=self.registry)
        self.characters = Counter("chorus_speech_characters", "Characters of text synthesized", registry=self.registry)
        ProcessCollector(registry=self.registry)   # process_resident_memory_bytes, cpu seconds, open fds
        self.registry.register(_ServerCollector(server))


class _ServerCollector:
    """Engine cache and batcher counters, read at scrape time."""

    def __init__(self, server: VoiceServer):
        self.server = server

    def collect(self):
        stats = self.server.engine.stats()
        for name, value, text in [("hits", stats.hits, "batches that found an adapted voice resident"),
                                  ("misses", stats.misses, "batches that had to load an adapted voice"),
                                  ("loads", stats.loads, "adapted voices loaded into the model"),
                                  ("load_failures", stats.load_failures, "adapted voice loads that failed"),
                                  ("evictions", stats.evictions, "adapted voices evicted from the model")]:
            yield CounterMetricFamily(f"chorus_cache_{name}", f"Voice cache: {text}", value=value)
        yield CounterMetricFamily("chorus_cache_load_seconds", "Time spent loading voices", value=stats.load_seconds)
        yield GaugeMetricFamily("chorus_cache_resident_bytes", "Bytes of adapter tensors resident",
                                value=stats.resident_bytes)
        yield GaugeMetricFamily("chorus_cache_resident_voices", "Adapted voices resident", value=stats.resident_voices)
        yield GaugeMetricFamily("chorus_cache_capacity_bytes", "Adapter cache budget", value=stats.capacity_bytes)
        batcher = self.server.batcher
        if batcher is not None:
            b = batcher.stats
            sizes = dict(b.batch_sizes)
            bounds = [1, 2, 4, 8, 16, 32, 64]
            buckets = [(str(le), sum(c for s, c in sizes.items() if s <= le)) for le in bounds]
            buckets.append(("+Inf", sum(sizes.values())))
            yield HistogramMetricFamily("chorus_batch_size", "Requests per forward of the acoustic model",
                                        buckets=buckets, sum_value=sum(s * c for s, c in sizes.items()))
            for name, value in [("requests", b.requests), ("completed", b.completed), ("failed", b.failed)]:
                yield CounterMetricFamily(f"chorus_batcher_{name}", f"Batcher requests {name}", value=value)
            yield CounterMetricFamily("chorus_batcher_busy_seconds", "Batcher worker time in batches",
                                      value=b.busy_seconds)
            paths = CounterMetricFamily("chorus_batches_by_path", "Batches by path", labels=["path"])
            for path, count in b.paths.items():
                paths.add_metric([path], count)
            yield paths
        yield GaugeMetricFamily("chorus_onboarding_queued", "Onboarding jobs waiting", value=self.server.jobs.queued)
        yield GaugeMetricFamily("chorus_onboarding_running", "Onboarding jobs running",
                                value=int(self.server.jobs.running is not None))


class _MetricsMiddleware:
    """Counts every HTTP request by route template (never by voice id or tenant) and status."""

    def __init__(self, app, metrics: Callable[[], Metrics]):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics = self.metrics()
            metrics.requests.labels(route=route, method=scope.get("method", ""), status=str(status[0])).inc()
            metrics.latency.labels(route=route).observe(time.perf_counter() - started)


# -- the server ----------------------------------------------------------------------------------
class VoiceServer:
    """The state behind the routes: store, engine, batcher, onboarding worker, tenants, metrics.

    Takes over ``engine.resolve``: adapted voices are ``<tenant>/<voice>@<sha256 prefix>`` keys that
    it maps to ``store.get_voice``.
    """

    def __init__(self, store: VoiceStore, engine: Engine, tenants: Tenants | None = None,
                 settings: ServerSettings | None = None):
        self.store = store
        self.engine = engine
        self.tenants = tenants or Tenants()
        self.settings = settings or ServerSettings()
        engine.resolve = self.resolve
        self.batcher: Batcher | None = None
        jobs_dir = self.settings.jobs_dir
        if jobs_dir is None:
            # A dot folder: the store's recovery only looks at tenant folders (ids never start with a dot).
            jobs_dir = Path(store.root) / ".jobs" if store.local else store.cache_dir.parent / ".jobs"
        self.jobs = JobRunner(store, jobs_dir, self.training_bundle, self.settings.adapt,
                              progress_interval=self.settings.progress_interval)
        self.metrics = Metrics(self)

    # -- lifecycle
    def start(self) -> None:
        report = self.store.recover()
        if any(dataclasses.asdict(report).values()):
            log.warning("store recovery: %s", report)
        self.batcher = Batcher(self.engine, max_batch=self.settings.max_batch, max_wait_ms=self.settings.max_wait_ms)
        self.jobs.start()
        self.jobs.resume()

    def close(self) -> None:
        self.jobs.close()
        if self.batcher is not None:
            self.batcher.close(timeout=30)

    # -- voices
    @staticmethod
    def key(record: VoiceRecord) -> str:
        return f"{record.tenant}/{record.voice_id}@{(record.sha256 or '')[:16]}"

    def resolve(self, key: str) -> Path:
        """Engine callback: the local folder of adapted voice ``key``; ``KeyError`` if it is gone or changed."""
        tenant, _, rest = key.partition("/")
        voice_id, _, digest = rest.rpartition("@")
        try:
            record = self.store.voice(tenant, voice_id)
        except InvalidId as error:
            raise KeyError(str(error)) from None
        if record.status != VoiceStatus.READY or (record.sha256 or "")[:16] != digest:
            raise KeyError(f"voice {voice_id!r} changed")
        return self.store.get_voice(tenant, voice_id)

    def training_bundle(self) -> ModelBundle:
        """A private copy of the base for one adaptation (``adapt`` adds its adapter to the model it gets)."""
        with self.engine.lock:   # never copy mid-batch (a merged adapter would be copied in)
            model = copy.deepcopy(self.engine.model)
        for name in adapter_names(model):
            remove_adapter(model, name)
        return dataclasses.replace(self.engine.bundle, model=model)

    def check_voice_id(self, voice_id: str, param: str = "voice") -> str:
        try:
            return check_id(voice_id)
        except InvalidId:
            raise ApiError(400, f"invalid voice id {voice_id[:80]!r}: use 1-64 of a-z, 0-9, '_' and '-', starting "
                                f"with a letter or digit", param=param) from None

    def record(self, tenant: str, voice_id: str) -> VoiceRecord:
        self.check_voice_id(voice_id)
        try:
            return self.store.voice(tenant, voice_id)
        except VoiceNotFound:
            raise self.not_found(voice_id) from None

    @staticmethod
    def not_found(voice_id: str) -> ApiError:
        # The same words whether the voice never existed or belongs to another tenant.
        return ApiError(404, f"voice {voice_id[:80]!r} not found", type="not_found_error", param="voice",
                        code="voice_not_found")

    def engine_voice(self, tenant: str, voice_id: str) -> str:
        """What to ask the engine for: a base voice name or the key of the tenant's ready voice."""
        if self.engine.is_base(voice_id):
            return voice_id
        record = self.record(tenant, voice_id)
        if record.status == VoiceStatus.TRAINING:
            raise ApiError(409, f"voice {voice_id!r} is still training (job {record.job_id})", type="conflict_error",
                           param="voice", code="voice_not_ready")
        if record.status != VoiceStatus.READY:
            raise ApiError(409, f"voice {voice_id!r} is {record.status.value}: {self.public(record.error or '')}",
                           type="conflict_error", param="voice", code="voice_not_ready")
        return self.key(record)

    def public(self, message: str) -> str:
        """A message with server paths taken out."""
        for path, name in [(str(self.jobs.jobs_dir), "<jobs>"), (self.store.root, "<store>")]:
            message = message.replace(path, name)
        return message

    def voice_json(self, record: VoiceRecord, resident: set[str]) -> dict:
        return {"id": record.voice_id, "object": "voice", "type": "custom", "name": record.name,
                "status": record.status.value, "created": int(record.created), "updated": int(record.updated),
                "method": record.method, "size_bytes": record.size_bytes, "job_id": record.job_id,
                "error": self.public(record.error) if record.error else None,
                "resident": self.key(record) in resident}

    def base_json(self, name: str) -> dict:
        return {"id": name, "object": "voice", "type": "base", "name": name, "status": "ready",
                "default": name == self.engine.bundle.default_speaker, "resident": True}

    def job_json(self, job: JobRecord) -> dict:
        message = self.public(job.message) if job.message else None
        return {"id": job.job_id, "object": "voice.job", "voice": job.voice_id, "status": job.status.value,
                "progress": round(job.progress, 3), "message": message,
                "error": message if job.status.value in ("failed", "interrupted") else None,
                "created": int(job.created), "updated": int(job.updated)}

    def forget(self, tenant: str, voice_id: str) -> None:
        """Drop every resident version of a deleted voice from the model (one in use goes at eviction)."""
        prefix = f"{tenant}/{voice_id}@"
        for key in self.engine.resident():
            if key.startswith(prefix):
                try:
                    self.engine.unload(key)
                except RuntimeError:
                    pass

    def authenticate(self, request: Request) -> str:
        try:
            return self.tenants.authenticate(request.headers.get("authorization"))
        except Unauthorized as error:
            raise ApiError(401, str(error), type="authentication_error", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"}) from None


def _synthesis_error(error: BaseException, voice: str) -> ApiError:
    if isinstance(error, UnknownVoice):
        return VoiceServer.not_found(voice)
    if isinstance(error, VoiceNotReady):
        return ApiError(409, f"voice {voice!r} is not ready (GET /v1/voices/{voice} says why)", type="conflict_error",
                        param="voice", code="voice_not_ready")
    if isinstance(error, VoiceCorrupted):
        return ApiError(409, f"voice {voice!r} failed its checksum and is marked failed; upload it again",
                        type="conflict_error", param="voice", code="voice_corrupted")
    if isinstance(error, VoiceError):   # a folder this base cannot load; its message names server paths
        log.warning("voice %r could not be loaded: %s", voice, error)
        return ApiError(409, f"voice {voice!r} cannot be loaded on this server's base model (see the server log)",
                        type="conflict_error", param="voice", code="voice_unloadable")
    if isinstance(error, (ValueError, TypeError)):   # e.g. nothing speakable in the text
        log.info("speech refused: %s", error)
        return ApiError(400, str(error)[:300], param="input")
    log.error("synthesis failed", exc_info=error)
    return ApiError(500, "synthesis failed (see the server log)", type="server_error")


async def _read_json(request: Request, limit: int) -> object:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, f"expected Content-Type application/json, got {content_type[:60] or 'none'!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is over {limit} bytes", type="request_too_large")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", type="request_too_large")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None


def _form_text(form, name: str, required: bool, max_chars: int) -> str | None:
    value = form.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"the form field {name!r} is required", param=name)
        return None
    if isinstance(value, UploadFile):
        raise ApiError(400, f"{name!r} must be a text field, not a file", param=name)
    if len(value) > max_chars:
        raise ApiError(413 if name == "transcripts" else 400, f"{name!r} is over {max_chars} characters", param=name)
    return value


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:64]


async def _read_upload(upload: UploadFile, limits: UploadLimits) -> tuple[str, bytes]:
    data = await upload.read(limits.max_clip_bytes + 1)
    if len(data) > limits.max_clip_bytes:
        raise UploadError(f"{(upload.filename or 'a file')[:100]}: over {limits.max_clip_bytes} bytes", 413)
    return upload.filename or "", data


def create_app(store: VoiceStore, engine: Engine, tenants: Tenants | None = None,
               settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app of one server. Starting it (its lifespan) recovers the store, starts the batcher
    and the onboarding worker and resumes interrupted jobs; stopping it closes them."""
    server = VoiceServer(store, engine, tenants, settings)
    settings = server.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(server.start)
        try:
            yield
        finally:
            await run_in_threadpool(server.close)

    app = FastAPI(title="Chorus voice server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(_MetricsMiddleware, metrics=lambda: server.metrics)

    # -- errors: always JSON, never a stack trace
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return _error_response(error.status, error.message, error.type, error.param, error.code, error.headers)

    @app.exception_handler(UploadError)
    async def upload_error(request: Request, error: UploadError):
        return _error_response(error.status, str(error), _type_for(error.status))

    @app.exception_handler(InvalidId)
    async def invalid_id(request: Request, error: InvalidId):
        return _error_response(400, str(error))

    @app.exception_handler(VoiceNotFound)
    @app.exception_handler(JobNotFound)
    async def not_found(request: Request, error: KeyError):
        return _error_response(404, str(error.args[0]) if error.args else "not found", "not_found_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        message = error.detail if isinstance(error.detail, str) else "request refused"
        if error.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path[:100]}"
        return _error_response(error.status_code, message, _type_for(error.status_code), headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in error.errors()]
        return _error_response(400, "; ".join(parts)[:500] or "invalid request")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception):
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=error)
        return _error_response(500, "internal server error (logged on the server)", "server_error")

    # -- health and metrics
    @app.get("/healthz")
    def healthz():
        stats = engine.stats()
        return {"status": "ok" if server.batcher is not None else "starting", "base_voices": len(engine.base_voices),
                "resident_voices": stats.resident_voices, "resident_bytes": stats.resident_bytes,
                "tenancy": "single" if server.tenants.single_tenant else "keys",
                "onboarding": {"queued": server.jobs.queued, "running": server.jobs.running is not None}}

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- speech
    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        tenant = server.authenticate(request)
        body = parse_speech(await _read_json(request, settings.max_json_bytes), settings)
        voice_key = await run_in_threadpool(server.engine_voice, tenant, body.voice)
        batcher = server.batcher
        if batcher is None:
            raise ApiError(503, "the server is starting", type="server_error")
        chunks = split_sentences(body.input, settings.max_chunk_chars)
        rate = engine.sample_rate
        server.metrics.characters.inc(len(body.input))
        headers = {"X-Sample-Rate": str(rate), "Cache-Control": "no-store"}
        media_type = CONTENT_TYPES[body.response_format]
        # The first chunk is awaited before any byte is sent, so a bad voice or text is a clean 4xx.
        try:
            first = await batcher.synthesize_async(chunks[0], voice_key, body.speed)
        except Exception as error:  # noqa: BLE001 - mapped to a status and a message
            raise _synthesis_error(error, body.voice) from None
        if len(chunks) == 1 or body.response_format == "flac":
            audio = [first.audio]
            try:
                for chunk in chunks[1:]:
                    audio.append((await batcher.synthesize_async(chunk, voice_key, body.speed)).audio)
            except Exception as error:  # noqa: BLE001
                raise _synthesis_error(error, body.voice) from None
            whole = np.concatenate(audio)
            server.metrics.audio_seconds.inc(len(whole) / rate)
            return Response(encode_whole(whole, rate, body.response_format), media_type=media_type, headers=headers)
        # The rest are queued together once the first is out: they batch into one forward while it streams.
        futures = [batcher.submit(chunk, voice_key, body.speed) for chunk in chunks[1:]]

        async def stream():
            try:
                if body.response_format == "wav":
                    yield wav_header(rate)
                yield pcm16(first.audio)
                server.metrics.audio_seconds.inc(first.duration)
                for future in futures:
                    result = await asyncio.wrap_future(future)
                    server.metrics.audio_seconds.inc(result.duration)
                    yield pcm16(result.audio)
            except Exception:
                # Headers are gone: the only honest signal left is a stream cut short.
                log.exception("speech stream for voice %r failed mid-way", body.voice)
                raise
            finally:
                for future in futures:
                    future.cancel()

        return StreamingResponse(stream(), media_type=media_type, headers=headers)

    # -- voices
    @app.get("/v1/voices")
    def list_voices(request: Request):
        tenant = server.authenticate(request)
        resident = set(engine.resident())
        custom = [server.voice_json(r, resident) for r in store.list_voices(tenant)]
        return {"object": "list", "data": [server.base_json(name) for name in engine.base_voices] + custom}

    @app.get("/v1/voices/{voice_id}")
    def get_voice(voice_id: str, request: Request):
        tenant = server.authenticate(request)
        if engine.is_base(voice_id):
            return server.base_json(voice_id)
        return server.voice_json(server.record(tenant, voice_id), set(engine.resident()))

    @app.delete("/v1/voices/{voice_id}")
    def delete_voice(voice_id: str, request: Request):
        tenant = server.authenticate(request)
        if engine.is_base(voice_id):
            raise ApiError(400, f"{voice_id!r} is a base voice of the model; it cannot be deleted", param="voice")
        server.check_voice_id(voice_id)
        try:
            store.delete_voice(tenant, voice_id)
        except VoiceNotFound:
            raise server.not_found(voice_id) from None
        server.forget(tenant, voice_id)
        return {"id": voice_id, "object": "voice.deleted", "deleted": True}

    @app.post("/v1/voices", status_code=202)
    async def create_voice(request: Request):
        tenant = server.authenticate(request)
        limits = settings.upload
        content_type = request.headers.get("content-type", "")
        if not content_type.lower().startswith("multipart/form-data"):
            raise ApiError(415, "expected a multipart/form-data upload (fields name, consent, and files 'clips' "
                                f"with 'transcripts', or one 'archive'), got {content_type[:60] or 'none'!r}")
        declared = request.headers.get("content-length")
        if not declared or not declared.isdigit():
            raise ApiError(411, "uploads need a Content-Length header")
        if int(declared) > limits.max_upload_bytes:
            raise ApiError(413, f"the upload is {int(declared)} bytes; at most {limits.max_upload_bytes}",
                           type="request_too_large")
        form = await request.form(max_files=limits.max_clips + 1, max_fields=16,
                                  max_part_size=max(1 << 20, 200 * limits.max_clips))
        upload_dir = None
        try:
            name = (_form_text(form, "name", True, 100) or "").strip()
            if not name or not name.isprintable():
                raise ApiError(400, "'name' must be 1-100 printable characters", param="name")
            consent = (_form_text(form, "consent", False, 2_000) or "").strip()
            if len(consent) < 10:
                raise ApiError(400, "'consent' is required: a statement that the speaker consented to a synthetic "
                                    "voice made from these recordings (e.g. 'Jane Doe consented in writing on "
                                    "2024-05-01'); uploads without it are refused", param="consent",
                               code="consent_required")
            voice_id = (_form_text(form, "id", False, 64) or "").strip() or _slug(name)
            server.check_voice_id(voice_id, param="id")
            if engine.is_base(voice_id):
                raise ApiError(409, f"{voice_id!r} is a base voice of the model; choose another id", param="id",
                               type="conflict_error")
            clips = [f for f in form.getlist("clips") if isinstance(f, UploadFile)]
            if len(clips) != len(form.getlist("clips")):
                raise ApiError(400, "'clips' must be files", param="clips")
            archive = form.get("archive")
            if archive is not None and not isinstance(archive, UploadFile):
                raise ApiError(400, "'archive' must be a file (a zip)", param="archive")
            if bool(clips) == (archive is not None):
                raise ApiError(400, "send either files 'clips' (with 'transcripts') or one 'archive', not both or neither")
            upload_dir = server.jobs.new_upload_dir()
            if clips:
                text = _form_text(form, "transcripts", True, limits.max_clips * (limits.max_transcript_chars + 300))
                transcripts = parse_transcripts(text)
                files = [await _read_upload(clip, limits) for clip in clips]
                prepared = await run_in_threadpool(prepare_clips, files, transcripts, upload_dir / "voice", limits)
            else:
                if archive.size is not None and archive.size > limits.max_upload_bytes:
                    raise UploadError("the archive is too large", 413)
                data = await archive.read(limits.max_upload_bytes + 1)
                prepared = await run_in_threadpool(prepare_archive, data, upload_dir / "voice", limits)
            try:
                job_id = store.create_job(tenant, voice_id, name=name, method=settings.adapt.method)
            except VoiceConflict as error:
                raise ApiError(409, str(error), type="conflict_error", param="id") from None
            server.jobs.submit(upload_dir, job_id, tenant, voice_id, name,
                               {"statement": consent, "clips": prepared.clips, "seconds": prepared.seconds,
                                "audio_sha256": prepared.audio_sha256})
            upload_dir = None
            job = server.job_json(store.get_job(tenant, job_id))
            job.update(clips=prepared.clips, seconds=prepared.seconds)
            return JSONResponse(job, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})
        finally:
            if upload_dir is not None:
                server.jobs.discard(upload_dir)
            await form.close()

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, request: Request):
        tenant = server.authenticate(request)
        if not JOB_ID.fullmatch(job_id):
            raise ApiError(404, f"job {job_id[:80]!r} not found", type="not_found_error")
        try:
            return server.job_json(store.get_job(tenant, job_id))
        except JobNotFound:
            raise ApiError(404, f"job {job_id!r} not found", type="not_found_error") from None

    _add_web_page(app)
    return app


# -- the web page --------------------------------------------------------------------------------
WEB_DIR = Path(__file__).parent / "web"
WEB_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
             "style.css": "text/css; charset=utf-8"}
# The page runs only its own script and style and calls only this server (no CDN, no inline code);
# synthesized audio plays from blob: URLs.
WEB_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
           "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'")


def _add_web_page(app: FastAPI) -> None:
    """``GET /``: the web page (``serving/web/``: plain HTML, CSS and JavaScript, no build step), and its
    files at ``GET /web/{name}``. They need no key: the page sends the key typed into it with each API call."""

    def web_file(name: str) -> Response:
        try:
            content = (WEB_DIR / name).read_bytes()
        except OSError:
            raise ApiError(404, f"the web page file {name!r} is missing from this installation",
                           type="not_found_error") from None
        return Response(content, media_type=WEB_FILES[name],
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": WEB_CSP,
                                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    @app.get("/", include_in_schema=False)
    def web_page():
        return web_file("index.html")

    @app.get("/web/{name}", include_in_schema=False)
    def web_asset(name: str):
        if name not in WEB_FILES:
            raise ApiError(404, f"no web page file {name[:80]!r}", type="not_found_error")
        return web_file(name)


def serve(store: str, host: str = "127.0.0.1", port: int = 8000, base: str | Path | None = None,
          vocoder: str | None = None, keys: str | Path | None = None, cache_mb: float = 64.0,
          settings: ServerSettings | None = None, announce: Callable[[str], None] = print,
          log_level: str = "info") -> None:
    """Run the server with uvicorn until interrupted (``chorus serve``)."""
    import uvicorn

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(levelname)s:     %(name)s: %(message)s")
    tenants = Tenants.load(keys)
    check_bind(host, tenants)
    if cache_mb < 0:
        raise ValueError(f"--cache-mb must be >= 0, got {cache_mb}")
    voice_store = VoiceStore(store)
    engine = Engine.load(base, vocoder, cache_bytes=int(cache_mb * (1 << 20)))
    app = create_app(voice_store, engine, tenants, settings)
    if tenants.single_tenant:
        announce(f"no API keys configured: single-tenant mode (tenant 'default', no authentication), "
                 f"loopback only ({host})")
    else:
        announce(f"{len(tenants.names)} tenant(s) with API keys; requests need 'Authorization: Bearer KEY'")
    announce(f"{len(engine.base_voices)} base voices (default {engine.bundle.default_speaker}); voice store: {store}; "
             f"adapter cache {cache_mb:g} MB")
    announce(f"OpenAI-compatible endpoint: http://{host}:{port}/v1 (audio.speech), voices at /v1/voices")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
