"""Several processes (servers on several machines) may share one store. Each open store is an *owner*
with a heartbeat in the database; work in flight (an upload, a deletion, a running job) records its
owner, and whoever finds an owner dead (no heartbeat for ``lease_seconds``, or a process of this machine
that is gone) finishes or undoes its work: :meth:`Owners.reclaim`, run by every store's heartbeat
thread, and :meth:`Owners.recover` at start-up. Work of a live owner is never touched."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from chorus.adapters.voice import WEIGHTS_FILE
from chorus.serving.store.backends import Backends
from chorus.serving.store.jobs import Jobs
from chorus.serving.store.layout import mismatches
from chorus.serving.store.records import VoiceRecord, VoiceStatus
from chorus.serving.store.voices import Voices

log = logging.getLogger("chorus.serving.store")

# An owner that has not beaten for this long is dead: its uploads are undone, its deletions finished,
# its jobs resumed by another worker. Long enough for a paused process (a swap storm, a GC) to come back.
LEASE_SECONDS = 15.0


@dataclass
class RecoveryReport:
    """What ``VoiceStore.recover`` found and did."""

    interrupted_jobs: list[str] = field(default_factory=list)
    failed_voices: list[tuple[str, str]] = field(default_factory=list)  # (tenant, voice id)
    restored_voices: list[tuple[str, str]] = field(default_factory=list)  # committed, not yet marked ready
    finished_deletes: list[tuple[str, str]] = field(default_factory=list)
    removed_uploads: list[str] = field(default_factory=list)  # temporary prefixes
    orphan_folders: list[str] = field(default_factory=list)  # voice folders no record lists (left as they are)

    def summary(self) -> str:
        """What was found and done, for an operator's log ("" when nothing was); orphan folders are left out
        (the server names them on a line of their own)."""

        def keys(pairs: list[tuple[str, str]]) -> str:
            return ", ".join(f"{tenant}/{voice_id}" for tenant, voice_id in pairs)

        parts = [
            f"{len(self.interrupted_jobs)} onboarding job(s) cut short, trained again where their clips are kept: "
            f"{', '.join(self.interrupted_jobs)}"
            if self.interrupted_jobs
            else "",
            f"{len(self.failed_voices)} voice(s) failed (cut short before their files were stored, or their files "
            f"lost; a job cut short trains its voice again): {keys(self.failed_voices)}"
            if self.failed_voices
            else "",
            f"{len(self.restored_voices)} voice(s) whose files were stored made ready: {keys(self.restored_voices)}"
            if self.restored_voices
            else "",
            f"{len(self.finished_deletes)} deletion(s) finished: {keys(self.finished_deletes)}"
            if self.finished_deletes
            else "",
            f"{len(self.removed_uploads)} unfinished upload(s) removed" if self.removed_uploads else "",
        ]
        return "; ".join(part for part in parts if part)


class Owners:
    """This store as one owner among those on its database: its heartbeat, and the recovery of the work
    of owners found dead. ``lease_seconds``: how long without a heartbeat makes an owner dead."""

    def __init__(self, backends: Backends, voices: Voices, jobs: Jobs, lease_seconds: float = LEASE_SECONDS) -> None:
        self._layout, self._db, self.owner = backends.layout, backends.db, backends.owner
        self._voices, self._jobs = voices, jobs
        self.lease_seconds = lease_seconds
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    def register(self) -> None:
        """Add this store to the owners table, alive as of now."""
        now = self._db.now()
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO owners (id, host, pid, started, heartbeat) VALUES (?, ?, ?, ?, ?)",
                (self.owner, _HOST, os.getpid(), now, now),
            )

    def start(self) -> None:
        """Beat, and reclaim the work of dead owners, every third of the lease until :meth:`stop`."""
        self._threads = [
            threading.Thread(
                target=self._every_third_of_lease, args=(job,), name=f"chorus-store-{job.__name__}", daemon=True
            )
            for job in (self.beat, self.reclaim)  # apart: a slow reclaim must not delay the heartbeat
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the heartbeat and mark this owner dead: what it left in flight is then anyone's to recover."""
        self._stopped.set()
        for thread in self._threads:
            thread.join()
        with self._db.transaction() as db:
            # Marked dead rather than removed: whatever it left in flight (a job stopped by the
            # server's stop) is for the next reclaim or recovery, of this server or another.
            db.execute("UPDATE owners SET heartbeat=0 WHERE id=?", (self.owner,))

    def _every_third_of_lease(self, job: Callable[[], object]) -> None:
        """Run ``job`` every third of the lease until the store closes; a database that is down for a
        while is logged, not fatal."""
        while not self._stopped.wait(self.lease_seconds / 3):
            try:
                job()
            except Exception:  # noqa: BLE001 - retried at the next turn
                log.exception("store %s failed (retrying)", job.__name__)

    def beat(self) -> None:
        """Mark this store alive (the heartbeat other stores read, by the database's clock)."""
        with self._db.transaction(exclusive=False) as db:
            beat = db.execute("UPDATE owners SET heartbeat=? WHERE id=?", (self._db.now(), self.owner))
        if not beat.rowcount:  # declared dead while paused: its work went to others; it starts afresh
            log.warning("store owner %s was found dead by another server; registering again", self.owner)
            self.register()

    def live_others(self) -> list[dict]:
        """The other owners alive now (a server, a job process, another store command): id, host, pid and
        seconds since their heartbeat, by the database's clock."""
        now, dead = self._db.now(), self._dead_owners()
        with self._db.read() as db:
            rows = db.execute("SELECT * FROM owners WHERE id!=?", (self.owner,)).fetchall()
        return [
            {"id": row["id"], "host": row["host"], "pid": row["pid"], "beat_seconds_ago": now - row["heartbeat"]}
            for row in rows
            if row["id"] not in dead
        ]

    def is_alive(self, owner: str) -> bool:
        """Whether store owner ``owner`` (this one, or another process on the store) is alive."""
        return owner == self.owner or not self._is_dead(owner, self._dead_owners())

    def recover(self) -> RecoveryReport:
        """Bring the store back to a consistent state after a crash; call at start-up, before serving.
        Only work of owners found dead (or of none, or of this store before it serves) is touched, so
        servers sharing the store keep working meanwhile.

        Upload prefixes of such owners are removed; a deletion cut short is finished; a training voice
        whose upload was committed (the process died before marking it ready) becomes ready, any other
        becomes failed and its partial folder is removed; a ready voice without a valid commit marker
        becomes failed; queued and running jobs become interrupted (a worker's claim takes them again).
        """
        dead = self._dead_owners() | {self.owner}  # this store's own work at start-up is a caller's leftover
        report = RecoveryReport()
        for entry, owner in self._layout.uploads():
            if self._is_dead(owner, dead):
                self._layout.remove(entry)
                report.removed_uploads.append(self._layout.url(entry))
        voices = self._voices.every()
        self._recover_work(dead, voices, report)
        for voice in voices:
            if voice.status == VoiceStatus.READY:
                manifest = self._layout.read_marker(self._layout.blob(voice.tenant, voice.voice_id))
                if manifest is None or manifest[WEIGHTS_FILE].sha256 != voice.sha256:
                    self._voices.set_failed(
                        voice.tenant, voice.voice_id, "its stored folder has no valid commit marker"
                    )
                    report.failed_voices.append((voice.tenant, voice.voice_id))
        report.orphan_folders = self._layout.orphan_urls({(v.tenant, v.voice_id) for v in voices})
        self._forget_owners(dead - {self.owner})
        return report

    def reclaim(self) -> RecoveryReport:
        """Finish or undo the work in flight of every owner found dead since the last look (what
        :meth:`recover` does at start-up, for those owners only); run every third of the lease by a
        thread of every open store, so a job of a server that died is taken up by another within a lease
        or two. This store's own deletions whose files the store refused earlier are finished too."""
        self._voices.finish_pending_deletes()
        dead = self._dead_owners()
        report = RecoveryReport()
        if not dead:
            return report
        voices = [voice for voice in self._voices.every() if voice.owner in dead]
        for voice in voices:
            if voice.status == VoiceStatus.TRAINING:  # its upload in progress, if any
                for owner in dead:
                    for entry in self._layout.uploads_of(voice.tenant, voice.voice_id, owner):
                        self._layout.remove(entry)
                        report.removed_uploads.append(self._layout.url(entry))
        self._recover_work(dead, voices, report)
        self._forget_owners(dead)
        if report.summary():
            log.warning("reclaimed the work of dead store owner(s) %s: %s", sorted(dead), report.summary())
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
        with self._db.transaction() as db:
            for owner in dead:
                db.execute("DELETE FROM owners WHERE id=? AND (heartbeat<? OR host=?)", (owner, stale, _HOST))

    def _recover_work(self, dead: set[str], voices: list[VoiceRecord], report: RecoveryReport) -> None:
        """Finish the deletions and undo or finish the uploads among ``voices`` of dead owners (see
        :meth:`_is_dead`), and interrupt the active jobs of such owners."""
        for voice in voices:
            if voice.status not in (VoiceStatus.DELETED, VoiceStatus.TRAINING) or not self._is_dead(voice.owner, dead):
                continue
            key = (voice.tenant, voice.voice_id)
            blob = self._layout.blob(*key)
            if voice.status == VoiceStatus.DELETED:
                self._voices.finish_delete(*key)
                report.finished_deletes.append(key)
                continue
            manifest = self._layout.read_marker(blob)
            if manifest is not None and not mismatches(self._layout.fs, blob, manifest):
                self._voices.restore(voice, manifest)
                report.restored_voices.append(key)
            else:
                self._layout.remove(blob)
                self._voices.set_failed(*key, "interrupted before its upload was committed")
                report.failed_voices.append(key)
        report.interrupted_jobs += self._jobs.interrupt(dead)


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
