"""Offline augmentation of speech for training the speaker encoder: noise, reverberation, band limits
and speed, so that an embedding learns the voice and not the room, the line or the rate.

Every function takes mono float audio ``[samples]`` and a ``numpy.random.Generator`` where it draws
anything, and returns new audio of the same dtype. Reverberation convolves with a simulated room
impulse response (a direct path, then Gaussian noise whose energy decays by 60 dB over ``rt60``
seconds: the statistical model of late reverberation); band limits are a Butterworth band-pass (a
telephone line is 300-3,400 Hz); speed resamples with soxr (pitch and rate move together, as sox's
``speed`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr
from scipy.signal import butter, fftconvolve, sosfilt


def add_noise(audio: np.ndarray, snr_db: float, rng: np.random.Generator, color: str = "white") -> np.ndarray:
    """``audio`` plus white or pink noise at ``snr_db`` dB below the audio's power."""
    noise = rng.standard_normal(len(audio))
    if color == "pink":  # 1/f power: scale the spectrum by 1/sqrt(f)
        spectrum = np.fft.rfft(noise)
        spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
        noise = np.fft.irfft(spectrum, n=len(audio))
    elif color != "white":
        raise ValueError(f"noise color must be 'white' or 'pink', got {color!r}")
    power = float(np.mean(audio.astype(np.float64) ** 2)) or 1e-12
    noise *= np.sqrt(power / (10 ** (snr_db / 10)) / max(float(np.mean(noise**2)), 1e-12))
    return (audio + noise).astype(audio.dtype)


def room_impulse_response(rt60: float, rate: int, rng: np.random.Generator, direct_ratio_db: float = 0.0) -> np.ndarray:
    """A simulated impulse response: a unit direct path, then decaying noise (60 dB over ``rt60`` s)
    whose energy is ``direct_ratio_db`` dB below the direct path's."""
    length = max(2, int(rt60 * rate))
    t = np.arange(length) / rate
    tail = rng.standard_normal(length) * 10 ** (-3 * t / rt60)  # amplitude: -60 dB at rt60
    tail[0] = 0.0
    tail *= np.sqrt(10 ** (-direct_ratio_db / 10) / max(float(np.sum(tail**2)), 1e-12))
    tail[0] = 1.0
    return tail


def reverberate(audio: np.ndarray, rt60: float, rate: int, rng: np.random.Generator) -> np.ndarray:
    """``audio`` in a simulated room (see :func:`room_impulse_response`), as loud as it was."""
    wet = fftconvolve(audio.astype(np.float64), room_impulse_response(rt60, rate, rng))[: len(audio)]
    peak, wet_peak = float(np.abs(audio).max()) or 1.0, float(np.abs(wet).max()) or 1.0
    return (wet * peak / wet_peak).astype(audio.dtype)


def band_limit(audio: np.ndarray, low_hz: float, high_hz: float, rate: int) -> np.ndarray:
    """A 4th-order Butterworth band-pass from ``low_hz`` to ``high_hz``."""
    sos = butter(4, [low_hz, high_hz], btype="bandpass", fs=rate, output="sos")
    return sosfilt(sos, audio.astype(np.float64)).astype(audio.dtype)


def change_speed(audio: np.ndarray, factor: float, rate: int) -> np.ndarray:
    """Played ``factor`` times faster (higher and shorter above 1), by resampling."""
    return soxr.resample(audio, rate, rate / factor).astype(audio.dtype)


@dataclass(frozen=True)
class Augmentation:
    """One augmented copy: each effect with its probability, then its parameter drawn from its range."""

    noise: float = 0.5
    snr_db: tuple[float, float] = (5.0, 20.0)
    reverb: float = 0.4
    rt60: tuple[float, float] = (0.2, 0.8)
    band: float = 0.2  # a telephone line
    speed: float = 0.3
    speeds: tuple[float, float] = (0.9, 1.1)

    def apply(self, audio: np.ndarray, rate: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        """The augmented audio and what was done to it (for the training log)."""
        done = []
        if rng.random() < self.speed:
            factor = float(rng.uniform(*self.speeds))
            audio = change_speed(audio, factor, rate)
            done.append(f"speed {factor:.2f}")
        if rng.random() < self.reverb:
            rt60 = float(rng.uniform(*self.rt60))
            audio = reverberate(audio, rt60, rate, rng)
            done.append(f"reverb {rt60:.2f} s")
        if rng.random() < self.band:
            audio = band_limit(audio, 300.0, 3400.0, rate)
            done.append("band 300-3400 Hz")
        if rng.random() < self.noise:
            snr = float(rng.uniform(*self.snr_db))
            audio = add_noise(audio, snr, rng, color=str(rng.choice(["white", "pink"])))
            done.append(f"noise {snr:.0f} dB")
        return audio, done
