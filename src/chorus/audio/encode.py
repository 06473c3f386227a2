"""Audio to bytes for a client: 16-bit PCM, WAV (whole, or streamed with an "unknown length" header) and FLAC."""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf


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


def encode_whole(audio: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """``audio`` ``[samples]`` as one ``pcm``, ``wav`` or ``flac`` file."""
    if response_format == "pcm":
        return pcm16(audio)
    if response_format == "wav":
        data = pcm16(audio)
        return wav_header(sample_rate, len(data)) + data
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(audio, -1.0, 1.0), sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()
