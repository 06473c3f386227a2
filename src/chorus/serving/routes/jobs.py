"""``GET /v1/jobs/{id}`` (an onboarding job's status, progress and error) and ``POST /v1/jobs/{id}/cancel``."""

from __future__ import annotations

import re

from fastapi import APIRouter

from chorus.serving.errors import ApiError
from chorus.serving.routes.deps import ERRORS, Server, Tenant
from chorus.serving.schemas.jobs import Job
from chorus.serving.server import ServerState
from chorus.serving.store import FINISHED_JOB, JobNotFound, JobRecord, JobStatus

router = APIRouter()

JOB_ID = re.compile(r"[0-9a-f]{32}")


def job_json(server: ServerState, job: JobRecord) -> dict:
    """A job as :class:`Job` (also the answer to ``POST /v1/voices``, with what the upload held); its message
    fit for a tenant, and its error that message when it failed or was interrupted."""
    message = server.public(job.message) if job.message else None
    return Job(
        id=job.job_id,
        voice=job.voice_id,
        status=job.status.value,
        progress=round(job.progress, 3),
        message=message,
        error=message if job.status.value in ("failed", "interrupted") else None,
        created=int(job.created),
        updated=int(job.updated),
    ).model_dump()


def _not_found(job_id: str) -> ApiError:
    return ApiError(404, f"job {job_id[:80]!r} not found", type="not_found_error")


@router.get("/v1/jobs/{job_id}", responses={200: {"model": Job}, **ERRORS})
def get_job(job_id: str, tenant: Tenant, server: Server):
    if not JOB_ID.fullmatch(job_id):
        raise _not_found(job_id)
    try:
        return job_json(server, server.store.get_job(tenant, job_id))
    except JobNotFound:
        raise _not_found(job_id) from None


@router.post("/v1/jobs/{job_id}/cancel", responses={200: {"model": Job}, **ERRORS})
def cancel_job(job_id: str, tenant: Tenant, server: Server):
    """Stop an onboarding job: a queued one never trains, a running one stops at its next step (on this
    server; another server's at its next progress write, within about a second); its voice is marked
    failed and its files removed."""
    if not JOB_ID.fullmatch(job_id):
        raise _not_found(job_id)
    store = server.store
    try:
        job = store.get_job(tenant, job_id)
        if job.status in FINISHED_JOB:
            raise ApiError(
                409, f"job {job_id!r} is {job.status.value} already: nothing to cancel", type="conflict_error"
            )
        store.update_job(job_id, status=JobStatus.FAILED, message="cancelled by its tenant")
        server.jobs.cancel(job_id)
        return job_json(server, store.get_job(tenant, job_id))
    except JobNotFound:
        raise _not_found(job_id) from None
    except ValueError:  # it ended between the two reads
        raise ApiError(409, f"job {job_id!r} ended already: nothing to cancel", type="conflict_error") from None
