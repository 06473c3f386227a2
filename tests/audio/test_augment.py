"""Augmentation: the noise of every kind is at the asked SNR, the room decays by 60 dB over its RT60, the
band-pass, phone line and codecs keep rate and length and remove what lies outside their band, speed
changes length (and so pitch), tempo changes length and keeps pitch, and a seeded draw repeats."""

from __future__ import annotations

import numpy as np
import pytest

from chorus.audio.augment import (
    CHANNELS,
    CODECS,
    Augmentation,
    add_babble,
    add_noise,
    band_limit,
    change_rate,
    change_speed,
    codec_round_trip,
    gain,
    mu_law,
    narrowband,
    phone_line,
    quiet_mic,
    reverberate,
    room_impulse_response,
)

RATE = 16000


def tone(hz: float, seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def snr_of(clean: np.ndarray, noisy: np.ndarray) -> float:
    return 10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean((noisy - clean).astype(np.float64) ** 2))


def band_power(audio: np.ndarray, low: float, high: float, rate: int = RATE) -> float:
    """Power of ``audio`` between ``low`` and ``high`` Hz (after the first quarter second: filter onsets)."""
    spectrum = np.abs(np.fft.rfft(audio[rate // 4 :].astype(np.float64))) ** 2
    hz = np.fft.rfftfreq(len(audio) - rate // 4, 1 / rate)
    return float(spectrum[(hz >= low) & (hz < high)].sum())


def chirp(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    """Equal power at every frequency from 50 Hz to just under Nyquist."""
    t = np.arange(int(seconds * rate)) / rate
    top = 0.48 * rate
    return (0.5 * np.sin(2 * np.pi * (50 * t + (top - 50) * t**2 / (2 * seconds)))).astype(np.float32)


@pytest.mark.parametrize("color", ["white", "pink", "brown", "room"])
@pytest.mark.parametrize("snr_db", [0.0, 10.0, 30.0])
def test_noise_is_at_the_asked_snr(color, snr_db):
    clean = tone(220)
    noisy = add_noise(clean, snr_db, np.random.default_rng(0), color, rate=RATE)
    assert noisy.dtype == np.float32 and noisy.shape == clean.shape
    assert snr_of(clean, noisy) == pytest.approx(snr_db, abs=0.05)


def test_noise_kinds_have_their_slopes():
    """Pink and brown noise put more power low than white; brown most."""

    def low_share(color):
        noisy = add_noise(np.zeros(RATE, np.float32) + 1e-3, 0.0, np.random.default_rng(0), color, rate=RATE)
        return band_power(noisy, 20, 500) / band_power(noisy, 20, 8000)

    white, pink, brown = low_share("white"), low_share("pink"), low_share("brown")
    assert white < 0.1 < pink < brown and brown > 0.9
    with pytest.raises(ValueError, match="room noise needs the audio's rate"):
        add_noise(tone(220), 10.0, np.random.default_rng(0), "room")
    with pytest.raises(ValueError, match="noise kind must be one of"):
        add_noise(tone(220), 10.0, np.random.default_rng(0), "blue")


def test_babble_is_other_talkers_at_the_asked_snr():
    talkers = [tone(300, 0.3), tone(500, 2.0), tone(700, 0.7)]  # shorter and longer than the audio
    clean = tone(220)
    noisy = add_babble(clean, talkers, 5.0, np.random.default_rng(0))
    assert noisy.shape == clean.shape and snr_of(clean, noisy) == pytest.approx(5.0, abs=0.05)
    for hz in (300, 500, 700):  # every talker is in the mix
        assert band_power(noisy - clean, hz - 20, hz + 20) > 0.1 * band_power(noisy - clean, 0, 8000)
    with pytest.raises(ValueError, match="at least one other talker"):
        add_babble(clean, [], 5.0, np.random.default_rng(0))


def test_gain_and_the_quiet_microphone():
    clean = tone(220)
    assert np.abs(gain(clean, -20.0)).max() == pytest.approx(0.05, rel=1e-5)
    quiet = quiet_mic(clean, RATE, np.random.default_rng(0), noise_dbfs=-70.0)
    # Back to the voice's peak, with the -70 dBFS floor lifted by the 30 dB: ~ -40 dBFS, ~31 dB SNR.
    assert quiet.dtype == np.float32 and quiet.shape == clean.shape
    assert np.abs(quiet).max() == pytest.approx(0.5, rel=1e-5)
    voice = clean * float(quiet @ clean / (clean @ clean))  # the AGC's gain is set by the noisy peak
    assert snr_of(voice, quiet) == pytest.approx(10 * np.log10(0.125 / 10 ** (-4.0) / 1.1), abs=1.0)


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


def test_mu_law_is_g711_at_8_bits():
    ramp = np.linspace(-0.9, 0.9, 1000).astype(np.float32)
    assert len(np.unique(mu_law(ramp, 8))) <= 256 and len(np.unique(mu_law(ramp, 5))) <= 32
    assert snr_of(tone(440), mu_law(tone(440), 8)) > 30 > snr_of(tone(440), mu_law(tone(440), 5)) > 15


@pytest.mark.parametrize("rate", [16000, 22050])
def test_phone_line_keeps_300_to_3400_hz_rate_and_length(rate):
    def kept(hz, rng=None):
        clean = tone(hz, 1.0, rate)
        line = phone_line(clean, rate, rng)
        assert line.dtype == np.float32 and line.shape == clean.shape
        return float(np.mean(line[rate // 4 :].astype(np.float64) ** 2) / np.mean(clean[rate // 4 :] ** 2.0))

    assert all(kept(hz) > 0.8 for hz in (500, 1000, 3000))
    assert kept(100) < 0.01 and kept(150) < 0.05  # below the line (and mains hum)
    assert kept(3900) < 0.01 and kept(6000) < 1e-4  # above it, and above 8 kHz's Nyquist
    sweep = chirp(1.0, rate)
    assert not np.array_equal(phone_line(sweep, rate, np.random.default_rng(0)), phone_line(sweep, rate))


def test_narrowband_removes_everything_above_4_khz():
    sweep = chirp(1.0, 22050)
    saved = narrowband(sweep, 22050)
    assert saved.shape == sweep.shape and saved.dtype == np.float32
    assert band_power(saved, 4100, 11025, 22050) < 1e-3 * band_power(sweep, 4100, 11025, 22050)
    assert band_power(saved, 100, 3500, 22050) > 0.9 * band_power(sweep, 100, 3500, 22050)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("rate", [16000, 22050])
def test_codec_round_trips_keep_rate_and_length(codec, rate):
    voice = (0.4 * tone(400, 2.0, rate) + 0.3 * tone(900, 2.0, rate) + 0.2 * tone(2000, 2.0, rate)) * np.hanning(
        2 * rate
    )
    voice = voice.astype(np.float32)
    coded = codec_round_trip(voice, rate, codec)
    assert coded.dtype == np.float32 and coded.shape == voice.shape
    # Lossy but still the same spectrum; the real codecs' delay is removed by their decoders (the
    # stand-in's band-pass shifts phases, as a line does).
    spectra = np.abs(np.fft.rfft(coded)), np.abs(np.fft.rfft(voice))
    assert np.corrcoef(*spectra)[0, 1] > 0.9 and not np.allclose(coded, voice, atol=1e-3)
    if codec != "amr":
        assert np.corrcoef(coded, voice)[0, 1] > 0.9
    with pytest.raises(ValueError, match="codec must be one of"):
        codec_round_trip(voice, rate, "aac")


def test_speed_changes_length_and_pitch():
    fast = change_speed(tone(200), 1.25, RATE)
    assert len(fast) == pytest.approx(RATE / 1.25, abs=2)
    peak = np.argmax(np.abs(np.fft.rfft(fast))) * RATE / len(fast)
    assert peak == pytest.approx(250, abs=2)


def test_rate_changes_length_and_keeps_pitch():
    fast = change_rate(tone(200), RATE, 1.25)
    assert len(fast) == pytest.approx(RATE / 1.25, rel=0.01) and fast.dtype == np.float32
    peak = np.argmax(np.abs(np.fft.rfft(fast))) * RATE / len(fast)
    assert peak == pytest.approx(200, abs=3)


def test_augmentation_draws_and_reports_what_it_did():
    always = Augmentation(speed=1.0, tempo=1.0, reverb=1.0, noise=1.0, mic=1.0, channel=1.0)
    audio, done = always.apply(tone(440), RATE, np.random.default_rng(1))
    assert [d.split()[0] for d in done] == ["speed", "tempo", "reverb", "noise", "mic", "channel"]
    assert audio.dtype == np.float32
    never = Augmentation(speed=0.0, tempo=0.0, reverb=0.0, noise=0.0, mic=0.0, channel=0.0)
    same, nothing = never.apply(tone(440), RATE, np.random.default_rng(1))
    assert nothing == [] and np.array_equal(same, tone(440))


def test_augmentation_draws_every_channel_and_noise_kind_and_repeats_with_its_seed():
    augmentation = Augmentation(speed=0.0, tempo=0.0, reverb=0.0, noise=1.0, mic=1.0, channel=1.0)
    talkers = [tone(300), tone(500)]
    seen = set()
    for seed in range(60):
        audio, done = augmentation.apply(tone(440), RATE, np.random.default_rng(seed), talkers)
        assert audio.shape == tone(440).shape and audio.dtype == np.float32
        seen.update(" ".join(d.split()[:2]) for d in done)
    assert {f"channel {c}" for c in CHANNELS} <= seen
    assert {f"noise {k}" for k in ("white", "pink", "brown", "room", "babble")} <= seen
    assert {"mic quiet"} <= seen
    first = augmentation.apply(tone(440), RATE, np.random.default_rng(7), talkers)
    again = augmentation.apply(tone(440), RATE, np.random.default_rng(7), talkers)
    assert first[1] == again[1] and np.array_equal(first[0], again[0])
    without = {
        " ".join(d.split()[:2])
        for s in range(30)
        for d in augmentation.apply(tone(440), RATE, np.random.default_rng(s))[1]
    }
    assert "noise babble" not in without  # babble only with other talkers
    with pytest.raises(ValueError, match="unknown channel"):
        Augmentation(channels=("fax",))
