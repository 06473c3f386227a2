"""Freed memory goes back to the OS after an onboarding job (chorus.serving.onboarding.heap, the worker's use of it):
measured as resident memory (RSS), which glibc keeps in its arenas without the trim. The trim is the worker
loop's, after every job, for both runners; with ``chorus serve``'s (``ProcessJobRunner``) a job's copy of the
base lives and dies in its own process (tests/serving/test_job_process.py), with ``create_app``'s default
(``JobRunner``, measured here) in a thread of the server.

Each measurement runs in a process of its own, a clean heap whose RSS only the measured work moves: in a long
test process a thread's arena may reuse memory freed by earlier tests, and nothing else there holds still."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chorus.serving.store import JobStatus

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, RSS from /proc")

MB = 1 << 20
# A job's copy of the base, at the scale the trim matters: ~190 MB in 64 KB blocks (under glibc's mmap
# threshold, so they live in a malloc arena, as a model's many small tensors do).
BLOCKS, BLOCK_FLOATS = 3000, 8192

# Both scripts start with this: RSS, and a job's copy of the base allocated in the calling thread (its malloc
# arena) with small things that outlive the job among them (``survivors``: log records, cache entries), as in
# a real job: without them glibc would give the arena's free top back by itself and there would be nothing to show.
PRELUDE = f"""
import json, sys, threading
from pathlib import Path
import numpy as np

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

def copy_of_a_base(survivors):
    blocks = []
    for k in range({BLOCKS}):
        blocks.append(np.ones({BLOCK_FLOATS}))
        if k % 50 == 49:
            survivors.append(np.ones(200))
    return blocks
"""

# The worker loop of create_app's runner, its trim watched; argv[1]: a scratch folder.
WORKER_JOB = (
    PRELUDE
    + """
import weakref
from chorus.serving.onboarding import job_runner
from chorus.serving.onboarding.job_runner import JobRunner, OnboardingJob
from chorus.serving.settings import ServerSettings
from chorus.serving.store import VoiceStore

copies, survivors, seen, trims = [], [], {}, []
trimmed = threading.Event()

class FakeBase:  # a job's copy of the base: its memory, and whether it is still alive
    def __init__(self):
        self.blocks = copy_of_a_base(survivors)

def base_copy():
    copy = FakeBase()
    copies.append(weakref.ref(copy))
    seen["job"] = rss()
    return copy  # adapt fails on it: the job ends failed, its copy must go all the same

give_back = job_runner.give_back_freed_memory

def trim():  # the worker's own call
    trims.append(copies[-1]() is None)
    given = give_back()
    seen["after"] = rss()
    trimmed.set()
    return given

job_runner.give_back_freed_memory = trim
scratch = Path(sys.argv[1])
store = VoiceStore(str(scratch / "store"))
runner = JobRunner(store, scratch / "jobs", base_copy, ServerSettings().adapt, poll_seconds=None)
job = OnboardingJob(store.create_job("default", "fiona", name="Fiona"), "default", "fiona", "Fiona")
folder = runner.new_upload_dir()
(folder / job_runner.DATA_DIR).mkdir()
seen["start"] = rss()
runner.start()
try:
    runner.submit(folder, job, {"statement": "consented"})
    seen["trimmed"] = trimmed.wait(60)
    seen["status"] = store.get_job("default", job.job_id).status.value
finally:
    runner.close()
    store.close()
seen["freed_before_trim"] = trims[0]
print(json.dumps(seen))
"""
)


def run_script(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@glibc
def test_the_worker_gives_the_heap_back_once_a_jobs_copy_of_the_base_is_garbage(tmp_path):
    seen = run_script(WORKER_JOB, str(tmp_path))
    assert seen["trimmed"] is True
    assert seen["status"] == JobStatus.FAILED.value
    assert seen["freed_before_trim"] is True  # called after the job, with its copy of the base already freed
    grown = seen["job"] - seen["start"]
    assert grown > BLOCKS * BLOCK_FLOATS * 8 * 3 / 4, f"the job's copy of the base took {grown / MB:.0f} MB"
    left = seen["after"] - seen["start"]
    assert left < grown / 4, f"{left / MB:.0f} MB of the job's {grown / MB:.0f} MB still resident after the job"


# A burst freed in a thread, then the trim alone.
BURST = (
    PRELUDE
    + """
from chorus.serving.onboarding.heap import give_back_freed_memory

survivors, seen = [], {"start": rss()}

def job():  # in a thread, as the worker trains: the thread's own arena
    blocks = copy_of_a_base(survivors)
    seen["peak"] = rss()
    del blocks

thread = threading.Thread(target=job)
thread.start()
thread.join()
seen["freed"] = rss()
seen["given"] = give_back_freed_memory()
seen["after"] = rss()
print(json.dumps(seen))
"""
)


@glibc
def test_freed_memory_is_handed_back_on_glibc():
    seen = run_script(BURST)
    burst = seen["peak"] - seen["start"]
    assert burst > 150 * MB, seen
    assert seen["freed"] - seen["start"] > burst * 3 / 4, seen  # freed, yet glibc kept it: what the trim is for
    assert seen["given"] is True
    assert seen["after"] - seen["start"] < burst / 4, seen  # back near the start
