"""bench/one_speaker.py's report: refusals counted against the calibrated threshold, each figure listed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from one_speaker import report  # noqa: E402


def test_refusals_are_counted_under_the_threshold():
    result = {
        "provenance": {"commit": "abc", "src_clean": True, "threads": 2, "path": "split_score", "load": "1.0"},
        "clips": 16,
        "min_share": 0.1,
        "calibration": {"a": 0.9, "b": 0.75},
        "threshold": 0.73,
        "shipped": 0.73,
        "figures": {
            "alone": [{"folder": "x", "score": 0.8}, {"folder": "y", "score": 0.73}],  # on the threshold: taken
            "corpus pairs": [{"folder": "a + b", "score": 0.2}, {"folder": "c + d", "score": 0.9}],
        },
    }
    text = report(result)
    assert "| alone | 2 | 0 (0%) | 0.730-0.800 |" in text
    assert "| corpus pairs | 2 | 1 (50%) | 0.200-0.900 |" in text
    assert "* alone: y: 0.730 (taken)" in text and "Corpus pairs taken as one voice (1): c + d 0.900" in text
