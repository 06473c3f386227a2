"""Onboarding jobs in processes of their own: what ``chorus serve`` trains voices with.

A job holds a copy of the base, Whisper, the speaker encoder and the training's activations: 250-500 MB
on the shipped base (``bench/job_memory.py``). Trained in a thread of the server, that memory stays in the
server's heap after the job (glibc keeps freed arenas; ``malloc_trim`` gives back most, not all), and the
server's resident memory steps up and down by hundreds of MB as jobs come and go (``bench/soak.py``). In a
process of its own it all goes back to the system when the job ends, and a crash or an out-of-memory kill
in training ends that job (marked failed), not the server.

Jobs start from a fork server that has imported torch and Chorus once: a job is forked from it in a
fraction of a second, without the server's threads (uvicorn, the batcher) in the child. The child opens
the store itself on behalf of the server (the job stays the server's: if the child dies, the server fails
the job; if the server dies, its jobs are reclaimed as any dead owner's; a signal to all of the server's
processes, Ctrl-C or ``systemctl stop``, is left to the server's stop) and runs :meth:`JobRunner.run
<chorus.serving.onboarding.job_runner.JobRunner.run>` (:func:`job_runner_for`, as a Ray onboarding task does): the same
claim, checks, progress and cancellation through the store. The server's stop reaches it through a
shared flag (training stops at its next step and the next start trains the job again), and so does a cancel of its
job (its voice deleted: :meth:`JobRunner.cancel <chorus.serving.onboarding.job_runner.JobRunner.cancel>`); it ends itself the
moment the server ends.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from multiprocessing.connection import wait

from chorus.models.bundle import load_bundle
from chorus.serving.onboarding.job_runner import JobRunner, OnboardingJob
from chorus.serving.onboarding.refinement import RefinementCheck
from chorus.serving.settings import ServeConfig, jobs_dir
from chorus.serving.store import ACTIVE_JOB, JobNotFound, JobStatus, VoiceStore
from chorus.synthesis import DEFAULT_BASE
from chorus.text.phonemize import close_backends

log = logging.getLogger("chorus.serving.jobs")

# What the fork server imports before forking jobs: the training stack, so a job starts in well under a second,
# and fork_server, which has it ignore SIGTERM (see there).
PRELOAD = [
    "chorus.serving.onboarding.fork_server",
    "torch",
    "chorus.serving.onboarding.job_process",
    "chorus.training.adapt",
    "chorus.evaluation.asr",
]
# Seconds a stopping server gives a job's process to stop at its next step before it is killed.
STOP_GRACE_SECONDS = 30.0


def job_runner_for(config: ServeConfig, store: VoiceStore, closing=None, cancelled=None) -> JobRunner:
    """An in-process worker for ``config``'s server on ``store`` that loads its own copy of the base: what a
    job's process (and a Ray onboarding task) runs one job with. ``closing`` / ``cancelled``: events whose
    setting stops training for the server's stop / the job's cancel (:class:`StopFlag` from the server;
    default the runner's own)."""
    settings = config.settings
    return JobRunner(
        store,
        jobs_dir(settings, store),
        lambda: load_bundle(config.base or DEFAULT_BASE, config.device),
        settings.adapt,
        progress_interval=settings.progress_interval,
        sample_config=settings.adapt_sample,
        closing=closing,
        cancelled=cancelled,
        refinement_check=RefinementCheck(settings.consent.max_refined_wer_increase),
    )


class StopFlag:
    """The server's stop (or a job's cancel), seen by its job processes: a byte in shared memory with
    :class:`threading.Event`'s ``set``/``clear``/``is_set``/``wait``. Lock-free, unlike
    ``multiprocessing.Event``: a job process killed while it held that Event's lock would leave the server's
    stop hanging on it."""

    def __init__(self, context: multiprocessing.context.BaseContext):
        self._value = context.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def clear(self) -> None:
        self._value.value = False

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)
        return self.is_set()


def _die_with(server_pid: int) -> None:
    """End this process the moment the server ``server_pid`` ends: a server killed mid-job must not leave a
    job training beside the one that takes it over (the fork server outlives the server while a job lives:
    each job holds the end of the pipe it watches, so only the job can watch the server)."""
    try:
        server = os.pidfd_open(server_pid)  # readable once that process has ended; immune to pid reuse
    except ProcessLookupError:
        os._exit(1)  # already gone

    def watch() -> None:
        select.select([server], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="chorus-job-watchdog", daemon=True).start()


def run_job(
    config: ServeConfig, job: OnboardingJob, owner: str, closing: StopFlag, server_pid: int, cancelled: StopFlag
) -> None:
    """A job process's body: open the store on behalf of its server (store ``owner``: the job is the
    server's, claimed by it or by this process, and stays so if this process dies), train ``job`` to its
    end (or to the server's stop, ``closing``, or the job's cancel, ``cancelled``), close the store."""
    # A signal to the whole server (Ctrl-C, systemctl stop) is the server's to answer: its stop sets
    # ``closing``, and training stops at its next step. Left to Python's defaults, SIGINT would raise
    # KeyboardInterrupt here mid-step and the server would fail the job (see fork_server).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Speech first (ServerSettings.job_niceness). Before any thread starts: on Linux a niceness is a thread's,
    # inherited by the threads it starts (torch's among them), not changed in threads already running.
    os.nice(config.settings.job_niceness)
    _die_with(server_pid)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    store = VoiceStore(config.store, config.database, config.cache_dir, on_behalf_of=owner)
    try:
        job_runner_for(config, store, closing, cancelled).run(job)
    finally:
        try:
            store.close()
        finally:
            close_backends()  # the process ends by os._exit: phonemizer's copies of libespeak-ng go now or never


class ProcessJobRunner(JobRunner):
    """The server's onboarding worker, each job trained in a process of its own (see the module's
    docstring); queueing, resuming and the shared queue stay in the server, as :class:`JobRunner`'s."""

    def __init__(self, store: VoiceStore, config: ServeConfig):
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        settings = config.settings
        super().__init__(
            store,
            jobs_dir(settings, store),
            bundle_factory=_no_bundle,
            config=settings.adapt,
            progress_interval=settings.progress_interval,
            sample_config=settings.adapt_sample,
            closing=StopFlag(self._context),
            cancelled=StopFlag(self._context),  # one job's process at a time: cleared before each
        )
        self.serve_config = config
        self._process = None  # the job's process while one runs

    def dispatch(self, job: OnboardingJob) -> None:
        """Train ``job`` in a new process and wait for it; a job its process left unfinished (killed, or a
        store that refused the job's end) or that could not start is failed here (``fail`` leaves alone a
        job that has ended or that another worker holds)."""
        # Taken here first: a job that another server's worker took from the shared queue costs no process
        # (and no copy of the base); the process's own claim is then a no-op, the job being this owner's.
        if not self.claim(job):
            return
        try:
            process = self._context.Process(
                target=run_job,
                args=(self.serve_config, job, self.store.owner, self.closing, os.getpid(), self._cancelled),
                name=f"chorus-job-{job.job_id[:8]}",
            )
            process.start()
        except Exception:  # noqa: BLE001 - no process (out of memory, of file descriptors): the job ends here
            log.exception("onboarding job %s: its process did not start", job.job_id)
            self.fail(job.job_id, "training could not start (see the server log)")
            return
        self._process = process
        log.info("onboarding job %s: training in process %d", job.job_id, process.pid)
        process.join()
        while process.exitcode is None:  # join() returned early: only when interrupted
            process.join(1.0)
        self._process = None
        if self.closing.is_set():
            return  # stopped by the server's stop: left for the next start to resume
        try:
            status = self.store.get_job(job.tenant, job.job_id).status
        except JobNotFound:
            return
        except Exception:  # noqa: BLE001 - the store is down: fail it (recorded once the store takes it)
            status = JobStatus.RUNNING
        if status in ACTIVE_JOB:
            if process.exitcode < 0:
                how = f"was killed by signal {-process.exitcode}"
                log.error("onboarding job %s: its process %s", job.job_id, how)
            else:
                how = f"exited (code {process.exitcode}) without ending it"
                log.warning("onboarding job %s: its process %s", job.job_id, how)
            self.fail(job.job_id, f"training stopped: its process {how} (see the server log)")

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop: a job's process stops training at its next step (killed if it has not within
        :data:`STOP_GRACE_SECONDS`); the next start trains it again."""
        self.closing.set()
        process = self._process
        # Waits on its sentinel, not join(): the worker thread joins it, and two readers of a fork server's
        # child's exit status leave one of them without it.
        if process is not None and not wait([process.sentinel], STOP_GRACE_SECONDS):
            log.warning("onboarding process %d did not stop; killing it", process.pid)
            process.kill()
        super().close(timeout)
        process = self._process  # one started while this stop began (the fork server's first start is slow)
        if process is not None and not wait([process.sentinel], STOP_GRACE_SECONDS):
            process.kill()


def _no_bundle():
    raise RuntimeError("each onboarding job's process loads its own copy of the base")
