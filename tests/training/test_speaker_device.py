"""The speaker encoder's training on a GPU machine's terms: crops made by data-loader workers (the same
batches as the training process makes alone), a wall-clock budget that plans the schedules, a run
started from another's weights (``init``), and scripts/device_speaker_train.py's pack -> train trip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from chorus.speaker_recognition.encoder import SpeakerEncoderConfig
from chorus.training.speaker_encoder import (
    CHECKPOINT,
    SpeakerTrainConfig,
    learning_rate_at,
    margin_at,
    prepare_clips,
    train_speaker_encoder,
    training_batches,
)
from conftest import SMALL_SPEAKER_ENCODER, tiny_speaker_train_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = {**SMALL_SPEAKER_ENCODER, "n_mels": 80}
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs Debian espeak-ng")


_config = tiny_speaker_train_config


def test_the_schedules_run_over_the_planned_steps():
    config = SpeakerTrainConfig(corpus="", out="", steps=1000, learning_rate=1e-3, margin_start=0.0, margin_full=0.0)
    # No ramp from 0: the margin is on from the first step (an init run's classes are already apart).
    assert [margin_at(config, s) for s in (1, 2, 500)] == [0.2, 0.2, 0.2]
    assert learning_rate_at(config, 1) == pytest.approx(1e-3)
    # The cosine is down to a tenth by the plan's last step, whatever the configured upper bound.
    assert learning_rate_at(config, 101, planned=101) == pytest.approx(1e-4, rel=0.01)
    assert learning_rate_at(config, 100, planned=100) < learning_rate_at(config, 100) / 5
    warm = SpeakerTrainConfig(corpus="", out="", steps=100, learning_rate=1e-3, warmup_steps=10)
    assert [learning_rate_at(warm, s) / learning_rate_at(config, s, 100) for s in (1, 5, 10)] == pytest.approx(
        [0.1, 0.5, 1.0]
    )
    ramped = SpeakerTrainConfig(corpus="", out="", steps=100, margin_start=0.5, margin_full=0.8)
    assert margin_at(ramped, 66, planned=200) == 0.0 and margin_at(ramped, 66) > 0.0
    for bad in (dict(workers=-1), dict(max_minutes=0), dict(checkpoint_minutes=-1.0), dict(warmup_steps=-2)):
        with pytest.raises(ValueError):
            SpeakerTrainConfig(corpus="", out="", **bad)


@needs_espeak
def test_workers_make_the_batches_the_training_process_would(two_voice_corpus):
    from chorus.audio.mel import MelConfig

    mel_config = MelConfig()
    alone = _config(two_voice_corpus, "", steps=7)
    clips = prepare_clips(alone, mel_config, progress=False)
    expected = list(training_batches(clips, alone, mel_config, 3))
    assert len(expected) == 5 and expected[0][0].shape == (4, 48, 80) and expected[0][0].dtype == np.float32
    for workers in (1, 2):
        made = list(training_batches(clips, _config(two_voice_corpus, "", steps=7, workers=workers), mel_config, 3))
        assert len(made) == 5
        for (mels, labels, augmented), (want_mels, want_labels, want_augmented) in zip(made, expected):
            np.testing.assert_array_equal(mels, want_mels)
            np.testing.assert_array_equal(labels, want_labels)
            assert augmented == want_augmented


@needs_espeak
def test_a_run_with_workers_follows_the_run_without(two_voice_corpus, tmp_path):
    alone = train_speaker_encoder(_config(two_voice_corpus, tmp_path / "alone", steps=3), progress=False)
    helped = train_speaker_encoder(_config(two_voice_corpus, tmp_path / "helped", steps=3, workers=2), progress=False)
    ours, theirs = load_file(str(helped / "encoder.safetensors")), load_file(str(alone / "encoder.safetensors"))
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], msg=name)


@needs_espeak
def test_init_starts_from_another_runs_encoder_and_head_with_a_fresh_optimizer(two_voice_corpus, tmp_path):
    first = train_speaker_encoder(_config(two_voice_corpus, tmp_path / "first", optimizer="adam"), progress=False)
    saved = load_file(str(first / CHECKPOINT / "training_state.safetensors"))
    # Another optimizer (the first run's state is Adam's), a learning rate too small to move a weight.
    config = _config(
        two_voice_corpus, tmp_path / "second", optimizer="sgd", learning_rate=1e-12, margin_start=0.0, margin_full=0.0
    )
    second = train_speaker_encoder(config, progress=False, init=first)
    ours, theirs = load_file(str(second / "encoder.safetensors")), load_file(str(first / "encoder.safetensors"))
    for name in theirs:
        if "running" not in name and "num_batches" not in name:  # batch-norm statistics move in training
            torch.testing.assert_close(ours[name], theirs[name], msg=name)
    state = load_file(str(second / CHECKPOINT / "training_state.safetensors"))
    torch.testing.assert_close(state["head.weight"], saved["head.weight"])
    meta = json.loads((second / CHECKPOINT / "training_state.json").read_text())
    assert meta["step"] == 4 and meta["initialized_from"] == {"folder": str(first), "step": 4}
    assert meta["config"]["optimizer"] == "sgd" and len(meta["losses"]) == 4  # a fresh count, from step 1
    info = json.loads((second / "config.json").read_text())["info"]
    assert info["initialized_from"]["step"] == 4 and info["resumed_from_step"] is None
    with pytest.raises(ValueError, match="not both"):
        train_speaker_encoder(config, progress=False, init=first, resume=first)
    other = _config(two_voice_corpus, tmp_path / "other", encoder=SpeakerEncoderConfig(**{**SMALL, "embedding_dim": 8}))
    with pytest.raises(ValueError, match="not the one configured"):
        train_speaker_encoder(other, progress=False, init=first)


@needs_espeak
def test_a_budgeted_run_plans_its_steps_stops_in_time_and_saves(two_voice_corpus, tmp_path):
    config = _config(
        two_voice_corpus, tmp_path / "budget", steps=100_000, max_minutes=0.05, checkpoint_every=10**6, log_every=5
    )
    saves: list[Path] = []
    folder = train_speaker_encoder(config, progress=False, on_save=saves.append)
    meta = json.loads((folder / CHECKPOINT / "training_state.json").read_text())
    info = json.loads((folder / "config.json").read_text())["info"]
    assert 1 <= info["steps"] == meta["step"] < 100_000
    assert meta["planned_steps"] < 100_000  # the pace was measured and the schedules ran over the plan
    assert info["train_seconds"] < 0.05 * 60 + 2.0
    assert saves == [folder, folder]  # the last checkpoint, then the calibrated encoder
    assert {"loss.csv", "loss.png", "encoder.safetensors", "config.json"} <= {p.name for p in folder.iterdir()}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_that_is_not_there_is_refused_plainly(tmp_path):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        train_speaker_encoder(_config(tmp_path, tmp_path / "out", device="cuda"), progress=False)


@needs_espeak
def test_the_cli_trains_from_init_with_workers(two_voice_corpus, tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app

    first = train_speaker_encoder(_config(two_voice_corpus, tmp_path / "first"), progress=False)
    result = CliRunner().invoke(
        app,
        ["speaker", "train", str(two_voice_corpus), "--out", str(tmp_path / "cli"), "--init", str(first)]
        + ["--steps", "2", "--workers", "2", "--device", "cpu"],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "cli" / CHECKPOINT / "training_state.json").read_text())
    assert meta["config"]["workers"] == 2 and meta["config"]["margin_start"] == meta["config"]["margin_full"] == 0.0
    assert meta["config"]["encoder"]["channels"] == list(SMALL["channels"])  # the init's architecture


@needs_espeak
def test_the_device_script_packs_the_split_and_trains_from_it(two_voice_corpus, tmp_path):
    """--pack writes the run's split as Opus; the device mode checks, decodes, trains to its minutes and
    leaves its 7 files; a held-out dataset's name is refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import device_speaker_train as device
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    first = train_speaker_encoder(_config(two_voice_corpus, tmp_path / "first"), progress=False)
    data = tmp_path / "data"
    device.pack(two_voice_corpus, data, first / CHECKPOINT, level=0.98, jobs=1)
    manifest = json.loads((data / "manifest.json").read_text())
    assert "Opus" in (data / "README.md").read_text()
    # The split is prepare_clips': the same held-out clips, the same number of training clips.
    config = _config(two_voice_corpus, "")
    from chorus.audio.mel import MelConfig

    clips = prepare_clips(config, MelConfig(), progress=False)
    decoded = device.decode_clips(data, manifest, 1)
    assert decoded.speakers == clips.speakers == manifest["speakers"]
    for ours, theirs in zip(decoded.heldout, clips.heldout):
        assert [m.shape for m in ours] == [m.shape for m in theirs]
        assert all(abs(a - b).mean() < 1.0 for a, b in zip(ours, theirs))  # Opus at ~13 kbps, log-mel units
    assert [[len(a) for a in s] for s in decoded.train] == [[len(a) for a in s] for s in clips.train]
    with pytest.raises(ValueError, match="held-out dataset"):
        device.refuse_heldout_datasets(["m3", "flite-slt"], [])
    with pytest.raises(ValueError, match="held-out dataset"):
        device.refuse_heldout_datasets(["m3"], ["piper-joe/wavs/1.wav"])
    device.refuse_heldout_datasets(["piper-joe-pitch-150"], ["piper-joe-pitch-150/wavs/1.wav"])  # a v2 speaker

    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "scripts" / "device_speaker_train.py"), "--data", str(data)]
    command += ["--init", str(first), "--out", str(out), "--minutes", "0.5", "--reserve-seconds", "1"]
    command += ["--device", "cpu", "--workers", "2", "--threads", "1", "--batch-speakers", "2", "--warmup", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks passed" in run.stdout and "done:" in run.stdout
    names = {p.name for p in out.iterdir()}
    assert names == {*device.OUT_FILES, "loss.csv", "loss.png", "log.txt"}
    info = json.loads((out / "config.json").read_text())["info"]
    assert info["initialized_from"]["step"] == 4 and "Opus" in info["data"] and info["baseline_eer_opus"] is not None
    state = json.loads((out / "training_state.json").read_text())
    assert state["step"] == info["steps"] and state["config"]["optimizer"] == "adam"
    # A kill-proof folder: --out itself resumes (its checkpoint files and calibrated encoder agree).
    assert load_file(str(out / "encoder.safetensors")).keys() == load_file(str(first / "encoder.safetensors")).keys()

    broken = tmp_path / "broken"
    shutil.copytree(data, broken)
    next((broken / "audio").iterdir()).unlink()
    run = subprocess.run(
        [*command[:3], str(broken), *command[4:]], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert run.returncode == 2 and "FAIL:" in run.stdout and "missing" in run.stdout
