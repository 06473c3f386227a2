"""Settings of one voice server: limits, batching, where job files live, and the onboarding recipe.

The recipe is plain data here (:class:`AdaptRecipe`): the routes and the server import no training
code; only the onboarding worker (:mod:`chorus.serving.worker`) turns it into an ``AdaptConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chorus.serving.store import VoiceStore
from chorus.serving.uploads import UploadLimits

JOBS_FOLDER = ".jobs"


@dataclass(frozen=True)
class AdaptRecipe:
    """How onboarded voices are trained.

    ``method``: adapter method(s) joined by ``+`` (``residual`` scored best in ``bench/adaptation.py``);
    ``steps``: most training steps (early stopping usually ends sooner); ``threads``: CPU threads of one
    job; ``options``: any other ``chorus.training.adapt.AdaptConfig`` field by name (for example
    ``{"eval_every": 2, "max_frames": 1500}`` or ``{"method_options": {"lora": {"r": 4}}}``).
    """

    method: str = "residual"
    steps: int = 300
    threads: int = 1
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may ask of a server (:mod:`chorus.serving.quotas` enforces it).

    requests_per_minute: authenticated requests of one tenant (bursts up to the same number);
    active_jobs: its onboarding jobs queued or running; voices / voice_bytes: what it keeps stored;
    queued_jobs: onboarding jobs waiting on this server, all tenants together.
    """

    requests_per_minute: int = 600
    active_jobs: int = 2
    voices: int = 1_000
    voice_bytes: int = 2 << 30
    queued_jobs: int = 32


@dataclass
class ServerSettings:
    """Limits and knobs of one server."""

    max_text_chars: int = 2_000
    max_json_bytes: int = 64 << 10
    max_chunk_chars: int = 300  # a sentence longer than this is cut at a comma or space
    max_batch: int = 16
    max_wait_ms: float = 5.0
    upload: UploadLimits = field(default_factory=UploadLimits)
    limits: TenantLimits = field(default_factory=TenantLimits)
    adapt: AdaptRecipe = field(default_factory=AdaptRecipe)
    jobs_dir: Path | None = None  # default: see :func:`jobs_dir`
    progress_interval: float = 1.0  # least seconds between two progress writes of a running job
    store_probe_seconds: float = 5.0  # /healthz probes the store's writability at most this often


def jobs_dir(settings: ServerSettings, store: VoiceStore) -> Path:
    """Where onboarding jobs keep their files: ``settings.jobs_dir``, else ``<store root>/.jobs`` for a
    local store or ``.jobs`` beside its database's voice cache. A dot folder: the store's recovery only
    looks at tenant folders (ids never start with a dot)."""
    if settings.jobs_dir is not None:
        return Path(settings.jobs_dir)
    return Path(store.root) / JOBS_FOLDER if store.local else store.cache_dir.parent / JOBS_FOLDER
