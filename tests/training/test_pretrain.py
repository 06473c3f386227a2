"""The pretraining loop on a tiny espeak-ng corpus: runs, logs, checkpoints, resumes, DDP."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chorus.models.bundle import load_bundle
from chorus.models.config import AcousticConfig
from chorus.training.checkpoint import load_training_state
from chorus.training.interrupts import RunInterrupted
from chorus.training.pretrain import PretrainConfig, _PretrainLoop, learning_rate_at, pretrain
from conftest import TINY_MODEL
from local_services import free_port

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs Debian espeak-ng")


@pytest.fixture
def corpus(two_voice_corpus) -> Path:
    return two_voice_corpus


def recipe(corpus: Path, out: Path, steps: int) -> PretrainConfig:
    return PretrainConfig(
        data=str(corpus),
        out=str(out),
        model=AcousticConfig(**TINY_MODEL),
        steps=steps,
        max_frames=2000,
        eval_every=2,
        save_every=2,
        threads=1,
        val_per_speaker=1,
    )


def test_pretrain_writes_checkpoint_log_and_plot_and_resumes(corpus, tmp_path):
    checkpoint = pretrain(recipe(corpus, tmp_path, steps=4), progress=False)
    bundle = load_bundle(checkpoint)
    assert bundle.speakers == ["f2", "m3"] and bundle.info["steps"] == 4
    assert (tmp_path / "loss.png").stat().st_size > 0
    log = (tmp_path / "log.csv").read_text().splitlines()
    assert log[0].startswith("step,split") and len(log) == 1 + 2 * 2
    # Normalization statistics are stored in the checkpoint, not recomputed at load time.
    assert bundle.model.mel_std.min() > 0 and bundle.model.mel_mean.abs().sum() > 0

    pretrain(recipe(corpus, tmp_path, steps=6), progress=False)
    state = load_training_state(checkpoint)
    assert state.meta["step"] == 6, "the second run continued from step 4"
    assert any(key.startswith("optimizer.") for key in state.tensors)
    steps_logged = [int(line.split(",")[0]) for line in (tmp_path / "log.csv").read_text().splitlines()[1:]]
    assert steps_logged == [2, 2, 4, 4, 6, 6]


def test_learning_rate_warms_up_then_decays():
    config = PretrainConfig(data="x", out="y", warmup_steps=10, learning_rate=1.0)
    assert learning_rate_at(5, config) == pytest.approx(0.5)
    assert learning_rate_at(10, config) == pytest.approx(1.0)
    assert learning_rate_at(40, config) == pytest.approx(0.5)


def test_anneal_falls_linearly_to_zero_at_the_last_step():
    config = PretrainConfig(data="x", out="y", warmup_steps=10, learning_rate=1.0, steps=60, anneal_from=40)
    assert learning_rate_at(40, config) == pytest.approx(0.5), "the schedule is unchanged up to the anneal"
    assert learning_rate_at(50, config) == pytest.approx(0.25)
    assert learning_rate_at(60, config) == 0.0
    with pytest.raises(ValueError, match="anneal_from"):
        PretrainConfig(data="x", out="y", steps=60, anneal_from=60)


def test_bad_corpus_items_are_skipped_with_a_summary(corpus, tmp_path, capsys):
    broken = tmp_path / "data"
    shutil.copytree(corpus, broken)
    import numpy as np
    import soundfile as sf

    sf.write(broken / "m3" / "wavs" / "quiet.wav", np.zeros(44_100, dtype=np.float32), 22_050)
    with (broken / "m3" / "metadata.csv").open("a") as handle:
        handle.write("missing|This clip does not exist.\nbad line without separator\nquiet|Nothing is said here.\n")
    pretrain(recipe(broken, tmp_path / "run", steps=1), progress=False)
    printed = capsys.readouterr().out
    assert "metadata.csv:7" in printed and "not found" in printed
    assert "metadata.csv:8" in printed
    assert "quiet.wav" in printed and "silent" in printed
    assert "skipped 3 problem(s)" in printed and "Training on the rest" in printed


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo")
def test_ddp_with_two_local_processes(corpus, tmp_path):
    config = tmp_path / "model.json"
    config.write_text(json.dumps(TINY_MODEL))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "chorus",
            "pretrain",
            str(corpus),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "4",
            "--config",
            str(config),
            "--threads",
            "1",
            "--max-frames",
            "700",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    bundle = load_bundle(tmp_path / "run" / "checkpoint")
    assert bundle.info["world_size"] == 2 and bundle.info["steps"] == 4


def test_optional_pitch_and_energy_predictors_train_from_the_corpus(corpus, tmp_path):
    config = recipe(corpus, tmp_path, steps=2)
    config.model = AcousticConfig(**TINY_MODEL, use_pitch=True, use_energy=True)
    bundle = load_bundle(pretrain(config, progress=False))
    mean, std = bundle.model.pitch_stats.tolist()
    assert 4.0 < mean < 6.5 and std > 0, "log-F0 statistics of espeak voices (55-650 Hz)"
    log = (tmp_path / "log.csv").read_text()
    assert log.count("\n") == 3
    out = bundle.model.infer(*[t[:1] for t in _encoded(bundle)], speaker_ids=torch.tensor([0]))
    assert out.pitch is not None and out.energy is not None


def _encoded(bundle):
    ids = bundle.front_end.encode(["A short test."])[0]
    return torch.tensor([ids]), torch.tensor([len(ids)])


def test_resume_continues_exactly_where_the_checkpoint_was_taken(corpus, tmp_path):
    """Stopping at step 3 and resuming to 7 gives the weights of one uninterrupted 7-step run
    (same data order across an epoch boundary, same optimizer moments and learning rate)."""
    straight = load_bundle(pretrain(recipe(corpus, tmp_path / "straight", steps=7), progress=False))
    pretrain(recipe(corpus, tmp_path / "resumed", steps=3), progress=False)
    resumed = load_bundle(pretrain(recipe(corpus, tmp_path / "resumed", steps=7), progress=False))
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name
    meta = load_training_state(tmp_path / "resumed" / "checkpoint").meta
    assert meta["epoch"] >= 1, "the 7 steps crossed an epoch boundary"


def test_interrupted_checkpoint_write_is_recovered(corpus, tmp_path):
    pretrain(recipe(corpus, tmp_path, steps=2), progress=False)
    # A kill between the two renames of an atomic write leaves only the moved-aside old folder.
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old-12345")
    pretrain(recipe(corpus, tmp_path, steps=4), progress=False)
    assert load_training_state(tmp_path / "checkpoint").meta["step"] == 4
    assert [int(line.split(",")[0]) for line in (tmp_path / "log.csv").read_text().splitlines()[1:]] == [2, 2, 4, 4]


def logged_steps(out: Path) -> list[int]:
    return [int(line.split(",")[0]) for line in (out / "log.csv").read_text().splitlines()[1:]]


def test_a_run_shorter_than_an_evaluation_logs_and_plots_its_last_step(corpus, tmp_path):
    """A researcher's probe: 20 steps under eval_every 250 left log.csv with its header alone, and no loss.png."""
    pretrain(dataclasses.replace(recipe(corpus, tmp_path, steps=3), eval_every=250, save_every=500), progress=False)
    assert logged_steps(tmp_path) == [3, 3] and (tmp_path / "loss.png").stat().st_size > 0


def test_features_made_from_another_corpus_are_refused(corpus, tmp_path):
    """The cache in OUT was trained on whatever DATA named (a missing folder too), and the checkpoint said DATA:
    a cache is tied to its corpus' contents (a copy elsewhere is the same corpus)."""
    out = tmp_path / "run"
    pretrain(recipe(corpus, out, steps=2), progress=False)
    moved = shutil.copytree(corpus, tmp_path / "moved")
    assert load_bundle(pretrain(recipe(moved, out, steps=4), progress=False)).info["steps"] == 4
    metadata = next(moved.glob("*/metadata.csv"))
    metadata.write_text(metadata.read_text().replace("|", "|Fixed: ", 1))
    with pytest.raises(ValueError, match="was made from another corpus than"):
        pretrain(recipe(moved, out, steps=6), progress=False)
    with pytest.raises(ValueError, match="no such folder"):
        pretrain(recipe(tmp_path / "nowhere", out, steps=6), progress=False)


def test_a_corpus_is_the_same_by_any_path_to_it(corpus, tmp_path, monkeypatch):
    """The review's catch: a refused metadata line was hashed with the path as typed, so the same corpus given
    relative and absolute were two corpora."""
    from chorus.training.pretrain import corpus_digest

    copy = shutil.copytree(corpus, tmp_path / "corpus")
    metadata = next(copy.glob("*/metadata.csv"))
    metadata.write_text(metadata.read_text() + "a line without its fields\n")
    monkeypatch.chdir(tmp_path)
    assert corpus_digest("corpus") == corpus_digest(copy) == corpus_digest(f"../{tmp_path.name}/corpus")
    metadata.write_text(metadata.read_text() + "another bad line\n")
    assert corpus_digest("corpus") != corpus_digest(corpus)
    metadata.write_bytes(b"\xff\xfe" + metadata.read_text().encode("utf-16-le"))  # a whole file refused: no line
    assert corpus_digest("corpus") == corpus_digest(copy) == corpus_digest(f"../{tmp_path.name}/corpus")


def test_ctrl_c_saves_the_step_it_stopped_at_and_the_run_goes_on_from_there(corpus, tmp_path, monkeypatch):
    """Ctrl-C had killed the run mid-step, silently, and a rerun went back to the last periodic checkpoint (up to
    499 steps): now the step under way ends, is logged and saved, and the same command resumes there."""
    step = _PretrainLoop._train_step

    def interrupted_at_3(self, positions):
        values = step(self, positions)
        if self.position.step == 3:
            signal.raise_signal(signal.SIGINT)  # as the terminal sends it: handled between steps
        return values

    monkeypatch.setattr(_PretrainLoop, "_train_step", interrupted_at_3)
    found = signal.getsignal(signal.SIGINT)  # Python's own, or SIG_IGN where the tests were started in the background
    with pytest.raises(RunInterrupted) as interrupted:
        pretrain(dataclasses.replace(recipe(corpus, tmp_path, steps=8), save_every=500), progress=False)
    assert interrupted.value.step == 3 and "the same command goes on from there" in str(interrupted.value)
    assert load_training_state(tmp_path / "checkpoint").meta["step"] == 3 and logged_steps(tmp_path)[-1] == 3
    assert signal.getsignal(signal.SIGINT) is found  # the handler the run found, again
    monkeypatch.undo()
    pretrain(recipe(corpus, tmp_path, steps=4), progress=False)
    assert load_training_state(tmp_path / "checkpoint").meta["step"] == 4


def test_options_a_resumed_run_cannot_follow_are_refused(corpus, tmp_path):
    """A researcher's probe: on resume, --config and --default-speaker were dropped without a word."""
    from typer.testing import CliRunner

    from chorus.cli import app

    pretrain(recipe(corpus, tmp_path, steps=2), progress=False)
    config = tmp_path / "model.json"
    config.write_text(json.dumps(TINY_MODEL))
    runner = CliRunner()
    base = ["pretrain", str(corpus), "--out", str(tmp_path), "--steps", "3", "--threads", "1"]
    result = runner.invoke(app, [*base, "--config", str(config)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--config applies to a new run" in result.output, result.output
    result = runner.invoke(app, [*base, "--default-speaker", "m3"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "whose default speaker is f2" in result.output, result.output


def test_a_base_warm_starts_on_more_speakers_keeping_the_ones_it_knows(tiny_base):
    """Issue 38's fallback: the shipped base goes on learning beside natural-sounding speakers it never heard."""
    from chorus.training.pretrain import warm_start

    base = load_bundle(tiny_base)
    started = warm_start(base, ["m3", "natural-x", "f2"], "m3")
    old, new = base.model.state_dict(), started.model.state_dict()
    assert set(old) == set(new)
    for name in old:
        if name != "speaker_embedding.weight":
            assert torch.equal(old[name], new[name]), name
    table = base.model.speaker_embedding.weight
    assert torch.equal(new["speaker_embedding.weight"][0], table[base.speakers.index("m3")])
    assert torch.equal(new["speaker_embedding.weight"][2], table[base.speakers.index("f2")])
    assert torch.allclose(new["speaker_embedding.weight"][1], table.mean(dim=0))
    assert started.speakers == ["m3", "natural-x", "f2"] and base.model.config.n_speakers == 2
    # The base's own voice is unchanged by the warm start: the same phonemes give the same spectra.
    phonemes = torch.tensor([[5, 9, 12, 7, 3]])
    with torch.no_grad():
        before = base.model.infer(phonemes, torch.tensor([5]), speaker_ids=torch.tensor([base.speakers.index("f2")]))
        after = started.model.infer(phonemes, torch.tensor([5]), speaker_ids=torch.tensor([2]))
    assert torch.equal(before.mel, after.mel)


def test_pretraining_reads_several_corpus_folders_from_a_warm_start(corpus, new_voice_data, tiny_base, tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app
    from chorus.training.pretrain import warm_start

    out = tmp_path / "natural"
    command = ["pretrain", str(corpus), str(new_voice_data), "--out", str(out), "--steps", "2", "--threads", "1"]
    result = CliRunner().invoke(app, [*command, "--init-from", str(tiny_base), "--learning-rate", "1e-4"])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(out / "checkpoint")
    assert bundle.speakers == ["f2", "f4", "m3"] and bundle.model.config.n_speakers == 3
    assert bundle.default_speaker == load_bundle(tiny_base).default_speaker == "m3"
    recipe_used = bundle.info["recipe"]
    assert recipe_used["init_from"] == str(tiny_base) and recipe_used["alignment_prior_steps"] == 0
    assert bundle.info["corpus"] == [str(corpus), str(new_voice_data)]
    # It speaks as its base did (vocoder, post-filter) until they are chosen for it.
    shipped_like = dict(load_bundle(tiny_base).info, default_vocoder="griffin-lim", postfilter={"global_variance": 1.5})
    shipped_like["showcase_speakers"] = ["m3"]
    assert warm_start(dataclasses.replace(load_bundle(tiny_base), info=shipped_like), ["m3"], "m3").info == {
        "default_vocoder": "griffin-lim",
        "postfilter": {"global_variance": 1.5},
        "showcase_speakers": ["m3"],
    }
    # The base's mel statistics rule (its decoder speaks in them), not the new corpus'.
    assert torch.equal(bundle.model.mel_mean, load_bundle(tiny_base).model.mel_mean)
    again = CliRunner().invoke(app, [*command, "--init-from", str(tiny_base)], env={"COLUMNS": "300"})
    assert again.exit_code == 2 and "--init-from applies to a new run" in again.output, again.output
    # Resumed, it keeps the schedule it began with (a review's catch: it went back to a new run's learning rate
    # and alignment prior, and its recipe forgot the warm start); another peak is refused, not taken.
    other = CliRunner().invoke(app, [*command[:-4], "--steps", "3", "--learning-rate", "1e-3"], env={"COLUMNS": "300"})
    assert other.exit_code == 2 and "--learning-rate 0.001" in other.output and "begun with 0.0001" in other.output
    resumed = CliRunner().invoke(app, [*command[:-4], "--steps", "3", "--threads", "1"])
    assert resumed.exit_code == 0, resumed.output
    kept = load_bundle(out / "checkpoint").info["recipe"]
    assert kept["learning_rate"] == 1e-4 and kept["alignment_prior_steps"] == 0 and kept["init_from"] == str(tiny_base)
    assert kept["steps"] == 3 and kept["model"] == dict(load_bundle(tiny_base).model.config.to_dict(), n_speakers=3)


def test_a_speaker_in_two_corpus_folders_is_refused(corpus, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(corpus / "m3", twin / "m3")
    with pytest.raises(ValueError, match="speaker 'm3' is in both"):
        pretrain(dataclasses.replace(recipe(corpus, tmp_path / "run", steps=1), data=[str(corpus), str(twin)]))


def test_one_corpus_folder_in_a_list_keeps_its_digest(corpus):
    """Feature caches made before several folders were taken stay valid for the same one folder."""
    from chorus.training.pretrain import corpus_digest

    assert corpus_digest([corpus]) == corpus_digest(corpus) != corpus_digest([corpus, corpus])
