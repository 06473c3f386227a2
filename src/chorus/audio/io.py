"""Reading and writing audio: any WAV/FLAC in, mono float32 at the model's rate out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr

from chorus.atomic import atomic_write

SAMPLE_RATE = 22_050
# A channel this far under a recording's loudest holds no part of it (a mic on one side of a stereo input, the
# other channel's hiss or crosstalk): averaged in, it would halve the sound, 6 dB quieter.
SILENT_CHANNEL_DB = 30.0


class AudioError(ValueError):
    """An audio file that cannot be used; the message names the file and the reason."""


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE, min_rate: int = 0) -> np.ndarray:
    """Read ``path`` (any rate, any channel count) as mono float32 in [-1, 1] at ``sample_rate``.

    Returns an array of shape ``[samples]``. Raises :class:`AudioError` for missing or unreadable files, and
    for one recorded below ``min_rate`` Hz (resampling it up would hide that it lacks the voice's upper band).
    """
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: {'a folder, not an audio file' if path.is_dir() else 'audio file not found'}")
    if min_rate and (declared := recorded_rate(path)) is not None and declared < min_rate:  # before decoding it
        raise AudioError(f"{path}: recorded at {declared} Hz (minimum {min_rate} Hz)")
    try:
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as error:  # OSError: e.g. no read permission
        # libsndfile reads WAV, FLAC, Ogg and MP3; AAC/M4A/WebM go through FFmpeg's decoders (PyAV).
        decoded = decode_with_av(path)
        if decoded is None:
            raise AudioError(f"{path}: unreadable audio ({error})") from error
        audio, rate = decoded
    # Float WAVs can hold NaN/inf, which would turn every loss downstream into NaN.
    if not np.isfinite(audio).all():
        raise AudioError(f"{path}: audio contains NaN or infinite samples")
    if rate < min_rate:
        raise AudioError(f"{path}: recorded at {rate} Hz (minimum {min_rate} Hz)")
    mono = downmix(audio)
    if rate != sample_rate and mono.size:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def downmix(audio: np.ndarray) -> np.ndarray:
    """``audio`` ``[samples, channels]`` as mono ``[samples]``: the mean of the channels that carry the sound,
    leaving out any :data:`SILENT_CHANNEL_DB` or more under the loudest (a stereo file with one live channel
    is that channel, not half of it)."""
    if audio.shape[1] == 1 or not len(audio):
        return audio[:, 0]
    power = np.einsum("ij,ij->j", audio, audio, dtype=np.float64) / len(audio)  # no float64 copy of the audio
    live = power >= power.max() * 10 ** (-SILENT_CHANNEL_DB / 10)
    return audio[:, live].mean(axis=1, dtype=np.float64).astype(audio.dtype)


def recorded_rate(path: str | os.PathLike) -> int | None:
    """The rate ``path`` was recorded at, from its header (libsndfile's reading, else FFmpeg's container: AAC,
    WebM), without decoding it; None where neither reads it."""
    try:
        return sf.info(str(path)).samplerate
    except Exception:  # noqa: BLE001 - libsndfile, OS and header errors alike: FFmpeg's turn
        pass
    try:
        import av

        with av.open(str(path)) as container:
            return int(container.streams.audio[0].rate)
    except Exception:  # noqa: BLE001 - any failure means: no rate to be read
        return None


class AudioTooLong(AudioError):
    """Audio found longer than a caller's bound, before or while it was decoded."""

    def __init__(self, seconds: float, bound: float):
        super().__init__(f"{seconds:.1f} s or more; at most {bound:g} s")
        self.seconds, self.bound = seconds, bound


class AudioTooDense(AudioError):
    """Audio holding more samples (frames x channels) than a caller's bound, found while it was decoded."""

    def __init__(self, channels: int, rate: int, bound: int):
        super().__init__(f"{channels} channel(s) at {rate} Hz: over {bound:,} samples")
        self.channels, self.rate, self.bound = channels, rate, bound


def decode_with_av(
    source: str | os.PathLike | BinaryIO, max_seconds: float | None = None, max_samples: int | None = None
) -> tuple[np.ndarray, int] | None:
    """``([samples, channels] float32, rate)`` of any audio FFmpeg decodes (AAC/M4A, WebM, ...: what libsndfile
    does not read), from a path or a binary file, its channels 2 for stereo and 1 for anything else; None if it
    is not such audio.

    ``max_seconds`` bounds the work, whatever the container says or hides: a duration in its metadata over
    the bound is refused before any decoding, and decoding stops as soon as it passes the bound (raises
    :class:`AudioTooLong`). A few compressed megabytes can hold hours of silence; decoded whole, they
    would cost gigabytes. ``max_samples`` bounds the decoded samples (frames x channels) as well, whatever the
    rate (raises :class:`AudioTooDense`)."""
    try:
        import av

        with av.open(source if hasattr(source, "read") else str(source)) as container:
            stream = container.streams.audio[0]
            rate = stream.rate
            declared = _declared_seconds(container, stream)
            if max_seconds is not None and declared is not None and declared > max_seconds:
                raise AudioTooLong(declared, max_seconds)
            limit = None if max_seconds is None else int(max_seconds * rate)
            # Stereo keeps both channels for downmix (a silent one left out); more are mixed to mono by FFmpeg,
            # so that a surround file costs no more memory than a mono one; so is a layout FFmpeg leaves unnamed.
            stereo = stream.layout is not None and stream.layout.name == "stereo"
            channels, layout = (2, "stereo") if stereo else (1, "mono")
            resampler = av.AudioResampler(format="flt", layout=layout, rate=rate)  # packed: samples interleaved
            densest = None if max_samples is None else max_samples // channels
            chunks, samples = [], 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1, channels))
                    samples += len(chunks[-1])
                if limit is not None and samples > limit:
                    raise AudioTooLong(samples / rate, max_seconds)
                if densest is not None and samples > densest:
                    raise AudioTooDense(channels, rate, max_samples)
    except (AudioTooLong, AudioTooDense):
        raise
    except Exception:  # noqa: BLE001 - any decoder failure means: not audio we can read
        return None
    if not chunks:
        return None
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


def _declared_seconds(container, stream) -> float | None:
    """The duration the container's metadata declares (stream's, else the container's), if any."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE: microseconds
    return None


def save_audio(path: str | os.PathLike, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write mono float audio as 16-bit PCM (WAV or FLAC by suffix), atomically (temp + rename).

    Raises :class:`AudioError` for NaN or infinite samples, which 16-bit PCM cannot represent.
    """
    path = Path(path)
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.isfinite(audio).all():
        raise AudioError(f"{path}: refusing to save audio with NaN or infinite samples")
    audio = np.clip(audio, -1.0, 1.0)
    fmt = "FLAC" if path.suffix.lower() == ".flac" else "WAV"
    atomic_write(path, lambda temp: sf.write(str(temp), audio, sample_rate, subtype="PCM_16", format=fmt))
