"""Augmentation of speech for training the speaker encoder: rooms, noises, microphones, lines, codecs
and speaking rates, so that an embedding learns the voice and not the room, the line or the rate.

Every function takes mono float audio ``[samples]`` at ``rate`` Hz and a ``numpy.random.Generator``
where it draws anything, and returns new audio of the same dtype, rate and length (except the speed
and rate changes, which change the length on purpose).

- Rooms: :func:`reverberate` convolves with a simulated impulse response (a direct path, then
  Gaussian noise whose energy decays by 60 dB over ``rt60`` seconds: the statistical model of late
  reverberation).
- Noise at a given SNR: white, pink (1/f), brown (1/f^2), "room" (brown rumble through a room) and
  babble (other talkers' speech).
- Microphones: :func:`gain`, and :func:`quiet_mic` (a speaker far from a cheap microphone whose
  automatic gain control lifts the noise floor with the voice).
- Channels: :func:`band_limit` (Butterworth band-pass), :func:`narrowband` (saved at 8 kHz),
  :func:`phone_line` (a landline: 300-3,400 Hz, 8 kHz, G.711 mu-law), :func:`codec_round_trip` (MP3
  and Opus through libsndfile, and an AMR-like stand-in).
- Rates: :func:`change_speed` resamples (pitch and rate move together, as sox's ``speed`` does);
  :func:`change_rate` changes the speaking rate and keeps the pitch (a phase vocoder).

Two different people put through the same line or codec must stay two people: that is what the
speaker encoder learns from these, and what the custom-voice check depends on.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import librosa
import numpy as np
import soundfile as sf
import soxr
from scipy.signal import butter, fftconvolve, sosfilt

NOISE_KINDS = ("white", "pink", "brown", "room")
CODECS = ("mp3", "opus", "amr")
# What Augmentation's channel effect draws from ("band": the 300-3,400 Hz band-pass alone).
CHANNELS = ("band", "narrowband", "phone", "mp3", "opus", "amr")
PHONE_BAND = (300.0, 3400.0)
PHONE_RATE = 8000
# libsndfile's codecs, as (format, subtype, the rates the codec takes).
_SNDFILE_CODECS = {
    "mp3": ("MP3", "MPEG_LAYER_III", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("OGG", "OPUS", (8000, 12000, 16000, 24000, 48000)),
}


def _power(audio: np.ndarray) -> float:
    return float(np.mean(audio.astype(np.float64) ** 2)) or 1e-12


def _fit(audio: np.ndarray, length: int) -> np.ndarray:
    """``audio`` cut or zero-padded to ``length`` samples (a codec's or resampler's last frame)."""
    return audio[:length] if len(audio) >= length else np.pad(audio, (0, length - len(audio)))


def _resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    return audio if from_rate == to_rate else soxr.resample(audio, from_rate, to_rate)


def colored_noise(kind: str, length: int, rng: np.random.Generator, rate: int | None = None) -> np.ndarray:
    """``[length]`` float64 noise of ``kind`` (see :data:`NOISE_KINDS`), of any scale.

    "pink" has 1/f power, "brown" 1/f^2 (a low rumble: traffic, ventilation), "room" is brown noise
    heard in a room (reverberated; needs ``rate``)."""
    if kind not in NOISE_KINDS:
        raise ValueError(f"noise kind must be one of {', '.join(NOISE_KINDS)}, got {kind!r}")
    noise = rng.standard_normal(length)
    if kind in ("pink", "brown", "room"):
        spectrum = np.fft.rfft(noise)
        frequency = np.arange(1, len(spectrum))
        # Amplitude 1/sqrt(f) gives 1/f power; 1/f gives 1/f^2. Brown noise's DC would be a huge
        # offset, so it is removed.
        spectrum[1:] /= np.sqrt(frequency) if kind == "pink" else frequency
        if kind != "pink":
            spectrum[0] = 0.0
        noise = np.fft.irfft(spectrum, n=length)
    if kind == "room":
        if rate is None:
            raise ValueError("room noise needs the audio's rate")
        noise = fftconvolve(noise, room_impulse_response(float(rng.uniform(0.3, 0.8)), rate, rng))[:length]
    return noise


def _mix(audio: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """``audio`` plus ``noise`` scaled to ``snr_db`` dB below the audio's power."""
    noise = noise * np.sqrt(_power(audio) / 10 ** (snr_db / 10) / _power(noise))
    return (audio + noise).astype(audio.dtype)


def add_noise(
    audio: np.ndarray, snr_db: float, rng: np.random.Generator, color: str = "white", rate: int | None = None
) -> np.ndarray:
    """``audio`` plus noise of kind ``color`` (:data:`NOISE_KINDS`; "room" needs ``rate``) at ``snr_db``
    dB below the audio's power."""
    return _mix(audio, colored_noise(color, len(audio), rng, rate), snr_db)


def add_babble(audio: np.ndarray, talkers: Sequence[np.ndarray], snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``audio`` plus the sum of ``talkers`` (other people's speech ``[samples]`` at the same rate; each
    looped and cropped from a random start to the audio's length, all at one level) at ``snr_db`` dB
    below the audio's power."""
    if not talkers:
        raise ValueError("babble needs at least one other talker")
    babble = np.zeros(len(audio))
    for talker in talkers:
        if not len(talker):
            raise ValueError("a babble talker has no samples")
        looped = np.tile(talker.astype(np.float64), int(np.ceil((len(audio) + len(talker)) / len(talker))))
        start = int(rng.integers(0, len(talker)))
        piece = looped[start : start + len(audio)]
        babble += piece / np.sqrt(_power(piece))
    return _mix(audio, babble, snr_db)


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


def gain(audio: np.ndarray, db: float) -> np.ndarray:
    """``audio`` ``db`` dB louder (quieter below 0); nothing is clipped."""
    return (audio * 10 ** (db / 20)).astype(audio.dtype)


def quiet_mic(audio: np.ndarray, rate: int, rng: np.random.Generator, noise_dbfs: float | None = None) -> np.ndarray:
    """A speaker far from a cheap microphone: the voice 30 dB down, the microphone's own noise floor
    (white hiss, ``noise_dbfs`` RMS, drawn from -75..-65 dBFS when None, plus mains hum at 50 or 60 Hz
    10 dB under it), then the automatic gain control restoring the original peak, which lifts the
    noise floor by as much as the voice."""
    if noise_dbfs is None:
        noise_dbfs = float(rng.uniform(-75.0, -65.0))
    quiet = gain(audio, -30.0).astype(np.float64)
    hum_hz = float(rng.choice([50.0, 60.0]))
    hum = np.sqrt(2) * 10 ** ((noise_dbfs - 10) / 20) * np.sin(2 * np.pi * hum_hz * np.arange(len(audio)) / rate)
    floor = rng.standard_normal(len(audio)) * 10 ** (noise_dbfs / 20) + hum
    noisy = quiet + floor
    peak, noisy_peak = float(np.abs(audio).max()) or 1.0, float(np.abs(noisy).max()) or 1.0
    return (noisy * peak / noisy_peak).astype(audio.dtype)


def mu_law(audio: np.ndarray, bits: int = 8) -> np.ndarray:
    """``audio`` (in [-1, 1]) through a ``bits``-bit mu-law quantizer and back (8 bits: G.711's
    telephone coding, mu = 255; the error grows with the signal, ~38 dB SNR at 8 bits, ~6 dB less per
    bit fewer)."""
    mu = 255.0
    x = np.clip(audio.astype(np.float64), -1.0, 1.0)
    compressed = np.sign(x) * np.log1p(mu * np.abs(x)) / np.log1p(mu)
    levels = 2 ** (bits - 1)  # per sign
    quantized = np.clip(np.round(compressed * levels), -levels, levels - 1) / levels
    return (np.sign(quantized) * np.expm1(np.abs(quantized) * np.log1p(mu)) / mu).astype(audio.dtype)


def narrowband(audio: np.ndarray, rate: int, target_rate: int = PHONE_RATE) -> np.ndarray:
    """``audio`` saved at ``target_rate`` and read back at ``rate`` (nothing above ``target_rate``/2)."""
    down = _resample(audio, rate, target_rate)
    return _fit(_resample(down, target_rate, rate), len(audio)).astype(audio.dtype)


def phone_line(audio: np.ndarray, rate: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``audio`` over a landline: the 300-3,400 Hz band-pass, 8 kHz, 8-bit mu-law (G.711), back to ``rate``.

    With ``rng``, the band's edges vary as lines do (low 250-350 Hz, high 3,200-3,500 Hz)."""
    low, high = PHONE_BAND if rng is None else (float(rng.uniform(250, 350)), float(rng.uniform(3200, 3500)))
    line = mu_law(band_limit(_resample(audio, rate, PHONE_RATE), low, high, PHONE_RATE), bits=8)
    return _fit(_resample(line, PHONE_RATE, rate), len(audio)).astype(audio.dtype)


def codec_available(codec: str) -> bool:
    """Whether :func:`codec_round_trip` can run ``codec`` here ("amr" is simulated, so always)."""
    if codec == "amr":
        return True
    container, subtype, _ = _SNDFILE_CODECS[codec]
    return container in sf.available_formats() and subtype in sf.available_subtypes(container)


def codec_round_trip(audio: np.ndarray, rate: int, codec: str) -> np.ndarray:
    """``audio`` encoded with ``codec`` at a low bitrate, decoded, and back at ``rate`` and its length.

    "mp3" (LAME) and "opus" (in Ogg, at 16 kHz: Opus takes 8, 12, 16, 24 or 48 kHz) go through
    libsndfile (1.1 or newer) at its lowest-bitrate setting (``compression_level`` 0.9 of 1). "amr" is
    a stand-in, since no AMR encoder is available here: 8 kHz, 300-3,400 Hz, and 5-bit mu-law noise.
    Raises ``RuntimeError`` naming what is missing when libsndfile lacks the codec."""
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    if codec == "amr":
        # AMR-NB is a CELP coder whose error, like a log quantizer's, follows the signal's level,
        # at a segmental SNR of roughly 10-20 dB (4.75-12.2 kbit/s); 5-bit mu-law is ~20 dB of such noise.
        line = band_limit(_resample(audio, rate, PHONE_RATE), *PHONE_BAND, PHONE_RATE)
        peak = float(np.abs(line).max()) or 1.0  # quantize at full scale, as a codec's gain would
        coded = mu_law(line / peak, bits=5) * peak
        return _fit(_resample(coded, PHONE_RATE, rate), len(audio)).astype(audio.dtype)
    if not codec_available(codec):
        container, subtype, _ = _SNDFILE_CODECS[codec]
        raise RuntimeError(
            f"{codec} needs libsndfile >= 1.1 with {container}/{subtype}; this one is {sf.__libsndfile_version__}"
        )
    container, subtype, rates = _SNDFILE_CODECS[codec]
    coded_rate = 16000 if codec == "opus" else rate if rate in rates else 22050
    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", coded_rate, 1, subtype, format=container, compression_level=0.9) as file:
        file.write(np.clip(_resample(audio.astype(np.float32), rate, coded_rate), -1.0, 1.0))
    buffer.seek(0)
    decoded, decoded_rate = sf.read(buffer, dtype="float32")
    return _fit(_resample(decoded, decoded_rate, rate), len(audio)).astype(audio.dtype)


def change_speed(audio: np.ndarray, factor: float, rate: int) -> np.ndarray:
    """Played ``factor`` times faster (higher and shorter above 1), by resampling."""
    return soxr.resample(audio, rate, rate / factor).astype(audio.dtype)


def change_rate(audio: np.ndarray, rate: int, factor: float) -> np.ndarray:
    """Spoken ``factor`` times faster (shorter above 1) at the same pitch: a phase vocoder
    (librosa's ``time_stretch``) with ~30 ms windows, the scale of a speech frame (longer ones smear
    the onsets, shorter ones the harmonics)."""
    n_fft = 2 ** int(round(np.log2(0.03 * rate)))
    stretched = librosa.effects.time_stretch(audio.astype(np.float32), rate=factor, n_fft=n_fft, hop_length=n_fft // 4)
    return stretched.astype(audio.dtype)


@dataclass(frozen=True)
class Augmentation:
    """One augmented copy: each effect with its probability, then its parameters drawn from its range.

    In the order a recording happens: the speaker's rate (``speed``: resampled; ``tempo``: pitch
    kept), the room (``reverb``), background noise (``noise``: a kind from ``noise_kinds`` at an SNR
    from ``snr_db``; "babble" only when other talkers are given), the microphone (``mic``: a gain
    from ``gain_db``, or the quiet far microphone with probability ``quiet_mic`` within it), then the
    line or file (``channel``: one of ``channels``, see :data:`CHANNELS`)."""

    speed: float = 0.2
    speeds: tuple[float, float] = (0.9, 1.1)
    tempo: float = 0.2
    tempos: tuple[float, float] = (0.85, 1.2)
    reverb: float = 0.3
    rt60: tuple[float, float] = (0.2, 0.8)
    noise: float = 0.5
    snr_db: tuple[float, float] = (0.0, 30.0)
    noise_kinds: tuple[str, ...] = (*NOISE_KINDS, "babble")
    mic: float = 0.3
    gain_db: tuple[float, float] = (-20.0, 6.0)
    quiet_mic: float = 0.3
    channel: float = 0.5
    channels: tuple[str, ...] = CHANNELS

    def __post_init__(self) -> None:
        for kind in self.noise_kinds:
            if kind not in (*NOISE_KINDS, "babble"):
                raise ValueError(f"unknown noise kind {kind!r}; choose from {', '.join(NOISE_KINDS)}, babble")
        for channel in self.channels:
            if channel not in CHANNELS:
                raise ValueError(f"unknown channel {channel!r}; choose from {', '.join(CHANNELS)}")

    def apply(
        self, audio: np.ndarray, rate: int, rng: np.random.Generator, talkers: Sequence[np.ndarray] = ()
    ) -> tuple[np.ndarray, list[str]]:
        """The augmented audio and what was done to it (for the training log). ``talkers``: other
        speakers' audio at ``rate`` for babble noise."""
        done = []
        if rng.random() < self.speed:
            factor = float(rng.uniform(*self.speeds))
            audio = change_speed(audio, factor, rate)
            done.append(f"speed {factor:.2f}")
        if rng.random() < self.tempo:
            factor = float(rng.uniform(*self.tempos))
            audio = change_rate(audio, rate, factor)
            done.append(f"tempo {factor:.2f}")
        if rng.random() < self.reverb:
            rt60 = float(rng.uniform(*self.rt60))
            audio = reverberate(audio, rt60, rate, rng)
            done.append(f"reverb {rt60:.2f} s")
        kinds = [k for k in self.noise_kinds if k != "babble" or len(talkers)]
        if rng.random() < self.noise and kinds:
            snr = float(rng.uniform(*self.snr_db))
            kind = str(rng.choice(kinds))
            if kind == "babble":
                count = int(rng.integers(1, min(len(talkers), 5) + 1))
                chosen = [talkers[i] for i in rng.choice(len(talkers), size=count, replace=False)]
                audio = add_babble(audio, chosen, snr, rng)
            else:
                audio = add_noise(audio, snr, rng, color=kind, rate=rate)
            done.append(f"noise {kind} {snr:.0f} dB")
        if rng.random() < self.mic:
            if rng.random() < self.quiet_mic:
                audio = quiet_mic(audio, rate, rng)
                done.append("mic quiet")
            else:
                db = float(rng.uniform(*self.gain_db))
                audio = gain(audio, db)
                done.append(f"mic {db:+.0f} dB")
        if rng.random() < self.channel and self.channels:
            channel = str(rng.choice(self.channels))
            if channel == "band":
                audio = band_limit(audio, *PHONE_BAND, rate)
            elif channel == "narrowband":
                audio = narrowband(audio, rate)
            elif channel == "phone":
                audio = phone_line(audio, rate, rng)
            else:
                audio = codec_round_trip(audio, rate, channel)
            done.append(f"channel {channel}")
        return audio, done
