"""The onboarding worker: checked uploads adapted into voices one job at a time, by a background thread
(here, or in a process of its own per job: :mod:`chorus.serving.onboarding.job_process`, what ``chorus serve`` uses),
with real progress (steps done of the recipe's at most) reported to the store's job.

This is the one serving module that imports the training code. A job's files live in
``<jobs_dir>/<job_id>/`` (``job.json``, the clips in ``voice/``, the trained voice in ``out/``) until the
job ends; once written they are published to the store (:meth:`VoiceStore.publish_job_inputs`: copied
under a remote root), so that the worker of any server sharing the store can take the job. Each job is
claimed by exactly one worker (:meth:`VoiceStore.claim_job`); an idle worker takes queued or interrupted
jobs of other servers (:meth:`VoiceStore.claim_next_job`), so a job whose server died is finished by
another. A job interrupted by a restart is resumed from its files when they are still there
(:meth:`JobRunner.resume`), else marked failed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from chorus.adapters.voice import trained_on
from chorus.data.check import WARNING_NAMES
from chorus.models.bundle import ModelBundle
from chorus.recipe import AdaptConfig
from chorus.serving.onboarding.heap import give_back_freed_memory
from chorus.serving.onboarding.refinement import RefinementCheck, WordCheck
from chorus.serving.settings import ConsentSettings
from chorus.serving.store import (
    ACTIVE_JOB,
    FINISHED_JOB,
    JobNotFound,
    JobStatus,
    JobTakenOver,
    VoiceConflict,
    VoiceNotFound,
    VoiceStore,
)
from chorus.training.adapt import VOICE, AdaptResult, DataRefused, adapt

log = logging.getLogger("chorus.serving.worker")

DATA_DIR = "voice"  # the LJSpeech-style folder of a job
OUT_DIR = "out"  # the voice folder ``adapt`` writes
JOB_FILE = "job.json"
INCOMING_PREFIX = ".incoming-"
CONSENT_LOG = "consent.jsonl"
# Progress of a job: checks and setup below TRAINING_START, training steps up to TRAINING_END, then saving.
TRAINING_START, TRAINING_END = 0.05, 0.95
SWEEP_SECONDS = 30.0  # how often an idle worker removes the folders of jobs that ended elsewhere

_consent_lock = threading.Lock()


# A job's recipe: CLIPS for an upload of clips (``ServerSettings.adapt``), SAMPLE for a voice refined from
# one short sample in the background (``ServerSettings.adapt_sample``: OpenAI's custom voices).
CLIPS, SAMPLE = "clips", "sample"


@dataclass(frozen=True)
class OnboardingJob:
    job_id: str
    tenant: str
    voice_id: str
    name: str
    recipe: str = CLIPS


def write_job_file(job_dir: Path, job: OnboardingJob) -> None:
    """``job.json``: what :meth:`JobRunner.resume` needs to take the job up again after a restart."""
    (job_dir / JOB_FILE).write_text(
        json.dumps(
            {
                "job_id": job.job_id,
                "tenant": job.tenant,
                "voice_id": job.voice_id,
                "name": job.name,
                "recipe": job.recipe,
                "created": time.time(),
            }
        ),
        encoding="utf-8",
    )


def record_consent(store: VoiceStore, jobs_dir: Path, job: OnboardingJob, consent: dict) -> None:
    """Keep the recorded person's consent: in the store's database (``VoiceStore.consent_audit``), which backups
    and migrations carry, and as a line of ``<jobs_dir>/consent.jsonl``, this machine's log of it; both outlive
    the job's files."""
    store.audit_consent(job.tenant, job.voice_id, job.job_id, consent)
    entry = {"time": time.time(), "tenant": job.tenant, "voice_id": job.voice_id, "job_id": job.job_id, **consent}
    with _consent_lock, open(jobs_dir / CONSENT_LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, ensure_ascii=False) + "\n")


class JobCancelled(Exception):
    """Raised from ``adapt``'s callbacks, and between the job's later phases, when the job ended while it
    trained (its voice was deleted, or its tenant cancelled it): the job stops there."""


class ServerStopping(Exception):
    """Raised from ``adapt``'s step callback when the server stops: training ends at that step and the
    job's files stay for the next start, which trains it again."""


def for_the_uploader(error: ValueError, job_dir: Path) -> str:
    """A job's failure as its uploader reads it: a refusal of the data without the command line's advice
    (:class:`~chorus.training.adapt.DataRefused`), and the job's folders by name, not path."""
    message = error.reason if isinstance(error, DataRefused) else str(error)
    return message.replace(str(job_dir / DATA_DIR), "upload").replace(str(job_dir), "job")


class JobRunner:
    """Runs onboarding jobs one at a time from a background thread (in it, or wherever :meth:`dispatch` says).

    ``bundle_factory`` gives a private copy of the base for each job (``adapt`` adds its adapter to it in
    place, saving a copy of its own; the resident serving model must not see that); ``config`` is the recipe jobs of
    clips train with (``ServerSettings.adapt``), ``sample_config`` the one of a voice refined from one
    short sample (``ServerSettings.adapt_sample``; default ``config``). ``on_ready(tenant, voice_id)``
    is called once a voice is stored. ``progress_interval``: least seconds between two progress writes.
    ``poll_seconds``: how often an idle worker looks for published jobs of other servers (None: never).
    ``closing``: the event that stops it (default its own; a job's process gets its server's).
    ``cancelled``: the event that stops the job being trained (set by :meth:`cancel`; default its own, a
    job's process gets its server's). ``refinement_check``: whether a sample's refined voice reads well
    enough to replace its instant voice (default: Whisper, ``ConsentSettings``' threshold).
    Subclasses change where a queued job runs by overriding :meth:`dispatch` (and :attr:`running`).
    """

    def __init__(
        self,
        store: VoiceStore,
        jobs_dir: str | Path,
        bundle_factory: Callable[[], ModelBundle],
        config: AdaptConfig,
        on_ready: Callable[[str, str], None] | None = None,
        progress_interval: float = 1.0,
        poll_seconds: float | None = 1.0,
        sample_config: AdaptConfig | None = None,
        closing: threading.Event | None = None,
        cancelled: threading.Event | None = None,
        refinement_check: RefinementCheck | None = None,
    ):
        self.store = store
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.bundle_factory = bundle_factory
        self.config = config
        self.sample_config = sample_config or config
        self.on_ready = on_ready
        self.progress_interval = progress_interval
        self.poll_seconds = poll_seconds
        self._queue: queue.Queue[OnboardingJob | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = closing or threading.Event()
        self._cancelled = cancelled or threading.Event()
        self.refinement_check = refinement_check or RefinementCheck(ConsentSettings().max_refined_wer_increase)
        self._running: str | None = None
        self._running_lock = threading.Lock()  # a cancel and the start or end of a job: one at a time
        self._passed_over: set[str] = set()  # ids of queued jobs cancelled while they wait
        # Jobs that ended here while the store refused to record it (a full disk, a database down): the
        # worker records them before anything else, so none stays "running" (and holds its tenant's slot).
        self._unrecorded: dict[str, str] = {}
        self._unrecorded_lock = threading.Lock()
        # Jobs this worker took to their end, by (tenant, "done" or "failed"), for /metrics: read from the
        # store after each job, so a job trained in a process of its own counts as one trained here.
        self.ended: collections.Counter[tuple[str, str]] = collections.Counter()
        self._claimed: str | None = None  # the job this worker last took (claim), whose end it counts

    # -- lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="chorus-onboarding", daemon=True)
            self._thread.start()

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop: a job training stops at its next step, queued ones are not started; all are left to the
        next start's recovery (interrupted, then resumed from their files). Waits for the worker thread
        (a job still preparing its data finishes that first): an interpreter that exits under a thread
        inside torch aborts."""
        if self._thread is not None:
            self._closing.set()
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
            with contextlib.suppress(Exception):  # a tidy-up: the next start sweeps again
                self.remove_finished()

    @property
    def closing(self) -> threading.Event:
        return self._closing

    @property
    def queued(self) -> int:
        """Jobs waiting in this worker's queue, less those cancelled (or their voice deleted) while they wait, which
        are passed over when their turn comes: a tenant that uploaded and cancelled in a loop filled the server's
        queue for every tenant until the running job ended."""
        with self._queue.mutex:
            waiting = [job.job_id for job in self._queue.queue if job is not None]
        return sum(job_id not in self._passed_over for job_id in waiting)

    @property
    def running(self) -> str | None:
        """The id of the job being trained, if any."""
        return self._running

    def cancel(self, job_id: str) -> None:
        """Stop ``job_id`` now if this worker is training it (in this process or a job process of its own):
        at its next step, or before its next phase. For a job the store has ended already (its voice
        deleted, its tenant's cancel): the store's state is what every worker reads, but a training job only
        reads it at its next progress write, and a job between steps (checking its words, uploading) never.
        A queued job is not claimed once its turn comes; until then it no longer counts as waiting (:attr:`queued`)."""
        with self._running_lock:
            if self._running == job_id:
                self._cancelled.set()
                return
        with self._queue.mutex:
            if any(job is not None and job.job_id == job_id for job in self._queue.queue):
                self._passed_over.add(job_id)

    # -- uploads and submission
    def new_upload_dir(self) -> Path:
        """A fresh folder for an upload being checked (removed by :meth:`discard` or moved by :meth:`submit`)."""
        # Named after this store's owner: servers on one machine may share the jobs folder, and each
        # removes only the leftovers of owners found dead.
        folder = self.jobs_dir / f"{INCOMING_PREFIX}{self.store.owner}-{uuid.uuid4().hex}"
        folder.mkdir()
        return folder

    def discard(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def submit(self, upload_dir: Path, job: OnboardingJob, consent: dict) -> None:
        """Adopt ``upload_dir`` (holding the checked ``voice/`` folder) as ``job``'s files and queue it.

        The files are written before the folder is renamed into place, so a full disk leaves nothing
        but ``upload_dir`` (for :meth:`discard`); the job is then marked failed where the store can
        still take it (else start-up's :meth:`resume` fails it: it has no job folder)."""
        try:
            write_job_file(upload_dir, job)
            record_consent(self.store, self.jobs_dir, job, consent)
            upload_dir.rename(self.jobs_dir / job.job_id)
            self.store.publish_job_inputs(job.job_id, self.jobs_dir / job.job_id)
        except Exception as error:  # a full disk, an object store or a database that refused
            self.fail(job.job_id, f"its files: {error}"[:200])  # kept until the store takes it
            shutil.rmtree(self.jobs_dir / job.job_id, ignore_errors=True)
            self.store.remove_job_inputs(job.job_id)
            raise
        self._queue.put(job)

    def resume(self) -> tuple[list[str], list[str]]:
        """After ``store.recover()``: queue every interrupted job whose files are still here or published
        in the store, fail the others, and remove files no live job owns. Returns (resumed, failed) job ids."""
        resumed, failed = [], []
        for job in self.store.interrupted_jobs():
            job_dir = self.jobs_dir / job.job_id
            meta = _read_json(job_dir / JOB_FILE) if self.store.fetch_job_inputs(job.job_id, job_dir) else None
            try:
                voice = self.store.voice(job.tenant, job.voice_id)
            except VoiceNotFound:
                voice = None
            intact = (
                meta is not None
                and (job_dir / DATA_DIR / "metadata.csv").is_file()
                and voice is not None
                and voice.job_id == job.job_id
                and meta.get("tenant") == job.tenant
            )
            # Only while it is still interrupted: another server's worker may have taken it meanwhile.
            if intact:
                requeued = self.store.update_job(
                    job.job_id,
                    status=JobStatus.QUEUED,
                    progress=0.0,
                    message="resumed after a server restart; waiting for the trainer",
                    if_status=JobStatus.INTERRUPTED,
                )
                if requeued is None:
                    continue
                self._queue.put(
                    OnboardingJob(
                        job.job_id,
                        job.tenant,
                        job.voice_id,
                        str(meta.get("name") or job.voice_id),
                        str(meta.get("recipe") or CLIPS),
                    )
                )
                resumed.append(job.job_id)
            else:
                ended = self.store.update_job(
                    job.job_id,
                    status=JobStatus.FAILED,
                    message="interrupted by a server restart and its uploaded clips are gone; upload them again",
                    if_status=JobStatus.INTERRUPTED,
                )
                if ended is None:
                    continue
                shutil.rmtree(job_dir, ignore_errors=True)
                self.store.remove_job_inputs(job.job_id)
                failed.append(job.job_id)
        self.remove_finished(live=set(resumed))
        if resumed or failed:
            log.info("onboarding jobs after restart: %d resumed, %d failed", len(resumed), len(failed))
        return resumed, failed

    def remove_finished(self, live: set[str] = frozenset()) -> None:
        """Remove what no job needs from the jobs folder: folders of jobs that have ended (a job another
        server's worker took from the shared queue and finished leaves this server's copy of its clips),
        uploads being checked by a server found dead, and unreadable folders. Jobs queued, running or
        interrupted (to be resumed), ``live`` ones, and uploads of live servers stay."""
        for entry in self.jobs_dir.iterdir():
            if not entry.is_dir() or entry.name in live or entry.name == self._running:
                continue
            if entry.name.startswith(INCOMING_PREFIX):
                owner = entry.name.removeprefix(INCOMING_PREFIX).rsplit("-", 1)[0]
                if not self.store.is_alive(owner):
                    shutil.rmtree(entry, ignore_errors=True)
                continue
            if entry.name.startswith("."):
                continue  # a folder being written (atomic_write_folder's), or another tool's
            meta = _read_json(entry / JOB_FILE)
            if meta is None or not self._needed(str(meta.get("tenant")), str(meta.get("job_id"))):
                shutil.rmtree(entry, ignore_errors=True)

    def _needed(self, tenant: str, job_id: str) -> bool:
        """Whether a job's files are still needed: it is queued, running or interrupted."""
        try:
            status = self.store.get_job(tenant, job_id).status
        except (JobNotFound, ValueError):
            return False
        return status in (*ACTIVE_JOB, JobStatus.INTERRUPTED)

    # -- the work
    def _loop(self) -> None:
        swept = time.monotonic()
        while not self._closing.is_set():
            self.record_failures()
            try:
                job = self._queue.get(timeout=self.poll_seconds)
            except queue.Empty:
                try:
                    job = self._claim_published()
                    if job is None and time.monotonic() - swept > SWEEP_SECONDS:
                        swept = time.monotonic()
                        self.remove_finished()
                except Exception:  # noqa: BLE001 - an object store or database down for a while: look again later
                    log.exception("looking for onboarding jobs failed")
                    job = None
                if job is None:
                    continue
            if job is None or self._closing.is_set():
                break
            with self._running_lock:
                self._passed_over.discard(job.job_id)
                self._cancelled.clear()  # a cancel of the job before this one stops nothing of it
                self._running = job.job_id
            try:
                self.dispatch(job)
            except Exception:  # noqa: BLE001 - never let one job kill the worker
                log.exception("onboarding job %s crashed", job.job_id)
            finally:
                with self._running_lock:
                    self._running = None
            self._count_end(job)
            # The job's copy of the base is garbage now (run's frame is gone): hand its pages back to the OS
            # rather than leave them in malloc's arenas, where the server's RSS would keep them.
            give_back_freed_memory()

    def _count_end(self, job: OnboardingJob) -> None:
        """Count ``job`` in :attr:`ended` if it ended here (not one stopped by the server's stop, nor one
        another worker took over); a failure the store has not taken yet counts as failed."""
        claimed, self._claimed = self._claimed, None
        if claimed != job.job_id or self._closing.is_set():
            return
        with self._unrecorded_lock:
            unrecorded = job.job_id in self._unrecorded
        try:
            status = JobStatus.FAILED if unrecorded else self.store.get_job(job.tenant, job.job_id).status
        except Exception:  # noqa: BLE001 - gone with its voice, or a store down for now: not counted
            return
        if status in FINISHED_JOB:
            self.ended[job.tenant, status.value] += 1

    def _claim_published(self) -> OnboardingJob | None:
        """A job of any server, queued or interrupted, with its files fetched here; None when there is none.
        A job whose files cannot be fetched now goes back to the queue (interrupted) for any worker."""
        record = self.store.claim_next_job()
        if record is None:
            return None
        job_dir = self.jobs_dir / record.job_id
        try:
            meta = _read_json(job_dir / JOB_FILE) if self.store.fetch_job_inputs(record.job_id, job_dir) else None
        except Exception:
            self.store.update_job(
                record.job_id, status=JobStatus.INTERRUPTED, message="its clips could not be fetched", as_worker=True
            )
            raise
        if meta is None:
            self.fail(record.job_id, "its uploaded clips are gone; upload them again")
            return None
        log.info("onboarding job %s (%s/%s) taken from the shared queue", record.job_id, record.tenant, record.voice_id)
        return OnboardingJob(
            record.job_id,
            record.tenant,
            record.voice_id,
            str(meta.get("name") or record.voice_id),
            str(meta.get("recipe") or CLIPS),
        )

    def dispatch(self, job: OnboardingJob) -> None:
        """Called by the worker thread for each queued job, in order: trains it here (:meth:`run`)."""
        self.run(job)

    def claim(self, job: OnboardingJob) -> bool:
        """Take ``job`` for this worker (a no-op when it holds it already). False when it is not there to
        take: a job that ended while it waited (cancelled, its voice deleted) has its files removed; one
        that another server's worker took from the shared queue is left to it."""
        if self.store.claim_job(job.job_id) is not None:
            self._claimed = job.job_id
            return True
        if not self._needed(job.tenant, job.job_id):
            shutil.rmtree(self.jobs_dir / job.job_id, ignore_errors=True)
            self.store.remove_job_inputs(job.job_id)
        return False

    def run(self, job: OnboardingJob) -> None:
        """Train ``job`` from its files to its end (done or failed) in this thread; removes its files."""
        job_dir = self.jobs_dir / job.job_id
        if not self.claim(job):
            return
        keep_files = False
        threads = torch.get_num_threads()  # what the job sets (its word check too); speech must get it back
        try:
            if not self.store.fetch_job_inputs(job.job_id, job_dir):
                raise ValueError("its uploaded clips are gone; upload them again")
            self.store.update_job(
                job.job_id, progress=0.02, message="checking the clips and preparing the base", as_worker=True
            )
            shutil.rmtree(job_dir / OUT_DIR, ignore_errors=True)  # a resumed job starts over
            bundle = self.bundle_factory()
            result = adapt(
                job_dir / DATA_DIR,
                bundle,
                job_dir / OUT_DIR,
                self.sample_config if job.recipe == SAMPLE else self.config,
                progress=False,
                name=job.name,
                on_step=self._progress_reporter(job),
                on_start=self._instant_reporter(job, bundle.speakers) if job.recipe == SAMPLE else None,
                in_place=True,  # the factory's copy is this job's alone
            )
            card = result.card
            metrics = card.metrics
            words = None
            if job.recipe == SAMPLE:
                # A sample's voice already speaks (its instant voice): refinement must earn its place, by
                # likeness (the held-out mel loss) and then by words.
                if not metrics["validation_mel_l1_best"] < metrics["validation_mel_l1_start"]:
                    raise ValueError(
                        f"refinement did not improve on the held-out part of the sample (mel L1 "
                        f"{metrics['validation_mel_l1_start']:.3f} -> {metrics['validation_mel_l1_best']:.3f}); "
                        "the instant voice stays"
                    )
                words = self._check_words(job, bundle, result)
                if not words.kept:
                    raise ValueError(
                        f"the refined voice reads worse than the instant voice ({words}); the instant voice stays"
                    )
            similarity = metrics.get("encoder_similarity_to_clips")
            self._stop_if_cancelled(job)  # deleted while it was judged (its words, its likeness): not uploaded
            self.store.update_job(
                job.job_id,
                as_worker=True,
                progress=0.97,
                message=(
                    f"trained {card.steps} steps in {card.train_seconds:.0f} s on {trained_on(card)}; "
                    f"held-out mel L1 {metrics['validation_mel_l1_start']:.3f} -> {metrics['validation_mel_l1_best']:.3f}"
                    + (
                        f"; similarity to the upload {similarity:.3f} (Chorus speaker encoder)"
                        if similarity is not None
                        else ""
                    )
                    + (f"; {words}" if words is not None else "")
                    + (f"; clips left out: {card.notes['skipped_clips']}" if "skipped_clips" in card.notes else "")
                    + "".join(f"; warning: {card.notes[name]}" for name in WARNING_NAMES if name in card.notes)
                ),
            )
            self.store.put_voice(job.tenant, job.voice_id, result.voice_dir, name=job.name, job_id=job.job_id)
            log.info("onboarding job %s: voice %s/%s is ready", job.job_id, job.tenant, job.voice_id)
            if self.on_ready is not None:
                self.on_ready(job.tenant, job.voice_id)
        except JobCancelled:
            log.info("onboarding job %s stopped: its voice was deleted, or the job ended, while it trained", job.job_id)
        except JobTakenOver:
            log.info("onboarding job %s stopped: another worker took it over while it trained", job.job_id)
        except ServerStopping:
            keep_files = True
            log.info(
                "onboarding job %s stopped by the server's stop; the next start trains it again from its clips",
                job.job_id,
            )
        except VoiceConflict as error:
            log.info("onboarding job %s dropped: %s", job.job_id, error)
            self.fail(job.job_id, "the voice was deleted or replaced while it trained")
        except ValueError as error:  # the data or the recipe (adapt's checks say why)
            log.info("onboarding job %s failed: %s", job.job_id, error)
            self.fail(job.job_id, for_the_uploader(error, job_dir))
        except Exception:  # noqa: BLE001 - the details stay in the server log
            log.exception("onboarding job %s failed", job.job_id)
            self.fail(job.job_id, "training failed with an internal error (see the server log)")
        finally:
            torch.set_num_threads(threads)
            # A job another worker holds now (this server was found dead meanwhile) keeps its files; so does
            # one whose state the store cannot tell now (the sweep removes them later).
            with contextlib.suppress(Exception):
                if not keep_files and job.job_id not in self._unrecorded and not self._needed(job.tenant, job.job_id):
                    shutil.rmtree(job_dir, ignore_errors=True)
                    self.store.remove_job_inputs(job.job_id)

    def _stop_if_cancelled(self, job: OnboardingJob) -> None:
        if self._cancelled.is_set():
            raise JobCancelled(job.job_id)

    def _check_words(self, job: OnboardingJob, bundle: ModelBundle, result: AdaptResult) -> WordCheck:
        """The refined voice of a sample's ``job`` against the instant voice it speaks as now (its record's;
        the start speaker the card names where the record has none) (:mod:`chorus.serving.onboarding.refinement`)."""
        self._stop_if_cancelled(job)
        try:
            self.store.update_job(
                job.job_id,
                as_worker=True,
                progress=0.96,
                message="checking that the refined voice reads as well as the instant voice",
            )
            record = self.store.voice(job.tenant, job.voice_id)
        except (ValueError, JobNotFound, VoiceNotFound):  # it ended meanwhile (the voice deleted, the job cancelled)
            raise JobCancelled(job.job_id) from None
        instant = record.instant or result.card.notes["speaker_vector_start"]
        words = self.refinement_check(bundle, result.model, VOICE, instant)
        log.info("onboarding job %s: %s", job.job_id, words)
        return words

    def _instant_reporter(self, job: OnboardingJob, speakers: list[str]) -> Callable[[int], None]:
        """``adapt``'s start callback for a sample's voice: until it is refined, the voice speaks as the base
        speaker that fits the transcribed sample best by teacher-forced mel loss (where training starts),
        not the encoder's blend it spoke as from its ``POST``: bench/short_samples.py measured the mel-loss
        choice at the nearest speaker's similarity and WER in every cell, the blend in a third of them. (A
        sample recipe started by a speaker encoder, ``AdaptConfig.speaker_encoder``, starts from, and so
        speaks as, the encoder's nearest speaker instead.) A store that cannot take it now leaves the blend;
        the refinement goes on."""

        def on_start(speaker: int) -> None:
            self._stop_if_cancelled(job)
            try:
                changed = self.store.set_instant(job.tenant, job.voice_id, job.job_id, speakers[speaker])
            except Exception as error:  # noqa: BLE001 - an outage: the blend stays, training goes on
                log.warning("onboarding job %s: instant voice not updated (%r)", job.job_id, error)
                return
            if changed:
                log.info(
                    "onboarding job %s: voice %s speaks as %s meanwhile", job.job_id, job.voice_id, speakers[speaker]
                )

        return on_start

    def _progress_reporter(self, job: OnboardingJob) -> Callable[[int, int], None]:
        """``adapt``'s step callback: the job's progress from TRAINING_START to TRAINING_END as steps pass,
        written at most every ``progress_interval`` seconds (and at the last step). Each step stops on
        :meth:`cancel`, and the write is the cancellation check for the rest: a job that ended meanwhile
        (voice deleted, job cancelled, possibly by another server on the same store) raises
        :class:`JobCancelled`, which stops the training loop."""
        last_write = [float("-inf")]

        def on_step(done: int, total: int) -> None:
            if self._closing.is_set():
                raise ServerStopping(job.job_id)
            self._stop_if_cancelled(job)
            now = time.monotonic()
            if done < total and now - last_write[0] < self.progress_interval:
                return
            last_write[0] = now
            fraction = TRAINING_START + (TRAINING_END - TRAINING_START) * done / max(total, 1)
            try:
                self.store.update_job(
                    job.job_id,
                    as_worker=True,
                    progress=round(fraction, 3),
                    message=f"training: step {done} of at most {total} (early stopping may end it sooner)"
                    if done
                    else "preparing: checking the clips and computing their features",
                )
            except (ValueError, JobNotFound, JobTakenOver):
                raise JobCancelled(job.job_id) from None

        return on_step

    def fail(self, job_id: str, message: str) -> None:
        """Mark the job failed with ``message`` (nothing if it already ended, e.g. its voice was deleted,
        or if this worker no longer holds it). When the store cannot take the write now, the failure is kept
        and recorded by :meth:`record_failures`, which the worker calls before each job and each poll."""
        try:
            self.store.update_job(job_id, status=JobStatus.FAILED, message=message, as_worker=True)
        except (ValueError, JobNotFound, JobTakenOver):
            pass
        except Exception:  # noqa: BLE001 - a database or object store that refuses writes for now
            log.exception("onboarding job %s failed, and its failure could not be recorded yet", job_id)
            with self._unrecorded_lock:
                self._unrecorded[job_id] = message

    def record_failures(self) -> None:
        """Record the failures that the store refused earlier; those it still refuses are kept for later."""
        with self._unrecorded_lock:
            pending, self._unrecorded = self._unrecorded, {}
        for job_id, message in pending.items():
            self.fail(job_id, message)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
