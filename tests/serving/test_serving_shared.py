"""Two `chorus serve` processes on one shared store: PostgreSQL (a throwaway cluster) and S3 (moto's server),
as servers on two machines would share it. A voice onboarded through one is spoken by the other; one is
killed with SIGKILL while it trains a voice, the other finishes that job, and the restarted one sees the
same, consistent store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import requests

from conftest import clip_files, wait_for
from local_services import free_port

CONSENT = "Fiona Example consented in writing on 2024-05-01 to a synthetic voice made from these recordings."


class ServerProcess:
    """One `chorus serve` on the shared store, its output in a log file."""

    def __init__(self, tiny_base: Path, root: str, database: str, folder: Path, name: str):
        self.port = free_port()
        self.log_path = folder / f"{name}.log"
        command = [
            sys.executable,
            "-m",
            "chorus",
            "serve",
            "--store",
            root,
            "--database",
            database,
            "--cache-dir",
            str(folder / name / "cache"),  # and the jobs folder beside it: each "machine" its own disk
            "--port",
            str(self.port),
            "--model",
            str(tiny_base),
            "--vocoder",
            "griffin-lim",
            "--adapt-method",
            "lora",
            "--adapt-steps",
            "40",
        ]
        self.jobs_dir = folder / name / ".jobs"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder / name)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log()
            try:
                if requests.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.3)
        raise AssertionError(f"{name} did not start: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> dict:
        response = requests.get(f"{self.url}{path}", timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def speak(self, voice: str) -> requests.Response:
        return requests.post(
            f"{self.url}/v1/audio/speech",
            json={"model": "chorus", "input": "A voice from the other server.", "voice": voice},
            timeout=60,
        )

    def onboard(self, voice_name: str, data: Path) -> str:
        files, transcripts = clip_files(data)
        response = requests.post(
            f"{self.url}/v1/voices",
            files=files,
            data={"name": voice_name, "consent": CONSENT, "transcripts": transcripts},
            timeout=60,
        )
        assert response.status_code == 202, response.text + self.log()[-4000:]
        return response.json()["id"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def job_owner_pid(database: str, job_id: str) -> int | None:
    """The process that holds a job now (from the store's owners table), None if no live owner."""
    with psycopg.connect(database) as connection:
        row = connection.execute(
            "SELECT owners.pid FROM jobs JOIN owners ON owners.id = jobs.owner WHERE jobs.id = %s", (job_id,)
        ).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def shared_servers(tiny_base, s3_bucket, postgres_url, tmp_path):
    root = f"{s3_bucket}/voices"
    started: list[ServerProcess] = []

    def start(name: str) -> ServerProcess:
        (tmp_path / name).mkdir(exist_ok=True)
        server = ServerProcess(tiny_base, root, postgres_url, tmp_path, name)
        started.append(server)
        return server

    yield start, root, postgres_url
    for server in started:
        server.stop()


def test_two_servers_share_voices_and_finish_a_killed_servers_job(shared_servers, new_voice_data, tmp_path):
    start, root, database = shared_servers
    first, second = start("first"), start("second")

    # A voice onboarded through the first is listed ready and spoken by the second as soon as its job is
    # done: the store marks the voice ready and its job done in one transaction of the shared database.
    job = first.onboard("Fiona", new_voice_data)
    wait_for(lambda: first.get(f"/v1/jobs/{job}")["status"] in ("done", "failed"), 180, "fiona's job ends")
    assert first.get(f"/v1/jobs/{job}")["status"] == "done", first.get(f"/v1/jobs/{job}")
    assert second.get("/v1/voices/fiona")["status"] == "ready"
    spoken = second.speak("fiona")
    assert spoken.status_code == 200 and len(spoken.content) > 1000, spoken.text

    # The first is killed while it trains a second voice: the second server takes the job up and ends it.
    job = first.onboard("Gail", new_voice_data)
    wait_for(lambda: job_owner_pid(database, job) == first.process.pid, 60, "the first server runs gail's job")
    wait_for(lambda: first.get(f"/v1/jobs/{job}")["progress"] > 0.02, 60, "gail's job under way")
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    listed = second.get("/v1/voices/gail")
    assert listed["status"] in ("training", "failed"), listed  # never ready before its files are
    wait_for(lambda: second.get(f"/v1/jobs/{job}")["status"] in ("done", "failed"), 240, "gail's job ends", 0.3)
    assert second.get(f"/v1/jobs/{job}")["status"] == "done", second.get(f"/v1/jobs/{job}")
    assert f"onboarding job {job}" in second.log() and "taken from the shared queue" in second.log()
    assert second.speak("gail").status_code == 200

    # The first, started again, sees the same store: both voices ready, both speak, nothing half-written.
    again = start("first")
    mine = {v["id"]: v["status"] for v in again.get("/v1/voices")["data"] if "status" in v}
    theirs = {v["id"]: v["status"] for v in second.get("/v1/voices")["data"] if "status" in v}
    assert mine == theirs and {"fiona": "ready", "gail": "ready"}.items() <= mine.items()
    assert again.speak("gail").status_code == 200 and again.speak("fiona").status_code == 200
    verify = subprocess.run(
        [sys.executable, "-m", "chorus", "store", "verify", root, "--database", database],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert verify.returncode == 0 and "2 ready voice(s) checked" in verify.stdout, verify.stdout + verify.stderr
    import fsspec

    fs, prefix = fsspec.core.url_to_fs(root)
    leftovers = [path for path in fs.find(prefix) if "/.upload-" in path or "/.jobs/" in path]
    assert leftovers == []  # no upload half-way, no job's clips left behind ...
    for server in (again, second):  # ... in the store or on either machine
        assert [p.name for p in server.jobs_dir.iterdir() if p.name != "consent.jsonl"] == []
