"""The channel a recording went through, estimated from the recording: its band and its SNR."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from chorus.audio import augment
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.speaker_recognition.channel import estimate_channel, limit_band, shared_band
from chorus.speaker_recognition.voice_match import band_class


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """Six seconds of espeak-ng at 22,050 Hz: a voice with energy up to ~8 kHz."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    path = tmp_path_factory.mktemp("channel") / "speech.wav"
    text = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
    subprocess.run(["espeak-ng", "-v", "en-us+m3", "-w", str(path), text], check=True, timeout=60)
    return load_audio(path)


def test_a_whole_band_recording_keeps_its_high_band(speech):
    channel = estimate_channel(speech, SAMPLE_RATE)
    assert channel.high_hz > 5000 and channel.low_hz < 250
    assert channel.snr_db > 30  # digital silence between words


@pytest.mark.parametrize(
    ("through", "expected"),
    [
        (lambda a: a, (0.0, 0.0)),
        (lambda a: augment.codec_round_trip(a, SAMPLE_RATE, "mp3"), (0.0, 5500.0)),
        (lambda a: augment.narrowband(a, SAMPLE_RATE), (0.0, 3900.0)),
        (lambda a: augment.phone_line(a, SAMPLE_RATE), (300.0, 3400.0)),
        (lambda a: augment.codec_round_trip(a, SAMPLE_RATE, "amr"), (0.0, 3900.0)),
    ],
    ids=["clean", "mp3", "8 kHz", "phone line", "amr"],
)
def test_a_channel_falls_in_the_class_of_its_band(speech, through, expected):
    """The class a trial is cut to and its cohort heard in: never wider than the recording's band."""
    channel = estimate_channel(through(speech), SAMPLE_RATE)
    found = band_class(channel.low_hz, channel.high_hz, SAMPLE_RATE / 2)
    assert found[1] <= expected[1] if expected[1] else found == expected, channel


@pytest.mark.parametrize("snr", [20.0, 10.0])
def test_noise_lowers_the_estimated_snr(speech, snr):
    """The estimate compares loud frames with the quietest ones, so it reads above the mean-power SNR
    the noise was added at, but orders recordings by it."""
    noisy = augment.add_noise(speech, snr, np.random.default_rng(0))
    estimated = estimate_channel(noisy, SAMPLE_RATE).snr_db
    assert snr - 3 <= estimated <= snr + 15
    cleaner = estimate_channel(augment.add_noise(speech, snr + 10, np.random.default_rng(0)), SAMPLE_RATE).snr_db
    assert cleaner > estimated


def test_the_shared_band_is_the_narrower_of_the_two(speech):
    clean = estimate_channel(speech, SAMPLE_RATE)
    phone = estimate_channel(augment.phone_line(speech, SAMPLE_RATE), SAMPLE_RATE)
    assert shared_band(clean, phone) == (phone.low_hz, phone.high_hz)


def test_limit_band_removes_what_is_outside_it(speech):
    cut = limit_band(speech, SAMPLE_RATE, 300.0, 3400.0)
    spectrum = np.abs(np.fft.rfft(cut)) ** 2
    freqs = np.fft.rfftfreq(cut.size, 1 / SAMPLE_RATE)
    inside = spectrum[(freqs > 500) & (freqs < 3000)].mean()
    assert spectrum[freqs > 5000].mean() < inside * 1e-4
    assert cut.dtype == np.float32 and cut.shape == speech.shape
