"""Settings of one voice server: limits, batching, where job files live, and the onboarding recipe.

The recipe is plain data here (:class:`AdaptRecipe`): the routes and the server import no training
code; only the onboarding worker (:mod:`chorus.serving.worker`) turns it into an ``AdaptConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ConfigDict, PositiveInt, TypeAdapter, with_config

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


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may ask of a server (:mod:`chorus.serving.quotas` enforces it).

    requests_per_minute: authenticated requests (bursts up to the same number); active_jobs: onboarding
    jobs queued or running; voices / voice_bytes: what it keeps stored.
    """

    requests_per_minute: PositiveInt = 600
    active_jobs: PositiveInt = 2
    voices: PositiveInt = 1_000
    voice_bytes: PositiveInt = 2 << 30


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Limits:
    """Every tenant's limits (``tenant``, with overrides by tenant name in ``tenants``) and the whole
    server's: ``requests_per_minute`` of all tenants together, ``queued_jobs`` waiting on this server,
    ``voice_bytes`` of every tenant's voices together."""

    tenant: TenantLimits = field(default_factory=TenantLimits)
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    requests_per_minute: PositiveInt = 6_000
    queued_jobs: PositiveInt = 32
    voice_bytes: PositiveInt = 64 << 30

    def of(self, tenant: str) -> TenantLimits:
        """``tenant``'s limits."""
        return self.tenants.get(tenant, self.tenant)

    @classmethod
    def from_file(cls, path: str | Path) -> Limits:
        """Limits from a JSON file (``chorus serve --limits``)::

            {"tenant": {"requests_per_minute": 120, "voices": 50},
             "tenants": {"acme": {"voices": 500}},
             "server": {"requests_per_minute": 3000, "queued_jobs": 16, "voice_bytes": 10737418240}}

        Every part and field may be left out (its default stands); a tenant's overrides apply over
        ``tenant``. ``ValueError`` naming the file and the field for anything else.
        """
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            unknown = sorted(set(data) - {"tenant", "tenants", "server"})
            if unknown:
                raise ValueError(f"unknown parts {unknown}: expected 'tenant', 'tenants' and 'server'")
            tenant, tenants, server = (data.get(part, {}) for part in ("tenant", "tenants", "server"))
            if not all(isinstance(part, dict) for part in (tenant, tenants, server)):
                raise ValueError("'tenant', 'tenants' and 'server' must be objects")
            unknown = sorted(set(server) - _SERVER_FIELDS)
            if unknown:
                raise ValueError(f"server: unknown fields {unknown}; expected {sorted(_SERVER_FIELDS)}")
            merged = {
                name: {**tenant, **overrides} if isinstance(overrides, dict) else overrides
                for name, overrides in tenants.items()
            }
            return _LIMITS.validate_python({"tenant": tenant, "tenants": merged, **server})
        except (OSError, ValueError, TypeError) as error:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"limits file {path}: {error}") from None


_LIMITS = TypeAdapter(Limits)
_SERVER_FIELDS = {"requests_per_minute", "queued_jobs", "voice_bytes"}


# OpenAI's voice names, so that clients with a fixed voice picker work: each speaks as a speaker of the
# shipped base (names a base lacks fall back to its default speaker). `chorus serve --voice-aliases FILE`
# replaces the map. A tenant's own voice of the same id comes first.
OPENAI_VOICE_ALIASES = {
    "alloy": "flite-rms",
    "ash": "flite-rms-down300-slow",
    "ballad": "flite-awb-speed120",
    "coral": "espeak-us-f4",
    "echo": "flite-awb",
    "fable": "festival-kal",
    "onyx": "flite-kal16",
    "nova": "espeak-us-f2",
    "sage": "festival-kal-speed135",
    "shimmer": "espeak-us-f3",
    "verse": "flite-rms-up350",
    "marin": "espeak-us-f5",
    "cedar": "flite-kal16-up500",
}


def read_voice_aliases(path: str | Path) -> dict[str, str]:
    """A voice aliases file: JSON ``{"alias": "speaker", ...}``; raises ``ValueError`` naming the file."""
    try:
        aliases = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"voice aliases file {path}: {error}") from None
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise ValueError(f'voice aliases file {path}: expected a JSON object {{"alias": "speaker", ...}}')
    return aliases


@dataclass
class ServerSettings:
    """Limits and knobs of one server."""

    voice_aliases: dict[str, str] = field(default_factory=lambda: dict(OPENAI_VOICE_ALIASES))

    max_text_chars: int = 2_000
    # Seconds of audio one request may ask for (its pauses plus its text as read out, estimated before any
    # synthesis): a short input of long breaks or thousands of digits must not cost minutes and megabytes.
    max_output_seconds: float = 300.0
    max_json_bytes: int = 64 << 10
    max_chunk_chars: int = 300  # a sentence longer than this is cut at a comma or space
    max_batch: int = 16
    max_wait_ms: float = 5.0
    upload: UploadLimits = field(default_factory=UploadLimits)
    limits: Limits = field(default_factory=Limits)
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
