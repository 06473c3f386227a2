"""An operator's care of a store (``chorus store ...``): copy its voices into another store (migrate),
back it up while it serves, verify every voice's files, and repair the folders no record lists."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chorus.adapters.voice import WEIGHTS_FILE
from chorus.serving.store.backends import Backends
from chorus.serving.store.layout import LOCAL, MARKER_FILE, BlobLayout, Manifest, mismatches
from chorus.serving.store.metadata import SqliteDatabase
from chorus.serving.store.records import VoiceConflict, VoiceCorrupted, VoiceRecord, VoiceStatus, voice_record
from chorus.serving.store.voices import Voices


@dataclass
class VerifyReport:
    """What ``VoiceStore.verify`` found; it changes nothing."""

    checked: int = 0  # ready voices whose files were read and hashed
    corrupt: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, voice id, what is wrong)
    orphan_folders: list[str] = field(default_factory=list)  # voice folders no record lists
    # (tenant, voice id, why it was failed) of voices a server marked failed once their files were stored (a
    # checksum that no longer matched), whose files check out again: `chorus store repair` makes them ready
    restorable: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.orphan_folders and not self.restorable


@dataclass
class RepairReport:
    """What ``VoiceStore.repair`` did with the voice folders no record listed."""

    adopted: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id), now ready voices
    quarantined: list[str] = field(default_factory=list)  # where each other folder was moved
    restored: list[tuple[str, str]] = field(default_factory=list)  # voices marked failed, whole again: ready


@dataclass
class CopyReport:
    """What ``VoiceStore.copy_to`` copied, and what it did not."""

    copied: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id), checksums equal
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, voice id, why)
    gone: list[tuple[str, str]] = field(default_factory=list)  # deleted or replaced while it copied
    # (tenant, voice id) of custom voices that speak as their instant voice, their refinement failed: a record
    # with no files, copied as it is
    instant: list[tuple[str, str]] = field(default_factory=list)
    consents: int = 0  # consent recordings copied (the audit records voices were made under)
    consents_given: int = 0  # entries of the consent that onboarding uploads were given, copied


# Every column of the consents and consent_audit tables, copied as they are.
CONSENT_COLUMNS = "tenant, id, name, language, created, heard, word_error_rate, embedding, recording, recording_sha256"
AUDIT_COLUMNS = "tenant, voice_id, job_id, created, entry"


class Maintenance:
    """Copy, back up, verify and repair the store of ``backends`` and ``voices``."""

    def __init__(self, backends: Backends, voices: Voices) -> None:
        self._layout, self._db = backends.layout, backends.db
        self._voices = voices

    def copy_to(self, target: Voices, on_voice: Callable[[VoiceRecord], None] | None = None) -> CopyReport:
        """Copy every ready voice into the voices of another store, from one snapshot of the records, with
        every consent recording and each custom voice that speaks as its instant voice (its refinement
        failed, or still training: :meth:`_copy_instant`): each
        voice's files are downloaded, checked against its commit marker and its record's checksum,
        uploaded through ``target.put`` (which checks them again where they land), and the copy's
        checksums compared with the source's. Voices not ready, or already in ``target``, are skipped;
        one deleted or replaced while the copy ran is left out. ``on_voice``: called per voice (a
        progress bar)."""
        # The voices first: a consent a voice read here names cannot be deleted while that voice exists, so it
        # is still there to copy after (the other way round, a voice made meanwhile would name a consent not copied).
        voices = self._voices.every()
        report = CopyReport(
            # a consent is known by its tenant and id; an entry of the consent given with an upload, by all of it
            consents=self._copy_rows(target, "consents", CONSENT_COLUMNS, key=2),
            consents_given=self._copy_rows(target, "consent_audit", AUDIT_COLUMNS, key=5),
        )
        for voice in voices:
            key = (voice.tenant, voice.voice_id)
            if on_voice is not None:
                on_voice(voice)
            if voice.status in (VoiceStatus.FAILED, VoiceStatus.TRAINING) and voice.instant is not None:
                self._copy_instant(voice, target, report)
                continue
            if voice.status != VoiceStatus.READY:
                if voice.status != VoiceStatus.DELETED:
                    report.skipped.append((*key, f"{voice.status.value}, not ready"))
                continue
            blob = self._layout.blob(*key)
            with tempfile.TemporaryDirectory(prefix="chorus-copy-") as temp:
                manifest = self._layout.read_marker(blob)
                try:
                    for file in manifest or {}:
                        self._layout.fs.get_file(f"{blob}/{file}", f"{temp}/{file}")
                except FileNotFoundError:
                    manifest = None
                if (
                    manifest is None
                    or manifest[WEIGHTS_FILE].sha256 != voice.sha256
                    or mismatches(LOCAL, temp, manifest)
                ):
                    report.gone.append(key)
                    continue
                try:
                    copy = target.put(*key, temp, name=voice.name)
                except VoiceConflict as error:
                    report.skipped.append((*key, f"in the target already ({error})"))
                    continue
            copied = target.backends.layout.read_marker(target.backends.layout.blob(*key))
            if copy.sha256 != voice.sha256 or copied != manifest:
                raise VoiceCorrupted(f"{voice.tenant}/{voice.voice_id}: the copy's checksums differ from the source's")
            # The voice keeps its age, its consent, its instant voice and the id of the job that made it (the job
            # stays behind: a voice a job made is read as refined, done, where its job is not)
            with target.backends.db.transaction() as db:
                db.execute(
                    "UPDATE voices SET created=?, consent_id=?, instant=?, job_id=? WHERE tenant=? AND id=?",
                    (voice.created, voice.consent_id, voice.instant, voice.job_id, *key),
                )
            report.copied.append(key)
        return report

    def _copy_rows(self, target: Voices, table: str, columns: str, key: int) -> int:
        """Copy the rows of ``table`` (its ``columns``, as they are) that ``target`` lacks, a row known by its
        first ``key`` columns; how many."""
        names = columns.split(", ")
        with self._db.read() as db:
            rows = [tuple(row[c] for c in names) for row in db.execute(f"SELECT {columns} FROM {table}").fetchall()]
        with target.backends.db.transaction() as db:
            known = ", ".join(names[:key])
            there = {
                tuple(row[c] for c in names[:key]) for row in db.execute(f"SELECT {known} FROM {table}").fetchall()
            }
            missing = [row for row in rows if row[:key] not in there]
            for row in missing:
                db.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(row))})", row)
        return len(missing)

    def _copy_instant(self, voice: VoiceRecord, target: Voices, report: CopyReport) -> None:
        """Copy the record of a custom voice that speaks as its instant voice (no files: its refinement
        failed, or is still training), as it is but for its job, which stays behind: one still refining
        arrives as one whose refinement failed, saying so (it speaks as its instant voice there too)."""
        error = voice.error
        if voice.status == VoiceStatus.TRAINING:
            error = "its refinement was still training where it was copied from, and stayed there"
        key = (voice.tenant, voice.voice_id)
        layout = target.backends.layout
        with target.backends.db.transaction() as db:
            if db.execute("SELECT 1 FROM voices WHERE tenant=? AND id=?", key).fetchone() is not None:
                report.skipped.append((*key, "in the target already"))
                return
            db.execute(
                "INSERT INTO voices (tenant, id, name, status, created, updated, blob_url, method, error, "
                "consent_id, instant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    *key,
                    voice.name,
                    VoiceStatus.FAILED,
                    voice.created,
                    voice.updated,
                    layout.url(layout.blob(*key)),
                    voice.method,
                    error,
                    voice.consent_id,
                    voice.instant,
                ),
            )
        report.instant.append(key)

    def backup(
        self, destination: str | os.PathLike, copy_into_new_store: Callable[[Path], CopyReport]
    ) -> tuple[int, list[tuple[str, str]]]:
        """Copy the store into the new local folder ``destination``, consistently while it serves: a SQLite
        database through its online backup (one snapshot, jobs and failed voices included), then the files
        of every voice ready in that snapshot, each checked against its commit marker and the snapshot's
        checksum. A PostgreSQL store's ready voices go through ``copy_into_new_store`` (:meth:`copy_to` a
        store opened at ``destination``). ``destination`` opens as a store itself. Returns (voices
        copied, voices deleted or replaced before their files were copied: left out of the copy)."""
        destination = Path(destination)
        if destination.exists() and any(destination.iterdir()):
            raise ValueError(f"{destination}: the backup folder must be new or empty")
        destination.mkdir(parents=True, exist_ok=True)
        if not isinstance(self._db, SqliteDatabase):  # PostgreSQL: the ready voices, as `migrate` copies them
            report = copy_into_new_store(destination)
            return len(report.copied), report.gone
        copy = self._db.backup(destination / "store.sqlite3")
        try:
            copy.execute("DELETE FROM owners")  # this store's liveness is not the copy's
            ready = [voice_record(r) for r in copy.execute("SELECT * FROM voices WHERE status=?", (VoiceStatus.READY,))]
            copied, gone = 0, []
            for voice in ready:
                blob = self._layout.blob(voice.tenant, voice.voice_id)
                manifest = self._layout.read_marker(blob)
                target = destination / voice.tenant / voice.voice_id
                target.mkdir(parents=True)
                try:
                    for file in [*(manifest or {}), MARKER_FILE]:
                        self._layout.fs.get_file(f"{blob}/{file}", str(target / file))
                except FileNotFoundError:
                    manifest = None
                if (
                    manifest is None
                    or manifest[WEIGHTS_FILE].sha256 != voice.sha256  # replaced after the snapshot
                    or mismatches(LOCAL, str(target), manifest)
                ):
                    shutil.rmtree(target)  # deleted or replaced while the backup ran
                    copy.execute("DELETE FROM voices WHERE tenant=? AND id=?", (voice.tenant, voice.voice_id))
                    gone.append((voice.tenant, voice.voice_id))
                else:
                    copied += 1
            # Every record names its folder in the copy, not the source's (an operator's probe: the copy's records
            # had kept the source's absolute URLs).
            here = BlobLayout(str(destination))
            for tenant, voice_id in copy.execute("SELECT tenant, id FROM voices").fetchall():
                url = here.url(here.blob(tenant, voice_id))
                copy.execute("UPDATE voices SET blob_url=? WHERE tenant=? AND id=?", (url, tenant, voice_id))
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            copy.close()
        return copied, gone

    def verify(self) -> VerifyReport:
        """Check every ready voice's files against its commit marker and the record's checksum, and find
        voice folders no record lists (``chorus store verify``). Changes no voice; safe while serving."""
        report = VerifyReport()
        voices = self._voices.every()
        for voice in voices:
            if self._whole_again(voice) is not None:
                report.restorable.append((voice.tenant, voice.voice_id, voice.error or ""))
            if voice.status != VoiceStatus.READY:
                continue
            report.checked += 1
            problem = self._checked(voice)[1]
            if problem is not None:
                report.corrupt.append((voice.tenant, voice.voice_id, problem))
        report.orphan_folders = self._layout.orphan_urls({(v.tenant, v.voice_id) for v in voices})
        return report

    def _whole_again(self, voice: VoiceRecord) -> Manifest | None:
        """The commit marker of a voice marked failed after its files were stored (it keeps their checksum: a
        server found them changed), when they check out against it and the checksum again (restored from a
        backup); else None."""
        if voice.status != VoiceStatus.FAILED or voice.sha256 is None:
            return None
        manifest, problem = self._checked(voice)
        return manifest if problem is None else None

    def _checked(self, voice: VoiceRecord) -> tuple[Manifest | None, str | None]:
        """The voice's commit marker, and what is wrong with its files against it and its record's checksum
        (None: nothing)."""
        blob = self._layout.blob(voice.tenant, voice.voice_id)
        manifest = self._layout.read_marker(blob)
        if manifest is None:
            return None, "no valid commit marker (folder missing?)"
        if manifest[WEIGHTS_FILE].sha256 != voice.sha256:
            return manifest, "weights differ from the record's checksum"
        if bad := mismatches(self._layout.fs, blob, manifest):
            return manifest, f"files differ from their marker: {', '.join(bad)}"
        return manifest, None

    def repair(self) -> RepairReport:
        """Deal with every voice folder no record lists, deleting none (``chorus store repair``): one whose
        commit marker and files check out is adopted as a ready voice, named from its voice card; any other
        is moved to ``<root>/.quarantine/<tenant>/<id>-<time>``. A voice a server marked failed because its
        files had changed is ready again once they check out. Run while no server writes to the store."""
        report = RepairReport()
        for voice in self._voices.every():
            manifest = self._whole_again(voice)
            if manifest is not None:
                self._voices.restore(voice, manifest)
                report.restored.append((voice.tenant, voice.voice_id))
        for tenant, voice_id, path in self._layout.orphans({(v.tenant, v.voice_id) for v in self._voices.every()}):
            manifest = self._layout.read_marker(path)
            if manifest is None or mismatches(self._layout.fs, path, manifest):
                report.quarantined.append(self._layout.quarantine(tenant, voice_id, path))
                continue
            card = self._layout.read_card(path)
            now = time.time()
            with self._db.transaction() as db:
                db.execute(
                    "INSERT INTO voices (tenant, id, name, status, created, updated, blob_url, sha256, "
                    "size_bytes, method, base) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        tenant,
                        voice_id,
                        str(card.get("name") or voice_id)[:100],
                        VoiceStatus.READY,
                        now,
                        now,
                        self._layout.url(path),
                        manifest[WEIGHTS_FILE].sha256,
                        sum(d.size for d in manifest.values()),
                        "+".join(card.get("methods") or []) or None,
                        str(card["base_model_sha256"]) if card.get("base_model_sha256") else None,
                    ),
                )
            report.adopted.append((tenant, voice_id))
        return report
