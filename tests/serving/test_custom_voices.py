"""OpenAI's custom voices, end to end with the official ``openai`` SDK against a real ``chorus serve``
(a subprocess on the tiny base): a consent recording, a voice from a sample that speaks at once as its
instant voice, its refinement, deletes; and the refusals (wrong phrase, another speaker, another tenant's
consent, an oversized file, an unknown format). The recordings are espeak-ng's, heard by the shipped
Whisper and judged by the shipped speaker encoder."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import soundfile as sf
import soxr

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from chorus.serving.settings import CONSENT_PHRASES  # noqa: E402
from local_services import free_port  # noqa: E402

KEYS = {"ann-key-0123456789abcdef": "ann", "bob-key-0123456789abcdef": "bob"}


@pytest.fixture(scope="module")
def recordings(custom_voice_recordings, tmp_path_factory) -> dict[str, Path]:
    """conftest's (f4: the consent phrase and a 12 s sample; m3: the sample), a wrong phrase and a text file."""
    folder = tmp_path_factory.mktemp("more_recordings")
    wrong, junk = folder / "wrong.wav", folder / "notes.txt"
    text = "I do not give anyone permission to copy my voice today."
    subprocess.run(["espeak-ng", "-v", "en-us+f4", "-w", str(wrong), text], check=True, timeout=60)
    junk.write_text("not audio at all\n" * 100)
    return {**custom_voice_recordings, "wrong": wrong, "junk": junk}


SERVER_FOLDERS: dict[str, Path] = {}  # a server's URL -> its folder (keys, store, log)


@pytest.fixture(scope="module")
def server_url(tiny_base, tmp_path_factory):
    """``chorus serve`` on the tiny base with two tenants, on a free loopback port."""
    folder = tmp_path_factory.mktemp("custom_voices_server")
    keys = folder / "keys.txt"
    keys.write_text("".join(f"{key} {tenant}\n" for key, tenant in KEYS.items()))
    port = free_port()
    chorus = Path(sys.executable).with_name("chorus")
    command = [str(chorus), "serve", "--store", str(folder / "store"), "--model", str(tiny_base)]
    command += ["--vocoder", "griffin-lim", "--keys", str(keys), "--port", str(port), "--sample-steps", "60"]
    log = open(folder / "server.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    SERVER_FOLDERS[url] = folder
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/healthz", timeout=2).json()["status"] == "ok":
                break
        except (requests.RequestException, ValueError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"chorus serve did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield url
    process.terminate()
    process.wait(30)
    log.close()


def client(url: str, tenant: str = "ann") -> openai.OpenAI:
    key = next(k for k, t in KEYS.items() if t == tenant)
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)


def stage(url: str, voice_id: str) -> dict:
    return requests.get(
        f"{url}/v1/audio/voices/{voice_id}", headers={"Authorization": "Bearer ann-key-0123456789abcdef"}, timeout=30
    ).json()


def test_the_openai_sdk_creates_speaks_refines_and_deletes_a_voice(server_url, recordings):
    ann = client(server_url)
    with open(recordings["consent"], "rb") as recording:
        consent = ann.audio.voice_consents.create(name="Fiona's consent", language="en-US", recording=recording)
    assert consent.object == "audio.voice_consent" and consent.id.startswith("cons_") and consent.language == "en-US"
    assert ann.audio.voice_consents.retrieve(consent.id).name == "Fiona's consent"
    assert ann.audio.voice_consents.update(consent.id, name="Fiona").name == "Fiona"
    assert [c.id for c in ann.audio.voice_consents.list()] == [consent.id]

    with open(recordings["sample"], "rb") as sample:
        voice = ann.audio.voices.create(name="Fiona", consent=consent.id, audio_sample=sample)
    assert voice.object == "audio.voice" and voice.id.startswith("voice_") and voice.name == "Fiona"
    assert voice.type == "audio_sample" and voice.model_extra["stage"] == "instant"
    instant = ann.audio.speech.create(
        model="tts-1", voice={"id": voice.id}, input="Hello there.", response_format="wav"
    )
    assert instant.content[:4] == b"RIFF" and len(instant.content) > 1_000

    deadline = time.monotonic() + 600
    while (now := stage(server_url, voice.id))["stage"] != "adapted":
        assert now["refinement"] != "failed", now
        assert time.monotonic() < deadline, f"not refined in 10 minutes: {now}"
        time.sleep(1)
    # Its refinement replaced the encoder's blend with the one base speaker that fits the sample best.
    assert now["instant"] and "+" not in now["instant"] and "(" not in now["instant"], now
    adapted = ann.audio.speech.create(
        model="tts-1", voice={"id": voice.id}, input="Hello there.", response_format="wav"
    )
    assert adapted.content[:4] == b"RIFF" and adapted.content != instant.content

    with pytest.raises(openai.ConflictError, match="audit record"):
        ann.audio.voice_consents.delete(consent.id)  # a voice made under it still exists
    deleted = ann.audio.voices.delete(voice.id)
    assert deleted.deleted and deleted.id == voice.id
    with pytest.raises(openai.NotFoundError):
        ann.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Hello.")
    assert ann.audio.voice_consents.delete(consent.id).deleted
    assert list(ann.audio.voice_consents.list()) == []


def test_the_refusals(server_url, recordings):
    ann, bob = client(server_url), client(server_url, "bob")
    with open(recordings["wrong"], "rb") as recording, pytest.raises(openai.BadRequestError, match="heard") as wrong:
        ann.audio.voice_consents.create(name="wrong", language="en", recording=recording)
    assert wrong.value.code == "consent_phrase_mismatch"
    with open(recordings["junk"], "rb") as junk, pytest.raises(openai.APIStatusError) as unknown:
        ann.audio.voice_consents.create(name="junk", language="en", recording=junk)
    assert unknown.value.status_code == 415
    with pytest.raises(openai.APIStatusError) as oversized:
        ann.audio.voice_consents.create(name="big", language="en", recording=("big.wav", b"\0" * (11 << 20)))
    assert oversized.value.status_code == 413
    with open(recordings["consent"], "rb") as recording:
        consent = ann.audio.voice_consents.create(name="Fiona", language="en", recording=recording)
    with (
        open(recordings["other"], "rb") as other,
        pytest.raises(openai.BadRequestError, match="speaker score") as mismatch,
    ):
        ann.audio.voices.create(name="Not Fiona", consent=consent.id, audio_sample=other)
    assert mismatch.value.code == "speaker_mismatch"
    with open(recordings["sample"], "rb") as sample, pytest.raises(openai.NotFoundError):
        bob.audio.voices.create(name="Stolen", consent=consent.id, audio_sample=sample)  # ann's consent
    with pytest.raises(openai.NotFoundError):
        bob.audio.voice_consents.retrieve(consent.id)
    assert ann.audio.voice_consents.delete(consent.id).deleted


def test_chorus_serve_refuses_oversized_headers(server_url):
    """A security probe sent ``GET /healthz`` with a 100 MB header, without a key: httptools took it whole (124
    MB of server memory). ``chorus serve`` parses with h11, which stops a request's headers at 16 KB when they
    arrive in pieces; headers that arrive whole (an operator's probe: 17-120 KB in one write were answered, 200 with
    a key) are refused after parsing (431)."""
    assert requests.get(f"{server_url}/healthz", headers={"X-A": "a" * 8_000}, timeout=30).status_code == 200
    with contextlib.suppress(requests.RequestException):  # a 400, or the connection closed on it: never a 200
        assert requests.get(f"{server_url}/healthz", headers={"X-A": "a" * 1_000_000}, timeout=30).status_code == 400
    host, port = urlsplit(server_url).hostname, urlsplit(server_url).port
    for size in (17_000, 60_000):
        with socket.create_connection((host, port), timeout=30) as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * size + b"\r\n\r\n")
            status_line = connection.recv(64).split(b"\r\n")[0]
        assert status_line in (b"HTTP/1.1 431 Request Header Fields Too Large", b"HTTP/1.1 400 Bad Request"), size
    assert requests.get(f"{server_url}/healthz", timeout=30).status_code == 200  # and it serves on


def test_a_consent_keeps_its_sound_not_the_uploads_other_bytes(server_url, recordings, tmp_path):
    """A security probe stored 9.9 MB of random bytes in a consent WAV's ``junk`` chunk (kept base64 in the
    database, outside every quota). What is kept for audit is the decoded sound, as FLAC."""
    padded = tmp_path / "padded.wav"
    wav = Path(recordings["consent"]).read_bytes()
    junk = np.random.default_rng(0).bytes(2 << 20)
    chunk = b"junk" + struct.pack("<I", len(junk)) + junk
    body = wav[12:]  # the chunks after "RIFF" <size> "WAVE"
    padded.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(chunk) + len(body)) + b"WAVE" + chunk + body)
    ann = client(server_url)
    with open(padded, "rb") as recording:
        consent = ann.audio.voice_consents.create(name="Padded", language="en", recording=recording)
    database = sqlite3.connect(SERVER_FOLDERS[server_url] / "store" / "store.sqlite3")
    try:
        [(kept,)] = database.execute("SELECT recording FROM consents WHERE id=?", (consent.id,)).fetchall()
    finally:
        database.close()
    kept = base64.b64decode(kept)
    audio, rate = sf.read(io.BytesIO(kept), dtype="float32")
    original, original_rate = sf.read(recordings["consent"], dtype="float32")
    assert kept[:4] == b"fLaC" and len(kept) < len(wav) and junk[:64] not in kept
    assert rate == original_rate and len(audio) == len(original) and np.abs(audio - original).max() < 1e-4
    assert ann.audio.voice_consents.delete(consent.id).deleted


def test_a_sample_through_a_phone_line_makes_an_instant_voice_that_stays(server_url, recordings, tmp_path):
    """A sample may come at 8 kHz (the speaker check judges it in the band it shares with the consent), but a
    voice is trained from 16 kHz or more: no refinement is queued to fail on it (its answer says why at once),
    and the instant voice speaks."""
    audio, rate = sf.read(recordings["sample"], dtype="float32")
    narrow = tmp_path / "sample-8k.wav"
    sf.write(narrow, soxr.resample(audio, rate, 8_000), 8_000)
    ann = client(server_url)
    with open(recordings["consent"], "rb") as recording:
        consent = ann.audio.voice_consents.create(name="Fiona by phone", language="en", recording=recording)
    with open(narrow, "rb") as sample:
        voice = ann.audio.voices.create(name="Fiona by phone", consent=consent.id, audio_sample=sample)
    for answered in (voice.model_dump(), stage(server_url, voice.id)):  # the creation's answer, and the voice's
        assert answered["stage"] == "instant" and answered["refinement"] == "failed", answered
        assert "recorded at 8000 Hz" in answered["refinement_error"], answered
        assert "16000 Hz or more" in answered["refinement_error"], answered
    # Its consent is in the audit log as any voice's is, though no job ran.
    log = SERVER_FOLDERS[server_url] / "store" / ".jobs" / "consent.jsonl"
    audited = [json.loads(line) for line in log.read_text().splitlines()]
    entry = next(e for e in audited if e["voice_id"] == voice.id)
    assert entry["consent_id"] == consent.id and entry["clips"] == 1 and len(entry["audio_sha256"]) == 64, entry
    speech = ann.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Hello there.", response_format="wav")
    assert speech.content[:4] == b"RIFF" and len(speech.content) > 1_000
    assert ann.audio.voices.delete(voice.id).deleted and ann.audio.voice_consents.delete(consent.id).deleted


@pytest.mark.parametrize(
    ("heard", "accepted"),
    [
        (CONSENT_PHRASES["en"], True),
        (
            "I am the owner of this voice and I consent to Boris using this voice to create a synthetic voice model",
            False,
        ),
        (
            "I am the owner of this voice and I do not consent to Chorus using this voice to create a synthetic voice model.",
            False,
        ),
        (
            "I am not the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model.",
            False,
        ),
        ("I don't consent to Chorus using this voice.", False),
        ("I am the owner of this voice.", False),
        ("The birch canoe slid on the smooth planks.", False),
    ],
)
def test_the_consent_phrase_is_judged_by_its_words(heard, accepted):
    """The server's phrase check reads the words' meaning (tests/serving/test_consent_phrase.py has the
    cases): another company's name, a negation or half the phrase is refused, quoting what was heard."""
    from chorus.evaluation.asr import Transcript, Word
    from chorus.serving.errors import ApiError
    from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
    from chorus.serving.settings import ConsentSettings

    words = tuple(Word(w, 0.3 * k, 0.3 * k + 0.25, 0.9) for k, w in enumerate(heard.split()))
    checks = CustomVoiceChecks(None, ConsentSettings(), transcriber=lambda audio, rate, beam: Transcript(heard, words))
    silence = np.zeros(16000 * 7, np.float32)
    if accepted:
        consent = checks.heard(silence, 16000, "en-GB")
        assert consent.text == heard and consent.verdict.accepted and consent.speech.size > 0
    else:
        with pytest.raises(ApiError, match="must read") as refused:
            checks.heard(silence, 16000, "en")
        assert refused.value.status == 400 and refused.value.code == "consent_phrase_mismatch"
    with pytest.raises(ApiError, match="no consent phrase for language"):
        checks.heard(silence, 16000, "fr-FR")
