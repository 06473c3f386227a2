"""What a recording's channel left of a voice: its frequency band and its signal-to-noise ratio, estimated
from the recording itself, and the band two recordings share.

Why a speaker check needs it: a speaker encoder hears the channel as well as the voice. Two strangers
through one phone line (300-3,400 Hz at 8 kHz) score as one speaker (bench/consent.py, issue 37), and
one owner through two channels (a clean consent, a phone-line sample) scores as two. Comparing both
recordings inside the band they share, and normalizing the score against a cohort heard through that
same band and noise (:mod:`chorus.speaker_recognition.consent_check`), takes the channel out of the comparison.

The estimate:

* frames of 32 ms every 16 ms; the loudest 40 % are speech, the quietest 10 % the noise floor;
* SNR: speech-frame power over noise-frame power (digital silence: capped at ``MAX_SNR_DB``);
* the voice's spectrum: the speech frames' mean power spectrum less the noise frames', smoothed over
  ~100 Hz, in dB below its level in 500-2,500 Hz (the part of a voice every channel keeps); the band
  runs from 1 kHz down to where it falls ``LOW_EDGE_DB`` and up to where it falls ``HIGH_EDGE_DB``.
  A voice's own spectrum falls 30-40 dB by 5-7 kHz (espeak-ng's anika: below -30 dB from 2.75 kHz), so
  the high edge must be lenient to keep a clean recording's band; nothing is left above 4 kHz at 8 kHz.
  Below its F0 a voice falls fast, so the low edge is strict: a 300 Hz high-pass (a phone line, 24 dB an
  octave) reads ~170-200 Hz, a whole-band male voice ~60-100 Hz.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.signal import butter, sosfiltfilt

MAX_SNR_DB = 60.0  # digital silence between words: the floor is below anything measurable
HIGH_EDGE_DB = 45.0  # how far below its mid-band level the voice's spectrum may fall inside the band, above it
LOW_EDGE_DB = 20.0  # ... and below it
_FRAME_S, _HOP_S = 0.032, 0.016
_MID_BAND = (500.0, 2500.0)


@dataclass(frozen=True)
class Channel:
    """A recording's band ``[low_hz, high_hz]`` (where its voice is) and its speech-to-noise ratio."""

    low_hz: float
    high_hz: float
    snr_db: float

    def describe(self) -> str:
        return f"{self.low_hz:.0f}-{self.high_hz:.0f} Hz at {self.snr_db:.0f} dB SNR"


def _frames(audio: np.ndarray, rate: int) -> np.ndarray:
    """``[frames, frame_length]`` Hann-windowed frames of ``audio``."""
    length, hop = int(_FRAME_S * rate), int(_HOP_S * rate)
    if audio.size < length:
        audio = np.pad(audio, (0, length - audio.size))
    count = 1 + (audio.size - length) // hop
    index = np.arange(length)[None, :] + hop * np.arange(count)[:, None]
    return audio[index] * np.hanning(length)[None, :]


def _loudest_and_quietest(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the speech frames (loudest 40 %) and the noise frames (quietest 10 %) of ``frames``."""
    power = np.mean(frames**2, axis=1)
    order = np.argsort(power)
    noise = order[: max(1, len(order) // 10)]
    speech = order[len(order) - max(1, (4 * len(order)) // 10) :]
    return speech, noise


def estimate_channel(audio: np.ndarray, rate: int) -> Channel:
    """The channel of mono ``audio`` ``[samples]`` at ``rate``: its voice's band and its SNR."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    frames = _frames(audio, rate)
    speech, noise = _loudest_and_quietest(frames)
    spectra = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    speech_power, noise_power = spectra[speech].mean(axis=0), spectra[noise].mean(axis=0)
    frame_speech, frame_noise = float(np.mean(frames[speech] ** 2)), float(np.mean(frames[noise] ** 2))
    snr = (
        MAX_SNR_DB
        if frame_noise <= frame_speech * 10 ** (-MAX_SNR_DB / 10)
        else 10 * np.log10(frame_speech / frame_noise)
    )
    voice = np.maximum(speech_power - noise_power, 1e-20)
    freqs = np.fft.rfftfreq(frames.shape[1], 1 / rate)
    width = max(1, int(round(100 / (freqs[1] - freqs[0]))))
    smooth = np.convolve(voice, np.ones(width) / width, mode="same")
    mid = (freqs >= _MID_BAND[0]) & (freqs <= _MID_BAND[1])
    level = 10 * np.log10(smooth + 1e-20)
    reference = 10 * np.log10(float(np.mean(smooth[mid])) + 1e-20)
    # The band is the run of frequencies within the limits around 1 kHz: a peak of noise far above the
    # voice's band is not part of it, and a muffled recording can read narrower than the reference band.
    start = int(np.argmin(np.abs(freqs - 1000.0)))
    low = start
    while low > 0 and level[low - 1] >= reference - LOW_EDGE_DB:
        low -= 1
    high = start
    while high < len(level) - 1 and level[high + 1] >= reference - HIGH_EDGE_DB:
        high += 1
    return Channel(float(freqs[low]), float(freqs[high]), float(min(snr, MAX_SNR_DB)))


def shared_band(a: Channel, b: Channel) -> tuple[float, float]:
    """The band both channels pass: the higher low edge and the lower high edge."""
    return max(a.low_hz, b.low_hz), min(a.high_hz, b.high_hz)


def limit_band(audio: np.ndarray, rate: int, low_hz: float, high_hz: float) -> np.ndarray:
    """``audio`` with nothing left outside ``[low_hz, high_hz]``: an 8th-order Butterworth run forwards
    and backwards (no phase shift: the voice's timing is untouched). An edge at 0 Hz or the Nyquist
    frequency is no edge."""
    audio = np.asarray(audio, dtype=np.float64)
    nyquist = rate / 2
    if high_hz < 0.97 * nyquist:
        audio = sosfiltfilt(butter(8, high_hz, btype="lowpass", fs=rate, output="sos"), audio)
    if low_hz > 60.0:
        audio = sosfiltfilt(butter(4, low_hz, btype="highpass", fs=rate, output="sos"), audio)
    return audio.astype(np.float32)
