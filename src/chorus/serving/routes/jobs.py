"""``GET /v1/jobs/{id}`` (an onboarding job's status, progress and error) and ``POST /v1/jobs/{id}/cancel``."""

from __future__ import annotations

import re

from fastapi import APIRouter

from chorus.serving.errors import ApiError
from chorus.serving.routes.deps import ERRORS, Server, Tenant
from chorus.serving.schemas import Job
from chorus.serving.store import FINISHED_JOB, JobNotFound, JobStatus

router = APIRouter()

JOB_ID = re.compile(r"[0-9a-f]{32}")


def _not_found(job_id: str) -> ApiError:
    return ApiError(404, f"job {job_id[:80]!r} not found", type="not_found_error")


@router.get("/v1/jobs/{job_id}", responses={200: {"model": Job}, **ERRORS})
def get_job(job_id: str, tenant: Tenant, server: Server):
    if not JOB_ID.fullmatch(job_id):
        raise _not_found(job_id)
    try:
        return server.job_json(server.store.get_job(tenant, job_id))
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
        return server.job_json(store.get_job(tenant, job_id))
    except JobNotFound:
        raise _not_found(job_id) from None
    except ValueError:  # it ended between the two reads
        raise ApiError(409, f"job {job_id!r} ended already: nothing to cancel", type="conflict_error") from None
