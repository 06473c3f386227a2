"""OpenAI's custom voices, as its API and SDK shape them: consent recordings (``/v1/audio/voice_consents``:
create, list, retrieve, rename, delete) and voices from one sample (``POST /v1/audio/voices``,
``DELETE /v1/audio/voices/{id}``). Chorus adds ``GET /v1/audio/voices/{id}`` for the voice's stage and
``GET /v1/audio/voice_consents/phrases`` for what a consent must read (clients show it before recording).

A consent must read the server's phrase for its language; a sample must be the consent's speaker
(:mod:`chorus.serving.onboarding.consent_checks`). A new voice speaks at once as its instant voice and is refined by an
adaptation job in the background (the sample transcribed and cut at silences); once that job is done the
voice's next request speaks the adapted voice. A consent is kept while any voice made under it exists:
deleting it then is refused (409, naming the voices), since it is their audit record.
"""

from __future__ import annotations

import dataclasses
import secrets

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from chorus.data.check import tenths_down
from chorus.serving.errors import ApiError
from chorus.serving.onboarding.job_runner import SAMPLE, OnboardingJob, record_consent
from chorus.serving.onboarding.upload_form import form_file, form_text, read_multipart
from chorus.serving.onboarding.uploads import (
    RecordingTooLong,
    audit_recording,
    clip_speech,
    decode_recording,
    prepare_heard,
    recording_sha256,
)
from chorus.serving.quotas import check_onboarding, quota_reached
from chorus.serving.routes.deps import ERRORS, Server, Tenant, read_json
from chorus.serving.schemas.custom_voices import (
    AudioVoice,
    AudioVoiceDeleted,
    ConsentPhrases,
    VoiceConsent,
    VoiceConsentDeleted,
    VoiceConsentList,
)
from chorus.serving.server import ServerState
from chorus.serving.settings import UploadLimits
from chorus.serving.store import (
    ConsentInUse,
    ConsentNotFound,
    ConsentRecord,
    InvalidId,
    JobNotFound,
    JobStatus,
    QuotaReached,
    VoiceConflict,
    VoiceRecord,
    VoiceStatus,
    check_id,
)

router = APIRouter()

VOICE_PREFIX = "voice_"
FORM_FIELDS_BYTES = 64 << 10  # room for a form's text fields and part headers beside its one file
_CONSENTS = "/v1/audio/voice_consents"


def consent_json(record: ConsentRecord) -> dict:
    return VoiceConsent(
        id=record.consent_id, name=record.name, language=record.language, created_at=int(record.created)
    ).model_dump()


def audio_voice_json(server: ServerState, record: VoiceRecord) -> dict:
    """The voice as OpenAI's ``audio.voice``, with its stage and its refinement's state: its job's, or, where
    the job is not in this store (a voice migrated from another, whose jobs stay behind), what the voice says
    of it: ready, done; failed, failed (a migrated voice had said ``refinement: null`` beside stage adapted).
    A voice no job made (added by the operator) has no refinement."""
    failed = record.status == VoiceStatus.FAILED
    made_by_a_job = record.job_id is not None or record.instant is not None
    refinement = JobStatus.DONE.value if record.status == VoiceStatus.READY and made_by_a_job else None
    if record.job_id is not None:
        try:
            refinement = server.store.get_job(record.tenant, record.job_id).status.value
        except JobNotFound:
            pass
    return AudioVoice(
        id=record.voice_id,
        name=record.name,
        created_at=int(record.created),
        type="audio_sample" if record.consent_id is not None else "custom",
        consent=record.consent_id,
        stage=record.stage,
        instant=record.instant,
        refinement="failed" if failed else refinement,
        refinement_error=server.public(record.error) if failed and record.error else None,
    ).model_dump()


def _consent(server: ServerState, tenant: str, consent_id: str, param: str | None = None) -> ConsentRecord:
    """The tenant's consent (another tenant's is not found, as one that never was)."""
    try:
        return server.store.consent(tenant, check_id(consent_id, "consent id"))
    except (ConsentNotFound, InvalidId):
        raise ApiError(
            404, f"consent recording {consent_id[:80]!r} not found", type="not_found_error", param=param
        ) from None


def _recording_limits(server: ServerState) -> UploadLimits:
    """An upload's limits for a consent or a sample, which may come through a phone line."""
    return dataclasses.replace(server.settings.upload, min_sample_rate=server.settings.consent.min_sample_rate)


def _name(form, max_chars: int = 100) -> str:
    name = (form_text(form, "name", True, max_chars) or "").strip()
    if not name or not name.isprintable():
        raise ApiError(400, f"'name' must be 1-{max_chars} printable characters", param="name")
    return name


# -- consent recordings
async def _one_file_form(request: Request, max_file_bytes: int, expected: str) -> FormData:
    """A multipart form of one file of at most ``max_file_bytes`` and its text fields (see ``read_multipart``)."""
    return await read_multipart(request, max_file_bytes + FORM_FIELDS_BYTES, 1, expected, file_bytes=max_file_bytes)


@router.post(_CONSENTS, responses={200: {"model": VoiceConsent}, **ERRORS})
async def create_consent(request: Request, tenant: Tenant, server: Server):
    """A consent recording: multipart ``name``, ``language`` (BCP 47) and ``recording`` (<= 10 MiB); it
    must read the server's phrase for the language and nothing else (400 quoting what was heard otherwise); the
    consent's speaker is embedded from the phrase's words alone. 501 on a base the server's jobs do not train: a
    consent there could make no voice, and would be heard and kept for nothing."""
    server.check_trains_voices()
    settings = server.settings.consent
    max_consents = server.settings.limits.of(tenant).consents
    try:  # a tenant at its quota is told before its upload is read and checked (seconds of CPU for nothing)
        await run_in_threadpool(server.store.check_consent_room, tenant, max_consents)
    except QuotaReached as error:
        raise quota_reached(error) from None
    form = await _one_file_form(request, settings.max_file_bytes, "fields name, language, recording")
    try:
        name = _name(form)
        language = (form_text(form, "language", True, 35) or "").strip()
        filename, data = await form_file(form, "recording", settings.max_file_bytes)
    finally:
        await form.close()
    checks = server.custom_voices
    checks.phrase(language)  # a language without a phrase: refused before any decoding
    # Seconds of CPU: a few at once, a few of them one tenant's (429 past the queue or the share).
    async with server.check_slots.turn(tenant, request.is_disconnected):
        audio, rate = await run_in_threadpool(
            decode_recording, "recording", data, settings.max_consent_seconds, _recording_limits(server)
        )
        heard = await run_in_threadpool(checks.heard, audio, rate, language)
        embedding = await run_in_threadpool(checks.embed, heard.speech, rate)  # the phrase's words alone
        kept = await run_in_threadpool(audit_recording, audio, rate)  # the sound alone, not the upload's other bytes
    try:
        record = await run_in_threadpool(  # a database write of the recording: off the event loop
            server.store.create_consent,
            tenant,
            name=name,
            language=language,
            heard=heard.text,
            word_error_rate=heard.word_error_rate,
            embedding=embedding.tolist(),
            recording=kept,
            max_consents=max_consents,
        )
    except QuotaReached as error:
        raise quota_reached(error) from None
    return consent_json(record)


@router.get(_CONSENTS, responses={200: {"model": VoiceConsentList}, **ERRORS})
def list_consents(tenant: Tenant, server: Server, after: str | None = None, limit: int = 20):
    if not 1 <= limit <= 100:
        raise ApiError(400, "'limit' must be 1-100", param="limit")
    if after is not None:
        _consent(server, tenant, after, param="after")
    records = server.store.list_consents(tenant, after, limit + 1)
    page = records[:limit]
    return VoiceConsentList(
        data=[consent_json(r) for r in page],
        first_id=page[0].consent_id if page else None,
        last_id=page[-1].consent_id if page else None,
        has_more=len(records) > limit,
    ).model_dump()


# Before the route of one consent, which would take "phrases" for an id (consent ids start with "cons_").
@router.get(_CONSENTS + "/phrases", responses={200: {"model": ConsentPhrases}, **ERRORS})
def consent_phrases(tenant: Tenant, server: Server):
    """What a consent recording must read, per language, and what a sample must be (Chorus's: clients such
    as the web page show the phrase before recording it)."""
    settings = server.settings.consent
    return ConsentPhrases(
        phrases=settings.phrases, min_sample_seconds=settings.min_sample_seconds, max_file_bytes=settings.max_file_bytes
    ).model_dump()


@router.get(_CONSENTS + "/{consent_id}", responses={200: {"model": VoiceConsent}, **ERRORS})
def retrieve_consent(consent_id: str, tenant: Tenant, server: Server):
    return consent_json(_consent(server, tenant, consent_id))


@router.post(_CONSENTS + "/{consent_id}", responses={200: {"model": VoiceConsent}, **ERRORS})
async def update_consent(consent_id: str, request: Request, tenant: Tenant, server: Server):
    """Rename a consent recording (the only change a consent takes): JSON ``{"name": ...}``."""
    _consent(server, tenant, consent_id)
    body = await read_json(request, 4 << 10)
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or not name.isprintable():
        raise ApiError(400, "'name' must be 1-100 printable characters", param="name")
    try:
        return consent_json(server.store.rename_consent(tenant, consent_id, name.strip()))
    except ConsentNotFound:  # deleted meanwhile
        raise ApiError(404, f"consent recording {consent_id!r} not found", type="not_found_error") from None


@router.delete(_CONSENTS + "/{consent_id}", responses={200: {"model": VoiceConsentDeleted}, **ERRORS})
def delete_consent(consent_id: str, tenant: Tenant, server: Server):
    _consent(server, tenant, consent_id)
    try:
        server.store.delete_consent(tenant, consent_id)
    except ConsentInUse as error:
        raise ApiError(409, str(error), type="conflict_error", code="consent_in_use") from None
    except ConsentNotFound:
        raise ApiError(404, f"consent recording {consent_id!r} not found", type="not_found_error") from None
    return VoiceConsentDeleted(id=consent_id).model_dump()


# -- voices from a sample
def _same_speaker(server: ServerState, consent: ConsentRecord, sample: np.ndarray, rate: int) -> None:
    """400 unless ``sample`` is the consent's speaker. The consent is heard again from its audit recording:
    its speaker is judged on the stretches that read the phrase alone (the check needs audio, not a stored
    embedding, to compare both in the band they share)."""
    checks = server.custom_voices
    recording = server.store.consent_recording(consent.tenant, consent.consent_id)
    audio, consent_rate = decode_recording(
        "recording", recording, server.settings.consent.max_consent_seconds, _recording_limits(server)
    )
    heard = checks.heard(audio, consent_rate, consent.language)
    checks.same_speaker(heard.speech, consent_rate, sample, rate)


def _unrefined(rate: int, upload: UploadLimits) -> str:
    """Why a sample recorded at ``rate`` is not refined: a voice is trained from ``upload.min_sample_rate``
    or more (as the onboarding job's data check takes a clip), so no job is queued to fail on it."""
    return (
        f"not refined: the sample was recorded at {rate} Hz, and a voice is trained from {upload.min_sample_rate} "
        "Hz or more; it speaks as its instant voice. For a refined voice, record the sample again at "
        f"{upload.min_sample_rate} Hz or more (not through a phone line)"
    )


@router.post("/v1/audio/voices", responses={200: {"model": AudioVoice}, **ERRORS})
async def create_audio_voice(request: Request, tenant: Tenant, server: Server):
    """A voice from multipart ``name``, ``audio_sample`` (10-30 s, <= 10 MiB) and ``consent`` (an id):
    answered as soon as the checks pass, speaking at once as its instant voice, refined in the background.
    A longer sample is refused from its declared duration (or where decoding passes 30 s), pointing to
    ``POST /v1/voices``, Chorus's onboarding of longer recordings."""
    server.check_trains_voices()
    settings = server.settings
    consent_settings = settings.consent
    check_onboarding(server.store, tenant, settings.limits, server.jobs.queued)
    form = await _one_file_form(request, consent_settings.max_file_bytes, "fields name, consent, audio_sample")
    try:
        kind = form_text(form, "type", False, 20)
        if kind not in (None, "audio_sample"):
            raise ApiError(400, f"type {kind!r} is not supported here: only 'audio_sample'", param="type")
        name = _name(form)
        consent = _consent(server, tenant, (form_text(form, "consent", True, 80) or "").strip(), param="consent")
        filename, data = await form_file(form, "audio_sample", consent_settings.max_file_bytes)
    finally:
        await form.close()
    checks = server.custom_voices
    limits = dataclasses.replace(_recording_limits(server), min_total_seconds=consent_settings.min_sample_seconds)
    # Seconds of CPU: a few at once, a few of them one tenant's (429 past the queue or the share).
    async with server.check_slots.turn(tenant, request.is_disconnected):
        try:
            audio, rate = await run_in_threadpool(
                decode_recording, "audio_sample", data, consent_settings.max_sample_seconds, limits
            )
        except RecordingTooLong as error:
            raise ApiError(
                400,
                f"the sample lasts {error.seconds:.1f} s{' or more' if error.at_least else ''}; at most "
                f"{error.longest:g} s. For a voice from longer recordings (up to {limits.max_total_seconds / 60:g} "
                "minutes), upload them to POST /v1/voices",
                param="audio_sample",
                code="sample_too_long",
            ) from None
        speech = (await run_in_threadpool(clip_speech, audio, rate, transcribed=False))[0]  # as the job counts it
        if speech < consent_settings.min_sample_seconds:
            raise ApiError(
                400,
                f"the sample holds {tenths_down(speech)} s of speech ({len(audio) / rate:.1f} s of audio, with the "
                f"silence and pauses around the words); at least {consent_settings.min_sample_seconds:g} s of speech",
                param="audio_sample",
            )
        await run_in_threadpool(_same_speaker, server, consent, audio, rate)
        embedding = await run_in_threadpool(checks.embed, audio, rate)
        instant = await run_in_threadpool(checks.instant_voice, embedding)
    voice_id = VOICE_PREFIX + secrets.token_hex(12)
    # A sample under the rate voices are trained from would be left out whole by the job's data check: such a
    # voice keeps its instant voice, and no job is queued (nor counted against the tenant's jobs) to fail.
    refined = rate >= settings.upload.min_sample_rate
    upload_dir = server.jobs.new_upload_dir() if refined else None
    try:
        if refined:
            prepared = await run_in_threadpool(
                prepare_heard, filename, audio, rate, speech, upload_dir / "voice", limits
            )
        own = settings.limits.of(tenant)
        try:
            job_id = server.store.create_job(
                tenant,
                voice_id,
                name=name,
                method=settings.adapt_sample.methods.spec,
                max_active_jobs=own.active_jobs if refined else None,
                max_voices=own.voices,
                consent_id=consent.consent_id,
                instant=instant,
                base=server.engine.base.sha256,
            )
        except VoiceConflict as error:
            raise ApiError(409, str(error), type="conflict_error") from None
        except QuotaReached as error:
            raise quota_reached(error) from None
        except ConsentNotFound:  # deleted while the sample was checked
            raise ApiError(
                404, f"consent recording {consent.consent_id!r} not found", type="not_found_error", param="consent"
            ) from None
        job = OnboardingJob(job_id, tenant, voice_id, name, SAMPLE)
        statement = {
            "statement": f"consent recording {consent.consent_id} ({consent.heard!r})",
            "consent_id": consent.consent_id,
        }
        if not refined:  # the consent is recorded as for any voice; the job is failed (kept if the store refuses now)
            heard = {"clips": 1, "seconds": round(len(audio) / rate, 2), "audio_sha256": recording_sha256(audio)}
            try:
                await run_in_threadpool(record_consent, server.store, server.jobs.jobs_dir, job, statement | heard)
            finally:  # a store that refused the audit must not leave the job queued, counted as active
                server.jobs.fail(job_id, _unrefined(rate, settings.upload))
        else:
            written = {"clips": prepared.clips, "seconds": prepared.seconds, "audio_sha256": prepared.audio_sha256}
            await run_in_threadpool(server.jobs.submit, upload_dir, job, statement | written)
            upload_dir = None
    finally:
        if upload_dir is not None:
            server.jobs.discard(upload_dir)
    return audio_voice_json(server, server.store.voice(tenant, voice_id))


@router.get("/v1/audio/voices/{voice_id}", responses={200: {"model": AudioVoice}, **ERRORS})
def retrieve_audio_voice(voice_id: str, tenant: Tenant, server: Server):
    """A voice made from a sample, with its stage (Chorus's; OpenAI's SDK has no retrieve)."""
    return audio_voice_json(server, server.record(tenant, voice_id))


@router.delete("/v1/audio/voices/{voice_id}", responses={200: {"model": AudioVoiceDeleted}, **ERRORS})
def delete_audio_voice(voice_id: str, tenant: Tenant, server: Server):
    return AudioVoiceDeleted(id=server.delete_voice(tenant, voice_id)).model_dump()  # the id as stored
