"""Where a recording holds speech, as a voice-activity detector hears it, and how far its speech stands above
the noise between words.

Energy alone counts a tone, a hum, music or steady noise as speech as readily as a voice; a detector trained
on speech tells them apart, and the data check (:mod:`chorus.data.check`) counts speech by it: Silero VAD,
the model faster-whisper ships in its wheel (``faster_whisper/assets/silero_vad_v6.onnx``, run by its
:func:`faster_whisper.vad.get_vad_model`; nothing is downloaded). It reads 16 kHz audio in windows of 512
samples (32 ms) and gives each a probability of speech. Of the corpus's speech clips, clean or in noise down
to 10 dB SNR, it hears four fifths or more of their sound as speech; of tones, chords, hum and noise, 2 % or
less (bench/speech_activity.py).

The same windows give a recording's signal-to-noise ratio without a clean reference: the level of its
speech windows over the level inside its pauses. A level rule alone cannot tell them (the quietest frames of
a clip with few pauses are quiet speech, not noise); the detector says which windows are words. A crowd's
babble is speech to it, so a recording in a crowd shows few pauses to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chorus.audio.encode import resample

VAD_RATE = 16_000  # the detector's sample rate
WINDOW = 512  # samples per detector window at VAD_RATE (32 ms)
WINDOW_SECONDS = WINDOW / VAD_RATE
SPEECH_PROBABILITY = 0.5  # a window at or above this is speech (faster-whisper's and Silero's default)
# A pause: a run of at least PAUSE_WINDOWS windows at or under PAUSE_PROBABILITY (noise lifts a pause's
# windows to 0.15-0.3; a word's quiet middle is shorter). Its first and last windows hold the tails of the
# words beside it: only the windows inside it are the recording's noise.
PAUSE_PROBABILITY = 0.3
PAUSE_WINDOWS = 5  # 160 ms
DIGITAL_ZERO_DB = -100.0  # this quiet (dBFS) is digital zeros, not a room: counted as silence at this level
# A recording's sound: its windows within SOUND_RANGE_DB of the loudest and, where its pauses stand at least
# PAUSES_UNDER_DB under the loudest (a room's noise, not a tone or a hiss throughout), ABOVE_PAUSES_DB above
# their level: a pause's silence or room noise is no sound, however long.
SOUND_RANGE_DB = 30.0
PAUSES_UNDER_DB = 10.0
ABOVE_PAUSES_DB = 6.0


@dataclass(frozen=True)
class SpeechActivity:
    """What the detector heard in one recording.

    ``speech_seconds``: windows heard as speech, times their length; ``sound_seconds``: the windows that hold
    sound (:data:`SOUND_RANGE_DB`), which a voice's speech mostly is and a tone's or a hiss's is not.
    ``speech_db`` / ``noise_db``: the median
    level (dBFS) of the speech windows and of the windows inside pauses (:data:`PAUSE_WINDOWS`), where
    digital zeros count as silence at -100 dB but for an editor's padding before the first sound and after the
    last (it tells nothing of the room); None where the recording has no such window.
    """

    speech_seconds: float
    sound_seconds: float
    speech_db: float | None
    noise_db: float | None
    noise_windows: int = 0  # windows the noise level was measured on

    @property
    def snr_db(self) -> float | None:
        """The speech's level over the noise between words, in dB; None where either is unknown."""
        if self.speech_db is None or self.noise_db is None:
            return None
        return self.speech_db - self.noise_db


def speech_probabilities(mono: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(the detector's probability of speech for each 32 ms window of ``mono`` ``[samples]`` at ``rate``
    ``[windows]``, each window's level in dBFS ``[windows]``), the audio resampled to 16 kHz."""
    from faster_whisper.vad import get_vad_model  # imported here: faster-whisper loads CTranslate2

    audio = resample(np.asarray(mono, dtype=np.float32), rate, VAD_RATE)
    audio = np.pad(audio, (0, -len(audio) % WINDOW))
    if not len(audio):
        return np.zeros(0, np.float32), np.zeros(0)
    # Levels first: faster-whisper's model zeroes the last 64 samples of the array it is given.
    energy = np.mean(np.square(audio.reshape(-1, WINDOW), dtype=np.float64), axis=1)
    probabilities = np.asarray(get_vad_model()(audio), dtype=np.float32).reshape(-1)
    return probabilities, 10 * np.log10(energy + 1e-20)


def speech_activity(mono: np.ndarray, rate: int) -> SpeechActivity:
    """What the detector hears in ``mono`` ``[samples]`` at ``rate``: see :class:`SpeechActivity`."""
    probabilities, levels = speech_probabilities(mono, rate)
    speech = probabilities >= SPEECH_PROBABILITY
    between = _inside_pauses(probabilities <= PAUSE_PROBABILITY)
    sounding = np.flatnonzero(levels > DIGITAL_ZERO_DB)
    if len(sounding):  # padding of zeros before the first sound and after the last is no pause
        between[: sounding[0]] = between[sounding[-1] + 1 :] = False
    floored = np.maximum(levels, DIGITAL_ZERO_DB)
    noise_db = float(np.median(floored[between])) if between.any() else None
    loudest = float(levels.max()) if len(levels) else DIGITAL_ZERO_DB
    least = loudest - SOUND_RANGE_DB
    if noise_db is not None and noise_db <= loudest - PAUSES_UNDER_DB:
        least = max(least, noise_db + ABOVE_PAUSES_DB)
    return SpeechActivity(
        speech_seconds=float(speech.sum()) * WINDOW_SECONDS,
        sound_seconds=float(np.sum(levels >= least)) * WINDOW_SECONDS,
        speech_db=float(np.median(levels[speech])) if speech.any() else None,
        noise_db=noise_db,
        noise_windows=int(between.sum()),
    )


def _inside_pauses(quiet: np.ndarray) -> np.ndarray:
    """The windows inside the runs of at least :data:`PAUSE_WINDOWS` True in ``quiet`` ``[windows]``: each run
    without its first and last window."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    inside = np.zeros(len(quiet), dtype=bool)
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        if end - start >= PAUSE_WINDOWS:
            inside[start + 1 : end - 1] = True
    return inside
