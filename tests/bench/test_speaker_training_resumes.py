"""bench/speaker.py's trainings outlast a working session: a variant with a checkpoint and no encoder yet
goes on from it; one trained already is left alone; a new one starts afresh."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import speaker  # noqa: E402


class _Log:
    def __init__(self):
        self.measured_names = []

    def measured(self, name: str) -> None:
        self.measured_names.append(name)


def test_a_cut_training_resumes_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)  # the virtual speakers, made already
    encoders = work / "encoders"
    (encoders / "resnet18-adam" / "checkpoint").mkdir(parents=True)  # cut short
    (encoders / "resnet18-sgd").mkdir(parents=True)
    (encoders / "resnet18-sgd" / "config.json").write_text("{}")  # finished
    calls = []
    monkeypatch.setattr(speaker, "prepare_clips", lambda config, mel: "clips")
    monkeypatch.setattr(
        speaker, "train_speaker_encoder", lambda config, clips, resume: calls.append((config, clips, resume))
    )
    args = argparse.Namespace(work=work, corpus=tmp_path, steps=600, seed=1234, threads=1)
    log = _Log()
    speaker.train_variants(["resnet18-adam", "resnet18-sgd", "resnet18-rev-adam8bit"], args, log)
    assert [(Path(c.out).name, resume) for c, _, resume in calls] == [
        ("resnet18-adam", encoders / "resnet18-adam"),
        ("resnet18-rev-adam8bit", None),
    ]
    assert all(c.checkpoint_minutes == speaker.CHECKPOINT_MINUTES and c.steps == 600 for c, _, _ in calls)
    assert log.measured_names == ["train resnet18-adam", "train resnet18-rev-adam8bit"]
