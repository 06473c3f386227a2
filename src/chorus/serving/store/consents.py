"""Consent recordings (OpenAI's ``voice_consents``): per tenant, each with what Whisper heard in it, its
speaker's embedding, and the recording itself (base64 in the database: an audit record goes with the
metadata it vouches for, and is never served back). A consent is kept while any voice made under it
exists (:class:`ConsentInUse`); a tenant has at most ``max_consents``.

Beside them, the ``consent_audit`` table: the consent each onboarding upload was given (``POST /v1/voices``'
statement, what the upload kept), one JSON entry per job, never changed nor deleted."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time

from chorus.serving.store.backends import Backends
from chorus.serving.store.metadata import Sql
from chorus.serving.store.records import (
    ConsentInUse,
    ConsentNotFound,
    ConsentRecord,
    QuotaReached,
    VoiceStatus,
    check_id,
    consent_record,
)

CONSENT_PREFIX = "cons_"
_COLUMNS = "tenant, id, name, language, created, heard, word_error_rate, embedding, recording_sha256"


def new_consent_id() -> str:
    """``cons_`` and 24 hex digits: OpenAI's form, and a valid store id."""
    return CONSENT_PREFIX + secrets.token_hex(12)


class Consents:
    """The ``consents`` table."""

    def __init__(self, backends: Backends) -> None:
        self._db = backends.db

    def check_room(self, tenant: str, max_consents: int) -> None:
        """``QuotaReached`` if ``tenant`` keeps ``max_consents`` already: asked before seconds of checking a
        recording that could not be kept (``create`` counts again in its own transaction)."""
        with self._db.read() as db:
            _check_room(db, tenant, max_consents)

    def create(
        self,
        tenant: str,
        *,
        name: str,
        language: str,
        heard: str,
        word_error_rate: float,
        embedding: list[float],
        recording: bytes,
        max_consents: int | None = None,
    ) -> ConsentRecord:
        """Keep a checked consent recording; ``QuotaReached`` past ``max_consents`` (counted in the same
        transaction, as voices are)."""
        check_id(tenant, "tenant")
        consent_id, now = new_consent_id(), time.time()
        with self._db.transaction() as db:
            if max_consents is not None:
                _check_room(db, tenant, max_consents)
            db.execute(
                f"INSERT INTO consents ({_COLUMNS}, recording) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    tenant,
                    consent_id,
                    name,
                    language,
                    now,
                    heard,
                    word_error_rate,
                    json.dumps([round(float(x), 6) for x in embedding]),
                    hashlib.sha256(recording).hexdigest(),
                    base64.b64encode(recording).decode(),
                ),
            )
        return self.get(tenant, consent_id)

    def audit(self, tenant: str, voice_id: str, job_id: str | None, entry: dict) -> None:
        """Keep ``entry`` (JSON-serializable: the statement, the upload's digest ...) as the consent given
        for ``job_id``'s upload of ``voice_id``."""
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO consent_audit (tenant, voice_id, job_id, created, entry) VALUES (?, ?, ?, ?, ?)",
                (tenant, voice_id, job_id, time.time(), json.dumps(entry, ensure_ascii=False, sort_keys=True)),
            )

    def audit_entries(self, tenant: str | None = None) -> list[dict]:
        """Every entry :meth:`audit` kept (of ``tenant``, or of all), oldest first, each with its tenant, voice,
        job and time."""
        query = "SELECT tenant, voice_id, job_id, created, entry FROM consent_audit"
        with self._db.read() as db:
            rows = db.execute(
                query + (" WHERE tenant=?" if tenant is not None else "") + " ORDER BY created, voice_id",
                (tenant,) if tenant is not None else (),
            ).fetchall()
        return [
            {
                **json.loads(row["entry"]),
                "tenant": row["tenant"],
                "voice_id": row["voice_id"],
                "job_id": row["job_id"],
                "created": row["created"],
            }
            for row in rows
        ]

    def get(self, tenant: str, consent_id: str) -> ConsentRecord:
        with self._db.read() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM consents WHERE tenant=? AND id=?", (tenant, consent_id)
            ).fetchone()
        if row is None:
            raise ConsentNotFound(f"no consent recording {consent_id!r}")
        return consent_record(row)

    def recording(self, tenant: str, consent_id: str) -> bytes:
        """The recording as kept: its decoded sound as 16-bit FLAC (``uploads.audit_recording``; older consents,
        the upload itself), for its tenant's audit; no route serves it."""
        with self._db.read() as db:
            row = db.execute("SELECT recording FROM consents WHERE tenant=? AND id=?", (tenant, consent_id)).fetchone()
        if row is None:
            raise ConsentNotFound(f"no consent recording {consent_id!r}")
        return base64.b64decode(row["recording"])

    def of_tenant(self, tenant: str, after: str | None = None, limit: int | None = None) -> list[ConsentRecord]:
        """The tenant's consents, oldest first (then by id); from the one after ``after``, at most ``limit``."""
        with self._db.read() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM consents WHERE tenant=? ORDER BY created, id", (tenant,)
            ).fetchall()
        records = [consent_record(row) for row in rows]
        if after is not None:
            ids = [r.consent_id for r in records]
            if after not in ids:
                raise ConsentNotFound(f"no consent recording {after!r} to list after")
            records = records[ids.index(after) + 1 :]
        return records if limit is None else records[:limit]

    def rename(self, tenant: str, consent_id: str, name: str) -> ConsentRecord:
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE consents SET name=? WHERE tenant=? AND id=?", (name, tenant, consent_id)
            ).rowcount
        if not changed:
            raise ConsentNotFound(f"no consent recording {consent_id!r}")
        return self.get(tenant, consent_id)

    def delete(self, tenant: str, consent_id: str) -> None:
        """Forget a consent no voice was made under; ``ConsentInUse`` (naming them) otherwise."""
        with self._db.transaction() as db:
            if db.execute("SELECT 1 FROM consents WHERE tenant=? AND id=?", (tenant, consent_id)).fetchone() is None:
                raise ConsentNotFound(f"no consent recording {consent_id!r}")
            voices = [
                row["id"]
                for row in db.execute(
                    "SELECT id FROM voices WHERE tenant=? AND consent_id=? AND status!=? ORDER BY id",
                    (tenant, consent_id, VoiceStatus.DELETED),
                ).fetchall()
            ]
            if voices:
                raise ConsentInUse(
                    f"consent recording {consent_id!r} is the audit record of voice(s) {', '.join(voices)}: "
                    "delete them first"
                )
            db.execute("DELETE FROM consents WHERE tenant=? AND id=?", (tenant, consent_id))


def _check_room(db: Sql, tenant: str, max_consents: int) -> None:
    total = db.execute("SELECT COUNT(*) AS total FROM consents WHERE tenant=?", (tenant,)).fetchone()["total"]
    if total >= max_consents:
        raise QuotaReached(
            f"you keep {total} consent recording{'' if total == 1 else 's'} (at most {max_consents}); delete unused "
            "ones",
            "consents",
        )
