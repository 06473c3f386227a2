"""Onboarding jobs in processes of their own (``chorus serve``'s worker): a job trains in its process and its
voice is stored; a killed process fails its job; the server's stop stops the process at its next step and
leaves the job to the next start; a server killed -9 takes its job's process with it."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chorus.adapters import parse_methods
from chorus.recipe import AdaptConfig
from chorus.serving.onboarding.job_process import PRELOAD, ProcessJobRunner
from chorus.serving.onboarding.job_runner import OnboardingJob
from chorus.serving.settings import ServeConfig, ServerSettings
from chorus.serving.store import JobStatus, VoiceStatus, VoiceStore
from conftest import wait_for

SHORT = AdaptConfig(methods=parse_methods("lora"), steps=4, threads=1, eval_every=2, max_frames=1500)
# Far more steps than a test waits for: only a kill or a stop ends it in time.
ENDLESS = AdaptConfig(methods=parse_methods("lora"), steps=100_000, threads=1, eval_every=50_000, patience=100)


@pytest.fixture
def serving(tiny_base, tmp_path, request):
    """(store, runner, submit) for a server on ``tmp_path`` whose jobs train with the recipe ``request.param``."""
    config = ServeConfig(
        store=str(tmp_path / "store"),
        base=tiny_base,
        settings=ServerSettings(adapt=request.param, progress_interval=0.0),
    )
    store = VoiceStore(config.store)
    runner = ProcessJobRunner(store, config)
    runner.start()

    def submit(voice_id: str, data) -> OnboardingJob:
        job = OnboardingJob(store.create_job("default", voice_id, name=voice_id), "default", voice_id, voice_id)
        upload = runner.new_upload_dir()
        shutil.copytree(data, upload / "voice")
        runner.submit(upload, job, {"statement": "consented in writing, for this test"})
        return job

    yield store, runner, submit
    runner.close()
    store.close()


def job_of(store: VoiceStore, job: OnboardingJob):
    return store.get_job(job.tenant, job.job_id)


@pytest.mark.parametrize("serving", [SHORT], indirect=True)
def test_a_job_trains_in_a_process_of_its_own_and_its_voice_is_stored(serving, new_voice_data):
    store, runner, submit = serving
    job = submit("fiona", new_voice_data)
    wait_for(lambda: job_of(store, job).status in (JobStatus.DONE, JobStatus.FAILED), 300, "the job ends")
    assert job_of(store, job).status == JobStatus.DONE, job_of(store, job).message
    # The server's own runner cannot load a base (its bundle factory raises): the job's process trained it.
    assert store.voice("default", "fiona").status == VoiceStatus.READY
    assert (store.get_voice("default", "fiona") / "voice_card.json").is_file()
    # Its files removed once it ended (by its process, just after it recorded the end).
    wait_for(lambda: not (runner.jobs_dir / job.job_id).exists(), 60, "the job's files are removed")


def wait_training(store: VoiceStore, runner: ProcessJobRunner, job: OnboardingJob) -> int:
    """The pid of ``job``'s process, once it trains."""
    wait_for(
        lambda: (
            (job_of(store, job).message or "").startswith("training: step")
            or job_of(store, job).status not in (JobStatus.QUEUED, JobStatus.RUNNING)
        ),
        300,
        "training starts",
    )
    assert job_of(store, job).status == JobStatus.RUNNING, job_of(store, job)
    process = runner._process
    assert process is not None and process.pid != os.getpid()
    return process.pid


@pytest.mark.parametrize("serving", [ENDLESS], indirect=True)
def test_a_job_whose_process_is_killed_fails_and_the_server_goes_on(serving, new_voice_data):
    store, runner, submit = serving
    job = submit("fiona", new_voice_data)
    os.kill(wait_training(store, runner, job), signal.SIGKILL)  # what the kernel's OOM killer does
    wait_for(lambda: job_of(store, job).status == JobStatus.FAILED, 60, "the job is failed")
    assert "killed by signal 9" in job_of(store, job).message
    assert store.voice("default", "fiona").status == VoiceStatus.FAILED
    # The worker takes the next job.
    second = submit("gina", new_voice_data)
    wait_training(store, runner, second)


@pytest.mark.parametrize("serving", [ENDLESS], indirect=True)
def test_a_jobs_process_trains_at_a_lower_priority_than_the_server(serving, new_voice_data):
    """Speech first: the job's process is niced by ServerSettings.job_niceness (the server is not)."""
    store, runner, submit = serving
    job = submit("fiona", new_voice_data)
    pid = wait_training(store, runner, job)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    # Every thread of it (torch's, Whisper's, the watchdog): on Linux a niceness is per thread.
    threads = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    assert len(threads) > 1
    assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {min(own + ServerSettings().job_niceness, 19)}
    assert ServerSettings().job_niceness > 0


def test_a_niceness_out_of_range_is_refused():
    with pytest.raises(ValueError, match="must be 0-19, got 20"):
        ServerSettings(job_niceness=20)


@pytest.mark.parametrize("serving", [ENDLESS], indirect=True)
def test_the_servers_stop_stops_the_jobs_process_and_leaves_the_job_to_the_next_start(
    serving, new_voice_data, tmp_path
):
    store, runner, submit = serving
    job = submit("fiona", new_voice_data)
    wait_training(store, runner, job)
    process = runner._process
    runner.close()
    assert process.exitcode == 0  # it stopped at its next step, not killed
    assert job_of(store, job).status == JobStatus.RUNNING  # held by its process's owner, now gone
    assert (runner.jobs_dir / job.job_id).is_dir()  # its files kept for the resume
    store.close()
    reopened = VoiceStore(str(tmp_path / "store"))
    try:
        reopened.recover()
        assert reopened.get_job("default", job.job_id).status == JobStatus.INTERRUPTED
    finally:
        reopened.close()


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "systemctl-stop"])
@pytest.mark.parametrize("serving", [ENDLESS], indirect=True)
def test_a_signal_to_all_the_servers_processes_leaves_the_job_to_the_servers_stop(serving, new_voice_data, sent):
    """Ctrl-C in a terminal and systemd's stop signal every process of the server: the fork server and the
    job's process as well. They leave it to the server's stop, which stops training at its next step and
    keeps the job for the next start. (The job's process had died of KeyboardInterrupt, or the fork server of
    SIGTERM, and the server had failed the job and deleted its clips.)"""
    store, runner, submit = serving
    job = submit("fiona", new_voice_data)
    pid = wait_training(store, runner, job)
    fork_server = multiprocessing.forkserver._forkserver._forkserver_pid
    for each in (fork_server, pid):
        os.kill(each, sent)
    step = job_of(store, job).message
    wait_for(lambda: job_of(store, job).message != step, 120, "training goes on")
    assert job_of(store, job).status == JobStatus.RUNNING and runner._process.exitcode is None
    os.kill(fork_server, 0)  # alive
    # ... and both signals ignored there before any job is forked, so a job never has Python's SIGINT handler
    ignored = int(Path(f"/proc/{fork_server}/status").read_text().split("SigIgn:")[1].split()[0], 16)
    assert ignored >> (signal.SIGINT - 1) & 1 and ignored >> (signal.SIGTERM - 1) & 1
    process = runner._process
    runner.close()  # what the server's stop does, once the signal reaches it
    assert process.exitcode == 0, process.exitcode  # stopped at its next step
    assert job_of(store, job).status == JobStatus.RUNNING and (runner.jobs_dir / job.job_id).is_dir()


def test_only_the_fork_server_imports_what_has_it_ignore_sigterm():
    source = Path(__file__).resolve().parents[2] / "src" / "chorus"
    importers = [
        path.relative_to(source).as_posix()
        for path in source.rglob("*.py")
        if "onboarding.fork_server" in path.read_text() or "import fork_server" in path.read_text()
    ]
    assert importers == ["serving/onboarding/job_process.py"]  # its PRELOAD, a list of names
    assert PRELOAD[0] == "chorus.serving.onboarding.fork_server"  # before any job is forked


def test_deleting_a_voice_stops_its_jobs_process_at_its_next_step(tiny_base, new_voice_data, tmp_path):
    """What the server's delete does (the store fails the job, the worker cancels it) stops the job's process
    at its next step: its progress is written once an hour here, so the store's state alone would not."""
    config = ServeConfig(
        store=str(tmp_path / "store"), base=tiny_base, settings=ServerSettings(adapt=ENDLESS, progress_interval=3600.0)
    )
    store = VoiceStore(config.store)
    runner = ProcessJobRunner(store, config)
    runner.start()
    try:
        job = OnboardingJob(store.create_job("default", "fiona", name="fiona"), "default", "fiona", "fiona")
        upload = runner.new_upload_dir()
        shutil.copytree(new_voice_data, upload / "voice")
        runner.submit(upload, job, {"statement": "consented in writing, for this test"})
        # Its first progress write (the clips checked): it trains from there on, in its process.
        process = wait_for(
            lambda: (job_of(store, job).message or "").startswith("preparing") and runner._process,
            300,
            "the job's process starts",
        )
        store.delete_voice("default", "fiona")
        runner.cancel(job.job_id)
        wait_for(lambda: runner.running is None, 120, "the job's process stops")
        assert process.exitcode == 0  # it stopped itself, not killed
        assert job_of(store, job).status == JobStatus.FAILED and job_of(store, job).message == "voice deleted"
        assert not store.list_voices("default")
        assert not (runner.jobs_dir / job.job_id).exists()  # its process removed its files
    finally:
        runner.close()
        store.close()


# A server that starts one endless job and prints its process's pid: killed -9 by the test below.
SERVER = """
import shutil, sys, time
from chorus.adapters import parse_methods
from chorus.recipe import AdaptConfig
from chorus.serving.onboarding.job_process import PRELOAD, ProcessJobRunner
from chorus.serving.settings import ServeConfig, ServerSettings
from chorus.serving.store import VoiceStore
from chorus.serving.onboarding.job_runner import OnboardingJob

root, base, data = sys.argv[1:4]
endless = AdaptConfig(methods=parse_methods("lora"), steps=100_000, threads=1, eval_every=50_000, patience=100)
config = ServeConfig(store=root, base=base, settings=ServerSettings(adapt=endless, progress_interval=0.0))
store = VoiceStore(root)
runner = ProcessJobRunner(store, config)
runner.start()
job = OnboardingJob(store.create_job("default", "fiona", name="fiona"), "default", "fiona", "fiona")
upload = runner.new_upload_dir()
shutil.copytree(data, upload / "voice")
runner.submit(upload, job, {"statement": "consented in writing, for this test"})
while runner._process is None:
    time.sleep(0.05)
print(runner._process.pid, job.job_id, flush=True)
time.sleep(3600)
"""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except OSError:
        return False


def test_a_job_process_dies_with_its_server(tiny_base, new_voice_data, tmp_path):
    """A server killed -9 mid-job leaves no orphan training on (with no other server on the store to take
    the job over, only the kernel can stop it); the next start finds the job interrupted."""
    root = str(tmp_path / "store")
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, root, str(tiny_base), str(new_voice_data)], stdout=subprocess.PIPE, text=True
    )
    try:
        pid, job_id = server.stdout.readline().split()
        pid = int(pid)
        with VoiceStore(root) as store:
            wait_for(
                lambda: (store.get_job("default", job_id).message or "").startswith("training: step"),
                300,
                "training starts",
            )
        assert running(pid)
        server.kill()
        wait_for(lambda: not running(pid), 30, "the job's process dies with its server")
    finally:
        server.kill()
        server.wait(30)
    with VoiceStore(root) as store:
        store.recover()
        assert store.get_job("default", job_id).status == JobStatus.INTERRUPTED


def test_a_job_another_server_took_costs_no_process(tiny_base, tmp_path, monkeypatch):
    """Two servers on one store: a job queued on this one but taken from the shared queue by the other's
    worker starts no process here (each would load a copy of the base only to find the job gone) and stays
    the other's."""
    config = ServeConfig(store=str(tmp_path / "store"), base=tiny_base, settings=ServerSettings(adapt=SHORT))
    here, there = VoiceStore(config.store), VoiceStore(config.store)
    runner = ProcessJobRunner(here, config)  # not started: the test hands it the job
    started = []
    # The context is multiprocessing's own (shared by every test): patched for this test only.
    monkeypatch.setattr(runner._context, "Process", lambda *args, **kwargs: started.append(kwargs))
    try:
        job = OnboardingJob(here.create_job("default", "fiona", name="fiona"), "default", "fiona", "fiona")
        assert there.claim_job(job.job_id) is not None
        runner.dispatch(job)
        assert started == []
        record = there.get_job("default", job.job_id)
        assert record.status == JobStatus.RUNNING
        assert there.claim_job(job.job_id) is not None  # still the other server's: its own claim is a no-op
    finally:
        here.close()
        there.close()


def test_a_job_cancelled_while_queued_no_longer_counts_as_waiting(tmp_path):
    """A tenant that uploaded and cancelled in a loop filled the server's queue (32 "waiting") for every tenant
    until the running job ended: a cancelled job is passed over when its turn comes, and not counted before."""
    from chorus.serving.onboarding.job_runner import JobRunner

    store = VoiceStore(str(tmp_path / "store"))
    runner = JobRunner(store, tmp_path / "jobs", bundle_factory=lambda: None, config=AdaptConfig())  # not started
    jobs = []
    for k in range(3):
        job = OnboardingJob(store.create_job("acme", f"v{k}"), "acme", f"v{k}", f"v{k}")
        upload = runner.new_upload_dir()
        (upload / "voice").mkdir()
        runner.submit(upload, job, {"statement": "consented in writing"})
        jobs.append(job)
    assert runner.queued == 3
    store.update_job(jobs[1].job_id, status=JobStatus.FAILED, message="cancelled by its tenant")
    runner.cancel(jobs[1].job_id)
    runner.cancel("job_not_here")  # another server's job: nothing to pass over here
    assert runner.queued == 2
    store.close()
