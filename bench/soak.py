"""Soak: ten minutes of mixed load on loopback against one real voice server (or several on one shared
store), for errors, latency over time and resident memory over time.

The server is ``chorus serve`` (this tree's CLI, a subprocess on a free loopback port) with an API
keys file of ``--tenants`` tenants and the operator, on a fresh store into which ``--voices``
synthetic ``lora+speaker`` voices (adapter tensors set to small random values, as in
``bench/serving.py``) were put beforehand, spread over the tenants (``VoiceStore.put_voice``).
Its adapter cache (``--cache-mb``) holds about half of them, so voices are loaded and evicted
throughout. Onboarding trains ``--adapt-steps`` steps on ``--adapt-threads`` thread(s), so a job
takes seconds: what is soaked is the job's path through the server (upload, base copy, training,
store commit, cache), not the quality of the voice.

Load, from client threads, each request on a fresh loopback connection, paced (a fixed period with
+-20% jitter, never a backlog burst), for ``--minutes``; per tenant:

* speech (most of the traffic): ``--speech-rate`` requests/s over all tenants, split over
  ``--speech-clients`` threads per tenant; a short sentence (one in five: two, streamed) in one of
  the tenant's voices, one request in ten in a base speaker; WAV, PCM or FLAC;
* catalog: list the tenant's voices, get one, and now and then get another tenant's voice (must
  be 404);
* onboarding, one job at a time per tenant (the limit is two): upload the shipped sample voice
  (17 clips, 61 s; as files with transcripts or as a zip archive, alternately), poll its job every
  second until it ends, speak with the new voice three times, get it, delete it, and check that
  speaking it then is a 404; every ``--cancel-every``-th job is cancelled at its first poll
  instead (then its voice is deleted); ``--upload-pause`` seconds between jobs;
* the operator: the detailed ``/healthz`` every 5 s (resident voices and bytes) and ``/metrics``
  every 30 s;
* a *flood tenant* (``--flood-streams``, 0 for none), as a hostile user: that many streamed PCM
  requests at once, each ~``--flood-chars`` characters (about 50 sentences, the most one request may
  carry), each read to its end and followed by the next at once;
* a *polite tenant*: one short sentence (PCM, a base speaker) every ``--polite-period`` seconds. It
  runs alone on the servers for ``--idle-seconds`` before the rest of the load starts (its idle
  latency), then as long again beside the flood and nothing else (the batcher's fairness alone: no
  other tenant's speech, no training), then through the whole load. Target: its p99 beside the flood
  at most 5x its idle p99; the ratio under the whole load is reported beside it.

Every request is recorded: when, kind, status, latency (connect to last byte) and the time to its
first body byte (for speech: the first audio). An error is a
connection failure or timeout, any 5xx, any status outside the ones expected for its kind, or a body
that is not what that kind returns (speech: a WAV/FLAC header and audio, or non-empty PCM; JSON
routes: the ids asked for, only the tenant's own voices in its list). A 429 is counted as
"limited", apart from errors (each tenant stays well under its 600 requests a minute). The
server's RSS, threads and open file descriptors are read from ``/proc/PID`` every second.

Targets: 0 errors; resident memory flat after warm-up: the median RSS over the last 30 s against
the median over the 30 s after warm-up grows less than 5%. Warm-up is the first fifth of the run
(2 of 10 minutes; shorter runs scale it and the windows down). Steps: the largest rise of the
median RSS over 30 s against the 30 s before (target: none > 100 MB), and the RSS just before each
onboarding job's upload against 5-15 s after its end (whether jobs step the memory up, and whether
the steps stop). Then the server is stopped with
SIGINT and must exit 0, and its store is checked offline: the pre-registered voices ready and
intact (``VoiceStore.verify``), every uploaded voice deleted, every job finished, no job files left.

    python bench/soak.py --out bench/results/soak

With ``--servers 2`` (or more) the same load runs against several servers on one shared store, each on its
own port (no load balancer: each request goes to a server drawn at random), the store being S3 (moto's
server) and PostgreSQL (a throwaway cluster) unless ``--store URL --database URL`` name real ones. Each
onboarded voice is then spoken and read on another server than the one that took its upload, right after
its job is seen done, and asked for there again after its deletion: any stale read is an error. Before the
load, the speech throughput of one server is measured against that of all of them (closed-loop clients,
alternating rounds; target: two one-thread servers at least 1.8x one). Per server: requests, latency,
errors, RSS.

    python bench/soak.py --servers 2 --out bench/results/soak-2-servers

With ``--trace-memory`` the servers run under tracemalloc (``bench/traced_serve.py``; slower, so not for
latency): a snapshot at warm-up's end and one at the load's end say how much of the RSS growth is Python
objects, and which lines allocate what grew.

    python bench/soak.py --minutes 15 --trace-memory --out bench/results/soak-traced

Writes ``soak.md``, ``soak.json`` and ``soak.png`` (p50/p99 latency per kind over time; RSS over time).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import itertools
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus.serving.settings import ServerSettings
from chorus.serving.store import FINISHED_JOB, VoiceStatus, VoiceStore
from chorus.serving.store.metadata import public_url
from chorus.serving.tenants import OPERATOR_TENANT
from chorus.synthesis import SAMPLE_VOICE, load_base
from run_record import LoadSampler, latency_ms, machine, percentile, tree_at  # bench/, beside this script
from run_record import closed_loop as run_clients
from servers import (
    batcher_counters,
    chorus_command,
    descendants_rss,
    free_port,
    launch,
    multipart,
    post_json,
    process_rss,
    request,
    wait_idle,
)
from servers import get as http_get
from servers import stop as stop_server
from serving import MB, TEXTS, make_voices

# The throwaway PostgreSQL and S3 live with the tests (tests/local_services.py), outside the package that ships.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import local_services  # noqa: E402

GROWTH_TARGET = 0.05
STEP_TARGET = 100 * (1 << 20)  # bytes: no step of resident memory larger (issue 31)
POLITE_TARGET = 5.0  # the polite tenant's p99 under the flood, at most this times its idle p99 (issue 31)
THROUGHPUT_TARGET = 1.8  # two servers, one thread each, against one (issue 20)
TRACED_SERVE = Path(__file__).with_name("traced_serve.py")  # chorus under tracemalloc (--trace-memory)
# Statuses each kind of request may answer besides 429 (counted as limited); anything else is an error.
EXPECTED = {
    "speech": {200},
    "speech-new": {200},  # in a voice just onboarded (its first request loads it)
    "speech-deleted": {404},  # in that voice once deleted
    "list": {200},
    "get": {200},
    "get-foreign": {404},  # another tenant's voice
    "upload": {202},
    "job": {200},
    "cancel": {200, 409},  # 409: the job ended before the cancel reached it
    "delete": {200},
    "healthz": {200},
    "metrics": {200},
    "polite": {200},  # the polite tenant's one sentence, alone before the load ("idle") and under the flood
    "flood": {200},  # the flood tenant's long streamed texts
}
CONSENT = "The recorded speaker (Piper joe, CC0) consented to synthetic voices; soak benchmark."
FORMATS = ["wav"] * 7 + ["pcm"] * 2 + ["flac"]
SHOWN = ("speech", "polite", "flood", "speech-new", "list", "get", "upload", "job", "delete")  # in tables, plots


# -- the requests --------------------------------------------------------------------------------
@dataclass
class Call:
    at: float  # seconds since the load started, when the request was sent
    kind: str
    tenant: str
    status: int  # 0: no answer (connection failure, timeout, cut-short body)
    seconds: float
    outcome: str  # ok | limited | error
    server: int = 0  # which server answered (an index into the ports)
    first_byte: float = 0.0  # seconds to the first byte of the body (the whole time without an answer)


@dataclass
class Recorder:
    """Sends requests to the servers and records each one: its kind, server, status, latency and outcome.
    A request goes to the server given, else to one drawn at random (every server shares the store)."""

    ports: list[int]
    start: float
    calls: list[Call] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(
        self,
        kind: str,
        tenant: str,
        key: str,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str | None = None,
        check=None,
        timeout: float = 120.0,
        server: int | None = None,
    ) -> tuple[int, bytes]:
        """``(status, body)``, ``(0, b"")`` without an answer. ``check(body) -> problem | None`` runs on
        an expected status."""
        server = random.randrange(len(self.ports)) if server is None else server
        began = time.monotonic()
        headers = {"Authorization": f"Bearer {key}"}
        if content_type:
            headers["Content-Type"] = content_type
        # A fresh connection per request: an idle kept-alive one closed by the server (uvicorn closes
        # them after 5 s) would otherwise fail the next request for a reason of the client's making.
        connection = http.client.HTTPConnection("127.0.0.1", self.ports[server], timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            first = response.read(1)  # speech: the first audio, as a client playing it would hear it
            first_byte = time.monotonic() - began
            status, data = response.status, first + response.read()
        except (OSError, http.client.HTTPException) as error:
            status, data, problem = 0, b"", f"no answer: {error!r}"
            first_byte = time.monotonic() - began
        else:
            problem = None
            if status != 429 and status not in EXPECTED[kind]:
                problem = f"status {status}: {data[:300].decode(errors='replace')}"
            elif status != 429 and check is not None:
                try:
                    problem = check(data)
                except (ValueError, KeyError, TypeError) as error:  # a body that is not the JSON expected
                    problem = f"bad body ({error!r}): {data[:200]!r}"
        finally:
            connection.close()
        took = time.monotonic() - began
        outcome = "error" if problem else "limited" if status == 429 else "ok"
        with self.lock:
            self.calls.append(Call(began - self.start, kind, tenant, status, took, outcome, server, first_byte))
            if problem:
                self.errors.append(
                    {
                        "at_s": round(began - self.start, 2),
                        "kind": kind,
                        "tenant": tenant,
                        "server": server,
                        "request": f"{method} {path}",
                        "problem": problem,
                    }
                )
        return status, data

    def speech(
        self,
        kind: str,
        tenant: Tenant,
        text: str,
        voice: str,
        response_format: str,
        server: int | None = None,
        timeout: float = 120.0,
    ) -> int:
        """``POST /v1/audio/speech``; its status. Audio is checked unless the kind expects none."""
        body = json.dumps({"model": "tts-1", "input": text, "voice": voice, "response_format": response_format})
        check = audio_check(response_format) if 200 in EXPECTED[kind] else None
        status, _ = self.send(
            kind,
            tenant.name,
            tenant.key,
            "POST",
            "/v1/audio/speech",
            body.encode(),
            "application/json",
            check,
            timeout,
            server,
        )
        return status

    def note(self, kind: str, tenant: str, problem: str) -> None:
        """An error that is no single request's answer (a job that never ends)."""
        with self.lock:
            self.errors.append(
                {"at_s": round(time.monotonic() - self.start, 2), "kind": kind, "tenant": tenant, "problem": problem}
            )


def audio_check(response_format: str):
    def check(data: bytes) -> str | None:
        if response_format == "wav" and (data[:4] != b"RIFF" or len(data) <= 44):
            return f"not a WAV with audio ({len(data)} bytes, starts {data[:4]!r})"
        if response_format == "flac" and (data[:4] != b"fLaC" or len(data) <= 42):
            return f"not a FLAC with audio ({len(data)} bytes, starts {data[:4]!r})"
        if response_format == "pcm" and (not data or len(data) % 2):
            return f"not 16-bit PCM ({len(data)} bytes)"
        return None

    return check


def json_check(test):
    """A check that parses the body as JSON and runs ``test(parsed) -> problem | None`` on it."""
    return lambda data: test(json.loads(data))


@dataclass(frozen=True)
class Sample:
    """The upload material: the shipped sample voice as clip files with transcripts, and as a zip."""

    clips: list[tuple[str, bytes]]
    transcripts: str  # JSON {filename: text}
    archive: bytes

    @classmethod
    def load(cls, folder: Path) -> Sample:
        lines = [line.split("|", 1) for line in (folder / "metadata.csv").read_text().splitlines() if line]
        clips = [(f"{utt}.flac", (folder / "wavs" / f"{utt}.flac").read_bytes()) for utt, _ in lines]
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:  # FLAC does not compress further
            archive.writestr("metadata.csv", (folder / "metadata.csv").read_text())
            for name, data in clips:
                archive.writestr(f"wavs/{name}", data)
        return cls(clips, json.dumps({f"{utt}.flac": text for utt, text in lines}), buffer.getvalue())

    def form(self, name: str, voice_id: str, as_archive: bool) -> tuple[bytes, str]:
        fields = {"name": name, "consent": CONSENT, "id": voice_id}
        if as_archive:
            return multipart(fields, [("archive", "voice.zip", self.archive, "application/zip")])
        files = [("clips", filename, data, "audio/flac") for filename, data in self.clips]
        return multipart(fields | {"transcripts": self.transcripts}, files)


# -- the load ------------------------------------------------------------------------------------
def paced(stop: threading.Event, period: float, rng: random.Random, action) -> None:
    """``action()`` every ``period`` seconds (+-20% jitter, random phase) until ``stop``; a late one
    is followed by the next at once, not by a burst catching up."""
    next_at = time.monotonic() + rng.uniform(0, period)
    while not stop.wait(max(0.0, next_at - time.monotonic())):
        action()
        next_at = max(next_at + period * rng.uniform(0.8, 1.2), time.monotonic())


@dataclass
class Tenant:
    name: str
    key: str
    voices: list[str]  # pre-registered, ready throughout


@dataclass
class Load:
    """The client threads of the soak and what they share."""

    recorder: Recorder
    tenants: list[Tenant]
    operator_key: str
    speakers: list[str]
    sample: Sample
    args: argparse.Namespace
    flood: Tenant | None = None  # sends --flood-streams long streamed texts at once, back to back
    polite: Tenant | None = None  # one short sentence at a time, every --polite-period seconds
    stop: threading.Event = field(default_factory=threading.Event)
    jobs: list[dict] = field(default_factory=list)  # every accepted upload: tenant, voice, job, how it ended
    health: list[dict] = field(default_factory=list)  # /healthz samples of the operator

    def threads(self) -> list[threading.Thread]:
        per_client = len(self.tenants) * self.args.speech_clients / self.args.speech_rate
        targets = []
        for t, tenant in enumerate(self.tenants):
            for c in range(self.args.speech_clients):
                targets.append((f"speech-{tenant.name}-{c}", self.speech_loop, (tenant, per_client, 100 * t + c)))
            targets.append((f"catalog-{tenant.name}", self.catalog_loop, (tenant, 100 * t + 50)))
            targets.append((f"onboarding-{tenant.name}", self.onboarding_loop, (tenant, 100 * t + 60)))
        targets.append(("operator", self.operator_loop, (10_000,)))
        if self.flood is not None:
            targets += [(f"flood-{k}", self.flood_loop, (20_000 + k,)) for k in range(self.args.flood_streams)]
        if self.polite is not None:
            targets.append(
                ("polite", polite_loop, (self.recorder, self.stop, self.polite, self.speakers[0], self.args))
            )
        return [
            threading.Thread(target=self.guarded, args=(target, *args), name=name, daemon=True)
            for name, target, args in targets
        ]

    def guarded(self, target, *args) -> None:
        """Run a client loop; a client that dies is an error of the soak (it would silently lower the load)."""
        try:
            target(*args)
        except Exception as error:  # noqa: BLE001 - reported, not raised in a thread nobody joins for it
            self.recorder.note("client", threading.current_thread().name, f"client thread died: {error!r}")

    def speak(self, kind: str, tenant: Tenant, voice: str, rng: random.Random, server: int | None = None) -> int:
        response_format = rng.choice(FORMATS)
        text = rng.choice(TEXTS) if rng.random() < 0.8 else " ".join(rng.sample(TEXTS, 2))  # two: streamed
        return self.recorder.speech(kind, tenant, text, voice, response_format, server)

    def speech_loop(self, tenant: Tenant, period: float, seed: int) -> None:
        rng = random.Random(self.args.seed * 1_000_003 + seed)

        def one() -> None:
            voice = rng.choice(self.speakers) if rng.random() < 0.1 else rng.choice(tenant.voices)
            self.speak("speech", tenant, voice, rng)

        paced(self.stop, period, rng, one)

    def flood_loop(self, seed: int) -> None:
        flood_stream(self.recorder, self.stop, self.flood, self.speakers[-1], self.args, seed)

    def catalog_loop(self, tenant: Tenant, seed: int) -> None:
        rng = random.Random(self.args.seed * 1_000_003 + seed)
        others = [v for t in self.tenants if t is not tenant for v in t.voices]
        step = iter(range(1 << 62))

        def listed(data: dict) -> str | None:
            custom = {v["id"]: v["status"] for v in data["data"] if v["type"] != "base"}
            foreign = [v for v in custom if not v.startswith(f"{tenant.name}-")]
            missing = [v for v in tenant.voices if custom.get(v) != VoiceStatus.READY]
            if foreign or missing:
                return f"list: foreign voices {foreign[:3]}, pre-registered not ready {missing[:3]}"
            return None

        def one() -> None:
            n = next(step)
            if n % 10 == 9:
                voice = rng.choice(others)
                self.recorder.send("get-foreign", tenant.name, tenant.key, "GET", f"/v1/voices/{voice}")
            elif n % 2:
                voice = rng.choice(tenant.voices)
                check = json_check(
                    lambda d: None if (d["id"], d["status"]) == (voice, "ready") else f"get {voice}: {d}"
                )
                self.recorder.send("get", tenant.name, tenant.key, "GET", f"/v1/voices/{voice}", check=check)
            else:
                self.recorder.send("list", tenant.name, tenant.key, "GET", "/v1/voices", check=json_check(listed))

        paced(self.stop, 2.0, rng, one)

    def onboarding_loop(self, tenant: Tenant, seed: int) -> None:
        """One onboarding job at a time: upload, poll to its end, use the voice, delete it."""
        rng = random.Random(self.args.seed * 1_000_003 + seed)
        if self.stop.wait(rng.uniform(0, self.args.upload_pause)):  # tenants' uploads out of step
            return
        number = 0
        while not self.stop.is_set():
            voice_id = f"{tenant.name}-up{number:03d}"
            body, content_type = self.sample.form(f"Upload {number} of {tenant.name}", voice_id, number % 2 == 1)
            check = json_check(lambda d, v=voice_id: None if d["voice"] == v and d["id"] else f"upload: {d}")
            writer = rng.randrange(len(self.recorder.ports))
            status, data = self.recorder.send(
                "upload", tenant.name, tenant.key, "POST", "/v1/voices", body, content_type, check, server=writer
            )
            if status == 429:
                self.stop.wait(5.0)
                continue
            number += 1
            if status == 202:
                self.follow(
                    tenant,
                    voice_id,
                    json.loads(data)["id"],
                    cancel=number % self.args.cancel_every == 0,
                    rng=rng,
                    writer=writer,
                )
            self.stop.wait(self.args.upload_pause * rng.uniform(0.8, 1.2))

    def follow(self, tenant: Tenant, voice_id: str, job_id: str, cancel: bool, rng: random.Random, writer: int) -> None:
        """Poll a job to its end (cancelling it at the first poll if ``cancel``), then use and delete its
        voice. At the soak's end a job still going is cancelled, so the store is left clean. With several
        servers the job is polled on any, the voice is spoken and read on another server than the one
        that took the upload (``writer``) right after the job is seen done, deleted through the writer
        and asked for again on the other: each a read across servers."""
        other = (writer + 1) % len(self.recorder.ports)
        job = {
            "tenant": tenant.name,
            "voice": voice_id,
            "job": job_id,
            "cancelled": False,
            "status": None,
            "writer": writer,
            "reader": other,
            "uploaded_at_s": round(time.monotonic() - self.recorder.start, 1),
        }
        self.jobs.append(job)
        began = time.monotonic()
        status = None
        while True:
            code, data = self.recorder.send(
                "job", tenant.name, tenant.key, "GET", f"/v1/jobs/{job_id}", check=json_check(lambda d: None)
            )
            if code == 200:
                answer = json.loads(data)
                status, job["message"] = answer["status"], answer["message"]
                if status in FINISHED_JOB:
                    break
            if time.monotonic() - began > self.args.job_timeout:
                self.recorder.note("job", tenant.name, f"job {job_id} not finished after {self.args.job_timeout:g} s")
                break  # deleting its voice below fails it
            if not job["cancelled"] and (cancel or self.stop.is_set()):
                self.recorder.send("cancel", tenant.name, tenant.key, "POST", f"/v1/jobs/{job_id}/cancel")
                job["cancelled"] = "planned" if cancel else "at the end"
                continue  # poll at once: it is failed now, or it had ended
            time.sleep(1.0)
        job["status"], job["seconds"] = status, round(time.monotonic() - began, 1)
        job["ended_at_s"] = round(time.monotonic() - self.recorder.start, 1)
        if status == "done":
            seen_done = time.monotonic()
            for _ in range(3):
                if self.speak("speech-new", tenant, voice_id, rng, server=other) == 200 and "spoken_after_s" not in job:
                    job["spoken_after_s"] = round(time.monotonic() - seen_done, 3)  # done -> audio from the other
            check = json_check(lambda d: None if d["id"] == voice_id else f"get {voice_id}: {d}")
            self.recorder.send(
                "get", tenant.name, tenant.key, "GET", f"/v1/voices/{voice_id}", check=check, server=other
            )
        check = json_check(lambda d: None if d["id"] == voice_id and d["deleted"] else f"delete: {d}")
        self.recorder.send(
            "delete", tenant.name, tenant.key, "DELETE", f"/v1/voices/{voice_id}", check=check, server=writer
        )
        if status == "done":
            self.speak("speech-deleted", tenant, voice_id, rng, server=other)

    def operator_loop(self, seed: int) -> None:
        rng = random.Random(seed)
        step = iter(range(1 << 62))

        def healthy(data: dict) -> str | None:
            with self.recorder.lock:
                self.health.append(
                    {
                        "at_s": round(time.monotonic() - self.recorder.start, 1),
                        "resident_voices": data["resident_voices"],
                        "resident_bytes": data["resident_bytes"],
                        "queued": data["onboarding"]["queued"],
                        "running": data["onboarding"]["running"],
                    }
                )
            return None if data["status"] == "ok" else f"healthz: {data}"

        def one() -> None:
            key = self.operator_key
            self.recorder.send("healthz", OPERATOR_TENANT, key, "GET", "/healthz", check=json_check(healthy))
            if next(step) % 6 == 5:
                self.recorder.send("metrics", OPERATOR_TENANT, key, "GET", "/metrics", check=metrics_check)

        paced(self.stop, 5.0, rng, one)


def flood_stream(
    recorder: Recorder, stop: threading.Event, tenant: Tenant, speaker: str, args: argparse.Namespace, seed: int
) -> None:
    """A hostile tenant's stream: the longest text allowed, streamed as PCM and read to its end, then the
    next at once, until ``stop``."""
    rng = random.Random(args.seed * 1_000_003 + seed)
    while not stop.is_set():
        recorder.speech("flood", tenant, flood_text(rng, args.flood_chars), speaker, "pcm", timeout=600.0)


def flood_text(rng: random.Random, chars: int) -> str:
    """Sentences drawn from ``TEXTS`` up to ``chars`` characters: about 50 of them for 1,990."""
    sentences: list[str] = []
    while len(" ".join([*sentences, candidate := rng.choice(TEXTS)])) <= chars:
        sentences.append(candidate)
    return " ".join(sentences)


def polite_loop(recorder: Recorder, stop: threading.Event, tenant: Tenant, speaker: str, args) -> None:
    """The polite tenant: one short sentence (PCM, a base speaker) every ``--polite-period`` seconds."""
    rng = random.Random(args.seed * 1_000_003 + 30_000)

    paced(stop, args.polite_period, rng, lambda: recorder.speech("polite", tenant, rng.choice(TEXTS), speaker, "pcm"))


def polite_alone(ports: list[int], tenant: Tenant, speaker: str, args) -> Recorder:
    """The polite tenant alone on the servers for ``--idle-seconds``, before any other load: its idle latency."""
    for port in ports:  # untimed: the first request of a server pays for what it loads on first use
        post_json(port, "/v1/audio/speech", {"model": "tts-1", "input": TEXTS[0], "voice": speaker}, tenant.key)
    recorder = Recorder(ports, time.monotonic())
    polite_for(recorder, tenant, speaker, args)
    return recorder


def polite_for(recorder: Recorder, tenant: Tenant, speaker: str, args: argparse.Namespace) -> None:
    """The polite tenant's requests into ``recorder`` for ``--idle-seconds``; returns when its last has ended."""
    stop = threading.Event()
    thread = threading.Thread(target=polite_loop, args=(recorder, stop, tenant, speaker, args), daemon=True)
    thread.start()
    time.sleep(args.idle_seconds)
    stop.set()
    thread.join()


def polite_beside_flood(
    ports: list[int], flood: Tenant, polite: Tenant, speakers: list[str], args: argparse.Namespace
) -> Recorder:
    """The polite tenant beside the flood tenant's ``--flood-streams`` streams and nothing else, for
    ``--idle-seconds`` (after 5 s in which the streams fill the queue): the batcher's fairness between two
    tenants, without the CPU that the mixed load's speech and training take. Returns once the streams in
    flight have ended."""
    recorder, stop = Recorder(ports, time.monotonic()), threading.Event()
    streams = [
        threading.Thread(target=flood_stream, args=(recorder, stop, flood, speakers[-1], args, 40_000 + k), daemon=True)
        for k in range(args.flood_streams)
    ]
    for stream in streams:
        stream.start()
    time.sleep(5.0)
    polite_for(recorder, polite, speakers[0], args)
    stop.set()
    for stream in streams:
        stream.join()
    return recorder


def metrics_check(data: bytes) -> str | None:
    return None if b"chorus_" in data else "no chorus_ series in /metrics"


def sample_process(pid: int, start: float, stop: threading.Event, out: list[dict]) -> None:  # one per server
    """RSS, threads and open file descriptors of the server every second (a leak shows in any), and the RSS
    of the processes it started (onboarding jobs)."""
    while not stop.wait(1.0):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return  # the process is gone
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        out.append(
            {
                "at_s": round(time.monotonic() - start, 2),
                "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
                "threads": int(fields["Threads"]),
                "fds": fds,
                "children_rss_bytes": descendants_rss(pid),
            }
        )


# -- the server ----------------------------------------------------------------------------------
def prepare_store(args, store: StoreSpec) -> tuple[list[Tenant], list[Tenant], str, Path]:
    """A store with ``--voices`` synthetic voices over the tenants, and the keys file for them; with
    ``--flood-streams``, also the flood and polite tenants (no voices of their own: base speakers)."""
    synthesizer = load_base(None, "griffin-lim")
    folders = make_voices(synthesizer, args.voices, args.work / "voices", args.method, args.adapter_scale, args.seed)
    tenants = [Tenant(f"t{t}", secrets.token_urlsafe(24), []) for t in range(args.tenants)]
    with store.open(args.work / "prepare-cache") as voices:
        for k, folder in enumerate(folders[v] for v in sorted(folders)):
            tenant = tenants[k % len(tenants)]
            voice_id = f"{tenant.name}-v{k:03d}"
            voices.put_voice(tenant.name, voice_id, folder)
            tenant.voices.append(voice_id)
    extra = [Tenant(name, secrets.token_urlsafe(24), []) for name in ("flood", "polite")] if args.flood_streams else []
    operator_key = secrets.token_urlsafe(24)
    keys = args.work / "keys.txt"
    keys.write_text("".join(f"{t.key} {t.name}\n" for t in [*tenants, *extra]) + f"{operator_key} {OPERATOR_TENANT}\n")
    return tenants, extra, operator_key, keys


@dataclass(frozen=True)
class StoreSpec:
    """Where the servers keep voices: a folder (SQLite inside), or an object store URL and a database."""

    root: str
    database: str | None = None

    def open(self, cache: Path) -> VoiceStore:
        return VoiceStore(self.root, self.database, str(cache) if self.database else None)

    def server_options(self, folder: Path) -> list[str]:
        options = ["--store", self.root]
        if self.database:
            options += ["--database", self.database, "--cache-dir", str(folder / "cache")]
        return options


@dataclass
class Server:
    """One ``chorus serve`` process of the soak, with its own folder (cache, job files when the store is
    remote) and log."""

    process: subprocess.Popen
    command: list[str]
    port: int
    folder: Path
    samples: list[dict] = field(default_factory=list)  # /proc readings during the load

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"


def start_server(args, store: StoreSpec, keys: Path, limits: Path | None, folder: Path) -> Server:
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # --trace-memory: the same command under tracemalloc (bench/traced_serve.py), snapshots on SIGUSR1.
    chorus = [sys.executable, str(TRACED_SERVE)] if args.trace_memory else chorus_command()
    command = [
        *chorus,
        "serve",
        *store.server_options(folder),
        "--port",
        str(port),
        "--keys",
        str(keys),
        "--cache-mb",
        f"{args.cache_mb:g}",
        "--adapt-steps",
        str(args.adapt_steps),
        "--adapt-threads",
        str(args.adapt_threads),
        *(["--limits", str(limits)] if limits else []),
        *niceness_options(args),
    ]
    environment = os.environ | {"OMP_NUM_THREADS": str(args.threads), "CHORUS_SNAPSHOTS": str(folder / "snapshots")}
    process = launch(command, port, folder / "server.log", env=environment, cwd=folder)
    return Server(process, command, port, folder)


def niceness_options(args: argparse.Namespace) -> list[str]:
    """``--job-niceness`` for the server where the bench was given one; none (the server's default) where
    it was not or has no such option (bench/first_audio.py starts its server through :func:`start_server`)."""
    niceness = getattr(args, "job_niceness", None)
    return [] if niceness is None else ["--job-niceness", str(niceness)]


def take_snapshot(server: Server, limit_s: float = 120.0) -> Path | None:
    """Have a ``--trace-memory`` server write its next tracemalloc snapshot; its path, None if it did not."""
    folder = server.folder / "snapshots"
    before = len(list(folder.glob("snapshot-*.pickle"))) if folder.is_dir() else 0
    server.process.send_signal(signal.SIGUSR1)
    path = folder / f"snapshot-{before + 1}.pickle"
    deadline = time.monotonic() + limit_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    return path if path.exists() else None


def python_growth(first: Path, last: Path, top: int = 12) -> dict:
    """What the server's Python objects grew by between two tracemalloc snapshots: the total and the
    allocation sites whose size changed most, up or down (each with the innermost frames of Chorus's code
    that led there): a site missing from them changed by less than the last one listed."""
    before, after = (tracemalloc.Snapshot.load(str(p)) for p in (first, last))
    ignore = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    ]
    before, after = before.filter_traces(ignore), after.filter_traces(ignore)
    rows = []
    for stat in after.compare_to(before, "traceback")[:top]:
        frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback]
        ours = [f"{f.filename.split('/chorus/')[-1]}:{f.lineno}" for f in stat.traceback if "/chorus/" in f.filename]
        rows.append(
            {"growth_bytes": stat.size_diff, "count_diff": stat.count_diff, "where": frames[-1], "chorus": ours[-3:]}
        )
    totals = [sum(s.size for s in snap.statistics("filename")) for snap in (before, after)]
    return {"before_bytes": totals[0], "after_bytes": totals[1], "top": rows}


def drain(port: int, operator_key: str, timeout: float) -> float | None:
    """Wait until the onboarding worker is idle (``/healthz``), so the stop finds no job mid-way and the
    job files of cancelled jobs still queued are gone; seconds waited, None if it never was."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        onboarding = json.loads(http_get(port, "/healthz", operator_key))["onboarding"]
        if onboarding["queued"] == 0 and not onboarding["running"]:
            return round(time.monotonic() - began, 1)
        time.sleep(1.0)
    return None


def check_store(store_spec: StoreSpec, servers: list[Server], tenants: list[Tenant], jobs: list[dict]) -> dict:
    """The store after shutdown, read offline: what should be there is, and nothing else."""
    with store_spec.open(servers[0].folder.parent / "check-cache") as store:
        expected = {t.name: set(t.voices) for t in tenants}
        found = {t.name: {v.voice_id: v.status for v in store.list_voices(t.name)} for t in tenants}
        missing = sorted(v for t in tenants for v in t.voices if found[t.name].get(v) != VoiceStatus.READY)
        left = sorted(v for t in tenants for v in found[t.name] if v not in expected[t.name])
        unfinished = [j["job"] for j in jobs if store.get_job(j["tenant"], j["job"]).status not in FINISHED_JOB]
        report = store.verify()
        interrupted = [j.job_id for j in store.interrupted_jobs()]
        # Job files: in each server's jobs folder, and published under a remote root.
        jobs_dirs = [Path(store.root) / ".jobs"] if store.local else [s.folder / ".jobs" for s in servers]
        published = [] if store.local else list(store.fs.find(f"{store.root}/.jobs"))
    leftovers = sorted(p.name for d in jobs_dirs if d.exists() for p in d.iterdir() if p.name != "consent.jsonl")
    leftovers += published
    consents = sum(
        len((d / "consent.jsonl").read_text().splitlines()) for d in jobs_dirs if (d / "consent.jsonl").exists()
    )
    result = {
        "ready_voices_missing": missing,
        "uploaded_voices_left": left,
        "jobs_unfinished": unfinished,
        "jobs_interrupted": interrupted,
        "verified_voices": report.checked,
        "corrupt": [list(c) for c in report.corrupt],
        "orphan_folders": report.orphan_folders,
        "job_files_left": leftovers,
        "consent_records": consents,
        "jobs_accepted": len(jobs),
    }
    result["ok"] = not (missing or left or unfinished or interrupted or report.corrupt or report.orphan_folders)
    result["ok"] = result["ok"] and not leftovers and consents == len(jobs)
    return result


def server_log(path: Path) -> dict:
    """Log lines by level, the warnings, errors and tracebacks (each distinct line once, with its count)
    and the log's last lines (what the process said as it stopped)."""
    lines = path.read_text(errors="replace").splitlines()
    levels = Counter(line.split(":", 1)[0] for line in lines if line[:1].isupper() and ":" in line[:10])
    notable = Counter(
        line for line in lines if "Traceback" in line or line.startswith(("ERROR", "WARNING", "CRITICAL"))
    )
    return {
        "lines": len(lines),
        "levels": dict(levels),
        "notable": [{"line": line, "count": n} for line, n in notable.most_common(20)],
        "notable_count": sum(notable.values()),
        "tail": lines[-15:],
    }


# -- summaries -----------------------------------------------------------------------------------
def summarize(calls: list[Call], duration: float, bins: int) -> dict:
    kinds = [k for k in EXPECTED if any(c.kind == k for c in calls)]
    totals = {}
    for kind in kinds:
        mine = [c for c in calls if c.kind == kind]
        outcomes = Counter(c.outcome for c in mine)
        totals[kind] = {
            "requests": len(mine),
            "ok": outcomes["ok"],
            "limited": outcomes["limited"],
            "errors": outcomes["error"],
            "statuses": {str(s): n for s, n in sorted(Counter(c.status for c in mine).items())},
            **latency_ms([c.seconds for c in mine if c.outcome == "ok"]),
        }
    width = duration / bins
    series = []
    for b in range(bins):
        # The last bin also takes the requests of the cleanup after the load (jobs cancelled at the end).
        inside = [c for c in calls if b * width <= c.at < (b + 1) * width or (b == bins - 1 and c.at >= duration)]
        series.append(
            {
                "from_s": b * width,
                "to_s": (b + 1) * width,
                "kinds": {
                    k: latency_ms([c.seconds for c in inside if c.kind == k and c.outcome == "ok"]) for k in kinds
                },
                "errors": sum(c.outcome == "error" for c in inside),
                "limited": sum(c.outcome == "limited" for c in inside),
            }
        )
    return {"totals": totals, "series": series, "bin_s": width}


def memory(samples: list[dict], health: list[dict], duration: float, warmup: float, bins: int) -> dict:
    """RSS growth after warm-up: the median over the window right after it against the one at the end."""
    window = min(30.0, (duration - warmup) / 4)

    def median(key: str, lo: float, hi: float, rows: list[dict] = samples) -> float:
        values = [s[key] for s in rows if lo <= s["at_s"] < hi]
        return float(np.median(values)) if values else float("nan")

    after = median("rss_bytes", warmup, warmup + window)
    end = median("rss_bytes", duration - window, duration)
    width = duration / bins
    series = [
        {
            "from_s": b * width,
            "to_s": (b + 1) * width,
            "rss_bytes": median("rss_bytes", b * width, (b + 1) * width),
            "threads": median("threads", b * width, (b + 1) * width),
            "fds": median("fds", b * width, (b + 1) * width),
            "resident_voices": median("resident_voices", b * width, (b + 1) * width, health),
        }
        for b in range(bins)
    ]
    during = [s for s in samples if s["at_s"] < duration]
    return {
        "warmup_s": warmup,
        "window_s": window,
        "rss_after_warmup_bytes": after,
        "rss_end_bytes": end,
        "growth": (end - after) / after,
        "target": GROWTH_TARGET,
        "met": (end - after) / after < GROWTH_TARGET,
        "rss_first_bytes": during[0]["rss_bytes"] if during else None,
        "rss_max_bytes": max(s["rss_bytes"] for s in during) if during else None,
        "threads_after_warmup": median("threads", warmup, warmup + window),
        "threads_end": median("threads", duration - window, duration),
        "fds_after_warmup": median("fds", warmup, warmup + window),
        "fds_end": median("fds", duration - window, duration),
        "largest_step": largest_step(during, 0.0),
        "largest_step_after_warmup": largest_step(during, warmup),
        "step_target_bytes": STEP_TARGET,
        "series": series,
    }


def flood_summary(idle: Recorder, beside: Recorder, calls: list[Call], args) -> dict:
    """The polite tenant alone (before the load), beside the flood alone, and under the flood and the mixed
    load; what the flood sent during the load."""

    def timing(rows: list[Call]) -> dict:
        ok = [c for c in rows if c.outcome == "ok"]
        first = latency_ms([c.first_byte for c in ok])
        return {
            **latency_ms([c.seconds for c in ok]),
            "first_byte_p50_ms": first.get("p50_ms"),
            "first_byte_p99_ms": first.get("p99_ms"),
            "errors": sum(c.outcome == "error" for c in rows),
        }

    def ratio(a: dict, b: dict) -> float:
        return b["p99_ms"] / a["p99_ms"] if a.get("n") and b.get("n") else float("nan")

    alone, under = timing(idle.calls), timing([c for c in calls if c.kind == "polite"])
    paired = timing([c for c in beside.calls if c.kind == "polite"])
    judged = ratio(alone, paired)  # the target's: the flood and nothing else
    flood = [c for c in calls if c.kind == "flood"]
    return {
        "idle": alone,
        "beside_flood": paired,
        "under_flood": under,
        "p99_ratio_beside_flood": judged,
        "p99_ratio": ratio(alone, under),
        "target": POLITE_TARGET,
        "met": judged <= POLITE_TARGET,
        "flood": {
            "streams": args.flood_streams,
            "chars": args.flood_chars,
            "requests": len(flood),
            "errors": sum(c.outcome == "error" for c in flood),
            **latency_ms([c.seconds for c in flood if c.outcome == "ok"]),
        },
    }


def largest_step(samples: list[dict], since: float, window: float = 30.0) -> dict:
    """The largest rise of resident memory that stays: the median RSS over ``window`` seconds against the
    median over the ``window`` before, at every 5 s from ``since``."""
    best = {"bytes": 0.0, "at_s": None}
    if not samples:
        return best
    at = np.array([s["at_s"] for s in samples])
    rss = np.array([s["rss_bytes"] for s in samples], dtype=float)
    for t in np.arange(since + window, at[-1] - window, 5.0):
        before, after = rss[(at >= t - window) & (at < t)], rss[(at >= t) & (at < t + window)]
        if len(before) and len(after) and np.median(after) - np.median(before) > best["bytes"]:
            best = {"bytes": float(np.median(after) - np.median(before)), "at_s": float(t)}
    return best


def job_rss(samples: list[dict], jobs: list[dict]) -> list[dict]:
    """RSS just before each job's upload (median over the 5 s before) and after it ended (median over 5-15 s
    after): whether onboarding steps the memory up, and whether the steps stop. And the floor: the lowest
    RSS from 3 s before the job was seen ended to 10 s after, where the worker has just given the freed heap
    back (``chorus.serving.onboarding.heap``) and no job holds memory; a leak raises the floor job after job."""
    at = np.array([s["at_s"] for s in samples]) if samples else np.zeros(0)
    rss = np.array([s["rss_bytes"] for s in samples], dtype=float) if samples else np.zeros(0)

    def median(lo: float, hi: float, of=np.median) -> float:
        inside = rss[(at >= lo) & (at < hi)]
        return float(of(inside)) if len(inside) else float("nan")

    rows = []
    for job in sorted((j for j in jobs if "ended_at_s" in j), key=lambda j: j["uploaded_at_s"]):
        before = median(job["uploaded_at_s"] - 5, job["uploaded_at_s"])
        after = median(job["ended_at_s"] + 5, job["ended_at_s"] + 15)
        rows.append(
            {
                "voice": job["voice"],
                "status": job["status"],
                "uploaded_at_s": job["uploaded_at_s"],
                "ended_at_s": job["ended_at_s"],
                "rss_before_bytes": before,
                "rss_after_bytes": after,
                "rss_floor_bytes": median(job["ended_at_s"] - 3, job["ended_at_s"] + 10, np.min),
            }
        )
    return rows


# -- report --------------------------------------------------------------------------------------
def fmt(row: dict) -> str:
    return f"{row['p50_ms']:.0f} / {row['p99_ms']:.0f} ({row['n']})" if row.get("n") else "-"


def report(result: dict, args) -> None:
    """``soak.md`` (printed too) and ``soak.png`` in ``args.out``; ``soak.json`` first, so the figures survive
    a bad format."""
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    servers = result["servers"]
    lines = [
        *header_lines(result, args),
        *findings_lines(result),
        *step_lines(servers),
        *flood_lines(result["flood"]),
        *onboarding_lines(result),
        *throughput_lines(result["throughput"]),
        "",
        *server_table(servers),
        "",
        *kinds_lines(result["requests"]["totals"]),
        *error_lines(result["errors"]),
        *series_lines(result["requests"]),
        *process_lines(servers),
        *growth_table(servers),
        *job_table(servers),
        *log_lines(servers),
        *caveat_lines(args),
    ]
    (args.out / "soak.md").write_text("\n".join(lines) + "\n")
    plot(result, args.out / "soak.png")
    print("\n".join(lines))


def header_lines(result: dict, args) -> list[str]:
    """The title, the command, the servers and the load they met."""
    config, servers = result["config"], result["servers"]
    several = len(servers) > 1
    minutes = args.minutes
    return [
        f"# Soak: mixed load against {'one voice server' if not several else f'{len(servers)} voice servers on one shared store'}",
        "",
        "```",
        result["command"],
        "```",
        "",
        (
            f"`{shlex.join(result['server_command'])}` (this tree at {tree_at(config.get('provenance', config))})"
            + (
                f" and {len(servers) - 1} more like it on other ports, sharing the store (voices {config['store_root']}"
                f" through moto's S3 server, metadata in PostgreSQL {config['database']}); each request goes to a "
                "server drawn at random, and each onboarded voice is spoken, read and asked for after deletion on "
                "another server than the one that took its upload"
                if several
                else ""
            )
            + f" on a {config['cpus']}-core CPU, OMP_NUM_THREADS={args.threads}, load average {config['load_average_start'][0]:.1f} at the start "
            f"and {config['load_average_end'][0]:.1f} at the end (other work shares the machine). "
            f"{args.tenants} tenants with {args.voices} synthetic `{args.method}` voices between them, put into "
            f"the store before the server started; adapter cache {args.cache_mb:g} MB (a median "
            f"{np.median([h['resident_voices'] for h in result['health']]):.0f} voices resident: the server loads "
            f"and evicts throughout); onboarding {args.adapt_steps} training steps "
            f"on {args.adapt_threads} thread(s) in processes at niceness {_job_niceness(args)}. {minutes:g} minutes of load: speech at {args.speech_rate:g} "
            f"requests/s over all tenants ({args.speech_clients} paced clients per tenant), catalog requests "
            f"every 2 s per tenant, one onboarding job at a time per tenant with {args.upload_pause:g} s between "
            f"jobs (every {args.cancel_every}th cancelled), the operator's /healthz every 5 s. Every request "
            "opens its own loopback connection; latency is from connecting to the last byte."
        ),
        "",
    ]


def _job_niceness(args) -> str:
    """The onboarding processes' niceness as run: the option, else the server's default (runs made before
    ``ServerSettings.job_niceness`` existed ran their jobs at the server's priority)."""
    given = getattr(args, "job_niceness", None)
    if given is not None:
        return str(given)
    return (
        "0 (before job_niceness existed)"
        if not hasattr(args, "job_niceness")
        else f"{ServerSettings().job_niceness} (the server's default)"
    )


def findings_lines(result: dict) -> list[str]:
    """The findings' first lines: errors against their target, then each server's memory against its own."""
    totals, servers = result["requests"]["totals"], result["servers"]
    errors = result["error_count"]
    limited = sum(t["limited"] for t in totals.values())
    requests = sum(t["requests"] for t in totals.values())
    return [
        "## Findings",
        "",
        f"- Errors: **{errors}** in {requests:,} requests (target 0: **{'met' if errors == 0 else 'NOT met'}**); "
        f"{limited} limited (429)"
        + (
            f"; client threads still running at the end: {', '.join(result['stuck_threads'])}"
            if result["stuck_threads"]
            else ""
        )
        + ".",
        *(
            f"- Server {k}: resident memory after warm-up (the first {mem['warmup_s'] / 60:g} min, a fifth of the "
            f"run) {mem['rss_after_warmup_bytes'] / MB:.1f} MB (median over {mem['window_s']:g} s after warm-up) -> "
            f"{mem['rss_end_bytes'] / MB:.1f} MB (median over the last {mem['window_s']:g} s): "
            f"**{100 * mem['growth']:+.2f}%** (target < {100 * GROWTH_TARGET:g}%: "
            f"**{'met' if mem['met'] else 'NOT met'}**); first sample {mem['rss_first_bytes'] / MB:.1f} MB, "
            f"highest {mem['rss_max_bytes'] / MB:.1f} MB; threads {mem['threads_after_warmup']:.0f} -> "
            f"{mem['threads_end']:.0f}, open file descriptors {mem['fds_after_warmup']:.0f} -> {mem['fds_end']:.0f}."
            for k, mem in enumerate(server["memory"] for server in servers)
        ),
    ]


def onboarding_lines(result: dict) -> list[str]:
    """The findings on onboarding jobs, each server's shutdown and the store read afterwards."""
    servers, store, jobs = result["servers"], result["store"], result["jobs"]
    several = len(servers) > 1
    done = [j for j in jobs if j["status"] == "done"]
    spoken = [j["spoken_after_s"] for j in done if "spoken_after_s" in j]
    return [
        (
            f"- Onboarding: {len(jobs)} jobs accepted, {len(done)} done "
            f"(median {np.median([j['seconds'] for j in done]) if done else float('nan'):.1f} s from upload to done), "
            f"{sum(j['cancelled'] == 'planned' for j in jobs)} cancelled as planned at their first poll, "
            f"{sum(j['cancelled'] == 'at the end' for j in jobs)} at the end of the load; each voice made was spoken 3 times, deleted, then asked for "
            "again (a 404 expected)"
            + (
                f"; from a job seen done to the first audio of its voice from the other server: median "
                f"{np.median(spoken):.2f} s, at most {max(spoken):.2f} s over {len(spoken)} voices (that request's "
                "own time included: loading the voice and synthesizing)"
                if several and spoken
                else ""
            )
            + "."
        ),
        *(
            f"- Server {k} shutdown (SIGINT, once its onboarding worker was idle: "
            f"{'after ' + format(server['drain_s'], 'g') + ' s' if server['drain_s'] is not None else 'it never was'}): "
            f"exit code {server['shutdown']['exit_code']} after {server['shutdown']['seconds']:g} s"
            + (" (killed: it did not exit in 120 s)" if server["shutdown"]["killed"] else "")
            + "."
            for k, server in enumerate(servers)
        ),
        (
            f"- Store read afterwards: {'all as expected' if store['ok'] else '**NOT as expected**'} "
            f"({store['verified_voices']} ready voices verified, {len(store['uploaded_voices_left'])} uploaded "
            f"voices left, {len(store['jobs_unfinished'])} jobs unfinished, {len(store['job_files_left'])} job "
            f"files or folders left, {store['consent_records']} consent records for {store['jobs_accepted']} jobs)."
        ),
    ]


def kinds_lines(totals: dict) -> list[str]:
    """Requests by kind: outcomes, statuses and latency."""
    lines = [
        "## Requests by kind",
        "",
        "| kind | requests | ok | limited | errors | statuses | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, t in totals.items():
        statuses = ", ".join(f"{s}: {n}" for s, n in t["statuses"].items())
        timing = f"{t['p50_ms']:.0f} | {t['p99_ms']:.0f} | {t['max_ms']:.0f}" if t.get("n") else "- | - | -"
        lines.append(
            f"| {kind} | {t['requests']:,} | {t['ok']:,} | {t['limited']} | {t['errors']} | {statuses} | {timing} |"
        )
    lines += [
        "",
        "Latency percentiles are over the requests answered as expected. Expected statuses: "
        + "; ".join(f"{k} {', '.join(str(s) for s in sorted(v))}" for k, v in EXPECTED.items())
        + ".",
        "",
    ]
    return lines


def error_lines(errors: list[dict]) -> list[str]:
    """The first ten errors (all are in soak.json)."""
    lines = ["## Errors", ""]
    if errors:
        lines += [f"- {e['at_s']} s, {e['kind']} ({e['tenant']}): {e['problem']}" for e in errors[:10]]
        if len(errors) > 10:
            lines.append(f"- ... {len(errors) - 10} more in soak.json")
    else:
        lines.append("None.")
    return lines


def series_lines(requests: dict) -> list[str]:
    """Latency per kind over time."""
    totals, series = requests["totals"], requests["series"]
    shown = [k for k in SHOWN if k in totals]
    lines = [
        "",
        f"## Latency over time: p50 / p99 ms (requests), per {requests['bin_s']:g} s",
        "",
        "| from min | " + " | ".join(shown) + " | errors | limited |",
        "|---" * (len(shown) + 3) + "|",
    ]
    for row in series:
        cells = " | ".join(fmt(row["kinds"].get(k, {})) for k in shown)
        lines.append(f"| {row['from_s'] / 60:.1f} | {cells} | {row['errors']} | {row['limited']} |")
    return lines


def process_lines(servers: list[dict]) -> list[str]:
    """Each server's RSS, threads and descriptors over time, and the resident voices."""
    lines = [
        "",
        "## Server processes over time (medians per interval)",
        "",
        "| from min | "
        + " | ".join(f"server {k} RSS MB, threads, fds" for k in range(len(servers)))
        + " | resident voices |",
        "|---" * (len(servers) + 2) + "|",
    ]
    for b, row in enumerate(servers[0]["memory"]["series"]):
        cells = " | ".join(
            f"{s['memory']['series'][b]['rss_bytes'] / MB:.1f}, {s['memory']['series'][b]['threads']:.0f}, "
            f"{s['memory']['series'][b]['fds']:.0f}"
            for s in servers
        )
        lines.append(f"| {row['from_s'] / 60:.1f} | {cells} | {row['resident_voices']:.0f} |")
    return lines


def log_lines(servers: list[dict]) -> list[str]:
    """Each server's log: counts by level, its notable lines, and how it ended."""
    lines = []
    for k, server in enumerate(servers):
        log = server["log"]
        lines += [
            "",
            f"## Server {k} log",
            "",
            f"{log['lines']:,} lines ({', '.join(f'{k} {v:,}' for k, v in sorted(log['levels'].items()))}); "
            f"{log['notable_count']} warnings, errors or tracebacks"
            + (" (distinct lines, with their counts):" if log["notable"] else "."),
        ]
        if log["notable"]:
            lines += ["", "```", *(f"{n['count']:>5} x {n['line'][:200]}" for n in log["notable"][:10]), "```"]
        lines += ["", "Its last lines, as it stopped:", "", "```", *(line[:200] for line in log["tail"]), "```"]
    return lines


def caveat_lines(args) -> list[str]:
    """What the figures do not show."""
    return [
        "",
        "## Caveats",
        "",
        "- Synthetic voices with random adapters: the speech is not meant to sound like anyone; its cost does "
        "not depend on the adapter values.",
        f"- {args.adapt_steps} training steps per onboarded voice: a real job trains for minutes, so its memory "
        "(a copy of the base, the optimizer, the batch) lives longer; the path through the server is the same.",
        "- One shared CPU: latencies move with whatever else runs on it; RSS includes allocator slack.",
    ]


def flood_lines(flood: dict | None) -> list[str]:
    if flood is None:
        return []
    idle, paired, under, sent = flood["idle"], flood["beside_flood"], flood["under_flood"], flood["flood"]

    def timed(t: dict) -> str:
        return (
            f"p50 {t['p50_ms']:.0f} ms, p99 {t['p99_ms']:.0f} ms (first byte {t['first_byte_p50_ms']:.0f} / "
            f"{t['first_byte_p99_ms']:.0f} ms, {t['n']} requests, {t['errors']} errors)"
        )

    return [
        f"- Polite tenant (one sentence at a time, PCM): alone before the load {timed(idle)}; beside the flood and "
        f"nothing else {timed(paired)}: p99 **{flood['p99_ratio_beside_flood']:.1f}x** idle (target <= "
        f"{flood['target']:g}x: **{'met' if flood['met'] else 'NOT met'}**); under the flood and the mixed load "
        f"(other tenants' speech, onboarding jobs training on the same 2 cores) {timed(under)}: p99 "
        f"**{flood['p99_ratio']:.1f}x** idle. The flood tenant during the load: {sent['streams']} "
        f"streamed texts of ~{sent['chars']:,} characters at once, back to back: {sent['requests']} requests, "
        f"{sent['errors']} errors"
        + (f", each {sent['p50_ms'] / 1000:.0f} s (p50) to its last byte." if sent.get("n") else ".")
    ]


def step_lines(servers: list[dict]) -> list[str]:
    lines = []
    for k, server in enumerate(servers):
        mem, jobs = server["memory"], server["job_rss"]
        step, after = mem["largest_step"], mem["largest_step_after_warmup"]
        deltas = [(j["rss_after_bytes"] - j["rss_before_bytes"]) / MB for j in jobs if j["status"] == "done"]
        floors = [(j["ended_at_s"], j["rss_floor_bytes"] / MB) for j in jobs if j["status"] == "done"]
        floors = [(t, f) for t, f in floors if t >= mem["warmup_s"] and np.isfinite(f)]
        work = server["batcher"]
        lines.append(
            f"- Server {k}'s batcher during the load: {work['batches']:,.0f} batches, mean "
            f"{work['rows'] / max(work['batches'], 1):.2f} sentences taking {work['busy_s'] / max(work['batches'], 1):.3f} s "
            f"(busy {100 * work['busy_s'] / work['seconds']:.0f}% of the {work['seconds'] / 60:.1f} min from the load's start "
            "to the end of the streams and jobs still going when it stopped)."
        )
        lines.append(
            f"- Server {k}: largest lasting RSS step (median over 30 s against the 30 s before) "
            f"{step['bytes'] / MB:.1f} MB"
            + (f" at {step['at_s'] / 60:.1f} min" if step["at_s"] is not None else "")
            + f"; after warm-up {after['bytes'] / MB:.1f} MB (target no step > {STEP_TARGET / MB:.0f} MB: "
            f"**{'met' if step['bytes'] <= STEP_TARGET else 'NOT met'}** over the whole run)"
            + (
                f"; across each finished onboarding job (5 s before its upload -> 5-15 s after its end, other "
                f"load going on): median {np.median(deltas):+.1f} MB, first three "
                f"{', '.join(f'{d:+.1f}' for d in deltas[:3])} MB, last three "
                f"{', '.join(f'{d:+.1f}' for d in deltas[-3:])} MB."
                if deltas
                else "."
            )
        )
        children = [p.get("children_rss_bytes", 0) for p in server["process"]]
        if any(children):
            lines.append(
                f"- Server {k}'s onboarding processes (its fork server and the job processes forked from it; not in "
                f"the server's RSS above): RSS peak {max(children) / MB:.0f} MB, median {np.median(children) / MB:.0f} "
                f"MB, at the end {children[-1] / MB:.0f} MB."
            )
        growth = server.get("python_growth")
        if growth:
            lines.append(
                f"- Server {k}'s Python objects (tracemalloc, after a garbage collection, warm-up's end -> the end of "
                f"the load): {growth['before_bytes'] / MB:.1f} -> {growth['after_bytes'] / MB:.1f} MB "
                f"(**{(growth['after_bytes'] - growth['before_bytes']) / MB:+.1f} MB**); the sites that changed most "
                "(up or down) are listed below."
            )
        if len(floors) >= 6:
            third = len(floors) // 3
            first, last = (float(np.median([f for _, f in part])) for part in (floors[:third], floors[-third:]))
            lines.append(
                f"- Server {k}: RSS floor right after each job done after warm-up (the lowest from 3 s before it was "
                "seen done to 10 s after: where the worker has just handed the freed heap back, if the job ran on "
                f"this server), {len(floors)} jobs: median of the first third {first:.0f} MB (to "
                f"{floors[third - 1][0] / 60:.1f} min), of the last third {last:.0f} MB (from "
                f"{floors[-third][0] / 60:.1f} min): **{last - first:+.0f} MB** (a leak raises the floor job after "
                "job; a plateau keeps it level)."
            )
    return lines


def growth_table(servers: list[dict]) -> list[str]:
    """The allocation sites whose Python objects changed most after warm-up (``--trace-memory``)."""
    lines = []
    for k, server in enumerate(servers):
        growth = server.get("python_growth")
        if not growth:
            continue
        lines += [
            "",
            f"## Server {k}: Python allocations that changed most after warm-up (tracemalloc, up or down)",
            "",
            "| growth | objects | allocated at | through Chorus's |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {row['growth_bytes'] / 1024:+,.0f} KB | {row['count_diff']:+,} | `{row['where']}` | "
            f"{', '.join(f'`{c}`' for c in row['chorus']) or '-'} |"
            for row in growth["top"]
        ]
    return lines


def job_table(servers: list[dict]) -> list[str]:
    lines = ["", "## Resident memory around each onboarding job", ""]
    for k, server in enumerate(servers):
        lines += [
            f"Server {k}:",
            "",
            "| voice | status | uploaded, min | ended, min | RSS before MB | RSS after MB | change MB | floor MB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for j in server["job_rss"]:
            change = (j["rss_after_bytes"] - j["rss_before_bytes"]) / MB
            lines.append(
                f"| {j['voice']} | {j['status']} | {j['uploaded_at_s'] / 60:.2f} | {j['ended_at_s'] / 60:.2f} | "
                f"{j['rss_before_bytes'] / MB:.1f} | {j['rss_after_bytes'] / MB:.1f} | {change:+.1f} | "
                f"{j['rss_floor_bytes'] / MB:.1f} |"
            )
        lines.append("")
    return lines


def throughput_lines(scaling: dict | None) -> list[str]:
    if scaling is None:
        return []
    rounds = scaling["rounds"]
    one = [r["one"]["requests_per_s"] for r in rounds]
    every = [r["all"]["requests_per_s"] for r in rounds]
    return [
        (
            f"- Throughput, measured before the soak's load ({len(rounds)} alternating rounds of "
            f"{scaling['seconds']:g} s after 3 s of warm-up; {scaling['clients_per_server']} closed-loop clients per "
            f"server; one sentence, {len(scaling['text'])} characters, in base speaker {scaling['speaker']}: the "
            f"time is the base model's synthesis on each server's one thread): one server "
            f"{np.median(one):.2f} req/s (rounds {', '.join(f'{v:.2f}' for v in one)}), all "
            f"{np.median(every):.2f} req/s (rounds {', '.join(f'{v:.2f}' for v in every)}): ratio "
            f"**{scaling['ratio_median']:.2f}x** (median; {scaling['ratio_min']:.2f}-{scaling['ratio_max']:.2f} over "
            f"the rounds; target {scaling['target']:g}x: **{'met' if scaling['met'] else 'NOT met'}**)."
        )
    ]


def server_table(servers: list[dict]) -> list[str]:
    """Per server: requests it answered, their rate, speech latency, errors, RSS."""
    lines = [
        "## By server",
        "",
        "| server | requests | requests/s | speech p50 / p99 ms | errors | RSS after warm-up -> end MB | RSS max MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, server in enumerate(servers):
        totals, mem = server["requests"], server["memory"]
        count = sum(t["requests"] for t in totals.values())
        speech = totals.get("speech", {})
        timing = f"{speech['p50_ms']:.0f} / {speech['p99_ms']:.0f}" if speech.get("n") else "-"
        seconds = server["memory"]["series"][-1]["to_s"]
        lines.append(
            f"| {k} | {count:,} | {count / seconds:.2f} | {timing} | {sum(t['errors'] for t in totals.values())} | "
            f"{mem['rss_after_warmup_bytes'] / MB:.1f} -> {mem['rss_end_bytes'] / MB:.1f} | {mem['rss_max_bytes'] / MB:.1f} |"
        )
    return lines


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, servers = result["requests"]["series"], result["servers"]
    mem = servers[0]["memory"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    middles = [(row["from_s"] + row["to_s"]) / 120 for row in series]
    for k, kind in enumerate(SHOWN):
        points = [(m, row["kinds"].get(kind, {})) for m, row in zip(middles, series)]
        points = [(m, r) for m, r in points if r.get("n")]
        if not points:
            continue
        color = f"C{k}"
        top.plot([m for m, _ in points], [r["p50_ms"] for _, r in points], "o-", color=color, label=f"{kind} p50")
        top.plot(
            [m for m, _ in points],
            [r["p99_ms"] for _, r in points],
            "s--",
            color=color,
            mfc="white",
            label=f"{kind} p99",
        )
    top.set_yscale("log")
    top.set_ylabel("latency, ms")
    top.legend(fontsize=7, ncol=4)
    top.grid(alpha=0.3, which="both")
    for k, server in enumerate(servers):
        samples = server["process"]
        bottom.plot(
            [s["at_s"] / 60 for s in samples],
            [s["rss_bytes"] / MB for s in samples],
            color=f"C{k}",
            lw=1,
            label=f"server {k}",
        )
        for job in server["job_rss"]:
            bottom.axvline(job["ended_at_s"] / 60, color=f"C{k}", lw=0.5, alpha=0.4)
    warm, window, duration = mem["warmup_s"], mem["window_s"], result["config"]["minutes"] * 60
    bottom.axvline(warm / 60, color="k", ls="--", lw=1, label="end of warm-up")
    bottom.axvspan(warm / 60, (warm + window) / 60, color="C2", alpha=0.2, label="windows compared")
    bottom.axvspan((duration - window) / 60, duration / 60, color="C2", alpha=0.2)
    bottom.set_ylabel("server RSS, MB")
    bottom.set_xlabel("minutes since the load started")
    growth = ", ".join(f"{100 * s['memory']['growth']:+.2f}%" for s in servers)
    bottom.set_title(f"RSS after warm-up {growth} (target < {100 * GROWTH_TARGET:g}%)", fontsize=9)
    bottom.legend(fontsize=7)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def closed_loop(ports: list[int], keys: list[str], body: bytes, clients: int, warmup: float, seconds: float) -> dict:
    """``clients`` threads per port, each sending the same speech request back to back; the requests
    answered 200 within the ``seconds`` after ``warmup`` are counted. Keys rotate over the tenants."""

    def send(target: tuple[int, str]) -> int:
        port, key = target
        try:
            return request(port, "POST", "/v1/audio/speech", body, key, "application/json", timeout=120)[0]
        except (OSError, http.client.HTTPException):
            return 0

    plans = [
        itertools.repeat((port, keys[(k * clients + c) % len(keys)]))
        for k, port in enumerate(ports)
        for c in range(clients)
    ]
    inside = run_clients(plans, send, warmup + seconds).within(warmup, seconds)
    answered = [s.seconds for s in inside if s.outcome == 200]
    return {
        "requests_per_s": len(answered) / seconds,
        "failed": sum(s.outcome != 200 for s in inside),
        "p50_ms": percentile([1000 * t for t in answered], 50) if answered else None,
    }


def throughput(args, servers: list[Server], tenants: list[Tenant], speaker: str) -> dict:
    """Speech throughput of the first server alone against all of them, in alternating rounds: the same
    sentence in base speaker ``speaker`` (no adapter to load: the time is the base model's synthesis),
    ``--throughput-clients`` closed-loop clients per server."""
    text = TEXTS[0]
    body = json.dumps({"model": "tts-1", "input": text, "voice": speaker, "response_format": "wav"}).encode()
    keys = [t.key for t in tenants]
    rounds = []
    for r in range(args.throughput_rounds):
        one = closed_loop([servers[0].port], keys, body, args.throughput_clients, 3.0, args.throughput_seconds)
        every = closed_loop(
            [s.port for s in servers], keys, body, args.throughput_clients, 3.0, args.throughput_seconds
        )
        rounds.append({"one": one, "all": every, "ratio": every["requests_per_s"] / max(one["requests_per_s"], 1e-9)})
        print(
            f"throughput round {r + 1}: one server {one['requests_per_s']:.2f} req/s, {len(servers)} servers "
            f"{every['requests_per_s']:.2f} req/s, ratio {rounds[-1]['ratio']:.2f}",
            flush=True,
        )
    ratios = [row["ratio"] for row in rounds]
    return {
        "text": text,
        "speaker": speaker,
        "clients_per_server": args.throughput_clients,
        "seconds": args.throughput_seconds,
        "rounds": rounds,
        "ratio_median": float(np.median(ratios)),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "target": THROUGHPUT_TARGET,
        "met": float(np.median(ratios)) >= THROUGHPUT_TARGET,
    }


def shared_store(args, services: contextlib.ExitStack) -> StoreSpec:
    """The store the servers share: the folder of one machine by default; with several servers, the
    PostgreSQL and S3 given (``--database``, ``--store``), else a throwaway cluster and moto's S3 server."""
    if args.database:
        if not args.store:
            raise SystemExit("--database needs --store (the voices' URL, e.g. s3://bucket/voices)")
        return StoreSpec(args.store, args.database)
    if args.servers == 1:
        return StoreSpec(args.store or str(args.work / "store"))
    postgres = services.enter_context(local_services.postgres_cluster())
    environment = services.enter_context(local_services.s3_server())
    os.environ.update(environment)  # the servers and this process reach moto's S3 as any AWS SDK would
    return StoreSpec(f"s3://{local_services.new_bucket(environment)}/voices", local_services.new_database(postgres))


def rereport(out: Path) -> None:
    """The report of a finished run again, from its ``soak.json`` (the figures derived from the raw
    samples recomputed with this code), with the run's own options."""
    result = json.loads((out / "soak.json").read_text())
    for server in result["servers"]:
        server["job_rss"] = job_rss(server["process"], result["jobs"])
    report(result, argparse.Namespace(**result["config"] | {"out": out}))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="of load (warm-up: the first fifth)")
    parser.add_argument("--servers", type=int, default=1, help="servers on one shared store, each on its own port")
    parser.add_argument("--store", default=None, help="voice store URL (default: a folder, or S3 for --servers 2+)")
    parser.add_argument(
        "--database", default=None, help="postgresql:// URL (default for --servers 2+: a throwaway one)"
    )
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--voices", type=int, default=40, help="synthetic voices put in the store, over the tenants")
    parser.add_argument("--speech-rate", type=float, default=4.0, help="speech requests/s, all tenants together")
    parser.add_argument("--speech-clients", type=int, default=2, help="paced speech threads per tenant")
    parser.add_argument("--upload-pause", type=float, default=60.0, help="seconds between one tenant's jobs")
    parser.add_argument("--cancel-every", type=int, default=4, help="every n-th job is cancelled")
    parser.add_argument("--job-timeout", type=float, default=300.0, help="a job not done by then is an error")
    parser.add_argument("--adapt-steps", type=int, default=3)
    parser.add_argument("--adapt-threads", type=int, default=1)
    parser.add_argument(
        "--job-niceness", type=int, default=None, help="of the servers' onboarding processes (default: the server's)"
    )
    parser.add_argument("--cache-mb", type=float, default=1.5, help="each server's adapter cache")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each server")
    parser.add_argument("--throughput-seconds", type=float, default=20.0, help="per measurement (--servers 2+)")
    parser.add_argument("--throughput-clients", type=int, default=4, help="closed-loop clients per server")
    parser.add_argument("--throughput-rounds", type=int, default=3, help="one server, then all: alternating")
    parser.add_argument("--bins", type=int, default=10, help="intervals of the time series")
    parser.add_argument(
        "--flood-streams", type=int, default=4, help="the flood tenant's long streams at once (0: no flood tenant)"
    )
    parser.add_argument("--flood-chars", type=int, default=1990, help="characters of each flood text")
    parser.add_argument("--polite-period", type=float, default=1.0, help="seconds between the polite tenant's requests")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="before the load, the polite tenant alone for this long, then as long beside the flood alone",
    )
    parser.add_argument("--method", default="lora+speaker", help="of the synthetic voices")
    parser.add_argument("--adapter-scale", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="run the servers under tracemalloc (slower) and report their Python objects' growth after warm-up",
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak"))
    parser.add_argument(
        "--rereport", action="store_true", help="write the report again from OUT/soak.json (no load is run)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.rereport:
        rereport(args.out)
        return
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "bench/soak.py", *sys.argv[1:]])
    scratch = args.work is None
    args.work = Path(tempfile.mkdtemp(prefix="chorus-soak-")) if scratch else args.work
    args.out.mkdir(parents=True, exist_ok=True)
    services = contextlib.ExitStack()
    try:
        store = shared_store(args, services)
        config = {
            **machine(args.threads, "chorus serve (this tree's CLI) on loopback, under mixed HTTP load"),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "store_root": store.root,
            "database": public_url(store.database) if store.database else "SQLite in the store folder",
        }
        print(f"preparing the store ({store.root}) ...", flush=True)
        tenants, extra, operator_key, keys = prepare_store(args, store)
        servers = [
            start_server(args, store, keys, limits_file(args), args.work / f"server-{k}") for k in range(args.servers)
        ]
        print(f"servers up on ports {[s.port for s in servers]} (pids {[s.process.pid for s in servers]})", flush=True)
        try:
            with LoadSampler() as sampled:
                soaked = soak(args, servers, tenants, extra, operator_key)
        finally:
            shutdowns = [stop_server(server.process) for server in servers]
        config["load_average_end"] = os.getloadavg()
        config["provenance"]["load"] = sampled.summary()
        checked = check_store(store, servers, tenants, soaked.load.jobs)
        report(results(args, command, config, servers, shutdowns, soaked, checked), args)
    finally:
        services.close()
        if scratch:
            shutil.rmtree(args.work, ignore_errors=True)


def limits_file(args) -> Path | None:
    """With several servers, limits the throughput phase's clients stay under (the default 600 requests a
    minute per tenant would stop them); None (the defaults) for one."""
    if args.servers == 1:
        return None
    limits = args.work / "limits.json"
    limits.write_text(
        json.dumps({"tenant": {"requests_per_minute": 60_000}, "server": {"requests_per_minute": 600_000}})
    )
    return limits


@dataclass
class Soaked:
    """What the servers went through: the throughput phase, the polite tenant alone and beside the flood,
    the load, and what was read around it (per server: drain seconds, batcher work, tracemalloc snapshots)."""

    scaling: dict | None
    idle: Recorder | None
    beside: Recorder | None
    load: Load
    duration: float
    stuck: list[str]
    drained: list[float | None]
    batches: list[dict]
    snapshots: list[list[Path | None]]


def soak(args, servers: list[Server], tenants: list[Tenant], extra: list[Tenant], operator_key: str) -> Soaked:
    """The phases, in order: throughput (several servers), the polite tenant alone then beside the flood
    (with a flood tenant), then ``--minutes`` of the mixed load."""
    ports = [server.port for server in servers]
    listed = json.loads(http_get(ports[0], "/v1/voices", tenants[0].key))["data"]
    speakers = [v["id"] for v in listed if v["type"] == "base"]
    scaling = throughput(args, servers, tenants, speakers[0]) if args.servers > 1 else None
    idle = beside = None
    if extra:
        idle, beside = polite_phases(args, servers, extra, speakers)
    print(f"{args.minutes:g} minutes of load ...", flush=True)
    counters = [batcher_counters(port, operator_key) for port in ports]
    start = time.monotonic()
    load = Load(Recorder(ports, start), tenants, operator_key, speakers, Sample.load(SAMPLE_VOICE), args, *extra)
    sampling = threading.Event()
    samplers = [
        threading.Thread(target=sample_process, args=(s.process.pid, start, sampling, s.samples), daemon=True)
        for s in servers
    ]
    for thread in samplers:
        thread.start()
    threads = load.threads()
    for thread in threads:
        thread.start()
    duration = 60 * args.minutes
    snapshots = watch(args, load, servers, start, duration)
    load.stop.set()
    for thread in threads:
        thread.join(timeout=args.job_timeout + 60)
    stuck = [t.name for t in threads if t.is_alive()]
    drained = [drain(port, operator_key, args.job_timeout) for port in ports]
    batches = [
        {k: after[k] - before[k] for k in before} | {"seconds": time.monotonic() - start}
        for before, after in zip(counters, (batcher_counters(port, operator_key) for port in ports))
    ]
    sampling.set()
    for thread in samplers:
        thread.join()
    if args.trace_memory:
        snapshots.append([take_snapshot(server) for server in servers])
    return Soaked(scaling, idle, beside, load, duration, stuck, drained, batches, snapshots)


def polite_phases(args, servers: list[Server], extra: list[Tenant], speakers: list[str]) -> tuple[Recorder, Recorder]:
    """Once the servers' start-up work is done: the polite tenant alone, then beside the flood alone."""
    ports = [server.port for server in servers]
    waited = [wait_idle(server.process.pid) for server in servers]  # start-up work in the background
    print(
        f"servers idle after {max(waited):.0f} s; the polite tenant alone for {args.idle_seconds:g} s ...",
        flush=True,
    )
    idle = polite_alone(ports, extra[1], speakers[0], args)
    print(f"idle: {latency_ms([c.seconds for c in idle.calls if c.outcome == 'ok'])}", flush=True)
    print(f"the polite tenant beside the flood alone for {args.idle_seconds:g} s ...", flush=True)
    beside = polite_beside_flood(ports, *extra, speakers, args)
    polite = [c.seconds for c in beside.calls if c.kind == "polite" and c.outcome == "ok"]
    print(f"beside the flood: {latency_ms(polite)}", flush=True)
    return idle, beside


def watch(args, load: Load, servers: list[Server], start: float, duration: float) -> list[list[Path | None]]:
    """Until the load's end: progress every minute (requests, errors, RSS), and with ``--trace-memory`` the
    servers' snapshot at warm-up's end (the first of two)."""
    snapshots: list[list[Path | None]] = []
    while (left := start + duration - time.monotonic()) > 0:
        time.sleep(min(left, 60.0))
        if args.trace_memory and not snapshots and time.monotonic() - start >= duration / 5:
            snapshots.append([take_snapshot(server) for server in servers])  # warm-up's end
        with load.recorder.lock:
            calls = list(load.recorder.calls)
        rss = ", ".join(f"{process_rss(s.process.pid) / MB:.1f}" for s in servers)
        print(
            f"{(time.monotonic() - start) / 60:5.1f} min: {len(calls):,} requests, "
            f"{sum(c.outcome == 'error' for c in calls)} errors, RSS {rss} MB",
            flush=True,
        )
    return snapshots


def results(
    args, command: str, config: dict, servers: list[Server], shutdowns: list[dict], soaked: Soaked, store: dict
) -> dict:
    """``soak.json``'s content, ``store`` being the store's check after shutdown: summaries first, raw calls
    last."""
    load, calls = soaked.load, soaked.load.recorder.calls
    before_errors = [error for recorder in (soaked.idle, soaked.beside) if recorder for error in recorder.errors]
    return {
        "command": command,
        "server_command": [Path(servers[0].command[0]).name, *servers[0].command[1:]],
        "config": config,
        "requests": summarize(calls, soaked.duration, args.bins),
        "servers": [
            server_result(args, k, server, shutdown, soaked)
            for k, (server, shutdown) in enumerate(zip(servers, shutdowns))
        ],
        "throughput": soaked.scaling,
        "errors": before_errors + load.recorder.errors,
        "error_count": len(load.recorder.errors) + len(soaked.stuck) + len(before_errors),
        "flood": flood_summary(soaked.idle, soaked.beside, calls, args) if soaked.idle else None,
        "stuck_threads": soaked.stuck,
        "health": load.health,
        "jobs": load.jobs,
        "store": store,
        "calls": [
            [round(c.at, 3), c.kind, c.tenant, c.status, round(1000 * c.seconds, 1), c.outcome, c.server] for c in calls
        ],
    }


def server_result(args, k: int, server: Server, shutdown: dict, soaked: Soaked) -> dict:
    """One server's part of the result: its requests, memory, jobs' RSS, batcher work, stop and log."""
    snapshots, duration = soaked.snapshots, soaked.duration
    traced = args.trace_memory and len(snapshots) == 2 and snapshots[0][k] and snapshots[-1][k]
    return {
        "port": server.port,
        "requests": summarize([c for c in soaked.load.recorder.calls if c.server == k], duration, 1)["totals"],
        "memory": memory(server.samples, soaked.load.health, duration, duration / 5, args.bins),
        "job_rss": job_rss(server.samples, soaked.load.jobs),
        "batcher": soaked.batches[k],
        "shutdown": shutdown,
        "drain_s": soaked.drained[k],
        "log": server_log(server.log_path),
        "process": server.samples,
        "python_growth": python_growth(snapshots[0][k], snapshots[-1][k]) if traced else None,
    }


if __name__ == "__main__":
    main()
