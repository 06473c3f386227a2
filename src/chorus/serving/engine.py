"""The server's engine is the library's (:mod:`chorus.synthesis.engine`): the names the serving modules import."""

from chorus.synthesis.engine import (
    DEFAULT_CACHE_BYTES,
    AdaptedVoice,
    CachedVoice,
    Engine,
    EngineStats,
    EngineVoice,
    SentenceRequest,
    UnknownVoice,
    adapter_bytes,
    is_mergeable,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "AdaptedVoice",
    "CachedVoice",
    "Engine",
    "EngineStats",
    "EngineVoice",
    "SentenceRequest",
    "UnknownVoice",
    "adapter_bytes",
    "is_mergeable",
]
