"""The custom-voice speaker check (:mod:`chorus.speaker_recognition.voice_match`): its pieces on a fake encoder, then
the attacks of issue 37 on real recordings with the shipped cohort and its calibrated settings.

Every attack here was accepted by the check it replaced (a raw cosine of Chorus's encoder at 0.6135):
strangers sharing a phone line or an 8 kHz file scored 0.90 on average, 272 of 272 accepted."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from scipy.signal import lfilter

from chorus.audio import augment
from chorus.audio.io import SAMPLE_RATE, load_audio
from chorus.evaluation.similarity import mean_embedding
from chorus.speaker_recognition.channel import Channel, limit_band
from chorus.speaker_recognition.voice_match import (
    BANDS,
    SNRS,
    VARIANTS,
    Cohort,
    FusedMatch,
    MatchSettings,
    UnusableRecording,
    VoiceMatch,
    band_class,
    class_key,
    group_keys,
    load_cohort,
    snr_class,
    snr_group,
    threshold_key,
)


class FakeEmbedder:
    """Windows of one second; a window's embedding is its spectrum's shape in 8 bands (unit length)."""

    name = "fake"
    rate = 8000

    def windows(self, audio: np.ndarray) -> np.ndarray:
        if audio.size < self.rate or not np.any(audio):
            raise ValueError("no speech found in the recording (silent or too short)")
        rows = []
        for start in range(0, audio.size - self.rate + 1, self.rate // 2):
            power = np.abs(np.fft.rfft(audio[start : start + self.rate])) ** 2
            rows.append(np.sqrt([band.sum() for band in np.array_split(power, 8)]))
        rows = np.asarray(rows, dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def tone(formants: list[float], seconds: float = 3.0, rate: int = 8000, seed: int = 0) -> np.ndarray:
    """A "voice": noise through resonators at ``formants`` (its timbre: what :class:`FakeEmbedder` sees),
    in syllables of 0.2 s with pauses between (the channel estimate takes its noise floor from the pauses)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    excitation = rng.standard_normal(t.size)
    audio = np.zeros(t.size)
    for formant in formants:
        radius, angle = 0.97, 2 * np.pi * formant / rate
        audio += lfilter([1.0], [1.0, -2 * radius * np.cos(angle), radius**2], excitation)
    syllables = np.convolve((np.sin(2 * np.pi * 2.5 * t) > -0.2).astype(float), np.hanning(160) / 80, mode="same")
    audio *= syllables
    return (0.3 * audio / np.abs(audio).max() + 1e-4 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def fake_cohort() -> Cohort:
    clips = [tone([100 + 37 * i, 700 + 91 * i, 1900 + 53 * i], seed=i) for i in range(12)]
    cohort = Cohort(clips, 8000, [f"c{i}" for i in range(12)])
    cohort.embed_classes(FakeEmbedder())
    return cohort


def test_every_channel_class_is_embedded(fake_cohort):
    table = fake_cohort.embeddings["fake"]
    expected = {class_key(b, s, v) for b in BANDS for s in SNRS for v in VARIANTS}
    assert set(table) == expected - {class_key(b, SNRS[0], "babble") for b in BANDS}  # a clean crowd is no crowd
    assert all(rows.shape == (12, 8) for rows in table.values())


def test_a_trial_is_normalized_by_every_variant_of_its_class_pooled(fake_cohort):
    """Adaptive s-norm picks among the cohort heard every way (rooms, crowd, quantizer): no estimate of
    which one the trial came through is needed."""
    match = VoiceMatch(FakeEmbedder(), fake_cohort, MatchSettings())
    assert match.cohort(BANDS[1], 11.0).shape == (12 * len(VARIANTS), 8)
    assert match.cohort(BANDS[1], 55.0).shape == (12 * (len(VARIANTS) - 1), 8)  # no crowd when clean


def test_a_cohort_round_trips_through_its_folder(fake_cohort, tmp_path):
    fake_cohort.settings["fake"] = MatchSettings(threshold=1.5, window_threshold=-2.0)
    fake_cohort.save(tmp_path / "cohort")
    loaded = load_cohort(tmp_path / "cohort")
    assert loaded.speakers == fake_cohort.speakers and loaded.rate == 8000
    assert loaded.settings["fake"] == MatchSettings(threshold=1.5, window_threshold=-2.0)
    key = class_key(BANDS[2], SNRS[3])
    # Embeddings are stored at half precision: ample for cosines of unit vectors.
    np.testing.assert_allclose(loaded.embeddings["fake"][key], fake_cohort.embeddings["fake"][key], atol=2e-3)
    for ours, theirs in zip(loaded.clips, fake_cohort.clips, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize(
    ("band", "expected"),
    [
        ((60.0, 7800.0), (0.0, 0.0)),
        ((60.0, 5400.0), (0.0, 5500.0)),
        ((90.0, 3850.0), (0.0, 3900.0)),
        ((190.0, 3850.0), (300.0, 3400.0)),  # a 300 Hz high-pass: not compared with a cohort that kept its lows
        ((60.0, 3500.0), (300.0, 3400.0)),
        ((60.0, 2000.0), (300.0, 3400.0)),  # narrower than every class: the narrowest (and the check refuses it)
    ],
)
def test_a_trial_takes_the_widest_class_no_wider_than_its_band(band, expected):
    assert band_class(*band, nyquist=8000.0) == expected


def test_snr_classes_are_the_nearest():
    assert snr_class(45.0) == 60.0 and snr_class(12.0) == 10.0 and snr_class(-3.0) == 5.0


def test_snorm_is_zero_at_the_cohorts_mean_and_counts_in_its_deviations(fake_cohort):
    match = VoiceMatch(FakeEmbedder(), fake_cohort, MatchSettings(top=4))
    rng = np.random.default_rng(0)
    a = mean_embedding(rng.standard_normal((3, 8)))
    cohort = rng.standard_normal((12, 8))
    cohort /= np.linalg.norm(cohort, axis=1, keepdims=True)
    top = np.sort(cohort @ a)[-4:]
    assert match.snorm(float(top.mean()), a, a, cohort, cohort) == pytest.approx(0.0, abs=1e-9)
    one_up = float(top.mean() + top.std())
    assert match.snorm(one_up, a, a, cohort, cohort) == pytest.approx(1.0, rel=1e-6)


def test_the_fake_voice_matches_itself_and_not_another(fake_cohort):
    match = VoiceMatch(
        FakeEmbedder(), fake_cohort, MatchSettings(threshold=1.0, window_threshold=-50.0, min_band_hz=1000.0)
    )
    voice = [130.0, 1450.0, 2600.0]
    owner = match.match(tone(voice, 6.0, seed=1), 8000, tone(voice, 12.0, seed=2), 8000)
    stranger = match.match(tone(voice, 6.0, seed=1), 8000, tone([240.0, 610.0, 3300.0], 12.0, seed=3), 8000)
    assert owner.accepted and owner.score > stranger.score and not stranger.accepted
    assert stranger.reason == "the sample's voice does not match the consent recording's"


def test_a_trial_is_judged_by_its_class_threshold_or_the_strictest(fake_cohort):
    """Before: one threshold for every channel, set by the hardest (a crowd shared by both recordings), refused
    three clean owners in four. Now a class the calibration filled has its own; any other takes its groups'
    (test_a_class_without_its_own_threshold_takes_the_stricter_of_its_groups) or, without those, the pooled."""
    assert [snr_group(x) for x in (40.0, 25.0, 20.0, 12.5, 12.4, 3.0)] == ["clean", "clean"] + ["middling"] * 2 + [
        "noisy"
    ] * 2
    assert threshold_key((0.0, 3900.0), 30.0, 8.0) == "0-3900 clean/noisy"
    voice = [130.0, 1450.0, 2600.0]
    consent, sample = tone(voice, 6.0, seed=1), tone(voice, 12.0, seed=2)
    loose = VoiceMatch(
        FakeEmbedder(), fake_cohort, MatchSettings(threshold=1.0, window_threshold=-50.0, min_band_hz=1000.0)
    )
    verdict = loose.match(consent, 8000, sample, 8000)
    key = verdict.threshold_key
    assert verdict.accepted and key == threshold_key(
        verdict.band, verdict.consent_channel.snr_db, verdict.sample_channel.snr_db
    )
    strict = MatchSettings(
        threshold=verdict.score + 1.0, window_threshold=-50.0, min_band_hz=1000.0, stretch_margin=50.0
    )
    assert not VoiceMatch(FakeEmbedder(), fake_cohort, strict).match(consent, 8000, sample, 8000).accepted
    own = MatchSettings(**{**strict.__dict__, "thresholds": {key: verdict.score - 1.0}})
    assert VoiceMatch(FakeEmbedder(), fake_cohort, own).match(consent, 8000, sample, 8000).accepted
    other = MatchSettings(**{**strict.__dict__, "thresholds": {"300-3400 noisy/noisy": -99.0}})
    assert not VoiceMatch(FakeEmbedder(), fake_cohort, other).match(consent, 8000, sample, 8000).accepted


def test_a_class_without_its_own_threshold_takes_the_stricter_of_its_groups():
    """Before: a class the calibration had too few strangers in (every whole-band pair: 9 of 9 clean owners
    refused in bench/consent.py's calibration split) took the pooled threshold, set by shared crowds and
    lines. Now it takes its SNR pair's, or its band's where higher; the pooled one where its SNR pair has none
    (noise lifts strangers: a noisy side's class must not fall to a band threshold set on cleaner pairs)."""
    settings = MatchSettings(
        threshold=9.0,
        thresholds={"0-3900 clean/clean": 1.0, "0-0 *": 2.0, "0-5500 *": 1.5, "* clean/clean": 3.0}
        | {"* clean/middling": 0.5},
    )
    assert group_keys("0-0 clean/middling") == ("0-0 *", "* clean/middling") and group_keys("") == ()
    assert settings.threshold_for("0-3900 clean/clean") == 1.0  # its own, though its SNR pair's is higher
    assert settings.threshold_for("0-0 clean/clean") == 3.0  # its SNR pair's, the stricter
    assert settings.threshold_for("0-0 clean/middling") == 2.0  # its band's, the stricter
    assert settings.threshold_for("300-3400 clean/clean") == 3.0  # no band group: its SNR pair's
    assert settings.threshold_for("0-5500 noisy/clean") == 9.0  # a band group but no SNR pair's: pooled
    assert settings.threshold_for("") == 9.0
    # Without its SNR pair's group a class takes the strictest threshold there is, where one is above the pooled.
    stricter = replace(settings, thresholds=settings.thresholds | {"* middling/middling": 11.0})
    assert stricter.threshold_for("0-5500 noisy/clean") == 11.0 and stricter.threshold_for("0-0 clean/clean") == 3.0
    assert MatchSettings(threshold=2.0).threshold_for("0-0 noisy/clean") == 2.0  # nothing calibrated per class


def test_each_third_of_the_sample_must_be_the_consents_speaker(fake_cohort):
    """Before: each window was scored against the rest of the sample only, and the rest of a half-and-half
    splice is half each window's own voice (91.7 % of bench/consent.py's splices passed once thresholds went
    per class). Now each third is scored against the consent too."""
    voice, other = [130.0, 1450.0, 2600.0], [240.0, 610.0, 3300.0]
    consent = tone(voice, 6.0, seed=1)
    spliced = np.concatenate([tone(voice, 8.0, seed=2), tone(other, 4.0, seed=3)])
    settings = MatchSettings(threshold=-50.0, window_threshold=-50.0, min_band_hz=1000.0, stretch_margin=0.0)
    match = VoiceMatch(FakeEmbedder(), fake_cohort, settings)
    whole = match.match(consent, 8000, tone(voice, 12.0, seed=2), 8000)
    verdict = match.match(consent, 8000, spliced, 8000)
    assert verdict.worst_stretch < whole.worst_stretch
    strict = VoiceMatch(
        FakeEmbedder(),
        fake_cohort,
        MatchSettings(
            **{
                **settings.__dict__,
                "threshold": verdict.worst_stretch + 0.5 * (whole.worst_stretch - verdict.worst_stretch),
            }
        ),
    )
    assert strict.match(consent, 8000, tone(voice, 12.0, seed=2), 8000).accepted
    refused = strict.match(consent, 8000, spliced, 8000)
    assert not refused.accepted and "another voice in it" in refused.reason


def test_a_recording_with_too_little_voice_is_refused_as_such(fake_cohort):
    match = VoiceMatch(FakeEmbedder(), fake_cohort, MatchSettings(min_band_hz=2500.0))
    muffled = limit_band(tone([400.0, 900.0, 2600.0], 6.0), 8000, 0.0, 1200.0)  # nothing above ~1.5 kHz
    with pytest.raises(UnusableRecording, match="too little of the voice"):
        match.match(muffled, 8000, tone([150.0, 1400.0, 2600.0], 12.0), 8000)
    with pytest.raises(UnusableRecording, match="no speech"):
        match.match(tone([150.0, 1400.0, 2600.0], 6.0), 8000, np.zeros(8000 * 12, np.float32), 8000)


def test_a_channel_is_described_for_people():
    assert Channel(300.0, 3400.0, 18.4).describe() == "300-3400 Hz at 18 dB SNR"


# -- the attacks, on real voices with the shipped cohort and thresholds ------------------------------
SAMPLE_TEXT = (
    "Every morning I walk along the river before work, and I watch the boats drift past the old stone "
    "bridge. On weekends my family and I cook a large breakfast together, then we plan a short trip into "
    "the hills where the air is cool and quiet."
)
PHRASE = "I am the owner of this voice and I consent to Chorus using this voice to create a synthetic voice model."


@pytest.fixture(scope="module")
def voices(tmp_path_factory) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """espeak-ng voices outside the cohort: (consent, 13 s sample) each."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs Debian espeak-ng")
    folder = tmp_path_factory.mktemp("voice_match")
    found = {}
    for variant in ("michel", "travis", "anika"):
        pair = []
        for label, text in (("consent", PHRASE), ("sample", SAMPLE_TEXT)):
            path = folder / f"{variant}-{label}.wav"
            subprocess.run(["espeak-ng", "-v", f"en-us+{variant}", "-w", str(path), text], check=True, timeout=60)
            pair.append(load_audio(path))
        found[variant] = (pair[0], pair[1])
    return found


@pytest.fixture(scope="module", params=["resemblyzer", "fused"])
def shipped_match(request):
    """The speaker check as the server builds it, with the shipped cohort and settings: resemblyzer's, and the
    default, resemblyzer's and Chorus v3's scores fused."""
    from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
    from chorus.serving.settings import ConsentSettings

    return CustomVoiceChecks(None, ConsentSettings(speaker_encoder=request.param)).voice_match  # type: ignore[arg-type]


def test_the_server_fuses_resemblyzer_and_chorus_v3_by_default():
    from chorus.serving.onboarding.consent_checks import CustomVoiceChecks
    from chorus.serving.settings import ConsentSettings

    match = CustomVoiceChecks(None, ConsentSettings()).voice_match  # type: ignore[arg-type]
    assert isinstance(match, FusedMatch)
    assert [part.embedder.name for part in match.parts] == ["resemblyzer", "chorus-v3"]
    assert match.settings == load_cohort().settings["fused"]


def test_a_fused_verdict_sums_its_parts_scores_and_is_judged_by_its_own_settings(fake_cohort):
    """Each part's own thresholds do not count: only the summed scores against the fused settings."""
    strict = MatchSettings(threshold=1e9)  # would refuse everything alone
    part = VoiceMatch(FakeEmbedder(), fake_cohort, strict)
    consent, sample = tone([700, 1200]), tone([700, 1200], seed=1)
    alone = part.match(consent, 8000, sample, 8000)
    assert not alone.accepted
    lenient = MatchSettings(threshold=2 * alone.score - 1e-3, window_threshold=-1e9, stretch_margin=1e9)
    fused = FusedMatch(part, part, lenient).match(consent, 8000, sample, 8000)
    assert fused.accepted and fused.score == pytest.approx(2 * alone.score, abs=1e-3)
    assert fused.worst_window == pytest.approx(2 * alone.worst_window, abs=1e-3)
    assert fused.threshold_key == alone.threshold_key
    refused = FusedMatch(part, part, replace(lenient, threshold=2 * alone.score + 1e-2)).match(
        consent, 8000, sample, 8000
    )
    assert not refused.accepted and "does not match" in refused.reason


def phone(audio: np.ndarray) -> np.ndarray:
    return augment.phone_line(audio, SAMPLE_RATE)


def narrowband(audio: np.ndarray) -> np.ndarray:
    return augment.narrowband(audio, SAMPLE_RATE)


def noisy(audio: np.ndarray) -> np.ndarray:
    return augment.add_noise(audio, 10.0, np.random.default_rng(7))


@pytest.mark.parametrize("channel", [phone, narrowband, noisy], ids=["phone line", "8 kHz", "10 dB noise"])
@pytest.mark.parametrize(("consent", "sample"), [("michel", "travis"), ("travis", "anika"), ("anika", "michel")])
def test_strangers_sharing_a_channel_are_refused(shipped_match, voices, channel, consent, sample):
    """Hole: one phone line (or one 8 kHz file, or one noisy room) made any two voices one speaker."""
    verdict = shipped_match.match(channel(voices[consent][0]), SAMPLE_RATE, channel(voices[sample][1]), SAMPLE_RATE)
    assert not verdict.accepted, verdict


@pytest.mark.parametrize("channel", [None, phone, narrowband], ids=["clean", "phone line", "8 kHz"])
@pytest.mark.parametrize("owner", ["michel", "travis", "anika"])
def test_an_owner_is_accepted_through_a_shared_or_a_different_channel(shipped_match, voices, channel, owner):
    """Hole: a clean consent and a phone-line sample of one owner were two speakers (0 of 17 accepted)."""
    consent, sample = voices[owner]
    shared = shipped_match.match(*(channel(consent) if channel else consent, SAMPLE_RATE), *(channel(sample) if channel else sample, SAMPLE_RATE))  # fmt: skip
    assert shared.accepted, shared
    if channel is not None:
        mismatched = shipped_match.match(consent, SAMPLE_RATE, channel(sample), SAMPLE_RATE)
        assert mismatched.accepted, mismatched


def test_a_sample_with_another_voice_spliced_in_is_refused(shipped_match, voices):
    """Hole: only the sample's mean was compared; half of it could be someone else."""
    consent, own = voices["michel"]
    spliced = np.concatenate([own[: own.size // 2], voices["travis"][1][: voices["travis"][1].size // 2]])
    verdict = shipped_match.match(consent, SAMPLE_RATE, spliced, SAMPLE_RATE)
    assert not verdict.accepted, verdict


def test_a_recording_whose_channel_leaves_no_voice_is_refused_plainly(shipped_match, voices):
    consent, sample = voices["michel"]
    muffled = limit_band(sample, SAMPLE_RATE, 0.0, 1200.0)  # a voice through a wall
    with pytest.raises(UnusableRecording, match="too little of the voice"):
        shipped_match.match(consent, SAMPLE_RATE, muffled, SAMPLE_RATE)
