"""The workload of ``test_serving_store.py::test_no_committed_voice_lost_over_20_kill_9_points``, run as a
script: ``python crash_workload.py VOICE_FOLDER WORKDIR SEED POINTS``.

This process imports the store once, then forks one worker per run (before any thread exists, so the
fork is safe). Each worker runs the same workload on its own store under ``WORKDIR``: two voices
committed first, then at once a tenant onboarding five voices through jobs, another tenant uploading
five voices directly, and a third thread deleting every other voice as it becomes ready. A journal
beside each store (``<store>.journal``) records what the store acknowledged (a call returned) and what
was asked of it. Every write step of the store (a file operation, a rename, a database transaction)
is counted, and the worker kills itself with SIGKILL at the step chosen for its run. A first run
without a kill counts the steps; the kill points are ``POINTS`` distinct steps drawn with ``SEED``.
Prints one JSON line per crash run: its store, the step and whether the worker died by SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from chorus.serving.store import VoiceStore

VOICES_PER_THREAD = 5


def workload(folder: str, root: str, kill_at: int) -> int:
    """Run the workload on a new store at ``root``; SIGKILL at write step ``kill_at`` (0: never).
    Returns the number of write steps taken."""
    store = VoiceStore(root)
    journal = os.open(f"{root}.journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def note(*words: str) -> None:
        os.write(journal, (" ".join(words) + "\n").encode())  # in the kernel at once: survives SIGKILL

    steps, lock = [0], threading.Lock()

    def counted(call: Callable) -> Callable:
        def step(*args, **kwargs):
            with lock:
                steps[0] += 1
                if steps[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)

        return step

    for name in ("makedirs", "put_file", "pipe_file", "mv", "rm", "rm_file"):
        setattr(store.fs, name, counted(getattr(store.fs, name)))
    os.replace = counted(os.replace)  # how a local store moves a voice into place
    # Every write transaction (exclusive); the heartbeat's is not a step of the workload.
    transaction, write = store.database.transaction, counted(store.database.transaction)
    store.database.transaction = lambda exclusive=True: write() if exclusive else transaction(exclusive)

    for i in range(2):
        store.put_voice("acme", f"keep{i}", folder)
        note("ready", "acme", f"keep{i}")
    ready: list[tuple[str, str]] = []
    uploads_done = threading.Event()

    def onboard_through_jobs() -> None:
        for i in range(VOICES_PER_THREAD):
            job = store.create_job("acme", f"a{i}")
            store.update_job(job, status="running", progress=0.5)
            store.put_voice("acme", f"a{i}", folder, job_id=job)
            note("ready", "acme", f"a{i}")
            ready.append(("acme", f"a{i}"))

    def upload_directly() -> None:
        for i in range(VOICES_PER_THREAD):
            store.put_voice("globex", f"g{i}", folder)
            note("ready", "globex", f"g{i}")
            ready.append(("globex", f"g{i}"))

    def delete_every_other() -> None:
        deleted = 0
        while deleted < VOICES_PER_THREAD:
            if 2 * deleted < len(ready):
                tenant, voice = ready[2 * deleted]
                note("deleting", tenant, voice)
                store.delete_voice(tenant, voice)
                note("deleted", tenant, voice)
                deleted += 1
            elif uploads_done.wait(0.001) and 2 * deleted >= len(ready):
                return

    writers = [threading.Thread(target=onboard_through_jobs), threading.Thread(target=upload_directly)]
    deleter = threading.Thread(target=delete_every_other)
    for thread in [*writers, deleter]:
        thread.start()
    for thread in writers:
        thread.join()
    uploads_done.set()
    deleter.join()
    store.close()
    return steps[0]


def in_worker(run: Callable[[], int]) -> tuple[int, int]:
    """``run()`` in a forked worker: (its wait status, the steps it reported, -1 if none)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.write(write_end, str(run()).encode())
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end) as reported:
        steps = reported.read()
    status = os.waitpid(pid, 0)[1]
    return status, int(steps) if steps else -1


def main() -> None:
    folder, workdir, seed, points = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    status, steps = in_worker(lambda: workload(folder, f"{workdir}/count", 0))
    if status != 0:
        sys.exit(f"the workload failed without a kill (wait status {status})")
    print(json.dumps({"steps": steps}), flush=True)
    for run, kill_at in enumerate(sorted(random.Random(seed).sample(range(1, steps + 1), points))):
        root = f"{workdir}/crash-{run:02d}"
        status, _ = in_worker(lambda: workload(folder, root, kill_at))  # noqa: B023 (runs at once)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(json.dumps({"root": root, "kill_at": kill_at, "killed": killed}), flush=True)


if __name__ == "__main__":
    main()
