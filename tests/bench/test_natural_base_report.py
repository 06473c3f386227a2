"""bench/natural_base.py: its labels, MOS per row and the report's blank cells."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chorus.evaluation.voices import VoiceClip  # noqa: E402
from natural_base import labelled, mos_by_group, report  # noqa: E402


def test_labels_name_the_shipped_one_by_none():
    assert labelled("shipped,natural=runs/x/checkpoint") == {"shipped": None, "natural": "runs/x/checkpoint"}


def test_mos_is_the_mean_and_sd_over_each_rows_clips():
    clips = [VoiceClip(f"v|{s}", i, "t", np.zeros(4), 22050, 0.0) for s in ("a", "b") for i in range(2)]
    rows = [SimpleNamespace(id=clip.id, mos=score) for clip, score in zip(clips, (2.0, 4.0, 3.0, 3.0))]
    assert mos_by_group(clips, SimpleNamespace(rows=rows)) == {"v|a": (3.0, 1.0), "v|b": (3.0, 0.0)}


def test_a_base_without_the_voice_leaves_its_cell_blank():
    result = {
        "systems": ["recordings", "shipped + shipped"],
        "voices": ["natural-joe-speed-116"],
        "bases": {"shipped": {"folder": "shipped", "steps": 9000}},
        "vocoders": {"shipped": "neural"},
        "sentences": 12,
        "summary": {"natural-joe-speed-116|recordings": {"wer": 0.053, "similarity": 0.917}},
        "mos": {"natural-joe-speed-116|recordings": (3.98, 0.32)},
        "provenance": {"commit": "abc", "src_clean": True, "threads": 1, "load": "1.0"},
    }
    line = next(row for row in report(result).splitlines() if row.startswith("| natural-joe"))
    assert line == "| natural-joe-speed-116 | 3.98 ± 0.32 / 5.3 / 0.917 |  |"
