"""Audio to bytes in the formats clients ask for: wav, flac, mp3, opus (in Ogg), aac (ADTS) and raw pcm.

The names and content types are OpenAI's ``response_format`` values. WAV and raw PCM are written
here (16-bit little-endian mono); FLAC by libsndfile; MP3, Opus and AAC by the FFmpeg encoders that
PyAV ships (LAME, libopus, FFmpeg's AAC). Every format but FLAC streams: :class:`AudioStream` turns
chunks of audio into bytes as they come, one continuous encoder over the whole text (no gap or
click between sentences). A WAV says its true length wherever it is known before its header goes out
(the whole audio at once, :func:`encode_whole`); a streamed one carries an "unknown length" header.
:class:`AudioWriter` writes chunks into a file as they come, keeping none of them, and gives a WAV in a
file it can seek its true sizes when it is closed.
"""

from __future__ import annotations

import io
import numbers
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr


@dataclass(frozen=True)
class AudioFormat:
    name: str
    content_type: str
    suffixes: tuple[str, ...]
    streams: bool
    codec: str | None = None  # PyAV encoder; None: written here or by libsndfile
    container: str | None = None  # PyAV muxer
    rates: tuple[int, ...] | None = None  # sample rates the codec takes (others are resampled to the last)


MIN_RATE, MAX_RATE = 8_000, 48_000  # the output sample rates (Hz) a file may be asked for: telephone to studio
_MPEG_RATES = (8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000)
FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", "audio/wav", (".wav",), streams=True),
        AudioFormat("flac", "audio/flac", (".flac",), streams=False),
        AudioFormat("mp3", "audio/mpeg", (".mp3",), True, "libmp3lame", "mp3", _MPEG_RATES),
        AudioFormat(
            "opus", "audio/ogg", (".opus", ".ogg"), True, "libopus", "ogg", (8_000, 12_000, 16_000, 24_000, 48_000)
        ),
        AudioFormat("aac", "audio/aac", (".aac",), True, "aac", "adts", _MPEG_RATES),
        AudioFormat("pcm", "audio/pcm", (".pcm", ".raw"), streams=True),
    )
}


def format_for(path: str | Path | None, explicit: str | None = None) -> str:
    """The format of an output: ``explicit`` if given, else by ``path``'s suffix.

    Raises ``ValueError`` for an unknown format or suffix (never a silent WAV)."""
    if explicit is not None:
        return format_named(explicit)
    suffix = Path(path).suffix.lower() if path is not None else ""
    for audio_format in FORMATS.values():
        if suffix in audio_format.suffixes:
            return audio_format.name
    known = ", ".join(s for f in FORMATS.values() for s in f.suffixes)
    shown = f"suffix {suffix!r}" if suffix else "no suffix"
    raise ValueError(f"{path}: {shown}; give a file ending in one of {known}, or name the format")


def format_named(name: str) -> str:
    """The format ``name`` names, in any case, by its name or a suffix of its files ("WAV", "ogg", ".raw");
    ``ValueError`` listing the formats otherwise."""
    key = name.lower().removeprefix(".") if isinstance(name, str) else name
    for audio_format in FORMATS.values():
        if key == audio_format.name or f".{key}" in audio_format.suffixes:
            return audio_format.name
    raise ValueError(f"unknown audio format {name!r}; choose one of {', '.join(FORMATS)}")


def output_rate(audio_format: str, sample_rate: int) -> int:
    """The rate ``audio_format`` is written at when asked for ``sample_rate``: Opus takes 8, 12, 16, 24 or 48 kHz,
    and another rate is written at 48 kHz, the rate every Opus file decodes at (what a client is told)."""
    rates = FORMATS[audio_format].rates
    return sample_rate if rates is None or sample_rate in rates else rates[-1]


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``audio`` ``[samples]`` at ``to_rate`` (soxr, high quality)."""
    if from_rate == to_rate or not audio.size:
        return audio
    return soxr.resample(audio, from_rate, to_rate, quality="HQ").astype(np.float32)


WAV_HEADER_BYTES = 44
# The most sample bytes a WAV can state: its RIFF size (data + 36) is a 32-bit field.
_WAV_MAX_DATA = 0xFFFFFFFF - 36


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 16-bit mono PCM WAV header; ``data_bytes=None`` (or more than 32 bits can state) writes 0xFFFFFFFF
    sizes ("unknown length", for streams)."""
    known = data_bytes is not None and data_bytes <= _WAV_MAX_DATA
    data = data_bytes if known else 0xFFFFFFFF
    riff = 36 + data_bytes if known else 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def pcm16(audio: np.ndarray) -> bytes:
    """``audio`` ``[samples]`` in [-1, 1] (clipped beyond) as 16-bit little-endian PCM."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class _Sink(io.RawIOBase):
    """A write-only file whose bytes are taken out as the muxer writes them."""

    def __init__(self):
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


class AudioStream:
    """Chunks of audio in, bytes of one ``audio_format`` file out, as they come.

    ``sample_rate`` is the rate of the audio written; ``rate`` the file's (see :func:`output_rate`).
    ``write(audio)`` returns the bytes ready so far (possibly none: encoders work in frames);
    ``close()`` the rest. FLAC is kept and encoded whole at ``close()`` (:class:`AudioWriter` writes it to a
    file as it comes)."""

    def __init__(self, audio_format: str, sample_rate: int, out_rate: int | None = None):
        self.format = FORMATS[format_for(None, audio_format)]
        if out_rate is not None and (
            isinstance(out_rate, bool)
            or not isinstance(out_rate, numbers.Integral)
            or not MIN_RATE <= out_rate <= MAX_RATE
        ):  # 0 had been written at the model's rate unsaid, 22050.5 a struct error, -5 soxr's
            raise ValueError(
                f"sample_rate must be a whole number of Hz from {MIN_RATE:,} to {MAX_RATE:,}, got {out_rate!r}"
            )
        self.sample_rate = sample_rate
        self.rate = output_rate(self.format.name, out_rate or sample_rate)
        self._kept: list[np.ndarray] = []
        self._started = False
        self._container = self._stream = self._sink = None
        if self.format.codec is not None:
            import av

            self._sink = _Sink()
            self._container = av.open(self._sink, mode="w", format=self.format.container)
            self._stream = self._container.add_stream(self.format.codec, rate=self.rate, layout="mono")

    def prepared(self, audio: np.ndarray) -> np.ndarray:
        """``audio`` ``[samples]`` at the file's rate, clipped to [-1, 1]: what is encoded."""
        return np.clip(resample(np.asarray(audio, dtype=np.float32).reshape(-1), self.sample_rate, self.rate), -1, 1)

    def write(self, audio: np.ndarray, last: bool = False) -> bytes:
        """The bytes of ``audio`` ``[samples]`` ready so far. ``last``: no audio follows, so a WAV whose header
        has not gone out yet states its true length (then :meth:`close` adds nothing)."""
        audio = self.prepared(audio)
        name = self.format.name
        if name == "flac":
            self._kept.append(audio)
            return b""
        if name in ("wav", "pcm"):
            data = pcm16(audio)
            if name == "wav" and not self._started:
                data = wav_header(self.rate, len(data) if last else None) + data
            self._started = True
            return data
        return self._encode(audio)

    def _encode(self, audio: np.ndarray | None) -> bytes:
        import av

        frame = None
        if audio is not None:
            if not audio.size:
                return b""
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio[None, :]), format="flt", layout="mono")
            frame.sample_rate = self.rate
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        name = self.format.name
        if name == "flac":
            buffer = io.BytesIO()
            audio = np.concatenate(self._kept) if self._kept else np.zeros(0, np.float32)
            sf.write(buffer, audio, self.rate, format="FLAC", subtype="PCM_16")
            return buffer.getvalue()
        if name == "wav" and not self._started:
            return wav_header(self.rate, 0)
        if self._container is None:
            return b""
        tail = self._encode(None)
        self._container.close()
        return tail + self._sink.take()


def encode_whole(audio: np.ndarray, sample_rate: int, audio_format: str, out_rate: int | None = None) -> bytes:
    """``audio`` ``[samples]`` at ``sample_rate`` as one file of ``audio_format`` (a WAV with its true length)."""
    stream = AudioStream(audio_format, sample_rate, out_rate)
    return stream.write(audio, last=True) + stream.close()


class AudioWriter:
    """Chunks of audio written into ``file`` (binary, open for writing) as one file of ``audio_format``, as
    they come: each :meth:`write`'s bytes are in ``file`` (flushed) when it returns, so a pipe or a player
    gets every sentence as it is made, and no audio is kept here (memory stays flat with the text's length).

    ``seekable``: ``file`` is one this process opened (not standard output, which may be a pipe, or a file
    opened for appending where a seek back would be ignored). Then a WAV's header, written first with
    "unknown length", is rewritten with the true sizes at :meth:`close`, where the file began; elsewhere a
    WAV knows its length only when its first write is its last (``last=True``). FLAC states its length in
    its header and is not streamed: libsndfile writes it as it comes into ``file`` when seekable, else into a
    temporary file that is copied to ``file`` at :meth:`close`. :meth:`close` leaves ``file`` open."""

    def __init__(
        self, file: BinaryIO, audio_format: str, sample_rate: int, out_rate: int | None = None, seekable: bool = False
    ):
        self._file = file
        self._encoder = AudioStream(audio_format, sample_rate, out_rate)
        self.format = self._encoder.format.name
        self._start = file.tell() if seekable else None
        self._bytes = 0  # written into file so far, header included
        self._flac = self._spool = None
        if self.format == "flac":
            self._spool = file if seekable else tempfile.TemporaryFile()
            self._flac = sf.SoundFile(self._spool, "w", self._encoder.rate, 1, format="FLAC", subtype="PCM_16")

    def write(self, audio: np.ndarray, last: bool = False) -> None:
        """Encode ``audio`` ``[samples]`` into the file now; ``last``: nothing follows (see the class)."""
        if self._flac is not None:
            self._flac.write(self._encoder.prepared(audio))
            return
        self._put(self._encoder.write(audio, last))

    def close(self) -> None:
        """End the file: the encoder's tail, and the true sizes where they can still be written."""
        if self._flac is not None:
            self._flac.close()
            if self._spool is not self._file:
                self._spool.seek(0)
                shutil.copyfileobj(self._spool, self._file)
                self._spool.close()
            self._file.flush()
            return
        self._put(self._encoder.close())
        if self.format == "wav" and self._start is not None and self._bytes >= WAV_HEADER_BYTES:
            end = self._file.tell()
            self._file.seek(self._start)
            self._file.write(wav_header(self._encoder.rate, self._bytes - WAV_HEADER_BYTES))
            self._file.seek(end)
            self._file.flush()

    def _put(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self._file.flush()
            self._bytes += len(data)
