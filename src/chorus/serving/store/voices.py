"""The voice records of a store: uploading a voice (claimed in the database before any file is written,
marked ready only once committed), serving it (its files checked against their checksums on every
load), listing and deleting it. A voice's status says whether it may be served: only ``ready`` voices
are. Every query is scoped by tenant: another tenant's voice raises the same ``VoiceNotFound`` as one
that does not exist."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import NoReturn

from chorus.adapters.voice import WEIGHTS_FILE, read_voice
from chorus.serving.store.backends import Backends, outage_errors
from chorus.serving.store.cache import DownloadCache
from chorus.serving.store.layout import LOCAL, MARKER_FILE, Manifest, digest, mismatches, voice_files
from chorus.serving.store.metadata import Sql
from chorus.serving.store.records import (
    ACTIVE_JOB,
    JobNotFound,
    JobStatus,
    VoiceConflict,
    VoiceCorrupted,
    VoiceNotFound,
    VoiceNotReady,
    VoiceRecord,
    VoiceStatus,
    check_id,
    placeholders,
    voice_record,
)

log = logging.getLogger("chorus.serving.store")


class Voices:
    """The ``voices`` table and the voice folders it lists; safe to share between threads. ``cache``:
    where the voices of a remote root are downloaded to be served."""

    def __init__(self, backends: Backends, cache: DownloadCache) -> None:
        self.backends = backends
        self.cache = cache
        self._layout, self._db, self._owner = backends.layout, backends.db, backends.owner
        self._lock = threading.Lock()
        self._pending_deletes: set[tuple[str, str]] = set()  # (tenant, voice id) whose files are left

    def put(
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
        files = voice_files(folder)
        voice = read_voice(folder)
        manifest = {file: digest(LOCAL, str(path)) for file, path in files.items()}
        self._claim(tenant, voice_id, name or voice_id, "+".join(voice.methods), job_id)
        try:
            self._layout.write_voice(tenant, voice_id, self._owner, files, manifest)
        except BaseException as error:
            self.set_failed(tenant, voice_id, f"upload failed: {error}")
            raise
        now = time.time()
        with self._db.transaction() as db:
            # Only while the voice is still this upload's: a deletion, or another server that found this
            # one dead and undid its upload, wins.
            marked = db.execute(
                "UPDATE voices SET status=?, sha256=?, size_bytes=?, base=?, error=NULL, owner=NULL, updated=? "
                "WHERE tenant=? AND id=? AND status=? AND owner=?",
                (
                    VoiceStatus.READY,
                    manifest[WEIGHTS_FILE].sha256,
                    sum(d.size for d in manifest.values()),
                    (voice.card.base_model_sha256 or None) if voice.card else None,
                    now,
                    tenant,
                    voice_id,
                    VoiceStatus.TRAINING,
                    self._owner,
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
                # the deletion may have removed the folder before this upload moved in
                self._layout.remove(self._layout.blob(tenant, voice_id))
            raise VoiceConflict(f"voice {voice_id!r} was deleted or taken over while it was uploaded")
        return self.record(tenant, voice_id)

    def get(self, tenant: str, voice_id: str) -> Path:
        """A local folder holding the ready voice, its files checked against their checksums now.

        For a remote root the folder is a cached download, fetched again if it does not match.
        A voice whose stored files do not match (or carry anything but the voice files) is marked
        failed and ``VoiceCorrupted`` is raised; it is not served again until uploaded anew.
        """
        return self.folder(self.record(tenant, voice_id))

    def folder(self, record: VoiceRecord) -> Path:
        """:meth:`get` of a record read before (a request's): ``VoiceNotFound`` when the voice was replaced
        or deleted since, rather than a mismatch taken for corruption."""
        tenant, voice_id = record.tenant, record.voice_id
        if record.status != VoiceStatus.READY:
            detail = f": {record.error}" if record.error else ""
            raise VoiceNotReady(f"voice {voice_id!r} is {record.status.value}{detail}")
        blob = self._layout.blob(tenant, voice_id)
        manifest = self._layout.read_marker(blob)
        if manifest is None or manifest[WEIGHTS_FILE].sha256 != record.sha256:
            if self.record(tenant, voice_id).sha256 != record.sha256:  # raises VoiceNotFound once deleted
                raise VoiceNotFound(f"voice {voice_id!r} was replaced")
            self._corrupted(tenant, voice_id, "its stored folder has no valid commit marker for these weights")
        stray = self._layout.stray_files(blob)
        if stray:
            self._corrupted(
                tenant,
                voice_id,
                f"its stored folder holds unexpected files {stray} (only the "
                f"voice files and safetensors weights are ever loaded)",
            )
        if self._layout.local:
            local, bad = Path(blob), mismatches(self._layout.fs, blob, manifest)
        else:
            local, bad = self.cache.fetch(self._layout, tenant, voice_id, manifest)
        if bad:
            self._corrupted(tenant, voice_id, f"checksum mismatch in {', '.join(bad)}")
        return local

    def record(self, tenant: str, voice_id: str) -> VoiceRecord:
        """The metadata of one voice of ``tenant`` (any status but deleted)."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        with self._db.read() as db:
            row = db.execute(
                "SELECT * FROM voices WHERE tenant=? AND id=? AND status!=?", (tenant, voice_id, VoiceStatus.DELETED)
            ).fetchone()
        if row is None:
            raise VoiceNotFound(f"no voice {voice_id!r}")
        return voice_record(row)

    def of_tenant(self, tenant: str) -> list[VoiceRecord]:
        """Every voice of ``tenant`` with its status (ready, training, failed), by id."""
        check_id(tenant, "tenant")
        with self._db.read() as db:
            rows = db.execute(
                "SELECT * FROM voices WHERE tenant=? AND status!=? ORDER BY id", (tenant, VoiceStatus.DELETED)
            ).fetchall()
        return [voice_record(row) for row in rows]

    def every(self) -> list[VoiceRecord]:
        """Every record, whatever its status or tenant."""
        with self._db.read() as db:
            return [voice_record(row) for row in db.execute("SELECT * FROM voices").fetchall()]

    def stored_bytes(self, tenant: str | None = None) -> int:
        """Bytes of the committed voices of ``tenant`` (None: of every tenant)."""
        where, args = ("AND tenant=?", (tenant,)) if tenant is not None else ("", ())
        with self._db.read() as db:
            row = db.execute(
                f"SELECT COALESCE(SUM(size_bytes), 0) AS total FROM voices WHERE status!=? {where}",
                (VoiceStatus.DELETED, *args),
            ).fetchone()
        return int(row["total"])

    def delete(self, tenant: str, voice_id: str) -> bool:
        """Delete a voice: it stops being served at once; its files, cached copy and row go after.
        A job queued, training or interrupted for it is marked failed (its upload would then be refused, and
        no worker takes it up again to bring the voice back). Returns whether its
        files went now; when the store refuses (read-only, full), the voice is deleted all the same and
        its files are removed by :meth:`finish_pending_deletes` (the store's next reclaim) or start-up."""
        check_id(tenant, "tenant")
        check_id(voice_id)
        now = time.time()
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE voices SET status=?, owner=?, updated=? WHERE tenant=? AND id=? AND status!=?",
                (VoiceStatus.DELETED, self._owner, now, tenant, voice_id, VoiceStatus.DELETED),
            ).rowcount
            if not changed:
                raise VoiceNotFound(f"no voice {voice_id!r}")
            unfinished = (*ACTIVE_JOB, JobStatus.INTERRUPTED)
            db.execute(
                f"UPDATE jobs SET status=?, message=?, updated=? WHERE tenant=? AND voice_id=? "
                f"AND status IN ({placeholders(unfinished)})",
                (JobStatus.FAILED, "voice deleted", now, tenant, voice_id, *unfinished),
            )
        return self._finish_delete_or_defer(tenant, voice_id)

    def finish_pending_deletes(self) -> None:
        """Retry removing the files of this store's deletions the store refused earlier."""
        with self._lock:
            pending, self._pending_deletes = self._pending_deletes, set()
        for tenant, voice_id in pending:
            self._finish_delete_or_defer(tenant, voice_id)

    def _finish_delete_or_defer(self, tenant: str, voice_id: str) -> bool:
        try:
            self.finish_delete(tenant, voice_id)
        except (OSError, sqlite3.Error, *outage_errors()) as error:
            log.warning(
                "voice %s/%s is deleted; its files stay until the store takes writes (%s)", tenant, voice_id, error
            )
            with self._lock:
                self._pending_deletes.add((tenant, voice_id))
            return False
        return True

    def finish_delete(self, tenant: str, voice_id: str) -> None:
        """Remove a deleted voice's files, cached copy and row."""
        blob = self._layout.blob(tenant, voice_id)
        # The marker goes first: a deletion cut short leaves an uncommitted folder, never a partial
        # voice that looks whole.
        self._layout.remove(f"{blob}/{MARKER_FILE}")
        self._layout.remove(blob)
        self.cache.evict(tenant, voice_id)
        with self._db.transaction() as db:
            db.execute(
                "DELETE FROM voices WHERE tenant=? AND id=? AND status=?", (tenant, voice_id, VoiceStatus.DELETED)
            )

    def check_claimable(self, db: Sql, tenant: str, voice_id: str, job_id: str | None) -> None:
        """Raise ``VoiceConflict`` unless the voice is absent, failed, or being trained by ``job_id``."""
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

    def mark_training(
        self,
        db: Sql,
        tenant: str,
        voice_id: str,
        name: str,
        method: str | None,
        job_id: str | None,
        now: float,
        consent_id: str | None = None,
        instant: str | None = None,
        base: str | None = None,
    ) -> None:
        """List the voice as training, owned by this store (a new row, or one that was failed), on the base
        ``base`` (sha256; its instant voice blends that base's speakers)."""
        db.execute(
            "INSERT INTO voices (tenant, id, name, status, created, updated, blob_url, method, job_id, owner, "
            "consent_id, instant, base) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, id) DO UPDATE SET name=excluded.name, status=excluded.status, "
            "updated=excluded.updated, sha256=NULL, size_bytes=NULL, method=excluded.method, "
            "job_id=excluded.job_id, error=NULL, owner=excluded.owner, "
            # the upload of a job's own voice keeps what the job was queued with (consent, instant voice, base)
            "consent_id=CASE WHEN voices.job_id=excluded.job_id THEN voices.consent_id ELSE excluded.consent_id END, "
            "instant=CASE WHEN voices.job_id=excluded.job_id THEN voices.instant ELSE excluded.instant END, "
            "base=CASE WHEN voices.job_id=excluded.job_id THEN voices.base ELSE excluded.base END",
            (
                tenant,
                voice_id,
                name,
                VoiceStatus.TRAINING,
                now,
                now,
                self._layout.url(self._layout.blob(tenant, voice_id)),
                method,
                job_id,
                self._owner,
                consent_id,
                instant,
                base,
            ),
        )

    def _claim(self, tenant: str, voice_id: str, name: str, method: str, job_id: str | None) -> None:
        """Mark the voice training before any blob is written, so a crash mid-upload leaves a row that
        ``recover`` can find."""
        now = time.time()
        with self._db.transaction() as db:
            if job_id is not None:
                job = db.execute(
                    "SELECT status, owner FROM jobs WHERE id=? AND tenant=? AND voice_id=?", (job_id, tenant, voice_id)
                ).fetchone()
                if job is None:
                    raise JobNotFound(f"no job {job_id!r} for voice {voice_id!r}")
                if job["status"] not in ACTIVE_JOB:
                    raise VoiceConflict(f"job {job_id!r} is {job['status']}; its voice is not accepted")
                if job["owner"] != self._owner:  # this store was found dead, and another worker took the job
                    raise VoiceConflict(f"job {job_id!r} is held by another worker; its voice is not accepted")
                # A job uploads only the voice it was queued for: one deleted meanwhile (its row gone with its
                # files) is not brought back by the job's late end, nor is one queued anew by another job.
                voice = db.execute("SELECT job_id FROM voices WHERE tenant=? AND id=?", (tenant, voice_id)).fetchone()
                if voice is None or voice["job_id"] != job_id:
                    raise VoiceConflict(f"voice {voice_id!r} was deleted or replaced while job {job_id!r} trained it")
            self.check_claimable(db, tenant, voice_id, job_id)
            self.mark_training(db, tenant, voice_id, name, method, job_id, now)

    def set_instant(self, tenant: str, voice_id: str, job_id: str, instant: str) -> bool:
        """Make a sample's voice speak as ``instant`` while its job ``job_id`` trains; False if the voice
        has moved on meanwhile (deleted, replaced by another job, already ready)."""
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE voices SET instant=?, updated=? WHERE tenant=? AND id=? AND job_id=? AND status=?",
                (instant, time.time(), tenant, voice_id, job_id, VoiceStatus.TRAINING),
            )
            return changed.rowcount == 1

    def set_failed(self, tenant: str, voice_id: str, error: str) -> None:
        """Mark the voice failed with ``error`` (unless it is being deleted)."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE voices SET status=?, error=?, updated=? WHERE tenant=? AND id=? AND status!=?",
                (VoiceStatus.FAILED, error, time.time(), tenant, voice_id, VoiceStatus.DELETED),
            )

    def _corrupted(self, tenant: str, voice_id: str, reason: str) -> NoReturn:
        self.set_failed(tenant, voice_id, reason)
        raise VoiceCorrupted(f"voice {voice_id!r} refused: {reason}; it is marked failed and must be uploaded again")

    def restore(self, voice: VoiceRecord, manifest: Manifest) -> None:
        """Mark ready a voice whose upload was committed (``manifest``) but not yet recorded, and its job
        done."""
        now = time.time()
        base = self._layout.read_card(self._layout.blob(voice.tenant, voice.voice_id)).get("base_model_sha256")
        with self._db.transaction() as db:
            db.execute(
                "UPDATE voices SET status=?, sha256=?, size_bytes=?, base=?, error=NULL, owner=NULL, updated=? "
                "WHERE tenant=? AND id=?",
                (
                    VoiceStatus.READY,
                    manifest[WEIGHTS_FILE].sha256,
                    sum(d.size for d in manifest.values()),
                    str(base) if base else None,
                    now,
                    voice.tenant,
                    voice.voice_id,
                ),
            )
            if voice.job_id is not None:
                db.execute(
                    f"UPDATE jobs SET status=?, progress=1, owner=NULL, updated=? WHERE id=? "
                    f"AND status IN ({placeholders(ACTIVE_JOB)})",
                    (JobStatus.DONE, now, voice.job_id, *ACTIVE_JOB),
                )
