"""Where in a consent recording the phrase was said, and how much other speech it holds.

One recording, one claim: a consent's speaker is taken only from the stretches the recognizer aligned to the
phrase's words (:func:`phrase_spans`, :func:`cut`), and a recording with other voiced audio beside them
(:func:`speech_outside`) is refused. Otherwise the phrase read by one person, followed by another person's
speech played backwards (which Whisper may not transcribe at all), gives a consent whose words are right and
whose voice is the other person's.

Voiced audio is found by :func:`voiced_frames`: a frame is voiced when it is periodic at a voice's pitch
(normalized autocorrelation) and louder than the recording's own noise floor. Periodicity is what speech in
any language, speech reversed, humming and singing share, and what white or broadband noise lacks: at 15-20 dB
SNR, noise frames are as loud as quiet speech but their autocorrelation stays near zero. An energy detector
alone would count such noise (or need a threshold that misses quiet speech), and webrtcvad's model is a
speech/non-speech classifier tuned on forward speech, with its own view of noise; this one is a few lines of
numpy whose every threshold is written here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import soxr

from chorus.evaluation.asr import Word

RATE = 16_000  # the detector's analysis rate: a voice's pitch and the formants below 8 kHz
FRAME = 0.04  # seconds: two periods of a 50 Hz voice
HOP = 0.01
MIN_PITCH, MAX_PITCH = 60.0, 400.0  # Hz: low men's voices to high children's
# A frame is voiced when its autocorrelation at some pitch period reaches this (white noise over that lag
# range peaks near 0.2 on a 40 ms frame; voiced speech, even at 15 dB SNR, is above 0.6) ...
PERIODICITY = 0.5
# ... and it is this much louder than the recording's noise floor (its 10th-percentile frame) and than
# digital near-silence: a faint echo of periodic hum is not speech.
ABOVE_FLOOR_DB = 6.0
ABSOLUTE_FLOOR_DB = -60.0
MIN_RUN = 3  # frames: a voiced stretch shorter than 30 ms is a click, not a syllable


def voiced_frames(audio: np.ndarray, rate: int) -> np.ndarray:
    """Which ``HOP``-spaced frames of mono ``audio`` ``[samples]`` at ``rate`` are voiced: bool ``[frames]``,
    frame ``k`` centred at ``k * HOP + FRAME / 2`` seconds."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if rate != RATE and audio.size:
        audio = soxr.resample(audio, rate, RATE, quality="HQ")
    size, hop = int(FRAME * RATE), int(HOP * RATE)
    if audio.size < size:
        return np.zeros(0, dtype=bool)
    frames = np.lib.stride_tricks.sliding_window_view(audio, size)[::hop].astype(np.float64)
    frames = frames - frames.mean(axis=1, keepdims=True)
    power = np.mean(frames**2, axis=1)
    loudness = 10 * np.log10(power + 1e-12)
    floor = max(float(np.percentile(loudness, 10)) + ABOVE_FLOOR_DB, ABSOLUTE_FLOOR_DB)

    # Normalized autocorrelation at each lag: the product of a frame with itself shifted, over the energy of
    # the two overlapping parts (so that long lags are not penalized for their shorter overlap).
    spectrum = np.fft.rfft(frames, n=2 * size, axis=1)
    product = np.fft.irfft(np.abs(spectrum) ** 2, axis=1)[:, :size]
    energy = np.cumsum(frames**2, axis=1)
    lags = np.arange(int(RATE / MAX_PITCH), int(RATE / MIN_PITCH) + 1)
    head = energy[:, size - 1 - lags]  # energy of samples [0, size - lag)
    tail = energy[:, -1:] - energy[:, lags - 1]  # energy of samples [lag, size)
    periodicity = (product[:, lags] / np.sqrt(head * tail + 1e-20)).max(axis=1)

    voiced = (periodicity >= PERIODICITY) & (loudness >= floor)
    return _without_short_runs(voiced, MIN_RUN)


def phrase_spans(
    words: Sequence[Word], pad: float, max_word: float, duration: float
) -> tuple[tuple[float, float], ...]:
    """The stretches of a recording ``duration`` seconds long where ``words`` were said, in seconds: each word
    cut to ``max_word`` from its start, widened by ``pad`` each side (word timestamps are about a tenth of a
    second off), overlapping ones merged.

    The cut: the recognizer's alignment can stretch a word over what follows it (a pause, or audio it did
    not transcribe); a word is said from where it starts, and no word of a phrase lasts a second.
    """
    spans: list[list[float]] = []
    for word in sorted(words, key=lambda w: w.start):
        start = max(0.0, word.start - pad)
        end = min(duration, min(word.end, word.start + max_word) + pad)
        if end <= start:
            continue
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return tuple((start, end) for start, end in spans)


def speech_outside(audio: np.ndarray, rate: int, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of voiced audio (:func:`voiced_frames`) in mono ``audio`` ``[samples]`` outside ``spans``."""
    voiced = voiced_frames(audio, rate)
    centres = np.arange(voiced.size) * HOP + FRAME / 2
    inside = np.zeros(voiced.size, dtype=bool)
    for start, end in spans:
        inside |= (centres >= start) & (centres < end)
    return float(np.count_nonzero(voiced & ~inside) * HOP)


def cut(audio: np.ndarray, rate: int, spans: Sequence[tuple[float, float]]) -> np.ndarray:
    """The parts of mono ``audio`` ``[samples]`` within ``spans`` (seconds), one after another: float32
    ``[samples]`` at ``rate``."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    parts = [audio[int(start * rate) : int(end * rate)] for start, end in spans]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def _without_short_runs(flags: np.ndarray, shortest: int) -> np.ndarray:
    """``flags`` with every run of True shorter than ``shortest`` set False."""
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    kept = np.zeros_like(flags)
    for start, end in zip(starts, ends, strict=True):
        if end - start >= shortest:
            kept[start:end] = True
    return kept
