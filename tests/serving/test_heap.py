"""Freed memory goes back to the OS after an onboarding job (chorus.serving.heap, the worker's use of it)."""

from __future__ import annotations

import sys
import threading
import weakref

import pytest

from chorus.serving import worker
from chorus.serving.heap import give_back_freed_memory
from chorus.serving.settings import ServerSettings
from chorus.serving.store import JobStatus, VoiceStore
from chorus.serving.worker import JobRunner, OnboardingJob


class FakeBase:
    """Stands for a job's copy of the base: only whether it is still alive matters here."""


def test_the_worker_gives_the_heap_back_once_a_jobs_copy_of_the_base_is_garbage(tmp_path, monkeypatch):
    copies: list[weakref.ref] = []
    trims: list[bool] = []  # per call: was the job's copy already freed?
    trimmed = threading.Event()

    def base_copy():
        copy = FakeBase()
        copies.append(weakref.ref(copy))
        return copy  # adapt fails on it: the job ends failed, its copy must go all the same

    def trim():
        trims.append(copies[-1]() is None)
        trimmed.set()
        return True

    monkeypatch.setattr(worker, "give_back_freed_memory", trim)
    store = VoiceStore(str(tmp_path / "store"))
    runner = JobRunner(store, tmp_path / "jobs", base_copy, ServerSettings().adapt, poll_seconds=None)
    job = OnboardingJob(store.create_job("default", "fiona", name="Fiona"), "default", "fiona", "Fiona")
    folder = runner.new_upload_dir()
    (folder / worker.DATA_DIR).mkdir()
    runner.start()
    try:
        runner.submit(folder, job, {"statement": "consented"})
        assert trimmed.wait(60)
        assert store.get_job("default", job.job_id).status == JobStatus.FAILED
    finally:
        runner.close()
        store.close()
    assert trims[0] is True  # called after the job, with its copy of the base already freed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_is_handed_back_on_glibc():
    assert give_back_freed_memory() is True
