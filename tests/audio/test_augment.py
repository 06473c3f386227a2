"""Offline augmentation: the noise is at the asked SNR, the room decays by 60 dB over its RT60, the
band-pass removes what lies outside the line, speed changes length (and so pitch)."""

from __future__ import annotations

import numpy as np
import pytest

from chorus.audio.augment import (
    Augmentation,
    add_noise,
    band_limit,
    change_speed,
    reverberate,
    room_impulse_response,
)

RATE = 16000


def tone(hz: float, seconds: float = 1.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


@pytest.mark.parametrize("color", ["white", "pink"])
def test_noise_is_at_the_asked_snr(color):
    clean = tone(220)
    noisy = add_noise(clean, 10.0, np.random.default_rng(0), color)
    snr = 10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean((noisy - clean).astype(np.float64) ** 2))
    assert noisy.dtype == np.float32 and snr == pytest.approx(10.0, abs=0.05)


def test_room_decays_by_60_db_over_its_rt60():
    rir = room_impulse_response(0.5, RATE, np.random.default_rng(0))
    assert rir[0] == 1.0 and len(rir) == RATE // 2
    energy = np.convolve(rir[1:] ** 2, np.ones(400) / 400, mode="valid")  # 25 ms windows of the tail
    decay_db = 10 * np.log10(energy[0] / energy[-1])
    assert decay_db == pytest.approx(60, abs=6)
    wet = reverberate(tone(220), 0.5, RATE, np.random.default_rng(0))
    assert np.abs(wet).max() == pytest.approx(0.5, rel=1e-3) and not np.allclose(wet, tone(220))


def test_band_limit_keeps_the_line_and_removes_the_rest():
    def power(x):
        return float(np.mean(x[RATE // 4 :].astype(np.float64) ** 2))  # after the filter's onset

    inside, low, high = tone(1000), tone(100), tone(6000)
    assert power(band_limit(inside, 300, 3400, RATE)) > 0.8 * power(inside)
    assert power(band_limit(low, 300, 3400, RATE)) < 0.05 * power(low)
    assert power(band_limit(high, 300, 3400, RATE)) < 0.05 * power(high)


def test_speed_changes_length_and_pitch():
    fast = change_speed(tone(200), 1.25, RATE)
    assert len(fast) == pytest.approx(RATE / 1.25, abs=2)
    peak = np.argmax(np.abs(np.fft.rfft(fast))) * RATE / len(fast)
    assert peak == pytest.approx(250, abs=2)


def test_augmentation_draws_and_reports_what_it_did():
    always = Augmentation(noise=1.0, reverb=1.0, band=1.0, speed=1.0)
    audio, done = always.apply(tone(440), RATE, np.random.default_rng(1))
    assert [d.split()[0] for d in done] == ["speed", "reverb", "band", "noise"] and audio.dtype == np.float32
    never = Augmentation(noise=0.0, reverb=0.0, band=0.0, speed=0.0)
    same, nothing = never.apply(tone(440), RATE, np.random.default_rng(1))
    assert nothing == [] and np.array_equal(same, tone(440))
