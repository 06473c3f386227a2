"""Voice store: round trips on local disk and an object store (fsspec memory://), checksums on every
load, pickle refusal, id validation, tenant isolation, jobs, and recovery after ``kill -9``."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import fsspec
import fsspec.implementations.memory
import pytest
import torch

from chorus.adapters import adapter_state_dict, add_adapter
from chorus.adapters.lora import LoraConfig
from chorus.adapters.voice import (
    WEIGHTS_FILE,
    VoiceCard,
    VoiceError,
    read_voice,
    save_voice,
)
from chorus.models.bundle import file_sha256
from chorus.serving.routes.custom_voices import audio_voice_json
from chorus.serving.store import (
    MARKER_FILE,
    ConsentInUse,
    ConsentNotFound,
    InvalidId,
    JobNotFound,
    JobStatus,
    JobTakenOver,
    QuotaReached,
    RecoveryReport,
    StoreUnavailable,
    VoiceConflict,
    VoiceCorrupted,
    VoiceNotFound,
    VoiceNotReady,
    VoiceStatus,
    VoiceStore,
    new_store,
)
from chorus.serving.store.metadata import SCHEMA_VERSION
from conftest import tiny_model


def make_voice_folder(folder: Path, seed: int = 0) -> Path:
    """A LoRA voice of random values drawn from ``seed``, saved in ``folder``."""
    model = tiny_model().eval()
    configs = [LoraConfig(r=2)]
    add_adapter(model, "ann", configs)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for value in adapter_state_dict(model, "ann").values():
            value.add_(torch.randn(value.shape, generator=generator) * 0.05)
    return save_voice(folder, model, "ann", configs, VoiceCard("ann", ["lora"], base_model_sha256="base"))


@pytest.fixture(scope="module")
def voice_folder(tmp_path_factory) -> Path:
    return make_voice_folder(tmp_path_factory.mktemp("voices") / "ann")


@pytest.fixture(params=["path", "file-url", "memory", "postgres-s3"])
def store(request, tmp_path):
    """A store on local disk (plain path or file:// URL), on fsspec's in-memory object store, or shared:
    PostgreSQL and S3 (moto's server), as servers on several machines use it."""
    if request.param == "memory":
        root = f"memory://chorus-test-{uuid.uuid4().hex}"
        store = VoiceStore(root, database=str(tmp_path / "store.sqlite3"))
    elif request.param == "postgres-s3":
        database = request.getfixturevalue("postgres_url")
        bucket = request.getfixturevalue("s3_bucket")
        store = VoiceStore(f"{bucket}/voices", database=database, cache_dir=str(tmp_path / "cache"))
    else:
        root = str(tmp_path / "root")
        store = VoiceStore(root if request.param == "path" else f"file://{root}")
    yield store
    store.close()
    if request.param == "memory":
        fsspec.filesystem("memory").rm(store.root, recursive=True)


def corrupt(store: VoiceStore, path: str) -> None:
    data = bytearray(store.fs.cat_file(path))
    data[-1] ^= 0xFF
    store.fs.pipe_file(path, bytes(data))


def test_round_trip(store, voice_folder):
    record = store.put_voice("acme", "ann", voice_folder, name="Ann")
    assert record.status == VoiceStatus.READY and record.method == "lora" and record.name == "Ann"
    assert record.sha256 == file_sha256(voice_folder / WEIGHTS_FILE)
    assert store.fs.exists(f"{store.root}/acme/ann/{MARKER_FILE}")
    assert record.blob_url == store.fs.unstrip_protocol(f"{store.root}/acme/ann")
    assert [v.voice_id for v in store.list_voices("acme")] == ["ann"]

    local = store.get_voice("acme", "ann")
    assert file_sha256(local / WEIGHTS_FILE) == record.sha256
    assert read_voice(local).methods == ["lora"]
    assert store.get_voice("acme", "ann") == local  # a second load (from the cache when remote)

    with pytest.raises(VoiceConflict):
        store.put_voice("acme", "ann", voice_folder)
    store.delete_voice("acme", "ann")
    assert store.list_voices("acme") == []
    assert not store.fs.exists(f"{store.root}/acme/ann")
    with pytest.raises(VoiceNotFound):
        store.get_voice("acme", "ann")
    with pytest.raises(VoiceNotFound):
        store.delete_voice("acme", "ann")
    assert store.put_voice("acme", "ann", voice_folder).status == VoiceStatus.READY  # the id is free again


def test_a_record_read_before_a_replacement_is_not_found_not_corrupt(store, voice_folder, tmp_path):
    """A request resolves its voice's record once; if the voice is replaced before the engine loads it,
    the store says so (VoiceNotFound) and leaves the new voice ready rather than failing it as corrupt."""
    old = store.put_voice("acme", "ann", voice_folder)
    assert file_sha256(store.voice_folder(old) / WEIGHTS_FILE) == old.sha256
    other = make_voice_folder(tmp_path / "ann-2", seed=1)
    store.delete_voice("acme", "ann")
    new = store.put_voice("acme", "ann", other)
    with pytest.raises(VoiceNotFound, match="replaced"):
        store.voice_folder(old)
    assert store.voice("acme", "ann").status == VoiceStatus.READY
    assert file_sha256(store.voice_folder(new) / WEIGHTS_FILE) == new.sha256 != old.sha256
    store.delete_voice("acme", "ann")
    with pytest.raises(VoiceNotFound):
        store.voice_folder(new)


def test_checksum_verified_on_every_load(store, voice_folder):
    expected = file_sha256(voice_folder / WEIGHTS_FILE)
    store.put_voice("acme", "ann", voice_folder)
    local = store.get_voice("acme", "ann")
    if not store.local:
        # A damaged download is fetched again; an intact one is served after its check, whatever
        # happened to the stored copy since.
        (local / WEIGHTS_FILE).write_bytes((local / WEIGHTS_FILE).read_bytes()[:-1])
        assert file_sha256(store.get_voice("acme", "ann") / WEIGHTS_FILE) == expected
        corrupt(store, f"{store.root}/acme/ann/{WEIGHTS_FILE}")
        assert file_sha256(store.get_voice("acme", "ann") / WEIGHTS_FILE) == expected
        (local / WEIGHTS_FILE).write_bytes(b"")
    else:
        corrupt(store, f"{store.root}/acme/ann/{WEIGHTS_FILE}")
    with pytest.raises(VoiceCorrupted, match="checksum mismatch"):
        store.get_voice("acme", "ann")
    (record,) = store.list_voices("acme")
    assert record.status == VoiceStatus.FAILED and "checksum" in record.error
    with pytest.raises(VoiceNotReady, match="failed"):
        store.get_voice("acme", "ann")
    assert store.put_voice("acme", "ann", voice_folder).status == VoiceStatus.READY  # a failed voice is replaced
    assert store.get_voice("acme", "ann").is_dir()


def test_refuses_pickles(store, voice_folder, tmp_path):
    folder = tmp_path / "with-pickle"
    shutil.copytree(voice_folder, folder)
    (folder / "adapter_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(VoiceError, match="pickle"):
        store.put_voice("acme", "ann", folder)
    assert store.list_voices("acme") == []
    # A pickle slipped into a stored voice afterwards: the voice is refused, not loaded.
    store.put_voice("acme", "ann", voice_folder)
    store.fs.pipe_file(f"{store.root}/acme/ann/model.pt", b"\x80\x04K\x01.")
    with pytest.raises(VoiceCorrupted, match="unexpected files"):
        store.get_voice("acme", "ann")


def test_refuses_symbolic_links(store, voice_folder, tmp_path):
    """A link was followed: the store kept the file it named (an operator's secrets), and the card route served
    it to the tenant."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root-only secret")
    folder = tmp_path / "with-link"
    shutil.copytree(voice_folder, folder)
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(secret)
    with pytest.raises(VoiceError, match=r"refusing symbolic links \['README.md'\]"):
        store.put_voice("acme", "ann", folder)
    assert store.list_voices("acme") == []


BAD_IDS = ["../x", "a/b", "A", "", "a" * 65, ".hidden", "a.b", "x\n", "-x", "a b", "é"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_id_validation(bad, voice_folder, tmp_path):
    with VoiceStore(str(tmp_path / "root")) as store:
        calls = [
            lambda: store.put_voice("acme", bad, voice_folder),
            lambda: store.put_voice(bad, "ann", voice_folder),
            lambda: store.get_voice("acme", bad),
            lambda: store.get_voice(bad, "ann"),
            lambda: store.delete_voice("acme", bad),
            lambda: store.list_voices(bad),
            lambda: store.create_job("acme", bad),
            lambda: store.create_job(bad, "ann"),
        ]
        for call in calls:
            with pytest.raises(InvalidId):
                call()
        assert all(p.name.startswith("store.sqlite3") for p in (tmp_path / "root").iterdir())  # nothing written


@pytest.mark.parametrize("good", ["a", "a" * 64, "0-voice_1"])
def test_valid_ids(good, tmp_path):
    with VoiceStore(str(tmp_path / "root")) as store:
        store.create_job(good, good)
        assert [v.voice_id for v in store.list_voices(good)] == [good]


def test_tenant_isolation(store, voice_folder):
    store.put_voice("tenant-a", "ann", voice_folder)
    job = store.create_job("tenant-a", "bob")
    with pytest.raises(VoiceNotFound) as other_tenant:
        store.get_voice("tenant-b", "ann")
    with pytest.raises(VoiceNotFound) as missing:
        store.get_voice("tenant-b", "nobody")
    assert str(other_tenant.value) == str(missing.value).replace("nobody", "ann")  # nothing tells them apart
    with pytest.raises(VoiceNotFound):
        store.delete_voice("tenant-b", "ann")
    with pytest.raises(JobNotFound):
        store.get_job("tenant-b", job)
    assert store.list_voices("tenant-b") == []
    # Tenant B may use the same id for a voice of its own.
    store.put_voice("tenant-b", "ann", voice_folder)
    store.delete_voice("tenant-b", "ann")
    assert store.get_voice("tenant-a", "ann").is_dir()
    assert {v.voice_id for v in store.list_voices("tenant-a")} == {"ann", "bob"}


def test_jobs_follow_their_voice(store, voice_folder):
    job = store.create_job("acme", "ann", method="lora")
    assert store.get_job("acme", job).status == JobStatus.QUEUED
    assert store.voice("acme", "ann").status == VoiceStatus.TRAINING
    with pytest.raises(VoiceNotReady, match="training"):
        store.get_voice("acme", "ann")
    with pytest.raises(VoiceConflict, match="being trained"):
        store.create_job("acme", "ann")
    with pytest.raises(VoiceConflict, match="being trained"):
        store.put_voice("acme", "ann", voice_folder)  # without the job that trains it
    store.update_job(job, status="running", progress=0.5, message="step 50")
    with pytest.raises(ValueError, match="progress"):
        store.update_job(job, progress=1.5)
    with pytest.raises(ValueError):
        store.update_job(job, status="sleeping")
    store.put_voice("acme", "ann", voice_folder, job_id=job)
    done = store.get_job("acme", job)
    assert done.status == JobStatus.DONE and done.progress == 1.0 and done.message == "step 50"
    with pytest.raises(ValueError, match="done already"):
        store.update_job(job, status="running")

    failing = store.create_job("acme", "bob")
    store.update_job(failing, status="failed", message="loss diverged")
    assert store.voice("acme", "bob").status == VoiceStatus.FAILED
    assert store.voice("acme", "bob").error == "loss diverged"

    deleted = store.create_job("acme", "cid")
    store.delete_voice("acme", "cid")
    assert store.get_job("acme", deleted).status == JobStatus.FAILED
    with pytest.raises(VoiceConflict, match="failed"):
        store.put_voice("acme", "cid", voice_folder, job_id=deleted)


def test_a_deleted_voice_is_not_brought_back_by_its_job(store, voice_folder, tmp_path):
    # A job interrupted (its server died), its voice then deleted: no worker takes the job up again.
    job = store.create_job("acme", "ann")
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "job.json").write_text("{}")
    store.publish_job_inputs(job, tmp_path / "inputs")  # any server's worker may take it
    store.update_job(job, status="interrupted", message="the server stopped")
    store.delete_voice("acme", "ann")
    assert (
        store.get_job("acme", job).status == JobStatus.FAILED and store.get_job("acme", job).message == "voice deleted"
    )
    assert store.claim_job(job) is None and store.claim_next_job() is None
    with pytest.raises(VoiceConflict):
        store.put_voice("acme", "ann", voice_folder, job_id=job)
    with pytest.raises(VoiceNotFound):
        store.voice("acme", "ann")

    # A job left running with its voice gone (as a server of an earlier version left one): its end is refused.
    running = store.create_job("acme", "bob")
    assert store.claim_job(running) is not None
    store.delete_voice("acme", "bob")
    with store.database.transaction() as db:
        db.execute("UPDATE jobs SET status=?, owner=? WHERE id=?", (JobStatus.RUNNING, store.owner, running))
    with pytest.raises(VoiceConflict, match="deleted or replaced"):
        store.put_voice("acme", "bob", voice_folder, job_id=running)
    with pytest.raises(VoiceNotFound):
        store.voice("acme", "bob")


def test_threads_share_one_store(tmp_path):
    with VoiceStore(str(tmp_path / "root")) as store:

        def work(i: int) -> None:
            job = store.create_job("acme", f"v{i}")
            for step in range(5):
                store.update_job(job, status="running", progress=step / 5)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(store.list_voices("acme")) == 8


# The child opens the store, starts a job, and dies by SIGKILL at the chosen point of ``put_voice``:
# "upload" after the first of the voice's files reached the temporary prefix, "commit" when the folder
# is in place but before its commit marker, "ready" after the marker but before SQLite says ready.
CHILD = """
import os, signal, sys
from chorus.serving.store import VoiceStore
root, db, folder, point = sys.argv[1:]
store = VoiceStore(root, database=db)
job = store.create_job("acme", "ann")
store.update_job(job, status="running", progress=0.9)
print(job, flush=True)
store.create_job("acme", "queued-voice")
put_file, pipe_file, calls = store.fs.put_file, store.fs.pipe_file, []
def dying_put_file(*args, **kwargs):
    calls.append(args)
    if point == "upload" and len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return put_file(*args, **kwargs)
def dying_pipe_file(*args, **kwargs):
    if point == "commit":
        os.kill(os.getpid(), signal.SIGKILL)
    pipe_file(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
store.fs.put_file, store.fs.pipe_file = dying_put_file, dying_pipe_file
store.put_voice("acme", "ann", folder, job_id=job)
"""


def killed_child(root: str, database: str, folder: Path, point: str) -> str:
    """Run :data:`CHILD` on the store until it kills itself at ``point``; the id of the job it was in."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD, root, database, str(folder), point],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    return child.stdout.strip()


@pytest.mark.parametrize("point", ["upload", "commit", "ready"])
def test_recovery_after_kill_9(point, voice_folder, tmp_path):
    root, db = tmp_path / "root", tmp_path / "store.sqlite3"
    job = killed_child(str(root), str(db), voice_folder, point)
    leftovers = [p.name for p in (root / "acme").iterdir()]
    assert any(name.startswith(".upload-") for name in leftovers) == (point == "upload")

    with VoiceStore(str(root), database=str(db)) as store:
        report = store.recover()
        assert not any(p.name.startswith(".") for p in (root / "acme").iterdir())
        voices = {v.voice_id: v for v in store.list_voices("acme")}
        assert voices["queued-voice"].status == VoiceStatus.FAILED  # never started, nothing committed
        if point == "ready":
            # The upload was committed: nothing is lost, the voice is served and its job is done.
            assert report.restored_voices == [("acme", "ann")]
            assert voices["ann"].status == VoiceStatus.READY and voices["ann"].base == "base"  # its card's, restored
            assert store.get_job("acme", job).status == JobStatus.DONE
            assert store.get_voice("acme", "ann").is_dir()
            assert [j.voice_id for j in store.interrupted_jobs()] == ["queued-voice"]
            return
        assert voices["ann"].status == VoiceStatus.FAILED and "interrupted" in voices["ann"].error
        assert not (root / "acme" / "ann").exists()  # no half-written voice left behind
        with pytest.raises(VoiceNotReady):
            store.get_voice("acme", "ann")
        assert store.get_job("acme", job).status == JobStatus.INTERRUPTED
        assert {j.voice_id for j in store.interrupted_jobs()} == {"ann", "queued-voice"}
        # Resuming the interrupted job finishes the voice.
        store.update_job(job, status="running")
        assert store.voice("acme", "ann").status == VoiceStatus.TRAINING
        store.put_voice("acme", "ann", voice_folder, job_id=job)
        assert store.get_voice("acme", "ann").is_dir()
        assert store.recover().failed_voices == []


def test_no_committed_voice_lost_over_20_kill_9_points(voice_folder, tmp_path):
    """Onboarding, deletion and concurrent writes killed at 20 random write steps (see crash_workload.py);
    after each, a restart: every acknowledged voice is there and whole, every acknowledged deletion
    holds, and nothing half-written is listed as ready."""
    script = Path(__file__).with_name("crash_workload.py")
    ran = subprocess.run(
        [sys.executable, str(script), str(voice_folder), str(tmp_path), "16", "20"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    runs = lines[1:]
    assert len(runs) == 20 and all(run["killed"] for run in runs), (ran.stdout, ran.stderr)
    for run in runs:
        root = Path(run["root"])
        journal = [line.split() for line in Path(f"{root}.journal").read_text().splitlines()]
        acknowledged = {(t, v) for what, t, v in journal if what == "ready"}
        asked_to_delete = {(t, v) for what, t, v in journal if what == "deleting"}
        deleted = {(t, v) for what, t, v in journal if what == "deleted"}
        with VoiceStore(str(root)) as store:
            store.recover()
            listed = {(t, v.voice_id): v for t in ("acme", "globex") for v in store.list_voices(t)}
            where = f"killed at step {run['kill_at']}"
            for key in acknowledged - asked_to_delete:
                assert listed[key].status == VoiceStatus.READY, (where, key, listed.get(key))
            assert not deleted & set(listed), where
            for key, voice in listed.items():
                if voice.status == VoiceStatus.READY:  # whole: the checksums hold and it loads
                    read_voice(store.get_voice(*key))
            report = store.verify()
            assert report.ok and not report.orphan_folders, (where, report)
            assert not [p for p in root.glob("*/.*")], where  # no upload left half-way
            for tenant, voice_id in acknowledged - asked_to_delete:  # a voice's job ended with it
                job_id = listed[tenant, voice_id].job_id
                assert job_id is None or store.get_job(tenant, job_id).status == JobStatus.DONE, where


def test_recover_fails_a_ready_voice_without_marker_and_finishes_deletes(tmp_path, voice_folder):
    with VoiceStore(str(tmp_path / "root")) as store:
        store.put_voice("acme", "ann", voice_folder)
        store.put_voice("acme", "bob", voice_folder)
        store.fs.rm(f"{store.root}/acme/ann/{MARKER_FILE}")
        # A deletion cut short: the row says deleted, the files are still there.
        with sqlite3.connect(tmp_path / "root" / "store.sqlite3") as db:
            db.execute("UPDATE voices SET status='deleted' WHERE id='bob'")
        report = store.recover()
        assert report.failed_voices == [("acme", "ann")] and report.finished_deletes == [("acme", "bob")]
        assert [(v.voice_id, v.status) for v in store.list_voices("acme")] == [("ann", VoiceStatus.FAILED)]
        assert not (tmp_path / "root" / "acme" / "bob").exists()


def test_remote_root_needs_a_database(tmp_path, voice_folder):
    with pytest.raises(ValueError, match="needs a database"):
        VoiceStore("memory://chorus-test-no-db")
    # A SQLite database may also be named by URL, as SQLAlchemy and friends write it.
    with VoiceStore(f"memory://chorus-test-{uuid.uuid4().hex}", f"sqlite:///{tmp_path / 'meta.db'}") as store:
        store.put_voice("acme", "ann", voice_folder)
        assert store.database_url == str(tmp_path / "meta.db") and store.cache_dir == tmp_path / "voice-cache"
    with sqlite3.connect(tmp_path / "meta.db") as db:
        assert db.execute("SELECT id FROM voices").fetchall() == [("ann",)]
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5  # the migrations, versioned


def test_a_version_1_database_is_migrated_in_place(tmp_path, voice_folder):
    """A store written by the previous schema (before several servers: no owners) opens, migrates and
    keeps its voices."""
    root = tmp_path / "root"
    with VoiceStore(str(root)) as store:
        store.put_voice("acme", "ann", voice_folder)
    with sqlite3.connect(root / "store.sqlite3") as db:  # back to version 1, as an older Chorus left it
        db.execute("DROP TABLE owners")
        db.execute("DROP TABLE consents")
        for column in ("owner", "consent_id", "instant", "base"):
            db.execute(f"ALTER TABLE voices DROP COLUMN {column}")
        for column in ("owner", "inputs"):
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 1")
    with VoiceStore(str(root)) as store:
        assert store.voice("acme", "ann").status == VoiceStatus.READY and store.recover().failed_voices == []
        assert read_voice(store.get_voice("acme", "ann"))
        assert store.voice("acme", "ann").consent_id is None and store.list_consents("acme") == []
        # A voice committed before the store recorded bases has none: every server lists it, as before.
        assert store.voice("acme", "ann").base is None and store.voice("acme", "ann").made_on("any base")


def test_close_checkpoints_the_log_into_the_database_file(tmp_path, voice_folder):
    store = VoiceStore(str(tmp_path / "root"))
    store.put_voice("acme", "ann", voice_folder)
    job_id = store.create_job("acme", "bob", name="Bob")
    store.close()
    store.close()  # a second close is harmless
    (tmp_path / "backup").mkdir()
    shutil.copy(tmp_path / "root" / "store.sqlite3", tmp_path / "backup" / "store.sqlite3")  # no -wal, no -shm
    db = sqlite3.connect(tmp_path / "backup" / "store.sqlite3")
    try:
        assert sorted(row[0] for row in db.execute("SELECT id FROM voices")) == ["ann", "bob"]
        assert [row[0] for row in db.execute("SELECT id FROM jobs")] == [job_id]
    finally:
        db.close()


class FullMemoryFileSystem(fsspec.implementations.memory.MemoryFileSystem):
    """An object store that has run out of space: every write fails as a full disk does."""

    protocol = "fullmem"

    def pipe_file(self, path, value, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", path)


def test_a_store_that_cannot_be_written_is_one_clear_error_at_start_up(tmp_path):
    fsspec.register_implementation("fullmem", FullMemoryFileSystem, clobber=True)
    with pytest.raises(StoreUnavailable, match=r"fullmem://voices: .*cannot be opened for writing .*No space left"):
        VoiceStore("fullmem://voices", database=str(tmp_path / "store.sqlite3"))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(StoreUnavailable, match="cannot be opened for writing"):
        VoiceStore(str(blocked / "store"))
    # `chorus serve` says it in one line, with no traceback.
    from typer.testing import CliRunner

    from chorus.cli import app

    result = CliRunner().invoke(app, ["serve", "--store", str(blocked / "store")])
    assert result.exit_code == 2, result.output  # the CLI's exit status for bad input
    message = " ".join(result.output.split())
    assert "cannot be opened for writing" in message and "Traceback" not in result.output


def test_verify_finds_corrupt_voices_and_orphan_folders(store, voice_folder):
    store.put_voice("acme", "ann", voice_folder)
    store.put_voice("acme", "bob", voice_folder)
    store.put_voice("globex", "cat", voice_folder)
    assert store.verify().checked == 3 and store.verify().ok
    corrupt(store, f"{store.root}/acme/bob/adapter_model.safetensors")
    store.fs.makedirs(f"{store.root}/acme/ghost", exist_ok=True)
    store.fs.pipe_file(f"{store.root}/acme/ghost/adapter_model.safetensors", b"left by a crash or a copy")
    report = store.verify()
    assert report.checked == 3 and not report.ok
    assert report.corrupt == [("acme", "bob", "files differ from their marker: adapter_model.safetensors")]
    assert len(report.orphan_folders) == 1 and report.orphan_folders[0].endswith("/acme/ghost")
    assert store.recover().orphan_folders == report.orphan_folders  # start-up reports them, keeps them
    assert store.fs.exists(f"{store.root}/acme/ghost/adapter_model.safetensors")


def test_store_verify_command(tmp_path, voice_folder):
    from typer.testing import CliRunner

    from chorus.cli import app

    root = tmp_path / "store"
    with VoiceStore(str(root)) as store:
        store.put_voice("acme", "ann", voice_folder)
    clean = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert clean.exit_code == 0 and "1 ready voice(s) checked" in clean.output and "no corrupt voice" in clean.output
    (root / "acme" / "ghost").mkdir()
    (root / "acme" / "ghost" / "README.md").write_text("orphan")
    found = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert found.exit_code == 1 and "orphan folder" in found.output and "ghost" in found.output


@pytest.mark.parametrize("command", [["verify"], ["repair"], ["backup", "{typo}-copy"], ["migrate"]])
def test_a_mistyped_store_is_refused_not_made(tmp_path, command):
    """An operator's probe: verify and backup of a mistyped path had made a new, empty store there and said
    '0 ready voice(s) checked' / '0 voice(s) copied', exit 0."""
    from typer.testing import CliRunner

    from chorus.cli import app

    typo = tmp_path / "stroe1"
    if command == ["migrate"]:
        args = ["store", "migrate", "--from", str(typo), "--to", str(tmp_path / "target")]
    else:
        args = ["store", command[0], str(typo), *(part.format(typo=typo) for part in command[1:])]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "no voice store there" in result.output, result.output
    assert "store.sqlite3 does not exist" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing made: not the store, the copy nor the target
    assert new_store(str(typo)) == str(typo / "store.sqlite3")
    with VoiceStore(str(typo)):
        pass
    assert new_store(str(typo)) is None
    assert new_store(str(typo), "postgresql://user@host/db") is None  # not told from here
    unreadable = CliRunner().invoke(app, ["store", "verify", "foo://x"])
    assert unreadable.exit_code == 2 and "error:" in unreadable.output and "Traceback" not in unreadable.output


def test_store_add_command_puts_a_voice_made_offline(tmp_path, voice_folder):
    from typer.testing import CliRunner

    from chorus.cli import app

    root = tmp_path / "store"
    added = CliRunner().invoke(app, ["store", "add", str(root), "acme", "ann", str(voice_folder)])
    assert added.exit_code == 0 and "acme/ann: ready" in added.output, added.output
    with VoiceStore(str(root)) as store:
        assert store.voice("acme", "ann").status == VoiceStatus.READY
    broken = CliRunner().invoke(app, ["store", "add", str(root), "acme", "bob", str(tmp_path)])
    assert broken.exit_code == 2 and "not a voice folder" in broken.output
    # The same id again: one line saying how to go on (it was a 60-line traceback ending in VoiceConflict).
    again = CliRunner().invoke(app, ["store", "add", str(root), "acme", "ann", str(voice_folder)])
    message = " ".join(again.output.split())
    assert again.exit_code == 2 and "Traceback" not in again.output, again.output
    assert "voice 'ann' exists already" in message and "chorus voices delete ann" in message
    # A base speaker's name: a server speaks the speaker for it, so the voice was never heard nor deletable.
    speaker = CliRunner().invoke(app, ["store", "add", str(root), "acme", "flite-rms", str(voice_folder)])
    message = " ".join(speaker.output.split())
    assert speaker.exit_code == 2 and "'flite-rms' is a speaker of the base the voice was made on" in message
    with VoiceStore(str(root)) as store:
        assert [record.voice_id for record in store.list_voices("acme")] == ["ann"]


def test_store_add_many_adds_a_folder_of_voices_in_one_process_and_names_what_it_could_not(tmp_path, voice_folder):
    """Hundreds of voices through `chorus store add` cost 6-10 s each, almost all of it start-up (a probe)."""
    from typer.testing import CliRunner

    from chorus.cli import app

    voices = tmp_path / "voices"
    for name in ("ann", "bob", "flite-rms", "Not-An-Id"):
        shutil.copytree(voice_folder, voices / name)
    (voices / "notes").mkdir()  # no voice folder: not counted
    root = tmp_path / "store"
    added = CliRunner().invoke(app, ["store", "add-many", str(root), "acme", str(voices)])
    said = " ".join(added.output.split())
    assert added.exit_code == 1, added.output
    assert "2 of 4 voice(s) ready for acme" in said
    assert "not added: flite-rms: 'flite-rms' is a speaker of the base" in said
    assert "not added: Not-An-Id: invalid voice id 'Not-An-Id'" in said
    with VoiceStore(str(root)) as store:
        assert sorted(record.voice_id for record in store.list_voices("acme")) == ["ann", "bob"]
    again = CliRunner().invoke(app, ["store", "add-many", str(root), "acme", str(voices)])  # none added twice
    assert again.exit_code == 1 and "0 of 4 voice(s) ready" in " ".join(again.output.split())


def test_backup_while_writing_is_a_consistent_store(store, voice_folder, tmp_path):
    for name in ("ann", "bob"):
        store.put_voice("acme", name, voice_folder)
    writer_done = threading.Event()

    def keep_writing():
        for k in range(6):
            store.put_voice("globex", f"v{k}", voice_folder)
        store.delete_voice("acme", "bob")
        writer_done.set()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    copied, gone = store.backup(tmp_path / "backup")
    writer.join(60)
    assert writer_done.is_set() and copied >= 2 - len(gone)
    with VoiceStore(str(tmp_path / "backup")) as restored:
        report = restored.verify()
        assert report.ok and report.checked == copied, report  # every listed voice is whole, nothing extra
        assert (restored.get_voice("acme", "ann") / "adapter_model.safetensors").is_file()
        # Its records name its own folders, not the source's (an operator's probe)
        urls = [v.blob_url for v in restored.all_voices()]
        assert urls and all(
            url == f"file://{tmp_path / 'backup' / v.tenant / v.voice_id}"
            for url, v in zip(urls, restored.all_voices())
        )
    with pytest.raises(ValueError, match="must be new or empty"):
        store.backup(tmp_path / "backup")
    # The command line does the same.
    if store.local:
        from typer.testing import CliRunner

        from chorus.cli import app

        result = CliRunner().invoke(app, ["store", "backup", store.root, str(tmp_path / "second")])
        assert result.exit_code == 0 and "voice(s) copied" in result.output, result.output


def test_a_voice_failed_for_changed_files_is_listed_and_made_ready_once_they_are_whole(store, voice_folder):
    """An operator's probe: a voice a server had marked failed (a checksum mismatch) dropped out of verify, and
    copying its good files back left it failed for good."""
    store.put_voice("acme", "bob", voice_folder, name="Bob")
    weights = f"{store.root}/acme/bob/adapter_model.safetensors"
    good = store.fs.cat_file(weights)
    corrupt(store, weights)
    with pytest.raises(VoiceCorrupted):
        store.get_voice("acme", "bob")  # what a speech request does: the voice is marked failed
    assert store.voice("acme", "bob").status == VoiceStatus.FAILED
    assert store.verify().restorable == [] and store.repair().restored == []  # still changed: left failed
    store.fs.pipe_file(weights, good)  # the operator puts the good file back
    (listed,) = store.verify().restorable
    assert listed[:2] == ("acme", "bob") and "checksum mismatch" in listed[2] and not store.verify().ok
    assert store.repair().restored == [("acme", "bob")]
    assert store.voice("acme", "bob").status == VoiceStatus.READY and store.verify().ok
    assert (store.get_voice("acme", "bob") / "adapter_model.safetensors").is_file()


def test_repair_adopts_whole_orphans_and_quarantines_the_rest(store, voice_folder):
    store.put_voice("acme", "ann", voice_folder, name="Ann")
    # A whole voice folder no record lists (a restored copy, a lost database row) and a broken one.
    store.fs.copy(f"{store.root}/acme/ann", f"{store.root}/acme/twin", recursive=True)
    store.fs.makedirs(f"{store.root}/globex/junk", exist_ok=True)
    store.fs.pipe_file(f"{store.root}/globex/junk/adapter_model.safetensors", b"half a file")
    assert len(store.verify().orphan_folders) == 2
    report = store.repair()
    assert report.adopted == [("acme", "twin")]
    assert len(report.quarantined) == 1 and "/.quarantine/globex/junk-" in report.quarantined[0]
    assert store.voice("acme", "twin").status == VoiceStatus.READY and store.voice("acme", "twin").base == "base"
    assert (store.get_voice("acme", "twin") / "adapter_model.safetensors").is_file()
    after = store.verify()
    assert after.ok and after.checked == 2  # nothing orphaned left, and nothing deleted:
    assert store.fs.exists(report.quarantined[0] + "/adapter_model.safetensors")
    assert store.repair().adopted == [] and store.repair().quarantined == []


def test_store_repair_command(tmp_path, voice_folder):
    from typer.testing import CliRunner

    from chorus.cli import app

    root = tmp_path / "store"
    with VoiceStore(str(root)) as store:
        store.put_voice("acme", "ann", voice_folder)
    (root / "acme" / "junk").mkdir()
    (root / "acme" / "junk" / "README.md").write_text("no marker")
    # An operator's probe: repair ran beside a live server, whose upload in flight is a folder no record lists
    with VoiceStore(str(root)):  # a server's store, alive (its heartbeat, its process)
        refused = CliRunner().invoke(app, ["store", "repair", str(root)], env={"COLUMNS": "300"})
        assert refused.exit_code == 2 and "1 process(es) use this store now" in refused.output, refused.output
        assert "stop the server first, or pass --force" in refused.output
        assert (root / "acme" / "junk").is_dir()  # nothing moved
        forced = CliRunner().invoke(app, ["store", "repair", str(root), "--force"])
        assert forced.exit_code == 0 and "quarantined" in forced.output, forced.output
    (root / "acme" / "junk").mkdir()
    (root / "acme" / "junk" / "README.md").write_text("no marker")
    result = CliRunner().invoke(app, ["store", "repair", str(root)])  # the server stopped
    assert result.exit_code == 0 and "quarantined" in result.output, result.output
    assert (root / ".quarantine" / "acme").is_dir() and not (root / "acme" / "junk").exists()
    assert "nothing to repair" in CliRunner().invoke(app, ["store", "repair", str(root)]).output


@pytest.fixture
def shared_root(s3_bucket, postgres_url) -> tuple[str, str]:
    """(voice root, database) of a shared store: S3 (moto's server) and PostgreSQL."""
    return f"{s3_bucket}/voices", postgres_url


@pytest.mark.parametrize("point", ["upload", "commit", "ready"])
def test_a_live_server_reclaims_the_work_of_one_killed_on_a_shared_store(point, voice_folder, shared_root, tmp_path):
    """Two processes on PostgreSQL + S3; one is killed (SIGKILL) in the middle of putting a voice. The
    live one finds it dead and finishes or undoes its work while it keeps serving: nothing half-written
    is listed, a committed upload is kept, the jobs are interrupted (for any worker to take)."""
    root, database = shared_root
    with VoiceStore(root, database=database, cache_dir=str(tmp_path / "live")) as live:
        live.put_voice("globex", "kept", voice_folder)
        job = killed_child(root, database, voice_folder, point)
        report = live.reclaim()
        voices = {v.voice_id: v for v in live.list_voices("acme")}
        assert not live.fs.glob(f"{live.root}/acme/.upload-*")  # no upload left half-way
        assert voices["queued-voice"].status == VoiceStatus.FAILED
        if point == "ready":
            assert report.restored_voices == [("acme", "ann")]
            assert voices["ann"].status == VoiceStatus.READY and live.get_job("acme", job).status == JobStatus.DONE
            assert voices["ann"].base == "base"  # the card's: a voice of another base stays off this base's list
            read_voice(live.get_voice("acme", "ann"))
        else:
            assert voices["ann"].status == VoiceStatus.FAILED and "interrupted" in voices["ann"].error
            assert not live.fs.exists(f"{live.root}/acme/ann")
            assert live.get_job("acme", job).status == JobStatus.INTERRUPTED
        interrupted = {"queued-voice"} if point == "ready" else {"queued-voice", "ann"}
        assert {j.voice_id for j in live.interrupted_jobs()} == interrupted
        assert live.reclaim() == RecoveryReport()  # the dead owner is forgotten once its work is done
        assert live.voice("globex", "kept").status == VoiceStatus.READY and live.verify().ok


def test_each_job_is_claimed_by_exactly_one_worker_across_servers(shared_root, tmp_path):
    """Two stores (two servers) on one PostgreSQL database, three threads each, claiming the same 24
    published jobs at once: each job is taken exactly once (claims are exclusive write transactions), and its clips
    reach whichever worker took it."""
    root, database = shared_root
    inputs = tmp_path / "inputs"
    (inputs / "voice").mkdir(parents=True)
    (inputs / "voice" / "metadata.csv").write_text("a|Hello.\n")
    with (
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "a")) as a,
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "b")) as b,
    ):
        jobs = [a.create_job("acme", f"v{k}") for k in range(24)]
        for job in jobs:
            a.publish_job_inputs(job, inputs)
        claims: list[tuple[str, str]] = []
        lock = threading.Lock()

        def worker(store: VoiceStore) -> None:
            while (job := store.claim_next_job()) is not None:
                with lock:
                    claims.append((job.job_id, store.owner))

        threads = [threading.Thread(target=worker, args=(store,)) for store in (a, b) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(job for job, _ in claims) == sorted(jobs)  # each once, none lost
        assert {owner for _, owner in claims} <= {a.owner, b.owner}
        job, owner = claims[0]
        taker = a if owner == a.owner else b
        assert taker.get_job("acme", job).status == JobStatus.RUNNING
        assert taker.claim_job(job) is not None  # taking it again is a no-op for its worker ...
        assert (b if taker is a else a).claim_job(job) is None  # ... and refused to the other
        assert taker.fetch_job_inputs(job, tmp_path / "fetched")
        assert (tmp_path / "fetched" / "voice" / "metadata.csv").read_text() == "a|Hello.\n"


def test_store_migrate_to_a_shared_store_and_back(voice_folder, shared_root, tmp_path):
    """`chorus store migrate` copies a single-machine store into PostgreSQL + S3 and back, checksums
    checked; a voice whose files no longer match is left out and the command exits 1."""
    from typer.testing import CliRunner

    from chorus.cli import app

    root, database = shared_root
    with VoiceStore(str(tmp_path / "single")) as single:
        for tenant, voice_id in [("acme", "ann"), ("acme", "bob"), ("globex", "ann")]:
            single.put_voice(tenant, voice_id, voice_folder, name=f"{voice_id} of {tenant}")
        single.create_job("acme", "training")
        records = {(v.tenant, v.voice_id): v for v in single.all_voices() if v.status == VoiceStatus.READY}
    runner = CliRunner()
    there = runner.invoke(
        app, ["store", "migrate", "--from", str(tmp_path / "single"), "--to", root, "--to-database", database]
    )
    assert there.exit_code == 1, there.output  # the training voice was not copied, and it says so
    assert "3 voice(s) copied" in there.output and "skipped acme/training: training, not ready" in there.output
    back = runner.invoke(
        app, ["store", "migrate", "--from", root, "--from-database", database, "--to", str(tmp_path / "back")]
    )
    assert back.exit_code == 0 and "3 voice(s) copied" in back.output, back.output
    with VoiceStore(str(tmp_path / "back")) as copy:
        for key, record in records.items():
            copied = copy.voice(*key)
            assert (copied.sha256, copied.size_bytes, copied.name, copied.created) == (
                record.sha256,
                record.size_bytes,
                record.name,
                record.created,
            )
    again = runner.invoke(
        app, ["store", "migrate", "--from", root, "--from-database", database, "--to", str(tmp_path / "back")]
    )
    assert again.exit_code == 0 and "0 voice(s) copied" in again.output and "in the target already" in again.output
    with VoiceStore(root, database=database, cache_dir=str(tmp_path / "cache")) as shared:
        corrupt(shared, f"{shared.root}/acme/bob/adapter_model.safetensors")
    broken = runner.invoke(
        app, ["store", "migrate", "--from", root, "--from-database", database, "--to", str(tmp_path / "third")]
    )
    assert broken.exit_code == 1 and "left out acme/bob" in broken.output and "2 voice(s) copied" in broken.output


def test_a_tenants_limits_hold_across_servers_that_create_jobs_at_once(shared_root, tmp_path):
    """Two stores (two servers) creating jobs for one tenant at once, each told the same limit of 3
    active jobs: the count is taken in the job's own transaction, so together they create 3, not 3 each."""
    root, database = shared_root
    with (
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "a")) as a,
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "b")) as b,
    ):
        created, refused = [], []
        barrier = threading.Barrier(8)

        def onboard(store: VoiceStore, k: int) -> None:
            barrier.wait()
            try:
                created.append(store.create_job("acme", f"v{k}", max_active_jobs=3))
            except QuotaReached as error:
                refused.append(str(error))

        threads = [threading.Thread(target=onboard, args=(store, k)) for k, store in enumerate([a, b] * 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(created) == 3 and len(refused) == 5 and a.active_jobs("acme") == 3
        assert all("at most 3" in message for message in refused)
        with pytest.raises(QuotaReached, match="you keep 3 voices"):
            b.create_job("acme", "another", max_voices=3)


def test_a_worker_found_dead_can_no_longer_touch_the_job_another_took(voice_folder, shared_root, tmp_path):
    """Store ``a`` holds a job, stops beating (a long pause) and is found dead by ``b``, which takes the job
    over. ``a``'s late writes are refused (its progress, its failing the job, its upload of the voice);
    its own next heartbeat registers it again. A store that opened after another began its recovery is
    never taken for dead by it."""
    root, database = shared_root
    with (
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "a"), lease_seconds=60) as a,
        VoiceStore(root, database=database, cache_dir=str(tmp_path / "b"), lease_seconds=60) as b,
    ):
        job = a.create_job("acme", "ann")
        assert a.claim_job(job).status == JobStatus.RUNNING
        with b.database.transaction() as db:  # a's last heartbeat, long ago
            db.execute("UPDATE owners SET heartbeat=0 WHERE id=?", (a.owner,))
        assert b.reclaim().interrupted_jobs == [job]
        assert b.claim_job(job) is not None
        with pytest.raises(JobTakenOver):
            a.update_job(job, progress=0.5, as_worker=True)
        with pytest.raises(JobTakenOver):
            a.update_job(job, status="failed", message="a's training broke", as_worker=True)
        with pytest.raises(VoiceConflict, match="held by another worker"):
            a.put_voice("acme", "ann", voice_folder, job_id=job)
        assert b.get_job("acme", job).status == JobStatus.RUNNING and b.voice("acme", "ann").status == "training"
        b.put_voice("acme", "ann", voice_folder, job_id=job)
        assert b.get_job("acme", job).status == JobStatus.DONE
        a.heartbeat()  # its row is gone: it registers again, alive to everyone
        assert b.is_alive(a.owner)

        # b begins a recovery (it has found who is dead); c opens and queues a job before b's first write.
        with contextlib.ExitStack() as newcomers:
            transaction, fresh = b.database.transaction, []

            def newcomer_opens_first(exclusive=True):
                if exclusive and not fresh:
                    newcomer = newcomers.enter_context(
                        VoiceStore(root, database=database, cache_dir=str(tmp_path / "c"))
                    )
                    fresh.append((newcomer, newcomer.create_job("acme", "bob")))
                return transaction(exclusive)

            b.database.transaction = newcomer_opens_first
            try:
                report = b.recover()
            finally:
                del b.database.transaction
            newcomer, job = fresh[0]
            assert report.interrupted_jobs == [] and newcomer.get_job("acme", job).status == JobStatus.QUEUED


def test_an_unreachable_database_is_one_clear_error_without_its_password(tmp_path):
    from local_services import free_port

    url = f"postgresql://chorus:hunter2@127.0.0.1:{free_port()}/voices"
    with pytest.raises(StoreUnavailable, match="Connection refused") as refused:
        VoiceStore(str(tmp_path / "root"), database=url)
    assert "hunter2" not in str(refused.value) and "chorus:***@127.0.0.1" in str(refused.value)


def test_a_delete_the_store_refuses_to_finish_is_done_for_the_tenant_and_finished_later(store, voice_folder):
    """Files the store will not remove now (read-only, full): the voice is deleted all the same (not
    served, not listed, its id free once the files go), and the next reclaim removes them."""
    store.put_voice("acme", "ann", voice_folder)
    remove = store.fs.rm

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Read-only file system", path)

    store.fs.rm = refuse
    try:
        assert store.delete_voice("acme", "ann") is False
    finally:
        store.fs.rm = remove
    assert store.list_voices("acme") == []
    with pytest.raises(VoiceNotFound):
        store.delete_voice("acme", "ann")
    store.reclaim()
    assert not store.fs.exists(f"{store.root}/acme/ann") and store.all_voices() == []
    store.put_voice("acme", "ann", voice_folder)  # the id is free again
    assert store.delete_voice("acme", "ann") is True


def test_a_write_probe_that_fails_half_way_leaves_no_file(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / ".write-probe-0123abcd").write_bytes(b"")  # left by a process killed mid-probe
    with VoiceStore(str(root)) as store:
        assert not list(root.glob(".write-probe-*"))
        pipe = store.fs.pipe_file

        def half_written(path, value, **kwargs):
            pipe(path, b"")
            raise OSError(28, "No space left on device")

        store.fs.pipe_file = half_written
        try:
            assert "No space left" in store.write_problem()
        finally:
            store.fs.pipe_file = pipe
        assert not list(root.glob(".write-probe-*"))


def test_consents_per_tenant_kept_while_a_voice_made_under_them_exists(store):
    """OpenAI's consent recordings: per tenant, listed oldest first, renamed, counted against a quota,
    and not deleted while a voice made under one exists (in every kind of store)."""
    fields = {"language": "en", "heard": "i am the owner", "word_error_rate": 0.1, "embedding": [0.6, 0.8]}
    first = store.create_consent("acme", name="one", recording=b"RIFF-1", **fields)
    second = store.create_consent("acme", name="two", recording=b"RIFF-2", **fields)
    assert first.consent_id.startswith("cons_") and first.embedding == (0.6, 0.8)
    assert [c.consent_id for c in store.list_consents("acme")] == [first.consent_id, second.consent_id]
    assert [c.consent_id for c in store.list_consents("acme", after=first.consent_id)] == [second.consent_id]
    assert [c.consent_id for c in store.list_consents("acme", limit=1)] == [first.consent_id]
    assert store.list_consents("globex") == []
    with pytest.raises(ConsentNotFound):
        store.consent("globex", first.consent_id)  # another tenant's is not found
    assert store.rename_consent("acme", first.consent_id, "renamed").name == "renamed"
    assert store.consent_recording("acme", second.consent_id) == b"RIFF-2"
    with pytest.raises(QuotaReached):
        store.create_consent("acme", name="three", recording=b"x", max_consents=2, **fields)
    store.create_job("acme", "voice_1", name="One", consent_id=first.consent_id, instant="m3(1)")
    record = store.voice("acme", "voice_1")
    assert (record.consent_id, record.instant) == (first.consent_id, "m3(1)")
    with pytest.raises(ConsentInUse, match="voice_1"):
        store.delete_consent("acme", first.consent_id)
    store.delete_voice("acme", "voice_1")
    store.delete_consent("acme", first.consent_id)
    store.delete_consent("acme", second.consent_id)
    assert store.list_consents("acme") == []
    # A security probe: a consent deleted while its sample was checked (seconds) still made a voice, with no
    # consent left behind it. The job's transaction finds the consent gone, and makes none.
    with pytest.raises(ConsentNotFound):
        store.create_job("acme", "voice_2", name="Two", consent_id=second.consent_id, instant="m3(1)")
    with pytest.raises(VoiceNotFound):
        store.voice("acme", "voice_2")


def test_a_recovery_report_reads_as_a_sentence_for_the_operators_log():
    """It had been logged as a raw dataclass repr, a voice 'failed' beside the job that trains it again."""
    assert RecoveryReport().summary() == ""
    assert RecoveryReport(orphan_folders=["x"]).summary() == ""  # named on a line of its own
    report = RecoveryReport(interrupted_jobs=["3ed7"], failed_voices=[("ann", "ann")], removed_uploads=["u"])
    assert report.summary() == (
        "1 onboarding job(s) cut short, trained again where their clips are kept: 3ed7; 1 voice(s) failed (cut "
        "short before their files were stored, or their files lost; a job cut short trains its voice again): "
        "ann/ann; 1 unfinished upload(s) removed"
    )


def test_migrate_keeps_consents_and_voices_that_speak_as_their_instant_voice(voice_folder, tmp_path):
    """An operator's probe: `chorus store migrate` had dropped every consent recording and each custom voice
    whose refinement failed though it speaks as its instant voice, and a copied custom voice lost its consent."""
    from typer.testing import CliRunner

    from chorus.cli import app

    fields = {"language": "en", "heard": "i am the owner", "word_error_rate": 0.0, "embedding": [0.6, 0.8]}
    with VoiceStore(str(tmp_path / "single")) as single:
        kept = single.create_consent("acme", name="ann", recording=b"RIFF-ann", **fields)
        unused = single.create_consent("globex", name="gil", recording=b"RIFF-gil", **fields)
        refined = single.create_job("acme", "voice_r", name="Refined", consent_id=kept.consent_id, instant="m3(1)")
        single.put_voice("acme", "voice_r", voice_folder, name="Refined", job_id=refined)
        uploaded = single.create_job("acme", "voice_c", name="From clips")
        single.put_voice("acme", "voice_c", voice_folder, name="From clips", job_id=uploaded)
        failed = single.create_job("acme", "voice_i", name="Instant", consent_id=kept.consent_id, instant="f2(1)")
        single.update_job(failed, status=JobStatus.FAILED, message="the refined voice lost its words")
        # A review: one still refining had been skipped ("training, not ready"), though it speaks on the source
        single.create_job("acme", "voice_t", name="Training", consent_id=kept.consent_id, instant="m3(2)")
        before = {v.voice_id: v for v in single.all_voices()}
        assert before["voice_i"].status == VoiceStatus.FAILED
        single.audit_consent("acme", "voice_u", "job-1", {"statement": "Ann agreed in writing.", "clips": 3})
    moved = CliRunner().invoke(
        app,
        ["store", "migrate", "--from", str(tmp_path / "single"), "--to", str(tmp_path / "copy")],
        env={"COLUMNS": "300"},
    )
    assert moved.exit_code == 0, moved.output
    assert "2 voice(s) copied" in moved.output
    assert "2 consent recording(s) and 1 consent(s) given with uploads copied" in moved.output
    assert "2 voice(s) that speak as their instant voice (refinement failed or still training) copied" in moved.output
    with VoiceStore(str(tmp_path / "copy")) as copy:
        assert copy.consent_recording("acme", kept.consent_id) == b"RIFF-ann"
        (given,) = copy.consent_audit("acme")
        assert (given["voice_id"], given["job_id"], given["statement"], given["clips"]) == (
            "voice_u",
            "job-1",
            "Ann agreed in writing.",
            3,
        )
        assert copy.consent("globex", unused.consent_id).name == "gil"
        for voice_id in ("voice_r", "voice_i"):
            record, source = copy.voice("acme", voice_id), before[voice_id]
            assert (record.status, record.consent_id, record.instant, record.created, record.error) == (
                source.status,
                source.consent_id,
                source.instant,
                source.created,
                source.error,
            )
            assert record.job_id is None or voice_id == "voice_r"  # the failed job stays behind
        training = copy.voice("acme", "voice_t")  # its job stays on the source: it arrives as a failed refinement
        assert (training.status, training.instant, training.consent_id, training.job_id) == (
            VoiceStatus.FAILED,
            "m3(2)",
            kept.consent_id,
            None,
        )
        assert training.error == "its refinement was still training where it was copied from, and stayed there"
        with pytest.raises(ConsentInUse):
            copy.delete_consent("acme", kept.consent_id)  # its voices came with it
        # GET /v1/audio/voices/{id} on the copy: the refined voice's job stayed behind, and its refinement had
        # read null beside stage adapted (the operator's probe); it is done, as on the source
        server = SimpleNamespace(store=copy, public=str)
        shown = {v: audio_voice_json(server, copy.voice("acme", v)) for v in ("voice_r", "voice_i", "voice_t")}
        assert {v: (s["stage"], s["refinement"]) for v, s in shown.items()} == {
            "voice_r": ("adapted", "done"),
            "voice_i": ("instant", "failed"),
            "voice_t": ("instant", "failed"),
        }
        copy.put_voice("acme", "voice_o", voice_folder, name="Added by the operator")  # no job ever made it
        assert audio_voice_json(server, copy.voice("acme", "voice_o"))["refinement"] is None
        # A voice made from uploaded clips (no instant voice) keeps the id of the job that made it, so it reads
        # as refined there too
        clips = copy.voice("acme", "voice_c")
        assert clips.job_id == uploaded and audio_voice_json(server, clips)["refinement"] == "done"
    again = CliRunner().invoke(
        app, ["store", "migrate", "--from", str(tmp_path / "single"), "--to", str(tmp_path / "copy")]
    )
    assert (
        "0 consent recording(s) and 0 consent(s) given with uploads copied" in again.output
        and "skipped acme/voice_i: in the target" in again.output
    )


def test_a_voice_records_the_base_it_is_made_on_from_its_job_to_its_commit(store, voice_folder):
    """A sample's instant voice blends the queuing server's base speakers: listed by that base's servers alone."""
    job = store.create_job("acme", "ann", name="Ann", instant="m3", base="b" * 64)
    training = store.voice("acme", "ann")
    assert training.base == "b" * 64 and training.made_on("b" * 64) and not training.made_on("c" * 64)
    store.put_voice("acme", "ann", voice_folder, name="Ann", job_id=job)  # the job's own upload keeps its instant
    assert store.voice("acme", "ann").base == "base"  # committed: its card's base, whatever the job said
    unrecorded = store.create_job("acme", "bob", name="Bob")  # a queue that names no base (Ray's): any base's
    assert unrecorded and store.voice("acme", "bob").base is None and store.voice("acme", "bob").made_on("c" * 64)
