"""The state behind the routes: store, engine, batcher, onboarding worker, tenants and metrics, and what
the routes ask of them (which voice a tenant means, a message fit for a tenant, deleting a voice). The JSON
answers are the routes' own (:mod:`chorus.serving.routes`)."""

from __future__ import annotations

import difflib
import logging
import re
import time

from fastapi import Request

from chorus.models.speaker_mix import is_mix
from chorus.serving.batcher import Batcher, SpeechQueue
from chorus.serving.engine import Engine, EngineVoice
from chorus.serving.errors import ApiError, not_a_stored_voice, voice_not_found
from chorus.serving.metrics import Metrics
from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
from chorus.serving.onboarding.job_runner import JobRunner
from chorus.serving.onboarding.refinement import RefinementCheck
from chorus.serving.quotas import CheckSlots, RateLimiter, check_rate
from chorus.serving.settings import ServerSettings, jobs_dir
from chorus.serving.store import (
    InvalidId,
    VoiceNotFound,
    VoiceRecord,
    VoiceStatus,
    VoiceStore,
    check_id,
    outage_errors,
)
from chorus.serving.tenants import Tenants, Unauthorized
from chorus.serving.voice_keys import StoredVoice
from chorus.synthesis.voices import OPENAI_VOICE_ALIASES
from chorus.text.phonemize import close_backends

_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
log = logging.getLogger("chorus.serving.server")


def speaker_aliases(given: dict[str, str] | None, engine: Engine) -> dict[str, str]:
    """What each alias speaks as on ``engine``'s base. ``given`` (``--voice-aliases``): each must name a
    speaker or blend of the base and must not be a speaker's own name, else ``ValueError`` naming the
    aliases and the speakers (an unknown voice is an error, never another voice). None: the built-in
    :data:`OPENAI_VOICE_ALIASES`, made for the shipped base: on a base without one of its speakers that
    alias speaks as the default speaker, as ``/v1/audio/voices`` says, so OpenAI's names work on any base."""
    if given is None:
        default = engine.default_speaker
        return {
            alias: target if engine.is_speaker(target) else default
            for alias, target in OPENAI_VOICE_ALIASES.items()
            if not engine.is_speaker(alias)
        }
    problems = [
        f"{alias!r} is a speaker's own name"
        if engine.is_speaker(alias)
        else f"{alias!r} -> {target!r}: no such speaker"
        for alias, target in given.items()
        if engine.is_speaker(alias) or not engine.is_speaker(target)
    ]
    if problems:
        raise ValueError(
            f"voice aliases refused: {'; '.join(problems)}. This base's speakers: "
            f"{', '.join(engine.speakers)} (or a blend of them, e.g. 'a(2)+b(1)')"
        )
    return dict(given)


class ServerState:
    """One server's parts. It owns what it is given: :meth:`close` closes the job runner, the batcher
    and the store (checkpointing its write-ahead log).

    ``engine`` finds adapted voices through its own ``resolve`` (for a store,
    ``functools.partial(stored_voice_folder, store)``). ``jobs``: the onboarding worker (default: a
    :class:`JobRunner` training in this process on copies of the engine's base); ``batcher``: where
    speech requests go (default: a :class:`Batcher` on ``engine`` with the settings' limits).
    """

    def __init__(
        self,
        store: VoiceStore,
        engine: Engine,
        tenants: Tenants | None = None,
        settings: ServerSettings | None = None,
        *,
        jobs: JobRunner | None = None,
        batcher: SpeechQueue | None = None,
        custom_voices: CustomVoiceChecks | None = None,
    ):
        self.store = store
        self.engine = engine
        self.tenants = tenants or Tenants()
        self.settings = settings or ServerSettings()
        self.rate = RateLimiter()
        consent = self.settings.consent
        self.check_slots = CheckSlots(
            consent.max_concurrent_checks, consent.max_waiting_checks, consent.max_checks_per_tenant
        )
        self.jobs = jobs or JobRunner(
            store,
            jobs_dir(self.settings, store),
            engine.base_copy,
            self.settings.adapt,
            progress_interval=self.settings.progress_interval,
            sample_config=self.settings.adapt_sample,
            refinement_check=RefinementCheck(self.settings.consent.max_refined_wer_increase),
        )
        self.batcher = batcher or Batcher.of_server(engine, self.settings)
        self.metrics = Metrics(engine, self.batcher, self.jobs)
        self.custom_voices = custom_voices or CustomVoiceChecks(engine, self.settings.consent)
        self.aliases = speaker_aliases(self.settings.voice_aliases, engine)
        self.started = False
        self._store_check: tuple[float, str | None] = (float("-inf"), None)  # (when, problem)

    # -- lifecycle
    def start(self) -> None:
        """Recover the store (interrupted writes and jobs), start the onboarding worker, resume jobs."""
        report = self.store.recover()
        if report.summary():
            log.warning("store recovery: %s", report.summary())
        if report.orphan_folders:
            log.warning(
                "%d voice folder(s) that no record lists, left as they are (`chorus store verify` lists them): %s",
                len(report.orphan_folders),
                ", ".join(report.orphan_folders[:5]),
            )
        self.jobs.resume()  # before the worker thread starts: it would take the same interrupted jobs
        self.jobs.start()
        self.started = True

    def close(self) -> None:
        self.started = False
        try:
            self.jobs.close()
            self.batcher.close(timeout=30)
        finally:
            try:
                self.store.close()
            finally:
                # phonemizer's copies of libespeak-ng in the temporary folder go with its backends, which an exit
                # does not collect (a probe found one folder left per server run)
                close_backends()

    def store_problem(self) -> str | None:
        """Why the store cannot take writes (None when it can), probed at most every
        ``settings.store_probe_seconds``: a load balancer polling ``/healthz`` must not become a stream
        of writes to an object store."""
        checked, problem = self._store_check
        if time.monotonic() - checked >= self.settings.store_probe_seconds:
            problem = self.store.write_problem()
            self._store_check = (time.monotonic(), problem)
        return problem

    # -- voices
    def check_trains_voices(self) -> None:
        """Refuse onboarding (501) on a base the server's jobs do not train: they adapt the Chorus base."""
        base = self.engine.base
        if base.kind != "chorus":
            raise ApiError(
                501,
                f"this server speaks the {base.name} base, whose voices are adapted offline "
                f"(chorus adapt DATA --base {base.name} --out VOICE) and added to the store "
                "(chorus store add STORE TENANT ID VOICE); "
                "onboarding trains on the Chorus base",
                type="not_implemented_error",
            )

    def check_voice_id(self, voice_id: str, param: str = "voice") -> str:
        try:
            return check_id(voice_id)
        except InvalidId:
            raise ApiError(
                400,
                f"invalid voice id {voice_id[:80]!r}: use 1-64 of a-z, 0-9, '_' and '-', starting "
                f"with a letter or digit",
                param=param,
            ) from None

    def record(self, tenant: str, voice_id: str) -> VoiceRecord:
        """The tenant's stored voice ``voice_id``, named in any case as speech takes names. A speaker, or an
        alias the tenant has no voice of, is 400 (it is no stored voice: "not found; did you mean 'alloy'?"
        answered 'alloy' before); any other name the tenant has no voice of, 404."""
        voice_id = self.check_voice_id(voice_id.lower())
        if self.engine.is_speaker(voice_id):
            raise not_a_stored_voice(voice_id, "a speaker of the model")
        try:
            return self.store.voice(tenant, voice_id)
        except VoiceNotFound:
            self.forget(tenant, voice_id)  # deleted, maybe through another server on the same store
            if voice_id in self.aliases:
                raise not_a_stored_voice(
                    voice_id, f"OpenAI's name for the speaker {self.aliases[voice_id]!r}"
                ) from None
            raise voice_not_found(voice_id, self.close_names(tenant, voice_id)) from None

    def close_names(self, tenant: str, voice_id: str) -> list[str]:
        """Names a tenant may use that look like ``voice_id`` (for "did you mean"): speakers, aliases and
        the tenant's own voices, never another tenant's; first the ids of the tenant's voices whose display name
        it is (a new user's probe: "Awb", the name ``chorus voices list`` shows, was only "not found")."""
        try:
            records = self.store.list_voices(tenant)
        except outage_errors():
            records = []  # the suggestion is a courtesy: the 404 stands without the store
        named = [record.voice_id for record in records if record.name.lower() == voice_id.lower()]
        names = [*self.engine.speakers, *self.aliases, *(record.voice_id for record in records)]
        alike = difflib.get_close_matches(voice_id, names, n=3, cutoff=0.6)
        return (named + [name for name in alike if name not in named])[:3]

    def resolve_voice(self, tenant: str, voice_id: str) -> EngineVoice:
        """The voice a tenant's request names, resolved once: a speaker or blend of the base, an alias's
        speaker, or the tenant's ready voice with its record (:class:`StoredVoice`). Names are
        case-insensitive ("Alloy" is "alloy"), as every name the server gives out is lower case."""
        voice_id = voice_id.lower()
        if self.engine.is_speaker(voice_id) or is_mix(voice_id):
            try:
                return self.engine.resolve_voice(voice_id)
            except (KeyError, ValueError) as error:
                raise ApiError(400, str(error.args[0]), param="voice", code="invalid_blend") from None
        if voice_id in self.aliases:
            try:  # the tenant's own voice of that id comes first
                record = self.store.voice(tenant, voice_id)
            except VoiceNotFound:
                return self.engine.resolve_voice(self.aliases[voice_id])
            except outage_errors() as error:  # the database is down: an alias still speaks, as a speaker does
                log.warning("alias %r spoken without the store (%r)", voice_id, error)
                return self.engine.resolve_voice(self.aliases[voice_id])
        else:
            record = self.record(tenant, voice_id)
        if record.instant and record.status != VoiceStatus.READY:
            return self.engine.resolve_voice(record.instant)  # a sample's voice, until (or unless) refined
        if record.status == VoiceStatus.TRAINING:
            raise ApiError(
                409,
                f"voice {voice_id!r} is still training (job {record.job_id})",
                type="conflict_error",
                param="voice",
                code="voice_not_ready",
            )
        if record.status != VoiceStatus.READY:
            raise ApiError(
                409,
                f"voice {voice_id!r} is {record.status.value}: {self.public(record.error or '')}",
                type="conflict_error",
                param="voice",
                code="voice_not_ready",
            )
        voice = StoredVoice.of(record)
        if not self.engine.is_resident(voice.key):  # a new version: drop an older one (replaced through another server)
            self.forget(tenant, voice_id, keep=voice.key)
        return voice

    def public(self, message: str) -> str:
        """A message fit for a tenant: server paths, URLs (an object store's endpoint) and the store's bucket
        taken out."""
        message = _URL.sub("<url>", message)
        bucket = self.store.root.split("/", 1)[0]
        for path, name in [(str(self.jobs.jobs_dir), "<jobs>"), (self.store.root, "<store>"), (bucket, "<store>")]:
            if path:
                message = message.replace(path, name)
        return message

    def delete_voice(self, tenant: str, voice_id: str) -> str:
        """Delete the tenant's voice from the store and from this server's model (404 if it has none), and
        stop its onboarding job: the store fails it (queued, running or interrupted), and this server's
        worker, if it trains it now, stops it at once (:meth:`JobRunner.cancel`; another server's worker
        stops at its next progress write). Its id as stored (lower case) is returned."""
        record = self.record(tenant, voice_id)
        voice_id = record.voice_id
        try:
            self.store.delete_voice(tenant, voice_id)
        except VoiceNotFound:
            raise voice_not_found(voice_id) from None
        if record.job_id is not None:
            self.jobs.cancel(record.job_id)
        self.forget(tenant, voice_id)
        return voice_id

    def forget(self, tenant: str, voice_id: str, keep: str | None = None) -> None:
        """Drop every resident version of a voice but ``keep`` from the model (one in use goes at eviction):
        the store is the truth, and another server on it may have deleted or replaced the voice."""
        prefix = f"{tenant}/{voice_id}@"
        for key in self.engine.resident_now():
            if key.startswith(prefix) and key != keep:
                try:
                    self.engine.unload(key)
                except RuntimeError:
                    pass

    def authenticate(self, request: Request) -> str:
        """The request's tenant, its request spent from the server's and the tenant's rates (``ApiError`` 401 or 429)."""
        try:
            tenant = self.tenants.authenticate(request.headers.get("authorization"))
        except Unauthorized as error:
            raise ApiError(
                401,
                str(error),
                type="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            ) from None
        request.state.tenant = tenant  # for the access log and the per-tenant metrics
        check_rate(self.rate, tenant, self.settings.limits, keyed=not self.tenants.single_tenant)
        return tenant
