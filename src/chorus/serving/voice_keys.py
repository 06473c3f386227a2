"""How an adapted voice of the store reaches the engine: a :class:`StoredVoice` (its record, read once per
request) keyed ``<tenant>/<voice id>@<weights sha256 prefix>``.

Voices of different tenants never share a cache entry, and a voice uploaded again under the same id
is a new entry, never the stale one. The Ray Serve app uses the same key as its multiplexed model id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chorus.serving.engine import AdaptedVoice, UnknownVoice
from chorus.serving.store import InvalidId, VoiceNotFound, VoiceRecord, VoiceStatus, VoiceStore


def voice_key(record: VoiceRecord) -> str:
    """The engine key of a stored voice."""
    return f"{record.tenant}/{record.voice_id}@{(record.sha256 or '')[:16]}"


@dataclass(frozen=True)
class StoredVoice(AdaptedVoice):
    """A ready voice of the store with the record it was resolved from (it travels with the request, to
    the engine or to a Ray replica, so nothing reads the record again)."""

    record: VoiceRecord

    @classmethod
    def of(cls, record: VoiceRecord) -> StoredVoice:
        return cls(voice_key(record), record)


def stored_voice_folder(store: VoiceStore, voice: AdaptedVoice) -> Path:
    """The local folder of an adapted voice (an engine's ``resolve``, with the store bound): a
    :class:`StoredVoice`'s from its record; a bare key's after reading its record (the Ray multiplexer
    names voices by key). ``UnknownVoice`` when it is gone or was replaced; the store may also raise
    ``VoiceCorrupted``."""
    if isinstance(voice, StoredVoice):
        record = voice.record
    else:
        tenant, _, rest = voice.key.partition("/")
        voice_id, _, digest = rest.rpartition("@")
        try:
            record = store.voice(tenant, voice_id)
        except (InvalidId, VoiceNotFound) as error:
            raise UnknownVoice(voice.key, str(error)) from None
        if record.status != VoiceStatus.READY or (record.sha256 or "")[:16] != digest:
            raise UnknownVoice(voice.key, "the voice changed or is not ready")
    return store.voice_folder(record)
