"""What the voice store hands out and raises: tenant and voice ids, the statuses and records of its
``voices`` and ``jobs`` tables, and its errors."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from chorus.adapters.voice import VoiceError

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


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


class ConsentNotFound(KeyError):
    """No such consent recording for this tenant (whether or not another tenant has one of that id)."""


class ConsentInUse(RuntimeError):
    """A consent recording that voices were made under: it is their audit record, kept while they exist."""


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
    consent_id: str | None = None  # the consent recording it was made under (OpenAI's custom voices)
    instant: str | None = None  # a blend of base speakers it speaks as until its adapted voice is ready
    base: str | None = None  # sha256 of the base it was adapted on (its card's), once committed

    def made_on(self, base_sha256: str) -> bool:
        """Whether it speaks on the base ``base_sha256``: adapted on it, or not adapted yet (a sample's instant
        voice, or clips training: the server that trains them adapts them on its own base)."""
        return self.base is None or self.base == base_sha256

    @property
    def stage(self) -> str:
        """What it speaks as now: ``adapted``, ``instant`` (a sample's voice before or without its
        refinement), else ``training`` or ``failed`` (an upload of clips: nothing to speak yet)."""
        if self.status == VoiceStatus.READY:
            return "adapted"
        return "instant" if self.instant else self.status.value


@dataclass(frozen=True)
class ConsentRecord:
    """One row of the ``consents`` table: a consent recording (an audit record, kept while any voice made
    under it exists). ``heard``: Whisper's transcript of it; ``embedding``: its speaker in the encoder's
    space ``[D]``; the recording itself is read only by :meth:`VoiceStore.consent_recording`."""

    tenant: str
    consent_id: str
    name: str
    language: str
    created: float
    heard: str
    word_error_rate: float
    embedding: tuple[float, ...]
    recording_sha256: str


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


def check_id(value: str, kind: str = "voice id") -> str:
    """Return ``value`` if it is a valid tenant or voice id, else raise ``InvalidId``."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidId(f"invalid {kind} {value!r}: use 1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit")
    return value


def placeholders(values: tuple) -> str:
    """``?, ?, ...``: one SQL placeholder per value (for ``IN (...)``)."""
    return ", ".join("?" * len(values))


def voice_record(row: Mapping) -> VoiceRecord:
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
        consent_id=row["consent_id"],
        instant=row["instant"],
        base=row["base"],
    )


def consent_record(row: Mapping) -> ConsentRecord:
    return ConsentRecord(
        tenant=row["tenant"],
        consent_id=row["id"],
        name=row["name"],
        language=row["language"],
        created=row["created"],
        heard=row["heard"],
        word_error_rate=row["word_error_rate"],
        embedding=tuple(json.loads(row["embedding"])),
        recording_sha256=row["recording_sha256"],
    )


def job_record(row: Mapping) -> JobRecord:
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
