"""How an adapted voice is named inside the engine: ``<tenant>/<voice id>@<weights sha256 prefix>``.

Voices of different tenants never share a cache entry, and a voice uploaded again under the same id
is a new entry, never the stale one. The Ray Serve app uses the same key as its multiplexed model id.
"""

from __future__ import annotations

from pathlib import Path

from chorus.serving.engine import UnknownVoice
from chorus.serving.store import InvalidId, VoiceNotFound, VoiceRecord, VoiceStatus, VoiceStore


def voice_key(record: VoiceRecord) -> str:
    """The engine key of a stored voice."""
    return f"{record.tenant}/{record.voice_id}@{(record.sha256 or '')[:16]}"


def resolve_voice_key(store: VoiceStore, key: str) -> Path:
    """The local folder of adapted voice ``key`` (an engine's ``resolve``, with the store bound):
    ``UnknownVoice`` when it is gone or was replaced. The store may also raise ``VoiceCorrupted``."""
    tenant, _, rest = key.partition("/")
    voice_id, _, digest = rest.rpartition("@")
    try:
        record = store.voice(tenant, voice_id)
    except (InvalidId, VoiceNotFound) as error:
        raise UnknownVoice(key, str(error)) from None
    if record.status != VoiceStatus.READY or (record.sha256 or "")[:16] != digest:
        raise UnknownVoice(key, "the voice changed or is not ready")
    return store.get_voice(tenant, voice_id)
