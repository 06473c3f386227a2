"""The voice server scaled out on Ray Serve (``chorus serve --ray``): many replicas of the base, each
holding the voices it was last asked for, and onboarding jobs as Ray tasks.

Two deployments and one task:

* ``ChorusVoices`` (:class:`VoiceReplica`, ``replicas`` copies): one resident base (an
  :class:`~chorus.serving.engine.Engine`) and its :class:`~chorus.serving.batcher.Batcher` per replica.
  Adapted voices are Ray Serve *multiplexed models*: the model id is the engine key of the voice,
  ``<tenant>/<voice id>@<weights sha256 prefix>``, so Ray routes a request to a replica that already
  holds that voice (or, if none does, to one holding the fewest). Loading a voice is
  ``engine.add_voice`` of the store's folder; when Ray's per-replica LRU (``voices_per_replica``)
  drops one, the voice is removed from the engine (after the requests using it finish). Speakers
  carry no model id and go to any replica. The engine's own byte budget (``cache_mb``) still bounds
  each replica's adapters.
* ``ChorusIngress``: the same FastAPI app as ``chorus serve`` (:func:`chorus.serving.api.create_app`:
  routes, tenants, limits, errors, metrics), wrapped with ``@serve.ingress``; its batcher is a
  :class:`RemoteBatcher`, which sends each speech chunk to ``ChorusVoices`` through a
  ``DeploymentHandle`` with ``multiplexed_model_id`` set to the voice key. Run one ingress replica:
  its startup recovers the store (as ``chorus serve`` does), which marks other writers' jobs interrupted.
* :func:`run_onboarding_job` (a Ray task, ``job_cpus`` each): adapts one uploaded voice on a private
  copy of the base and puts it into the store; the ingress's :class:`RayJobRunner` starts one per upload,
  and :func:`submit_onboarding` starts one for a voice folder on disk.

Every process opens the same :class:`~chorus.serving.store.VoiceStore`: the SQLite file and the jobs
folder must be on a disk every Ray node sees (one machine, or a shared filesystem); the voice blobs
may be anywhere fsspec reaches.

Typical use::

    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app(RayServeConfig(ServeConfig(store="voices"), replicas=4)), name="chorus", route_prefix="/")
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray import serve

from chorus.serving.api import create_app
from chorus.serving.batcher import Batcher, BatcherStats
from chorus.serving.engine import AdaptedVoice, Engine, EngineVoice, UnknownVoice
from chorus.serving.onboarding.job_process import job_runner_for
from chorus.serving.onboarding.job_runner import DATA_DIR, JobRunner, OnboardingJob, record_consent, write_job_file
from chorus.serving.settings import ServeConfig, jobs_dir
from chorus.serving.store import JobStatus, VoiceStore
from chorus.serving.store.metadata import is_postgres_url
from chorus.serving.tenants import Tenants, check_bind
from chorus.serving.voice_keys import stored_voice_folder
from chorus.synthesis.forward import SentenceResult

log = logging.getLogger("chorus.serving.ray")

VOICES_DEPLOYMENT = "ChorusVoices"
INGRESS_DEPLOYMENT = "ChorusIngress"
APP_NAME = "chorus"


@dataclass
class RayServeConfig:
    """What every replica and onboarding task of one Ray deployment needs (sent to them pickled).

    ``server``: the store, base, vocoder, adapter budget (``cache_mb``, per engine) and settings, as for
    ``chorus serve``; ``tenants``: loaded from its keys once, here, so that no replica reads the keys file
    or the environment. ``replicas``: copies of the base serving speech; ``voices_per_replica``: Ray's
    multiplexing limit (adapted voices held per replica, least recently used dropped first); ``*_cpus``:
    Ray CPUs reserved per voices replica, ingress and onboarding task; ``threads``: torch threads per
    voices replica.
    """

    server: ServeConfig
    tenants: Tenants = field(default_factory=Tenants)
    replicas: int = 2
    voices_per_replica: int = 32
    replica_cpus: float = 1.0
    ingress_cpus: float = 0.5
    job_cpus: float = 1.0
    threads: int = 1
    max_ongoing_requests: int = 64  # per voices replica: what its batcher may gather into batches

    def __post_init__(self):
        if self.replicas < 1 or self.voices_per_replica < 1:
            raise ValueError(
                f"need replicas >= 1 and voices_per_replica >= 1, got {self.replicas}, {self.voices_per_replica}"
            )
        self.server = _absolute_paths(self.server)

    def open_store(self) -> VoiceStore:
        return VoiceStore(self.server.store, self.server.database, self.server.cache_dir)

    def job_runner(self, store: VoiceStore) -> JobRunner:
        """An in-process onboarding worker on ``store`` (what each onboarding task runs its job with)."""
        return job_runner_for(self.server, store)


def _absolute_paths(server: ServeConfig) -> ServeConfig:
    """``server`` with its local paths absolute: replicas and tasks are other processes, maybe in other
    folders."""
    vocoder = server.vocoder  # a name (griffin-lim, neural) or a folder
    settings = server.settings
    if settings.jobs_dir is not None:
        settings = dataclasses.replace(settings, jobs_dir=Path(settings.jobs_dir).absolute())
    return dataclasses.replace(
        server,
        store=server.store if "://" in server.store else os.path.abspath(server.store),
        database=server.database
        if server.database is None or is_postgres_url(server.database)
        else os.path.abspath(server.database),
        cache_dir=None if server.cache_dir is None else os.path.abspath(server.cache_dir),
        base=None if server.base is None else os.path.abspath(server.base),
        vocoder=os.path.abspath(vocoder) if vocoder is not None and Path(vocoder).exists() else vocoder,
        settings=settings,
    )


# -- one voices replica ------------------------------------------------------------------------------
@dataclass
class RemoteResult(SentenceResult):
    """A :class:`SentenceResult` from a voices replica (its ``mel`` left behind), with where it was made:
    ``replica`` (Serve replica id) and ``voice_loads`` (times that replica has loaded this voice)."""

    replica: str = ""
    voice_loads: int = 0


class LoadedVoice:
    """What Ray's multiplexer caches for one voice; Ray calls ``__del__`` when it drops the voice."""

    def __init__(self, host: VoiceHost, key: str):
        self.host, self.key, self._dropped = host, key, False

    def __del__(self):
        if not self._dropped:  # Ray's eviction calls it, then garbage collection would again
            self._dropped = True
            try:
                self.host.evict(self.key)
            except Exception:  # noqa: BLE001 - never raise from a finalizer (e.g. at interpreter exit)
                log.debug("dropping voice %s failed", self.key, exc_info=True)


class VoiceHost:
    """A replica's state, without Ray: the engine and its batcher, and which voices the multiplexer holds.

    A voice dropped by the multiplexer while requests still use it (queued in the batcher) leaves the
    engine when the last of them ends. A voice the engine evicted on its own (over ``cache_mb``) is read
    back from the store by the engine on its next use.
    """

    def __init__(self, config: RayServeConfig, replica: str = ""):
        import torch

        torch.set_num_threads(config.threads)
        self.config = config
        self.replica = replica or f"pid-{os.getpid()}"
        self.store = config.open_store()
        self.engine = Engine.load(
            config.server.base,
            config.server.vocoder,
            resolve=functools.partial(stored_voice_folder, self.store),
            cache_bytes=int(config.server.cache_mb * (1 << 20)),
        )
        self.batcher = Batcher.of_server(self.engine, config.server.settings)
        self.loads: Counter[str] = Counter()  # multiplexer loads per voice key, ever
        self.held: set[str] = set()  # voices the multiplexer holds now
        self._active: Counter[str] = Counter()  # requests using each voice now
        self._dropped: set[str] = set()  # dropped by the multiplexer while in use
        self._announced: dict[str, AdaptedVoice] = {}  # voices about to be loaded, with their records
        self._lock = threading.Lock()

    def announce(self, voice: AdaptedVoice) -> None:
        """The typed voice of a request about to ask the multiplexer for ``voice.key``: :meth:`load` takes
        its folder from the record it carries (the multiplexer passes the key alone)."""
        with self._lock:
            self._announced[voice.key] = voice

    def load(self, key: str) -> LoadedVoice:
        """Put voice ``key`` into the engine now (blocking); raises ``UnknownVoice``, ``VoiceError``..."""
        with self._lock:
            voice = self._announced.pop(key, None) or AdaptedVoice(key)
        self.engine.add_voice(key, stored_voice_folder(self.store, voice))
        with self._lock:
            self.loads[key] += 1
            self.held.add(key)
            self._dropped.discard(key)
        return LoadedVoice(self, key)

    def evict(self, key: str) -> None:
        with self._lock:
            self.held.discard(key)
            if self._active[key]:
                self._dropped.add(key)
                return
        self._remove(key)

    @contextmanager
    def using(self, key: str | None) -> Iterator[None]:
        """Count a request using adapted voice ``key`` (None: a speaker) for its duration."""
        if key is None:
            yield
            return
        with self._lock:
            self._active[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._active[key] -= 1
                remove = not self._active[key] and key in self._dropped
                if not self._active[key]:
                    del self._active[key]
                if remove:
                    self._dropped.discard(key)
        if remove:
            self._remove(key)

    def _remove(self, key: str) -> None:
        try:
            self.engine.remove_voice(key)
        except (UnknownVoice, RuntimeError):
            pass  # already gone, or in a running batch: the engine's own LRU takes it later

    def stats(self) -> dict:
        engine, resident = self.engine.stats(), self.engine.resident()
        with self._lock:
            return {
                "replica": self.replica,
                "pid": os.getpid(),
                "loads": dict(self.loads),
                "held": sorted(self.held),
                "resident": resident,
                "engine": dataclasses.asdict(engine),
                "batcher": {
                    "requests": self.batcher.stats.requests,
                    "batches": self.batcher.stats.batches,
                    "mean_batch_size": self.batcher.stats.mean_batch_size,
                },
            }

    def close(self) -> None:
        self.batcher.close(timeout=30)
        self.store.close()


@serve.deployment(name=VOICES_DEPLOYMENT)
class VoiceReplica:
    """The speech deployment: ``synthesize(text, voice, speed)`` with the voice key as multiplexed model id."""

    def __init__(self, config: RayServeConfig):
        context = serve.get_replica_context()
        replica_id = getattr(context, "replica_id", None)
        self.host = VoiceHost(config, str(getattr(replica_id, "unique_id", replica_id or "")))

        async def load_voice(voice_key: str) -> LoadedVoice:
            return await asyncio.to_thread(self.host.load, voice_key)

        # Wrapped here rather than on the class: the limit is the config's.
        self.voice = serve.multiplexed(max_num_models_per_replica=config.voices_per_replica)(load_voice)

    async def synthesize(
        self, text: str, voice: EngineVoice | str, speed: float = 1.0, tenant: str = ""
    ) -> RemoteResult | Exception:
        """Speak ``text`` in ``voice`` (typed by the ingress); an error is returned, not raised, so the
        caller re-raises it with its own type."""
        key = None
        try:
            if isinstance(voice, str):  # a caller of the deployment itself, not the ingress
                voice = self.host.engine.resolve_voice(voice)
            if isinstance(voice, AdaptedVoice):
                routed = serve.get_multiplexed_model_id()
                if routed != voice.key:
                    raise ValueError(
                        f"adapted voice {voice.key!r} must be requested with multiplexed_model_id={voice.key!r} "
                        f"(got {routed!r})"
                    )
                self.host.announce(voice)
                await self.voice(voice.key)
                key = voice.key
            with self.host.using(key):
                result = await self.host.batcher.synthesize_async(text, voice, speed, tenant)
        except Exception as error:  # noqa: BLE001 - handed back to the ingress
            return error
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(SentenceResult)}
        return RemoteResult(
            **(fields | {"mel": None}), replica=self.host.replica, voice_loads=self.host.loads[key] if key else 0
        )

    def voice_stats(self) -> dict:
        """This replica's bookkeeping: loads per voice, voices held, engine and batcher counters."""
        return self.host.stats()

    def __del__(self):
        host = getattr(self, "host", None)
        if host is not None:
            host.close()


# -- the ingress -------------------------------------------------------------------------------------
class RemoteBatcher:
    """The ingress's :class:`~chorus.serving.batcher.SpeechQueue`: every request goes to the voices
    deployment, an adapted voice with its key as ``multiplexed_model_id`` (batching happens in the
    voices replicas)."""

    def __init__(self, handle: Callable[[], object]):
        self._handle_factory = handle
        self._handle = None
        self.stats = BatcherStats()

    def handle(self):
        if self._handle is None:
            self._handle = self._handle_factory()
        return self._handle

    async def synthesize_async(
        self, text: str, voice: EngineVoice, speed: float = 1.0, tenant: str = ""
    ) -> RemoteResult:
        """Speak ``text`` in ``voice`` (typed: resolved by the ingress, so the replica reads no record)."""
        self.stats.requests += 1
        multiplexed = isinstance(voice, AdaptedVoice)
        handle = self.handle().options(multiplexed_model_id=voice.key) if multiplexed else self.handle()
        started = time.perf_counter()
        try:
            outcome = await handle.synthesize.remote(text, voice, speed, tenant)
        except Exception:
            self.stats.failed += 1
            raise
        if isinstance(outcome, BaseException):
            self.stats.failed += 1
            raise outcome
        self.stats.completed += 1
        self.stats.busy_seconds += time.perf_counter() - started
        return outcome

    def submit(self, text: str, voice: EngineVoice, speed: float = 1.0, tenant: str = "") -> Future:
        """As :meth:`Batcher.submit`; call it from the ingress's event loop."""
        return asyncio.run_coroutine_threadsafe(
            self.synthesize_async(text, voice, speed, tenant), asyncio.get_running_loop()
        )

    def synthesize(self, *args, **kwargs):
        raise RuntimeError("the Ray ingress only serves asynchronously")

    def close(self, timeout: float | None = None) -> None:
        pass


class RayJobRunner(JobRunner):
    """The ingress's onboarding: each job becomes a :func:`run_onboarding_job` Ray task the moment it is
    queued (the cluster decides how many train at once), instead of training in this process."""

    def __init__(self, store: VoiceStore, config: RayServeConfig):
        super().__init__(
            store,
            jobs_dir(config.server.settings, store),
            bundle_factory=_no_bundle,
            config=config.server.settings.adapt,
            progress_interval=config.server.settings.progress_interval,
            poll_seconds=None,  # every job of this cluster comes through this ingress
        )
        self.ray_config = config
        self._tasks: dict[object, OnboardingJob] = {}
        self._tasks_lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    @property
    def running(self) -> str | None:
        """One job whose task runs now (the tasks say what runs, not the dispatching thread)."""
        with self._tasks_lock:
            return next((job.job_id for job in self._tasks.values()), None)

    def start(self) -> None:
        super().start()
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="chorus-ray-jobs", daemon=True)
            self._reaper.start()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop dispatching; tasks already started finish on their own."""
        super().close(timeout)
        if self._reaper is not None:
            self._reaper.join(timeout)
            self._reaper = None

    def dispatch(self, job: OnboardingJob) -> None:
        """Start ``job``'s Ray task (called by the worker thread, one job at a time)."""
        ref = onboarding_task(self.ray_config).remote(self.ray_config, job)
        with self._tasks_lock:
            self._tasks[ref] = job

    def _reap(self) -> None:
        """Marks a job failed whose task died without saying so (a crashed worker)."""
        while not self.closing.is_set():
            with self._tasks_lock:
                refs = list(self._tasks)
            if not refs:
                self.closing.wait(0.2)
                continue
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            for ref in done:
                with self._tasks_lock:
                    job = self._tasks.pop(ref)
                try:
                    ray.get(ref)
                except Exception as error:  # noqa: BLE001 - the task itself died
                    log.error("onboarding task of job %s died: %s", job.job_id, error)
                    self.fail(job.job_id, "training failed with an internal error (see the server log)")


def _no_bundle():
    raise RuntimeError("Ray onboarding tasks load their own copy of the base")


def build_ingress_app(config: RayServeConfig, app_name: str):
    """The FastAPI app of the ingress (runs on the ingress replica): speech goes to the voices
    deployment, onboarding to Ray tasks."""
    import torch

    torch.set_num_threads(1)
    store = config.open_store()
    # The ingress never runs the model (its batcher is remote); it needs the base's speakers and rate.
    engine = Engine.load(config.server.base, config.server.vocoder, cache_bytes=0)
    remote = RemoteBatcher(lambda: serve.get_deployment_handle(VOICES_DEPLOYMENT, app_name=app_name))
    return create_app(
        store,
        engine,
        config.tenants,
        config.server.settings,
        jobs=RayJobRunner(store, config),
        batcher=remote,
        loopback_only=config.tenants.single_tenant,
    )


def ingress_deployment(config: RayServeConfig, app_name: str):
    """The ingress deployment class; the app is built on its replica (the engine and store do not travel)."""

    def build():
        return build_ingress_app(config, app_name)

    @serve.ingress(build)
    class ChorusIngress:
        def __init__(self, voices):
            self.voices = voices  # bound so that the voices deployment is part of the application

    return serve.deployment(name=INGRESS_DEPLOYMENT)(ChorusIngress)


def build_app(config: RayServeConfig, app_name: str = APP_NAME):
    """The Serve application (pass ``app_name`` again as ``serve.run(..., name=app_name)``)."""
    voices = VoiceReplica.options(
        num_replicas=config.replicas,
        max_ongoing_requests=config.max_ongoing_requests,
        ray_actor_options={"num_cpus": config.replica_cpus},
    ).bind(config)
    ingress = ingress_deployment(config, app_name).options(ray_actor_options={"num_cpus": config.ingress_cpus})
    return ingress.bind(voices)


# -- onboarding as Ray tasks -------------------------------------------------------------------------
def run_onboarding_job(config: RayServeConfig, job: OnboardingJob) -> str:
    """Train queued ``job`` from its files in the jobs folder and put the voice into the store (the same
    steps, checks and progress reports as the in-process worker); returns the job's final status."""
    import torch

    torch.set_num_threads(config.server.settings.adapt.threads)
    store = config.open_store()
    try:
        config.job_runner(store).run(job)
        return store.get_job(job.tenant, job.job_id).status.value
    finally:
        store.close()


# Not retried: a job whose worker died is marked failed (RayJobRunner) or interrupted (next start).
_onboarding_remote = ray.remote(max_retries=0)(run_onboarding_job)


def onboarding_task(config: RayServeConfig):
    """:func:`run_onboarding_job` as a Ray remote function reserving ``config.job_cpus``."""
    return _onboarding_remote.options(num_cpus=config.job_cpus)


def submit_onboarding(
    config: RayServeConfig, tenant: str, voice_id: str, data: str | Path, consent: str, name: str | None = None
) -> tuple[str, ray.ObjectRef]:
    """Onboard the LJSpeech-style folder ``data`` as ``voice_id`` of ``tenant`` in a Ray task; returns the
    job id (``GET /v1/jobs/ID`` follows it) and the task's ref (its result is the final job status).
    ``consent``: the recorded person's consent statement, logged as an upload's is."""
    if len(consent.strip()) < 10:
        raise ValueError("consent is required: a statement that the person recorded consented to a synthetic voice")
    name = name or voice_id
    store = config.open_store()
    try:
        job = OnboardingJob(
            store.create_job(tenant, voice_id, name=name, method=config.server.settings.adapt.methods.spec),
            tenant,
            voice_id,
            name,
        )
        folder = jobs_dir(config.server.settings, store)
        job_dir = folder / job.job_id
        failure = "could not copy the voice's data"  # what the job says if the step under way fails
        try:
            shutil.copytree(data, job_dir / DATA_DIR)
            write_job_file(job_dir, job)
            failure = "could not record its consent"
            record_consent(store, folder, job, {"statement": consent, "source": str(data)})
            failure = "could not publish its clips to the store"
            store.publish_job_inputs(job.job_id, job_dir)  # a task on another node fetches them from the store
        except BaseException:
            store.update_job(job.job_id, status=JobStatus.FAILED, message=failure)
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
    finally:
        store.close()
    return job.job_id, onboarding_task(config).remote(config, job)


# -- chorus serve --ray ------------------------------------------------------------------------------
def serve_ray(
    server: ServeConfig,
    replicas: int = 2,
    voices_per_replica: int = 32,
    announce: Callable[[str], None] = print,
    log_level: str = "info",
) -> None:
    """Start a local Ray cluster on this machine's resources, deploy ``server`` on it with ``replicas``
    speech replicas and serve until interrupted (``chorus serve --ray``)."""
    if server.device != "cpu":
        raise ValueError("--ray places replicas on CPUs; --device goes with the one-process server")
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s:     %(name)s: %(message)s"
    )
    tenants = Tenants.load(server.keys)
    check_bind(server.host, tenants)
    config = RayServeConfig(server, tenants=tenants, replicas=replicas, voices_per_replica=voices_per_replica)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
    # address="local": always a new cluster on this machine, never one named by RAY_ADDRESS.
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    # Ray's own handler (glog's) answers SIGTERM, as `systemctl stop` sends it, with an abort that leaves the
    # cluster's agents running: stop as Ctrl-C does, through the shutdown below.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # Ray CPUs are scheduling tokens: split the machine's so every replica and one onboarding task
        # fit at once (more tasks wait for a share), else a replica that does not fit never starts.
        cpus = ray.cluster_resources().get("CPU", 1.0)
        config.ingress_cpus = min(0.5, cpus / (replicas + 2))
        share = min(1.0, (cpus - config.ingress_cpus) / (replicas + 1))
        config.replica_cpus = config.job_cpus = share
        serve.start(http_options={"host": server.host, "port": server.port})
        serve.run(build_app(config, APP_NAME), name=APP_NAME, route_prefix="/")
        announce(
            f"Ray Serve on {cpus:g} CPUs: {replicas} speech replicas ({share:.2g} CPU each; one base, at most "
            f"{voices_per_replica} adapted voices and {server.cache_mb:g} MB of adapters each), onboarding jobs as Ray "
            f"tasks ({share:.2g} CPU each)"
        )
        announce(
            "single-tenant mode (no authentication), loopback only"
            if tenants.single_tenant
            else f"{len(tenants.names)} tenant(s) with API keys; requests need 'Authorization: Bearer KEY'"
        )
        announce(
            f"OpenAI-compatible endpoint: http://{server.host}:{server.port}/v1 (audio.speech), voices at /v1/voices"
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
