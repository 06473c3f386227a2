"""Voices: what ``voice`` takes (``GET /v1/audio/voices``), the tenant's voices (``GET /v1/voices``,
``GET``/``DELETE /v1/voices/{id}``) and onboarding (``POST /v1/voices``: a form of clips or an archive,
answered 202 with the job that trains the voice).

A tenant sees only its own voices: another tenant's voice is a 404 with the same message as one that
does not exist.
"""

from __future__ import annotations

import bisect
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from chorus.adapters.voice import CARD_FILE
from chorus.serving.errors import ApiError
from chorus.serving.onboarding.job_runner import OnboardingJob
from chorus.serving.onboarding.upload_form import read_onboarding_form
from chorus.serving.quotas import check_onboarding, quota_reached
from chorus.serving.routes.deps import ERRORS, Server, Tenant
from chorus.serving.routes.jobs import job_json
from chorus.serving.schemas.jobs import CreatedJob
from chorus.serving.schemas.voices import AudioVoices, BaseVoice, CustomVoice, VoiceDeleted, VoiceList, VoiceName
from chorus.serving.server import ServerState
from chorus.serving.store import QuotaReached, VoiceConflict, VoiceNotFound, VoiceRecord, VoiceStatus
from chorus.serving.voice_keys import voice_key

router = APIRouter()


def voice_json(server: ServerState, record: VoiceRecord, resident: set[str]) -> dict:
    """A tenant's voice as :class:`CustomVoice`; ``resident``: the engine keys loaded now."""
    return CustomVoice(
        id=record.voice_id,
        name=record.name,
        status=record.status.value,
        created=int(record.created),
        updated=int(record.updated),
        method=record.method,
        size_bytes=record.size_bytes,
        job_id=record.job_id,
        error=server.public(record.error) if record.error else None,
        resident=voice_key(record) in resident,
        stage=record.stage,
        instant=record.instant,
        this_base=record.made_on(server.engine.base.sha256),
    ).model_dump()


def speaker_json(server: ServerState, name: str) -> dict:
    """A speaker of the base as :class:`BaseVoice`."""
    return BaseVoice(id=name, name=name, default=name == server.engine.default_speaker).model_dump()


def voice_card(server: ServerState, tenant: str, voice_id: str) -> dict | None:
    """A ready voice's card (``voice_card.json``) without the recipe's internals, or None if unreadable."""
    try:
        card = json.loads((server.store.get_voice(tenant, voice_id) / CARD_FILE).read_text())
    except (OSError, ValueError, VoiceNotFound):
        return None
    notes = {k: v for k, v in card.get("notes", {}).items() if k not in ("recipe", "memory_options")}
    return {**{k: v for k, v in card.items() if k != "notes"}, "notes": notes}


@router.get("/v1/audio/voices", responses={200: {"model": AudioVoices}, **ERRORS})
def audio_voices(tenant: Tenant, server: Server):
    """Every name ``voice`` takes: the base's speakers, the aliases, the tenant's voices that speak: ready
    ones, and a sample's voice from its ``POST`` on (its instant voice while it is refined, or after its
    refinement failed), each with its stage. A voice adapted on another base than this server's is left out:
    a server with that base speaks it (``GET /v1/voices`` lists it, ``this_base`` false)."""
    # What resolve_voice speaks: a training or failed voice of clips has nothing to speak yet.
    base = server.engine.base.sha256
    own = {
        r.voice_id: r
        for r in server.store.list_voices(tenant)
        if (r.status == VoiceStatus.READY or r.instant) and r.made_on(base)
    }
    aliases = server.aliases
    names = list(dict.fromkeys(list(own) + list(aliases) + server.engine.speakers))
    return AudioVoices(
        voices=names,
        data=[
            VoiceName(id=name, kind="custom", stage=own[name].stage, name=own[name].name)
            if name in own
            else VoiceName(id=name, kind="alias" if name in aliases else "base")
            for name in names
        ],
        aliases=aliases,
    ).model_dump()


@router.get("/v1/voices", responses={200: {"model": VoiceList}, **ERRORS})
def list_voices(tenant: Tenant, server: Server, after: str | None = None, limit: int | None = None):
    """Every voice a request may name, speakers first; ``limit`` (1-1,000) pages them as OpenAI's lists do, after
    the voice ``after`` (a tenant of 1,011 voices had 267 KB in one answer, and ``limit`` was ignored unsaid)."""
    if limit is not None and not 1 <= limit <= 1000:
        raise ApiError(400, "'limit' must be 1-1000", param="limit")
    speakers = server.engine.speakers
    # A stored voice named as a speaker is never spoken (the speaker is): left out, so that each id is listed once.
    shadowed = set(speakers)
    stored = sorted(
        (record for record in server.store.list_voices(tenant) if record.voice_id not in shadowed),
        key=lambda record: record.voice_id,
    )
    ids = [*speakers, *(record.voice_id for record in stored)]
    if after is None:
        start = 0
    elif after in shadowed:
        start = speakers.index(after) + 1
    else:  # by order, not by presence: a page's last voice deleted meanwhile still goes on
        start = bisect.bisect_right(ids, after, lo=len(speakers))
    end = len(ids) if limit is None else min(start + limit, len(ids))
    resident = set(server.engine.resident())
    page = [
        speaker_json(server, ids[row])
        if row < len(speakers)
        else voice_json(server, stored[row - len(speakers)], resident)
        for row in range(start, end)
    ]
    return {  # as the rows are made (a model here would choose between BaseVoice and CustomVoice for each again)
        "object": "list",
        "data": page,
        "first_id": ids[start] if page else None,
        "last_id": ids[start + len(page) - 1] if page else None,
        "has_more": end < len(ids),
    }


@router.get("/v1/voices/{voice_id}", responses={200: {"model": BaseVoice | CustomVoice}, **ERRORS})
async def get_voice(voice_id: str, tenant: Tenant, server: Server):
    voice_id = voice_id.lower()  # as speech takes names
    if server.engine.is_speaker(voice_id):
        return speaker_json(server, voice_id)
    record = server.record(tenant, voice_id)
    answer = voice_json(server, record, set(server.engine.resident()))
    if record.status == VoiceStatus.READY:
        answer["card"] = await run_in_threadpool(voice_card, server, tenant, voice_id)
    return answer


@router.delete("/v1/voices/{voice_id}", responses={200: {"model": VoiceDeleted}, **ERRORS})
def delete_voice(voice_id: str, tenant: Tenant, server: Server):
    # A speaker or an alias is refused by ServerState.record, as for /v1/audio/voices/{id}: no stored voice.
    return VoiceDeleted(id=server.delete_voice(tenant, voice_id)).model_dump()


@router.post("/v1/voices", status_code=202, responses={202: {"model": CreatedJob}, **ERRORS})
async def create_voice(request: Request, tenant: Tenant, server: Server):
    server.check_trains_voices()
    settings, store = server.settings, server.store
    check_onboarding(store, tenant, settings.limits, server.jobs.queued)
    form = await read_onboarding_form(request, settings.upload)
    upload_dir = None
    try:
        voice_id = server.check_voice_id(form.voice_id, param="id")
        if server.engine.is_speaker(voice_id):
            raise ApiError(
                409, f"{voice_id!r} is a speaker of the model; choose another id", param="id", type="conflict_error"
            )
        upload_dir = server.jobs.new_upload_dir()
        async with server.check_slots.turn(tenant, request.is_disconnected):  # decoding, hearing: a few at once
            prepared = await form.prepare(upload_dir / "voice")
        own = settings.limits.of(tenant)
        try:  # the limits again, in the job's own transaction: another server may have taken the last place
            job_id = store.create_job(
                tenant,
                voice_id,
                name=form.name,
                method=settings.adapt.methods.spec,
                max_active_jobs=own.active_jobs,
                max_voices=own.voices,
                base=server.engine.base.sha256,
            )
        except VoiceConflict as error:
            raise ApiError(409, str(error), type="conflict_error", param="id") from None
        except QuotaReached as error:
            raise quota_reached(error) from None
        await run_in_threadpool(  # it publishes the clips: an upload to the object store, off the event loop
            server.jobs.submit,
            upload_dir,
            OnboardingJob(job_id, tenant, voice_id, form.name),
            {
                "statement": form.consent,
                "clips": prepared.clips,
                "seconds": prepared.seconds,
                "audio_sha256": prepared.audio_sha256,
                "left_out": list(prepared.left_out),
            },
        )
        upload_dir = None
        job = job_json(server, store.get_job(tenant, job_id))
        job.update(clips=prepared.clips, seconds=prepared.seconds, left_out=list(prepared.left_out))
        return JSONResponse(job, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})
    finally:
        if upload_dir is not None:
            server.jobs.discard(upload_dir)
        await form.close()
