"""The voice store of the multi-tenant server: voice and job metadata in a database (SQLite on one
machine, PostgreSQL for servers on several), adapter folders as blobs under any fsspec URL.

    <root>/<tenant>/<voice_id>/          one committed voice
      adapter_config.json, chorus_voice.json, adapter_model.safetensors, voice_card.json, README.md
      COMMITTED.json                     written last: sha256 and size of every file above
    <root>/<tenant>/.upload-<voice_id>-<owner>-<token>/    an upload in progress (removed by ``recover``)
    <root>/.jobs/<job_id>/               a queued job's clips, for a remote root (see ``publish_job_inputs``)

``root_url`` is anything fsspec opens: a plain path or ``file://`` (local disk, the default),
``s3://``, ``gs://``, ``memory://`` ... A voice folder without a valid ``COMMITTED.json`` is treated
as absent, because object stores have no atomic rename of a prefix: the marker is the commit. On
local disk the folder is also renamed into place in one step.

Metadata lives in one SQLite file on local disk (the default, ``<root>/store.sqlite3``) or in
PostgreSQL (:mod:`chorus.serving.metadata`); a remote ``root_url`` needs an explicit ``database``. A
voice's status says whether it may be served: only ``ready`` voices are, and only after their files match
the recorded checksums on that very load.

Several processes (servers on several machines) may share one store. Each open store is an *owner* with
a heartbeat in the database; work in flight (an upload, a deletion, a running job) records its owner, and
whoever finds an owner dead (no heartbeat for ``lease_seconds``, or a process of this machine that is
gone) finishes or undoes its work: :meth:`VoiceStore.reclaim`, run by every store's heartbeat thread, and
:meth:`VoiceStore.recover` at start-up. Work of a live owner is never touched.

Tenants are isolated: every query is scoped by tenant, and another tenant's voice or job raises the
same ``VoiceNotFound``/``JobNotFound`` as one that does not exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import NoReturn, Self

import fsspec
from fsspec.implementations.local import LocalFileSystem

from chorus.adapters.voice import (
    CARD_FILE,
    CHORUS_FILE,
    CONFIG_FILE,
    WEIGHTS_FILE,
    VoiceError,
    read_voice,
)
from chorus.atomic import atomic_write_folder
from chorus.serving.metadata import (
    Database,
    Sql,
    SqliteDatabase,
    is_postgres_url,
    open_database,
    public_url,
    sqlite_path,
)

log = logging.getLogger("chorus.serving.store")

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MARKER_FILE = "COMMITTED.json"
QUARANTINE_DIR = ".quarantine"  # under the root: folders `chorus store repair` set aside
MARKER_FORMAT = "chorus-voice-blob"
UPLOAD_PREFIX = ".upload-"
PROBE_PREFIX = ".write-probe-"  # the write probe of _probe_files, in the voice root
# Everything a voice folder may hold. Weights are only ever safetensors: a pickle (.bin, .pt, ...)
# runs code when loaded, so a folder carrying one is refused rather than skipped.
VOICE_FILES = frozenset({CONFIG_FILE, CHORUS_FILE, WEIGHTS_FILE, CARD_FILE, "README.md"})
REQUIRED_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE})
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
JOB_INPUTS_DIR = ".jobs"  # under a remote root: the clips of queued jobs, for any server's worker
# An owner that has not beaten for this long is dead: its uploads are undone, its deletions finished,
# its jobs resumed by another worker. Long enough for a paused process (a swap storm, a GC) to come back.
LEASE_SECONDS = 15.0


class VoiceStatus(StrEnum):
    READY = "ready"  # committed and checksummed: may be served
    TRAINING = "training"  # a job or an upload is producing it
    FAILED = "failed"  # training, upload or a load-time check failed; ``error`` says why
    DELETED = "deleted"  # being deleted (``recover`` finishes a deletion cut short)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the process died while it was queued or running; may be resumed


ACTIVE_JOB = (JobStatus.QUEUED, JobStatus.RUNNING)
FINISHED_JOB = (JobStatus.DONE, JobStatus.FAILED)


class InvalidId(ValueError):
    """A tenant or voice id outside ``[a-z0-9][a-z0-9_-]{0,63}`` (so never a path, a dot or a slash)."""


class StoreUnavailable(OSError):
    """The store cannot be opened for writing (read-only, full, missing); the message says which store."""


class VoiceNotFound(KeyError):
    """No such voice for this tenant (whether or not another tenant has one of that id)."""


class JobNotFound(KeyError):
    """No such job for this tenant (whether or not another tenant has one of that id)."""


class VoiceNotReady(LookupError):
    """The voice exists but may not be served: it is training or has failed."""


class VoiceConflict(RuntimeError):
    """The voice id is taken: it is ready (delete it first), training, or being deleted."""


class JobTakenOver(RuntimeError):
    """A worker's update of a job it no longer holds: its store was found dead meanwhile, and the job was
    interrupted or taken by another worker (``VoiceStore.update_job(as_worker=True)``)."""


class QuotaReached(RuntimeError):
    """A tenant already has as many active jobs or voices as ``create_job`` was told to allow; ``what``
    says which ("jobs" or "voices")."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


class VoiceCorrupted(VoiceError):
    """A stored voice's files do not match their checksums; the voice is marked failed."""


@dataclass(frozen=True)
class VoiceRecord:
    """One row of the ``voices`` table. Times are Unix seconds."""

    tenant: str
    voice_id: str
    name: str
    status: VoiceStatus
    created: float
    updated: float
    blob_url: str
    sha256: str | None  # of adapter_model.safetensors, once committed
    size_bytes: int | None  # of all the voice's files, once committed
    method: str | None  # e.g. "lora+speaker"
    job_id: str | None  # the job that trains (or trained) it
    error: str | None  # why it failed
    owner: str | None = None  # the store that is uploading or deleting it (see ``VoiceStore.reclaim``)


@dataclass(frozen=True)
class JobRecord:
    """One row of the ``jobs`` table. Times are Unix seconds."""

    job_id: str
    tenant: str
    voice_id: str
    status: JobStatus
    progress: float  # 0..1
    message: str | None
    created: float
    updated: float


@dataclass
class RecoveryReport:
    """What ``VoiceStore.recover`` found and did."""

    interrupted_jobs: list[str] = field(default_factory=list)
    failed_voices: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id)
    restored_voices: list[tuple[str, str]] = field(default_factory=list)  # committed, not yet marked ready
    finished_deletes: list[tuple[str, str]] = field(default_factory=list)
    removed_uploads: list[str] = field(default_factory=list)  # temporary prefixes
    orphan_folders: list[str] = field(default_factory=list)  # voice folders no record lists (left as they are)


@dataclass
class VerifyReport:
    """What ``VoiceStore.verify`` found; it changes nothing."""

    checked: int = 0  # ready voices whose files were read and hashed
    corrupt: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, voice id, what is wrong)
    orphan_folders: list[str] = field(default_factory=list)  # voice folders no record lists

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.orphan_folders


@dataclass
class RepairReport:
    """What ``VoiceStore.repair`` did with the voice folders no record listed."""

    adopted: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id), now ready voices
    quarantined: list[str] = field(default_factory=list)  # where each other folder was moved


@dataclass
class CopyReport:
    """What ``VoiceStore.copy_to`` copied, and what it did not."""

    copied: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id), checksums equal
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, voice id, why)
    gone: list[tuple[str, str]] = field(default_factory=list)  # deleted or replaced while it copied


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


def check_id(value: str, kind: str = "voice id") -> str:
    """Return ``value`` if it is a valid tenant or voice id, else raise ``InvalidId``."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidId(f"invalid {kind} {value!r}: use 1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit")
    return value


class VoiceStore:
    """Voices and training jobs of many tenants; safe to share between threads.

    ``root_url``: where adapter folders live (fsspec URL or local path). ``database``: a SQLite file or a
    ``postgresql://`` URL, by default ``<root>/store.sqlite3`` for a local root (required for a remote
    one). ``cache_dir``: where voices of a remote root are downloaded, by default ``voice-cache`` next to
    a SQLite file (under ``~/.cache/chorus`` for PostgreSQL). ``lease_seconds``: see :meth:`reclaim`.
    """

    def __init__(
        self,
        root_url: str,
        database: str | None = None,
        cache_dir: str | None = None,
        *,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.fs, root = fsspec.core.url_to_fs(root_url, **_storage_options(root_url))
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        if database is None:
            if not self.local:
                raise ValueError(
                    f"{root_url}: a remote voice root needs a database: a postgresql:// URL (servers on "
                    "several machines) or a local SQLite file"
                )
            database = os.path.join(self.root, "store.sqlite3")
        if cache_dir is None:
            if is_postgres_url(database):
                cache_dir = _default_cache_dir(root_url)
            else:
                cache_dir = Path(sqlite_path(database)).parent / "voice-cache"
        self.cache_dir = Path(cache_dir)
        self.lease_seconds = lease_seconds
        # Who this store is to the others on the same database: work in flight (an upload, a deletion, a
        # job) carries its id, and its heartbeat says it is alive (:meth:`reclaim`).
        self.owner = uuid.uuid4().hex[:12]
        self._lock = threading.RLock()
        self._download_locks: dict[tuple[str, str], threading.Lock] = {}
        self._pending_deletes: set[tuple[str, str]] = set()  # (tenant, voice id) whose files are left
        self._closed = threading.Event()
        self._db: Database | None = None
        try:
            self._open(database)
        except (OSError, sqlite3.Error, *outage_errors()) as error:
            if self._db is not None:
                self._db.close()
            raise StoreUnavailable(
                f"{root_url}: the voice store cannot be opened for writing ({error}); check that it exists, "
                f"is writable and has free space (database: {public_url(database)})"
            ) from None
        self._threads = [
            threading.Thread(
                target=self._every_third_of_lease, args=(job,), name=f"chorus-store-{job.__name__}", daemon=True
            )
            for job in (self._beat, self.reclaim)  # apart: a slow reclaim must not delay the heartbeat
        ]
        for thread in self._threads:
            thread.start()

    def _open(self, database: str) -> None:
        """Make the folders, write and remove a probe file in the voice root (a read-only or full root
        fails here, not at the first upload), then open the database (its schema migrated) and register
        this store as an owner."""
        self.fs.makedirs(self.root, exist_ok=True)
        for stale in self.fs.glob(f"{self.root}/{PROBE_PREFIX}*"):  # a probe of a process killed mid-write
            with contextlib.suppress(OSError):
                self.fs.rm_file(stale)
        self._probe_files()
        self._db = open_database(database)
        self._register()

    def _register(self) -> None:
        now = self._db.now()
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO owners (id, host, pid, started, heartbeat) VALUES (?, ?, ?, ?, ?)",
                (self.owner, _HOST, os.getpid(), now, now),
            )

    @property
    def database_url(self) -> str:
        """The metadata database: a SQLite path or a PostgreSQL URL without its password."""
        return self._db.url

    def close(self) -> None:
        """Stop the heartbeat, mark this owner dead (what it left in flight is then anyone's to recover)
        and close the database; a SQLite file gets its write-ahead log checkpointed into it, so that the
        file alone holds every voice and job. Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        for thread in self._threads:
            thread.join()
        try:
            with self._db.transaction() as db:
                # Marked dead rather than removed: whatever it left in flight (a job stopped by the
                # server's stop) is for the next reclaim or recovery, of this server or another.
                db.execute("UPDATE owners SET heartbeat=0 WHERE id=?", (self.owner,))
        finally:
            self._db.close()

    def _every_third_of_lease(self, job: Callable[[], object]) -> None:
        """Run ``job`` every third of the lease until the store closes; a database that is down for a
        while is logged, not fatal."""
        while not self._closed.wait(self.lease_seconds / 3):
            try:
                job()
            except Exception:  # noqa: BLE001 - retried at the next turn
                log.exception("store %s failed (retrying)", job.__name__)

    def _beat(self) -> None:
        """Mark this store alive (the heartbeat other stores read, by the database's clock)."""
        with self._db.transaction(exclusive=False) as db:
            beat = db.execute("UPDATE owners SET heartbeat=? WHERE id=?", (self._db.now(), self.owner))
        if not beat.rowcount:  # declared dead while paused: its work went to others; it starts afresh
            log.warning("store owner %s was found dead by another server; registering again", self.owner)
            self._register()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- voices ------------------------------------------------------------------------------------

    def put_voice(
        self, tenant: str, voice_id: str, folder: str | Path, *, name: str | None = None, job_id: str | None = None
    ) -> VoiceRecord:
        """Upload voice folder ``folder`` as ``voice_id`` of ``tenant`` and mark it ready.

        The folder is verified first (``read_voice``: config, weights checksum, safetensors), then
        copied to a temporary prefix, verified again there, moved into place, and committed by writing
        ``COMMITTED.json``; only then is the voice marked ready. With ``job_id`` (the job that trained
        it, which must still be active), that job is marked done in the same transaction.
        Raises ``VoiceConflict`` if the voice is ready already (delete it first).
        """
        check_id(tenant, "tenant")
        check_id(voice_id)
        folder = Path(folder)
        files = _voice_files(folder)
        voice = read_voice(folder)
        manifest = {file: _digest(_LOCAL, str(path)) for file, path in files.items()}
        method = "+".join(voice.methods)
        self._claim(tenant, voice_id, name or voice_id, method, job_id)
        blob = self._blob(tenant, voice_id)
        temp = f"{self.root}/{tenant}/{UPLOAD_PREFIX}{voice_id}-{self.owner}-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(temp, exist_ok=True)
            for file, path in files.items():
                self.fs.put_file(str(path), f"{temp}/{file}")
            bad = _mismatches(self.fs, temp, manifest)
            if bad:
                raise VoiceError(f"upload of {voice_id!r} does not match its source: {', '.join(bad)}")
            self._move_into_place(temp, blob, list(manifest))
            marker = {
                "format": MARKER_FORMAT,
                "version": 1,
                "files": {file: {"sha256": d.sha256, "size": d.size} for file, d in manifest.items()},
            }
            self.fs.pipe_file(f"{blob}/{MARKER_FILE}", json.dumps(marker, indent=2).encode())
        except BaseException as error:
            self._remove(temp)
            self._set_failed(tenant, voice_id, f"upload failed: {error}")
            raise
        now = time.time()
        with self._transaction() as db:
            # Only while the voice is still this upload's: a deletion, or another server that found this
            # one dead and undid its upload, wins.
            marked = db.execute(
                "UPDATE voices SET status=?, sha256=?, size_bytes=?, error=NULL, owner=NULL, updated=? "
                "WHERE tenant=? AND id=? AND status=? AND owner=?",
                (
                    VoiceStatus.READY,
                    manifest[WEIGHTS_FILE].sha256,
                    sum(d.size for d in manifest.values()),
                    now,
                    tenant,
                    voice_id,
                    VoiceStatus.TRAINING,
                    self.owner,
                ),
            ).rowcount
            if marked and job_id is not None:
                db.execute(
                    "UPDATE jobs SET status=?, progress=1, owner=NULL, updated=? WHERE id=?",
                    (JobStatus.DONE, now, job_id),
                )
        if not marked:
            with self._db.read() as db:
                row = db.execute("SELECT status FROM voices WHERE tenant=? AND id=?", (tenant, voice_id)).fetchone()
            if row is None or row["status"] == VoiceStatus.DELETED:
                self._remove(blob)  # the deletion may have removed the folder before this upload moved in
            raise VoiceConflict(f"voice {voice_id!r} was deleted or taken over while it was uploaded")
        return self.voice(tenant, voice_id)

    def get_voice(self, tenant: str, voice_id: str) -> Path:
        """A local folder holding the ready voice, its files checked against their checksums now.

        For a remote root the folder is a cached download, fetched again if it does not match.
        A voice whose stored files do not match (or carry anything but the voice files) is marked
        failed and ``VoiceCorrupted`` is raised; it is not served again until uploaded anew.
        """
        return self.voice_folder(self.voice(tenant, voice_id))

    def voice_folder(self, record: VoiceRecord) -> Path:
        """:meth:`get_voice` of a record read before (a request's): ``VoiceNotFound`` when the voice was
        replaced or deleted since, rather than a mismatch taken for corruption."""
        tenant, voice_id = record.tenant, record.voice_id
        if record.status != VoiceStatus.READY:
            detail = f": {record.error}" if record.error else ""
            raise VoiceNotReady(f"voice {voice_id!r} is {record.status.value}{detail}")
        blob = self._blob(tenant, voice_id)
        manifest = self._read_marker(blob)
        if manifest is None or manifest[WEIGHTS_FILE].sha256 != record.sha256:
            if self.voice(tenant, voice_id).sha256 != record.sha256:  # raises VoiceNotFound once deleted
                raise VoiceNotFound(f"voice {voice_id!r} was replaced")
            self._corrupted(tenant, voice_id, "its stored folder has no valid commit marker for these weights")
        stray = sorted(set(_names(self.fs, blob)) - VOICE_FILES - {MARKER_FILE})
        if stray:
            self._corrupted(
                tenant,
                voice_id,
                f"its stored folder holds unexpected files {stray} (only the "
                f"voice files and safetensors weights are ever loaded)",
            )
        if self.local:
            local = Path(blob)
            bad = _mismatches(self.fs, blob, manifest)
        else:
            local = self.cache_dir / tenant / voice_id
            with self._download_lock(tenant, voice_id):
                bad = _mismatches(_LOCAL, str(local), manifest)
                if bad:
                    atomic_write_folder(
                        local, lambda temp: [self.fs.get_file(f"{blob}/{file}", str(temp / file)) for file in manifest]
                    )
                    bad = _mismatches(_LOCAL, str(local), manifest)
        if bad:
            self._corrupted(tenant, voice_id, f"checksum mismatch in {', '.join(bad)}")
        return local

    def voice(self, tenant: str, voice_id: str) -> VoiceRecord:
        """The metadata of one voice of ``tenant`` (any status but deleted)."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        with self._db.read() as db:
            row = db.execute(
                "SELECT * FROM voices WHERE tenant=? AND id=? AND status!=?", (tenant, voice_id, VoiceStatus.DELETED)
            ).fetchone()
        if row is None:
            raise VoiceNotFound(f"no voice {voice_id!r}")
        return _voice_record(row)

    def list_voices(self, tenant: str) -> list[VoiceRecord]:
        """Every voice of ``tenant`` with its status (ready, training, failed), by id."""
        check_id(tenant, "tenant")
        with self._db.read() as db:
            rows = db.execute(
                "SELECT * FROM voices WHERE tenant=? AND status!=? ORDER BY id", (tenant, VoiceStatus.DELETED)
            ).fetchall()
        return [_voice_record(row) for row in rows]

    def all_voices(self) -> list[VoiceRecord]:
        """Every record, whatever its status or tenant."""
        with self._db.read() as db:
            return [_voice_record(row) for row in db.execute("SELECT * FROM voices").fetchall()]

    def delete_voice(self, tenant: str, voice_id: str) -> bool:
        """Delete a voice: it stops being served at once; its files, cached copy and row go after.
        A job still training it is marked failed (its upload would then be refused). Returns whether its
        files went now; when the store refuses (read-only, full), the voice is deleted all the same and
        its files are removed by a later :meth:`reclaim` (every third of the lease) or start-up."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        now = time.time()
        with self._transaction() as db:
            changed = db.execute(
                "UPDATE voices SET status=?, owner=?, updated=? WHERE tenant=? AND id=? AND status!=?",
                (VoiceStatus.DELETED, self.owner, now, tenant, voice_id, VoiceStatus.DELETED),
            ).rowcount
            if not changed:
                raise VoiceNotFound(f"no voice {voice_id!r}")
            db.execute(
                f"UPDATE jobs SET status=?, message=?, updated=? WHERE tenant=? AND voice_id=? "
                f"AND status IN ({_placeholders(ACTIVE_JOB)})",
                (JobStatus.FAILED, "voice deleted", now, tenant, voice_id, *ACTIVE_JOB),
            )
        return self._finish_delete_or_defer(tenant, voice_id)

    def _finish_delete_or_defer(self, tenant: str, voice_id: str) -> bool:
        try:
            self._finish_delete(tenant, voice_id)
        except (OSError, sqlite3.Error, *outage_errors()) as error:
            log.warning(
                "voice %s/%s is deleted; its files stay until the store takes writes (%s)", tenant, voice_id, error
            )
            with self._lock:
                self._pending_deletes.add((tenant, voice_id))
            return False
        return True

    # -- jobs --------------------------------------------------------------------------------------

    def create_job(
        self,
        tenant: str,
        voice_id: str,
        *,
        name: str | None = None,
        method: str | None = None,
        max_active_jobs: int | None = None,
        max_voices: int | None = None,
    ) -> str:
        """Queue a training job for a new voice (or a failed one): the voice is listed as training.
        Returns the job id. Raises ``VoiceConflict`` if the voice is ready, training or being deleted, and
        ``QuotaReached`` if ``tenant`` has ``max_active_jobs`` jobs queued or running, or ``max_voices``
        voices, already: counted in the same transaction, so servers sharing the store cannot both take
        the last place."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        job_id, now = uuid.uuid4().hex, time.time()
        with self._transaction() as db:
            self._check_claimable(db, tenant, voice_id, job_id=None)
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
                (job_id, tenant, voice_id, JobStatus.QUEUED, now, now, self.owner),
            )
            self._upsert_training(db, tenant, voice_id, name or voice_id, method, job_id, now)
        return job_id

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
        with self._transaction() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id!r}")
            job = _job_record(row)
            if if_status is not None and job.status != if_status:
                return None
            if as_worker and row["owner"] != self.owner:
                raise JobTakenOver(f"job {job_id!r} is no longer this worker's ({job.status.value})")
            if job.status in FINISHED_JOB:
                raise ValueError(f"job {job_id!r} is {job.status.value} already")
            if job.status == JobStatus.RUNNING and row["owner"] not in (None, self.owner):
                if new_status is not JobStatus.FAILED:
                    raise ValueError(f"job {job_id!r} is run by another worker")
            owner = row["owner"] if new_status is None else self.owner if new_status in ACTIVE_JOB else None
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
        return _job_record(row)

    def get_job(self, tenant: str, job_id: str) -> JobRecord:
        check_id(tenant, "tenant")
        with self._db.read() as db:
            row = db.execute("SELECT * FROM jobs WHERE tenant=? AND id=?", (tenant, job_id)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return _job_record(row)

    def stored_bytes(self, tenant: str | None = None) -> int:
        """Bytes of the committed voices of ``tenant`` (None: of every tenant)."""
        where, args = ("AND tenant=?", (tenant,)) if tenant is not None else ("", ())
        with self._db.read() as db:
            row = db.execute(
                f"SELECT COALESCE(SUM(size_bytes), 0) AS total FROM voices WHERE status!=? {where}",
                (VoiceStatus.DELETED, *args),
            ).fetchone()
        return int(row["total"])

    def active_jobs(self, tenant: str) -> int:
        """How many of ``tenant``'s onboarding jobs are queued or running."""
        with self._db.read() as db:
            return _active_jobs(db, tenant)

    def interrupted_jobs(self) -> list[JobRecord]:
        """Jobs of every tenant cut short by a dead process, oldest first, for the server to resume."""
        with self._db.read() as db:
            rows = db.execute("SELECT * FROM jobs WHERE status=? ORDER BY created", (JobStatus.INTERRUPTED,)).fetchall()
        return [_job_record(row) for row in rows]

    def claim_job(self, job_id: str) -> JobRecord | None:
        """Take queued or interrupted job ``job_id`` for this store's worker: it is marked running, owned
        by this store (taking it again is a no-op). None when it is not there to take (another worker has
        it, or it ended)."""
        return self._claim_job(
            "id=? AND (status IN (?, ?) OR (status=? AND owner=?))",
            (job_id, JobStatus.QUEUED, JobStatus.INTERRUPTED, JobStatus.RUNNING, self.owner),
        )

    def claim_next_job(self) -> JobRecord | None:
        """Take the oldest queued or interrupted job whose clips are published (any server's), as
        :meth:`claim_job` does; None when there is none. Claims are write transactions, so two workers
        never take the same job."""
        where = "inputs IS NOT NULL AND status IN (?, ?) ORDER BY created LIMIT 1"
        with self._db.read() as db:  # idle workers look every second: no write lock while there is nothing
            if (
                db.execute(f"SELECT id FROM jobs WHERE {where}", (JobStatus.QUEUED, JobStatus.INTERRUPTED)).fetchone()
                is None
            ):
                return None
        return self._claim_job(where, (JobStatus.QUEUED, JobStatus.INTERRUPTED))

    def _claim_job(self, where: str, args: tuple) -> JobRecord | None:
        now = time.time()
        with self._transaction() as db:
            row = db.execute(f"SELECT id FROM jobs WHERE {where}", args).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET status=?, owner=?, updated=? WHERE id=?",
                (JobStatus.RUNNING, self.owner, now, row["id"]),
            )
            job = _job_record(db.execute("SELECT * FROM jobs WHERE id=?", (row["id"],)).fetchone())
            db.execute(
                "UPDATE voices SET status=?, error=NULL, owner=?, updated=? WHERE tenant=? AND id=? AND job_id=? "
                "AND status IN (?, ?)",
                (
                    VoiceStatus.TRAINING,
                    self.owner,
                    now,
                    job.tenant,
                    job.voice_id,
                    job.job_id,
                    VoiceStatus.TRAINING,
                    VoiceStatus.FAILED,
                ),
            )
        return job

    def publish_job_inputs(self, job_id: str, folder: str | Path) -> None:
        """Record where job ``job_id``'s files are, so that any server's worker can take the job: the
        local ``folder`` itself for a store on local disk (servers sharing it are on this machine), else
        a copy under ``<root>/.jobs/<job id>/`` (uploaded first, then recorded)."""
        folder = Path(folder)
        if self.local:
            url = str(folder.absolute())
        else:
            remote = f"{self.root}/{JOB_INPUTS_DIR}/{job_id}"
            self.fs.put(str(folder), remote, recursive=True)
            url = self.fs.unstrip_protocol(remote)
        with self._transaction() as db:
            db.execute("UPDATE jobs SET inputs=? WHERE id=?", (url, job_id))

    def fetch_job_inputs(self, job_id: str, folder: str | Path) -> bool:
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
        if self.local:  # a server on this machine with another jobs folder
            if not Path(url).is_dir():
                return False
            atomic_write_folder(folder, lambda temp: shutil.copytree(url, temp, dirs_exist_ok=True))
            return True
        remote = self.fs._strip_protocol(url)
        if not self.fs.exists(remote):
            return False
        atomic_write_folder(folder, lambda temp: self.fs.get(f"{remote}/", f"{temp}/", recursive=True))
        return True

    def remove_job_inputs(self, job_id: str) -> None:
        """Remove the published copy of a job's files (a remote root's; a local job folder is its worker's)."""
        if not self.local:
            self._remove(f"{self.root}/{JOB_INPUTS_DIR}/{job_id}")

    # -- crash recovery ----------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Bring the store back to a consistent state after a crash; call at start-up, before serving.
        Only work of owners found dead (or of none, or of this store before it serves) is touched, so
        servers sharing the store keep working meanwhile.

        Upload prefixes of such owners are removed; a deletion cut short is finished; a training voice
        whose upload was committed (the process died before marking it ready) becomes ready, any other
        becomes failed and its partial folder is removed; a ready voice without a valid commit marker
        becomes failed; queued and running jobs become interrupted (:meth:`claim_job` takes them again).
        """
        dead = self._dead_owners() | {self.owner}  # this store's own work at start-up is a caller's leftover
        report = RecoveryReport()
        for tenant_path in _subpaths(self.fs, self.root):
            if not ID_PATTERN.fullmatch(_basename(tenant_path)):
                continue  # the SQLite files, the jobs' files
            for entry in _subpaths(self.fs, tenant_path):
                name = _basename(entry)
                if name.startswith(UPLOAD_PREFIX) and self._is_dead(_upload_owner(name), dead):
                    self._remove(entry)
                    report.removed_uploads.append(self.fs.unstrip_protocol(entry))
        voices = self.all_voices()
        self._recover_work(dead, voices, report)
        for voice in voices:
            if voice.status == VoiceStatus.READY:
                manifest = self._read_marker(self._blob(voice.tenant, voice.voice_id))
                if manifest is None or manifest[WEIGHTS_FILE].sha256 != voice.sha256:
                    self._set_failed(voice.tenant, voice.voice_id, "its stored folder has no valid commit marker")
                    report.failed_voices.append((voice.tenant, voice.voice_id))
        report.orphan_folders = self._orphan_folders(voices)
        self._forget_owners(dead - {self.owner})
        return report

    def reclaim(self) -> RecoveryReport:
        """Finish or undo the work in flight of every owner found dead since the last look (what
        :meth:`recover` does at start-up, for those owners only); run every third of the lease by a
        thread of every open store, so a job of a server that died is taken up by another within a lease
        or two."""
        with self._lock:
            pending, self._pending_deletes = self._pending_deletes, set()
        for tenant, voice_id in pending:  # this store's own deletions the store refused earlier
            self._finish_delete_or_defer(tenant, voice_id)
        dead = self._dead_owners()
        report = RecoveryReport()
        if not dead:
            return report
        voices = [voice for voice in self.all_voices() if voice.owner in dead]
        for voice in voices:
            if voice.status == VoiceStatus.TRAINING:  # its upload in progress, if any
                for owner in dead:
                    pattern = f"{self.root}/{voice.tenant}/{UPLOAD_PREFIX}{voice.voice_id}-{owner}-*"
                    for entry in self.fs.glob(pattern):
                        self._remove(entry)
                        report.removed_uploads.append(self.fs.unstrip_protocol(entry))
        self._recover_work(dead, voices, report)
        self._forget_owners(dead)
        if any(dataclasses.asdict(report).values()):
            log.warning("reclaimed the work of dead store owner(s) %s: %s", sorted(dead), report)
        return report

    def _dead_owners(self) -> set[str]:
        """The registered owners, this store aside, with no heartbeat within the lease (by the database's
        clock) or that are processes of this machine now gone."""
        now = self._db.now()
        with self._db.read() as db:
            rows = db.execute("SELECT * FROM owners WHERE id!=?", (self.owner,)).fetchall()
        return {
            row["id"]
            for row in rows
            if now - row["heartbeat"] >= self.lease_seconds
            or (row["host"] == _HOST and not _process_exists(row["pid"]))
        }

    def is_alive(self, owner: str) -> bool:
        """Whether store owner ``owner`` (this one, or another process on the store) is alive."""
        return owner == self.owner or not self._is_dead(owner, self._dead_owners())

    def _is_dead(self, owner: str | None, dead: set[str]) -> bool:
        """Whether work of ``owner`` is for recovery: an owner found dead, or none, or one not registered
        (gone before; a store registers before it does any work, so a newcomer is never taken for dead)."""
        if owner is None or owner in dead:
            return True
        with self._db.read() as db:
            return db.execute("SELECT id FROM owners WHERE id=?", (owner,)).fetchone() is None

    def _forget_owners(self, dead: set[str]) -> None:
        """Drop the rows of owners whose work was just recovered (unless one beat again meanwhile)."""
        stale = self._db.now() - self.lease_seconds
        with self._transaction() as db:
            for owner in dead:
                db.execute("DELETE FROM owners WHERE id=? AND (heartbeat<? OR host=?)", (owner, stale, _HOST))

    def _recover_work(self, dead: set[str], voices: list[VoiceRecord], report: RecoveryReport) -> None:
        """Finish the deletions and undo or finish the uploads among ``voices`` of dead owners (see
        :meth:`_is_dead`), and interrupt the active jobs of such owners."""
        for voice in voices:
            if voice.status not in (VoiceStatus.DELETED, VoiceStatus.TRAINING) or not self._is_dead(voice.owner, dead):
                continue
            key = (voice.tenant, voice.voice_id)
            blob = self._blob(*key)
            if voice.status == VoiceStatus.DELETED:
                self._finish_delete(*key)
                report.finished_deletes.append(key)
                continue
            manifest = self._read_marker(blob)
            if manifest is not None and not _mismatches(self.fs, blob, manifest):
                self._restore(voice, manifest)
                report.restored_voices.append(key)
            else:
                self._remove(blob)
                self._set_failed(*key, "interrupted before its upload was committed")
                report.failed_voices.append(key)
        now = time.time()
        with self._transaction() as db:
            rows = db.execute(
                f"SELECT * FROM jobs WHERE status IN ({_placeholders(ACTIVE_JOB)})", ACTIVE_JOB
            ).fetchall()
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
                report.interrupted_jobs.append(row["id"])

    def copy_to(self, target: VoiceStore, on_voice: Callable[[VoiceRecord], None] | None = None) -> CopyReport:
        """Copy every ready voice into ``target`` (``chorus store migrate``), from one snapshot of the
        records: each voice's files are downloaded, checked against its commit marker and its record's
        checksum, uploaded through ``target.put_voice`` (which checks them again where they land), and
        the copy's checksums compared with the source's. Voices not ready, or already in ``target``, are
        skipped; one deleted or replaced while the copy ran is left out. ``on_voice``: called per voice
        (a progress bar)."""
        report = CopyReport()
        for voice in self.all_voices():
            key = (voice.tenant, voice.voice_id)
            if on_voice is not None:
                on_voice(voice)
            if voice.status != VoiceStatus.READY:
                if voice.status != VoiceStatus.DELETED:
                    report.skipped.append((*key, f"{voice.status.value}, not ready"))
                continue
            blob = self._blob(*key)
            with tempfile.TemporaryDirectory(prefix="chorus-copy-") as temp:
                manifest = self._read_marker(blob)
                try:
                    for file in manifest or {}:
                        self.fs.get_file(f"{blob}/{file}", f"{temp}/{file}")
                except FileNotFoundError:
                    manifest = None
                if (
                    manifest is None
                    or manifest[WEIGHTS_FILE].sha256 != voice.sha256
                    or _mismatches(_LOCAL, temp, manifest)
                ):
                    report.gone.append(key)
                    continue
                try:
                    copy = target.put_voice(*key, temp, name=voice.name)
                except VoiceConflict as error:
                    report.skipped.append((*key, f"in the target already ({error})"))
                    continue
            copied = target._read_marker(target._blob(*key))
            if copy.sha256 != voice.sha256 or copied != manifest:
                raise VoiceCorrupted(f"{voice.tenant}/{voice.voice_id}: the copy's checksums differ from the source's")
            with target._transaction() as db:  # the voice keeps its age
                db.execute("UPDATE voices SET created=? WHERE tenant=? AND id=?", (voice.created, *key))
            report.copied.append(key)
        return report

    def backup(self, destination: str | os.PathLike) -> tuple[int, list[tuple[str, str]]]:
        """Copy the store into the new local folder ``destination``, consistently while it serves: a SQLite
        database through its online backup (one snapshot, jobs and failed voices included; a PostgreSQL
        store's ready voices through :meth:`copy_to`), then the files of every voice ready in
        that snapshot, each checked against its commit marker and the snapshot's checksum. ``destination``
        opens as a store itself. Returns (voices copied, voices deleted or replaced before their files were
        copied: left out of the copy)."""
        destination = Path(destination)
        if destination.exists() and any(destination.iterdir()):
            raise ValueError(f"{destination}: the backup folder must be new or empty")
        destination.mkdir(parents=True, exist_ok=True)
        if not isinstance(self._db, SqliteDatabase):  # PostgreSQL: the ready voices, as `migrate` copies them
            with VoiceStore(str(destination)) as copy:
                report = self.copy_to(copy)
            return len(report.copied), report.gone
        copy = self._db.backup(destination / "store.sqlite3")
        try:
            copy.execute("DELETE FROM owners")  # this store's liveness is not the copy's
            ready = [
                _voice_record(r) for r in copy.execute("SELECT * FROM voices WHERE status=?", (VoiceStatus.READY,))
            ]
            copied, gone = 0, []
            for voice in ready:
                blob = self._blob(voice.tenant, voice.voice_id)
                manifest = self._read_marker(blob)
                target = destination / voice.tenant / voice.voice_id
                target.mkdir(parents=True)
                try:
                    for file in [*(manifest or {}), MARKER_FILE]:
                        self.fs.get_file(f"{blob}/{file}", str(target / file))
                except FileNotFoundError:
                    manifest = None
                if (
                    manifest is None
                    or manifest[WEIGHTS_FILE].sha256 != voice.sha256  # replaced after the snapshot
                    or _mismatches(_LOCAL, str(target), manifest)
                ):
                    shutil.rmtree(target)  # deleted or replaced while the backup ran
                    copy.execute("DELETE FROM voices WHERE tenant=? AND id=?", (voice.tenant, voice.voice_id))
                    gone.append((voice.tenant, voice.voice_id))
                else:
                    copied += 1
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            copy.close()
        return copied, gone

    def verify(self) -> VerifyReport:
        """Check every ready voice's files against its commit marker and the record's checksum, and find
        voice folders no record lists (``chorus store verify``). Changes no voice; safe while serving."""
        report = VerifyReport()
        voices = self.all_voices()
        for voice in voices:
            if voice.status != VoiceStatus.READY:
                continue
            report.checked += 1
            blob = self._blob(voice.tenant, voice.voice_id)
            manifest = self._read_marker(blob)
            if manifest is None:
                report.corrupt.append((voice.tenant, voice.voice_id, "no valid commit marker (folder missing?)"))
            elif manifest[WEIGHTS_FILE].sha256 != voice.sha256:
                report.corrupt.append((voice.tenant, voice.voice_id, "weights differ from the record's checksum"))
            elif bad := _mismatches(self.fs, blob, manifest):
                report.corrupt.append(
                    (voice.tenant, voice.voice_id, f"files differ from their marker: {', '.join(bad)}")
                )
        report.orphan_folders = self._orphan_folders(voices)
        return report

    def repair(self) -> RepairReport:
        """Deal with every voice folder no record lists, deleting none (``chorus store repair``): one whose
        commit marker and files check out is adopted as a ready voice, named from its voice card; any other
        is moved to ``<root>/.quarantine/<tenant>/<id>-<time>``. Run while no server writes to the store."""
        voices = self.all_voices()
        report = RepairReport()
        for tenant, voice_id, path in self._orphans(voices):
            manifest = self._read_marker(path)
            if manifest is not None and not _mismatches(self.fs, path, manifest):
                try:
                    card = json.loads(self.fs.cat_file(f"{path}/{CARD_FILE}"))
                except (FileNotFoundError, ValueError):
                    card = {}
                card = card if isinstance(card, dict) else {}
                now = time.time()
                with self._transaction() as db:
                    db.execute(
                        "INSERT INTO voices (tenant, id, name, status, created, updated, blob_url, sha256, "
                        "size_bytes, method) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            tenant,
                            voice_id,
                            str(card.get("name") or voice_id)[:100],
                            VoiceStatus.READY,
                            now,
                            now,
                            self.fs.unstrip_protocol(path),
                            manifest[WEIGHTS_FILE].sha256,
                            sum(d.size for d in manifest.values()),
                            "+".join(card.get("methods") or []) or None,
                        ),
                    )
                report.adopted.append((tenant, voice_id))
            else:
                target = f"{self.root}/{QUARANTINE_DIR}/{tenant}/{voice_id}-{int(time.time())}"
                if self.local:
                    self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                    self.fs.mv(path, target, recursive=True)
                else:  # an object store has no folders to move: each object goes
                    for file in self.fs.find(path):
                        self.fs.mv(file, f"{target}/{file[len(path) :].lstrip('/')}")
                    self._remove(path)
                report.quarantined.append(self.fs.unstrip_protocol(target))
        return report

    def _orphans(self, voices: list[VoiceRecord]) -> list[tuple[str, str, str]]:
        """(tenant, voice id, path) of the voice folders (``<root>/<tenant>/<id>``) no record lists."""
        known = {(v.tenant, v.voice_id) for v in voices}
        orphans = []
        for tenant_path in _subpaths(self.fs, self.root):
            tenant = _basename(tenant_path)
            if not ID_PATTERN.fullmatch(tenant) or not self.fs.isdir(tenant_path):
                continue  # the SQLite files, the quarantine
            for entry in _subpaths(self.fs, tenant_path):
                name = _basename(entry)
                if ID_PATTERN.fullmatch(name) and (tenant, name) not in known:
                    orphans.append((tenant, name, entry))
        return sorted(orphans)

    def _orphan_folders(self, voices: list[VoiceRecord]) -> list[str]:
        """The orphan voice folders as URLs."""
        return [self.fs.unstrip_protocol(path) for _, _, path in self._orphans(voices)]

    def write_problem(self) -> str | None:
        """Why the store cannot take writes now (None when it can): a probe file written to and removed
        from the voice root, and a write to the database rolled back. For ``/healthz``."""
        try:
            self._probe_files()
            self._db.probe_write()
        except Exception as error:  # noqa: BLE001 - whatever the probe meets (an S3 endpoint down too) is the problem
            return f"{type(error).__name__}: {error}"[:200]
        return None

    # -- internals ---------------------------------------------------------------------------------

    def _probe_files(self) -> None:
        """Write and remove a small file in the voice root: raises what a read-only or full root raises.
        The probe is removed even when writing it failed half-way (a full disk leaves an empty file)."""
        probe = f"{self.root}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            self.fs.pipe_file(probe, b"chorus")
        finally:
            with contextlib.suppress(OSError):
                self.fs.rm_file(probe)

    def _transaction(self) -> AbstractContextManager[Sql]:
        """One exclusive write transaction (see :mod:`chorus.serving.metadata`)."""
        return self._db.transaction()

    def _blob(self, tenant: str, voice_id: str) -> str:
        return f"{self.root}/{tenant}/{voice_id}"

    def _check_claimable(self, db: Sql, tenant: str, voice_id: str, job_id: str | None) -> None:
        row = db.execute("SELECT status, job_id FROM voices WHERE tenant=? AND id=?", (tenant, voice_id)).fetchone()
        if row is None or row["status"] == VoiceStatus.FAILED:
            return
        if row["status"] == VoiceStatus.TRAINING and job_id is not None and row["job_id"] == job_id:
            return
        reasons = {
            VoiceStatus.READY: "exists already (delete it first)",
            VoiceStatus.TRAINING: f"is being trained (job {row['job_id']})",
            VoiceStatus.DELETED: "is being deleted",
        }
        raise VoiceConflict(f"voice {voice_id!r} {reasons[VoiceStatus(row['status'])]}")

    def _claim(self, tenant: str, voice_id: str, name: str, method: str, job_id: str | None) -> None:
        """Mark the voice training before any blob is written, so a crash mid-upload leaves a row that
        ``recover`` can find."""
        now = time.time()
        with self._transaction() as db:
            if job_id is not None:
                job = db.execute(
                    "SELECT status, owner FROM jobs WHERE id=? AND tenant=? AND voice_id=?", (job_id, tenant, voice_id)
                ).fetchone()
                if job is None:
                    raise JobNotFound(f"no job {job_id!r} for voice {voice_id!r}")
                if job["status"] not in ACTIVE_JOB:
                    raise VoiceConflict(f"job {job_id!r} is {job['status']}; its voice is not accepted")
                if job["owner"] != self.owner:  # this store was found dead, and another worker took the job
                    raise VoiceConflict(f"job {job_id!r} is held by another worker; its voice is not accepted")
            self._check_claimable(db, tenant, voice_id, job_id)
            self._upsert_training(db, tenant, voice_id, name, method, job_id, now)

    def _upsert_training(
        self,
        db: Sql,
        tenant: str,
        voice_id: str,
        name: str,
        method: str | None,
        job_id: str | None,
        now: float,
    ) -> None:
        db.execute(
            "INSERT INTO voices (tenant, id, name, status, created, updated, blob_url, method, job_id, owner) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, id) DO UPDATE SET name=excluded.name, status=excluded.status, "
            "updated=excluded.updated, sha256=NULL, size_bytes=NULL, method=excluded.method, "
            "job_id=excluded.job_id, error=NULL, owner=excluded.owner",
            (
                tenant,
                voice_id,
                name,
                VoiceStatus.TRAINING,
                now,
                now,
                self.fs.unstrip_protocol(self._blob(tenant, voice_id)),
                method,
                job_id,
                self.owner,
            ),
        )

    def _set_failed(self, tenant: str, voice_id: str, error: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE voices SET status=?, error=?, updated=? WHERE tenant=? AND id=? AND status!=?",
                (VoiceStatus.FAILED, error, time.time(), tenant, voice_id, VoiceStatus.DELETED),
            )

    def _corrupted(self, tenant: str, voice_id: str, reason: str) -> NoReturn:
        self._set_failed(tenant, voice_id, reason)
        raise VoiceCorrupted(f"voice {voice_id!r} refused: {reason}; it is marked failed and must be uploaded again")

    def _restore(self, voice: VoiceRecord, manifest: dict[str, FileDigest]) -> None:
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "UPDATE voices SET status=?, sha256=?, size_bytes=?, error=NULL, owner=NULL, updated=? "
                "WHERE tenant=? AND id=?",
                (
                    VoiceStatus.READY,
                    manifest[WEIGHTS_FILE].sha256,
                    sum(d.size for d in manifest.values()),
                    now,
                    voice.tenant,
                    voice.voice_id,
                ),
            )
            if voice.job_id is not None:
                db.execute(
                    f"UPDATE jobs SET status=?, progress=1, owner=NULL, updated=? WHERE id=? "
                    f"AND status IN ({_placeholders(ACTIVE_JOB)})",
                    (JobStatus.DONE, now, voice.job_id, *ACTIVE_JOB),
                )

    def _finish_delete(self, tenant: str, voice_id: str) -> None:
        blob = self._blob(tenant, voice_id)
        # The marker goes first: a deletion cut short leaves an uncommitted folder, never a partial
        # voice that looks whole.
        self._remove(f"{blob}/{MARKER_FILE}")
        self._remove(blob)
        shutil.rmtree(self.cache_dir / tenant / voice_id, ignore_errors=True)
        with self._transaction() as db:
            db.execute(
                "DELETE FROM voices WHERE tenant=? AND id=? AND status=?", (tenant, voice_id, VoiceStatus.DELETED)
            )

    def _move_into_place(self, temp: str, blob: str, files: list[str]) -> None:
        # Whatever is at ``blob`` now is uncommitted or a failed voice (a ready one was refused).
        self._remove(blob)
        if self.local:
            os.replace(temp, blob)
            return
        for file in files:
            self.fs.mv(f"{temp}/{file}", f"{blob}/{file}")
        self._remove(temp)

    def _read_marker(self, blob: str) -> dict[str, FileDigest] | None:
        """The committed files of a voice folder, or None if it has no valid commit marker."""
        try:
            marker = json.loads(self.fs.cat_file(f"{blob}/{MARKER_FILE}"))
            files = {file: FileDigest(str(d["sha256"]), int(d["size"])) for file, d in marker["files"].items()}
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a marker cut short by a crash reads as no marker
        if marker.get("format") != MARKER_FORMAT or not REQUIRED_FILES <= set(files) <= VOICE_FILES:
            return None
        return files

    def _remove(self, path: str) -> None:
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass  # an object store may drop an emptied prefix on its own

    def _download_lock(self, tenant: str, voice_id: str) -> threading.Lock:
        with self._lock:
            return self._download_locks.setdefault((tenant, voice_id), threading.Lock())


_LOCAL = LocalFileSystem()


def _voice_files(folder: Path) -> dict[str, Path]:
    """The files of a voice folder to upload; refuses pickles and anything else unexpected."""
    if not folder.is_dir():
        raise VoiceError(f"{folder}: not a folder")
    entries = {path.name: path for path in folder.iterdir()}
    pickles = sorted(name for name in entries if Path(name).suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise VoiceError(
            f"{folder}: refusing pickle files {pickles}: voice weights are loaded only from "
            f"safetensors (a pickle can run code when loaded)"
        )
    unexpected = sorted(name for name, path in entries.items() if name not in VOICE_FILES or not path.is_file())
    if unexpected:
        raise VoiceError(f"{folder}: unexpected entries {unexpected}; a voice folder holds only {sorted(VOICE_FILES)}")
    missing = sorted(REQUIRED_FILES - set(entries))
    if missing:
        raise VoiceError(f"{folder}: missing {missing} (not a voice folder)")
    return entries


def _digest(fs: fsspec.AbstractFileSystem, path: str) -> FileDigest:
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return FileDigest(digest.hexdigest(), size)


def _mismatches(fs: fsspec.AbstractFileSystem, folder: str, manifest: dict[str, FileDigest]) -> list[str]:
    """Names of the files in ``manifest`` that are missing from ``folder`` or differ."""
    bad = []
    for file, expected in manifest.items():
        try:
            if _digest(fs, f"{folder}/{file}") != expected:
                bad.append(file)
        except FileNotFoundError:
            bad.append(file)
    return bad


def _subpaths(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    try:
        return [entry.rstrip("/") for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def _names(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    return [_basename(entry) for entry in _subpaths(fs, path)]


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _upload_owner(name: str) -> str | None:
    """The owner in an upload prefix's name (``.upload-<voice id>-<owner>-<token>``)."""
    parts = name.removeprefix(UPLOAD_PREFIX).rsplit("-", 2)
    return parts[1] if len(parts) == 3 else None


def _host_identity() -> str:
    """This machine's name and, on Linux, its PID namespace: two containers that share a host name
    (host networking) still see each other's process ids as foreign."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}/{namespace}"


_HOST = _host_identity()  # where a process id in the owners table can be checked with kill(pid, 0)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _storage_options(root_url: str) -> dict:
    """No cached listings on an object store: other servers write the same prefixes."""
    protocol = root_url.split("://", 1)[0] if "://" in root_url else "file"
    return {"use_listings_cache": False} if protocol in ("s3", "s3a", "gs", "gcs", "az", "abfs") else {}


def _default_cache_dir(root_url: str) -> Path:
    """Where voices of a store with a shared database are cached when no ``cache_dir`` is given."""
    digest = hashlib.sha256(root_url.encode()).hexdigest()[:16]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chorus" / f"store-{digest}" / "voices"


def outage_errors() -> tuple[type[Exception], ...]:
    """What a shared store raises while its database or object store cannot be reached: psycopg's and its
    pool's errors (PostgreSQL), botocore's (S3 through s3fs). Each only if installed (the serve extra)."""
    found: list[type[Exception]] = []
    try:
        import psycopg
        import psycopg_pool

        found += [psycopg.Error, psycopg_pool.PoolTimeout]
    except ImportError:
        pass
    try:
        from botocore.exceptions import BotoCoreError

        found.append(BotoCoreError)
    except ImportError:
        pass
    return tuple(found)


def _active_jobs(db: Sql, tenant: str) -> int:
    """How many of ``tenant``'s jobs are queued or running."""
    query = f"SELECT COUNT(*) AS total FROM jobs WHERE tenant=? AND status IN ({_placeholders(ACTIVE_JOB)})"
    return int(db.execute(query, (tenant, *ACTIVE_JOB)).fetchone()["total"])


def _placeholders(values: tuple) -> str:
    return ", ".join("?" * len(values))


def _voice_record(row: Mapping) -> VoiceRecord:
    return VoiceRecord(
        tenant=row["tenant"],
        voice_id=row["id"],
        name=row["name"],
        status=VoiceStatus(row["status"]),
        created=row["created"],
        updated=row["updated"],
        blob_url=row["blob_url"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        method=row["method"],
        job_id=row["job_id"],
        error=row["error"],
        owner=row["owner"],
    )


def _job_record(row: Mapping) -> JobRecord:
    return JobRecord(
        job_id=row["id"],
        tenant=row["tenant"],
        voice_id=row["voice_id"],
        status=JobStatus(row["status"]),
        progress=row["progress"],
        message=row["message"],
        created=row["created"],
        updated=row["updated"],
    )
