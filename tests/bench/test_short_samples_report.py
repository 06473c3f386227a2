"""bench/short_samples.py's arithmetic: the recipe it chooses at 30 s and the verdicts of its targets."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from short_samples import REFERENCE_RECIPE, choose_recipe, target_lines  # noqa: E402


def row(seconds: float, similarity: float, wer: float = 0.15, recipe: str = "residual", cap: int = 100) -> dict:
    return {
        "voice": "v",
        "seconds": seconds,
        "recipe": recipe,
        "cap": cap,
        "seed": 1,
        "similarity": similarity,
        "wer": wer,
        "start_wer": 0.10,
        "adapt_seconds": 30.0,
    }


def one_minute(similarity: float) -> dict:
    recipe, cap = REFERENCE_RECIPE
    return row(60.0, similarity, recipe=recipe, cap=cap)


def test_a_miss_of_the_moonshot_is_not_rounded_onto_its_bar():
    # 0.8397 / 0.8401 = 0.9995: three digits would print "1.000x (not met)".
    (line,) = target_lines([row(15.0, 0.8397), row(30.0, 0.85), one_minute(0.8401)], ("residual", 100))
    assert "15 s at the 1-minute similarity: 0.9995x (**not met**)" in line
    assert "30 s similarity 1.0118x the 1-minute voice's (met)" in line


def test_a_30_s_voice_just_under_its_bar_is_a_miss():
    (line,) = target_lines([row(30.0, 0.9496), one_minute(1.0)], ("residual", 100))
    assert "30 s similarity 0.9496x the 1-minute voice's (**not met**)" in line
    (line,) = target_lines([row(30.0, 0.95), one_minute(1.0)], ("residual", 100))
    assert "30 s similarity 0.9500x the 1-minute voice's (met)" in line


def test_the_word_allowance_is_the_start_speakers_plus_ten_points():
    (line,) = target_lines([row(30.0, 0.9, wer=0.21), one_minute(0.9)], ("residual", 100))
    assert "30 s WER 21.0 vs start speaker 10.0 + 10 (**not met**)" in line
    (line,) = target_lines([row(30.0, 0.9, wer=0.19), one_minute(0.9)], ("residual", 100))
    assert "30 s WER 19.0 vs start speaker 10.0 + 10 (met)" in line


def test_within_half_a_hundredth_of_the_best_the_fewest_steps_are_chosen():
    rows = [row(30.0, 0.870, cap=100), row(30.0, 0.874, cap=300), row(30.0, 0.880, recipe="speaker", wer=0.30)]
    chosen, lines = choose_recipe(rows)
    assert chosen == ("residual", 100)
    assert any("`speaker` cap 100" in line and "WER allowance exceeded" in line for line in lines)
