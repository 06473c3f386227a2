"""bench/one_speaker.py's report: refusals counted against the calibrated threshold, each figure listed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import numpy as np  # noqa: E402

from one_speaker import intruded, report  # noqa: E402


def test_refusals_are_counted_under_the_threshold():
    result = {
        "provenance": {"commit": "abc", "src_clean": True, "threads": 2, "path": "split_score", "load": "1.0"},
        "clips": 48,
        "fewest": 16,
        "sizes": [16, 32, 48],
        "min_share": 0.1,
        "calibration": {"a @ 16": 0.9, "b @ 16": 0.75, "b @ 48": 0.8},
        "check_seconds": [1.5, 2.25],
        "threshold": 0.73,
        "shipped": 0.5,
        "figures": {
            "alone": [{"folder": "x", "score": 0.8}, {"folder": "y", "score": 0.73}],  # on the threshold: taken
            "two voices": [{"folder": "p", "score": 0.4}, {"folder": "q", "score": 0.6}],
            "corpus pairs": [{"folder": "a + b", "score": 0.2}, {"folder": "c + d", "score": 0.9}],
        },
    }
    text = report(result)
    assert "| alone | 2 | 0 (0%) | 0 (0%) | 0.730-0.800 |" in text
    assert "| corpus pairs | 2 | 1 (50%) | 1 (50%) | 0.200-0.900 |" in text
    assert "| two voices | 2 | 2 (100%) | 1 (50%) | 0.400-0.600 |" in text  # counted at both bounds
    assert "* alone: y: 0.730 (taken)" in text and "* two voices: p: 0.400 (refused)" in text
    assert "* two voices: q: 0.600 (taken)" in text  # as Chorus judges it, at the shipped 0.5
    assert "corpus pairs, taken as one voice (1): c + d 0.900" in text
    assert "(each voice at 16, 32, 48 clips; lowest b @ 16 0.750) less 0.02" in text and "took 1.5-2.2 s" in text


def test_a_few_clips_of_another_voice_sit_spread_among_ones_own():
    one, other = np.zeros((30, 2)), np.ones((10, 2))
    folder = intruded(one, other, 23, 3)
    assert folder.shape == (26, 2) and np.flatnonzero(folder[:, 0]).tolist() == [4, 13, 21]
