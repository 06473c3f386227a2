"""Settings of one voice server: limits, batching, where job files live, the onboarding recipe, and
where a server's parts come from (:class:`ServeConfig`, for ``chorus serve`` with or without ``--ray``).

The onboarding recipe is a :class:`chorus.recipe.AdaptConfig`, plain data: the routes and the server
import no training code; only the onboarding worker (:mod:`chorus.serving.onboarding.job_runner`) runs it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, NonNegativeInt, PositiveInt, TypeAdapter, with_config

from chorus.data.check import VOICE_MIN_SPEECH_SECONDS, CheckConfig
from chorus.recipe import AdaptConfig
from chorus.serving.store import VoiceStore

JOBS_FOLDER = ".jobs"

# Where the server's onboarding recipe differs from `chorus adapt`'s (AdaptConfig's defaults): a job
# shares the server's CPUs with speech, so it trains on one thread (the others stay with the speech
# batcher) and stops at half `chorus adapt`'s step cap, bounding how long one upload holds the worker
# (early stopping ends many runs sooner: bench/README.md's residual runs stopped after 225-500 steps).
ONBOARDING_STEPS = 300
ONBOARDING_THREADS = 1
# A voice refined from one short sample (OpenAI's custom voices: 10-30 s): fewer steps, and accepted
# from 10 s of speech (chorus adapt asks 25 s). bench/short_samples.py chose residual with a 100-step cap
# for samples under a minute: at 30 s, 200 or 300 steps gained no similarity (0.864-0.866 mean over the
# held-out datasets) and took up to 1.7x the time.
SAMPLE_STEPS = 100
SAMPLE_MIN_MINUTES = 10 / 60
SAMPLE_CLIP_SECONDS = 4.0  # a 10 s sample cut at silences: a few clips, one held out

# The phrase a consent recording reads, per language (BCP 47 primary tag); a server may set its own.
CONSENT_PHRASES = {
    "en": "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model."
}


@dataclass(frozen=True)
class ConsentSettings:
    """How OpenAI-style custom voices are checked (``/v1/audio/voice_consents``, ``POST /v1/audio/voices``).

    phrases: what a consent recording must say, per language (checked by meaning, not by word error rate: see
    the phrase check's fields below); max_file_bytes: a recording or sample (as OpenAI's 10 MiB);
    min_sample_seconds / max_sample_seconds / max_consent_seconds: how long a sample must
    be and may be (OpenAI's 30 s: longer recordings go to ``POST /v1/voices``), a consent may be;
    instant_speakers: how many base speakers, nearest the sample, blend into its instant voice;
    max_refined_wer_increase: how much worse than its instant voice (word error rate on the check
    sentences, :mod:`chorus.serving.onboarding.refinement`) a refined voice may read and still replace it.

    The last one is here rather than on the sample recipe (``ServerSettings.adapt_sample``, an
    :class:`AdaptConfig`): it is a rule of these voices, which alone have an instant voice to lose, not a
    way of training; a recipe is ``chorus adapt``'s too and is written into every voice card.
    """

    phrases: dict[str, str] = field(default_factory=lambda: dict(CONSENT_PHRASES))
    # The phrase check (chorus.serving.onboarding.consent_phrase): how many function words ("I", "the", "to") may be missed,
    # added or swapped for another (Whisper tiny.en on espeak's reading of the phrase: 0 clean, 2-3 at 15-20 dB
    # SNR; the "Thank you." it adds after the phrase is dismissed, not counted), and below what probability an
    # extra word is heard again before it refuses (Whisper's inventions in noise: 0.01-0.4; words it was sure of: 0.6 and up).
    max_loose_words: int = 4
    doubtful_probability: float = 0.5
    # The forced listen (the recognizer fed the phrase): how many phrase content words heard as others in their
    # place it may settle, and how likely each must be in the recording. Set on bench/consent.py's calibration
    # splits, above every wrong reading there ("Boris", "Coral", "Horace" for "Chorus"); each run's split gives
    # its own highest (0.0081, 0.0074, 0.0059 so far), and the highest of the runs is kept. A probe of the same
    # calibration voices through more channels and noise draws (bench/consent_forced_probe.py) found festival-ked
    # 220 cents down saying "Boris" through an AMR-like codec heard as "bore us" at 0.0111, which 0.0082 let
    # through. bench/consent.py now reads its wrong phrases through those channels too; its first such run
    # (bench/results/consent-wrong4) set this same bound. See docs/serving.md.
    max_forced_words: int = 2
    forced_probability: float = 0.0112
    # The consent's speech (chorus.serving.onboarding.consent_speech): how far past its timestamps a word may reach (they
    # are about 0.1 s off), the longest a word may be (the alignment stretches a word over audio it did not
    # transcribe), and how much voiced audio a consent may hold beside the phrase's words (an "um", a breath
    # voiced, a word's edge past the pad); laundering adds seconds.
    word_pad_seconds: float = 0.15
    max_word_seconds: float = 1.0
    max_extra_speech_seconds: float = 1.0
    max_file_bytes: int = 10 << 20
    min_sample_seconds: float = 10.0
    max_sample_seconds: float = 30.0
    max_consent_seconds: float = 60.0
    # A consent or sample may come through a phone line (8 kHz): the checks judge it in the band it has. An
    # upload of clips to train from may not (``UploadLimits.min_sample_rate``): such a sample makes an instant
    # voice only, its refinement marked failed, saying why, and no job queued.
    min_sample_rate: int = 8_000
    instant_speakers: int = 3
    max_refined_wer_increase: float = 0.05
    # The speaker check (chorus.speaker_recognition.voice_match): which encoder embeds ("resemblyzer", "chorus": the shipped
    # encoder, or "fused": resemblyzer's and Chorus v3's s-normalized scores summed, which took the most owners
    # of bench/consent.py at resemblyzer's stranger rate, see docs/serving.md) and the cohort folder its scores
    # are normalized against (default: the shipped one, whose cohort.json holds each check's calibrated settings).
    speaker_encoder: Literal["resemblyzer", "chorus", "fused"] = "fused"
    cohort: Path | None = None
    # Recordings checked at once by one server (decoding, Whisper, the speaker encoders: seconds of CPU each), and
    # how many more may wait for a turn; past that, 429 with Retry-After. The request rate bounds requests a
    # minute, not CPU at once: refused attempts cost no quota, and a probe's parallel uploads each ran Whisper.
    max_concurrent_checks: PositiveInt = 2
    max_waiting_checks: NonNegativeInt = 8
    # One tenant's share of those places (running and waiting): one key's parallel uploads had filled them all,
    # every other tenant answered 429 (a security probe).
    max_checks_per_tenant: PositiveInt = 3


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class UploadLimits:
    """What one onboarding upload may hold."""

    max_upload_bytes: int = 100 << 20  # the whole multipart body
    max_clips: int = 300
    max_clip_bytes: int = 25 << 20  # one clip, as uploaded or as unpacked from the archive
    min_clip_seconds: float = 0.3
    # A transcribed clip, as the onboarding job's data check takes one: a longer one would be accepted here and
    # then fail the job (a clip without transcript is cut at its silences there instead).
    max_clip_seconds: float = CheckConfig().max_seconds
    min_total_seconds: float = VOICE_MIN_SPEECH_SECONDS  # of speech, as the job's data check counts it
    max_total_seconds: float = 20 * 60.0
    max_transcript_chars: int = 1_000
    max_archive_members: int = 1_000
    max_unpacked_bytes: int = 400 << 20  # sum of an archive's declared member sizes
    max_compression_ratio: float = 200.0  # per member; audio never compresses like this, a bomb does
    # As the onboarding job's data check takes a clip: a lower rate would be accepted here and then left out.
    min_sample_rate: int = CheckConfig().min_sample_rate
    max_sample_rate: int = 192_000


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
    consents: PositiveInt = 100  # consent recordings kept (OpenAI's custom voices)


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

    # Aliases to speakers (or blends) of the base, each checked when the server starts; None: the built-in
    # OPENAI_VOICE_ALIASES (chorus.synthesis.voices), whose speakers another base may lack (then its default
    # speaker speaks).
    voice_aliases: dict[str, str] | None = None

    max_text_chars: int = 4_096  # OpenAI's: clients cut long texts at it
    # Seconds of audio one request may ask for (its pauses plus its text as read out, estimated before any
    # synthesis): a short input of long breaks or thousands of digits must not cost minutes and megabytes.
    max_output_seconds: float = 300.0
    max_json_bytes: int = 64 << 10
    max_chunk_chars: int = 300  # a sentence longer than this is cut at a comma or space
    max_batch: int = 16
    max_wait_ms: float = 5.0
    # A batch stops growing once its estimated time would pass this, and takes no row that would pad its first
    # past this many times its length: one tenant's sentence waits out at most one bounded batch of another's
    # backlog (see chorus.serving.batcher; None: unbounded).
    max_batch_ms: float | None = 100.0
    batch_pad_ratio: float | None = 2.0
    upload: UploadLimits = field(default_factory=UploadLimits)
    limits: Limits = field(default_factory=Limits)
    # How onboarded voices are trained: AdaptConfig's defaults (its default method) but for the above.
    adapt: AdaptConfig = field(
        default_factory=functools.partial(AdaptConfig, steps=ONBOARDING_STEPS, threads=ONBOARDING_THREADS)
    )
    # How a voice from one short sample (OpenAI's custom voices) is refined in the background.
    adapt_sample: AdaptConfig = field(
        default_factory=functools.partial(
            AdaptConfig,
            steps=SAMPLE_STEPS,
            threads=ONBOARDING_THREADS,
            min_minutes=SAMPLE_MIN_MINUTES,
            transcribed_clip_seconds=SAMPLE_CLIP_SECONDS,
        )
    )
    consent: ConsentSettings = field(default_factory=ConsentSettings)
    jobs_dir: Path | None = None  # default: see :func:`jobs_dir`
    progress_interval: float = 1.0  # least seconds between two progress writes of a running job
    # The niceness (``nice``, 0-19) of an onboarding job's process: on the cores the server speaks from, speech
    # goes first. bench/soak.py, two servers under the whole load, 12 minutes each: at 0 (equals) the polite
    # tenant's p99 was 7.3x its idle p99 and a job took 94 s (median); at 10, 3.1x but jobs starved (235 s,
    # 4 of 10 not done in 300 s); at 5, 3.3x and 156 s, none late.
    job_niceness: int = 5
    store_probe_seconds: float = 5.0  # /healthz probes the store's writability at most this often

    def __post_init__(self) -> None:
        if not 0 <= self.job_niceness <= 19:
            raise ValueError(f"job_niceness (--job-niceness) must be 0-19, got {self.job_niceness}")
        if self.max_text_chars < 1:  # 0 would refuse every speech request while /healthz says ok
            raise ValueError(f"max_text_chars (--max-text-chars) must be at least 1, got {self.max_text_chars}")


def jobs_dir(settings: ServerSettings, store: VoiceStore) -> Path:
    """Where onboarding jobs keep their files: ``settings.jobs_dir``, else ``<store root>/.jobs`` for a
    local store or ``.jobs`` beside its database's voice cache. A dot folder: the store's recovery only
    looks at tenant folders (ids never start with a dot)."""
    if settings.jobs_dir is not None:
        return Path(settings.jobs_dir)
    return Path(store.root) / JOBS_FOLDER if store.local else store.cache_dir.parent / JOBS_FOLDER


@dataclass(frozen=True)
class ServeConfig:
    """Where one server's parts come from and where it listens: ``chorus serve``'s options, the same with
    ``--ray`` (:func:`chorus.serving.api.serve`, :func:`chorus.serving.ray_app.serve_ray`).

    store: a folder, or an fsspec URL for the voices; database: a SQLite path or ``postgresql://`` URL of
    the metadata (default: in the store folder); cache_dir: where a remote store's voices are downloaded;
    base: the base (default: the shipped Chorus base), as ``--base`` names it: a Chorus model folder,
    ``piper-joe`` or a Piper ``voice.onnx`` (:func:`chorus.synthesis.bases.open_base`); vocoder: ``griffin-lim``, ``neural`` or a
    folder (default: the base's); keys: the API keys file; cache_mb: adapter cache budget in MB; device:
    where the one-process server's base runs (``--ray`` replicas run on CPUs).
    """

    store: str
    database: str | None = None
    cache_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    base: str | Path | None = None
    vocoder: str | None = None
    keys: str | Path | None = None
    cache_mb: float = 64.0
    settings: ServerSettings = field(default_factory=ServerSettings)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.cache_mb < 0:
            raise ValueError(f"cache_mb (--cache-mb) must be >= 0, got {self.cache_mb}")
        if not 1 <= self.port <= 65_535:  # uvicorn had bound 70000 as 70000 - 65536, announcing 70000
            raise ValueError(f"port (--port) must be 1-65535, got {self.port}")
