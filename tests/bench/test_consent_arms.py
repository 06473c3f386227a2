"""bench/consent_denoise.py's summary of its two arms: the recognizer arm is counted from its own verdicts and
timed by its whole check; results written before the arm existed read as the denoised arm."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import consent_denoise  # noqa: E402


def _verdict(ok: bool, forced: float | None = None, seconds: float = 1.0) -> dict:
    return {
        "accepted": ok or forced is not None,
        "forced": forced,
        "ok": ok,
        "heard": "",
        "reason": "",
        "seconds": seconds,
    }


def _row(condition: str, phrase: str, as_is: dict, other: dict, arm: str) -> dict:
    row = {"condition": condition, "phrase": phrase, "speaker": "slt+220c", "kind": "k", "audio_seconds": 6.0}
    row |= {"as_is": as_is, arm: other}
    if arm == consent_denoise.ARM_DENOISED:
        row |= {"denoise_seconds": 3.0, "denoise_cpu_seconds": 1.5, "denoise_create_seconds": 0.5}
    return row


def test_the_recognizer_arm_is_counted_and_timed_by_its_own_check():
    arm = consent_denoise.ARM_RECOGNIZER
    rows = [
        _row("clean", "right", _verdict(True, seconds=2.0), _verdict(True, seconds=4.0), arm),
        _row("clean", "right", _verdict(False, forced=0.002), _verdict(True, seconds=6.0), arm),  # gained
        _row("babble 10 dB", "right", _verdict(True), _verdict(False, seconds=2.0), arm),  # lost
        _row("clean", "wrong", _verdict(False, forced=0.0005), _verdict(False, forced=0.02, seconds=4.0), arm),
    ]
    result = {"rows": rows, "forced_bound": 0.0112, "arm": arm}
    summary = consent_denoise.summarize(result)
    assert summary["table"]["clean"] | {"seconds": 0} == {
        "right_n": 2, "right_as_is": 1, "right_other": 2, "wrong_n": 1, "wrong_as_is": 0, "wrong_other": 0, "seconds": 0
    }  # fmt: skip
    assert summary["table"]["clean"]["seconds"] == (4.0 + 6.0 + 4.0) / 3
    assert summary["right_flips"] == {"gained": 1, "lost": 1}
    assert summary["wrong_forced_max"] == {"as_is": 0.0005, arm: 0.02}
    # The other recognizer's own bound rises above its wrong reading (0.02): the recordings it accepted at the
    # shipped bound without a forced listen stay accepted.
    assert summary["raised_bound"][arm]["bound"] == 0.0201 and summary["raised_bound"]["as_is"]["bound"] == 0.0112
    assert summary["as_is_seconds_mean"] == (2.0 + 1.0 + 1.0 + 1.0) / 4


def test_results_from_before_the_arms_read_as_denoised():
    arm = consent_denoise.ARM_DENOISED
    rows = [_row("clean", "right", _verdict(True), _verdict(False), arm)]
    summary = consent_denoise.summarize({"rows": rows, "forced_bound": 0.0112})  # no "arm": an older result
    assert summary["arm"] == arm and summary["right_flips"] == {"gained": 0, "lost": 1}
    assert summary["denoise_real_time_factor"] == 0.5 and summary["seconds_mean"] == 3.0
