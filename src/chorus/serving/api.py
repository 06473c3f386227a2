"""The HTTP API of the multi-tenant voice server (FastAPI): the routes, on a :class:`VoiceServer` that
holds the engine (one resident base, adapted voices cached on demand), the batcher (concurrent requests
in one forward), the store (voices and jobs per tenant) and the onboarding worker.

Routes (all JSON errors are ``{"error": {"message", "type", "param", "code"}}``, as OpenAI's; the bodies
are the models of :mod:`chorus.serving.schemas`, shown at ``/docs``):

* ``POST /v1/audio/speech`` -- OpenAI-compatible: ``{"model", "input", "voice", "response_format",
  "speed", "instructions", "stream_format"}`` (+ Chorus's ``sample_rate``); ``wav`` | ``flac`` | ``mp3``
  | ``opus`` | ``aac`` | ``pcm`` (16-bit little-endian mono at 24 kHz, see ``X-Sample-Rate``). Text of
  several sentences is streamed (chunked) sentence by sentence as each is made, one encoder over the
  whole text; a streamed WAV's header says "unknown length" (sizes 0xFFFFFFFF). FLAC is sent whole.
  ``stream_format: "sse"`` sends OpenAI's ``speech.audio.delta`` / ``speech.audio.done`` events.
* ``POST /v1/audio/speech/captioned`` -- the same body; JSON with the audio (base64) and every word's
  and phoneme's start and end, from the durations the model predicted.
* ``GET /v1/voices``, ``GET /v1/voices/{id}``, ``DELETE /v1/voices/{id}`` -- the tenant's voices
  (with status) and the base's speakers.
* ``POST /v1/voices`` -- onboarding: multipart ``name``, ``consent``, optional ``id``, then either
  files ``clips`` + field ``transcripts`` (without it, the job transcribes the clips with Whisper)
  or one ``archive`` (LJSpeech-style zip); answers 202 with
  the job. ``GET /v1/jobs/{id}`` -- its status, progress and error; ``POST /v1/jobs/{id}/cancel`` stops
  it (training stops within about a second; deleting the voice does the same).
* ``GET /healthz``; ``GET /metrics`` (Prometheus).
* ``GET /`` -- a web page on these routes (speak, onboard a voice, follow its job): :mod:`chorus.serving.page`.

A tenant sees only its own voices: another tenant's voice is a 404 with the same message as one that
does not exist. An adapted voice reaches the engine by its key (:mod:`chorus.serving.voice_keys`).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from chorus.audio.encode import FORMATS, AudioStream, encode_whole, output_rate
from chorus.serving.batcher import SpeechQueue
from chorus.serving.engine import Engine
from chorus.serving.errors import ApiError, add_error_handlers, synthesis_error, voice_not_found
from chorus.serving.json_body import BodyError, loads_bounded
from chorus.serving.metrics import MetricsMiddleware
from chorus.serving.page import add_web_page
from chorus.serving.quotas import check_onboarding, quota_reached
from chorus.serving.schemas import (
    CONTENT_TYPES,
    MODEL_NAMES,
    PCM_RATE,
    AudioVoices,
    BaseVoice,
    CaptionedSpeech,
    CreatedJob,
    CustomVoice,
    ErrorBody,
    Health,
    Job,
    Liveness,
    ModelCard,
    ModelList,
    Onboarding,
    SpeechRequest,
    VoiceDeleted,
    VoiceList,
    VoiceName,
    parse_speech,
)
from chorus.serving.server import VoiceServer
from chorus.serving.settings import ServeConfig, ServerSettings
from chorus.serving.store import (
    FINISHED_JOB,
    JobNotFound,
    JobStatus,
    QuotaReached,
    VoiceConflict,
    VoiceNotFound,
    VoiceStatus,
    VoiceStore,
)
from chorus.serving.tenants import OPERATOR_TENANT, Tenants, check_bind
from chorus.serving.uploads import UploadError, UploadLimits, parse_transcripts, prepare_archive, prepare_clips
from chorus.serving.voice_keys import resolve_voice_key
from chorus.serving.worker import JobRunner, OnboardingJob
from chorus.text.sentences import estimated_seconds, speech_pieces
from chorus.text.ssml import Pause, SsmlError

log = logging.getLogger("chorus.serving.api")

JOB_ID = re.compile(r"[0-9a-f]{32}")
# What /docs shows for the routes' answers (they are built from these models; errors are ErrorBody).
_ERRORS = {status: {"model": ErrorBody} for status in (400, 401, 404, 409, 413, 415, 500)}


def silence(pause: Pause, rate: int) -> np.ndarray:
    """An SSML ``<break>`` as samples ``[samples]`` at ``rate``."""
    return np.zeros(pause.samples(rate), dtype=np.float32)


async def speech_events(audio: AsyncIterator[bytes], input_chars: int) -> AsyncIterator[bytes]:
    """OpenAI's speech stream as server-sent events: ``speech.audio.delta`` events carrying base64 audio,
    then ``speech.audio.done`` with the usage (characters stand in for tokens)."""
    async for data in audio:
        if data:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
    usage = {"input_tokens": input_chars, "output_tokens": 0, "total_tokens": input_chars}
    yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()


# Sentences of a streamed answer queued ahead of the one being sent (see the speech route).
STREAM_AHEAD = 3
# nginx's status for a request its client closed before the answer: logged, never seen by that client.
CLIENT_CLOSED_REQUEST = 499


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
        return loads_bounded(body)
    except BodyError as error:
        raise ApiError(400, str(error)) from None


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


def create_app(
    store: VoiceStore,
    engine: Engine,
    tenants: Tenants | None = None,
    settings: ServerSettings | None = None,
    *,
    jobs: JobRunner | None = None,
    batcher: SpeechQueue | None = None,
) -> FastAPI:
    """The FastAPI app of one server (:class:`VoiceServer` says what ``jobs`` and ``batcher`` default to).
    Starting it (its lifespan) recovers the store, starts the onboarding worker and resumes interrupted
    jobs; stopping it closes the worker, the batcher and the store."""
    server = VoiceServer(store, engine, tenants, settings, jobs=jobs, batcher=batcher)
    settings = server.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await run_in_threadpool(server.start)
            yield
        finally:
            await run_in_threadpool(server.close)

    app = FastAPI(
        title="Chorus voice server", lifespan=lifespan, docs_url="/docs", redoc_url=None, openapi_url="/openapi.json"
    )
    app.state.server = server
    app.add_middleware(MetricsMiddleware, metrics=lambda: server.metrics)
    add_error_handlers(app)

    # -- health and metrics
    def is_operator(request: Request) -> bool:
        """Whether the request may see server-wide figures: any request without keys configured, else
        only the operator tenant's key (``tenants.OPERATOR_TENANT``)."""
        if server.tenants.single_tenant:
            return True
        try:
            return server.authenticate(request) == OPERATOR_TENANT
        except ApiError:
            return False

    @app.get("/healthz", responses={200: {"model": Health | Liveness}})
    def healthz(request: Request):
        problem = server.store_problem() if server.started else None
        status = "starting" if not server.started else "degraded" if problem else "ok"
        if not is_operator(request):
            return Liveness(status=status).model_dump()
        stats = engine.stats()
        return Health(
            status=status,
            store_problem=problem,
            base_voices=len(engine.speakers),
            resident_voices=stats.resident_voices,
            resident_bytes=stats.resident_bytes,
            tenancy="single" if server.tenants.single_tenant else "keys",
            onboarding=Onboarding(queued=server.jobs.queued, running=server.jobs.running is not None),
        ).model_dump()

    @app.get("/metrics", responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})
    def metrics(request: Request):
        if not server.tenants.single_tenant and server.authenticate(request) != OPERATOR_TENANT:
            raise ApiError(
                403,
                f"/metrics needs the operator's key (tenant {OPERATOR_TENANT!r})",
                type="permission_error",
            )
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- speech
    async def speech_request(request: Request) -> tuple[str, SpeechRequest, str, list[str | Pause]]:
        """The tenant, the checked body, the engine's key of its voice, and what to read (text chunks and
        pauses)."""
        tenant = server.authenticate(request)
        body = parse_speech(await _read_json(request, settings.max_json_bytes), settings.max_text_chars)
        voice_key = await run_in_threadpool(server.engine_voice, tenant, body.voice)
        if not server.started:
            raise ApiError(503, "the server is starting", type="server_error")
        try:
            pieces = speech_pieces(body.input, settings.max_chunk_chars)
        except SsmlError as error:
            raise ApiError(400, str(error), param="input", code="unsupported_ssml") from None
        if not any(isinstance(p, str) for p in pieces):
            raise ApiError(400, "'input' has nothing to speak, only pauses", param="input")
        seconds = estimated_seconds(pieces, body.speed)
        if seconds > settings.max_output_seconds:
            raise ApiError(
                400,
                f"'input' would be about {seconds:.0f} s of audio or more (its breaks, and its text as read out); "
                f"at most {settings.max_output_seconds:g} s per request: split it into several",
                param="input",
                code="output_too_long",
            )
        return tenant, body, voice_key, pieces

    def output_rate_of(body: SpeechRequest) -> int:
        default = PCM_RATE if body.response_format == "pcm" else engine.sample_rate
        return output_rate(body.response_format, body.sample_rate or default)

    @app.post(
        "/v1/audio/speech",
        responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()}}, **_ERRORS},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}},
            }
        },
    )
    async def speech(request: Request):
        tenant, body, voice_key, pieces = await speech_request(request)
        batcher = server.batcher
        chunks = [p for p in pieces if isinstance(p, str)]
        first_index = next(i for i, p in enumerate(pieces) if isinstance(p, str))
        rate = engine.sample_rate
        audio_format = body.response_format
        out_rate = output_rate_of(body)
        server.metrics.characters.inc(len(body.input))
        headers = {"X-Sample-Rate": str(out_rate), "Cache-Control": "no-store"}
        media_type = CONTENT_TYPES[audio_format]

        # The first chunk is awaited before any byte is sent, so a bad voice or text is a clean 4xx.
        try:
            first = await batcher.synthesize_async(chunks[0], voice_key, body.speed, tenant)
        except Exception as error:  # noqa: BLE001 - mapped to a status and a message
            raise synthesis_error(error, body.voice) from None
        if body.stream_format == "audio" and (len(pieces) == 1 or not FORMATS[audio_format].streams):
            audio = []
            try:
                for index, piece in enumerate(pieces):
                    if isinstance(piece, Pause):
                        audio.append(silence(piece, rate))
                    elif index == first_index:
                        audio.append(first.audio)
                    elif await request.is_disconnected():  # nobody waits for the rest: make none of it
                        return Response(status_code=CLIENT_CLOSED_REQUEST)
                    else:
                        audio.append((await batcher.synthesize_async(piece, voice_key, body.speed, tenant)).audio)
            except Exception as error:  # noqa: BLE001
                raise synthesis_error(error, body.voice) from None
            whole = np.concatenate(audio)
            server.metrics.audio_seconds.inc(len(whole) / rate)
            data = encode_whole(whole, rate, audio_format, out_rate)
            return Response(data, media_type=media_type, headers=headers)
        # The rest are admitted as the stream is consumed, STREAM_AHEAD sentences ahead of the one being sent:
        # enough to batch while it plays, without one long text filling the queue before other requests.
        rest = iter(chunks[1:])
        futures: deque[Future] = deque()

        def admit() -> None:
            while len(futures) < STREAM_AHEAD and (chunk := next(rest, None)) is not None:
                futures.append(batcher.submit(chunk, voice_key, body.speed, tenant))

        admit()

        async def audio_bytes():
            """The file's bytes as each sentence is made: one encoder over the whole text."""
            encoder = AudioStream(audio_format, rate, out_rate)
            try:
                for index, piece in enumerate(pieces):
                    if isinstance(piece, Pause):
                        yield encoder.write(silence(piece, rate))
                        continue
                    if index == first_index:
                        result = first
                    else:
                        result = await asyncio.wrap_future(futures.popleft())
                        admit()
                    server.metrics.audio_seconds.inc(result.duration)
                    yield encoder.write(result.audio)
                yield encoder.close()
            except Exception:
                # Headers are gone: the only honest signal left is a stream cut short.
                log.exception("speech stream for voice %r failed mid-way", body.voice)
                raise
            finally:
                for future in futures:
                    future.cancel()

        if body.stream_format == "sse":
            return StreamingResponse(
                speech_events(audio_bytes(), len(body.input)), media_type="text/event-stream", headers=headers
            )
        return StreamingResponse(audio_bytes(), media_type=media_type, headers=headers)

    @app.post(
        "/v1/audio/speech/captioned",
        responses={200: {"model": CaptionedSpeech}, **_ERRORS},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}},
            }
        },
    )
    async def captioned_speech(request: Request):
        """Speech with word and phoneme timestamps (the model's predicted durations): the body of
        ``/v1/audio/speech``; the audio comes whole, base64 in JSON."""
        tenant, body, voice_key, pieces = await speech_request(request)
        rate, front_end = engine.sample_rate, engine.bundle.front_end
        seconds_per_frame = engine.bundle.mel_config.hop_length / rate
        audio, words, phonemes, offset = [], [], [], 0
        server.metrics.characters.inc(len(body.input))
        for piece in pieces:
            if isinstance(piece, Pause):
                audio.append(silence(piece, rate))
            elif await request.is_disconnected():  # nobody waits for the rest: make none of it
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            else:
                try:
                    result = await server.batcher.synthesize_async(piece, voice_key, body.speed, tenant)
                except Exception as error:  # noqa: BLE001 - mapped to a status and a message
                    raise synthesis_error(error, body.voice) from None
                said, sounds = await run_in_threadpool(front_end.timings, piece, result.frames, seconds_per_frame)
                words += [w.shifted(offset / rate) for w in said]
                phonemes += [p.shifted(offset / rate) for p in sounds]
                audio.append(result.audio)
            offset += len(audio[-1])
        whole = np.concatenate(audio)
        server.metrics.audio_seconds.inc(len(whole) / rate)
        out_rate = output_rate_of(body)
        return CaptionedSpeech(
            audio=base64.b64encode(encode_whole(whole, rate, body.response_format, out_rate)).decode(),
            response_format=body.response_format,
            sample_rate=out_rate,
            duration=round(len(whole) / rate, 4),
            words=[vars(w) for w in words],
            phonemes=[vars(p) for p in phonemes],
        ).model_dump()

    # -- what OpenAI clients look up
    @app.get("/v1/models", responses={200: {"model": ModelList}, **_ERRORS})
    def list_models(request: Request):
        server.authenticate(request)
        # Any model name is accepted by /v1/audio/speech; these are the ones clients offer.
        return ModelList(data=[ModelCard(id=name) for name in MODEL_NAMES]).model_dump()

    @app.get("/v1/audio/voices", responses={200: {"model": AudioVoices}, **_ERRORS})
    def audio_voices(request: Request):
        """Every name ``voice`` takes: the base's speakers, the aliases, the tenant's ready voices."""
        tenant = server.authenticate(request)
        ready = [r.voice_id for r in store.list_voices(tenant) if r.status == VoiceStatus.READY]
        names = list(dict.fromkeys(ready + list(server.aliases) + engine.speakers))
        return AudioVoices(
            voices=names,
            data=[
                VoiceName(id=name, kind="custom" if name in ready else "alias" if name in server.aliases else "base")
                for name in names
            ],
            aliases=server.aliases,
        ).model_dump()

    # -- voices
    @app.get("/v1/voices", responses={200: {"model": VoiceList}, **_ERRORS})
    def list_voices(request: Request):
        tenant = server.authenticate(request)
        resident = set(engine.resident())
        custom = [server.voice_json(r, resident) for r in store.list_voices(tenant)]
        return {"object": "list", "data": [server.speaker_json(name) for name in engine.speakers] + custom}

    @app.get("/v1/voices/{voice_id}", responses={200: {"model": BaseVoice | CustomVoice}, **_ERRORS})
    async def get_voice(voice_id: str, request: Request):
        tenant = server.authenticate(request)
        if engine.is_speaker(voice_id):
            return server.speaker_json(voice_id)
        record = server.record(tenant, voice_id)
        answer = server.voice_json(record, set(engine.resident()))
        if record.status == VoiceStatus.READY:
            answer["card"] = await run_in_threadpool(server.voice_card, tenant, voice_id)
        return answer

    @app.delete("/v1/voices/{voice_id}", responses={200: {"model": VoiceDeleted}, **_ERRORS})
    def delete_voice(voice_id: str, request: Request):
        tenant = server.authenticate(request)
        if engine.is_speaker(voice_id):
            raise ApiError(400, f"{voice_id!r} is a speaker of the model; it cannot be deleted", param="voice")
        server.check_voice_id(voice_id)
        try:
            store.delete_voice(tenant, voice_id)
        except VoiceNotFound:
            raise voice_not_found(voice_id) from None
        server.forget(tenant, voice_id)
        return VoiceDeleted(id=voice_id).model_dump()

    @app.post("/v1/voices", status_code=202, responses={202: {"model": CreatedJob}, **_ERRORS})
    async def create_voice(request: Request):
        tenant = server.authenticate(request)
        check_onboarding(store, tenant, settings.limits, server.jobs.queued)
        limits = settings.upload
        content_type = request.headers.get("content-type", "")
        if not content_type.lower().startswith("multipart/form-data"):
            raise ApiError(
                415,
                "expected a multipart/form-data upload (fields name, consent, and files 'clips' "
                f"with 'transcripts', or one 'archive'), got {content_type[:60] or 'none'!r}",
            )
        declared = request.headers.get("content-length")
        if not declared or not declared.isdigit():
            raise ApiError(411, "uploads need a Content-Length header")
        if int(declared) > limits.max_upload_bytes:
            raise ApiError(
                413, f"the upload is {int(declared)} bytes; at most {limits.max_upload_bytes}", type="request_too_large"
            )
        form = await request.form(
            max_files=limits.max_clips + 1, max_fields=16, max_part_size=max(1 << 20, 200 * limits.max_clips)
        )
        upload_dir = None
        try:
            name = (_form_text(form, "name", True, 100) or "").strip()
            if not name or not name.isprintable():
                raise ApiError(400, "'name' must be 1-100 printable characters", param="name")
            consent = (_form_text(form, "consent", False, 2_000) or "").strip()
            if len(consent) < 10:
                raise ApiError(
                    400,
                    "'consent' is required: a statement that the person recorded consented to a "
                    "synthetic voice made from these recordings (e.g. 'Jane Doe consented in "
                    "writing on 2024-05-01'); uploads without it are refused",
                    param="consent",
                    code="consent_required",
                )
            voice_id = (_form_text(form, "id", False, 64) or "").strip() or _slug(name)
            if not voice_id:
                raise ApiError(
                    400,
                    f"the name {name[:80]!r} has no letter or digit to make a voice id from: give an 'id' "
                    "(1-64 of a-z, 0-9, '_' and '-') or a name with a letter or digit",
                    param="name",
                )
            server.check_voice_id(voice_id, param="id")
            if engine.is_speaker(voice_id):
                raise ApiError(
                    409, f"{voice_id!r} is a speaker of the model; choose another id", param="id", type="conflict_error"
                )
            clips = [f for f in form.getlist("clips") if isinstance(f, UploadFile)]
            if len(clips) != len(form.getlist("clips")):
                raise ApiError(400, "'clips' must be files", param="clips")
            archive = form.get("archive")
            if archive is not None and not isinstance(archive, UploadFile):
                raise ApiError(400, "'archive' must be a file (a zip)", param="archive")
            if bool(clips) == (archive is not None):
                raise ApiError(
                    400, "send either files 'clips' (with 'transcripts') or one 'archive', not both or neither"
                )
            upload_dir = server.jobs.new_upload_dir()
            if clips:
                text = _form_text(form, "transcripts", False, limits.max_clips * (limits.max_transcript_chars + 300))
                # Without transcripts the job transcribes the clips with Whisper (long ones cut at silences).
                transcripts = parse_transcripts(text) if text is not None else None
                files = [await _read_upload(clip, limits) for clip in clips]
                prepared = await run_in_threadpool(prepare_clips, files, transcripts, upload_dir / "voice", limits)
            else:
                if archive.size is not None and archive.size > limits.max_upload_bytes:
                    raise UploadError("the archive is too large", 413)
                data = await archive.read(limits.max_upload_bytes + 1)
                prepared = await run_in_threadpool(prepare_archive, data, upload_dir / "voice", limits)
            own = settings.limits.of(tenant)
            try:  # the limits again, in the job's own transaction: another server may have taken the last place
                job_id = store.create_job(
                    tenant,
                    voice_id,
                    name=name,
                    method=settings.adapt.methods.spec,
                    max_active_jobs=own.active_jobs,
                    max_voices=own.voices,
                )
            except VoiceConflict as error:
                raise ApiError(409, str(error), type="conflict_error", param="id") from None
            except QuotaReached as error:
                raise quota_reached(error) from None
            await run_in_threadpool(  # it publishes the clips: an upload to the object store, off the event loop
                server.jobs.submit,
                upload_dir,
                OnboardingJob(job_id, tenant, voice_id, name),
                {
                    "statement": consent,
                    "clips": prepared.clips,
                    "seconds": prepared.seconds,
                    "audio_sha256": prepared.audio_sha256,
                },
            )
            upload_dir = None
            job = server.job_json(store.get_job(tenant, job_id))
            job.update(clips=prepared.clips, seconds=prepared.seconds)
            return JSONResponse(job, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})
        finally:
            if upload_dir is not None:
                server.jobs.discard(upload_dir)
            await form.close()

    @app.get("/v1/jobs/{job_id}", responses={200: {"model": Job}, **_ERRORS})
    def get_job(job_id: str, request: Request):
        tenant = server.authenticate(request)
        if not JOB_ID.fullmatch(job_id):
            raise ApiError(404, f"job {job_id[:80]!r} not found", type="not_found_error")
        try:
            return server.job_json(store.get_job(tenant, job_id))
        except JobNotFound:
            raise ApiError(404, f"job {job_id!r} not found", type="not_found_error") from None

    @app.post("/v1/jobs/{job_id}/cancel", responses={200: {"model": Job}, **_ERRORS})
    def cancel_job(job_id: str, request: Request):
        """Stop an onboarding job: a queued one never trains, a running one stops within about a second
        (the trainer checks at each progress write); its voice is marked failed and its files removed."""
        tenant = server.authenticate(request)
        if not JOB_ID.fullmatch(job_id):
            raise ApiError(404, f"job {job_id[:80]!r} not found", type="not_found_error")
        try:
            job = store.get_job(tenant, job_id)
            if job.status in FINISHED_JOB:
                raise ApiError(
                    409, f"job {job_id!r} is {job.status.value} already: nothing to cancel", type="conflict_error"
                )
            store.update_job(job_id, status=JobStatus.FAILED, message="cancelled by its tenant")
            return server.job_json(store.get_job(tenant, job_id))
        except JobNotFound:
            raise ApiError(404, f"job {job_id!r} not found", type="not_found_error") from None
        except ValueError:  # it ended between the two reads
            raise ApiError(409, f"job {job_id!r} ended already: nothing to cancel", type="conflict_error") from None

    add_web_page(app)
    return app


def serve(config: ServeConfig, announce: Callable[[str], None] = print, log_level: str = "info") -> None:
    """Run the server with uvicorn until interrupted (``chorus serve``)."""
    import uvicorn

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s:     %(name)s: %(message)s"
    )
    tenants = Tenants.load(config.keys)
    check_bind(config.host, tenants)
    voice_store = VoiceStore(config.store, config.database, config.cache_dir)
    engine = Engine.load(
        config.base,
        config.vocoder,
        config.device,
        resolve=functools.partial(resolve_voice_key, voice_store),
        cache_bytes=int(config.cache_mb * (1 << 20)),
    )
    app = create_app(voice_store, engine, tenants, config.settings)
    if tenants.single_tenant:
        announce(
            "no API keys configured: single-tenant mode (tenant 'default', no authentication), "
            f"loopback only ({config.host})"
        )
    else:
        announce(f"{len(tenants.names)} tenant(s) with API keys; requests need 'Authorization: Bearer KEY'")
    announce(
        f"{len(engine.speakers)} speakers (default {engine.bundle.default_speaker}); voice store: {config.store} "
        f"(metadata: {voice_store.database_url}); adapter cache {config.cache_mb:g} MB"
    )
    announce(f"OpenAI-compatible endpoint: http://{config.host}:{config.port}/v1 (audio.speech), voices at /v1/voices")
    uvicorn.run(app, host=config.host, port=config.port, log_level=log_level)
