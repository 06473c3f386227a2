"""bench/default_voice.py's rule: the setting chosen on development sentences, and the sentences it may use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chorus.corpus.text import benchmark_sentences  # noqa: E402
from default_voice import DEVELOPMENT, choose, unheard  # noqa: E402


def rows(default_wer: float, mos: tuple[float, float]) -> dict:
    return {"rms": {"wer": default_wer, "mos": mos[0]}, "awb": {"wer": 0.2, "mos": mos[1]}}


def test_the_fewest_lost_words_among_settings_that_keep_the_mos_bounds():
    dev = {
        "neural 1:1": rows(0.05, (2.5, 1.9)),  # fewest words lost, but a speaker under 2.0
        "neural 1:1.3": rows(0.10, (2.6, 2.1)),
        "griffin-lim 1:1": rows(0.08, (2.4, 2.2)),
    }
    assert choose(dev, "rms", words=100) == "griffin-lim 1:1"


def test_within_one_word_the_higher_mean_mos_wins():
    dev = {"a": rows(0.080, (2.4, 2.2)), "b": rows(0.089, (2.9, 2.5)), "c": rows(0.091, (3.5, 3.5))}
    assert choose(dev, "rms", words=100) == "b"  # c is two words away


def test_with_no_setting_in_bounds_the_rule_runs_over_all():
    dev = {"a": rows(0.10, (1.5, 1.5)), "b": rows(0.05, (1.8, 1.6))}
    assert choose(dev, "rms", words=100) == "b"


def test_development_sentences_are_unheard_and_not_the_figures():
    assert unheard(DEVELOPMENT) == list(DEVELOPMENT) and len(DEVELOPMENT) == 70
    with pytest.raises(ValueError, match="the base heard or the figures use"):
        unheard((*DEVELOPMENT[:2], benchmark_sentences()[0]))
