"""bench/consent.py's embedding cache: a recording is cached by its content, not by its label alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chorus.speaker_recognition.channel import Channel  # noqa: E402
from chorus.speaker_recognition.voice_match import MatchVerdict  # noqa: E402
from consent import Judges, recording_key  # noqa: E402


class LoudnessMatch:
    """A stand-in matcher: a recording's one "window" is its mean level, and a trial's score the
    consent's level less the sample's; every call is counted."""

    def __init__(self):
        self.channel_calls = 0

    def channel(self, audio, rate, what):
        self.channel_calls += 1
        return audio, Channel(60.0, 8000.0, 40.0)

    def band(self, a, b):
        return (0.0, 0.0)

    def windows(self, audio, band, what):
        return np.array([[float(np.mean(audio))]])

    def verdict(self, consent_windows, a, sample_windows, b, band):
        score = float(consent_windows[0, 0] - sample_windows[0, 0])
        return MatchVerdict(score, score, score > 0, band, (40.0, 40.0), a, b, score, score, 1)


def test_one_label_two_recordings_get_two_keys():
    first, second = np.full(100, 0.5, np.float32), np.full(100, 0.25, np.float32)
    assert recording_key(("clean", "joe"), first) == recording_key(("clean", "joe"), first.copy())
    assert recording_key(("clean", "joe"), first) != recording_key(("clean", "joe"), second)
    assert recording_key(("clean", "joe"), first) != recording_key(("clean", "ann"), first)


def test_two_shards_caches_merge_without_taking_each_others_recordings():
    """Two processes record one label differently (Piper's noise is unseeded); merged, each trial is
    judged again from its own recordings (was: the second shard's cache took the first's)."""
    sample = np.zeros(100, np.float32)
    shards, rows = [], []
    for level in (0.5, 0.25):
        judges = Judges(None, {"loudness": LoudnessMatch()})
        rows.append(judges.trial("loudness", ("clean", "joe"), np.full(100, level, np.float32), "sample", sample))
        shards.append(judges)
    merged = Judges(None, {"loudness": LoudnessMatch()})
    for judges in shards:
        merged.channels |= judges.channels
        merged.windows |= judges.windows
    assert [merged.judge("loudness", *row["keys"])["score"] for row in rows] == [0.5, 0.25]


def test_a_recording_is_measured_once_per_content():
    judges = Judges(None, {"loudness": (matcher := LoudnessMatch())})
    consent, sample = np.full(100, 0.5, np.float32), np.zeros(100, np.float32)
    for _ in range(3):
        judges.trial("loudness", ("clean", "joe"), consent, "sample", sample)
    assert matcher.channel_calls == 2


def test_calibration_sets_a_threshold_per_group_for_classes_without_their_own():
    """A class with too few strangers (here the whole band) takes its SNR pair's group threshold, set on the
    strangers of every band in that pair, not the pooled one that the noisiest pair sets."""
    from chorus.speaker_recognition.voice_match import MatchSettings
    from consent import MIN_CLASS_IMPOSTORS, calibrate

    def trial(key: str, relation: str, score: float) -> dict:
        verdict = {"score": score, "worst_window": 5.0, "worst_stretch": score, "threshold_key": key}
        return {"split": "calibration", "relation": relation, "condition": "clean", "chorus": verdict}

    n, half = MIN_CLASS_IMPOSTORS, MIN_CLASS_IMPOSTORS // 2
    # Clean pairs: two bands of half the minimum each, so only their SNR pair's group has enough strangers.
    trials = [trial("0-3900 clean/clean", "other voice", -k / n) for k in range(half)]  # up to 0
    trials += [trial("0-5500 clean/clean", "other voice", -1 - k / n) for k in range(half)]  # up to -1
    trials += [trial("0-3900 middling/middling", "other voice", 6.0 - k / n) for k in range(n)]  # up to 6
    trials += [trial("0-0 clean/clean", "other voice", -1.0) for _ in range(5)]  # too few for its own
    trials += [trial("0-0 clean/clean", "owner", 2.0) for _ in range(5)]
    # One stranger above the clean pair's group threshold (which lets 0.5 % of its 306 through: one): its
    # class refuses it all the same.
    trials += [trial("300-3400 clean/clean", "other voice", 1.5)]
    chosen = calibrate(trials, "chorus", MatchSettings())
    assert {"0-3900 clean/clean", "0-5500 clean/clean", "0-0 clean/clean"}.isdisjoint(chosen.thresholds)
    assert chosen.threshold > 5.9  # pooled: set by the middling pair's strangers
    assert 0.0 < chosen.thresholds["* clean/clean"] < 0.1  # the clean pair's group, over both bands
    assert chosen.threshold_for("0-0 clean/clean") == chosen.thresholds["* clean/clean"]
    assert chosen.threshold_for("0-0 clean/clean") < 2.0  # so its owners pass where the pooled one refused them
    assert 1.5 < chosen.threshold_for("300-3400 clean/clean") < 1.6  # its few strangers still refused
