"""Speech: ``POST /v1/audio/speech`` (OpenAI-compatible) and ``POST /v1/audio/speech/captioned``.

The body is ``{"model", "input", "voice", "response_format", "speed", "instructions", "stream_format"}``
(+ Chorus's ``sample_rate``); ``model`` one of :data:`~chorus.serving.schemas.models.MODEL_NAMES`; ``mp3`` (the default, as OpenAI's) |
``wav`` | ``flac`` | ``opus`` | ``aac`` | ``pcm`` (16-bit little-endian mono at 24 kHz, see ``X-Sample-Rate``). The voice is resolved once per request
(:meth:`ServerState.resolve_voice`) and the text laid out as the library lays it out
(:func:`chorus.synthesis.timeline.layout`: sentences, the silence between them, SSML breaks), so the same
text and voice give the same samples as ``chorus synthesize``. Text of several sentences is streamed
(chunked) sentence by sentence as each is made, one encoder over the whole text; a streamed WAV's header
says "unknown length" (sizes 0xFFFFFFFF), as OpenAI's does. Text of one sentence (SSML breaks around it or
not) is known whole once that sentence is made, before any byte goes out: it is sent whole, a WAV with its
true sizes. FLAC is sent whole, and so is any format when the body says ``"stream": false`` (Chorus's
extension, for readers that trust a WAV's sizes). ``stream_format: "sse"`` sends OpenAI's
``speech.audio.delta`` / ``speech.audio.done`` events. The captioned route answers JSON with the audio
(base64) and every word's and phoneme's start and end, from the durations the model predicted.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import aclosing
from dataclasses import dataclass
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from chorus.audio.encode import FORMATS, AudioStream, encode_whole, output_rate
from chorus.serving.engine import EngineVoice
from chorus.serving.errors import ApiError, synthesis_error
from chorus.serving.routes.deps import ERRORS, Server, Tenant, read_json
from chorus.serving.schemas.speech import (
    CONTENT_TYPES,
    PCM_RATE,
    CaptionedSpeech,
    SpeechRequest,
    parse_speech,
    read_instructions,
)
from chorus.serving.server import ServerState
from chorus.serving.settings import ServerSettings
from chorus.synthesis.result import SynthesisResult
from chorus.synthesis.timeline import Timeline, layout, silence
from chorus.text import dropped_characters
from chorus.text.sentences import estimated_seconds
from chorus.text.ssml import Pause, SsmlError

log = logging.getLogger("chorus.serving.speech")

router = APIRouter()

# Sentences of a streamed answer queued ahead of the one being sent (see :func:`_streamed`).
STREAM_AHEAD = 3
# nginx's status for a request its client closed before the answer: logged, never seen by that client.
CLIENT_CLOSED_REQUEST = 499

_BODY = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}}}
}


@dataclass
class CheckedSpeech:
    """A checked speech request: whose, its body, its voice (resolved once), what to read, in order, the
    chunks of its text left out for having nothing to say, and the characters left out of the chunks read
    (no spoken form: "你好" inside an English sentence, an emoji)."""

    tenant: str
    body: SpeechRequest
    voice: EngineVoice
    pieces: list[str | Pause]
    skipped: list[str]
    dropped: list[str]

    def headers(self, out_rate: int) -> dict[str, str]:
        """What the answer says beside its audio: the rate sent, and what of the request it did not follow."""
        headers = {"X-Sample-Rate": str(out_rate), "Cache-Control": "no-store"}
        ignored = read_instructions(self.body.instructions).ignored if self.body.instructions else ()
        if ignored:
            headers["X-Instructions-Ignored"] = _header_text("; ".join(ignored))
        if self.skipped:
            headers["X-Skipped-Text"] = _header_text(" ".join(self.skipped))
        if self.dropped:  # each once, in the order they came, so a reader finds them in the text
            headers["X-Dropped-Characters"] = _header_text("".join(dict.fromkeys(self.dropped)))
        return headers

    def synthesize(self, server: ServerState, text: str):
        """The awaitable result of one sentence."""
        return server.batcher.synthesize_async(text, self.voice, self.body.speed, self.tenant)

    def failed(self, error: Exception) -> ApiError:
        return synthesis_error(error, self.body.voice)


async def checked_speech(request: Request, tenant: str, server: ServerState) -> CheckedSpeech:
    settings = server.settings
    return await check_speech(
        parse_speech(await read_json(request, settings.max_json_bytes), settings.max_text_chars), tenant, server
    )


async def check_speech(body: SpeechRequest, tenant: str, server: ServerState) -> CheckedSpeech:
    """``body``, parsed, checked against the server: its voice resolved, its text laid out and bounded."""
    settings = server.settings
    voice = await run_in_threadpool(server.resolve_voice, tenant, body.voice)
    if not server.started:
        raise ApiError(503, "the server is starting", type="server_error")
    # Laying out 4,096 characters of "1. 1. ..." takes 0.2-0.45 s of CPU (a security probe: on the event loop,
    # refused requests within one tenant's rate stalled every other request for seconds).
    pieces, skipped, dropped = await run_in_threadpool(_laid_out, body, settings)
    server.metrics.characters.labels(tenant=tenant).inc(len(body.input))
    return CheckedSpeech(tenant, body, voice, pieces, skipped, dropped)


def _laid_out(body: SpeechRequest, settings: ServerSettings) -> tuple[list[str | Pause], list[str], list[str]]:
    """``body.input`` as sentences and pauses, the pieces skipped as unreadable and the characters dropped;
    ``ApiError`` 400 for SSML Chorus does not read, nothing speakable, or more than the longest answer."""
    skipped: list[str] = []
    try:
        pieces = layout(body.input, settings.max_chunk_chars, skipped=skipped)
    except SsmlError as error:
        raise ApiError(400, str(error), param="input", code="unsupported_ssml") from None
    if not any(isinstance(p, str) for p in pieces):
        what = f"only text this model cannot read ({' '.join(skipped)[:80]!r})" if skipped else "only pauses"
        raise ApiError(400, f"'input' has nothing speakable: {what}", param="input")
    seconds = estimated_seconds(pieces, body.speed)
    if seconds > settings.max_output_seconds:
        raise ApiError(
            400,
            f"'input' would be about {seconds:.0f} s of audio or more (its breaks, and its text as read out); "
            f"at most {settings.max_output_seconds:g} s per request: split it into several",
            param="input",
            code="output_too_long",
        )
    dropped = [char for piece in pieces if isinstance(piece, str) for char in dropped_characters(piece)]
    return pieces, skipped, dropped


# Printable ASCII but "%" stays as it is in a header value; the rest is percent-encoded UTF-8.
_HEADER_SAFE = "".join(chr(c) for c in range(32, 127) if chr(c) != "%")


def _header_text(text: str, limit: int = 300) -> str:
    """``text`` as a header value (HTTP headers carry latin-1, no line breaks): percent-encoded UTF-8
    beyond printable ASCII, so ``urllib.parse.unquote`` gives the text back ("你好" -> "%E4%BD%A0%E5%A5%BD")."""
    return quote(text[:limit], safe=_HEADER_SAFE)


def output_rate_of(body: SpeechRequest, model_rate: int) -> int:
    default = PCM_RATE if body.response_format == "pcm" else model_rate
    return output_rate(body.response_format, body.sample_rate or default)


async def speech_events(audio: AsyncIterator[bytes], input_chars: int) -> AsyncIterator[bytes]:
    """OpenAI's speech stream as server-sent events: ``speech.audio.delta`` events carrying base64 audio,
    then ``speech.audio.done`` with the usage (characters stand in for tokens)."""
    async for data in audio:
        if data:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
    usage = {"input_tokens": input_chars, "output_tokens": 0, "total_tokens": input_chars}
    yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()


@router.post(
    "/v1/audio/speech",
    responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()}}, **ERRORS},
    openapi_extra=_BODY,
)
async def speech(request: Request, tenant: Tenant, server: Server):
    return await spoken(request, server, await checked_speech(request, tenant, server))


async def spoken(request: Request, server: ServerState, job: CheckedSpeech) -> Response:
    """The answer to a checked request: whole, streamed, or as server-sent events, as its body asks."""
    body = job.body
    out_rate = output_rate_of(body, server.engine.sample_rate)
    headers = job.headers(out_rate)
    media_type = CONTENT_TYPES[body.response_format]
    # The first sentence is awaited before any byte is sent, so a bad voice or text is a clean 4xx.
    first_index = next(i for i, p in enumerate(job.pieces) if isinstance(p, str))
    try:
        first = await job.synthesize(server, job.pieces[first_index])
    except Exception as error:  # noqa: BLE001 - mapped to a status and a message
        raise job.failed(error) from None
    # With its only sentence made, the whole answer is known before its first byte: sent whole, true sizes.
    only_sentence = sum(isinstance(p, str) for p in job.pieces) == 1
    whole = only_sentence or not body.stream or not FORMATS[body.response_format].streams
    if body.stream_format == "audio" and whole:
        return await _whole(request, server, job, first_index, first, out_rate, media_type, headers)
    audio = _streamed(server, job, first_index, first, out_rate)
    if body.stream_format == "sse":
        return StreamingResponse(speech_events(audio, len(body.input)), media_type="text/event-stream", headers=headers)
    return StreamingResponse(audio, media_type=media_type, headers=headers)


async def _whole(
    request: Request,
    server: ServerState,
    job: CheckedSpeech,
    first_index: int,
    first,
    out_rate: int,
    media_type,
    headers,
) -> Response:
    """The answer as one file, made to the end unless the client leaves; its sentences are made as a stream's
    are (:func:`_in_order`), so the same batches give the same samples."""
    rate = server.engine.sample_rate
    timeline = Timeline(rate)
    try:
        async with aclosing(_in_order(server, job, first_index, first)) as pieces:
            async for piece, result in pieces:
                if result is None:
                    timeline.pause(piece)
                    continue
                timeline.sentence(result)
                if await request.is_disconnected():  # nobody waits for the rest: make none of it
                    return Response(status_code=CLIENT_CLOSED_REQUEST)
    except Exception as error:  # noqa: BLE001
        raise job.failed(error) from None
    whole = timeline.result().audio
    server.metrics.audio_seconds.labels(tenant=job.tenant).inc(len(whole) / rate)
    # Seconds of CPU for minutes of MP3 at 48 kHz: off the event loop, which every other request waits on.
    data = await run_in_threadpool(encode_whole, whole, rate, job.body.response_format, out_rate)
    return Response(data, media_type=media_type, headers=headers)


async def _streamed(server: ServerState, job: CheckedSpeech, first_index: int, first, out_rate: int):
    """The file's bytes as each sentence is made (:func:`_in_order`): one encoder over the whole text."""
    rate = server.engine.sample_rate
    encoder = AudioStream(job.body.response_format, rate, out_rate)
    try:
        async with aclosing(_in_order(server, job, first_index, first)) as pieces:
            index = 0
            async for piece, result in pieces:
                last = index == len(job.pieces) - 1  # a WAV that is one piece says its true length (as SSE can be)
                index += 1
                if result is None:
                    yield encoder.write(silence(piece, rate), last)
                    continue
                server.metrics.audio_seconds.labels(tenant=job.tenant).inc(result.duration)
                yield encoder.write(result.audio, last)
        yield encoder.close()
    except Exception:
        # Headers are gone: the only honest signal left is a stream cut short.
        log.exception("speech stream for voice %r failed mid-way", job.body.voice)
        raise


async def _in_order(server: ServerState, job: CheckedSpeech, first_index: int, first):
    """Each piece of the answer in order, with its sentence's result (None for a pause). The sentences after
    the first are admitted as the answer is consumed, :data:`STREAM_AHEAD` ahead of the one being taken:
    enough to batch while it plays, without one long text filling the queue before other requests. Those
    still queued when it is closed are cancelled."""
    rest = iter(p for i, p in enumerate(job.pieces) if isinstance(p, str) and i != first_index)
    futures: deque[Future] = deque()

    def admit() -> None:
        while len(futures) < STREAM_AHEAD and (text := next(rest, None)) is not None:
            futures.append(server.batcher.submit(text, job.voice, job.body.speed, job.tenant))

    admit()
    try:
        for index, piece in enumerate(job.pieces):
            if isinstance(piece, Pause):
                yield piece, None
            elif index == first_index:
                yield piece, first
            else:
                result = await asyncio.wrap_future(futures.popleft())
                admit()
                yield piece, result
    finally:
        for future in futures:
            future.cancel()


@router.post("/v1/audio/speech/captioned", responses={200: {"model": CaptionedSpeech}, **ERRORS}, openapi_extra=_BODY)
async def captioned_speech(request: Request, tenant: Tenant, server: Server):
    """Speech with word and phoneme timestamps (the model's predicted durations): the body of
    ``/v1/audio/speech``; the audio comes whole, base64 in JSON."""
    job = await checked_speech(request, tenant, server)
    engine = server.engine
    rate = engine.sample_rate
    timeline = Timeline(rate)
    for piece in job.pieces:
        if isinstance(piece, Pause):
            timeline.pause(piece)
        elif await request.is_disconnected():  # nobody waits for the rest: make none of it
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        else:
            try:
                result = await job.synthesize(server, piece)
            except Exception as error:  # noqa: BLE001 - mapped to a status and a message
                raise job.failed(error) from None
            timeline.sentence(await run_in_threadpool(engine.timed, result))
    answer = timeline.result()
    server.metrics.audio_seconds.labels(tenant=job.tenant).inc(answer.duration)
    body = await run_in_threadpool(
        _captioned_json, answer, rate, job.body.response_format, output_rate_of(job.body, rate)
    )
    return Response(body, media_type="application/json")


def _captioned_json(answer: SynthesisResult, rate: int, response_format: str, out_rate: int) -> bytes:
    """The captioned answer as JSON: its audio encoded, base64, and every word and phoneme (seconds of CPU for
    minutes of audio, so the route calls this off the event loop)."""
    return (
        CaptionedSpeech(
            audio=base64.b64encode(encode_whole(answer.audio, rate, response_format, out_rate)).decode(),
            response_format=response_format,
            sample_rate=out_rate,
            duration=round(answer.duration, 4),
            words=[vars(w) for w in answer.words],
            phonemes=[vars(p) for p in answer.phonemes],
        )
        .model_dump_json()
        .encode()
    )
