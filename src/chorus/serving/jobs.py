"""Voice onboarding for the server: uploaded clips checked and written as an LJSpeech-style folder, then
adapted into a voice by a background worker that reports progress to the store's job.

Uploads are checked before any job exists: every clip is decoded with soundfile (anything libsndfile
cannot read is refused, and so are empty, silent, overlong or non-finite clips), sizes, clip count
and total duration are bounded, and an archive is refused for absolute paths, ``..``, links,
encryption, too many members or an implausible compression ratio (a zip bomb). Nothing from an
upload ever names a file on disk: clips are re-encoded as 16-bit WAV under sanitized ids.

A job's files live in ``<jobs_dir>/<job_id>/`` (``job.json``, the clips in ``voice/``, the trained
voice in ``out/``) until the job ends. A job interrupted by a restart is resumed from those files
when they are still there (:meth:`JobRunner.resume`), else marked failed. ``adapt`` has no progress
callback, so a running job's progress is estimated from elapsed time against the expected training
time (learned from earlier jobs), and says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import queue
import re
import shutil
import stat
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import soundfile as sf

from chorus.models.bundle import ModelBundle
from chorus.serving.store import (
    ACTIVE_JOB,
    JobNotFound,
    JobStatus,
    VoiceConflict,
    VoiceNotFound,
    VoiceStore,
)
from chorus.training.adapt import AdaptConfig, adapt

log = logging.getLogger("chorus.serving.jobs")

DATA_DIR = "voice"           # the LJSpeech-style folder of a job
OUT_DIR = "out"              # the voice folder ``adapt`` writes
JOB_FILE = "job.json"
INCOMING_PREFIX = ".incoming-"
CONSENT_LOG = "consent.jsonl"
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".mp3", ".aiff", ".aif")
_SAFE_ID = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class UploadLimits:
    """What one onboarding upload may hold."""

    max_upload_bytes: int = 100 << 20          # the whole multipart body
    max_clips: int = 300
    max_clip_bytes: int = 25 << 20             # one clip, as uploaded or as unpacked from the archive
    min_clip_seconds: float = 0.3
    max_clip_seconds: float = 30.0
    min_total_seconds: float = 30.0            # as ``AdaptConfig.min_minutes``: less cannot make a voice
    max_total_seconds: float = 20 * 60.0
    max_transcript_chars: int = 1_000
    max_archive_members: int = 1_000
    max_unpacked_bytes: int = 400 << 20        # sum of an archive's declared member sizes
    max_compression_ratio: float = 200.0       # per member; audio never compresses like this, a bomb does
    min_sample_rate: int = 8_000
    max_sample_rate: int = 192_000


class UploadError(ValueError):
    """An upload refused, with the HTTP status to answer (400 bad content, 413 too large, 415 not audio/zip)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PreparedUpload:
    folder: Path
    clips: int
    seconds: float
    audio_sha256: str          # over every decoded clip, for the consent record


# -- uploads -------------------------------------------------------------------------------------
def parse_transcripts(text: str) -> dict[str, str]:
    """Transcripts by clip file name: a JSON object ``{"a.wav": "text", ...}`` or lines ``a.wav|text``."""
    text = text.strip().lstrip("\ufeff")
    if not text:
        raise UploadError("'transcripts' is empty: give a JSON object {filename: text} or lines 'filename|text'")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise UploadError(f"'transcripts' is not valid JSON: {error}") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise UploadError("'transcripts' JSON must be an object of filename -> text strings")
        return dict(data)
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, transcript = line.partition("|")
        if not sep or not name.strip():
            raise UploadError(f"'transcripts' line {number}: expected 'filename|text'")
        if name.strip() in out:
            raise UploadError(f"'transcripts' line {number}: {name.strip()!r} is given twice")
        out[name.strip()] = transcript
    return out


def _basename(name: str) -> str:
    return re.split(r"[\\/]", name or "")[-1]


class _DatasetWriter:
    """Decodes clips, checks them against the limits and writes ``<folder>/wavs/<id>.wav`` + metadata.csv."""

    def __init__(self, folder: Path, limits: UploadLimits):
        self.folder = folder
        self.limits = limits
        self.lines: list[str] = []
        self.ids: set[str] = set()
        self.seconds = 0.0
        self.digest = hashlib.sha256()
        (folder / "wavs").mkdir(parents=True, exist_ok=False)

    def _id(self, name: str) -> str:
        stem = _SAFE_ID.sub("_", PurePosixPath(_basename(name)).stem).strip("_")[:60] or "clip"
        candidate, n = stem, 1
        while candidate.lower() in self.ids:
            n += 1
            candidate = f"{stem}_{n}"
        self.ids.add(candidate.lower())
        return candidate

    def add(self, name: str, data: bytes, text: str) -> None:
        limits = self.limits
        label = _basename(name)[:100] or "clip"
        if len(self.lines) >= limits.max_clips:
            raise UploadError(f"too many clips: at most {limits.max_clips}", 413)
        if len(data) > limits.max_clip_bytes:
            raise UploadError(f"{label}: {len(data)} bytes; a clip may have at most {limits.max_clip_bytes}", 413)
        if not data:
            raise UploadError(f"{label}: empty file (zero-length audio)")
        text = " ".join(text.replace("|", " ").split())
        if not text:
            raise UploadError(f"{label}: empty transcript")
        if len(text) > limits.max_transcript_chars:
            raise UploadError(f"{label}: transcript of {len(text)} characters; at most {limits.max_transcript_chars}")
        try:
            info = sf.info(io.BytesIO(data))
        except Exception:  # noqa: BLE001 - libsndfile raises several types for non-audio
            raise UploadError(f"{label}: not a readable audio file (WAV, FLAC, OGG or MP3)", 415) from None
        if not limits.min_sample_rate <= info.samplerate <= limits.max_sample_rate:
            raise UploadError(f"{label}: sample rate {info.samplerate} Hz outside {limits.min_sample_rate}-"
                              f"{limits.max_sample_rate} Hz")
        if info.frames > limits.max_clip_seconds * info.samplerate:   # refused before decoding it all
            raise UploadError(f"{label}: {info.frames / info.samplerate:.1f} s; a clip may last at most "
                              f"{limits.max_clip_seconds:g} s")
        try:
            audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except Exception:  # noqa: BLE001
            raise UploadError(f"{label}: the audio could not be decoded", 415) from None
        if audio.shape[0] == 0:
            raise UploadError(f"{label}: zero-length audio")
        mono = audio.mean(axis=1)
        seconds = len(mono) / rate
        if seconds > limits.max_clip_seconds:
            raise UploadError(f"{label}: {seconds:.1f} s; a clip may last at most {limits.max_clip_seconds:g} s")
        if seconds < limits.min_clip_seconds:
            raise UploadError(f"{label}: {seconds:.2f} s; a clip must last at least {limits.min_clip_seconds:g} s")
        if not np.isfinite(mono).all():
            raise UploadError(f"{label}: the audio holds non-finite samples")
        if float(np.abs(mono).max()) < 1e-4:
            raise UploadError(f"{label}: the clip is silent")
        self.seconds += seconds
        if self.seconds > limits.max_total_seconds:
            raise UploadError(f"more than {limits.max_total_seconds / 60:g} minutes of audio in one upload", 413)
        utt_id = self._id(name)
        pcm = np.clip(mono, -1.0, 1.0)
        sf.write(self.folder / "wavs" / f"{utt_id}.wav", pcm, rate, subtype="PCM_16")
        self.digest.update(pcm.tobytes())
        self.lines.append(f"{utt_id}|{text}")

    def finish(self) -> PreparedUpload:
        if not self.lines:
            raise UploadError("no clips in the upload")
        if self.seconds < self.limits.min_total_seconds:
            raise UploadError(f"{self.seconds:.1f} s of audio; a voice needs at least "
                              f"{self.limits.min_total_seconds:g} s (1-10 minutes is the intended range)")
        (self.folder / "metadata.csv").write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        return PreparedUpload(self.folder, len(self.lines), round(self.seconds, 2), self.digest.hexdigest())


def prepare_clips(clips: list[tuple[str, bytes]], transcripts: dict[str, str], folder: str | Path,
                  limits: UploadLimits = UploadLimits()) -> PreparedUpload:
    """Write uploaded ``(filename, bytes)`` clips with their transcripts (keyed by file name or stem)
    as an LJSpeech-style folder at ``folder`` (which must not exist)."""
    if not clips:
        raise UploadError("no clips uploaded: send files in 'clips' (with 'transcripts') or one 'archive'")
    if len(clips) > limits.max_clips:
        raise UploadError(f"{len(clips)} clips; at most {limits.max_clips}", 413)
    by_name = {k.strip(): v for k, v in transcripts.items()}
    by_stem = {PurePosixPath(_basename(k)).stem: v for k, v in by_name.items()}
    used: set[str] = set()
    writer = _DatasetWriter(Path(folder), limits)
    for name, data in clips:
        base = _basename(name)
        stem = PurePosixPath(base).stem
        if base in by_name:
            text, key = by_name[base], base
        elif stem in by_stem:
            text, key = by_stem[stem], stem
        else:
            raise UploadError(f"{base[:100] or 'a clip'}: no transcript for it in 'transcripts'")
        used.add(key)
        writer.add(base, data, text)
    unused = sorted(k for k in by_name if k not in used and PurePosixPath(_basename(k)).stem not in used)
    if unused:
        raise UploadError(f"transcripts without a clip: {', '.join(repr(u[:60]) for u in unused[:5])}")
    return writer.finish()


def _unsafe_member(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    if "\x00" in name or "\\" in name:
        return "a name with a backslash or NUL"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if ".." in PurePosixPath(name).parts:
        return "a '..' path"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "a symbolic link"
    if info.flag_bits & 0x1:
        return "encryption"
    return None


def prepare_archive(data: bytes, folder: str | Path, limits: UploadLimits = UploadLimits()) -> PreparedUpload:
    """Check an LJSpeech-style zip (``metadata.csv`` with ``id|text`` or ``id|text|normalized`` lines and
    ``wavs/<id>.<audio suffix>``, at the top or in one folder) and write it as a clean folder at ``folder``."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        raise UploadError("'archive' is not a zip file", 415) from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_archive_members:
            raise UploadError(f"the archive has {len(infos)} entries; at most {limits.max_archive_members}", 413)
        total = 0
        for info in infos:
            reason = _unsafe_member(info)
            if reason:
                raise UploadError(f"archive entry {info.filename[:100]!r} refused: {reason}")
            total += info.file_size
            if info.file_size > limits.max_clip_bytes and not info.is_dir():
                raise UploadError(f"archive entry {info.filename[:100]!r}: {info.file_size} bytes unpacked; at most "
                                  f"{limits.max_clip_bytes}", 413)
            if info.file_size > limits.max_compression_ratio * max(info.compress_size, 1) and info.file_size > 1 << 20:
                raise UploadError(f"archive entry {info.filename[:100]!r}: compression ratio over "
                                  f"{limits.max_compression_ratio:g} (a zip bomb?)", 413)
        if total > limits.max_unpacked_bytes:
            raise UploadError(f"the archive unpacks to {total} bytes; at most {limits.max_unpacked_bytes}", 413)
        members = {info.filename: info for info in infos if not info.is_dir()}
        metadata = [name for name in members if PurePosixPath(name).name == "metadata.csv"
                    and not name.startswith("__MACOSX/") and len(PurePosixPath(name).parts) <= 2]
        if len(metadata) != 1:
            raise UploadError("the archive needs exactly one metadata.csv (at the top or in one folder) with "
                              f"'id|text' lines and the clips in wavs/; found {len(metadata)}")
        root = str(PurePosixPath(metadata[0]).parent)
        prefix = "" if root == "." else root + "/"
        try:
            lines = _read_member(archive, members[metadata[0]], limits).decode("utf-8-sig").splitlines()
        except UnicodeDecodeError:
            raise UploadError("metadata.csv is not UTF-8 text") from None
        writer = _DatasetWriter(Path(folder), limits)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            fields = [f.strip() for f in line.split("|")]
            if len(fields) not in (2, 3) or not fields[0]:
                raise UploadError(f"metadata.csv line {number}: expected 'id|text' or 'id|text|normalized'")
            utt_id, text = fields[0], (fields[2] if len(fields) == 3 and fields[2] else fields[1])
            audio = next((members[f"{prefix}wavs/{utt_id}{s}"] for s in AUDIO_SUFFIXES
                          if f"{prefix}wavs/{utt_id}{s}" in members), None)
            if audio is None:
                raise UploadError(f"metadata.csv line {number}: no wavs/{utt_id[:60]}.wav (or .flac, ...) in the archive")
            writer.add(audio.filename, _read_member(archive, audio, limits), text)
        return writer.finish()


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limits: UploadLimits) -> bytes:
    # zipfile stops at the declared size and checks the CRC, so the header's size (checked above) bounds this.
    try:
        with archive.open(info) as handle:
            data = handle.read(limits.max_clip_bytes + 1)
    except (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, EOFError) as error:
        raise UploadError(f"archive entry {info.filename[:100]!r} cannot be read ({type(error).__name__})") from None
    if len(data) > limits.max_clip_bytes:
        raise UploadError(f"archive entry {info.filename[:100]!r} is larger than {limits.max_clip_bytes} bytes", 413)
    return data


# -- the worker ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    job_id: str
    tenant: str
    voice_id: str
    name: str


class JobRunner:
    """Runs onboarding jobs one at a time in a background thread.

    ``bundle_factory`` gives a private copy of the base for each job (``adapt`` adds its adapter to the
    model it is given; the resident serving model must not see that). ``on_ready(tenant, voice_id)``
    is called once a voice is stored.
    """

    def __init__(self, store: VoiceStore, jobs_dir: str | Path, bundle_factory: Callable[[], ModelBundle],
                 config: AdaptConfig, on_ready: Callable[[str, str], None] | None = None,
                 progress_interval: float = 1.0):
        self.store = store
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.bundle_factory = bundle_factory
        self.config = config
        self.on_ready = on_ready
        self.progress_interval = progress_interval
        self.seconds_per_step: float | None = None     # learned from finished jobs
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._consent_lock = threading.Lock()
        self._closing = threading.Event()
        self.running: str | None = None

    # -- lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="chorus-onboarding", daemon=True)
            self._thread.start()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop after the job in progress; queued jobs, and one still running when ``timeout`` passes,
        are left to the next start's recovery (interrupted, then resumed from their files)."""
        if self._thread is not None:
            self._closing.set()
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    # -- uploads and submission
    def new_upload_dir(self) -> Path:
        """A fresh folder for an upload being checked (removed by :meth:`discard` or moved by :meth:`submit`)."""
        folder = self.jobs_dir / f"{INCOMING_PREFIX}{uuid.uuid4().hex}"
        folder.mkdir()
        return folder

    def discard(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def submit(self, upload_dir: Path, job_id: str, tenant: str, voice_id: str, name: str, consent: dict) -> None:
        """Adopt ``upload_dir`` (holding the checked ``voice/`` folder) as job ``job_id`` and queue it."""
        job_dir = self.jobs_dir / job_id
        upload_dir.rename(job_dir)
        (job_dir / JOB_FILE).write_text(json.dumps({"job_id": job_id, "tenant": tenant, "voice_id": voice_id,
                                                    "name": name, "created": time.time()}), encoding="utf-8")
        self._record_consent({"time": time.time(), "tenant": tenant, "voice_id": voice_id, "job_id": job_id,
                              **consent})
        self._queue.put(_Job(job_id, tenant, voice_id, name))

    def _record_consent(self, entry: dict) -> None:
        # An append-only audit log that outlives the job's files.
        with self._consent_lock, open(self.jobs_dir / CONSENT_LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def resume(self) -> tuple[list[str], list[str]]:
        """After ``store.recover()``: queue every interrupted job whose files are still here, fail the
        others, and remove files no live job owns. Returns (resumed, failed) job ids."""
        resumed, failed = [], []
        for job in self.store.interrupted_jobs():
            job_dir = self.jobs_dir / job.job_id
            meta = _read_json(job_dir / JOB_FILE)
            try:
                voice = self.store.voice(job.tenant, job.voice_id)
            except VoiceNotFound:
                voice = None
            intact = (meta is not None and (job_dir / DATA_DIR / "metadata.csv").is_file() and voice is not None
                      and voice.job_id == job.job_id and meta.get("tenant") == job.tenant)
            if intact:
                self.store.update_job(job.job_id, status=JobStatus.RUNNING, progress=0.0,
                                      message="resumed after a server restart; waiting for the trainer")
                self._queue.put(_Job(job.job_id, job.tenant, job.voice_id, str(meta.get("name") or job.voice_id)))
                resumed.append(job.job_id)
            else:
                self.store.update_job(job.job_id, status=JobStatus.FAILED,
                                      message="interrupted by a server restart and its uploaded clips are gone; "
                                              "upload them again")
                shutil.rmtree(job_dir, ignore_errors=True)
                failed.append(job.job_id)
        live = set(resumed)
        for entry in self.jobs_dir.iterdir():
            if entry.is_dir() and entry.name not in live:
                meta = _read_json(entry / JOB_FILE)
                if meta is not None and self._active(meta):
                    continue   # another process's job (a store shared by servers)
                shutil.rmtree(entry, ignore_errors=True)
        if resumed or failed:
            log.info("onboarding jobs after restart: %d resumed, %d failed", len(resumed), len(failed))
        return resumed, failed

    def _active(self, meta: dict) -> bool:
        try:
            return self.store.get_job(str(meta.get("tenant")), str(meta.get("job_id"))).status in ACTIVE_JOB
        except (JobNotFound, ValueError):
            return False

    # -- the work
    def _loop(self) -> None:
        while (job := self._queue.get()) is not None and not self._closing.is_set():
            self.running = job.job_id
            try:
                self._run(job)
            except Exception:  # noqa: BLE001 - never let one job kill the worker
                log.exception("onboarding job %s crashed", job.job_id)
            finally:
                self.running = None

    def _run(self, job: _Job) -> None:
        job_dir = self.jobs_dir / job.job_id
        try:
            if self.store.get_job(job.tenant, job.job_id).status not in ACTIVE_JOB:
                return   # its voice was deleted while it waited
            self.store.update_job(job.job_id, status=JobStatus.RUNNING, progress=0.02,
                                  message="checking the clips and preparing the base")
            shutil.rmtree(job_dir / OUT_DIR, ignore_errors=True)   # a resumed job starts over
            config = self.config
            bundle = self.bundle_factory()
            with _ProgressTicker(self, job.job_id, config):
                result = adapt(job_dir / DATA_DIR, bundle, job_dir / OUT_DIR, config, progress=False, name=job.name)
            card = result.card
            if card.steps:
                spent = card.train_seconds / card.steps
                self.seconds_per_step = spent if self.seconds_per_step is None else \
                    0.5 * self.seconds_per_step + 0.5 * spent
            metrics = card.metrics
            self.store.update_job(job.job_id, progress=0.97, message=(
                f"trained {card.steps} steps in {card.train_seconds:.0f} s on {card.data_minutes:.2f} min of audio; "
                f"held-out mel L1 {metrics['validation_mel_l1_start']:.3f} -> {metrics['validation_mel_l1_best']:.3f}"))
            self.store.put_voice(job.tenant, job.voice_id, result.voice_dir, name=job.name, job_id=job.job_id)
            log.info("onboarding job %s: voice %s/%s is ready", job.job_id, job.tenant, job.voice_id)
            if self.on_ready is not None:
                self.on_ready(job.tenant, job.voice_id)
        except VoiceConflict as error:
            log.info("onboarding job %s dropped: %s", job.job_id, error)
            self._fail(job, "the voice was deleted or replaced while it trained")
        except ValueError as error:   # the data or the recipe (adapt's checks say why)
            log.info("onboarding job %s failed: %s", job.job_id, error)
            self._fail(job, str(error).replace(str(job_dir / DATA_DIR), "upload").replace(str(job_dir), "job"))
        except Exception:  # noqa: BLE001 - the details stay in the server log
            log.exception("onboarding job %s failed", job.job_id)
            self._fail(job, "training failed with an internal error (see the server log)")
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)

    def _fail(self, job: _Job, message: str) -> None:
        try:
            self.store.update_job(job.job_id, status=JobStatus.FAILED, message=message)
        except (ValueError, JobNotFound):
            pass   # already final (deleted voice)

    def expected_seconds(self, config: AdaptConfig) -> float:
        per_step = self.seconds_per_step if self.seconds_per_step is not None else 0.5
        return max(1.0, min(config.steps * per_step, config.max_minutes * 60))


class _ProgressTicker:
    """Moves a running job's progress from 0.05 to at most 0.95 as time passes against the expected
    training time (``adapt`` reports no steps)."""

    def __init__(self, runner: JobRunner, job_id: str, config: AdaptConfig):
        self.runner, self.job_id, self.config = runner, job_id, config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chorus-progress-{job_id[:8]}", daemon=True)

    def __enter__(self) -> _ProgressTicker:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        started = time.perf_counter()
        expected = self.runner.expected_seconds(self.config)
        while not self._stop.is_set():
            elapsed = time.perf_counter() - started
            fraction = 1.0 - math.exp(-elapsed / expected)   # never claims to be done
            try:
                self.runner.store.update_job(self.job_id, progress=round(0.05 + 0.9 * fraction, 3), message=(
                    f"training: {elapsed:.0f} s of about {expected:.0f} s (progress estimated from elapsed time)"))
            except (ValueError, JobNotFound):
                return   # the job ended (its voice was deleted)
            self._stop.wait(self.runner.progress_interval)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
