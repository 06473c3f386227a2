"""Checking onboarding uploads before any job exists, and writing them as an LJSpeech-style folder.

Every clip is decoded (libsndfile, else FFmpeg's decoders) and heard; one the onboarding job could not
train on (unreadable, empty, silent, too short or long, non-finite, no speech heard, or missing from an
archive) is left out and named in the answer, as `chorus adapt` leaves out a folder's, and the upload is
refused only when too little speech is left. Sizes, clip count and total duration are bounded, and an archive
is refused for absolute paths, ``..``, links, encryption, too many members or an implausible
compression ratio (a zip bomb). Nothing from an upload ever names a file on disk: clips are re-encoded
as 16-bit WAV under sanitized ids.
"""

from __future__ import annotations

import hashlib
import io
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import soundfile as sf

from chorus.audio.io import AudioTooDense, AudioTooLong, decode_with_av, downmix
from chorus.audio.silences import split_at_silences
from chorus.data.check import channels_cancel, heard_speech, silence_problem, tenths_down
from chorus.data.formats import clip_names, names_columns  # uploads read a dataset as the data check does
from chorus.serving.errors import UploadError, in_bytes
from chorus.serving.json_body import BodyError, loads_bounded
from chorus.serving.settings import UploadLimits

_SAFE_ID = re.compile(r"[^A-Za-z0-9_-]+")
# The most samples (frames x channels) a clip may decode to: per second it may last, a stereo recording at 48 kHz,
# and never less than a minute of stereo at the highest rate the limits take. A FLAC of one steady tone at 192 kHz
# in 8 channels is 94 KB a minute and decoded 1.1 GB a minute (a probe of the server). Only what the server sets
# counts: a budget by the file's size was padded past (a FLAC PADDING block of 10 MB decodes to nothing).
DECODED_SAMPLES_PER_SECOND = 2 * 48_000
FLOOR_SECONDS = 60.0


class RecordingTooLong(UploadError):
    """A recording longer than ``longest`` seconds, found from its metadata or while decoding it (which
    stopped there): it lasts ``seconds``, or more when ``at_least``."""

    def __init__(self, label: str, seconds: float, longest: float, at_least: bool = False):
        more = " or more" if at_least else ""
        super().__init__(f"{label}: {seconds:.1f} s{more}; a clip may last at most {longest:g} s")
        self.seconds, self.longest, self.at_least = seconds, longest, at_least


@dataclass(frozen=True)
class PreparedUpload:
    folder: Path
    clips: int
    seconds: float
    audio_sha256: str  # over every decoded clip, for the consent record
    left_out: tuple[str, ...] = ()  # "clip: why" for each clip not kept (unreadable, silent, no speech, ...)


def parse_transcripts(text: str) -> dict[str, str]:
    """Transcripts by clip file name: a JSON object ``{"a.wav": "text", ...}`` or lines ``a.wav|text``."""
    text = text.strip().lstrip("\ufeff")
    if not text:
        raise UploadError("'transcripts' is empty: give a JSON object {filename: text} or lines 'filename|text'")
    if text.startswith("{"):
        try:  # bounded as request bodies are: nesting thousands deep would overflow json's recursion
            data = loads_bounded(text.encode("utf-8", "surrogatepass"), unique_keys=True)  # as the lines refuse it
        except BodyError as error:
            raise UploadError(f"'transcripts': {str(error).replace('the request body', 'the JSON')}") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise UploadError("'transcripts' JSON must be an object of filename -> text strings")
        return dict(data)
    out: dict[str, str] = {}
    lines = text.splitlines()
    if lines and names_columns([f.strip() for f in lines[0].split("|")]):
        lines[0] = ""  # a header row ("filename|text"), as metadata.csv may have
    for number, line in enumerate(lines, start=1):
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
        self.left_out: list[tuple[str, int]] = []  # ("clip: why", its HTTP status), as UploadError said them
        self.ids: set[str] = set()
        self.seconds = 0.0
        self.decoded_seconds = 0.0  # of every clip decoded, kept or left out: what the upload cost to read
        self.speech_seconds = 0.0  # as a voice-activity detector hears it, as the job's data check counts it
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

    def add(self, name: str, data: bytes, text: str | None) -> None:
        """One clip; ``text`` None: no transcript (the onboarding job transcribes it, and a long
        recording is cut at its silences there, so it may last up to the upload's whole budget). A clip the
        job could not train on (unreadable, too short or long, silent, no speech, an empty transcript) is left
        out and named, as `chorus adapt` leaves out its folder's; the upload's limits (413) refuse it whole."""
        limits = self.limits
        label = _basename(name)[:100] or "clip"
        if len(self.lines) + len(self.left_out) >= limits.max_clips:
            raise UploadError(f"too many clips: at most {limits.max_clips}", 413)
        if len(data) > limits.max_clip_bytes:
            raise UploadError(
                f"{label}: {in_bytes(len(data))}; a clip may have at most {in_bytes(limits.max_clip_bytes)}", 413
            )
        try:
            mono, rate, text, speech = self._heard(label, data, text)
        except UploadError as error:
            if error.status == 413:
                raise
            self.leave_out(str(error), error.status)
            return
        self.write(name, mono, rate, text, speech)

    def _heard(self, label: str, data: bytes, text: str | None) -> tuple[np.ndarray, int, str | None, float]:
        """A clip decoded ``[samples]``, its rate, its transcript tidied and its seconds of speech; an
        ``UploadError`` naming ``label`` where the job could not train on it."""
        limits = self.limits
        longest = limits.max_total_seconds if text is None else limits.max_clip_seconds
        if not data:
            raise UploadError(f"{label}: empty file (zero-length audio)")
        text = None if text is None else " ".join(text.replace("|", " ").split())
        if text == "":
            raise UploadError(f"{label}: empty transcript")
        if text is not None and len(text) > limits.max_transcript_chars:
            raise UploadError(f"{label}: transcript of {len(text)} characters; at most {limits.max_transcript_chars}")
        mono, rate = decode_recording(label, data, longest, limits)
        # Bounded over every clip, left out or kept: clips left out must not make reading an upload unbounded.
        self.decoded_seconds += len(mono) / rate
        if self.decoded_seconds > limits.max_total_seconds:
            raise UploadError(f"more than {limits.max_total_seconds / 60:g} minutes of audio in one upload", 413)
        speech, no_speech = clip_speech(mono, rate, transcribed=text is not None)
        if speech == 0 and (silent := silence_problem(mono, rate)):  # a clip too quiet, named, not a sum of 0 s
            raise UploadError(f"{label}: no speech heard ({silent})")
        if no_speech:  # a tone, music or noise, which the job's data check would leave out
            raise UploadError(f"{label}: no speech heard ({no_speech})")
        return mono, rate, text, speech

    def write(self, name: str, mono: np.ndarray, rate: int, text: str | None, speech: float) -> None:
        """One clip already decoded and heard (``mono`` ``[samples]`` at ``rate``, ``speech`` seconds of it),
        written as 16-bit WAV under a sanitized id."""
        limits = self.limits
        self.seconds += len(mono) / rate
        self.speech_seconds += speech
        if self.seconds > limits.max_total_seconds:
            raise UploadError(f"more than {limits.max_total_seconds / 60:g} minutes of audio in one upload", 413)
        utt_id = self._id(name)
        pcm = np.clip(mono, -1.0, 1.0)  # as recording_sha256 digests it
        # Encoded in memory and written by Python: libsndfile's own file writes turn a full or
        # read-only disk into an opaque "System error" instead of the OSError the server answers 503 for.
        wav = io.BytesIO()
        sf.write(wav, pcm, rate, format="WAV", subtype="PCM_16")
        (self.folder / "wavs" / f"{utt_id}.wav").write_bytes(wav.getvalue())
        self.digest.update(pcm.tobytes())
        self.lines.append(f"{utt_id}|{text or ''}")  # an empty text: transcribed by the job

    def finish(self) -> PreparedUpload:
        if not self.lines and not self.left_out:
            raise UploadError("no clips in the upload")
        if not self.lines:  # an upload of unreadable files only is 415, as one such file is
            statuses = {status for _, status in self.left_out}
            status = statuses.pop() if len(statuses) == 1 else 400
            raise UploadError(f"no clip in the upload can be trained on: {self._named_left_out()}", status)
        if self.speech_seconds < self.limits.min_total_seconds:
            raise UploadError(
                f"{tenths_down(self.speech_seconds)} s of speech ({self.seconds:.1f} s of audio, with the silence, noise "
                f"and pauses around the words); a voice needs at least {self.limits.min_total_seconds:g} s of speech "
                "(1-10 minutes is the intended range)"
                + (f"; left out: {self._named_left_out()}" if self.left_out else "")
            )
        (self.folder / "metadata.csv").write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        return PreparedUpload(
            self.folder,
            len(self.lines),
            round(self.seconds, 2),
            self.digest.hexdigest(),
            tuple(reason for reason, _ in self.left_out),
        )

    def leave_out(self, reason: str, status: int = 400) -> None:
        """Leave a clip out, saying why; refused with 413 once the clips named reach the upload's limit."""
        if len(self.lines) + len(self.left_out) >= self.limits.max_clips:
            raise UploadError(f"too many clips: at most {self.limits.max_clips}", 413)
        self.left_out.append((reason, status))

    def _named_left_out(self, shown: int = 5) -> str:
        more = len(self.left_out) - shown
        return "; ".join(reason for reason, _ in self.left_out[:shown]) + (f" (and {more} more)" if more > 0 else "")


def prepare_heard(
    name: str, mono: np.ndarray, rate: int, speech: float, folder: str | Path, limits: UploadLimits
) -> PreparedUpload:
    """One recording without a transcript that its route has decoded and heard already (a custom voice's
    sample: ``mono`` ``[samples]`` at ``rate``, ``speech`` seconds of it by :func:`clip_speech`), written as
    the onboarding job's folder at ``folder``, so that it is not decoded and heard a second time."""
    writer = _DatasetWriter(Path(folder), limits)
    writer.write(name, mono, rate, None, speech)
    return writer.finish()


def audit_recording(mono: np.ndarray, rate: int) -> bytes:
    """What a consent keeps of its recording ``[samples]`` for audit: the decoded sound as 16-bit FLAC. The
    upload's own bytes could carry anything beside the sound (a probe stored 9.9 MB of random bytes in a WAV's
    ``junk`` chunk, outside every quota); re-encoded, it is what its samples need (a minute of speech at 48 kHz
    about 3 MB, of noise about 6). Its sha256 (the consent record's) is the FLAC's, not the upload's."""
    flac = io.BytesIO()
    sf.write(flac, np.clip(mono, -1.0, 1.0), rate, format="FLAC", subtype="PCM_16")
    return flac.getvalue()


def recording_sha256(mono: np.ndarray) -> str:
    """The sha256 of one recording ``[samples]`` as an upload's clips are digested (its samples clipped to
    [-1, 1]), for the consent record of a sample that is written as no upload."""
    return hashlib.sha256(np.clip(mono, -1.0, 1.0).tobytes()).hexdigest()


def clip_speech(mono: np.ndarray, rate: int, transcribed: bool) -> tuple[float, str | None]:
    """(the speech an uploaded clip ``[samples]`` gives the onboarding job's data check, as a voice-activity
    detector hears it; why the check would leave all of it out, or None). A transcribed clip is judged whole;
    one without a transcript is cut at its silences first, as the job cuts it for Whisper, and the speech of
    the pieces the check would keep summed (an upper bound: a piece Whisper finds no words in is left out there);
    it is left out only where every piece is."""
    if transcribed:
        return heard_speech(mono, rate)
    speech, first_refusal = 0.0, None
    for piece in split_at_silences(mono, rate):
        seconds, no_speech = heard_speech(piece, rate)
        if no_speech is None:
            speech += seconds
        first_refusal = first_refusal or no_speech
    return speech, (first_refusal if speech == 0 else None)


def decode_recording(label: str, data: bytes, longest: float, limits: UploadLimits) -> tuple[np.ndarray, int]:
    """An uploaded recording's mono samples ``[samples]`` and rate, checked: a readable audio file (by
    libsndfile, else FFmpeg's decoders), its rate within the limits, at least ``limits.min_clip_seconds``
    long, finite and not silent; ``UploadError`` (named by ``label``) otherwise. One longer than ``longest``
    seconds is refused (:class:`RecordingTooLong`) from the duration its container declares, before any
    decoding, or, where that understates it, as soon as decoding passes ``longest``: never decoded whole. So
    is one whose channels and rate hold more samples than ``DECODED_SAMPLES_PER_SECOND`` x ``longest`` (at least
    ``FLOOR_SECONDS`` of stereo at ``limits.max_sample_rate``)."""
    audio, rate = _decode_within(label, data, longest, limits)
    if not np.isfinite(audio).all():
        raise UploadError(f"{label}: the audio holds non-finite samples")
    mono = downmix(audio)
    seconds = len(mono) / rate
    if seconds < limits.min_clip_seconds:
        raise UploadError(f"{label}: {seconds:.2f} s; a clip must last at least {limits.min_clip_seconds:g} s")
    # Sums without a float64 copy of the samples: 10 minutes at 192 kHz had cost 1.3 GB on top of the 0.46 GB decoded.
    mix_db = float(10 * np.log10(np.einsum("i,i->", mono, mono, dtype=np.float64) / len(mono) + 1e-20))
    if channels_cancel(audio, mix_db) and silence_problem(mono, rate):  # as the data check tells it
        raise UploadError(
            f"{label}: its channels cancel when mixed to mono (one is the other inverted?); export one channel"
        )
    if max(float(mono.max()), -float(mono.min())) < 1e-4:
        raise UploadError(f"{label}: the clip is silent")
    return mono, rate


def _decode_within(label: str, data: bytes, longest: float, limits: UploadLimits) -> tuple[np.ndarray, int]:
    """:func:`decode_recording`'s samples ``[samples, channels]`` and rate, decoded within its bounds."""
    budget = int(max(longest * DECODED_SAMPLES_PER_SECOND, FLOOR_SECONDS * 2 * limits.max_sample_rate))
    decoded = None
    try:
        info = sf.info(io.BytesIO(data))
        rate, frames, channels = info.samplerate, info.frames, info.channels
    except Exception:  # noqa: BLE001 - libsndfile raises several types for non-audio
        try:  # AAC/M4A, WebM: FFmpeg's decoders, stopped as soon as the clip is longer than it may be
            decoded = decode_with_av(io.BytesIO(data), max_seconds=longest, max_samples=budget)
        except AudioTooLong as error:
            raise RecordingTooLong(label, error.seconds, longest, at_least=True) from None
        except AudioTooDense as error:
            raise _too_many_samples(label, error.channels, error.rate, longest) from None
        if decoded is None:
            raise UploadError(
                f"{label}: not a readable audio file (WAV, FLAC, OGG, MP3, AAC/M4A or WebM)", 415
            ) from None
        rate, frames, channels = decoded[1], len(decoded[0]), decoded[0].shape[1]
    if rate < limits.min_sample_rate:
        raise UploadError(
            f"{label}: recorded at {rate} Hz; at least {limits.min_sample_rate} Hz (record again, or export the "
            "original recording: resampling up adds no voice)"
        )
    if rate > limits.max_sample_rate:
        raise UploadError(f"{label}: recorded at {rate} Hz; at most {limits.max_sample_rate} Hz")
    if frames > longest * rate:  # refused before decoding it all
        raise RecordingTooLong(label, frames / rate, longest)
    most = min(int(longest * rate), budget // max(channels, 1))
    if frames > most:
        raise _too_many_samples(label, channels, rate, longest)
    if decoded is not None:
        audio = decoded[0]
    else:
        try:
            # One frame past the bound at most: a declared length that understates the stream (an MP3 without
            # a length header is estimated) is caught at that frame, not after decoding all of it.
            audio, rate = sf.read(io.BytesIO(data), frames=most + 1, dtype="float32", always_2d=True)
        except Exception:  # noqa: BLE001
            raise UploadError(f"{label}: the audio could not be decoded", 415) from None
    if audio.shape[0] == 0:
        raise UploadError(f"{label}: zero-length audio")
    if audio.shape[0] > int(longest * rate):
        raise RecordingTooLong(label, audio.shape[0] / rate, longest, at_least=decoded is None)
    if audio.shape[0] > most:  # the header understated the length: caught one frame past the budget
        raise _too_many_samples(label, channels, rate, longest)
    return audio, rate


def _too_many_samples(label: str, channels: int, rate: int, longest: float) -> UploadError:
    return UploadError(
        f"{label}: {channels} channel(s) at {rate} Hz hold more samples than a clip may decode to here (as many "
        f"as {longest:g} s of stereo at 48 kHz, or a minute of stereo at any rate taken); export it as mono or "
        "stereo at 48 kHz or less"
    )


def prepare_clips(
    clips: list[tuple[str, bytes]],
    transcripts: dict[str, str] | None,
    folder: str | Path,
    limits: UploadLimits = UploadLimits(),
) -> PreparedUpload:
    """Write uploaded ``(filename, bytes)`` clips with their transcripts (keyed by file name or stem)
    as an LJSpeech-style folder at ``folder`` (which must not exist). ``transcripts`` None: none given;
    the lines leave the text empty and the onboarding job transcribes the clips with Whisper."""
    if not clips:
        raise UploadError("no clips uploaded: send files in 'clips' (with 'transcripts') or one 'archive'")
    if len(clips) > limits.max_clips:
        raise UploadError(f"{len(clips)} clips; at most {limits.max_clips}", 413)
    if transcripts is None:
        writer = _DatasetWriter(Path(folder), limits)
        for name, data in clips:
            writer.add(name, data, None)
        return writer.finish()
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


def _check_entries(infos: list[zipfile.ZipInfo], limits: UploadLimits) -> None:
    """Refuse an archive for its entries' names, kinds, sizes and compression, before reading any."""
    if len(infos) > limits.max_archive_members:
        raise UploadError(f"the archive has {len(infos)} entries; at most {limits.max_archive_members}", 413)
    total = 0
    for info in infos:
        reason = _unsafe_member(info)
        if reason:
            raise UploadError(f"archive entry {info.filename[:100]!r} refused: {reason}")
        total += info.file_size
        if info.file_size > limits.max_clip_bytes and not info.is_dir():
            raise UploadError(
                f"archive entry {info.filename[:100]!r}: {in_bytes(info.file_size)} unpacked; at most "
                f"{in_bytes(limits.max_clip_bytes)}",
                413,
            )
        if info.file_size > limits.max_compression_ratio * max(info.compress_size, 1) and info.file_size > 1 << 20:
            raise UploadError(
                f"archive entry {info.filename[:100]!r}: compression ratio over "
                f"{limits.max_compression_ratio:g} (a zip bomb?)",
                413,
            )
    if total > limits.max_unpacked_bytes:
        raise UploadError(
            f"the archive unpacks to {in_bytes(total)}; at most {in_bytes(limits.max_unpacked_bytes)}", 413
        )


def prepare_archive(data: bytes, folder: str | Path, limits: UploadLimits = UploadLimits()) -> PreparedUpload:
    """Check an LJSpeech-style zip (``metadata.csv`` with ``id|text`` or ``id|text|normalized`` lines and
    ``wavs/<id>.<audio suffix>``, at the top or in one folder) and write it as a clean folder at ``folder``."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        raise UploadError("'archive' is not a zip file", 415) from None
    with archive:
        infos = archive.infolist()
        _check_entries(infos, limits)
        members = {_member_name(info): info for info in infos if not info.is_dir()}
        metadata = [
            name
            for name in members
            if PurePosixPath(name).name == "metadata.csv"
            and not name.startswith("__MACOSX/")
            and len(PurePosixPath(name).parts) <= 2
        ]
        if len(metadata) != 1:
            raise UploadError(
                "the archive needs exactly one metadata.csv (at the top or in one folder) with "
                f"'id|text' lines and the clips in wavs/; found {len(metadata)}"
            )
        root = str(PurePosixPath(metadata[0]).parent)
        prefix = "" if root == "." else root + "/"
        try:
            lines = _read_member(archive, members[metadata[0]], limits).decode("utf-8-sig").splitlines()
        except UnicodeDecodeError:
            raise UploadError("metadata.csv is not UTF-8 text") from None
        if any("\x00" in line for line in lines):  # UTF-16 of plain letters without a byte-order mark
            raise UploadError("metadata.csv is not UTF-8 text (NUL characters: UTF-16?)")
        writer = _DatasetWriter(Path(folder), limits)
        first: dict[str, int] = {}  # a clip's entry -> the line that gave it
        opening = next((number for number, line in enumerate(lines, start=1) if line.strip()), 0)  # a header's line
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            fields = [f.strip() for f in line.split("|")]
            audio = _clip_member(members, f"{prefix}wavs/", fields[0])
            if audio is None and number == opening and names_columns(fields):
                continue  # a header row, of any number of columns ("id|text|normalized|speaker")
            if len(fields) not in (2, 3) or not fields[0]:
                raise UploadError(f"metadata.csv line {number}: expected 'id|text' or 'id|text|normalized'")
            utt_id, text = fields[0], (fields[2] if len(fields) == 3 and fields[2] else fields[1])
            if audio is None:  # left out, as `chorus adapt` leaves out a line of its folder without a clip
                beside = (
                    " (it is beside metadata.csv: put the clips in wavs/)"
                    if "/" not in utt_id and _clip_member(members, prefix, utt_id)
                    else ""
                )
                writer.leave_out(
                    f"metadata.csv line {number}: no wavs/{utt_id[:60]}.wav (or .flac, ...) in the archive{beside}"
                )
                continue
            if audio.filename in first:  # by its clip: "a" and "a.wav" are one
                raise UploadError(
                    f"metadata.csv line {number}: id {utt_id[:60]!r} is given twice (line {first[audio.filename]})"
                )
            first[audio.filename] = number
            # An id with no text (``id|``) is transcribed by the job, as `chorus adapt` transcribes it.
            writer.add(_member_name(audio), _read_member(archive, audio, limits), text or None)
        return writer.finish()


def _member_name(info: zipfile.ZipInfo) -> str:
    """An entry's name as its maker wrote it: zip tools that set no UTF-8 flag (Info-ZIP's ``zip``, Windows')
    still write UTF-8 names, which ``zipfile`` reads as code page 437."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except UnicodeError:
        return info.filename


def _clip_member(members: dict[str, zipfile.ZipInfo], wavs: str, utt_id: str) -> zipfile.ZipInfo | None:
    """The clip of ``utt_id`` under ``wavs`` as a dataset folder has it (``data.formats.clip_names``)."""
    return next((members[f"{wavs}{name}"] for name in clip_names(utt_id) if f"{wavs}{name}" in members), None)


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
