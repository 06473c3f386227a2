"""bench/bases.py's arithmetic: each reading's WER apart from the pooled one, and the report's rows and
verdicts from a base.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bases import PIPERS, reading_order, report, wer_per_draw  # noqa: E402


def judged(edits: int, words: int = 10) -> SimpleNamespace:
    return SimpleNamespace(word_edits=edits, reference_words=words)


def test_each_reading_has_its_own_wer():
    rows = [judged(1), judged(0), judged(3), judged(1)]  # two readings of two sentences
    assert wer_per_draw(rows, 2) == [0.05, 0.2]


def test_readings_that_do_not_divide_the_items_are_refused():
    with pytest.raises(ValueError, match="not 2 readings"):
        wer_per_draw([judged(1)] * 3, 2)


def test_each_system_reads_first_as_often_and_the_chorus_base_once():
    names = [*PIPERS, "Chorus base"]
    order = reading_order(names, sentences=6, draws=3)
    assert [(d, i) for d, i, n in order if n == "Chorus base"] == [(0, i) for i in range(6)]
    for draw, present in ((0, names), (1, list(PIPERS)), (2, list(PIPERS))):
        firsts = [next(n for d, i, n in order if (d, i) == (draw, index)) for index in range(6)]
        assert sorted(firsts) == sorted(present * (6 // len(present)))
    assert len(order) == 6 * 3 + 2 * 6 * 2


def system(mos: float, wer: float, rtf: float, per_draw: list[float] | None = None) -> dict:
    row = {"mos": mos, "mos_sd": 0.4, "wer": wer, "rtf": {"median": rtf, "q1": rtf, "q3": rtf, "n": 60}}
    return row | ({"wer_per_draw": per_draw} if per_draw else {})


def test_report_pools_the_readings_and_judges_the_gaps(tmp_path):
    spread = {"median": 1.45, "q1": 1.4, "q3": 1.5, "low": 1.3, "high": 1.6, "n": 60}
    result = {
        "draws": 3,
        "systems": {
            "Chorus's PyTorch Piper": system(3.95, 0.040, 0.14, [0.03, 0.05, 0.04]),
            "onnxruntime Piper": system(3.96, 0.035, 0.095, [0.02, 0.04, 0.045]),
            "Chorus base": system(3.0, 0.12, 0.02),
        },
        "torch_over_onnx_rtf": spread,
    }
    record = {"provenance": {"commit": "abcdef0123456", "src_clean": True, "threads": 1}, "result": result}
    (tmp_path / "base.json").write_text(json.dumps(record))
    text = report(tmp_path)
    assert "--draws 3" in text and "PyTorch seeded 0-2" in text
    assert "| Chorus's PyTorch Piper | 3.95 (0.40) | 4.0 % | 3.0, 5.0, 4.0 | 0.140 (0.140-0.140), n 60 |" in text
    assert "| Chorus base | 3.00 (0.40) | 12.0 % | - |" in text
    assert "| MOS within 0.05 of onnxruntime Piper's | -0.01 | met |" in text
    assert "| WER within 1 point | +0.5 points | met |" in text
    assert "| real-time factor <= 1.5x onnxruntime's | 1.45x (median) | met |" in text
    assert "Chorus's PyTorch Piper 3.0-5.0 %; onnxruntime Piper 2.0-4.5 % (the pooled gap: +0.5 points)" in text


def test_adapted_verdicts_compare_each_piper_voice_with_the_chorus_voice_of_its_target():
    from bases import adapted_verdicts

    def cell(target, base, minutes, mos, similarity, wer, train=10.0, share=0.0108):
        return dict(target=target, base=base, minutes=minutes, mos=mos, similarity=similarity, wer=wer,
                    train_minutes=train, voice_share=share)  # fmt: skip

    rows = [
        cell("a", "piper-joe", 3.0, 3.4, 0.90, 0.08),
        cell("a", "chorus", 3.0, 2.5, 0.91, 0.20),
        cell("a", "piper-joe", 1.0, 1.0, 0.10, 0.90),  # another minutes: not judged here
        cell("b", "piper-joe", 3.0, 2.0, 0.70, 0.12, train=16.0, share=0.03),
        cell("b", "chorus", 3.0, 2.0, 0.70, 0.30),  # an equal similarity meets ">="
        cell("c", "piper-joe", 3.0, 4.0, 0.99, 0.01),  # no Chorus voice of c: no row
        {"target": "a", "recordings": {}},
    ]
    lines = adapted_verdicts(rows)
    a_row, b_row = (next(line for line in lines if line.startswith(f"| {t} |")) for t in "ab")
    assert a_row == "| a | 3.40: met | 0.900 vs 0.910: **not met** | 8.0 %: met | 10.0: met | 1.08 %: met |"
    assert b_row == (
        "| b | 2.00: **not met** | 0.700 vs 0.700: met | 12.0 %: **not met** | 16.0: **not met** | 3.00 %: **not met** |"
    )
    assert not any(line.startswith("| c |") for line in lines)
    assert adapted_verdicts([cell("a", "chorus", 3.0, 2.5, 0.9, 0.2)]) == []
