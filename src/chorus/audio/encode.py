"""Audio to bytes in the formats clients ask for: wav, flac, mp3, opus (in Ogg), aac (ADTS) and raw pcm.

The names and content types are OpenAI's ``response_format`` values. WAV and raw PCM are written
here (16-bit little-endian mono); FLAC by libsndfile; MP3, Opus and AAC by the FFmpeg encoders that
PyAV ships (LAME, libopus, FFmpeg's AAC). Every format but FLAC streams: :class:`AudioStream` turns
chunks of audio into bytes as they come, one continuous encoder over the whole text (no gap or
click between sentences), and a streamed WAV carries an "unknown length" header.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path

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
        if explicit not in FORMATS:
            raise ValueError(f"unknown audio format {explicit!r}; choose one of {', '.join(FORMATS)}")
        return explicit
    suffix = Path(path).suffix.lower() if path is not None else ""
    for audio_format in FORMATS.values():
        if suffix in audio_format.suffixes:
            return audio_format.name
    known = ", ".join(s for f in FORMATS.values() for s in f.suffixes)
    shown = f"suffix {suffix!r}" if suffix else "no suffix"
    raise ValueError(f"{path}: {shown}; give a file ending in one of {known}, or --format")


def output_rate(audio_format: str, sample_rate: int) -> int:
    """The rate ``audio_format`` is written at when asked for ``sample_rate`` (Opus takes 8-48 kHz in five steps)."""
    rates = FORMATS[audio_format].rates
    return sample_rate if rates is None or sample_rate in rates else rates[-1]


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``audio`` ``[samples]`` at ``to_rate`` (soxr, high quality)."""
    if from_rate == to_rate or not audio.size:
        return audio
    return soxr.resample(audio, from_rate, to_rate, quality="HQ").astype(np.float32)


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 16-bit mono PCM WAV header; ``data_bytes=None`` writes 0xFFFFFFFF sizes ("unknown length", for streams)."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
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
    ``close()`` the rest. FLAC is kept and encoded whole at ``close()``."""

    def __init__(self, audio_format: str, sample_rate: int, out_rate: int | None = None):
        self.format = FORMATS[format_for(None, audio_format)]
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

    def write(self, audio: np.ndarray) -> bytes:
        audio = np.clip(resample(np.asarray(audio, dtype=np.float32).reshape(-1), self.sample_rate, self.rate), -1, 1)
        name = self.format.name
        if name == "flac":
            self._kept.append(audio)
            return b""
        if name in ("wav", "pcm"):
            header = b"" if self._started or name == "pcm" else wav_header(self.rate)
            self._started = True
            return header + pcm16(audio)
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
    if stream.format.name == "wav":
        data = pcm16(resample(np.asarray(audio, dtype=np.float32), sample_rate, stream.rate))
        return wav_header(stream.rate, len(data)) + data
    return stream.write(audio) + stream.close()
