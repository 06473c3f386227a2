"""The job queue of a store: training jobs queued for new voices (within a tenant's quotas), claimed by
exactly one worker of the servers sharing the store, their progress, and the clips they train on.
Every claim is a write transaction, exclusive across servers (:mod:`chorus.serving.store.metadata`)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from chorus.atomic import atomic_write_folder
from chorus.serving.store.backends import Backends
from chorus.serving.store.metadata import Sql
from chorus.serving.store.records import (
    ACTIVE_JOB,
    FINISHED_JOB,
    ConsentNotFound,
    JobNotFound,
    JobRecord,
    JobStatus,
    JobTakenOver,
    QuotaReached,
    VoiceStatus,
    check_id,
    job_record,
    placeholders,
)
from chorus.serving.store.voices import Voices


class Jobs:
    """The ``jobs`` table; a job's voice (in ``voices``) follows its job's status."""

    def __init__(self, backends: Backends, voices: Voices) -> None:
        self._layout, self._db, self._owner = backends.layout, backends.db, backends.owner
        self._voices = voices

    def create(
        self,
        tenant: str,
        voice_id: str,
        *,
        name: str | None = None,
        method: str | None = None,
        max_active_jobs: int | None = None,
        max_voices: int | None = None,
        consent_id: str | None = None,
        instant: str | None = None,
        base: str | None = None,
    ) -> str:
        """Queue a training job for a new voice (or a failed one): the voice is listed as training (made
        under consent recording ``consent_id``, speaking as the blend ``instant`` until it is ready, for
        OpenAI's custom voices), on the base whose sha256 is ``base`` (the queuing server's).
        Returns the job id. Raises ``VoiceConflict`` if the voice is ready, training or being deleted,
        ``QuotaReached`` if ``tenant`` has ``max_active_jobs`` jobs queued or running, or ``max_voices``
        voices, already: counted in the same transaction, so servers sharing the store cannot both take
        the last place; and ``ConsentNotFound`` if ``consent_id`` is gone (deleted while the sample was checked:
        a consent is deleted only in a transaction that finds no voice made under it)."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        job_id, now = uuid.uuid4().hex, time.time()
        with self._db.transaction() as db:
            if consent_id is not None and (
                db.execute("SELECT 1 FROM consents WHERE tenant=? AND id=?", (tenant, consent_id)).fetchone() is None
            ):
                raise ConsentNotFound(f"no consent recording {consent_id!r}")
            self._voices.check_claimable(db, tenant, voice_id, job_id=None)
            if max_active_jobs is not None:
                active = _active_jobs(db, tenant)
                if active >= max_active_jobs:
                    raise QuotaReached(
                        f"{active} of your onboarding jobs are queued or running (at most {max_active_jobs})", "jobs"
                    )
            if max_voices is not None:
                voices = db.execute(
                    "SELECT COUNT(*) AS total FROM voices WHERE tenant=? AND status!=? AND id!=?",
                    (tenant, VoiceStatus.DELETED, voice_id),
                ).fetchone()["total"]
                if voices >= max_voices:
                    raise QuotaReached(
                        f"you keep {voices} voices (at most {max_voices}); delete some to make room", "voices"
                    )
            db.execute(
                "INSERT INTO jobs (id, tenant, voice_id, status, progress, created, updated, owner) "
                "VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (job_id, tenant, voice_id, JobStatus.QUEUED, now, now, self._owner),
            )
            self._voices.mark_training(
                db, tenant, voice_id, name or voice_id, method, job_id, now, consent_id, instant, base
            )
        return job_id

    def update(
        self,
        job_id: str,
        *,
        status: str | None = None,
        progress: float | None = None,
        message: str | None = None,
        as_worker: bool = False,
        if_status: JobStatus | None = None,
    ) -> JobRecord | None:
        """Record a job's progress (the worker's call, hence no tenant). Its voice follows while not
        ready: queued or running -> training (a resumed job), failed or interrupted -> failed with
        ``message``. A done or failed job is final: updating it raises ``ValueError``; so does anything
        but failing it (a tenant's cancel) while another store's worker runs it. ``as_worker``: the
        update of the worker that holds the job, refused with ``JobTakenOver`` once this store does not
        hold it (it was found dead meanwhile). ``if_status``: change nothing and return None unless the
        job is in that status now."""
        new_status = JobStatus(status) if status is not None else None
        if progress is not None and not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be within 0..1, got {progress}")
        now = time.time()
        with self._db.transaction() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id!r}")
            job = job_record(row)
            if if_status is not None and job.status != if_status:
                return None
            if as_worker and row["owner"] != self._owner:
                raise JobTakenOver(f"job {job_id!r} is no longer this worker's ({job.status.value})")
            if job.status in FINISHED_JOB:
                raise ValueError(f"job {job_id!r} is {job.status.value} already")
            if job.status == JobStatus.RUNNING and row["owner"] not in (None, self._owner):
                if new_status is not JobStatus.FAILED:
                    raise ValueError(f"job {job_id!r} is run by another worker")
            owner = row["owner"] if new_status is None else self._owner if new_status in ACTIVE_JOB else None
            db.execute(
                "UPDATE jobs SET status=?, progress=?, message=?, owner=?, updated=? WHERE id=?",
                (
                    new_status or job.status,
                    job.progress if progress is None else progress,
                    job.message if message is None else message,
                    owner,
                    now,
                    job_id,
                ),
            )
            if new_status in ACTIVE_JOB:
                voice_status, error = VoiceStatus.TRAINING, None
            elif new_status in (JobStatus.FAILED, JobStatus.INTERRUPTED):
                voice_status, error = VoiceStatus.FAILED, message or f"training job {new_status.value}"
            else:
                voice_status = None
            if voice_status is not None:
                db.execute(
                    "UPDATE voices SET status=?, error=?, updated=? WHERE tenant=? AND id=? AND job_id=? "
                    "AND status IN (?, ?)",
                    (
                        voice_status,
                        error,
                        now,
                        job.tenant,
                        job.voice_id,
                        job_id,
                        VoiceStatus.TRAINING,
                        VoiceStatus.FAILED,
                    ),
                )
            row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return job_record(row)

    def get(self, tenant: str, job_id: str) -> JobRecord:
        check_id(tenant, "tenant")
        with self._db.read() as db:
            row = db.execute("SELECT * FROM jobs WHERE tenant=? AND id=?", (tenant, job_id)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return job_record(row)

    def active(self, tenant: str) -> int:
        """How many of ``tenant``'s onboarding jobs are queued or running."""
        with self._db.read() as db:
            return _active_jobs(db, tenant)

    def interrupted(self) -> list[JobRecord]:
        """Jobs of every tenant cut short by a dead process, oldest first, for the server to resume."""
        with self._db.read() as db:
            rows = db.execute("SELECT * FROM jobs WHERE status=? ORDER BY created", (JobStatus.INTERRUPTED,)).fetchall()
        return [job_record(row) for row in rows]

    def interrupt(self, dead: set[str]) -> list[str]:
        """Mark interrupted every queued or running job whose owner is in ``dead``, or none, or not
        registered (gone before); the ids of those jobs."""
        now, interrupted = time.time(), []
        with self._db.transaction() as db:
            rows = db.execute(f"SELECT * FROM jobs WHERE status IN ({placeholders(ACTIVE_JOB)})", ACTIVE_JOB).fetchall()
            registered = {row["id"] for row in db.execute("SELECT id FROM owners").fetchall()}
            for row in rows:
                owner = row["owner"]
                if owner is not None and owner not in dead and owner in registered:
                    continue
                db.execute(
                    "UPDATE jobs SET status=?, message=?, owner=NULL, updated=? WHERE id=?",
                    (
                        JobStatus.INTERRUPTED,
                        f"interrupted: the server stopped while the job was {row['status']}",
                        now,
                        row["id"],
                    ),
                )
                interrupted.append(row["id"])
        return interrupted

    def claim(self, job_id: str) -> JobRecord | None:
        """Take queued or interrupted job ``job_id`` for this store's worker: it is marked running, owned
        by this store (taking it again is a no-op). None when it is not there to take (another worker has
        it, or it ended)."""
        return self._claim(
            "id=? AND (status IN (?, ?) OR (status=? AND owner=?))",
            (job_id, JobStatus.QUEUED, JobStatus.INTERRUPTED, JobStatus.RUNNING, self._owner),
        )

    def claim_next(self) -> JobRecord | None:
        """Take the oldest queued or interrupted job whose clips are published (any server's), as
        :meth:`claim` does; None when there is none. Claims are write transactions, so two workers
        never take the same job."""
        where = "inputs IS NOT NULL AND status IN (?, ?) ORDER BY created LIMIT 1"
        with self._db.read() as db:  # idle workers look every second: no write lock while there is nothing
            if (
                db.execute(f"SELECT id FROM jobs WHERE {where}", (JobStatus.QUEUED, JobStatus.INTERRUPTED)).fetchone()
                is None
            ):
                return None
        return self._claim(where, (JobStatus.QUEUED, JobStatus.INTERRUPTED))

    def _claim(self, where: str, args: tuple) -> JobRecord | None:
        now = time.time()
        with self._db.transaction() as db:
            row = db.execute(f"SELECT id FROM jobs WHERE {where}", args).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET status=?, owner=?, updated=? WHERE id=?",
                (JobStatus.RUNNING, self._owner, now, row["id"]),
            )
            job = job_record(db.execute("SELECT * FROM jobs WHERE id=?", (row["id"],)).fetchone())
            db.execute(
                "UPDATE voices SET status=?, error=NULL, owner=?, updated=? WHERE tenant=? AND id=? AND job_id=? "
                "AND status IN (?, ?)",
                (
                    VoiceStatus.TRAINING,
                    self._owner,
                    now,
                    job.tenant,
                    job.voice_id,
                    job.job_id,
                    VoiceStatus.TRAINING,
                    VoiceStatus.FAILED,
                ),
            )
        return job

    def publish_inputs(self, job_id: str, folder: str | Path) -> None:
        """Record where job ``job_id``'s files are, so that any server's worker can take the job: the
        local ``folder`` itself for a store on local disk (servers sharing it are on this machine), else
        a copy under ``<root>/.jobs/<job id>/`` (uploaded first, then recorded)."""
        folder = Path(folder)
        if self._layout.local:
            url = str(folder.absolute())
        else:
            remote = self._layout.job_inputs(job_id)
            self._layout.fs.put(str(folder), remote, recursive=True)
            url = self._layout.url(remote)
        with self._db.transaction() as db:
            db.execute("UPDATE jobs SET inputs=? WHERE id=?", (url, job_id))

    def fetch_inputs(self, job_id: str, folder: str | Path) -> bool:
        """Make ``folder`` hold job ``job_id``'s published files (downloading them from a remote root when
        ``folder`` lacks them); False when they are nowhere to be found."""
        folder = Path(folder)
        if folder.is_dir():
            return True
        with self._db.read() as db:
            row = db.execute("SELECT inputs FROM jobs WHERE id=?", (job_id,)).fetchone()
        url = None if row is None else row["inputs"]
        if url is None:
            return False
        if self._layout.local:  # a server on this machine with another jobs folder
            if not Path(url).is_dir():
                return False
            atomic_write_folder(folder, lambda temp: shutil.copytree(url, temp, dirs_exist_ok=True))
            return True
        fs = self._layout.fs
        remote = fs._strip_protocol(url)
        if not fs.exists(remote):
            return False
        atomic_write_folder(folder, lambda temp: fs.get(f"{remote}/", f"{temp}/", recursive=True))
        return True

    def remove_inputs(self, job_id: str) -> None:
        """Remove the published copy of a job's files (a remote root's; a local job folder is its worker's)."""
        if not self._layout.local:
            self._layout.remove(self._layout.job_inputs(job_id))


def _active_jobs(db: Sql, tenant: str) -> int:
    """How many of ``tenant``'s jobs are queued or running."""
    query = f"SELECT COUNT(*) AS total FROM jobs WHERE tenant=? AND status IN ({placeholders(ACTIVE_JOB)})"
    return int(db.execute(query, (tenant, *ACTIVE_JOB)).fetchone()["total"])
