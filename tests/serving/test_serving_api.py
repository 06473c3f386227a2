"""The voice server's HTTP API on the tiny base: OpenAI-compatible speech (whole and streamed, wav/pcm/flac),
a bad-input matrix that always answers a 4xx JSON error without a stack trace, API keys and tenant
isolation, voice onboarding end to end (upload -> job -> voice -> speech) and resumption after a
restart, concurrent mixed-voice load through the batcher, Prometheus metrics, and the official
``openai`` client against a live uvicorn server."""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import errno
import functools
import io
import json
import logging
import re
import shutil
import sqlite3
import struct
import subprocess
import threading
import time
import unicodedata
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import hypothesis
import numpy as np
import pytest
import schemathesis
import soundfile as sf
import soxr
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402

from chorus.adapters import parse_methods  # noqa: E402
from chorus.adapters.lora import LoraConfig  # noqa: E402
from chorus.adapters.speaker import SpeakerConfig  # noqa: E402
from chorus.audio.io import AudioTooDense, decode_with_av  # noqa: E402
from chorus.models.bundle import load_bundle
from chorus.recipe import DEFAULT_METHOD, AdaptConfig  # noqa: E402
from chorus.serving.api import create_app  # noqa: E402
from chorus.serving.engine import Engine  # noqa: E402
from chorus.serving.errors import UploadError  # noqa: E402
from chorus.serving.json_body import _STRING  # noqa: E402
from chorus.serving.onboarding import job_runner, uploads  # noqa: E402
from chorus.serving.onboarding.job_runner import JobRunner, OnboardingJob  # noqa: E402
from chorus.serving.onboarding.refinement import CHECK_SENTENCES, RefinementCheck, WordCheck  # noqa: E402
from chorus.serving.onboarding.uploads import (  # noqa: E402
    RecordingTooLong,
    clip_speech,
    parse_transcripts,
    prepare_archive,
    prepare_clips,
)
from chorus.serving.quotas import RateLimiter  # noqa: E402
from chorus.serving.schemas.models import MODEL_NAMES  # noqa: E402
from chorus.serving.schemas.speech import parse_speech, read_instructions  # noqa: E402
from chorus.serving.settings import (  # noqa: E402
    ONBOARDING_STEPS,
    ONBOARDING_THREADS,
    Limits,
    ServeConfig,
    ServerSettings,
    TenantLimits,
    UploadLimits,
)
from chorus.serving.store import JobStatus, QuotaReached, VoiceStatus, VoiceStore  # noqa: E402
from chorus.serving.tenants import (  # noqa: E402
    Tenants,
    Unauthorized,
    check_bind,
    parse_env,
    parse_keys_file,
)
from chorus.serving.voice_keys import stored_voice_folder  # noqa: E402
from chorus.synthesis import SENTENCE_SILENCE, Synthesizer, load_base  # noqa: E402
from chorus.text.sentences import split_sentences  # noqa: E402
from conftest import clip_files, decode, random_voice, tiny_piper_base, wait_for  # noqa: E402

KEYS = {
    "acme-key-0123456789abcdef": "acme",
    "globex-key-0123456789abcdef": "globex",
    "operator-key-0123456789abcdef": "operator",
}
OPERATOR = {"Authorization": "Bearer operator-key-0123456789abcdef"}
ACME = {"Authorization": "Bearer acme-key-0123456789abcdef"}
GLOBEX = {"Authorization": "Bearer globex-key-0123456789abcdef"}
LIMITS = UploadLimits(max_upload_bytes=8 << 20, max_clips=40)
SETTINGS = ServerSettings(
    max_wait_ms=20,
    upload=LIMITS,
    # The limits have their own tests.
    limits=Limits(TenantLimits(requests_per_minute=100_000, active_jobs=100), requests_per_minute=1_000_000),
    store_probe_seconds=0.0,  # every /healthz probes the store (a fault shows at once)
    progress_interval=0.2,
    adapt=AdaptConfig(methods=parse_methods("lora"), steps=4, threads=1, eval_every=2, max_frames=1500),
)
SENTENCES = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. It is easy."


@pytest.fixture(scope="module")
def adapter_folders(tiny_base, tmp_path_factory) -> dict[str, Path]:
    """Voice folders with random adapter values, so each sounds its own; "alien" was made for another base."""
    bundle = load_bundle(tiny_base)
    root = tmp_path_factory.mktemp("api_voices")
    folders = {}
    for k, name in enumerate(["ann", "bob", "other-ann", "alien"]):
        # alien: made for another base
        folders[name] = random_voice(
            bundle,
            name,
            [LoraConfig(r=2), SpeakerConfig()],
            root / name,
            100 + k,
            base_sha256="0" * 64 if name == "alien" else None,
        )
    return folders


def make_app(tiny_base: Path, root: Path, keys: dict[str, str] | None = None, settings: ServerSettings = SETTINGS):
    store = VoiceStore(str(root))
    engine = Engine.load(
        tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store), cache_bytes=1 << 20
    )
    tenants = Tenants.from_pairs(keys.items()) if keys else Tenants()
    return create_app(store, engine, tenants, settings), store


@pytest.fixture(scope="module")
def tenants_app(tiny_base, adapter_folders, tmp_path_factory):
    """Two tenants: acme has ann and bob; globex has its own (different) ann and secret."""
    app, store = make_app(tiny_base, tmp_path_factory.mktemp("store_tenants"), KEYS)
    store.put_voice("acme", "ann", adapter_folders["ann"])
    store.put_voice("acme", "bob", adapter_folders["bob"])
    store.put_voice("globex", "ann", adapter_folders["other-ann"])
    store.put_voice("globex", "secret", adapter_folders["bob"])
    store.put_voice("acme", "alien", adapter_folders["alien"])
    with TestClient(app) as client:
        yield client, store


def speak(client, headers=ACME, **body):
    payload = {"model": "chorus", "input": "Hello there.", "voice": "m3", "response_format": "wav"} | body
    return client.post("/v1/audio/speech", json=payload, headers=headers)


def decode_any(content: bytes, audio_format: str) -> np.ndarray:
    """Samples of an mp3/opus/aac file (PyAV's decoders), mono float."""
    import av

    with av.open(io.BytesIO(content), format={"opus": "ogg", "aac": "aac"}.get(audio_format, audio_format)) as box:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in box.decode(audio=0)])


def assert_error(response, status: int, fragment: str = "") -> str:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str), body
    assert "Traceback" not in response.text and 'File "' not in response.text
    assert "pytest-of" not in response.text  # no server paths either
    assert fragment.lower() in body["error"]["message"].lower(), body
    return body["error"]["message"]


# -- pieces ----------------------------------------------------------------------------------------
def test_keys_are_long_and_kept_hashed(tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app

    made = CliRunner().invoke(app, ["serve-key", "acme"])
    assert made.exit_code == 0, made.output
    key = made.stderr.split("(shown once, not stored): ")[1].split()[0]
    line = made.stdout.strip()  # stdout is exactly the keys-file line
    assert len(key) >= 32 and key not in line and line.startswith("sha256:") and line.endswith(" acme")
    keys = tmp_path / "keys.txt"
    keys.write_text(line + "\n")
    tenants = Tenants.load(keys, env={})
    assert tenants.authenticate(f"Bearer {key}") == "acme"
    with pytest.raises(Unauthorized):
        tenants.authenticate(f"Bearer {line.split()[0]}")  # the digest is not a key
    with pytest.raises(ValueError, match="at least|16-512"):
        Tenants.load(None, env={"CHORUS_API_KEYS": "x:acme"})  # a 1-character key
    assert CliRunner().invoke(app, ["serve-key", "Bad!"]).exit_code != 0


def test_an_empty_keys_file_refuses_to_start_rather_than_open_the_server(tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app

    empty = tmp_path / "keys.txt"
    for text in ["", "\n\n", "# ann's key was here\n", "{}", "[]"]:
        empty.write_text(text)
        with pytest.raises(ValueError, match="no API keys in it"):
            Tenants.load(empty, env={})
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "store"), "--keys", str(empty)])
    assert result.exit_code != 0 and "no API keys in it" in result.output and "start without --keys" in result.output


def test_keys_file_env_and_bind_rules(tmp_path):
    lines = tmp_path / "keys.txt"
    lines.write_text("# key tenant\nk1-abcdef-0123456789 acme\n\nk2-abcdef-0123456789 globex\n")
    assert parse_keys_file(lines) == [("k1-abcdef-0123456789", "acme"), ("k2-abcdef-0123456789", "globex")]
    as_json = tmp_path / "keys.json"
    as_json.write_text(json.dumps({"k3-abcdef-0123456789": "acme"}))
    assert parse_keys_file(as_json) == [("k3-abcdef-0123456789", "acme")]
    tenants = Tenants.load(lines, env={"CHORUS_API_KEYS": "k4:x-0123456789abcdef:initech, k5-abcdef-0123456789:acme"})
    assert tenants.authenticate("Bearer k4:x-0123456789abcdef") == "initech"
    assert tenants.authenticate("bearer k2-abcdef-0123456789") == "globex"
    for header in [None, "", "Bearer", "Basic k1-abcdef-0123456789", "Bearer wrong"]:
        with pytest.raises(Unauthorized):
            tenants.authenticate(header)
    for bad in [
        "k1-abcdef-0123456789 ../etc",
        "k1-abcdef-0123456789 Acme",
        "only-a-key",
        "short acme",
        "sha256:12 acme",
    ]:
        lines.write_text(bad + "\n")
        with pytest.raises(ValueError):
            Tenants.load(lines, env={})
    with pytest.raises(ValueError):
        parse_env("no-colon-here")
    single = Tenants.load(None, env={})
    assert single.single_tenant and single.authenticate(None) == "default"
    for host in ["127.0.0.1", "::1", "localhost", "127.0.0.2"]:
        check_bind(host, single)
    for host in ["0.0.0.0", "192.168.1.5", "example.com", "::"]:
        with pytest.raises(ValueError, match="loopback"):
            check_bind(host, single)
    check_bind("0.0.0.0", tenants)  # with keys any address is allowed


def test_a_failed_job_says_why_without_the_command_lines_advice(new_voice_data, tmp_path):
    """The data check's refusal, as an uploader reads it: the upload by name, and no `chorus data check` to run."""
    from chorus.recipe import AdaptConfig
    from chorus.training.adapt import check_adaptation_data

    job_dir = tmp_path / "job-1"
    data = job_dir / job_runner.DATA_DIR
    shutil.copytree(new_voice_data, data)
    for wav in (data / "wavs").glob("*.wav"):
        audio, rate = sf.read(wav, dtype="float32")
        sf.write(wav, np.clip(audio * 40, -1, 1), rate)
    with pytest.raises(ValueError, match="chorus data check") as refused:
        check_adaptation_data(data, AdaptConfig(), progress=False)
    message = job_runner.for_the_uploader(refused.value, job_dir)
    assert message.startswith("upload: nothing usable (") and "at full scale" in message, message
    assert "chorus" not in message and str(tmp_path) not in message, message
    # Any other failure is told as it is, its folders named.
    assert job_runner.for_the_uploader(ValueError(f"{data}/wavs: cannot read"), job_dir) == "upload/wavs: cannot read"


def test_the_onboarding_recipe_is_adapts_but_for_the_servers_own_values():
    onboarding, library = ServerSettings().adapt, AdaptConfig()
    assert onboarding.methods.spec == DEFAULT_METHOD  # the onboarding default, as `chorus adapt`'s
    assert (onboarding.steps, onboarding.threads) == (ONBOARDING_STEPS, ONBOARDING_THREADS) == (300, 1)
    assert dataclasses.replace(onboarding, steps=library.steps, threads=library.threads) == library


def test_cli_refuses_an_open_host_without_keys(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app

    monkeypatch.delenv("CHORUS_API_KEYS", raising=False)
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "store"), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "loopback" in result.output
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "store"), "--keys", str(tmp_path / "none")])
    assert result.exit_code == 2 and "none" in result.output
    assert "CHORUS_API_KEYS" in CliRunner().invoke(app, ["serve", "--help"]).output


def test_what_an_operator_mistypes_is_refused_before_anything_starts(monkeypatch, tmp_path):
    """An operator's probe: a bad key in CHORUS_API_KEYS had been blamed on a good keys file, a missing keys
    file was a bare errno, --port 70000 was bound as port 4464, --max-text-chars 0 refused every request
    while /healthz said ok, and a port in use aborted the server after its store and job worker had started."""
    import os
    import socket

    from typer.testing import CliRunner

    from chorus.cli import app
    from chorus.serving.api import bound_sockets

    good = tmp_path / "keys.txt"
    good.write_text("k1-abcdef-0123456789 acme\n")
    with pytest.raises(ValueError, match=r"^CHORUS_API_KEYS \(with .*keys.txt\): an API key must be"):
        Tenants.load(good, env={"CHORUS_API_KEYS": "shortkey:eve"})
    with pytest.raises(ValueError, match=r"nokeys.txt: no such keys file \(`chorus serve-key TENANT >>"):
        Tenants.load(tmp_path / "nokeys.txt", env={})
    with pytest.raises(ValueError, match="a folder, not a keys file"):
        Tenants.load(tmp_path, env={})
    read, write = os.pipe()  # --keys <(...): a pipe, not a file, read as one
    os.write(write, b"k1-abcdef-0123456789 acme\n")
    os.close(write)
    try:
        assert Tenants.load(f"/dev/fd/{read}", env={}).authenticate("Bearer k1-abcdef-0123456789") == "acme"
    finally:
        os.close(read)
    with pytest.raises(ValueError, match=r"port \(--port\) must be 1-65535, got 70000"):
        ServeConfig(store=str(tmp_path / "store"), port=70_000)
    with pytest.raises(ValueError, match=r"max_text_chars \(--max-text-chars\) must be at least 1"):
        ServerSettings(max_text_chars=0)
    monkeypatch.delenv("CHORUS_API_KEYS", raising=False)
    store = tmp_path / "store"
    for flag, value in [("--port", "70000"), ("--max-text-chars", "0"), ("--adapt-steps", "-5")]:
        result = CliRunner().invoke(app, ["serve", "--store", str(store), flag, value], env={"COLUMNS": "200"})
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output, result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is in use by another process"):
            bound_sockets("127.0.0.1", port)
        result = CliRunner().invoke(app, ["serve", "--store", str(store), "--port", str(port)])
        assert result.exit_code == 2 and "is in use by another process" in result.output, result.output
    assert not store.exists()  # nothing was started, not even the store
    (free,) = bound_sockets("127.0.0.1", 0)
    with free:
        assert free.getsockname()[1] > 0
        # Refused until uvicorn makes it listen, once the app has started: a TCP probe fails while the
        # base loads (it had been accepted and left waiting).
        with pytest.raises(ConnectionRefusedError), socket.create_connection(free.getsockname(), timeout=5):
            pass
        free.listen()
        socket.create_connection(free.getsockname(), timeout=5).close()
    for each in bound_sockets("localhost", 0):  # each address the name gives, as uvicorn binds them
        with each:
            assert each.getsockname()[0] in ("127.0.0.1", "::1")


def test_sentence_splitting():
    assert split_sentences("One. Two! Three?") == ["One.", "Two!", "Three?"]
    assert split_sentences("Dr. Smith came. He sat.") == ["Dr. Smith came.", "He sat."]
    assert split_sentences("Hello. ... !") == ["Hello. ... !"]
    long = " ".join(["word"] * 200)
    assert all(len(chunk) <= 300 for chunk in split_sentences(long)) and len(split_sentences(long)) > 1


def test_uploads_of_any_common_format_and_length_without_transcripts(new_voice_data, tmp_path):
    """An AAC and an MP3 recording, each longer than a clip may be when transcribed, and no transcripts:
    written for the job to cut and transcribe; a transcribed clip still keeps the clip limit."""
    from chorus.audio.encode import encode_whole
    from chorus.audio.io import load_audio

    wavs = sorted((new_voice_data / "wavs").glob("*.wav"))
    audio = np.concatenate([load_audio(w) for w in wavs])  # about 35 s
    limits = UploadLimits(max_clip_seconds=20.0)
    clips = [("long.aac", encode_whole(audio, 22050, "aac")), ("long.mp3", encode_whole(audio, 22050, "mp3"))]
    prepared = prepare_clips(clips, None, tmp_path / "voice", limits)
    assert prepared.clips == 2 and prepared.seconds > 60
    assert (tmp_path / "voice" / "metadata.csv").read_text().splitlines() == ["long|", "long_2|"]
    with pytest.raises(UploadError, match="at most 20 s"):
        prepare_clips(clips[:1], {"long.aac": "Some words."}, tmp_path / "again", limits)
    with pytest.raises(UploadError, match="AAC/M4A or WebM"):
        prepare_clips([("x.m4a", b"not audio at all" * 100)], None, tmp_path / "bad", limits)
    # Without transcripts a recording is judged in the pieces the job cuts it into: long pauses of room tone
    # between its sentences are no fault, and the speech counted is its pieces' that hold speech; a recording
    # with no piece of speech is refused, as the job would leave every piece out.
    rng = np.random.default_rng(0)
    pause = (10 ** (-55 / 20) * rng.standard_normal(5 * 22050)).astype(np.float32)
    sentences = [load_audio(w) for w in wavs]
    paused = np.concatenate([part for sentence in sentences for part in (sentence, pause)])
    hum = 0.3 * np.sin(2 * np.pi * 100 * np.arange(8 * 22050) / 22050).astype(np.float32)
    humming = np.concatenate([hum[: 4 * 22050], sentences[0], hum[4 * 22050 :]])  # one piece, mostly hum
    both = np.concatenate([paused, humming])
    assert clip_speech(humming, 22050, True)[0] > 1  # speech the detector hears, in a piece it leaves out
    assert clip_speech(both, 22050, False)[0] == pytest.approx(clip_speech(paused, 22050, False)[0])
    assert clip_speech(paused, 22050, False)[0] > 25
    prepare_clips([("paused.mp3", encode_whole(paused, 22050, "mp3"))], None, tmp_path / "paused", UploadLimits())
    with pytest.raises(UploadError, match="hum.mp3: no speech heard \\(a voice-activity detector hears"):
        prepare_clips([("hum.mp3", encode_whole(hum, 22050, "mp3"))], None, tmp_path / "hum", limits)
    # The clips left out count toward the minutes an upload may hold: reading it stays bounded.
    hums = [(f"hum{n}.mp3", encode_whole(hum, 22050, "mp3")) for n in range(3)]
    with pytest.raises(UploadError, match="more than 0.3 minutes of audio in one upload") as refused:
        prepare_clips(hums, None, tmp_path / "hums", dataclasses.replace(limits, max_total_seconds=18.0))
    assert refused.value.status == 413
    # By default a transcribed clip is bounded as the job's data check bounds it (a 25 s one had been taken
    # at upload, then failed the job).
    clip = encode_whole(audio[: 25 * 22050], 22050, "mp3")
    with pytest.raises(UploadError, match="at most 20 s"):
        prepare_clips([("c.mp3", clip)], {"c.mp3": "Some words."}, tmp_path / "default", UploadLimits())


def test_transcripts_and_archive_safety(new_voice_data, tmp_path):
    assert parse_transcripts('{"a.wav": "Hi there."}') == {"a.wav": "Hi there."}
    assert parse_transcripts("a.wav|Hi there.\nb.wav|Bye.\n") == {"a.wav": "Hi there.", "b.wav": "Bye."}
    for bad in ["", "{not json", '["a"]', "no separator"]:
        with pytest.raises(UploadError):
            parse_transcripts(bad)
    # A name given twice: the lines refused it, the JSON kept the last (a probe of the uploads)
    with pytest.raises(UploadError, match="'transcripts': the JSON names 'a.wav' twice"):
        parse_transcripts('{"a.wav": "Hi there.", "b.wav": "Bye.", "a.wav": "Something else."}')
    good = io.BytesIO()
    with zipfile.ZipFile(good, "w") as archive:
        for path in sorted(new_voice_data.rglob("*")):
            if path.is_file():
                archive.write(path, f"myvoice/{path.relative_to(new_voice_data)}")
    prepared = prepare_archive(good.getvalue(), tmp_path / "ok", LIMITS)
    assert prepared.clips == 16 and prepared.seconds > 30
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == ["metadata.csv", "wavs"]

    def zipped(entries: dict[str, bytes], symlink: str | None = None) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
            if symlink:
                info = zipfile.ZipInfo(symlink)
                info.external_attr = 0o120777 << 16
                archive.writestr(info, "/etc/passwd")
        return buffer.getvalue()

    cases = {
        "'..'": zipped({"../evil.wav": b"x", "metadata.csv": b"a|b"}),
        "absolute": zipped({"/abs/metadata.csv": b"a|b"}),
        "symbolic link": zipped({"metadata.csv": b"a|b"}, symlink="wavs/a.wav"),
        "zip bomb": zipped({"metadata.csv": b"a|b", "wavs/a.wav": bytes(4 << 20)}),
        "exactly one metadata.csv": zipped({"wavs/a.wav": b"x"}),
        "no wavs/a.wav": zipped({"metadata.csv": b"a|hello"}),
        "it is beside metadata.csv: put the clips in wavs/": zipped({"metadata.csv": b"a|hello", "a.wav": b"x"}),
        "no wavs/wavs/a.wav.wav .or .flac, .... in the archive$": zipped(
            {"metadata.csv": b"wavs/a.wav|hi", "wavs/a.wav": b"x"}
        ),
        "NUL characters: UTF-16": zipped({"metadata.csv": "a|hello".encode("utf-16-le"), "wavs/a.wav": b"x"}),
        "not a zip": b"PK not really",
    }
    for number, (fragment, data) in enumerate(cases.items()):
        with pytest.raises(UploadError, match=fragment):
            prepare_archive(data, tmp_path / f"bad{number}", LIMITS)


def test_an_archive_is_read_as_the_data_check_reads_its_folder(new_voice_data, tmp_path):
    """What `chorus data check` and `chorus adapt` take in a folder, an upload takes in its zip: a header row,
    ids written with their suffix, lines left for Whisper (``id|``), names zipped without the UTF-8 flag
    (Info-ZIP's `zip`), a name in Unicode's decomposed form; an id given twice is refused, where it had been trained
    on twice."""
    lines = (new_voice_data / "metadata.csv").read_text().splitlines()
    wavs = sorted((new_voice_data / "wavs").glob("*.wav"))
    ids = [line.split("|")[0] for line in lines]
    rows = ["id|text", f"{ids[0]}.wav|{lines[0].split('|')[1]}", f"{ids[1]}|", *lines[2:]]
    renamed = {ids[2]: "clïp é"}  # a name with letters that code page 437 spells otherwise
    # macOS zips "é" as "e" and an accent (NFD), where the metadata's editor wrote one character (NFC).
    renamed[ids[5]] = unicodedata.normalize("NFD", "café")
    rows = [row.replace(ids[5], "café", 1) if row.startswith(ids[5] + "|") else row for row in rows]
    rows = [row.replace(ids[2], renamed[ids[2]], 1) if row.startswith(ids[2] + "|") else row for row in rows]

    def zipped(metadata: list[str]) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("metadata.csv", "\n".join(metadata) + "\n")
            for number, wav in enumerate(wavs):
                suffix = ".WAV" if number == 4 else ".wav"  # as cameras and Windows tools write it
                archive.writestr(f"wavs/{renamed.get(wav.stem, wav.stem)}{suffix}", wav.read_bytes())
        # As Info-ZIP's `zip` writes it: UTF-8 names without the UTF-8 flag (bit 11 of each header's flags).
        data = bytearray(buffer.getvalue())
        for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            start = data.find(signature)
            while start >= 0:
                flags = struct.unpack_from("<H", data, start + offset)[0]
                struct.pack_into("<H", data, start + offset, flags & ~0x800)
                start = data.find(signature, start + 4)
        return bytes(data)

    prepared = prepare_archive(zipped(rows), tmp_path / "ok", LIMITS)
    written = (tmp_path / "ok" / "metadata.csv").read_text().splitlines()
    assert prepared.clips == len(lines) and written[0].startswith(ids[0] + "|") and written[1] == f"{ids[1]}|"
    assert "cl_p|" + lines[2].split("|", 1)[1] in written  # the clip zipped under its UTF-8 name, its id made safe
    # A header row of four columns is a header too; a line whose clip is not in the archive is left out, named.
    wider = ["id|text|normalized|speaker", *rows[1:], "missing|A clip that was never zipped."]
    prepared = prepare_archive(zipped(wider), tmp_path / "wider", LIMITS)
    assert prepared.clips == len(lines), prepared
    assert prepared.left_out == (f"metadata.csv line {len(wider)}: no wavs/missing.wav (or .flac, ...) in the archive",)
    # Lines without their clips count as the clips they name: thousands of them are refused, not listed.
    many = ["id|text", *rows[1:], *(f"gone{n}|Never zipped." for n in range(LIMITS.max_clips))]
    with pytest.raises(UploadError, match=f"too many clips: at most {LIMITS.max_clips}") as refused:
        prepare_archive(zipped(many), tmp_path / "many", LIMITS)
    assert refused.value.status == 413
    for again in (ids[3], f"{ids[3]}.wav"):  # the same clip by its id or by its file's name
        twice = [*rows, f"{again}|Another text."]
        with pytest.raises(UploadError, match=f"line {len(twice)}: id '{again}' is given twice \\(line 5\\)"):
            prepare_archive(zipped(twice), tmp_path / f"twice-{again}", LIMITS)
    assert parse_transcripts("filename|text\na.wav|Hi.") == {"a.wav": "Hi."}  # the clips form's header row too


# -- speech ------------------------------------------------------------------------------------------
def test_openapi_page_shows_the_routes_and_their_bodies(tenants_app):
    client, _ = tenants_app
    schema = client.get("/openapi.json").json()
    assert {"/v1/audio/speech", "/v1/voices", "/v1/voices/{voice_id}", "/v1/jobs/{job_id}", "/healthz"} <= set(
        schema["paths"]
    )
    body = schema["paths"]["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["title"] == "SpeechRequest" and set(body["required"]) == {"input", "voice"}
    assert {"CustomVoice", "BaseVoice", "VoiceList", "Job", "CreatedJob", "ErrorBody"} <= set(
        schema["components"]["schemas"]
    )
    docs = client.get("/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text
    # Offline: every script and style the page loads comes from this server, none from a CDN.
    loaded = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
    assert loaded and all(url.startswith("/") and not url.startswith("//") for url in loaded), loaded
    assert all(client.get(url).status_code == 200 for url in loaded)


def test_a_speech_request_normalizes_each_sentence_once(tenants_app, monkeypatch):
    """The characters a sentence drops, its phonemes and its words' timestamps all read one normalization of
    it (they had each normalized it again: three times a sentence)."""
    from chorus.text import normalize

    class Counting:  # the normalizer's first step, counting the texts it is given
        def __init__(self, pattern):
            self.pattern, self.seen = pattern, collections.Counter()

        def sub(self, replacement, text):
            self.seen[text] += 1
            return self.pattern.sub(replacement, text)

    counting = Counting(normalize._number_dash_re)
    monkeypatch.setattr(normalize, "_number_dash_re", counting)
    normalize._spoken.cache_clear()
    client, _ = tenants_app
    sentences = ["Dr. Ames paid $12.50 on May 3rd.", "She left at 5:30 pm, 2 days later."]
    body = {"model": "chorus", "input": " ".join(sentences), "voice": "m3", "response_format": "wav"}
    response = client.post("/v1/audio/speech/captioned", json=body, headers=ACME)
    assert response.status_code == 200 and response.json()["words"], response.text
    assert [counting.seen[sentence] for sentence in sentences] == [1, 1], counting.seen


def test_speech_formats_speed_and_streaming(tenants_app):
    client, _ = tenants_app
    wav = speak(client)
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    audio, rate = decode(wav.content)
    assert rate == 22050 and len(audio) > 0 and np.isfinite(audio).all()
    assert struct.unpack("<I", wav.content[40:44])[0] == len(wav.content) - 44  # exact sizes when whole

    pcm = speak(client, response_format="pcm", sample_rate=22050)
    assert pcm.headers["content-type"] == "audio/pcm" and pcm.headers["x-sample-rate"] == "22050"
    assert np.array_equal(np.frombuffer(pcm.content, "<i2"), np.frombuffer(wav.content[44:], "<i2"))
    openai_pcm = speak(client, response_format="pcm")  # OpenAI's clients play raw pcm at 24 kHz
    assert openai_pcm.headers["x-sample-rate"] == "24000"
    assert abs(len(openai_pcm.content) / 2 / 24000 - len(pcm.content) / 2 / 22050) < 0.01

    flac = speak(client, response_format="flac", voice="ann")
    assert flac.headers["content-type"] == "audio/flac" and decode(flac.content)[1] == 22050

    fast, slow = speak(client, speed=2.0, response_format="pcm"), speak(client, speed=0.5, response_format="pcm")
    pcm = openai_pcm
    assert len(fast.content) < len(pcm.content) < len(slow.content)

    # Several sentences: streamed as made, a WAV header of unknown length, one chunk per sentence.
    with client.stream(
        "POST",
        "/v1/audio/speech",
        headers=ACME,
        json={"model": "tts-1", "input": SENTENCES, "voice": {"id": "bob"}, "response_format": "wav"},
    ) as streamed:
        assert streamed.status_code == 200 and "content-length" not in streamed.headers
        body = b"".join(streamed.iter_bytes())
    assert body[:4] == b"RIFF" and struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF
    audio, _ = decode(body)
    assert len(audio) == (len(body) - 44) // 2 and len(audio) > len(decode(wav.content)[0])


def test_a_wav_whole_before_its_first_byte_states_its_true_length(tenants_app):
    """One sentence, SSML breaks around it or not, is whole once it is made, before any byte goes out: its WAV
    says its true length (Python's wave reads its frames), as audio or as SSE events; several sentences still
    stream with an unknown length (above)."""
    import wave

    client, _ = tenants_app
    broken = speak(client, input='<speak><break time="300ms"/>Hello there.<break time="200ms"/></speak>')
    assert broken.status_code == 200, broken.text
    with wave.open(io.BytesIO(broken.content)) as read:
        assert read.getnframes() == (len(broken.content) - 44) // 2 > round(0.5 * 22050)
    with client.stream("POST", "/v1/audio/speech", headers=ACME, json={
        "input": "Hello there.", "voice": "m3", "response_format": "wav", "stream_format": "sse"
    }) as events:  # fmt: skip
        deltas = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")][:-1]
    body = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    with wave.open(io.BytesIO(body)) as read:
        assert read.getnframes() == (len(body) - 44) // 2 > 0

    # Several sentences, asked whole ("stream": false, Chorus's extension): true sizes, the streamed samples.
    whole = speak(client, input=SENTENCES, stream=False)
    streamed = speak(client, input=SENTENCES)
    assert int(whole.headers["content-length"]) == len(whole.content) and "content-length" not in streamed.headers
    with wave.open(io.BytesIO(whole.content)) as read:
        assert read.getnframes() == (len(whole.content) - 44) // 2
    # The same samples but for rounding: the stream batches its sentences together, the whole answer one by one.
    whole_samples, streamed_samples = decode(whole.content)[0], decode(streamed.content)[0]
    assert len(whole_samples) == len(streamed_samples) and np.abs(whole_samples - streamed_samples).max() < 1e-3
    assert_error(speak(client, input=SENTENCES, stream=False, stream_format="sse"), 400, "'stream': false")
    assert_error(speak(client, stream="no"), 400, "'stream' must be true or false")


def test_openai_defaults_mp3_and_its_model_names(tenants_app):
    """What OpenAI's clients send without a format gets OpenAI's default, mp3 (also as SSE and captioned);
    every model name /v1/models lists speaks the same base model."""
    client, _ = tenants_app
    body = {"model": "tts-1", "input": "Hello there.", "voice": "m3"}
    plain = client.post("/v1/audio/speech", json=body, headers=ACME)
    assert plain.status_code == 200 and plain.headers["content-type"] == "audio/mpeg"
    assert len(decode_any(plain.content, "mp3")) > 0
    with client.stream("POST", "/v1/audio/speech", headers=ACME, json=body | {"stream_format": "sse"}) as events:
        deltas = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")][:-1]
    assert len(decode_any(b"".join(base64.b64decode(e["audio"]) for e in deltas), "mp3")) > 0
    captioned = client.post("/v1/audio/speech/captioned", json=body, headers=ACME).json()
    assert captioned["response_format"] == "mp3"
    listed = [m["id"] for m in client.get("/v1/models", headers=ACME).json()["data"]]
    assert listed == list(MODEL_NAMES)
    spoken = {speak(client, model=name).content for name in listed}
    assert len(spoken) == 1  # the same samples whatever the name


@pytest.mark.parametrize(
    "audio_format, content_type", [("mp3", "audio/mpeg"), ("opus", "audio/ogg"), ("aac", "audio/aac")]
)
def test_compressed_formats_whole_and_streamed(tenants_app, audio_format, content_type):
    client, _ = tenants_app
    wav_seconds = len(decode(speak(client).content)[0]) / 22050
    whole = speak(client, response_format=audio_format)
    assert whole.status_code == 200 and whole.headers["content-type"] == content_type
    rate = int(whole.headers["x-sample-rate"])
    assert rate == (48000 if audio_format == "opus" else 22050)
    # Encoders pad a frame or two at the ends: the length agrees to within 0.1 s.
    assert abs(len(decode_any(whole.content, audio_format)) / rate - wav_seconds) < 0.1
    with client.stream(
        "POST",
        "/v1/audio/speech",
        headers=ACME,
        json={"input": SENTENCES, "voice": "m3", "response_format": audio_format},
    ) as streamed:
        assert streamed.status_code == 200 and "content-length" not in streamed.headers
        body = b"".join(streamed.iter_bytes())
    assert len(decode_any(body, audio_format)) / rate > wav_seconds  # one continuous file of every sentence


def test_server_sent_events_as_openai_defines_them(tenants_app):
    client, _ = tenants_app
    with client.stream(
        "POST",
        "/v1/audio/speech",
        headers=ACME,
        json={"input": SENTENCES, "voice": "m3", "response_format": "pcm", "stream_format": "sse"},
    ) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        text = "".join(streamed.iter_text())
    events = [json.loads(line[len("data: ") :]) for line in text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) >= 3
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] == len(SENTENCES)

    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    whole = speak(client, input=SENTENCES, response_format="pcm")
    assert len(pcm) == len(whole.content)  # the same samples as the audio stream, in events


def test_instructions_set_the_pace_and_name_what_they_ignore(tenants_app):
    client, _ = tenants_app
    plain = speak(client, response_format="pcm")
    slow = speak(client, response_format="pcm", instructions="Please speak slowly.")
    very_fast = speak(client, response_format="pcm", instructions="very fast")
    assert len(very_fast.content) < len(plain.content) < len(slow.content)
    assert "x-instructions-ignored" not in slow.headers
    # Code written for gpt-4o-mini-tts is spoken, not refused: the pace is taken, the tone named as ignored.
    calm = speak(client, response_format="pcm", instructions="Speak slowly and calmly.")
    assert calm.status_code == 200 and len(calm.content) == len(slow.content)
    assert calm.headers["x-instructions-ignored"] == "calmly"
    shout = speak(client, response_format="pcm", instructions="Whisper it, then shout «loud».")
    assert shout.status_code == 200 and len(shout.content) == len(plain.content)
    assert unquote(shout.headers["x-instructions-ignored"]) == "Whisper it; shout «loud»"


def test_a_sentence_in_another_script_is_left_out_and_named_never_a_cut_stream(tenants_app):
    client, _ = tenants_app
    plain = speak(client, input="Hello there. Goodbye now.", response_format="pcm")
    mixed = speak(client, input="Hello there. 你好。 Goodbye now.", response_format="pcm")
    assert mixed.status_code == 200 and unquote(mixed.headers["x-skipped-text"]) == "你好。"
    assert len(mixed.content) == len(plain.content)  # the rest spoken, with one pause between, as without it
    assert "x-skipped-text" not in plain.headers
    with client.stream(
        "POST",
        "/v1/audio/speech",
        headers=ACME,
        json={"input": "Hi. Привет! Bye.", "voice": "m3", "stream_format": "sse"},
    ) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert unquote(streamed.headers["x-skipped-text"]) == "Привет!"
    assert events[-1]["type"] == "speech.audio.done" and len(events) > 1
    assert_error(speak(client, input="你好。再见。"), 400, "only text this model cannot read")


def test_piper_http_api_speaks_as_the_speech_route(tenants_app):
    """``POST /`` as Piper's HTTP server answers it: JSON or plain text in, one whole WAV out, the same
    samples as /v1/audio/speech for the same text, speaker and pace."""
    import wave

    client, _ = tenants_app
    server = client.app.state.server
    default, second = server.engine.default_speaker, server.engine.speakers[1]
    answer = client.post("/", json={"text": SENTENCES}, headers=ACME)
    assert answer.status_code == 200 and answer.headers["content-type"] == "audio/wav", answer.text
    with wave.open(io.BytesIO(answer.content)) as read:  # whole, with its true sizes
        assert read.getnframes() == (len(answer.content) - 44) // 2 > 0
    # The same samples, to -60 dB: several sentences are asked for ahead, and which of them the batcher pads into
    # one batch depends on timing, which moves samples by up to 9 steps of 16-bit audio (seen in runs here).
    ours, rate = decode(answer.content)
    theirs, their_rate = decode(speak(client, input=SENTENCES, voice=default, stream=False).content)
    assert rate == their_rate and len(ours) == len(theirs) and np.abs(ours - theirs).max() <= 1e-3
    plain = client.post("/", content=SENTENCES.encode(), headers=ACME | {"Content-Type": "text/plain"})
    assert np.abs(decode(plain.content)[0] - ours).max() <= 1e-3
    by_index = client.post("/", json={"text": "Hello there.", "speaker_id": 1}, headers=ACME)
    assert by_index.content == speak(client, voice=second).content
    paced = client.post("/", json={"text": "Hello there.", "speaker": second, "length_scale": 2.0}, headers=ACME)
    assert paced.content == speak(client, voice=second, speed=0.5).content
    noisy = client.post("/", json={"text": "Hello there.", "noise_scale": 0.3}, headers=ACME)
    assert noisy.status_code == 200 and noisy.headers["x-options-ignored"] == "noise_scale"
    both = client.post("/", json={"text": "Hello there.", "speaker": default, "speaker_id": 1}, headers=ACME)
    assert both.content == by_index.content and both.headers["x-options-ignored"] == "speaker"  # Piper's order
    assert_error(client.post("/", json={"text": "Hello there."}), 401)
    for body, fragment in [
        ({}, "'text' is required"),
        ({"text": "Hi.", "length_scale": 9}, "'length_scale' must be a number from 0.25 to 4"),
        ({"text": "Hi.", "speaker_id": 99}, "'speaker_id' must be a whole number from 0 to"),
        ({"text": "Hi.", "rate": 2}, "unknown field(s) 'rate'"),
        ({"text": "Hi.", "voice": "nobody"}, "not found"),
        ({"text": "Hi.", "voice": "ann", "speaker_id": 0}, "not both"),
        ({"text": "a" * 4097}, "'text' is 4097 characters"),
    ]:
        assert fragment in client.post("/", json=body, headers=ACME).json()["error"]["message"]
    assert_error(client.post("/", content=b"<x/>", headers=ACME | {"Content-Type": "application/xml"}), 415)
    # A new user's probe: a declared charset was refused as "not UTF-8"; 'speaker' was named 'voice'.
    latin = ACME | {"Content-Type": "text/plain; charset=latin-1"}
    assert client.post("/", content="Café time.".encode("latin-1"), headers=latin).status_code == 200
    assert_error(client.post("/", content=b"Hi.", headers=ACME | {"Content-Type": "text/plain; charset=nope"}), 415)
    # A review: UTF-16 without a byte order mark was read little-endian; RFC 2781 reads it big-endian.
    plain = client.post("/", content=b"Hello there.", headers=ACME | {"Content-Type": "text/plain"}).content
    for charset, body in [
        ("utf-16", "Hello there.".encode("utf-16-be")),
        ("utf-16", "Hello there.".encode("utf-16")),  # with this machine's byte order mark
        ("UTF-32", "Hello there.".encode("utf-32-be")),
        ("utf-16le", "Hello there.".encode("utf-16-le")),
    ]:
        wide = client.post("/", content=body, headers=ACME | {"Content-Type": f"text/plain; charset={charset}"})
        assert wide.status_code == 200 and wide.content == plain, (charset, wide.text[:200])
    unknown = client.post("/", json={"text": "Hi.", "speaker": "nobody"}, headers=ACME).json()["error"]
    assert unknown["param"] == "speaker" and "not found" in unknown["message"]
    # A body past the server's bound is refused before it is read whole, as the speech route's is.
    limit = client.app.state.server.settings.max_json_bytes
    big = client.post("/", content=b"a" * (limit + 1), headers=ACME | {"Content-Type": "text/plain"})
    assert_error(big, 413)


def test_laying_out_and_encoding_whole_answers_run_off_the_event_loop(tenants_app, monkeypatch):
    """A security probe: 4,096 characters of "1. " took 0.2-0.45 s to lay out, and minutes of MP3 at 48 kHz
    seconds to encode, both on the event loop: refused requests within one tenant's rate, or a few long ones,
    stalled every other request for seconds. Both now run in the thread pool."""
    import asyncio

    from chorus.serving.routes import speech

    on_loop = []

    def watched(work):
        def run(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                on_loop.append(work.__name__)
            except RuntimeError:  # no loop in this thread: a worker's
                on_loop.append(None)
            return work(*args, **kwargs)

        return run

    monkeypatch.setattr(speech, "layout", watched(speech.layout))
    monkeypatch.setattr(speech, "encode_whole", watched(speech.encode_whole))
    client, _ = tenants_app
    assert speak(client, response_format="mp3").status_code == 200
    assert client.post("/v1/audio/speech/captioned", json={"input": "Hi.", "voice": "m3"}, headers=ACME).json()["words"]
    assert client.post("/", json={"text": "Hello there."}, headers=ACME).status_code == 200  # Piper's route
    assert_error(speak(client, input="1. " * 1365), 400, "would be about")
    assert len(on_loop) == 7 and set(on_loop) == {None}, on_loop  # 4 layouts, 3 whole encodings


def test_characters_left_out_of_a_spoken_sentence_are_named(tenants_app):
    client, _ = tenants_app
    plain = speak(client, input="Hello there.", response_format="pcm")
    mixed = speak(client, input="Hello 你好 there 👍.", response_format="pcm")
    assert mixed.status_code == 200 and unquote(mixed.headers["x-dropped-characters"]) == "你好👍"
    assert mixed.content == plain.content and "x-skipped-text" not in mixed.headers
    assert "x-dropped-characters" not in plain.headers
    inline = speak(client, input="Say [[ həˈloʊ ]] now.", response_format="pcm")  # phonemes are read as written
    assert inline.status_code == 200 and "x-dropped-characters" not in inline.headers


@pytest.mark.parametrize(
    "instructions, pace, ignored",
    [
        ("Please speak slowly.", 0.8, ()),
        ("very fast", 1.25**2, ()),
        ("a bit faster please", 1.25**0.5, ()),
        ("Speak slowly and calmly.", 0.8, ("calmly",)),
        ("Read it quickly, with a British accent", 1.25, ("with a British accent",)),
        ("Speak in a cheerful tone.", 1.0, ("Speak in a cheerful tone",)),
        # Clauses a word joins are named together, as written (a probe read "a cheerful; positive tone").
        ("Speak in a cheerful and positive tone.", 1.0, ("Speak in a cheerful and positive tone",)),
        ("Speak slowly and calmly and warmly", 0.8, ("calmly and warmly",)),
        ("Sound warm, and friendly", 1.0, ("Sound warm", "friendly")),
        (
            "Speak slowly, then quickly, in a cheerful and positive tone",
            1.0,
            ("Speak slowly", "quickly", "in a cheerful and positive tone"),
        ),
        ("Breakfast tone", 1.0, ("Breakfast tone",)),  # "fast" only as a word
        # A clause that says what not to do is no request for its pace: named, not followed (it was slowed).
        ("Do not speak slowly.", 1.0, ("Do not speak slowly",)),
        ("Don't rush, speak calmly", 1.0, ("Don't rush", "speak calmly")),
        ("Don’t speak slowly", 1.0, ("Don't speak slowly",)),  # a phone keyboard's apostrophe
        ("You cannot speak quickly", 1.0, ("You cannot speak quickly",)),
        # A negation after the pace word negates something else: the pace is taken.
        ("Speak slowly with no emotion.", 0.8, ("Speak with no emotion",)),
        ("Read it quickly without pauses", 1.25, ("Read it without pauses",)),
        ("Take note: speak slowly", 0.8, ("Take note",)),
        # Two paces for one request: neither taken, both named.
        ("Speak slowly. Then speak quickly.", 1.0, ("Speak slowly", "speak quickly")),
        ("Speak very slowly and softly, then faster", 1.0, ("Speak very slowly", "softly", "faster")),
    ],
)
def test_read_instructions(instructions, pace, ignored):
    read = read_instructions(instructions)
    assert read.pace == pytest.approx(pace) and read.ignored == ignored


def test_models_voices_and_openai_voice_aliases(tenants_app, adapter_folders):
    client, store = tenants_app
    models = client.get("/v1/models", headers=ACME).json()
    assert models["object"] == "list" and {"chorus", "tts-1"} <= {m["id"] for m in models["data"]}
    voices = client.get("/v1/audio/voices", headers=ACME).json()
    assert {"m3", "f2", "ann", "bob", "alloy", "nova"} <= set(voices["voices"])
    assert "secret" not in voices["voices"]  # another tenant's voice
    # A voice adapted on another base is no name this server speaks (a probe of the Piper server had listed it);
    # the tenant's own list keeps it, saying so, and speech with it says why.
    assert "alien" not in voices["voices"] and "alien" not in {v["id"] for v in voices["data"]}
    own = {v["id"]: v for v in client.get("/v1/voices", headers=ACME).json()["data"] if v["type"] == "custom"}
    assert own["alien"]["this_base"] is False and own["ann"]["this_base"] is True
    assert store.voice("acme", "alien").base == "0" * 64 and store.voice("acme", "ann").base
    assert_error(speak(client, voice="alien"), 409, "made on base chorus")
    kinds = {v["id"]: v["kind"] for v in voices["data"]}
    assert kinds["ann"] == "custom" and kinds["alloy"] == "alias" and kinds["m3"] == "base"
    # The tiny base has none of the shipped base's speakers: every alias speaks as its default speaker.
    default = client.app.state.server.engine.bundle.default_speaker
    assert voices["aliases"]["alloy"] == default
    alloy, base = speak(client, voice="alloy"), speak(client, voice=default)
    assert alloy.status_code == 200 and alloy.content == base.content
    assert_error(client.get("/v1/models"), 401)
    # A tenant's own voice named like an alias comes first, for that tenant only.
    store.put_voice("globex", "nova", adapter_folders["bob"])
    try:
        globex_nova = speak(client, headers=GLOBEX, voice="nova")
        assert globex_nova.content == speak(client, headers=GLOBEX, voice="secret").content
        assert speak(client, voice="nova").content == base.content
    finally:
        store.delete_voice("globex", "nova")


def test_voice_names_are_case_insensitive_and_a_typo_gets_did_you_mean(tenants_app):
    client, _ = tenants_app
    assert speak(client, voice="Alloy").content == speak(client, voice="alloy").content
    assert speak(client, voice="ANN").content == speak(client, voice="ann").content
    assert speak(client, voice=" ann ").content == speak(client, voice="ann").content  # a copied name's spaces
    assert_error(speak(client, voice="alloi"), 404, "did you mean 'alloy'")
    nothing_close = speak(client, voice="qqqq")
    assert nothing_close.status_code == 404 and "did you mean" not in nothing_close.text
    # Suggestions come only from what the asking tenant may use: globex's "secret" is not offered to acme.
    refused = speak(client, voice="secrets")
    assert refused.status_code == 404 and "secret" not in refused.json()["error"]["message"].replace("secrets", "")
    assert_error(speak(client, headers=GLOBEX, voice="secrets"), 404, "did you mean 'secret'")
    # A name /v1/audio/voices lists is never "not found; did you mean" itself (a new user's probe: GET
    # /v1/audio/voices/alloy answered "voice 'alloy' not found; did you mean 'alloy'?").
    for route in ("/v1/audio/voices/", "/v1/voices/"):
        assert_error(client.get(route + "alloy", headers=ACME), 400, "'alloy' is OpenAI's name for the speaker")
    for name in ("m3", "M3"):
        assert_error(client.get(f"/v1/audio/voices/{name}", headers=ACME), 400, "'m3' is a speaker of the model")
        assert_error(client.delete(f"/v1/audio/voices/{name}", headers=ACME), 400, "not a stored voice")
    assert client.get("/v1/voices/M3", headers=ACME).json()["id"] == "m3"
    assert client.get("/v1/voices/ANN", headers=ACME).json()["id"] == "ann"


def test_a_voice_named_by_its_display_name_gets_its_id_suggested(tenants_app, adapter_folders):
    """A new user's probe: "Awb", the name `chorus voices list` shows for a voice, was "voice 'awb' not found"
    with no hint; requests name voices by id (OpenAI's custom voices too)."""
    client, store = tenants_app
    store.put_voice("acme", "voice_5a1e", adapter_folders["ann"], name="Awb")
    try:
        assert_error(speak(client, voice="Awb"), 404, "did you mean 'voice_5a1e'")
        refused = speak(client, headers=GLOBEX, voice="Awb")  # another tenant's voice is no suggestion
        assert refused.status_code == 404 and "voice_5a1e" not in refused.text
    finally:
        store.delete_voice("acme", "voice_5a1e")


def test_a_sample_voice_is_listed_with_its_stage_from_its_post_on(tiny_base, adapter_folders, tmp_path):
    """``GET /v1/audio/voices`` lists every name ``voice`` takes: a sample's voice speaks from its POST on
    (its instant voice), so it is listed from then on, with its stage; an upload of clips still training
    has nothing to speak yet."""
    app, store = make_app(tiny_base, tmp_path / "store", KEYS)
    with TestClient(app) as client:  # the jobs below are never submitted: they stay as they are put

        def listed() -> dict[str, str | None]:
            return {v["id"]: v.get("stage") for v in client.get("/v1/audio/voices", headers=ACME).json()["data"]}

        sample_job = store.create_job("acme", "voice_0123", name="Fiona", instant="m3(1)")
        store.create_job("acme", "clips", name="Clips")
        assert listed()["voice_0123"] == "instant" and "clips" not in listed()
        assert "voice_0123" in client.get("/v1/audio/voices", headers=ACME).json()["voices"]
        assert speak(client, voice="voice_0123").status_code == 200  # as listed: it speaks
        assert "voice_0123" not in client.get("/v1/audio/voices", headers=GLOBEX).json()["voices"]
        store.update_job(sample_job, status=JobStatus.FAILED, message="refinement did not improve")
        assert listed()["voice_0123"] == "instant"  # a failed refinement leaves the instant voice speaking
        store.put_voice("acme", "ann", adapter_folders["ann"])
        assert listed()["ann"] == "adapted" and listed()["m3"] is None
        store.delete_voice("acme", "voice_0123")
        assert "voice_0123" not in listed()


def test_given_voice_aliases_must_name_speakers_of_the_base(tiny_base, tmp_path):
    """--voice-aliases naming no speaker stops the start with the alias and the speakers (never the
    default speaker in its place); the built-in OpenAI names fall back on a base without theirs (above)."""
    for aliases, fragment in [
        ({"narrator": "flite-rms", "duet": "m3(1)+f2(1)"}, "'narrator' -> 'flite-rms': no such speaker. "),
        ({"m3": "f2"}, "'m3' is a speaker's own name. "),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)) as refused:
            make_app(tiny_base, tmp_path / "refused", settings=dataclasses.replace(SETTINGS, voice_aliases=aliases))
        assert "base's speakers: f2, m3" in str(refused.value) and "duet" not in str(refused.value)
    given = {"narrator": "f2", "duet": "m3(1)+f2(1)"}
    app, _ = make_app(tiny_base, tmp_path / "given", settings=dataclasses.replace(SETTINGS, voice_aliases=given))
    with TestClient(app) as client:
        assert client.get("/v1/audio/voices").json()["aliases"] == given
        assert speak(client, voice="narrator").content == speak(client, voice="f2").content
        assert speak(client, voice="duet").content == speak(client, voice="m3(1)+f2(1)").content
        assert_error(speak(client, voice="alloy"), 404, "not found")  # the given map replaces the built-in one


def library_speech(tiny_base, adapter_folders, voice: str, speed: float, text: str):
    """What ``Synthesizer.synthesize`` makes of ``text`` in ``voice`` (a speaker, a blend, or acme's ann)."""
    library = load_base(tiny_base, "griffin-lim")
    if voice == "ann":
        library.load_voice(adapter_folders["ann"], "ann")
        return library.synthesize(text, voice="ann", speed=speed)
    return library.synthesize(text, speaker=voice, speed=speed)


def assert_served_as_the_library(client, expected, text: str, voice: str, speed: float) -> None:
    """The speech route (pcm and flac) and the captioned route answer ``expected`` (the library's result for the
    same text, voice and speed) byte for byte and timestamp for timestamp."""
    rate = expected.sample_rate
    for audio_format in ("pcm", "flac"):
        served = speak(client, input=text, voice=voice, speed=speed, response_format=audio_format, sample_rate=rate)
        assert served.status_code == 200, served.text
        assert served.content == expected.to_bytes(audio_format, rate), audio_format
    captioned = client.post(
        "/v1/audio/speech/captioned",
        json={"model": "chorus", "input": text, "voice": voice, "speed": speed, "response_format": "pcm"},
        headers=ACME,
    ).json()
    assert [(w["text"], w["start"], w["end"]) for w in captioned["words"]] == [
        (w.text, w.start, w.end) for w in expected.words
    ]


@pytest.mark.parametrize(
    ("voice", "speed", "text"),
    [
        ("m3", 1.0, "Hello there. Good day to you."),
        ("m3(2)+f2(1)", 1.25, "Hello there. Good day to you."),
        ("ann", 0.8, '<speak>Hello there. <break time="300ms"/>Good day.</speak>'),
    ],
)
def test_the_library_and_the_server_give_the_same_samples(tenants_app, tiny_base, adapter_folders, voice, speed, text):
    """One synthesis path: ``Synthesizer.synthesize`` and ``/v1/audio/speech`` (streamed PCM, whole FLAC) and
    the captioned route give the same bytes and timestamps for the same text, voice and speed (each
    sentence in a forward of its own on both sides)."""
    client, _ = tenants_app
    expected = library_speech(tiny_base, adapter_folders, voice, speed, text)
    assert_served_as_the_library(client, expected, text, voice, speed)


@pytest.fixture(scope="module")
def piper_app(tmp_path_factory):
    """A server on the tiny Piper base: acme has ann, a voice adapted on it."""
    from chorus.synthesis.engine import Engine as LibraryEngine
    from chorus.training.piper_adapt import PLACEMENTS

    root = tmp_path_factory.mktemp("piper_server")
    ann = random_voice(tiny_piper_base(), "ann", PLACEMENTS["all"](), root / "voices" / "ann", 7)
    store = VoiceStore(str(root / "store"))
    engine = LibraryEngine(tiny_piper_base(), resolve=functools.partial(stored_voice_folder, store))
    store.put_voice("acme", "ann", ann)
    with TestClient(create_app(store, engine, Tenants.from_pairs(KEYS.items()), SETTINGS)) as client:
        yield client, ann


@pytest.mark.parametrize(
    ("voice", "speed", "text"),
    [
        ("tiny-piper", 1.0, "Hello there. Good day to you."),
        ("ann", 0.8, '<speak>Hello there. <break time="300ms"/>Good day.</speak>'),
    ],
)
def test_the_library_and_the_server_give_the_same_samples_on_the_piper_base(piper_app, voice, speed, text):
    """The same on the Piper base (one resident generator): its own voice and a voice adapted on it, whole,
    streamed and captioned."""
    client, ann = piper_app
    library = Synthesizer(tiny_piper_base())
    if voice == "ann":
        library.load_voice(ann, "ann")
        expected = library.synthesize(text, voice="ann", speed=speed)
    else:
        expected = library.synthesize(text, speaker=voice, speed=speed)
    assert_served_as_the_library(client, expected, text, voice, speed)


def test_a_server_on_the_piper_base_refuses_to_onboard_voices(piper_app):
    """Its voices are adapted offline (chorus adapt --base); the form is refused before it is read. A consent
    too: it was heard, kept and counted against the tenant's quota, for a voice that could never be made."""
    client, _ = piper_app
    for route in ("/v1/voices", "/v1/audio/voices", "/v1/audio/voice_consents"):
        assert_error(client.post(route, data={"id": "new"}, headers=ACME), 501, "onboarding trains on the Chorus base")


def test_sentences_batched_by_the_server_match_the_library_to_float_noise(tenants_app, tiny_base, adapter_folders):
    """A stream admits the sentences after the first together (one padded forward); the samples then
    agree with the library's to Griffin-Lim's amplified float noise, and the lengths exactly."""
    client, _ = tenants_app
    text = "Hello there. Good day to you. See you soon. Take care."
    expected = library_speech(tiny_base, adapter_folders, "ann", 1.0, text)
    served = speak(client, input=text, voice="ann", response_format="pcm", sample_rate=expected.sample_rate)
    got = np.frombuffer(served.content, dtype="<i2").astype(np.float32) / 32767
    want = np.frombuffer(expected.to_bytes("pcm", expected.sample_rate), dtype="<i2").astype(np.float32) / 32767
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=5e-3)


def test_ssml_breaks_in_speech_whole_and_streamed(tenants_app):
    client, _ = tenants_app
    plain = speak(client, input="Hello there. Good day.", response_format="pcm", sample_rate=22050).content
    ssml = '<speak>Hello there. <break time="1s"/>Good day.</speak>'
    whole = speak(client, input=ssml, response_format="pcm", sample_rate=22050).content
    # The break stands in place of the silence between sentences (as the library lays it out): 1 s more, less it.
    assert len(whole) - len(plain) == 2 * round(22050 * (1.0 - SENTENCE_SILENCE))
    streamed = speak(client, input=ssml, response_format="wav")  # several pieces: streamed
    assert (len(streamed.content) - 44) == len(whole)
    # An element Chorus does not follow is read as its text, and named (a new user's probe: a 400 for all of it).
    ignored = speak(client, input="<speak><emphasis>Hi</emphasis></speak>")
    assert ignored.status_code == 200 and ignored.headers["X-Skipped-Text"] == "<emphasis>"
    assert_error(speak(client, input='<speak><break time="abc"/>Hi</speak>'), 400, "give milliseconds or seconds")


def test_captioned_speech_gives_word_and_phoneme_times(tenants_app):
    client, _ = tenants_app
    body = {"input": '<speak>Hello there. <break time="500ms"/>Good day to you.</speak>', "voice": "ann"}
    answer = client.post("/v1/audio/speech/captioned", json=body | {"response_format": "wav"}, headers=ACME)
    assert answer.status_code == 200, answer.text
    captioned = answer.json()
    audio, rate = decode(base64.b64decode(captioned["audio"]))
    assert rate == captioned["sample_rate"] == 22050 and abs(len(audio) / rate - captioned["duration"]) < 1e-3
    words = captioned["words"]
    assert [w["text"] for w in words] == ["Hello", "there.", "Good", "day", "to", "you."]  # as written
    assert all(a["end"] <= b["start"] for a, b in zip(words, words[1:])) and words[-1]["end"] <= captioned["duration"]
    assert words[2]["start"] - words[1]["end"] >= 0.5  # the break lies between the sentences
    assert captioned["phonemes"][0]["text"] == "h" and len(captioned["phonemes"]) > len(words)
    assert_error(client.post("/v1/audio/speech/captioned", json={"voice": "ann"}, headers=ACME), 400, "'input'")


def test_a_blend_of_speakers_is_a_voice(tenants_app):
    client, _ = tenants_app
    blend = speak(client, voice="m3(2)+f2(1)")
    assert blend.status_code == 200 and blend.content not in (speak(client).content, speak(client, voice="f2").content)
    assert speak(client, voice="m3(1)").content == speak(client).content
    assert_error(speak(client, voice="m3+ann"), 400, "cannot be blended")


BAD_SPEECH = [
    ({"input": ""}, 400, "empty"),
    ({"input": "   "}, 400, "empty"),
    ({"input": "a" * 4097}, 400, "at most 4096"),
    ({"input": None}, 400, "'input' is required"),
    ({"input": 42}, 400, "'input' must be a string"),
    ({"input": "!!! ???"}, 400, "speakable"),
    ({"voice": "nobody"}, 404, "not found"),
    ({"voice": "secret"}, 404, "not found"),  # globex's voice, asked by acme
    ({"voice": "../x"}, 400, "invalid voice id"),
    ({"voice": "ANN!"}, 400, "invalid voice id"),
    ({"voice": ""}, 400, "'voice' is required"),
    ({"voice": None}, 400, "'voice' is required"),
    ({"response_format": "ogg"}, 400, "unsupported response_format"),
    ({"response_format": "m4a"}, 400, "unsupported response_format"),
    ({"response_format": 3}, 400, "unsupported response_format"),
    ({"speed": 0.1}, 400, "'speed'"),
    ({"speed": 4.5}, 400, "'speed'"),
    ({"speed": "fast"}, 400, "'speed'"),
    ({"speed": True}, 400, "'speed'"),
    ({"stream_format": "events"}, 400, "stream_format"),
    ({"instructions": 3}, 400, "'instructions' must be a string"),
    ({"instructions": "x" * 4097}, 400, "at most 4096"),  # was a 500: pydantic's error escaped
    ({"sample_rate": 4000}, 400, "'sample_rate'"),
    ({"sample_rate": 22050.5}, 400, "'sample_rate'"),
    ({"model": ["x"]}, 400, "'model'"),
    ({"model": "nope"}, 404, "'nope' does not exist: use one of chorus, tts-1, tts-1-hd, gpt-4o-mini-tts"),
    ({"model": "whisper-1"}, 404, "does not exist"),
    ({"response_format": ["wav"]}, 400, "unsupported response_format 'list'"),
    ({"response_format": {"type": "wav"}}, 400, "unsupported response_format 'dict'"),
    ({"voice": "alien"}, 409, "made on base chorus (sha256 000000000000...), not on this server's base chorus (sha256"),
]


def test_an_optional_field_sent_as_null_takes_its_default(tenants_app):
    """Clients that serialize unset options as null (JavaScript's, some SDKs') get the defaults, not a 400
    naming a Python type; null is still no input or voice."""
    client, _ = tenants_app
    nulls = dict.fromkeys(("response_format", "speed", "instructions", "stream_format", "sample_rate", "stream"))
    answer = speak(client, **nulls)
    assert answer.status_code == 200 and answer.headers["content-type"] == "audio/mpeg"
    assert answer.content == speak(client, response_format="mp3").content
    assert_error(speak(client, input=None), 400, "'input' is required")
    assert_error(speak(client, voice=None), 400, "'voice' is required")


@pytest.mark.parametrize("change, status, fragment", BAD_SPEECH, ids=[str(c)[:40] for c, _, _ in BAD_SPEECH])
def test_bad_speech_requests(tenants_app, change, status, fragment):
    client, _ = tenants_app
    body = {"model": "chorus", "input": "Hello there.", "voice": "m3"}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    assert_error(client.post("/v1/audio/speech", json=body, headers=ACME), status, fragment)


def test_bad_bodies_paths_and_methods(tenants_app):
    client, _ = tenants_app
    post = client.post
    json_header = ACME | {"Content-Type": "application/json"}
    assert_error(post("/v1/audio/speech", content=b"{bad", headers=json_header), 400, "not valid JSON")
    assert_error(post("/v1/audio/speech", content=b"[1, 2]", headers=json_header), 400, "JSON object")
    assert_error(
        post("/v1/audio/speech", content=b'{"input": "Hi.", "voice": "m3", "speed": NaN}', headers=json_header),
        400,
        "'speed'",
    )
    assert_error(
        post("/v1/audio/speech", content=b"input=hi", headers=ACME | {"Content-Type": "text/plain"}),
        415,
        "application/json",
    )
    assert_error(post("/v1/audio/speech", content=b" " * (70 << 10), headers=json_header), 413, "over")
    # Bodies past Python's own parser limits (recursion, int digits) are plain 400s, checked on the raw text.
    deep = b'{"input": "Hi.", "voice": "m3", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    assert_error(post("/v1/audio/speech", content=deep, headers=json_header), 400, "nested over 32 levels")
    huge = b'{"input": "Hi.", "voice": "m3", "speed": ' + b"9" * 5_000 + b"}"
    assert_error(post("/v1/audio/speech", content=huge, headers=json_header), 400, "number over 64 characters")
    # Brackets and digits inside strings are text, not structure.
    inside = json.dumps({"input": "[" * 100 + "9" * 100, "voice": "m3"}).encode()
    assert post("/v1/audio/speech", content=inside, headers=json_header).status_code == 200
    # The same words for a voice of another tenant and one that never existed.
    theirs, missing = (speak(client, voice=v).json()["error"] for v in ("secret", "nobody-at-all"))
    assert theirs["message"].replace("secret", "X") == missing["message"].replace("nobody-at-all", "X")
    assert theirs | {"message": ""} == missing | {"message": ""}
    assert assert_error(client.get("/v1/voices/secret", headers=ACME), 404) == "voice 'secret' not found"
    for path in ["/v1/voices/..%2F..%2Fetc", "/v1/voices/%2E%2E", "/v1/voices/Bad!Id", "/v1/voices/a%00b"]:
        response = client.get(path, headers=ACME)
        assert response.status_code in (400, 404) and "error" in response.json(), (path, response.text)
    assert_error(client.delete("/v1/voices/Bad!Id", headers=ACME), 400, "invalid voice id")
    assert_error(client.delete("/v1/voices/m3", headers=ACME), 400, "is a speaker")
    assert_error(client.delete("/v1/voices/secret", headers=ACME), 404, "not found")
    assert_error(client.get("/v1/jobs/../../etc", headers=ACME), 404)
    assert_error(client.get("/v1/jobs/" + "0" * 32, headers=ACME), 404, "not found")
    assert_error(client.get("/v1/nothing-here", headers=ACME), 404)
    assert_error(client.put("/v1/audio/speech", headers=ACME), 405)


def test_api_keys_and_tenant_isolation(tenants_app, adapter_folders):
    client, store = tenants_app
    for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}]:
        response = client.get("/v1/voices", headers=headers)
        assert_error(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
        assert_error(speak(client, headers=headers), 401)
    listed = {
        t: {v["id"]: v for v in client.get("/v1/voices", headers=h).json()["data"]}
        for t, h in [("acme", ACME), ("globex", GLOBEX)]
    }
    assert set(listed["acme"]) == {"m3", "f2", "ann", "bob", "alien"} and set(listed["globex"]) == {
        "m3",
        "f2",
        "ann",
        "secret",
    }
    assert listed["acme"]["m3"]["type"] == "base" and listed["acme"]["m3"]["default"] is True
    assert listed["acme"]["ann"]["status"] == "ready" and listed["acme"]["ann"]["type"] == "custom"
    assert client.get("/v1/voices/bob", headers=ACME).json()["status"] == "ready"
    assert_error(client.get("/v1/voices/bob", headers=GLOBEX), 404, "not found")
    # Each tenant's "ann" is its own voice.
    ours = decode(speak(client, ACME, voice="ann").content)[0]
    theirs = decode(speak(client, GLOBEX, voice="ann").content)[0]
    assert not (len(ours) == len(theirs) and np.allclose(ours, theirs))
    assert client.get("/v1/voices/ann", headers=ACME).json()["resident"] is True
    # Deleting: another tenant cannot; the owner can, and then the voice is gone at once.
    store.put_voice("acme", "to-delete", adapter_folders["bob"])
    assert speak(client, voice="to-delete").status_code == 200
    assert_error(client.delete("/v1/voices/to-delete", headers=GLOBEX), 404)
    assert client.delete("/v1/voices/to-delete", headers=ACME).json() == {
        "id": "to-delete",
        "object": "voice.deleted",
        "deleted": True,
    }
    assert_error(speak(client, voice="to-delete"), 404, "not found")
    assert_error(client.get("/v1/voices/to-delete", headers=ACME), 404)
    assert not any(key.startswith("acme/to-delete@") for key in client.app.state.server.engine.resident())


def test_voices_not_ready_or_corrupted_are_refused(tenants_app, adapter_folders):
    client, store = tenants_app
    store.create_job("acme", "pending", name="Pending")
    pending = speak(client, voice="pending")
    assert_error(pending, 409, "still training")
    assert pending.headers["x-should-retry"] == "false"  # OpenAI's SDK retries a 409 twice unless told not to
    assert client.get("/v1/voices/pending", headers=ACME).json()["status"] == "training"
    store.put_voice("acme", "broken", adapter_folders["bob"])
    weights = Path(store.root) / "acme" / "broken" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))
    assert_error(speak(client, voice="broken"), 409, "checksum")
    shown = client.get("/v1/voices/broken", headers=ACME).json()
    assert shown["status"] == "failed" and "checksum" in shown["error"] and "pytest-of" not in shown["error"]
    assert_error(speak(client, voice="broken"), 409, "is failed")
    for voice in ("pending", "broken"):
        assert client.delete(f"/v1/voices/{voice}", headers=ACME).status_code == 200


def test_internal_errors_are_logged_not_shown(tenants_app, monkeypatch, caplog):
    client, store = tenants_app

    def broken(tenant):
        raise RuntimeError("database exploded at /secret/path/store.sqlite3")

    monkeypatch.setattr(store, "list_voices", broken)
    raw = TestClient(client.app, raise_server_exceptions=False)
    response = raw.get("/v1/voices", headers=ACME)
    assert_error(response, 500, "internal server error")
    assert "secret" not in response.text and "exploded" not in response.text
    assert any("exploded" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# -- onboarding --------------------------------------------------------------------------------------
def silence_wav(seconds: float, value: float = 0.1) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.full(int(22050 * seconds), value, np.float32), 22050, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


CONSENT = "Ann Example consented in writing on 2024-05-01 to a synthetic voice made from these recordings."


def test_upload_refusals(tenants_app, new_voice_data):
    client, store = tenants_app
    files, transcripts = clip_files(new_voice_data)
    form = {"name": "New voice", "consent": CONSENT, "transcripts": transcripts}

    def upload(data=form, upload_files=files, headers=ACME):
        return client.post("/v1/voices", data=data, files=upload_files, headers=headers)

    assert_error(upload({k: v for k, v in form.items() if k != "consent"}), 400, "'consent' is required")
    # A new user's probe: a short statement was told that none was given
    assert_error(upload(form | {"consent": "yes"}), 400, "'consent' has 3 characters, at least 10 are needed")
    assert_error(upload({k: v for k, v in form.items() if k != "name"}), 400, "'name'")
    assert_error(upload(form | {"id": "../evil"}), 400, "invalid voice id")
    assert_error(upload(form | {"name": "!!!"}), 400, "the name '!!!' has no letter or digit")
    assert_error(upload(form | {"id": "m3"}), 409, "is a speaker")
    assert_error(upload(form | {"id": "ann"}), 409, "exists already")
    # A clip the job could not train on is left out and named (below); alone, it leaves nothing to train on.
    first = files[0][1][0]

    def alone(data: bytes):
        clip = [("clips", (first, data, "audio/wav"))]
        return upload(form | {"transcripts": json.dumps({first: json.loads(transcripts)[first]})}, upload_files=clip)

    def refused(data: bytes, status: int, why: str) -> None:
        message = assert_error(alone(data), status, f"no clip in the upload can be trained on: {first}: ")
        assert why.lower() in message.lower(), message

    refused(b"this is not audio at all", 415, "not a readable audio file")
    refused(b"", 400, "empty file")
    refused(silence_wav(0), 400, "zero-length")
    refused(silence_wav(2, 0.0), 400, "silent")
    # A phone line's 8 kHz: the job's data check would refuse the clip after the upload was taken.
    audio, rate = sf.read(io.BytesIO(files[0][1][1]), dtype="float32")
    phone = io.BytesIO()
    sf.write(phone, soxr.resample(audio, rate, 8_000), 8_000, format="WAV")
    refused(phone.getvalue(), 400, f"{first}: recorded at 8000 Hz; at least 16000 Hz")
    # A clip recorded far too quietly is named, not summed as 0 s of speech.
    hushed = io.BytesIO()
    sf.write(hushed, audio * (10 ** (-50 / 20) / np.abs(audio).max()), rate, format="WAV")
    refused(hushed.getvalue(), 400, f"{first}: no speech heard (rms")
    # A tone as loud as speech: a voice-activity detector hears none in it, and the job would leave it out.
    tone = io.BytesIO()
    sf.write(tone, 0.3 * np.sin(2 * np.pi * 220 * np.arange(2 * rate) / rate), rate, format="WAV")
    refused(tone.getvalue(), 400, f"{first}: no speech heard (a voice-activity detector hears")
    for other in (-1.0, -0.97):  # one channel the other inverted, or nearly: the mix is silent or near it
        inverted = io.BytesIO()
        sf.write(inverted, np.stack([audio, other * audio], axis=1), rate, format="WAV")
        refused(inverted.getvalue(), 400, f"{first}: its channels cancel when mixed to mono")
    assert_error(upload(upload_files=files[1:]), 400, "transcripts without a clip")
    assert_error(upload(form | {"transcripts": json.dumps({"x.wav": "Hi."})}), 400, "no transcript")
    three = {name: text for name, text in list(json.loads(transcripts).items())[:3]}
    assert_error(upload(form | {"transcripts": json.dumps(three)}, upload_files=files[:3]), 400, "at least 25 s")
    # What was left out is named beside too little speech: it may be why.
    toned = [*files[:3], ("clips", ("tone.wav", tone.getvalue(), "audio/wav"))]
    message = assert_error(
        upload(form | {"transcripts": json.dumps({**three, "tone.wav": "Hello."})}, upload_files=toned),
        400,
        "at least 25 s",
    )
    assert "; left out: tone.wav: no speech heard (a voice-activity detector hears" in message, message
    # Six clips in 4 s of silence each: over 25 s of audio, about 15 s of speech, which the job would refuse.
    padded = []
    for _, (name, data, kind) in files[:6]:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        silence = np.zeros(2 * rate, np.float32)
        buffer = io.BytesIO()
        sf.write(buffer, np.concatenate([silence, audio, silence]), rate, format="WAV")
        padded.append(("clips", (name, buffer.getvalue(), kind)))
    six = {name: text for name, text in list(json.loads(transcripts).items())[:6]}
    assert_error(upload(form | {"transcripts": json.dumps(six)}, upload_files=padded), 400, "s of speech (")
    too_many = [("clips", (f"c{i}.wav", b"x", "audio/wav")) for i in range(41)]
    assert_error(
        upload(form | {"transcripts": json.dumps({f"c{i}.wav": "Hi." for i in range(41)})}, upload_files=too_many),
        413,
        "at most 40",
    )
    archive = [("archive", ("voice.zip", b"PK nonsense", "application/zip"))]
    assert_error(upload(upload_files=files + archive), 400, "not both")
    assert_error(upload(upload_files=archive), 415, "not a zip")
    assert_error(upload(upload_files=[("archive", ("big.zip", bytes(9 << 20), "application/zip"))]), 413, "at most")
    assert_error(client.post("/v1/voices", json={"name": "x", "consent": CONSENT}, headers=ACME), 415, "multipart")
    assert_error(upload(headers={}), 401)
    assert [v.voice_id for v in store.list_voices("acme")] == ["alien", "ann", "bob"]  # nothing half-made
    jobs_dir = client.app.state.server.jobs.jobs_dir
    assert [p.name for p in jobs_dir.iterdir() if p.is_dir()] == []


def tone(seconds: float, audio_format: str = "WAV", subtype: str = "PCM_16", rate: int = 16_000) -> bytes:
    """``seconds`` of a 220 Hz tone as an audio file's bytes."""
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format=audio_format, subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("seconds", "audio_format", "subtype"),
    [(31, "WAV", "PCM_16"), (600, "FLAC", "PCM_16"), (600, "MP3", "MPEG_LAYER_III")],
)
def test_a_sample_over_30_s_is_refused_from_its_length_before_decoding(
    tenants_app, monkeypatch, seconds, audio_format, subtype
):
    """OpenAI takes samples of up to 30 s: a longer one is refused from the length its file declares (10
    minutes of MP3 held a request 43 s when decoded), pointing to Chorus's onboarding of longer recordings."""
    client, store = tenants_app
    consent = store.create_consent(
        "acme", name="Acme", language="en", heard="...", word_error_rate=0.0, embedding=[1.0], recording=b"RIFF"
    ).consent_id

    def no_decoding(*args, **kwargs):
        raise AssertionError("the sample was decoded")

    monkeypatch.setattr(uploads.sf, "read", no_decoding)
    monkeypatch.setattr(uploads, "decode_with_av", no_decoding)
    try:
        response = client.post(
            "/v1/audio/voices",
            data={"name": "Long", "consent": consent},
            files={"audio_sample": (f"long.{audio_format.lower()}", tone(seconds, audio_format, subtype))},
            headers=ACME,
        )
        message = assert_error(response, 400, "POST /v1/voices")
        assert f"lasts {seconds:.1f} s; at most 30 s" in message, message
        assert response.json()["error"]["param"] == "audio_sample"
        assert response.json()["error"]["code"] == "sample_too_long"
        assert [v.voice_id for v in store.list_voices("acme")] == ["alien", "ann", "bob"]  # nothing made
    finally:
        store.delete_consent("acme", consent)


def test_a_recording_longer_than_its_file_declares_is_refused_once_decoding_passes_the_bound(monkeypatch):
    """Where a container understates its length (an MP3's is estimated where it has no length header), the
    duration check at the end would come after decoding all of it: decoding stops one frame past the bound."""
    real_info, real_read, read = uploads.sf.info, uploads.sf.read, []

    def understated(file):
        info = real_info(file)
        info.frames = 20 * info.samplerate
        return info

    def counted(*args, **kwargs):
        audio, rate = real_read(*args, **kwargs)
        read.append(len(audio))
        return audio, rate

    monkeypatch.setattr(uploads.sf, "info", understated)
    monkeypatch.setattr(uploads.sf, "read", counted)
    with pytest.raises(RecordingTooLong, match="or more; a clip may last at most 30 s") as refused:
        uploads.decode_recording("sample", tone(300), 30.0, UploadLimits())
    assert read == [30 * 16_000 + 1] and refused.value.longest == 30.0
    assert uploads.decode_recording("sample", tone(30), 30.0, UploadLimits())[0].shape == (30 * 16_000,)


def test_a_server_without_keys_answers_only_loopback_hosts_and_its_own_origin(tiny_base, tmp_path):
    """A security probe of a server without keys: any web page could POST a consent (multipart needs no
    preflight) or text to Piper's route, and through DNS rebinding (its own name resolving to 127.0.0.1) list
    and delete the user's voices. ``chorus serve`` without keys now refuses another Host or Origin."""
    store = VoiceStore(str(tmp_path / "store"))
    engine = Engine.load(tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store))
    app = create_app(store, engine, Tenants(), SETTINGS, loopback_only=True)
    with TestClient(app, base_url="http://127.0.0.1:8000") as local:
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost", "LOCALHOST.:8000"):
            assert local.get("/v1/voices", headers={"Host": host}).status_code == 200, host
        assert local.get("/v1/voices", headers={"Origin": "http://127.0.0.1:8000"}).status_code == 200
        rebound = local.get("/v1/voices", headers={"Host": "rebind.attacker.example:8000"})
        assert_error(rebound, 403, "only requests to a loopback host")
        for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example"):
            cross = local.post(
                "/", content=b"Hello from a web page.", headers={"Origin": origin, "Content-Type": "text/plain"}
            )
            assert_error(cross, 403, "no requests from another site")
    unguarded, _ = make_app(tiny_base, tmp_path / "store-2")
    with TestClient(unguarded, base_url="http://127.0.0.1:8000") as keyless:
        assert keyless.get("/v1/voices", headers={"Host": "testserver"}).status_code == 200  # off unless asked


def test_an_upload_is_bounded_by_the_bytes_that_arrive_not_by_its_content_length():
    """A chunked body under `Content-Length: 1000` was read whole to disk before any size check (a probe held 1.5 GB
    on one request): reading stops once the route's limit is passed."""
    import asyncio

    from starlette.requests import Request

    from chorus.serving.errors import ApiError
    from chorus.serving.onboarding.upload_form import read_multipart

    sent = []
    head = b'--b\r\nContent-Disposition: form-data; name="recording"; filename="x.wav"\r\n\r\n'

    async def receive():
        sent.append(1 << 20)  # 64 MiB offered, far past the 10 MiB asked for
        return {
            "type": "http.request",
            "body": (head if len(sent) == 1 else b"") + b"\0" * (1 << 20),
            "more_body": len(sent) < 64,
        }

    headers = [(b"content-type", b"multipart/form-data; boundary=b"), (b"content-length", b"1000")]
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)
    with pytest.raises(ApiError, match=r"over 10\.0 MiB \(10,485,760 bytes\)") as refused:
        asyncio.run(read_multipart(request, 10 << 20, 1, "a recording"))
    assert refused.value.status == 413 and sum(sent) <= 11 << 20, f"{sum(sent) >> 20} MiB read"


def test_sizes_in_refusals_read_as_a_person_reads_them():
    """The web page's probe: "the upload is 40000403 bytes; at most 10551296"."""
    from chorus.serving.errors import in_bytes

    assert in_bytes(40_000_403) == "38.1 MiB (40,000,403 bytes)" and in_bytes(10 << 20) == "10.0 MiB (10,485,760 bytes)"
    assert in_bytes(2_500) == "2.4 KiB (2,500 bytes)" and in_bytes(900) == "900 bytes" and in_bytes(1) == "1 byte"
    assert (
        in_bytes((1 << 20) - 50) == "1.0 MiB (1,048,526 bytes)" and in_bytes(3 << 30) == "3.0 GiB (3,221,225,472 bytes)"
    )


def test_a_server_that_stops_leaves_no_copy_of_espeak_behind(tiny_base, tmp_path):
    """phonemizer copies libespeak-ng into the temporary folder per backend; an exit collects none of them (an
    uploads probe found one folder left per server run)."""
    from chorus.text.phonemize import _backend

    app, _ = make_app(tiny_base, tmp_path / "store")
    with TestClient(app) as client:
        assert speak(client, headers={}).status_code == 200
        copy = _backend("en-us")._espeak._espeak._tempdir
        assert Path(copy).is_dir()
    assert not Path(copy).exists()


def test_the_voice_list_pages_as_openais_lists_do_when_asked(tenants_app):
    """1,011 voices were one 267 KB answer, and `limit` and `after` were ignored without a word (a probe at scale)."""
    client, _ = tenants_app
    whole = client.get("/v1/voices", headers=ACME).json()
    ids = [voice["id"] for voice in whole["data"]]
    assert ids[-2:] == ["ann", "bob"] and whole["has_more"] is False  # speakers, then the tenant's voices
    paged, after = [], None
    while True:
        page = client.get("/v1/voices", params={"limit": 3} | ({"after": after} if after else {}), headers=ACME).json()
        paged += [voice["id"] for voice in page["data"]]
        assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert paged == ids
    assert_error(client.get("/v1/voices", params={"limit": 0}, headers=ACME), 400, "'limit' must be 1-1000")
    # A cursor deleted meanwhile ("list and delete" loops) goes on from where it stood: after "azure", bob
    assert [v["id"] for v in client.get("/v1/voices", params={"after": "azure"}, headers=ACME).json()["data"]] == [
        "bob"
    ]


def test_headers_over_the_bound_are_refused_before_any_route_or_key_check(tenants_app):
    """What h11 lets through when a head arrives whole (and Ray's server, which is not h11) meets the same bound."""
    from chorus.serving.header_bound import MAX_HEADER_BYTES

    client, _ = tenants_app
    just_under = {"X-A": "a" * (MAX_HEADER_BYTES - 500)}
    assert client.get("/v1/models", headers={**ACME, **just_under}).status_code == 200
    over = {"X-A": "a" * MAX_HEADER_BYTES}
    for headers in (over, {**ACME, **over}):  # with no key and with one: refused alike
        assert_error(client.get("/v1/models", headers=headers), 431, f"at most {MAX_HEADER_BYTES:,}")


def test_a_page_on_another_port_of_this_machine_may_call_the_api_and_another_site_may_not(tenants_app):
    """A new user's probe: the docs said a page on another local port is not another site, but no preflight
    was answered (405) and no answer carried CORS headers, so a local web app could not use the server."""
    client, _ = tenants_app
    for origin in ("http://localhost:3000", "http://127.0.0.1:5173", "https://[::1]:8443"):
        asked = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        sdk = "authorization, content-type, x-stainless-os, openai-organization"  # what OpenAI's JS SDK asks
        preflight = client.options("/v1/audio/speech", headers=asked | {"Access-Control-Request-Headers": sdk})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == origin
        answer = speak(client, headers=ACME | {"Origin": origin})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
        assert {"X-Sample-Rate", "x-should-retry"} <= set(answer.headers["access-control-expose-headers"].split(", "))
    for origin in ("http://evil.example", "http://localhost.evil.example", "null"):
        preflight = client.options(
            "/v1/audio/speech", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code == 400 and "access-control-allow-origin" not in preflight.headers
        assert "access-control-allow-origin" not in speak(client, headers=ACME | {"Origin": origin}).headers
    assert_error(speak(client, headers={"Origin": "http://localhost:3000"}), 401)  # keys still apply


def test_recordings_are_checked_a_few_at_once_and_the_rest_refused_past_the_queue(
    tiny_base, custom_voice_recordings, tmp_path
):
    """A security probe: refused consents cost no quota, and each ran Whisper (seconds of CPU) as soon as it
    came, however many came at once. A server checks ``max_concurrent_checks`` at once, queues
    ``max_waiting_checks`` more, and answers the rest 429 with Retry-After."""
    from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
    from chorus.serving.quotas import CheckSlots
    from conftest import heard_as

    entered, release = threading.Event(), threading.Event()

    def slow_whisper(audio, rate, beam):
        entered.set()
        assert release.wait(60)
        return heard_as(SETTINGS.consent.phrases["en"], audio, rate)

    store = VoiceStore(str(tmp_path / "store"))
    engine = Engine.load(tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store))
    checks = CustomVoiceChecks(engine, SETTINGS.consent, transcriber=slow_whisper)
    app = create_app(store, engine, Tenants.from_pairs(KEYS.items()), SETTINGS, custom_voices=checks)
    recording = Path(custom_voice_recordings["consent"]).read_bytes()

    def post_consent():
        files = {"recording": ("consent.wav", recording, "audio/wav")}
        return client.post("/v1/audio/voice_consents", data={"name": "F", "language": "en"}, files=files, headers=ACME)

    with TestClient(app) as client:
        assert app.state.server.check_slots.running == SETTINGS.consent.max_concurrent_checks
        app.state.server.check_slots = CheckSlots(1, 0)  # one at a time, none waiting
        first: list = []
        worker = threading.Thread(target=lambda: first.append(post_consent()))
        worker.start()
        try:
            assert entered.wait(60)
            busy = post_consent()
            assert_error(busy, 429, "checking as many recordings as it can at once")
            assert busy.headers["Retry-After"] == "5"
        finally:
            release.set()
            worker.join(60)
        assert first[0].status_code == 200, first[0].text
        assert post_consent().status_code == 200  # the turn was given back


def test_check_slots_queue_in_order_refuse_past_the_queue_and_forget_a_cancelled_waiter():
    import asyncio

    from chorus.serving.errors import ApiError
    from chorus.serving.quotas import CheckSlots

    async def scenario():
        slots, order, release = CheckSlots(1, 1), [], asyncio.Event()

        async def hold():
            async with slots.turn("acme"):
                order.append("first")
                await release.wait()

        async def queued():
            async with slots.turn("acme"):
                order.append("second")

        first = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(queued())
        await asyncio.sleep(0)
        with pytest.raises(ApiError, match="checking as many recordings"):  # one running, one waiting: full
            async with slots.turn("acme"):
                pass
        waiter.cancel()  # a client gone while queued: its place in the queue is free again
        await asyncio.gather(waiter, return_exceptions=True)
        second = asyncio.create_task(queued())
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, second)
        assert order == ["first", "second"]

    asyncio.run(scenario())
    with pytest.raises(ValueError):
        CheckSlots(0, 1)


def test_check_slots_skip_a_client_gone_while_queued_and_serve_every_event_loop():
    """A review: a client that hung up while queued was still checked (seconds of CPU for no one) when its turn
    came; and the turns, an ``asyncio.Semaphore``, bound to the first event loop that waited on them, so an app
    that outlived its loop (one ``TestClient`` after another) failed its first queued check."""
    import asyncio

    from chorus.serving.errors import ApiError
    from chorus.serving.quotas import CheckSlots

    slots = CheckSlots(1, 2)

    async def scenario():
        ran, release = [], asyncio.Event()

        async def hold():
            async with slots.turn("acme"):
                ran.append("first")
                await release.wait()

        async def queued(name, gone):
            async def asked():
                return gone

            async with slots.turn("acme", asked):
                ran.append(name)

        first = asyncio.create_task(hold())
        await asyncio.sleep(0)
        hung_up = asyncio.create_task(queued("hung up", True))
        waiting = asyncio.create_task(queued("waiting", False))
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(first, hung_up, waiting, return_exceptions=True)
        assert ran == ["first", "waiting"]
        assert isinstance(results[1], ApiError) and results[1].status == 499 and results[1].code == "client_gone"
        async with slots.turn("acme"):  # every turn was given back
            pass

    asyncio.run(scenario())
    asyncio.run(scenario())  # a second event loop, the same slots


def test_check_slots_give_one_tenant_its_share_and_no_more():
    """A security probe: ten parallel consents from one key filled every place (2 running, 8 waiting) and
    every other tenant was answered 429. A tenant holds at most ``per_tenant`` places, running or waiting."""
    import asyncio

    from chorus.serving.errors import ApiError
    from chorus.serving.quotas import CheckSlots

    async def scenario():
        slots, release, ran = CheckSlots(1, 8, per_tenant=2), asyncio.Event(), []

        async def check(tenant):
            async with slots.turn(tenant):
                ran.append(tenant)
                await release.wait()

        held = [asyncio.create_task(check("ann")), asyncio.create_task(check("ann"))]
        await asyncio.sleep(0)
        with pytest.raises(
            ApiError, match="2 of your recordings are being checked or waiting .at most 2 at once."
        ) as busy:
            async with slots.turn("ann"):
                pass
        assert busy.value.status == 429 and busy.value.headers["Retry-After"] == "5"
        other = asyncio.create_task(check("bob"))  # another tenant still finds a place in the queue
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*held, other)
        assert ran == ["ann", "ann", "bob"]
        async with slots.turn("ann"):  # ann's places were given back
            pass

    asyncio.run(scenario())


def test_a_tenant_at_its_consent_quota_is_refused_before_its_recording_is_checked(
    tiny_base, custom_voice_recordings, tmp_path
):
    """A security probe: a tenant over its consent quota still had each recording decoded and heard (1.3-3.7 s
    of CPU) before the 429. The quota is read before the upload is."""
    from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
    from conftest import heard_as

    heard = []

    def whisper(audio, rate, beam):
        heard.append(len(audio))
        return heard_as(SETTINGS.consent.phrases["en"], audio, rate)

    settings = dataclasses.replace(
        SETTINGS, limits=dataclasses.replace(SETTINGS.limits, tenant=TenantLimits(consents=1))
    )
    store = VoiceStore(str(tmp_path / "store"))
    engine = Engine.load(tiny_base, "griffin-lim", resolve=functools.partial(stored_voice_folder, store))
    checks = CustomVoiceChecks(engine, settings.consent, transcriber=whisper)
    app = create_app(store, engine, Tenants.from_pairs(KEYS.items()), settings, custom_voices=checks)
    files = {"recording": ("consent.wav", Path(custom_voice_recordings["consent"]).read_bytes(), "audio/wav")}
    with TestClient(app) as client:
        first = client.post("/v1/audio/voice_consents", data={"name": "F", "language": "en"}, files=files, headers=ACME)
        assert first.status_code == 200, first.text
        listened = len(heard)
        full = client.post("/v1/audio/voice_consents", data={"name": "G", "language": "en"}, files=files, headers=ACME)
        assert_error(full, 429, "you keep 1 consent recording (at most 1)")
        # A full quota answers the same however often it is asked: OpenAI's SDK is told not to retry it.
        assert full.json()["error"]["code"] == "consent_quota_exceeded" and full.headers["x-should-retry"] == "false"

    # Over the size: said as the documented file limit and the room for fields ("at most 10.1 MiB" had read as
    # another limit than the 10 MiB the docs give).
    settings = dataclasses.replace(settings, consent=dataclasses.replace(settings.consent, max_file_bytes=10 << 20))
    store = VoiceStore(str(tmp_path / "store-2"))  # the first app's closed with it
    app = create_app(store, engine, Tenants.from_pairs(KEYS.items()), settings, custom_voices=checks)
    with TestClient(app) as client:
        large = {"recording": ("consent.wav", bytes(11 << 20), "audio/wav")}
        big = client.post("/v1/audio/voice_consents", data={"name": "H", "language": "en"}, files=large, headers=GLOBEX)
        assert_error(
            big, 413, "at most 10.1 MiB (10,551,296 bytes): a file of 10.0 MiB (10,485,760 bytes) and 64.0 KiB"
        )
        assert len(heard) == listened  # not heard at all


def test_a_clip_of_many_channels_at_a_high_rate_is_refused_before_it_is_decoded(monkeypatch):
    """A security probe's FLAC: one steady value in 8 channels at 192 kHz, 94 KB a minute, decoded whole to 1.1 GB
    a minute (3.95 GB of server memory for 3 minutes). Samples past a stereo 48 kHz recording of the longest
    clip are refused from the header; a stream that understates its length, one frame past that budget."""
    read = []
    real_read = uploads.sf.read

    def counted(*args, **kwargs):
        read.append(kwargs.get("frames"))
        return real_read(*args, **kwargs)

    monkeypatch.setattr(uploads.sf, "read", counted)
    surround = io.BytesIO()
    sf.write(surround, np.full((192_000 * 20, 8), 0.25, dtype=np.float32), 192_000, format="FLAC")
    with pytest.raises(UploadError, match="8 channel.s. at 192000 Hz hold more samples than a clip may decode to"):
        uploads.decode_recording("bomb.flac", surround.getvalue(), 30.0, UploadLimits())
    assert read == []  # refused from its header
    padded = surround.getvalue() + bytes(10 << 20)  # the file's size moves nothing: the budget is the server's
    with pytest.raises(UploadError, match="hold more samples"):
        uploads.decode_recording("bomb.flac", padded, 30.0, UploadLimits())
    understated = uploads.sf.info

    def shorter(file):
        info = understated(file)
        info.frames = 192_000
        return info

    monkeypatch.setattr(uploads.sf, "info", shorter)
    with pytest.raises(UploadError, match="hold more samples"):
        uploads.decode_recording("bomb.flac", surround.getvalue(), 30.0, UploadLimits())
    assert read == [60 * 2 * 192_000 // 8 + 1]  # a minute of stereo at 192 kHz, in 8 channels
    # FFmpeg's path (a WebM or AAC file) stops at the same budget.
    with pytest.raises(AudioTooDense):
        decode_with_av(io.BytesIO(surround.getvalue()), max_seconds=30.0, max_samples=10 * 96_000)
    # A minute of stereo at the highest rate the limits take is always decoded: a 12 s stereo WAV at 96 kHz, past
    # what a stereo 48 kHz recording of the longest clip here (20 s) holds. A bomb padded to look its size is not
    # (a review: a budget by the file's size let a FLAC with a 10 MB PADDING block decode to 83 M samples).
    studio = io.BytesIO()
    sf.write(studio, np.sin(np.arange(96_000 * 12)[:, None] * [0.01, 0.013]).astype(np.float32), 96_000, format="WAV")
    assert uploads.decode_recording("studio.wav", studio.getvalue(), 20.0, UploadLimits())[1] == 96_000
    stereo = io.BytesIO()  # a stereo clip at 48 kHz as long as a clip may be is decoded as before
    sf.write(stereo, np.sin(np.arange(48_000 * 30)[:, None] * [0.05, 0.07]).astype(np.float32), 48_000, format="FLAC")
    assert uploads.decode_recording("ok.flac", stereo.getvalue(), 30.0, UploadLimits())[0].shape == (48_000 * 30,)


def wait_for_job(client, job_id: str, headers: dict, timeout: float = 120.0) -> list[dict]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        seen.append(job)
        if job["status"] in ("done", "failed"):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {seen[-1]} after {timeout} s")


def test_onboarding_end_to_end_single_tenant(tiny_base, new_voice_data, tmp_path):
    app, store = make_app(tiny_base, tmp_path / "store")
    files, transcripts = clip_files(new_voice_data)
    # A 17th clip recorded far too loud: the job leaves it out, and says so where its uploader reads.
    audio, rate = sf.read(io.BytesIO(files[0][1][1]), dtype="float32")
    loud = io.BytesIO()
    sf.write(loud, np.clip(audio * 40, -1, 1), rate, format="WAV")
    files = [*files, ("clips", ("loud.wav", loud.getvalue(), "audio/wav"))]
    # An 18th, a tone: no speech in it; the upload leaves it out at once, and says so in its answer.
    tone = io.BytesIO()
    sf.write(tone, 0.3 * np.sin(2 * np.pi * 220 * np.arange(2 * rate) / rate), rate, format="WAV")
    files = [*files, ("clips", ("tone.wav", tone.getvalue(), "audio/wav"))]
    said = json.loads(transcripts)[files[0][1][0]]
    transcripts = json.dumps({**json.loads(transcripts), "loud.wav": said, "tone.wav": said})
    with TestClient(app) as client:
        assert client.get("/healthz").json()["tenancy"] == "single"
        created = client.post(
            "/v1/voices", files=files, data={"name": "Fiona Four", "consent": CONSENT, "transcripts": transcripts}
        )
        assert created.status_code == 202, created.text
        job = created.json()
        assert job["voice"] == "fiona-four" and job["clips"] == 17 and created.headers["location"].endswith(job["id"])
        assert len(job["left_out"]) == 1, job["left_out"]
        assert job["left_out"][0].startswith("tone.wav: no speech heard (a voice-activity detector hears"), job
        listed = {v["id"]: v for v in client.get("/v1/voices").json()["data"]}
        assert listed["fiona-four"]["status"] in ("training", "ready")
        assert client.get("/v1/audio/voices/fiona-four").json()["stage"] in ("training", "adapted")  # not "instant"
        history = wait_for_job(client, job["id"], {})
        assert history[-1]["status"] == "done" and history[-1]["progress"] == 1.0, history[-1]
        assert "clips left out: 1 (1 clipped)" in history[-1]["message"], history[-1]
        progress = [h["progress"] for h in history]
        assert progress == sorted(progress)
        assert client.get("/v1/voices/fiona-four").json()["status"] == "ready"
        # OpenAI's route names it as what it is (it was "audio_sample", made from no sample, with no consent)
        as_openai = client.get("/v1/audio/voices/fiona-four").json()
        assert (as_openai["type"], as_openai["stage"], as_openai["consent"]) == ("custom", "adapted", None)
        audio, rate = decode(speak(client, {}, voice="fiona-four").content)
        assert rate == 22050 and len(audio) > 0
        assert_error(
            client.post(
                "/v1/voices", files=files, data={"name": "Fiona Four", "consent": CONSENT, "transcripts": transcripts}
            ),
            409,
            "exists",
        )
        metrics = client.get("/metrics").text
        assert "chorus_cache_loads_total 1.0" in metrics
        assert "# HELP chorus_batcher_requests_total Speech requests the batcher was given" in metrics
        # By tenant (an operator's probe: there was none): requests, speech, and jobs ended (counted once the
        # job's end is read back, just after the job reports it)
        assert 'chorus_tenant_requests_total{status="202",tenant="default"} 1.0' in metrics
        assert 'chorus_tenant_requests_total{status="409",tenant="default"} 1.0' in metrics
        assert 'chorus_speech_characters_total{tenant="default"} 12.0' in metrics  # "Hello there."
        wait_for(
            lambda: (
                'chorus_onboarding_jobs_ended_total{status="done",tenant="default"} 1.0' in client.get("/metrics").text
            ),
            60,
            "the job's end is counted",
        )
    consent = [json.loads(line) for line in (tmp_path / "store" / ".jobs" / "consent.jsonl").read_text().splitlines()]
    assert consent[0]["statement"] == CONSENT and consent[0]["voice_id"] == "fiona-four"
    # ... and in the store's database, which backups and migrations carry (the jsonl is this machine's log)
    with VoiceStore(str(tmp_path / "store")) as reopened:
        (kept,) = reopened.consent_audit("default")
    assert {k: v for k, v in kept.items() if k != "created"} == {k: v for k, v in consent[0].items() if k != "time"}
    assert consent[0]["clips"] == 17 and consent[0]["left_out"] == job["left_out"]  # the audit says what was kept
    assert not [p for p in (tmp_path / "store" / ".jobs").iterdir() if p.is_dir()]  # job files removed


def test_onboarding_without_transcripts_transcribes_with_whisper(tiny_base, new_voice_data, tmp_path):
    app, store = make_app(tiny_base, tmp_path / "store")
    files, _ = clip_files(new_voice_data)
    with TestClient(app) as client:
        created = client.post("/v1/voices", files=files, data={"name": "Untold", "consent": CONSENT})
        assert created.status_code == 202, created.text
        history = wait_for_job(client, created.json()["id"], {})
        assert history[-1]["status"] == "done", history[-1]
        assert decode(speak(client, {}, voice="untold").content)[1] == 22050
        card = json.loads((store.get_voice("default", "untold") / "voice_card.json").read_text())
    automatic, _, clips = card["notes"]["automatic_transcripts"].partition(" of ")
    # Every clip's transcript is Whisper's; a clip in which it hears no word is left out.
    assert int(automatic) == int(clips.split()[0]) >= 14


def test_a_job_reports_the_training_steps_as_its_progress(tiny_base, new_voice_data, tmp_path):
    """Progress is adapt's own count (steps done of the recipe's at most), not a guess from elapsed time."""
    store = VoiceStore(str(tmp_path / "store"))
    recipe = AdaptConfig(methods=parse_methods("lora"), steps=4, threads=1, eval_every=2, max_frames=1500)
    runner = JobRunner(store, tmp_path / "jobs", lambda: load_bundle(tiny_base), recipe, progress_interval=0.0)
    job = OnboardingJob(store.create_job("default", "fiona", name="Fiona"), "default", "fiona", "Fiona")
    shutil.copytree(new_voice_data, tmp_path / "jobs" / job.job_id / "voice")
    reports, update_job = [], store.update_job

    def recording_update(job_id, **fields):
        reports.append((fields.get("progress"), fields.get("message") or ""))
        return update_job(job_id, **fields)

    store.update_job = recording_update
    try:
        runner.run(job)
        assert store.get_job("default", job.job_id).status == JobStatus.DONE
    finally:
        store.close()
    steps = [(progress, message) for progress, message in reports if message.startswith("training: step")]
    assert [p for p, _ in steps] == [round(0.05 + 0.9 * k / 4, 3) for k in range(1, 5)], reports
    assert [m.split()[2] for _, m in steps] == ["1", "2", "3", "4"]
    assert [p for p, _ in reports] == sorted(p for p, _ in reports)


def test_a_sample_voice_speaks_as_its_best_fitting_base_speaker_while_it_is_refined(
    tiny_base, new_voice_data, tmp_path
):
    """From its POST a sample's voice speaks as the encoder's blend; once its job has the sample's features it
    speaks as the base speaker the training starts from (lowest mel loss), and stays so if refinement fails."""
    store = VoiceStore(str(tmp_path / "store"))
    recipe = AdaptConfig(methods=parse_methods("lora"), steps=6, threads=1, eval_every=3, max_frames=1500)
    bundle = load_bundle(tiny_base)
    runner = JobRunner(store, tmp_path / "jobs", lambda: load_bundle(tiny_base), recipe, progress_interval=0.0)
    blend = f"{bundle.speakers[0]}(0.5)+{bundle.speakers[1]}(0.5)"
    job_id = store.create_job("default", "fiona", name="Fiona", instant=blend)
    job = OnboardingJob(job_id, "default", "fiona", "Fiona", job_runner.SAMPLE)
    shutil.copytree(new_voice_data, tmp_path / "jobs" / job.job_id / "voice")
    spoken, update_job = [], store.update_job

    def recording_update(job_id, **fields):  # what the voice speaks as at each progress write
        spoken.append((fields.get("message") or "", store.voice("default", "fiona").instant))
        return update_job(job_id, **fields)

    store.update_job = recording_update
    try:
        runner.run(job)
        record = store.voice("default", "fiona")
        assert spoken[0][1] == blend  # queued and checking the data: still the blend
        during = {instant for message, instant in spoken if message.startswith("training: step")}
        assert len(during) == 1 and next(iter(during)) in bundle.speakers
        assert record.instant == next(iter(during))
        if record.status == VoiceStatus.READY:  # the start the card names is the one it spoke as
            card = json.loads((store.get_voice("default", "fiona") / "voice_card.json").read_text())
            assert card["notes"]["speaker_vector_start"] == record.instant
        # Once its job has moved on, a late update changes nothing.
        assert not store.set_instant("default", "fiona", job_id, blend)
        assert store.voice("default", "fiona").instant == record.instant
    finally:
        store.close()


@pytest.mark.parametrize("how", ["voice deleted", "job cancelled"])
def test_ending_a_job_stops_its_training_at_its_next_step(tiny_base, new_voice_data, tmp_path, how):
    store = VoiceStore(str(tmp_path / "store"))
    # Far more steps than the test waits for (hours): only cancellation can end it. progress_interval 0:
    # every step writes its progress, and that write is the cancellation check.
    recipe = AdaptConfig(methods=parse_methods("lora"), steps=100_000, threads=1, eval_every=50_000, patience=100)
    runner = JobRunner(store, tmp_path / "jobs", lambda: load_bundle(tiny_base), recipe, progress_interval=0.0)
    job = OnboardingJob(store.create_job("default", "fiona", name="Fiona"), "default", "fiona", "Fiona")
    shutil.copytree(new_voice_data, tmp_path / "jobs" / job.job_id / "voice")
    ended, steps_after_end, update_job = threading.Event(), [], store.update_job

    def recording_update(job_id, **fields):
        if ended.is_set() and (fields.get("message") or "").startswith("training: step"):
            steps_after_end.append(fields["message"])
        return update_job(job_id, **fields)

    store.update_job = recording_update
    trainer = threading.Thread(target=runner.run, args=(job,))
    try:
        trainer.start()
        wait_for(
            lambda: (
                (store.get_job("default", job.job_id).message or "").startswith("training: step")
                or not trainer.is_alive()
            ),
            120,
            "training starts",
        )
        assert trainer.is_alive(), "the job ended before it trained"
        if how == "voice deleted":
            store.delete_voice("default", "fiona")
        else:
            update_job(job.job_id, status=JobStatus.FAILED, message="cancelled by its tenant")
        ended.set()
        wait_for(lambda: not trainer.is_alive(), 120, "training stops after its job ended")
        # The first progress write after the job ended finds it ended, and no step follows it.
        assert len(steps_after_end) <= 1, steps_after_end
        assert store.get_job("default", job.job_id).status == JobStatus.FAILED
        assert not (tmp_path / "jobs" / job.job_id).exists()  # its files are cleaned up
    finally:
        trainer.join(timeout=30)
        store.close()


# Far more steps than a test waits for (hours): only a cancel or a stop can end it in time.
ENDLESS = AdaptConfig(methods=parse_methods("lora"), steps=100_000, threads=1, eval_every=50_000, patience=100)
# A few steps that lower the held-out mel loss of new_voice_data on the tiny base: the word check decides.
SAMPLE_RECIPE = AdaptConfig(methods=parse_methods("lora"), steps=6, threads=1, eval_every=3, max_frames=1500)


def submit_sample_job(server, data: Path, voice_id: str = "voice_0123") -> OnboardingJob:
    """A sample's voice (speaking as a base speaker meanwhile) and its refinement job, queued on ``server``'s
    worker with ``data`` (an LJSpeech-style folder, its transcripts given) as the sample."""
    instant = server.engine.speakers[0]
    job_id = server.store.create_job("default", voice_id, name="Fiona", instant=instant)
    job = OnboardingJob(job_id, "default", voice_id, "Fiona", job_runner.SAMPLE)
    upload = server.jobs.new_upload_dir()
    shutil.copytree(data, upload / "voice")
    server.jobs.submit(upload, job, {"statement": "consented in writing, for this test"})
    return job


@pytest.mark.parametrize("route", ["/v1/audio/voices", "/v1/voices"])
def test_deleting_a_voice_stops_its_training_job_at_once(tiny_base, new_voice_data, tmp_path, route):
    """Deleting a voice fails its job in the store, and this server's worker stops training it at its next
    step: here its progress is written once an hour, so the store's state alone would not stop it."""
    settings = dataclasses.replace(SETTINGS, adapt_sample=ENDLESS, progress_interval=3600.0)
    app, store = make_app(tiny_base, tmp_path / "store", settings=settings)
    with TestClient(app) as client:
        server = app.state.server
        training, set_instant = threading.Event(), store.set_instant

        def starts_training(*args):  # the job's last call before its first step
            training.set()
            return set_instant(*args)

        store.set_instant = starts_training
        job = submit_sample_job(server, new_voice_data)
        wait_for(training.is_set, 120, "the job starts training")
        assert client.delete(f"{route}/{job.voice_id}").json()["deleted"] is True
        wait_for(lambda: server.jobs.running is None, 120, "the job stops")
        ended = store.get_job("default", job.job_id)
        assert ended.status == JobStatus.FAILED and ended.message == "voice deleted"
        assert_error(client.get(f"/v1/audio/voices/{job.voice_id}"), 404)
        assert not (server.jobs.jobs_dir / job.job_id).exists()  # its files removed


def test_a_voice_deleted_while_its_refinement_checks_its_words_stays_deleted(tiny_base, new_voice_data, tmp_path):
    """The job's end after its voice was deleted (here: while it judged the refined voice's words) neither
    stores the voice again nor leaves the job running."""
    app, store = make_app(
        tiny_base, tmp_path / "store", settings=dataclasses.replace(SETTINGS, adapt_sample=SAMPLE_RECIPE)
    )
    with TestClient(app) as client:
        server = app.state.server
        heard = []

        def delete_then_hear(audio, rate):
            if not heard:
                server.delete_voice("default", "voice_0123")
            heard.append(rate)
            return CHECK_SENTENCES[(len(heard) - 1) % len(CHECK_SENTENCES)]

        server.jobs.refinement_check = RefinementCheck(0.05, transcriber=delete_then_hear)
        job = submit_sample_job(server, new_voice_data)
        wait_for(lambda: store.get_job("default", job.job_id).status == JobStatus.FAILED, 120, "the job ends")
        wait_for(lambda: server.jobs.running is None, 120, "the worker is done with it")
        assert heard, "the job never checked its words (the held-out mel loss did not improve)"
        assert store.get_job("default", job.job_id).message == "voice deleted"
        assert_error(client.get(f"/v1/audio/voices/{job.voice_id}"), 404)
        assert not store.list_voices("default")
        assert not (server.jobs.jobs_dir / job.job_id).exists()


NOTHING, HALLUCINATED = ("",) * len(CHECK_SENTENCES), ("Thank you. " * 12,) * len(CHECK_SENTENCES)


@pytest.mark.parametrize(
    ("instant_heard", "refined_heard", "kept"),
    [
        (CHECK_SENTENCES, CHECK_SENTENCES, True),
        (CHECK_SENTENCES, NOTHING, False),
        # Two unintelligible voices tie (a rate is capped at 1: more hallucinated words say no more).
        (HALLUCINATED, NOTHING, True),
    ],
)
def test_a_refined_voice_replaces_its_instant_voice_only_if_it_reads_as_well(
    tiny_base, new_voice_data, tmp_path, instant_heard, refined_heard, kept
):
    """A refinement that fits the sample better (held-out mel loss) but reads worse than the instant voice
    (word error rate by Whisper, here a transcriber the test gives) is refused, as one that does not fit."""
    store = VoiceStore(str(tmp_path / "store"))
    heard = []

    def transcriber(audio, rate):  # the instant voice's clips first, then the refined voice's
        heard.append((len(audio), rate))
        return (tuple(instant_heard) + tuple(refined_heard))[len(heard) - 1]

    runner = JobRunner(
        store,
        tmp_path / "jobs",
        lambda: load_bundle(tiny_base),
        SAMPLE_RECIPE,
        progress_interval=0.0,
        refinement_check=RefinementCheck(0.05, transcriber=transcriber),
    )
    instant = load_bundle(tiny_base).speakers[1]
    job = OnboardingJob(
        store.create_job("default", "fiona", instant=instant), "default", "fiona", "F", job_runner.SAMPLE
    )
    shutil.copytree(new_voice_data, tmp_path / "jobs" / job.job_id / "voice")
    try:
        runner.run(job)
        ended, record = store.get_job("default", job.job_id), store.voice("default", "fiona")
        assert len(heard) == 2 * len(CHECK_SENTENCES) and all(samples > 0 and rate == 22050 for samples, rate in heard)
        if kept:
            assert ended.status == JobStatus.DONE and record.status == VoiceStatus.READY, ended.message
            rates = (
                "0.00 (instant voice) -> 0.00" if instant_heard == CHECK_SENTENCES else "1.00 (instant voice) -> 1.00"
            )
            assert f"word error rate on 4 check sentences {rates} (refined)" in ended.message, ended.message
        else:
            assert ended.status == JobStatus.FAILED and record.status == VoiceStatus.FAILED
            assert ended.message.startswith("the refined voice reads worse than the instant voice"), ended.message
            assert "0.00 (instant voice) -> 1.00 (refined), at most +0.05" in ended.message
            assert ended.message.endswith("the instant voice stays")
            assert record.instant is not None  # what it speaks as still
    finally:
        store.close()


def test_the_word_check_allows_the_settings_increase():
    assert WordCheck(0.08, 0.13, 0.05).kept and not WordCheck(0.08, 0.14, 0.05).kept
    assert WordCheck(0.3, 0.2, 0.0).kept and not WordCheck(0.0, 0.01, 0.0).kept
    assert ServerSettings().consent.max_refined_wer_increase == 0.05


def test_stopping_the_server_stops_a_training_job_and_the_next_start_resumes_it(tiny_base, new_voice_data, tmp_path):
    # Far more steps than the test waits for: only the stop can end it in time.
    long = dataclasses.replace(
        SETTINGS,
        adapt=AdaptConfig(methods=parse_methods("lora"), steps=100_000, threads=1, eval_every=50_000, patience=100),
    )
    app, store = make_app(tiny_base, tmp_path / "store", settings=long)
    files, transcripts = clip_files(new_voice_data)
    threads = torch.get_num_threads()
    with TestClient(app) as client:
        job_id = client.post(
            "/v1/voices", files=files, data={"name": "Fiona", "consent": CONSENT, "transcripts": transcripts}
        ).json()["id"]
        wait_for(
            lambda: (client.get(f"/v1/jobs/{job_id}").json().get("message") or "").startswith("training: step"),
            120,
            "training starts",
        )
        worker = app.state.server.jobs._thread
    # The server's stop waited for its worker: the training stopped at its next step (a server that left a
    # thread inside torch at exit would abort there).
    assert not worker.is_alive(), "the job's training went on after the server stopped"
    assert torch.get_num_threads() == threads  # the job's thread count did not stay with the process
    assert (tmp_path / "store" / ".jobs" / job_id / "voice" / "metadata.csv").is_file()  # kept to resume
    app, store = make_app(tiny_base, tmp_path / "store")  # the next start, with the short recipe
    with TestClient(app) as client:
        assert wait_for_job(client, job_id, {})[-1]["status"] == "done"
        assert speak(client, {}, voice="fiona").status_code == 200


def test_server_figures_need_the_operators_key(tenants_app):
    client, _ = tenants_app
    for headers in [{}, ACME, {"Authorization": "Bearer wrong"}]:
        assert client.get("/healthz", headers=headers).json() == {"status": "ok"}  # liveness only
    detailed = client.get("/healthz", headers=OPERATOR).json()
    assert detailed["tenancy"] == "keys" and "onboarding" in detailed and "resident_bytes" in detailed
    assert_error(client.get("/metrics"), 401, "missing API key")
    assert_error(client.get("/metrics", headers=ACME), 403, "operator")
    assert "chorus_http_requests_total" in client.get("/metrics", headers=OPERATOR).text


def test_cancel_route(tenants_app):
    client, store = tenants_app
    job_id = store.create_job("acme", "to-cancel", name="To cancel")
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=ACME)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "failed"
    assert "cancelled by its tenant" in json.dumps(cancelled.json())
    assert store.voice("acme", "to-cancel").status == VoiceStatus.FAILED
    assert_error(client.post(f"/v1/jobs/{job_id}/cancel", headers=ACME), 409, "nothing to cancel")
    assert_error(client.post(f"/v1/jobs/{job_id}/cancel", headers=GLOBEX), 404, "not found")
    assert_error(client.post("/v1/jobs/job_0000/cancel", headers=ACME), 404, "not found")


def test_interrupted_jobs_resume_or_fail_on_restart(tiny_base, new_voice_data, tmp_path):
    root = tmp_path / "store"
    with VoiceStore(str(root)) as store:
        kept = store.create_job("default", "kept", name="Kept")
        lost = store.create_job("default", "lost", name="Lost")
        store.update_job(kept, status="running", progress=0.4)  # the server died mid-training
    shutil.copytree(new_voice_data, root / ".jobs" / kept / "voice")
    (root / ".jobs" / kept / "job.json").write_text(
        json.dumps({"job_id": kept, "tenant": "default", "voice_id": "kept", "name": "Kept"})
    )
    app, store = make_app(tiny_base, root)
    with TestClient(app) as client:
        assert client.get(f"/v1/jobs/{lost}").json()["status"] == "failed"
        assert "upload them again" in client.get(f"/v1/jobs/{lost}").json()["error"]
        assert wait_for_job(client, kept, {})[-1]["status"] == "done"
        assert store.voice("default", "kept").status == VoiceStatus.READY
        assert store.voice("default", "lost").status == VoiceStatus.FAILED
        assert speak(client, {}, voice="kept").status_code == 200
    with VoiceStore(str(root)) as reopened:  # the server closed its store when it stopped
        assert reopened.get_job("default", kept).status == JobStatus.DONE


def test_a_stopped_server_leaves_everything_in_the_database_file(tiny_base, adapter_folders, tmp_path):
    """Stopping checkpoints SQLite's write-ahead log: the main file alone (a backup without -wal/-shm)
    holds every voice and job."""
    root = tmp_path / "store"
    app, store = make_app(tiny_base, root)
    store.put_voice("default", "ann", adapter_folders["ann"])
    job_id = store.create_job("default", "fiona", name="Fiona")
    with TestClient(app) as client:
        assert client.get("/v1/voices/ann").json()["status"] == "ready"
    backup = tmp_path / "backup"
    backup.mkdir()
    shutil.copy(root / "store.sqlite3", backup / "store.sqlite3")  # the main file alone
    db = sqlite3.connect(backup / "store.sqlite3")
    try:
        voices = {row[0]: row[1] for row in db.execute("SELECT id, status FROM voices")}
        jobs = [row[0] for row in db.execute("SELECT id FROM jobs")]
    finally:
        db.close()
    # fiona's job had no files, so the start failed it: that too was written to the main file.
    assert voices == {"ann": "ready", "fiona": "failed"} and jobs == [job_id]


# -- a live server: the official OpenAI client, concurrent load, metrics -------------------------------
@pytest.fixture(scope="module")
def live_app(tiny_base, adapter_folders, tmp_path_factory):
    """What ``live_server`` serves: the two tenants' keys; acme has ann and bob."""
    app, store = make_app(tiny_base, tmp_path_factory.mktemp("store_live"), KEYS)
    store.put_voice("acme", "ann", adapter_folders["ann"])
    store.put_voice("acme", "bob", adapter_folders["bob"])
    return app


def test_official_openai_client(live_server, tmp_path):
    live_server, _ = live_server
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key="acme-key-0123456789abcdef")
    whole = client.audio.speech.create(model="chorus", voice="ann", input="Hello there.", response_format="wav")
    audio, rate = decode(whole.content)
    assert rate == 22050 and len(audio) > 0
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="m3", input=SENTENCES, response_format="pcm"
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in response.iter_bytes() if chunk]
    streamed = b"".join(chunks)
    assert len(chunks) >= 2 and len(streamed) % 2 == 0 and len(streamed) > 2 * 22050 // 2
    with client.audio.speech.with_streaming_response.create(
        model="chorus", voice="bob", input=SENTENCES, response_format="wav"
    ) as response:
        assert len(decode(response.read())[0]) > 0
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.audio.speech.create(model="chorus", voice="nobody", input="Hello.")
    # No response_format: mp3, as OpenAI's, so the file its README writes is what its name says.
    mp3 = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.")
    mp3.write_to_file(tmp_path / "hello.mp3")
    assert mp3.response.headers["content-type"] == "audio/mpeg"
    assert len(decode_any((tmp_path / "hello.mp3").read_bytes(), "mp3")) > 0
    with pytest.raises(openai.NotFoundError, match="does not exist") as refused:
        client.audio.speech.create(model="whisper-1", voice="m3", input="Hello.")
    assert refused.value.code == "model_not_found" and "tts-1" in refused.value.message
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.audio.speech.create(model="chorus", voice="m3", input="Hello.", response_format="wma")
    sad = client.audio.speech.with_raw_response.create(
        model="gpt-4o-mini-tts", voice="m3", input="Hello.", instructions="Sound sad.", response_format="wav"
    )
    assert sad.headers["x-instructions-ignored"] == "Sound sad" and len(sad.content) > 44
    assert {m.id for m in client.models.list()} >= {"chorus", "tts-1", "gpt-4o-mini-tts"}
    stranger = openai.OpenAI(base_url=f"{live_server}/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.audio.speech.create(model="chorus", voice="m3", input="Hello.")


def test_curl_round_trip(live_server, tmp_path):
    """What the README shows: curl lists voices and speaks into a file, as a shell user would."""
    url, _ = live_server
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("needs curl")
    auth = ["-H", "Authorization: Bearer acme-key-0123456789abcdef"]

    def curl_post(body: str, *more: str) -> subprocess.CompletedProcess:
        command = [curl, "-sS", "--fail-with-body", *auth, "-H", "Content-Type: application/json", "-d", body]
        return subprocess.run([*command, *more, f"{url}/v1/audio/speech"], capture_output=True, timeout=120)

    listed = subprocess.run(
        [curl, "-sS", "--fail-with-body", *auth, f"{url}/v1/audio/voices"], capture_output=True, timeout=60
    )
    assert listed.returncode == 0 and "alloy" in json.loads(listed.stdout)["voices"]
    out = tmp_path / "hello.mp3"
    body = {"model": "tts-1", "voice": "ann", "input": "Hello there. Good day.", "response_format": "mp3"}
    spoken = curl_post(json.dumps(body), "-o", str(out))
    assert spoken.returncode == 0, spoken.stderr
    assert len(decode_any(out.read_bytes(), "mp3")) > 2000  # the tiny base speaks fast
    refused = curl_post('{"voice": "ann"}')
    assert refused.returncode == 22 and "'input' is required" in json.loads(refused.stdout)["error"]["message"]


def test_concurrent_mixed_voices_and_metrics(live_server):
    live_server, app = live_server
    server = app.state.server
    voices = ["m3", "f2", "ann", "bob"]
    texts = [
        "The birch canoe slid on the smooth planks.",
        "Rice is often served in round bowls.",
        "It is easy to tell the depth of a well.",
        "Glue the sheet to the dark blue background.",
    ]
    results: dict[int, tuple[int, bytes] | Exception] = {}

    def call(index: int) -> None:
        body = json.dumps(
            {"model": "chorus", "input": texts[index % 4], "voice": voices[index % 4], "response_format": "wav"}
        ).encode()
        request = urllib.request.Request(
            f"{live_server}/v1/audio/speech",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **ACME},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                results[index] = (response.status, response.read())
        except (urllib.error.URLError, OSError) as error:
            results[index] = error

    # The batcher is held until all 16 requests wait in it, so they go out as one batch of 16 (max_batch),
    # its bounds on a batch's time and padding lifted for this (tested in test_serving_engine.py).
    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    batches_before = server.batcher.stats.batch_sizes[16]
    bounds = server.batcher.max_batch_seconds, server.batcher.pad_ratio
    server.batcher.max_batch_seconds = server.batcher.pad_ratio = None
    with server.batcher.held():
        for thread in threads:
            thread.start()
        assert server.batcher.wait_queued(16, timeout=60), "the requests did not reach the batcher"
    for thread in threads:
        thread.join(90)
    server.batcher.max_batch_seconds, server.batcher.pad_ratio = bounds
    errors = {i: r for i, r in results.items() if isinstance(r, Exception) or r[0] != 200}
    assert len(results) == 16 and not errors, errors
    assert server.batcher.stats.batch_sizes[16] == batches_before + 1
    for index, (_, content) in results.items():
        assert len(decode(content)[0]) > 0, index
    metrics_request = urllib.request.Request(f"{live_server}/metrics", headers=OPERATOR)
    metrics = urllib.request.urlopen(metrics_request, timeout=10).read().decode()
    samples = {}
    for line in metrics.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    assert samples['chorus_http_requests_total{method="POST",route="/v1/audio/speech",status="200"}'] >= 16
    assert samples["chorus_batcher_completed_total"] >= 16
    assert samples['chorus_batch_size_bucket{le="16"}'] - samples['chorus_batch_size_bucket{le="8"}'] >= 1
    assert samples["chorus_cache_hits_total"] + samples["chorus_cache_misses_total"] >= 2
    assert samples["chorus_cache_loads_total"] >= 2 and samples["chorus_cache_resident_bytes"] > 0
    assert samples["process_resident_memory_bytes"] > 0
    assert 'chorus_http_request_seconds_bucket{le="60.0",route="/v1/audio/speech"}' in samples


# -- every route fuzzed from its OpenAPI schema ------------------------------------------------------
EXAMPLES_PER_ROUTE = 500


@pytest.fixture(scope="module")
def fuzzed_app(tiny_base, adapter_folders, tmp_path_factory):
    """An app with tenants and voices, started (lifespan) for the fuzzer's requests."""
    app, store = make_app(tiny_base, tmp_path_factory.mktemp("store_fuzz"), KEYS)
    store.put_voice("acme", "ann", adapter_folders["ann"])
    with TestClient(app):
        yield app


def test_no_route_answers_a_server_error(fuzzed_app):
    """Requests schemathesis generates from the OpenAPI schema for every operation (valid and invalid
    bodies, paths, queries), as a tenant and as nobody: whatever comes, never a 5xx. (Its pytest plugin
    does not run on this pytest; its per-operation strategies do.)"""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    calls = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=EXAMPLES_PER_ROUTE,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def never_a_server_error(case):
            response = case.call(headers=ACME if len(calls) % 4 else {})
            calls.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])

        never_a_server_error()
    print(f"{len(calls)} generated requests, statuses {sorted(set(calls))}")
    assert len(calls) >= 5 * EXAMPLES_PER_ROUTE // 2


def test_a_store_that_turns_read_only_answers_503_and_keeps_serving(tiny_base, adapter_folders, tmp_path):
    app, store = make_app(tiny_base, tmp_path / "store", KEYS)
    store.put_voice("acme", "ann", adapter_folders["ann"])
    with TestClient(app) as client:
        assert client.get("/healthz", headers=OPERATOR).json()["status"] == "ok"
        # The database turns read-only under the running server (a remount, a full disk): SQLite's own
        # refusal, through the read-only switch of the store's connection.
        with store.database.read() as db:
            db.execute("PRAGMA query_only = ON")
        try:
            refused = client.delete("/v1/voices/ann", headers=ACME)
            assert_error(refused, 503, "cannot take writes right now")
            assert refused.headers["Retry-After"] == "30"
            health = client.get("/healthz", headers=OPERATOR).json()
            assert health["status"] == "degraded" and "readonly" in health["store_problem"]
            assert client.get("/healthz").json() == {"status": "degraded"}
            # Reads keep working, and nothing was half-done: ann is still there and speaks.
            listed = client.get("/v1/voices", headers=ACME).json()["data"]
            assert any(v["id"] == "ann" and v.get("status") == "ready" for v in listed), listed
            assert speak(client, voice="ann").status_code == 200
        finally:
            with store.database.read() as db:
                db.execute("PRAGMA query_only = OFF")
        assert client.get("/healthz", headers=OPERATOR).json()["status"] == "ok"
        assert client.delete("/v1/voices/ann", headers=ACME).status_code == 200


@contextlib.contextmanager
def small_disk(path: Path, size: str = "4m") -> Iterator[Path]:
    """A real filesystem of ``size`` at ``path`` (tmpfs, so a full disk is a full disk: ENOSPC for files,
    SQLITE_FULL for the database); skips where this process may not mount (it needs CAP_SYS_ADMIN)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk is full; the file, to free the space again."""
    filler = folder / "filler"
    # Unbuffered: a write the disk refused half-way leaves nothing in a buffer for close() to fail on again.
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return filler


def test_a_full_disk_answers_503_and_keeps_serving(tiny_base, adapter_folders, new_voice_data, tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        app, store = make_app(tiny_base, disk / "store", KEYS)
        store.put_voice("acme", "ann", adapter_folders["ann"])
        files, transcripts = clip_files(new_voice_data)
        form = {"files": files, "data": {"name": "Fiona", "consent": CONSENT, "transcripts": transcripts}}
        with TestClient(app) as client:
            filler = fill(disk)
            refused = client.post("/v1/voices", headers=ACME, **form)
            assert_error(refused, 503, "No space left on device")
            assert refused.headers["Retry-After"] == "30"
            health = client.get("/healthz", headers=OPERATOR).json()
            assert health["status"] == "degraded" and "No space left" in health["store_problem"]
            # Reads keep working; nothing half-written: no job, no voice, no upload left in the job folder.
            listed = {v["id"]: v for v in client.get("/v1/voices", headers=ACME).json()["data"]}
            assert listed["ann"]["status"] == "ready" and "fiona" not in listed
            assert speak(client, voice="ann").status_code == 200
            assert not [p for p in (disk / "store" / ".jobs").iterdir() if p.is_dir()]
            report = store.verify()
            assert report.ok and report.checked == 1 and not report.orphan_folders
            filler.unlink()  # space again: the same upload goes through
            assert client.get("/healthz", headers=OPERATOR).json()["status"] == "ok"
            created = client.post("/v1/voices", headers=ACME, **form)
            assert created.status_code == 202, created.text
            assert wait_for_job(client, created.json()["id"], ACME)[-1]["status"] == "done"


def test_an_upload_whose_job_files_cannot_be_written_leaves_only_a_failed_job(
    tiny_base, new_voice_data, tmp_path, monkeypatch
):
    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(job_runner, "record_consent", disk_full)  # after the clips, before the job is queued
    app, store = make_app(tiny_base, tmp_path / "store", KEYS)
    files, transcripts = clip_files(new_voice_data)
    with TestClient(app) as client:
        refused = client.post(
            "/v1/voices",
            headers=ACME,
            files=files,
            data={"name": "Fiona", "consent": CONSENT, "transcripts": transcripts},
        )
        assert_error(refused, 503, "No space left on device")
        [voice] = store.list_voices("acme")
        assert voice.voice_id == "fiona" and voice.status == VoiceStatus.FAILED and "its files" in voice.error
        assert store.get_job("acme", voice.job_id).status == JobStatus.FAILED
        assert not [p for p in (tmp_path / "store" / ".jobs").iterdir() if p.is_dir()]
        assert app.state.server.jobs.queued == 0


def test_every_route_keeps_tenants_apart(tiny_base, adapter_folders, new_voice_data, tmp_path):
    """The cross-tenant matrix: for every route of the API, globex tries acme's voice or job (and the
    server-wide figures); not one attempt reaches them. A route added without its row fails here."""
    app, store = make_app(tiny_base, tmp_path / "store", KEYS)
    store.put_voice("acme", "bob", adapter_folders["bob"])
    files, transcripts = clip_files(new_voice_data)
    upload = {"files": files, "data": {"name": "Bob", "id": "bob", "consent": CONSENT, "transcripts": transcripts}}

    def own_namespace(response):  # globex's "bob" is its own voice: no conflict with acme's, no leak
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["voice"] == "bob" and client.post(f"/v1/jobs/{job['id']}/cancel", headers=GLOBEX).status_code == 200

    def not_listed(response):
        ids = {v["id"] for v in response.json()["data"]}
        assert response.status_code == 200 and not ids & {"bob", "pending"}, ids

    def no_acme_voice(response):
        assert response.status_code == 200 and not {"bob", "pending"} & set(response.json()["voices"])

    matrix = {
        ("POST", "/v1/audio/speech"): (lambda: speak(client, GLOBEX, voice="bob"), 404),
        ("POST", "/"): (lambda: client.post("/", json={"text": "Hi.", "voice": "bob"}, headers=GLOBEX), 404),
        ("GET", "/v1/audio/voices"): (lambda: client.get("/v1/audio/voices", headers=GLOBEX), no_acme_voice),
        ("POST", "/v1/audio/speech/captioned"): (
            lambda: client.post("/v1/audio/speech/captioned", json={"input": "Hi.", "voice": "bob"}, headers=GLOBEX),
            404,
        ),
        ("GET", "/v1/models"): (
            lambda: client.get("/v1/models", headers=GLOBEX),
            lambda response: response.status_code == 200,  # the same for every tenant: nothing of acme's
        ),
        ("GET", "/v1/models/{model_id}"): (
            lambda: client.get("/v1/models/tts-1", headers=GLOBEX),
            lambda response: response.status_code == 200,  # the same for every tenant: nothing of acme's
        ),
        ("GET", "/v1/voices"): (lambda: client.get("/v1/voices", headers=GLOBEX), not_listed),
        ("GET", "/v1/voices/{voice_id}"): (lambda: client.get("/v1/voices/pending", headers=GLOBEX), 404),
        ("DELETE", "/v1/voices/{voice_id}"): (lambda: client.delete("/v1/voices/bob", headers=GLOBEX), 404),
        ("POST", "/v1/voices"): (lambda: client.post("/v1/voices", headers=GLOBEX, **upload), own_namespace),
        ("GET", "/v1/jobs/{job_id}"): (lambda: client.get(f"/v1/jobs/{acme_job}", headers=GLOBEX), 404),
        ("POST", "/v1/jobs/{job_id}/cancel"): (
            lambda: client.post(f"/v1/jobs/{acme_job}/cancel", headers=GLOBEX),
            404,
        ),
        # OpenAI's custom voices: acme's consent recording and the voice made under it.
        ("POST", "/v1/audio/voice_consents"): (
            lambda: client.post(
                "/v1/audio/voice_consents",
                data={"name": "mine", "language": "xx"},
                files={"recording": ("c.wav", b"RIFF", "audio/wav")},
                headers=GLOBEX,
            ),
            400,  # its own request, refused for its own reason (no phrase for that language)
        ),
        ("GET", "/v1/audio/voice_consents/phrases"): (
            lambda: client.get("/v1/audio/voice_consents/phrases", headers=GLOBEX),
            lambda response: response.status_code == 200,  # the server's phrases: the same for every tenant
        ),
        ("GET", "/v1/audio/voice_consents"): (
            lambda: client.get("/v1/audio/voice_consents", headers=GLOBEX),
            lambda response: response.status_code == 200 and response.json()["data"] == [],
        ),
        ("GET", "/v1/audio/voice_consents/{consent_id}"): (
            lambda: client.get(f"/v1/audio/voice_consents/{acme_consent}", headers=GLOBEX),
            404,
        ),
        ("POST", "/v1/audio/voice_consents/{consent_id}"): (
            lambda: client.post(f"/v1/audio/voice_consents/{acme_consent}", json={"name": "x"}, headers=GLOBEX),
            404,
        ),
        ("DELETE", "/v1/audio/voice_consents/{consent_id}"): (
            lambda: client.delete(f"/v1/audio/voice_consents/{acme_consent}", headers=GLOBEX),
            404,
        ),
        ("POST", "/v1/audio/voices"): (
            lambda: client.post(
                "/v1/audio/voices",
                data={"name": "Stolen", "consent": acme_consent},
                files={"audio_sample": ("s.wav", b"RIFF", "audio/wav")},
                headers=GLOBEX,
            ),
            404,
        ),
        ("GET", "/v1/audio/voices/{voice_id}"): (
            lambda: client.get("/v1/audio/voices/voice_0123", headers=GLOBEX),
            404,
        ),
        ("DELETE", "/v1/audio/voices/{voice_id}"): (
            lambda: client.delete("/v1/audio/voices/voice_0123", headers=GLOBEX),
            404,
        ),
        ("GET", "/metrics"): (lambda: client.get("/metrics", headers=GLOBEX), 403),
        ("GET", "/healthz"): (
            lambda: client.get("/healthz", headers=GLOBEX),
            lambda response: response.json() == {"status": "ok"},  # liveness only
        ),
    }
    with TestClient(app) as client:
        acme_job = store.create_job("acme", "pending", name="Pending")  # after start-up's recovery
        acme_consent = store.create_consent(
            "acme", name="Acme", language="en", heard="...", word_error_rate=0.0, embedding=[1.0], recording=b"RIFF"
        ).consent_id
        store.create_job("acme", "voice_0123", name="Acme", consent_id=acme_consent, instant="m3(1)")
        routes = {(method, path) for path, item in app.openapi()["paths"].items() for method in map(str.upper, item)}
        assert routes == set(matrix), f"routes without a cross-tenant row: {routes - set(matrix)}"
        for (method, path), (attempt, expected) in matrix.items():
            response = attempt()
            if isinstance(expected, int):
                assert response.status_code == expected, (method, path, response.status_code, response.text)
                assert "acme" not in response.text, (method, path, response.text)
            else:
                assert expected(response) is not False, (method, path, response.text)
        # acme's things are untouched: bob speaks, the job still waits.
        assert speak(client, ACME, voice="bob").status_code == 200
        assert client.get(f"/v1/jobs/{acme_job}", headers=ACME).json()["status"] == "queued"
        assert client.get("/v1/audio/voices/voice_0123", headers=ACME).json()["stage"] == "instant"
        listed = {v["id"]: v for v in client.get("/v1/audio/voices", headers=ACME).json()["data"]}
        assert listed["voice_0123"] == {"id": "voice_0123", "kind": "custom", "name": "Acme", "stage": "instant"}
        assert [c["id"] for c in client.get("/v1/audio/voice_consents", headers=ACME).json()["data"]] == [acme_consent]


def test_limits_per_tenant_and_server_answer_429(tiny_base, adapter_folders, tmp_path):
    limits = Limits(
        TenantLimits(requests_per_minute=3, active_jobs=1, voices=2),
        tenants={"operator": TenantLimits(requests_per_minute=1_000)},
        requests_per_minute=7,
    )
    app, store = make_app(tiny_base, tmp_path / "store", KEYS, dataclasses.replace(SETTINGS, limits=limits))
    app.state.server.rate = RateLimiter(clock=lambda: 0.0)  # no refill while the test runs
    store.put_voice("acme", "ann", adapter_folders["ann"])
    with TestClient(app) as client:
        for _ in range(3):
            assert client.get("/v1/voices", headers=ACME).status_code == 200
        limited = client.get("/v1/voices", headers=ACME)
        assert_error(limited, 429, "over 3 requests a minute for this key")
        assert 1 <= int(limited.headers["Retry-After"]) <= 20
        assert client.get("/v1/voices", headers=GLOBEX).status_code == 200  # another tenant's own budget
        upload = {"data": {"name": "X"}, "files": [("clips", ("a.wav", b"x", "audio/wav"))]}
        store.create_job("globex", "pending", name="Pending")  # globex has one job queued already
        busy = client.post("/v1/voices", headers=GLOBEX, **upload)
        assert_error(busy, 429, "1 of your onboarding jobs are queued or running (at most 1)")
        assert busy.headers["Retry-After"] == "60"
        store.put_voice("globex", "one", adapter_folders["ann"])
        store.put_voice("globex", "two", adapter_folders["bob"])
        with store.database.transaction() as db:  # the queued job ends, so only the voice count stands in the way
            db.execute("UPDATE jobs SET status='failed' WHERE tenant='globex'")
        full = client.post("/v1/voices", headers=GLOBEX, **upload)
        assert_error(full, 429, "delete some to make room")
        assert full.headers["x-should-retry"] == "false" and "x-should-retry" not in limited.headers  # waiting helps
        # 6 requests admitted so far (acme's refused one spent nothing): the operator's own budget is large, the
        # server's has one left.
        assert client.get("/v1/voices", headers=OPERATOR).status_code == 200
        assert_error(client.get("/v1/voices", headers=OPERATOR), 429, "over 7 requests a minute on this server")
        assert client.get("/healthz").json() == {"status": "ok"}  # liveness spends no one's budget


def test_a_server_without_keys_names_no_key_in_its_rate_limit(tiny_base, tmp_path):
    limits = Limits(TenantLimits(requests_per_minute=1), requests_per_minute=100)
    app, _ = make_app(tiny_base, tmp_path / "store", settings=dataclasses.replace(SETTINGS, limits=limits))
    app.state.server.rate = RateLimiter(clock=lambda: 0.0)
    with TestClient(app) as client:
        assert client.get("/v1/voices").status_code == 200
        assert_error(client.get("/v1/voices"), 429, "over 1 requests a minute for this server's single tenant")


def test_a_client_gone_before_its_body_is_read_is_no_server_error(tenants_app, caplog):
    """A probe's client sent half a body and hung up: a 500 with two tracebacks in the log, counted as a server
    error. It is a 499 (nginx's "client closed request"), logged as information."""
    client, _ = tenants_app
    for path, content_type, begun in [
        ("/v1/audio/speech", b"application/json", b'{"input": "He'),
        (
            "/v1/audio/voice_consents",
            b"multipart/form-data; boundary=x",
            b'--x\r\nContent-Disposition: form-data; name="na',
        ),
    ]:
        arriving = [{"type": "http.request", "body": begun, "more_body": True}, {"type": "http.disconnect"}]
        sent: list[dict] = []

        async def receive(arriving=arriving):
            return arriving.pop(0) if arriving else {"type": "http.disconnect"}

        async def send(message, sent=sent):
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"testserver"), (b"content-type", content_type), (b"content-length", b"400"),
                        (b"authorization", ACME["Authorization"].encode())],
            "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        }  # fmt: skip
        with caplog.at_level(logging.INFO, logger="chorus"):
            client.portal.call(client.app, scope, receive, send)
        starts = [m for m in sent if m["type"] == "http.response.start"]
        assert [m["status"] for m in starts] == [499], (path, starts)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "client closed POST /v1/audio/speech before its request was read" in caplog.text


def test_limits_on_stored_bytes(tiny_base, adapter_folders, tmp_path):
    upload = {"data": {"name": "X"}, "files": [("clips", ("a.wav", b"x", "audio/wav"))]}
    one_voice = sum(f.stat().st_size for f in adapter_folders["ann"].iterdir())
    for case, limits, tenant, message in [
        ("tenant", Limits(TenantLimits(voice_bytes=one_voice)), ACME, "your voices take"),
        ("server", Limits(SETTINGS.limits.tenant, voice_bytes=one_voice), GLOBEX, "this server's voices take"),
    ]:
        app, store = make_app(tiny_base, tmp_path / case, KEYS, dataclasses.replace(SETTINGS, limits=limits))
        store.put_voice("acme", "ann", adapter_folders["ann"])
        assert store.stored_bytes("acme") == store.stored_bytes() >= one_voice and store.stored_bytes("globex") == 0
        with TestClient(app) as client:
            assert_error(client.post("/v1/voices", headers=tenant, **upload), 429, message)


def test_limits_file(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text(
        json.dumps(
            {
                "tenant": {"requests_per_minute": 120, "voices": 50},
                "tenants": {"acme": {"voices": 500}},
                "server": {"requests_per_minute": 3000, "voice_bytes": 1e9},
            }
        )
    )
    limits = Limits.from_file(path)
    assert limits.of("globex") == TenantLimits(requests_per_minute=120, voices=50)
    assert limits.of("acme") == TenantLimits(requests_per_minute=120, voices=500)  # over the file's tenant part
    assert (limits.requests_per_minute, limits.queued_jobs, limits.voice_bytes) == (3000, 32, 10**9)
    for bad, fragment in [
        ({"tenant": {"voices": 0}}, "greater than 0"),
        ({"tenant": {"voice": 5}}, "voice"),
        ({"tenants": {"acme": {"requests": 5}}}, "requests"),
        ({"server": {"voices": 5}}, "server: unknown fields ['voices']"),
        ({"servers": {}}, "unknown parts ['servers']"),
        ([], "expected a JSON object"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            Limits.from_file(path)
        assert str(path) in str(error.value)
    path.write_text("{not json")
    from typer.testing import CliRunner

    from chorus.cli import app

    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "store"), "--limits", str(path)])
    assert result.exit_code == 2 and "limits file" in result.output and "Traceback" not in result.output


def test_a_voice_changed_through_another_server_is_dropped_from_this_ones_model(tiny_base, adapter_folders, tmp_path):
    """Two servers on one store: a voice resident in one's model and then replaced or deleted through the
    other is never spoken stale: the next request loads the new version (the old leaves the model) or
    gets 404 (and the voice leaves the model)."""
    first, first_store = make_app(tiny_base, tmp_path / "store", KEYS)
    second, second_store = make_app(tiny_base, tmp_path / "store", KEYS)
    first_store.put_voice("acme", "ann", adapter_folders["ann"])
    with TestClient(first) as one, TestClient(second) as other:
        engine = other.app.state.server.engine
        assert speak(other, voice="ann").status_code == 200
        (old,) = [key for key in engine.resident() if key.startswith("acme/ann@")]
        assert one.delete("/v1/voices/ann", headers=ACME).status_code == 200
        first_store.put_voice("acme", "ann", adapter_folders["bob"])  # the same id, other weights
        assert speak(other, voice="ann").status_code == 200
        (new,) = [key for key in engine.resident() if key.startswith("acme/ann@")]
        assert new != old
        assert one.delete("/v1/voices/ann", headers=ACME).status_code == 200
        assert_error(speak(other, voice="ann"), 404, "ann")
        assert not [key for key in engine.resident() if key.startswith("acme/ann@")]


def test_a_job_taken_and_finished_by_another_server_leaves_no_copy_here(new_voice_data, tmp_path):
    """A job published by this server's worker and taken from the shared queue by another server's: once
    it ends there, this server's copy of its clips goes at the next sweep; copies of jobs still running
    elsewhere, and uploads still being checked, stay."""
    root, database = f"memory://chorus-{uuid.uuid4().hex}", str(tmp_path / "store.sqlite3")
    with VoiceStore(root, database) as here, VoiceStore(root, database) as there:
        runner = JobRunner(here, tmp_path / "here-jobs", lambda: None, ServerSettings().adapt)
        jobs = []
        for voice_id in ("ann", "bob"):
            job = OnboardingJob(here.create_job("default", voice_id), "default", voice_id, voice_id)
            folder = runner.new_upload_dir()
            shutil.copytree(new_voice_data, folder / "voice")
            runner.submit(folder, job, {"statement": CONSENT})  # published, and queued here
            jobs.append(job)
        taken = [there.claim_next_job(), there.claim_next_job()]
        assert {job.job_id for job in taken} == {job.job_id for job in jobs}  # the other worker has both
        there.update_job(jobs[0].job_id, status="failed", message="ended there")
        checking = runner.new_upload_dir()  # an upload still being checked
        runner.remove_finished()
        left = {p.name for p in runner.jobs_dir.iterdir()}
        assert left == {jobs[1].job_id, checking.name, "consent.jsonl"}
        runner.run(jobs[1])  # its turn here: the other server runs it, so this one leaves it (and its files)
        assert there.get_job("default", jobs[1].job_id).status == JobStatus.RUNNING
        assert (runner.jobs_dir / jobs[1].job_id).is_dir()
        # The other server stops with the job unfinished: interrupted, its files stay here to resume it.
        there.close()
        assert here.recover().interrupted_jobs == [jobs[1].job_id]
        dead = runner.jobs_dir / f".incoming-{there.owner}-{uuid.uuid4().hex}"  # an upload it was checking
        dead.mkdir()
        runner.remove_finished()
        assert {p.name for p in runner.jobs_dir.iterdir()} == {jobs[1].job_id, checking.name, "consent.jsonl"}


def test_inputs_that_broke_the_parsers_are_400s(tenants_app):
    """A lone surrogate in any text field, an ordinal of 500 digits, transcripts nested 100,000 deep."""
    client, _ = tenants_app
    for field in ("input", "model", "voice"):
        body = {"model": "chorus", "input": "Hello there.", "voice": "m3"} | {field: "Hello \ud800 there"}
        response = client.post(
            "/v1/audio/speech", content=json.dumps(body), headers=ACME | {"Content-Type": "application/json"}
        )
        assert_error(response, 400, "not valid Unicode")
    ordinal = f'<speak><say-as interpret-as="ordinal">{"9" * 500}</say-as></speak>'
    assert_error(speak(client, input=ordinal), 400, "at most 30 digits")
    with pytest.raises(UploadError, match="nested over 32 levels deep"):
        parse_transcripts("{" + '"a":[' * 100_000 + "]" * 100_000 + "}")
    # A security probe's body: '"' and escaped quotes, never closed. The scan for strings began a new attempt at
    # each quote and read to the end (64 KB: 28 s on the event loop, every client stalled); it now takes the
    # unterminated string whole in one match, and json.loads refuses it.
    unclosed = b'"' + b'\\"' * 5_000
    assert _STRING.match(unclosed).end() == len(unclosed)
    assert_error(
        client.post("/v1/audio/speech", content=unclosed, headers=ACME | {"Content-Type": "application/json"}),
        400,
        "not valid JSON",
    )
    with pytest.raises(UploadError, match="not valid"):
        parse_transcripts("{" + unclosed.decode())
    # A blend weight of 400 nines was read as inf, the blend as nan, and the model failed: a 500 and a traceback.
    assert_error(speak(client, voice=f"m3({'9' * 400})+f2"), 400, "too large")


def test_a_failed_voice_replaced_at_the_voice_quota_is_not_counted_twice(tmp_path, adapter_folders):
    from chorus.serving.errors import ApiError
    from chorus.serving.quotas import check_onboarding

    store = VoiceStore(str(tmp_path / "store"))
    limits = Limits(TenantLimits(voices=2))
    store.put_voice("acme", "ann", adapter_folders["ann"])
    failed_job = store.create_job("acme", "again", name="Again")
    store.update_job(failed_job, status="failed", message="out of disk")
    assert {v.voice_id: v.status for v in store.list_voices("acme")}["again"] == "failed"
    check_onboarding(store, "acme", limits, queued_here=0)  # 2 voices kept, one of them failed: no 429 yet
    assert store.create_job("acme", "again", name="Again", max_voices=2)  # replacing it: still 2 voices
    with pytest.raises(QuotaReached, match="at most 2"):
        store.create_job("acme", "third", name="Third", max_voices=2)
    with pytest.raises(ApiError, match="delete some to make room"):
        check_onboarding(store, "acme", limits, queued_here=0)  # ann ready, again training: full


def test_a_tenants_refused_requests_leave_the_servers_budget_to_the_others(tiny_base, tmp_path):
    limits = Limits(TenantLimits(requests_per_minute=3), requests_per_minute=5)
    app, _ = make_app(tiny_base, tmp_path / "store", KEYS, dataclasses.replace(SETTINGS, limits=limits))
    app.state.server.rate = RateLimiter(clock=lambda: 0.0)  # no refill while the test runs
    with TestClient(app) as client:
        answers = [client.get("/v1/voices", headers=ACME).status_code for _ in range(10)]
        assert answers == [200] * 3 + [429] * 7  # acme floods: refused for its key, 3 of the server's spent
        assert [client.get("/v1/voices", headers=GLOBEX).status_code for _ in range(2)] == [200, 200]
        assert_error(client.get("/v1/voices", headers=OPERATOR), 429, "over 5 requests a minute on this server")


def test_a_job_whose_failure_the_store_refuses_is_failed_once_it_takes_writes(new_voice_data, tmp_path):
    """A full disk during training, and the database refusing the failure too: the job does not stay
    running (holding the tenant's job slot); the worker records its failure once the store takes writes."""
    import sqlite3

    store = VoiceStore(str(tmp_path / "store"))

    def no_space():
        raise OSError(28, "No space left on device")

    runner = JobRunner(store, tmp_path / "jobs", no_space, ServerSettings().adapt, poll_seconds=None)
    job = OnboardingJob(store.create_job("default", "fiona", name="Fiona"), "default", "fiona", "Fiona")
    shutil.copytree(new_voice_data, tmp_path / "jobs" / job.job_id / "voice")
    update_job, full = store.update_job, [True]

    def refusing_failures(job_id, **fields):
        if full[0] and fields.get("status") == JobStatus.FAILED:
            raise sqlite3.OperationalError("database or disk is full")
        return update_job(job_id, **fields)

    store.update_job = refusing_failures
    try:
        runner.run(job)  # nothing escapes to the worker loop
        assert store.get_job("default", job.job_id).status == JobStatus.RUNNING
        runner.record_failures()  # still full: kept for later
        assert store.get_job("default", job.job_id).status == JobStatus.RUNNING
        full[0] = False
        runner.record_failures()
        record = store.get_job("default", job.job_id)
        assert record.status == JobStatus.FAILED and "internal error" in record.message
        assert store.active_jobs("default") == 0
    finally:
        store.close()


def test_small_requests_for_huge_outputs_are_400s_before_any_synthesis(tenants_app):
    from chorus.text.sentences import estimated_seconds, speech_pieces

    client, _ = tenants_app
    breaks = "<speak>a" + "<break time='10s'/>" * 104 + "</speak>"
    digits = '<speak><say-as interpret-as="digits">' + "7" * 1_900 + "</say-as></speak>"
    # A probe: inline phonemes (which the normalizer drops) and words spelled letter by letter were estimated
    # at 2.8 s and 173 s, and spoke for 715 s (at speed 0.25) and 860 s.
    phonemes = ("[[θːθːθːθːθːθːθː]] " * 216)[:4_096]
    letters = ("bcdfghjklmnpqrstvwxz " * 196)[:4_096]
    for text, speed in ((breaks, 1.0), (digits, 1.0), (phonemes, 0.25), (letters, 1.0)):
        assert len(text) <= 4_096
        for route in ("/v1/audio/speech", "/v1/audio/speech/captioned"):
            body = {"model": "chorus", "input": text, "voice": "m3", "speed": speed}
            assert_error(client.post(route, json=body, headers=ACME), 400, "at most 300 s per request")
    # Plain text of the longest input allowed (OpenAI's 4,096 characters) fits the budget.
    prose = ("The birch canoe slid on the smooth planks. " * 100)[:4_096]
    assert parse_speech({"input": prose, "voice": "m3"}, SETTINGS.max_text_chars).input == prose
    assert 120 < estimated_seconds(speech_pieces(prose)) < 300
    assert estimated_seconds(speech_pieces(prose), speed=2.0) == estimated_seconds(speech_pieces(prose)) / 2


def call_asgi(app, route: str, body: dict, hang_up: bool, on_send=None) -> list[dict]:
    """POST ``body`` to ``route`` straight through ASGI (TestClient buffers whole answers): the client
    hangs up after sending it if ``hang_up``; ``on_send(message)`` sees each message as it is sent."""
    import asyncio

    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        if hang_up:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)  # a client that stays: nothing more to read

    sent = []

    async def send(message):
        sent.append(message)
        if on_send is not None:
            on_send(message)

    headers = [(b"content-type", b"application/json"), (b"authorization", ACME["Authorization"].encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "root_path": "",
    }
    asyncio.run(app(scope, receive, send))
    return sent


def counted_submits(batcher) -> list[str]:
    """The texts ``batcher`` is asked to speak from now on, in order."""
    made, submit = [], batcher.submit

    def counting(text, *args):
        made.append(text)
        return submit(text, *args)

    batcher.submit = counting
    return made


@pytest.mark.parametrize(
    ("route", "response_format"), [("/v1/audio/speech", "flac"), ("/v1/audio/speech/captioned", "wav")]
)
def test_a_client_gone_before_a_whole_answer_stops_its_synthesis(tiny_base, tmp_path, route, response_format):
    """Answers sent whole (flac, captioned) stop once the client has gone: the sentences beyond what was
    already asked for (the first, and for /v1/audio/speech at most STREAM_AHEAD ahead, as a stream's) are never
    queued."""
    from chorus.serving.routes.speech import STREAM_AHEAD

    app, _ = make_app(tiny_base, tmp_path / "store", KEYS)
    text = " ".join(f"Sentence number {n} is here." for n in range(6))
    with TestClient(app):  # the server's start-up (batcher, engine)
        made = counted_submits(app.state.server.batcher)
        body = {"model": "chorus", "input": text, "voice": "m3", "response_format": response_format}
        sent = call_asgi(app, route, body, hang_up=True)
    # /v1/audio/speech makes its first sentence before anything else (a bad voice or text must still be a clean
    # 4xx), then asks ahead as a stream does; the captioned route looks before each sentence.
    assert len(made) <= (1 + STREAM_AHEAD if route == "/v1/audio/speech" else 0) < 6, (made, sent)
    assert sent[0]["status"] == 499


def test_a_streamed_answer_queues_its_sentences_as_it_is_consumed(tiny_base, tmp_path):
    """Ten sentences streamed: when each piece of audio is sent, at most STREAM_AHEAD more sentences of it
    wait in the batcher's queue (they had all been queued at once: another tenant's sentence waited for all)."""
    from chorus.serving.routes.speech import STREAM_AHEAD

    app, _ = make_app(tiny_base, tmp_path / "store", KEYS)
    text = " ".join(f"Sentence number {n} is here." for n in range(10))
    with TestClient(app):
        made = counted_submits(app.state.server.batcher)
        asked_when_sent = []

        def on_send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                asked_when_sent.append(len(made))

        body = {"model": "chorus", "input": text, "voice": "m3", "response_format": "pcm"}
        sent = call_asgi(app, "/v1/audio/speech", body, hang_up=False, on_send=on_send)
    assert sent[0]["status"] == 200 and len(made) == 10
    # The k-th sentence's audio goes out with at most 1 + k + STREAM_AHEAD sentences asked for.
    assert all(count <= min(10, 1 + k + STREAM_AHEAD) for k, count in enumerate(asked_when_sent)), asked_when_sent


def test_store_outages_answer_503_with_retry_after_and_name_nothing_internal(tiny_base, tmp_path, monkeypatch):
    """The shared store's database or object store unreachable: /healthz stays a 200 (degraded, its probe
    cached), reads answer 503 with Retry-After and no host or bucket, aliases and speakers still speak."""
    import psycopg
    from botocore.exceptions import EndpointConnectionError

    app, store = make_app(tiny_base, tmp_path / "store", KEYS, dataclasses.replace(SETTINGS, store_probe_seconds=60))
    with TestClient(app) as client:
        server = app.state.server
        probes = []

        def unreachable_s3(*args, **kwargs):  # the probe file the store writes to its root
            probes.append(1)
            raise EndpointConnectionError(endpoint_url="http://10.1.2.3:9000/secret-bucket")

        monkeypatch.setattr(store.fs, "pipe_file", unreachable_s3)
        server._store_check = (float("-inf"), None)
        for _ in range(3):
            health = client.get("/healthz", headers=OPERATOR)
            assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert len(probes) == 1  # a failed probe is cached as a good one is
        assert client.get("/healthz").json() == {"status": "degraded"}  # no key: the status alone

        def database_down(*args, **kwargs):
            raise psycopg.OperationalError("connection to server at 10.1.2.3, port 5432 failed")

        store.list_voices = store.voice = database_down
        listed = client.get("/v1/voices", headers=ACME)
        assert_error(listed, 503, "cannot be reached right now")
        assert listed.headers["Retry-After"] == "15" and "10.1.2.3" not in listed.text
        assert speak(client, voice="alloy").status_code == 200  # an alias, resolved without the database
        assert speak(client, voice="m3").status_code == 200
        message = f"upload failed: http://10.1.2.3:9000/{store.root}/acme/x unreachable ({store.root})"
        assert "10.1.2.3" not in server.public(message) and store.root not in server.public(message)


def test_a_voice_id_made_from_a_name_folds_its_accents():
    """A new user's probe: "Zoë Ünïcode 声" made the id "zo-n-code", its accented letters cut out."""
    from chorus.serving.onboarding.upload_form import _slug

    assert _slug("Zoë Ünïcode 声") == "zoe-unicode"
    assert _slug("Fiona Four") == "fiona-four" and _slug("声") == ""
