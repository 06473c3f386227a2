"""bench/sample_refinement.py's two rules (which evaluation each keeps), what each serves, and the order in which
the evaluations are checked."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sample_refinement import Snapshots, chosen, report, served  # noqa: E402


def test_the_lowest_loss_is_kept_only_if_it_reads_well_and_the_first_that_does_otherwise():
    assert chosen([25, 50, 75], {25: True, 50: True, 75: False}) == (25, 25)
    assert chosen([25, 50, 75], {25: False, 50: False, 75: True}) == (None, 75)
    assert chosen([25, 50], {25: False, 50: False}) == (None, None)
    assert chosen([], {}) == (None, None)  # no evaluation improved on the start


def test_a_rule_that_keeps_no_evaluation_serves_the_instant_voice():
    row = {"instant": {"wer": 0.1, "similarity": 0.6}, "steps": {"50": {"wer": 0.2, "similarity": 0.8}},
           "lowest_loss_kept": None, "first_that_reads_well": 50}  # fmt: skip
    assert served(row, "lowest_loss_kept") == {"wer": 0.1, "similarity": 0.6}
    assert served(row, "first_that_reads_well") == {"wer": 0.2, "similarity": 0.8}


def test_the_report_counts_the_refined_voices_and_averages_what_is_served():
    row = {"voice": "slt+220c-seed0", "sample_seconds": 12.0, "instant_speaker": "flite-rms",
           "instant": {"wer": 0.1, "similarity": 0.6},
           "steps": {"25": {"check_refined": 0.2, "kept": False, "wer": 0.3, "similarity": 0.9},
                     "50": {"check_refined": 0.0, "kept": True, "wer": 0.2, "similarity": 0.8}},
           "lowest_loss_kept": None, "first_that_reads_well": 50}  # fmt: skip
    result = {"rows": [row], "split": "calibration", "seed": 0, "sentences": 10,
              "provenance": {"commit": "0" * 40, "src_clean": True, "threads": 1, "load": "1.0-1.0"}}  # fmt: skip
    text = report(result)
    assert "- lowest loss: refined 0 of 1; WER 10.0 %, similarity 0.600" in text
    assert "- first that reads well: refined 1 of 1; WER 20.0 %, similarity 0.800" in text
    assert "| instant: 10.0 % / 0.600 | step 50: 20.0 % / 0.800 |" in text


def test_the_evaluations_that_improved_are_checked_best_loss_first_earlier_step_on_ties():
    snapshots = Snapshots()
    snapshots.states = {0: {}, 25: {}, 50: {}, 75: {}, 100: {}}
    history = [{"step": 0, "val_mel": 0.5}, {"step": 25, "val_mel": 0.4}, {"step": 50, "val_mel": 0.3},
               {"step": 75, "val_mel": 0.4}, {"step": 100, "val_mel": 0.6}]  # fmt: skip
    assert snapshots.improved_steps(SimpleNamespace(history=history)) == [(50, 0.3), (25, 0.4), (75, 0.4)]
