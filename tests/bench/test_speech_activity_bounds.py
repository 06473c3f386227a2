"""bench/speech_activity.py's rules: the bounds from the calibration's gaps, rounded, and said when a rounded bound
falls outside its gap; a voice's clips as one dataset."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from speech_activity import bounds, datasets  # noqa: E402


def _result(speech: list[float], sounds: list[float], clean: list[float], noisy: list[float]) -> dict:
    rows = [{"voice": "v", "condition": "white 10 dB", "heard": h, "snr_db": 5.0} for h in speech]
    rows += [{"voice": f"c{i}", "condition": "clean", "heard": 1.0, "snr_db": v} for i, v in enumerate(clean)]
    rows += [{"voice": f"n{i}", "condition": "white 20 dB", "heard": 1.0, "snr_db": v} for i, v in enumerate(noisy)]
    rows = [r for r in rows for _ in range(3)]  # three clips each: a dataset tells its ratio from three
    return {"calibration": rows, "calibration_sounds": [{"sound": "tone", "heard": h} for h in sounds]}


def test_the_middle_of_each_gap_rounded_and_checked():
    b = bounds(_result([0.66, 0.9], [0.0, 0.02], [37.1, 50.0], [31.8, 18.0]))
    assert (b["heard_bound"], b["heard_bound_in_gap"]) == (0.3, True)  # the middle of 0.02-0.66 is 0.34
    assert (b["snr_bound"], b["snr_bound_in_gap"]) == (34.0, True)  # of 31.8-37.1, 34.45
    assert (b["clean_n"], b["noisy_n"]) == (2, 2)
    # A narrow gap that rounding leaves: 0.31-0.38 has its middle at 0.345, rounded to 0.3, under 0.31.
    narrow = bounds(_result([0.38], [0.31], [37.1], [31.8]))
    assert narrow["heard_bound"] == 0.3 and not narrow["heard_bound_in_gap"]
    overlapping = bounds(_result([0.5], [0.6], [30.0], [32.0]))  # no gap at all
    assert not overlapping["heard_bound_in_gap"] and not overlapping["snr_bound_in_gap"]


def test_a_dataset_needs_three_clips_that_tell_a_ratio():
    rows = [{"voice": "a", "condition": "clean", "snr_db": v} for v in (40.0, None, 50.0)]
    rows += [{"voice": "b", "condition": "clean", "snr_db": v} for v in (40.0, 44.0, 60.0)]
    assert datasets(rows) == {("a", "clean"): None, ("b", "clean"): 44.0}
