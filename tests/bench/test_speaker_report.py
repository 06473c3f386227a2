"""bench/speaker.py's report: every EER also without piper-joe and its relatives (voices the encoders trained on
the Piper voice's relatives heard), and bundles judged beside the trained variants without memory rows."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import numpy as np  # noqa: E402

import speaker  # noqa: E402


def _clips() -> list[tuple[str, Path]]:
    names = ["flite-slt", "flite-slt", "festival-ked", "festival-ked", "piper-joe", "piper-joe~pitch-240"]
    return [(name, Path(f"{name}/{i}.wav")) for i, name in enumerate(names)]


def test_the_eer_without_joe_leaves_out_every_pair_with_a_joe_clip():
    # slt and ked told apart perfectly (targets 1.0 and 0.8, others 0 and 0.6); joe's first clip sits on slt's,
    # and its relative (a speaker of its own) elsewhere: with joe's pairs a non-target scores 1.0.
    embeddings = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0.6, 0.8, 0], [1, 0, 0], [0, 0, 1.0]])
    row = speaker.verification_row(embeddings, _clips())
    assert (row["trials"], row["targets"], row["trials_without_joe"]) == (15, 2, 6)
    assert row["eer_without_joe"] == 0.0 and row["eer"] > 0.0
    assert speaker.is_joe("piper-joe~pitch-240") and speaker.is_joe("piper-joe") and not speaker.is_joe("flite-slt")
    assert not speaker.is_joe("piper-joey")


def test_bundles_are_reported_beside_variants_without_a_trunk_ratio():
    def row(variant, eer, without):
        return {
            "variant": variant,
            "parameters": 1000,
            "seconds_per_step": 2.0,
            "final_loss": 3.0,
            "calibration_eer": 0.02,
            "eer": eer,
            "min_dcf": 0.9,
            "eer_without_joe": without,
        }

    encoders = [row("resnet18-adam", 0.2, 0.25), row("resnet18-rev-adam8bit", 0.1, 0.15), row("assets/v3", 0.07, 0.11)]
    resemblyzer = {"eer": 0.06, "min_dcf": 1.0, "trials": 15, "targets": 2, "trials_without_joe": 6}
    resemblyzer["eer_without_joe"] = 0.09
    args = argparse.Namespace(
        heldout="heldout",
        trial_virtual_speakers=9,
        steps=600,
        seed=1,
        threads=1,
        encoders=[Path("assets/v3")],
        batch=32,
        frames=200,
        memory_speakers=252,
    )
    encoders[0]["trials"], encoders[0]["targets"] = 15, 2
    text = speaker.report(encoders, resemblyzer, [], {}, args, _clips())
    assert "EER % without piper-joe's 9 trials" in text
    assert "| resnet18-rev-adam8bit | 1,000 | 2.00 (2.00-2.00) | 3.00 | 2.00 | 10.00 | 0.900 | 15.00 | 0.50 |" in text
    assert "| assets/v3 | 1,000 | see its card | 3.00 | 2.00 | 7.00 | 0.900 | 11.00 |  |" in text  # trained elsewhere
    assert "| 6.00 | 1.000 | 9.00 | |" in text  # resemblyzer's row
    assert "Bundles judged as they are (assets/v3)" in text
