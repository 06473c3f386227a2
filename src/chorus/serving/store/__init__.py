"""The voice store of the multi-tenant server: voice and job metadata in a database (SQLite on one
machine, PostgreSQL for servers on several), adapter folders as blobs under any fsspec URL (the
layout and its commit markers: :mod:`.layout`).

Metadata lives in one SQLite file on local disk (the default, ``<root>/store.sqlite3``) or in
PostgreSQL (:mod:`chorus.serving.store.metadata`); a remote ``root_url`` needs an explicit ``database``. A
voice's status says whether it may be served: only ``ready`` voices are, and only after their files match
the recorded checksums on that very load.

Several processes (servers on several machines) may share one store. Each open store is an *owner* with
a heartbeat in the database; work in flight (an upload, a deletion, a running job) records its owner, and
whoever finds an owner dead finishes or undoes its work (:mod:`.owners`). Work of a live owner is never
touched.

Tenants are isolated: every query is scoped by tenant, and another tenant's voice or job raises the
same ``VoiceNotFound``/``JobNotFound`` as one that does not exist.

:class:`VoiceStore` is the one front; it composes parts by concern that share its backends
(:class:`~.backends.Backends`: the blob layout, the database, this store's owner id):

    records      ids, statuses, the records of the two tables, errors
    layout       the blob layout under the root and the commit marker
    cache        local copies of the voices of a remote root
    voices       voice records: upload, serve (checksummed), list, delete
    jobs         the job queue and its claims
    owners       the heartbeat; reclaiming and recovering the work of dead owners
    maintenance  copy (migrate), backup, verify, repair
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self

import fsspec

from chorus.serving.store.backends import Backends, outage_errors
from chorus.serving.store.cache import DownloadCache, default_cache_dir
from chorus.serving.store.consents import Consents
from chorus.serving.store.jobs import Jobs
from chorus.serving.store.layout import MARKER_FILE, BlobLayout
from chorus.serving.store.maintenance import CopyReport, Maintenance, RepairReport, VerifyReport
from chorus.serving.store.metadata import Database, is_postgres_url, open_database, public_url, sqlite_path
from chorus.serving.store.owners import LEASE_SECONDS, Owners, RecoveryReport
from chorus.serving.store.records import (
    ACTIVE_JOB,
    FINISHED_JOB,
    ConsentInUse,
    ConsentNotFound,
    ConsentRecord,
    InvalidId,
    JobNotFound,
    JobRecord,
    JobStatus,
    JobTakenOver,
    QuotaReached,
    StoreUnavailable,
    VoiceConflict,
    VoiceCorrupted,
    VoiceNotFound,
    VoiceNotReady,
    VoiceRecord,
    VoiceStatus,
    check_id,
)
from chorus.serving.store.voices import Voices

__all__ = [
    "ACTIVE_JOB",
    "new_store",
    "FINISHED_JOB",
    "MARKER_FILE",
    "ConsentInUse",
    "ConsentNotFound",
    "ConsentRecord",
    "CopyReport",
    "InvalidId",
    "JobNotFound",
    "JobRecord",
    "JobStatus",
    "JobTakenOver",
    "QuotaReached",
    "RecoveryReport",
    "RepairReport",
    "StoreUnavailable",
    "VerifyReport",
    "VoiceConflict",
    "VoiceCorrupted",
    "VoiceNotFound",
    "VoiceNotReady",
    "VoiceRecord",
    "VoiceStatus",
    "VoiceStore",
    "check_id",
    "outage_errors",
]


def new_store(root_url: str, database: str | None = None) -> str | None:
    """The SQLite file that opening ``root_url`` would create, making a new, empty store rather than open
    one (a mistyped path); None where the store's metadata is there, or cannot be told from here (a
    PostgreSQL database, or a remote root without its database: opening it refuses)."""
    if database is None:
        layout = BlobLayout(root_url)
        if not layout.local:
            return None
        database = os.path.join(layout.root, "store.sqlite3")
    if is_postgres_url(database):
        return None
    path = sqlite_path(database)
    return None if os.path.isfile(path) else path


class VoiceStore:
    """Voices and training jobs of many tenants; safe to share between threads.

    ``root_url``: where adapter folders live (fsspec URL or local path). ``database``: a SQLite file or a
    ``postgresql://`` URL, by default ``<root>/store.sqlite3`` for a local root (required for a remote
    one). ``cache_dir``: where voices of a remote root are downloaded, by default ``voice-cache`` next to
    a SQLite file (under ``~/.cache/chorus`` for PostgreSQL). ``lease_seconds``: see :meth:`reclaim`.
    Opening the store writes a probe file to its root and registers it as an owner in the database, so
    a read-only or full store fails here (``StoreUnavailable``), not at the first upload. ``on_behalf_of``:
    open it as a helper of that live owner (an onboarding job's process working for its server): what it
    claims and writes is that owner's, it has no heartbeat of its own, and closing it leaves the owner alive.
    """

    def __init__(
        self,
        root_url: str,
        database: str | None = None,
        cache_dir: str | None = None,
        *,
        lease_seconds: float = LEASE_SECONDS,
        on_behalf_of: str | None = None,
    ) -> None:
        layout = BlobLayout(root_url)
        if database is None:
            if not layout.local:
                raise ValueError(
                    f"{root_url}: a remote voice root needs a database: a postgresql:// URL (servers on "
                    "several machines) or a local SQLite file"
                )
            database = os.path.join(layout.root, "store.sqlite3")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(root_url, database)
        self.lease_seconds = lease_seconds
        self.owner = on_behalf_of or uuid.uuid4().hex[:12]
        self._helper = on_behalf_of is not None
        self._lock = threading.Lock()
        self._closed = False
        db: Database | None = None
        try:
            layout.prepare()
            db = open_database(database)
            self._backends = Backends(layout, db, self.owner)
            self._voices = Voices(self._backends, DownloadCache(self.cache_dir))
            self._jobs = Jobs(self._backends, self._voices)
            self._consents = Consents(self._backends)
            self._owners = Owners(self._backends, self._voices, self._jobs, lease_seconds)
            if not self._helper:
                self._owners.register()
        except (OSError, sqlite3.Error, *outage_errors()) as error:
            if db is not None:
                db.close()
            raise StoreUnavailable(
                f"{root_url}: the voice store cannot be opened for writing ({error}); check that it exists, "
                f"is writable and has free space (database: {public_url(database)})"
            ) from None
        self._maintenance = Maintenance(self._backends, self._voices)
        if not self._helper:
            self._owners.start()

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The filesystem of the voice root (fsspec)."""
        return self._backends.layout.fs

    @property
    def root(self) -> str:
        """The voice root, as a path of :attr:`fs` (no protocol)."""
        return self._backends.layout.root

    @property
    def local(self) -> bool:
        """Whether the voice root is on local disk."""
        return self._backends.layout.local

    @property
    def database(self) -> Database:
        """The metadata database (:mod:`chorus.serving.store.metadata`), shared by every part of the store."""
        return self._backends.db

    @property
    def database_url(self) -> str:
        """The metadata database: a SQLite path or a PostgreSQL URL without its password."""
        return self._backends.db.url

    def close(self) -> None:
        """Stop the heartbeat, mark this owner dead (what it left in flight is then anyone's to recover)
        and close the database; a SQLite file gets its write-ahead log checkpointed into it, so that the
        file alone holds every voice and job. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if not self._helper:
                self._owners.stop()
        finally:
            self._backends.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write_problem(self) -> str | None:
        """Why the store cannot take writes now (None when it can): a probe file written to and removed
        from the voice root, and a write to the database rolled back. For ``/healthz``."""
        try:
            self._backends.layout.probe()
            self._backends.db.probe_write()
        except Exception as error:  # noqa: BLE001 - whatever the probe meets (an S3 endpoint down too) is the problem
            return f"{type(error).__name__}: {error}"[:200]
        return None

    # -- voices (:class:`~.voices.Voices`) ---------------------------------------------------------

    def put_voice(
        self, tenant: str, voice_id: str, folder: str | Path, *, name: str | None = None, job_id: str | None = None
    ) -> VoiceRecord:
        """Upload voice folder ``folder`` as ``voice_id`` of ``tenant``, committed and marked ready (with
        ``job_id``: that job done); see :meth:`Voices.put`."""
        return self._voices.put(tenant, voice_id, folder, name=name, job_id=job_id)

    def get_voice(self, tenant: str, voice_id: str) -> Path:
        """A local folder holding the ready voice, its files checked against their checksums now; see
        :meth:`Voices.get`."""
        return self._voices.get(tenant, voice_id)

    def voice_folder(self, record: VoiceRecord) -> Path:
        """:meth:`get_voice` of a record read before (a request's, so the record is not read again);
        ``VoiceNotFound`` when the voice was replaced or deleted since."""
        return self._voices.folder(record)

    def voice(self, tenant: str, voice_id: str) -> VoiceRecord:
        """The metadata of one voice of ``tenant`` (any status but deleted)."""
        return self._voices.record(tenant, voice_id)

    def set_instant(self, tenant: str, voice_id: str, job_id: str, instant: str) -> bool:
        """Change what a training sample's voice speaks as meanwhile. See :meth:`Voices.set_instant`."""
        return self._voices.set_instant(tenant, voice_id, job_id, instant)

    def list_voices(self, tenant: str) -> list[VoiceRecord]:
        """Every voice of ``tenant`` with its status (ready, training, failed), by id."""
        return self._voices.of_tenant(tenant)

    def all_voices(self) -> list[VoiceRecord]:
        """Every record, whatever its status or tenant."""
        return self._voices.every()

    def delete_voice(self, tenant: str, voice_id: str) -> bool:
        """Delete a voice: it stops being served at once; returns whether its files went now (else a later
        :meth:`reclaim` removes them); see :meth:`Voices.delete`."""
        return self._voices.delete(tenant, voice_id)

    def stored_bytes(self, tenant: str | None = None) -> int:
        """Bytes of the committed voices of ``tenant`` (None: of every tenant)."""
        return self._voices.stored_bytes(tenant)

    # -- jobs (:class:`~.jobs.Jobs`) ---------------------------------------------------------------

    def create_job(
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
        """Queue a training job for a new voice (or a failed one), within the quotas given; its id. See
        :meth:`Jobs.create`."""
        return self._jobs.create(
            tenant,
            voice_id,
            name=name,
            method=method,
            max_active_jobs=max_active_jobs,
            max_voices=max_voices,
            consent_id=consent_id,
            instant=instant,
            base=base,
        )

    # -- consent recordings (OpenAI's custom voices; see :mod:`chorus.serving.store.consents`)
    def create_consent(self, tenant: str, **fields) -> ConsentRecord:
        """Keep a checked consent recording (fields of :meth:`Consents.create`)."""
        return self._consents.create(tenant, **fields)

    def check_consent_room(self, tenant: str, max_consents: int) -> None:
        """``QuotaReached`` if ``tenant`` keeps ``max_consents`` consent recordings already."""
        self._consents.check_room(tenant, max_consents)

    def audit_consent(self, tenant: str, voice_id: str, job_id: str | None, entry: dict) -> None:
        """Keep the consent an onboarding upload was given (see :meth:`Consents.audit`)."""
        self._consents.audit(tenant, voice_id, job_id, entry)

    def consent_audit(self, tenant: str | None = None) -> list[dict]:
        """The consents onboarding uploads were given, oldest first (see :meth:`Consents.audit_entries`)."""
        return self._consents.audit_entries(tenant)

    def consent(self, tenant: str, consent_id: str) -> ConsentRecord:
        return self._consents.get(tenant, consent_id)

    def consent_recording(self, tenant: str, consent_id: str) -> bytes:
        return self._consents.recording(tenant, consent_id)

    def list_consents(self, tenant: str, after: str | None = None, limit: int | None = None) -> list[ConsentRecord]:
        return self._consents.of_tenant(tenant, after, limit)

    def rename_consent(self, tenant: str, consent_id: str, name: str) -> ConsentRecord:
        return self._consents.rename(tenant, consent_id, name)

    def delete_consent(self, tenant: str, consent_id: str) -> None:
        """Forget a consent recording; ``ConsentInUse`` while voices made under it exist."""
        self._consents.delete(tenant, consent_id)

    def update_job(
        self,
        job_id: str,
        *,
        status: str | None = None,
        progress: float | None = None,
        message: str | None = None,
        as_worker: bool = False,
        if_status: JobStatus | None = None,
    ) -> JobRecord | None:
        """Record a job's progress; its voice follows. See :meth:`Jobs.update`."""
        return self._jobs.update(
            job_id, status=status, progress=progress, message=message, as_worker=as_worker, if_status=if_status
        )

    def get_job(self, tenant: str, job_id: str) -> JobRecord:
        """One job of ``tenant``; ``JobNotFound`` for another tenant's."""
        return self._jobs.get(tenant, job_id)

    def active_jobs(self, tenant: str) -> int:
        """How many of ``tenant``'s onboarding jobs are queued or running."""
        return self._jobs.active(tenant)

    def interrupted_jobs(self) -> list[JobRecord]:
        """Jobs of every tenant cut short by a dead process, oldest first, for the server to resume."""
        return self._jobs.interrupted()

    def claim_job(self, job_id: str) -> JobRecord | None:
        """Take queued or interrupted job ``job_id`` for this store's worker; see :meth:`Jobs.claim`."""
        return self._jobs.claim(job_id)

    def claim_next_job(self) -> JobRecord | None:
        """Take the oldest queued or interrupted job whose clips are published; see :meth:`Jobs.claim_next`."""
        return self._jobs.claim_next()

    def publish_job_inputs(self, job_id: str, folder: str | Path) -> None:
        """Record where job ``job_id``'s files are, for any server's worker; see :meth:`Jobs.publish_inputs`."""
        self._jobs.publish_inputs(job_id, folder)

    def fetch_job_inputs(self, job_id: str, folder: str | Path) -> bool:
        """Make ``folder`` hold job ``job_id``'s published files; False when they are nowhere to be found."""
        return self._jobs.fetch_inputs(job_id, folder)

    def remove_job_inputs(self, job_id: str) -> None:
        """Remove the published copy of a job's files (a remote root's; a local job folder is its worker's)."""
        self._jobs.remove_inputs(job_id)

    # -- owners (:class:`~.owners.Owners`) ---------------------------------------------------------

    def heartbeat(self) -> None:
        """Mark this store alive now (its thread does so every third of the lease); a store that was found
        dead meanwhile registers again."""
        self._owners.beat()

    def live_others(self) -> list[dict]:
        """The other processes using this store now (servers, their jobs, other store commands)."""
        return self._owners.live_others()

    def is_alive(self, owner: str) -> bool:
        """Whether store owner ``owner`` (this one, or another process on the store) is alive."""
        return self._owners.is_alive(owner)

    def recover(self) -> RecoveryReport:
        """Bring the store back to a consistent state after a crash; call at start-up, before serving.
        See :meth:`Owners.recover`."""
        return self._owners.recover()

    def reclaim(self) -> RecoveryReport:
        """Finish or undo the work in flight of every owner found dead (no heartbeat for ``lease_seconds``,
        or a process of this machine now gone); run every third of the lease by this store's thread. See
        :meth:`Owners.reclaim`."""
        return self._owners.reclaim()

    # -- maintenance (:class:`~.maintenance.Maintenance`) ------------------------------------------

    def copy_to(self, target: VoiceStore, on_voice: Callable[[VoiceRecord], None] | None = None) -> CopyReport:
        """Copy every ready voice into ``target`` (``chorus store migrate``), checksums checked at both
        ends; see :meth:`Maintenance.copy_to`."""
        return self._maintenance.copy_to(target._voices, on_voice)

    def backup(self, destination: str | os.PathLike) -> tuple[int, list[tuple[str, str]]]:
        """Copy the store into the new local folder ``destination``, consistently while it serves; returns
        (voices copied, voices left out: deleted or replaced meanwhile). See :meth:`Maintenance.backup`."""
        return self._maintenance.backup(destination, self._copy_into_new_store)

    def _copy_into_new_store(self, destination: Path) -> CopyReport:
        with VoiceStore(str(destination)) as copy:
            return self.copy_to(copy)

    def verify(self) -> VerifyReport:
        """Check every ready voice's files and find the folders no record lists (``chorus store verify``);
        changes nothing. See :meth:`Maintenance.verify`."""
        return self._maintenance.verify()

    def repair(self) -> RepairReport:
        """Adopt or quarantine the folders no record lists (``chorus store repair``); see
        :meth:`Maintenance.repair`."""
        return self._maintenance.repair()
