"""bench/many_voices.py's report: the K = 1 control corrects the other K's ratios, and each command's
provenance is stated."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from many_voices import control_lines, provenance_lines  # noqa: E402


def row(k: int, ratios: list[float]) -> dict:
    return {"k": k, "ratio": {"values": ratios, "mean": sum(ratios) / len(ratios)}}


def test_each_k_is_divided_by_the_control():
    (blank, line) = control_lines([row(1, [0.9, 0.9]), row(32, [1.8, 1.35])])
    assert blank == ""
    assert "K = 32: 1.58 / 0.90 = **1.75x** (lowest repeat 1.50x)" in line and "K = 1:" not in line


def test_no_control_no_correction():
    assert control_lines([row(32, [1.8])]) == []


def test_provenance_is_stated_per_command_that_has_one():
    record = {"commit": "abcdef0123456", "src_clean": True, "threads": 1, "path": "adapt_many", "note": "n"}
    lines = provenance_lines(["run a", "run b"], {"run b": record})
    assert lines == ["`run b`: commit `abcdef0123` (src/ clean), 1 thread(s), timed: adapt_many, n.", ""]
    assert provenance_lines(["run a"], {}) == []
