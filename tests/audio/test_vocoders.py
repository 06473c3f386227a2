"""Vocoders (registry, save/load, Griffin-Lim quality, Vocos shapes) and the vocoder training loop."""

from __future__ import annotations

import csv
import dataclasses
import shutil
import signal
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

from chorus.audio.io import load_audio
from chorus.audio.mel import MelConfig, MelSpectrogram
from chorus.audio.vocoders import (
    GriffinLim,
    Vocoder,
    VocoderError,
    Vocos,
    VocosConfig,
    build_vocoder,
    load_vocoder,
    register_vocoder,
    registered_vocoders,
)
from chorus.training.checkpoint import load_training_state
from chorus.training.interrupts import RunInterrupted
from chorus.training.vocoder import VocoderTrainConfig, train_vocoder

torch.set_num_threads(1)
SR = 22_050
TINY_VOCOS = VocosConfig(dim=32, intermediate_dim=64, num_layers=2)


def speech(tmp_path: Path) -> tuple[np.ndarray, tuple[float, float]]:
    """~3 s of espeak-ng speech at 22,050 Hz, or a harmonic chirp where espeak-ng is missing; with
    Griffin-Lim's bounds for it: (mel spectral convergence, mean |log-mel| error), measured x ~1.4."""
    espeak = shutil.which("espeak-ng")
    if espeak:
        wav = tmp_path / "speech.wav"
        subprocess.run([espeak, "-w", str(wav), "The quick brown fox jumps over the lazy dog."], check=True)
        return load_audio(wav)[: 3 * SR], (0.12, 0.27)  # measured 0.083, 0.19
    t = np.arange(3 * SR) / SR
    phase = 2 * np.pi * np.cumsum(120 + 60 * t) / SR
    return (0.1 * sum(np.sin(k * phase) / k for k in range(1, 20))).astype(np.float32), (0.16, 0.5)  # 0.113, 0.36


def make_dataset(root: Path) -> Path:
    """Two speakers, LJSpeech layout, 1.2 s harmonic 'voices'; one file at 16 kHz to be resampled."""
    rng = np.random.default_rng(0)
    for speaker, f0 in (("low", 110.0), ("high", 210.0)):
        wavs = root / speaker / "wavs"
        wavs.mkdir(parents=True)
        lines = []
        for index, rate in enumerate((SR, SR, 16_000)):
            t = np.arange(int(1.2 * rate)) / rate
            phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))) / rate
            voice = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t))
            audio = 0.2 * voice + 0.01 * rng.standard_normal(t.size)
            sf.write(wavs / f"{speaker}_{index}.wav", audio.astype(np.float32), rate)
            lines.append(f"{speaker}_{index}|text")
        (root / speaker / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def tiny_train_config(**changes) -> VocoderTrainConfig:
    config = VocoderTrainConfig(
        vocoder=TINY_VOCOS,
        batch_size=2,
        min_segment_seconds=0.3,
        max_segment_seconds=0.4,
        learning_rate=3e-3,
        warmup_steps=2,
        log_every=1,
        checkpoint_every=10,
    )
    return replace(config, **changes)


def read_log(out: Path) -> list[dict]:
    with (out / "loss.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


# ---------------------------------------------------------------------------------- registry, I/O


def test_registry_lists_builtins_and_explains_unknown_names():
    assert {"griffin-lim", "vocos"} <= set(registered_vocoders())
    with pytest.raises(VocoderError, match="registered vocoders: .*griffin-lim.*vocos"):
        build_vocoder("hifigan")
    # A new user's probe: "vocos" was offered by name, and needs trained weights (a folder) to load.
    with pytest.raises(VocoderError, match="by name: griffin-lim$"):
        load_vocoder("no-such-vocoder")
    with pytest.raises(VocoderError, match="needs trained weights"):
        load_vocoder("vocos")
    with pytest.raises(VocoderError, match="bad config"):
        build_vocoder("vocos", width=3)
    assert isinstance(load_vocoder("griffin-lim"), GriffinLim)


def test_save_load_round_trip_gives_identical_output(tmp_path):
    mel = torch.randn(2, 20, 80) - 4
    for vocoder in (
        build_vocoder("vocos", dim=32, intermediate_dim=64, num_layers=2),
        build_vocoder("griffin-lim", n_iter=4),
    ):
        folder = vocoder.save(tmp_path / vocoder.name)
        assert sorted(p.name for p in folder.iterdir()) == ["vocoder.json", "vocoder.safetensors"]
        loaded = load_vocoder(folder, mel_config=MelConfig())
        assert type(loaded) is type(vocoder) and loaded.config == vocoder.config
        with torch.no_grad():
            assert torch.equal(loaded(mel), vocoder.eval()(mel))


def test_mel_config_mismatch_is_refused(tmp_path):
    folder = Vocos(TINY_VOCOS).save(tmp_path / "v")
    with pytest.raises(VocoderError, match="different mel features.*fmax 8000.0 != 11025.0"):
        load_vocoder(folder, mel_config=MelConfig(fmax=11025.0))
    (folder / "vocoder.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(VocoderError, match="cannot load weights"):
        load_vocoder(folder)


def test_user_vocoder_plugs_in(tmp_path):
    @dataclass(frozen=True)
    class LinearConfig:
        scale: float = 1.0

    @register_vocoder("test-linear")
    class LinearVocoder(Vocoder):
        config_class = LinearConfig

        def __init__(self, config=LinearConfig(), mel_config=MelConfig()):
            super().__init__(config, mel_config)
            self.net = torch.nn.Conv1d(mel_config.n_mels, mel_config.hop_length, 1)

        def forward(self, log_mel):
            return self.config.scale * self.net(log_mel.transpose(1, 2)).transpose(1, 2).flatten(1)

    vocoder = build_vocoder("test-linear", scale=0.5)
    loaded = load_vocoder(vocoder.save(tmp_path / "mine"))
    mel = torch.randn(1, 9, 80)
    assert loaded.vocode(mel[0]).shape == (9 * 256,)
    assert np.array_equal(loaded.vocode(mel), vocoder.vocode(mel))
    with pytest.raises(VocoderError, match="expects log-mel"):
        vocoder.vocode(torch.randn(9, 64))


# ---------------------------------------------------------------------------------------- vocoders


def test_griffin_lim_reconstructs_real_speech(tmp_path):
    audio, (max_convergence, max_log_error) = speech(tmp_path)
    audio = torch.from_numpy(audio)
    to_mel = MelSpectrogram()
    log_mel = to_mel(audio)[None]
    with torch.inference_mode():
        output = GriffinLim()(log_mel)
    assert output.shape == (1, log_mel.shape[1] * 256)
    rebuilt = to_mel(output[:, : audio.numel()])
    target = log_mel.exp()
    convergence = float(torch.linalg.norm(rebuilt.exp() - target) / torch.linalg.norm(target))
    assert convergence < max_convergence
    assert float((rebuilt - log_mel).abs().mean()) < max_log_error


def test_griffin_lim_handles_short_inputs_sharpening_and_odd_hops():
    sharpening = GriffinLim(replace(GriffinLim().config, n_iter=2, power=1.3))
    odd_hop = GriffinLim(replace(GriffinLim().config, n_iter=2), MelConfig(hop_length=300))  # 1024 % 300 != 0
    for frames in (1, 2, 5):
        assert sharpening(torch.randn(2, frames, 80) - 5).shape == (2, frames * 256)
        output = odd_hop(torch.randn(1, frames, 80) - 5)
        assert output.shape == (1, frames * 300) and torch.isfinite(output).all()


def test_vocos_shapes_and_default_size():
    vocoder = Vocos(TINY_VOCOS)
    for frames in (1, 7):
        assert vocoder(torch.randn(2, frames, 80)).shape == (2, frames * 256)
    parameters = sum(p.numel() for p in Vocos().parameters())
    assert 1e6 < parameters < 4e6


# ---------------------------------------------------------------------------------------- training


def test_training_reduces_loss_and_writes_a_loadable_vocoder(tmp_path):
    data = make_dataset(tmp_path / "data")
    out = tmp_path / "run"
    result = train_vocoder(data, out, tiny_train_config(), steps=20, show_progress=False)
    log = read_log(out)
    assert result.step == 20 and [int(row["step"]) for row in log] == list(range(1, 21))
    # The total jumps with the crops drawn (the 16 kHz file has no energy above 8 kHz, which the
    # log-magnitude term weighs heavily), so compare the terms that move steadily.
    for term, factor in (("mel_l1", 0.6), ("stft_sc", 0.98)):
        values = [float(row[term]) for row in log]
        assert np.mean(values[-5:]) < factor * np.mean(values[:3]), (term, values)
    for name in ("loss.png", "samples/reference.wav", "samples/step_000020.wav", "checkpoint/training_state.json"):
        assert (out / name).is_file(), name
    vocoder = load_vocoder(out, mel_config=MelConfig())
    assert isinstance(vocoder, Vocos) and vocoder.config == TINY_VOCOS


def test_resume_continues_exactly_where_it_stopped(tmp_path):
    """With both discriminators on, so their weights and optimizer are checkpointed too."""
    data = make_dataset(tmp_path / "data")
    config = tiny_train_config(
        discriminators=("period", "resolution"), discriminator_channels=4, period_channels=(4, 4)
    )
    train_vocoder(data, tmp_path / "straight", config, steps=4, show_progress=False)
    train_vocoder(data, tmp_path / "resumed", config, steps=2, show_progress=False)
    with pytest.raises(FileExistsError):
        train_vocoder(data, tmp_path / "resumed", config, steps=4, show_progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        train_vocoder(
            data, tmp_path / "resumed", replace(config, batch_size=3), steps=4, resume=True, show_progress=False
        )
    result = train_vocoder(data, tmp_path / "resumed", None, steps=4, resume=True, show_progress=False)
    assert result.step == 4
    assert [row["step"] for row in read_log(tmp_path / "resumed")] == ["1", "2", "3", "4"]
    straight = load_file(tmp_path / "straight" / "checkpoint" / "training_state.safetensors")
    resumed = load_file(tmp_path / "resumed" / "checkpoint" / "training_state.safetensors")
    assert straight.keys() == resumed.keys() and any(k.startswith("discriminator.") for k in straight)
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)
    straight = load_file(tmp_path / "straight" / "vocoder.safetensors")
    resumed = load_file(tmp_path / "resumed" / "vocoder.safetensors")
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


def test_weights_only_checkpoint_keeps_no_optimizer_and_resumes(tmp_path):
    data = make_dataset(tmp_path / "data")
    config = tiny_train_config(discriminators=("period",), period_channels=(4, 4), checkpoint_optimizers=False)
    train_vocoder(data, tmp_path / "run", config, steps=2, show_progress=False)
    state = load_file(tmp_path / "run" / "checkpoint" / "training_state.safetensors")
    assert state and all(key.startswith("discriminator.parts.period.") for key in state)
    before = load_file(tmp_path / "run" / "vocoder.safetensors")
    result = train_vocoder(data, tmp_path / "run", None, steps=4, resume=True, show_progress=False)
    assert result.step == 4 and [row["step"] for row in read_log(tmp_path / "run")] == ["1", "2", "3", "4"]
    after = load_file(tmp_path / "run" / "vocoder.safetensors")
    assert any(not torch.equal(before[key], after[key]) for key in before)


def test_ctrl_c_saves_the_step_it_stopped_at_and_steps_or_threads_under_one_are_refused(tmp_path, monkeypatch):
    """A researcher's probe: Ctrl-C lost the steps since the last checkpoint (up to 499) without a word; --steps 0
    printed 'saved in OUT' over a folder with no vocoder; --threads 0 was a traceback from torch."""
    from chorus.training.vocoder import _VocoderLoop

    data = make_dataset(tmp_path / "data")
    for steps, threads in ((0, 1), (2, 0)):
        with pytest.raises(ValueError, match="steps and threads must be at least 1"):
            train_vocoder(data, tmp_path / "none", tiny_train_config(), steps=steps, threads=threads)
    step = _VocoderLoop._train_step

    def interrupted_at_3(self, index, lr):
        terms = step(self, index, lr)
        if index == 2:  # the third step
            signal.raise_signal(signal.SIGINT)
        return terms

    monkeypatch.setattr(_VocoderLoop, "_train_step", interrupted_at_3)
    with pytest.raises(RunInterrupted) as interrupted:
        train_vocoder(data, tmp_path / "run", tiny_train_config(log_every=5), steps=10, show_progress=False)
    assert interrupted.value.step == 3
    assert load_training_state(tmp_path / "run" / "checkpoint").meta["step"] == 3
    assert [row["step"] for row in read_log(tmp_path / "run")] == ["3"] and (tmp_path / "run" / "loss.png").is_file()
    monkeypatch.undo()
    assert train_vocoder(data, tmp_path / "run", None, steps=4, resume=True, show_progress=False).step == 4
    done = train_vocoder(data, tmp_path / "run", None, steps=4, resume=True, show_progress=False)  # nothing to train
    assert done.step == 4 and done.losses == {}


def test_period_discriminator_sees_every_period_and_any_length():
    from chorus.training.vocoder import Discriminators, VocoderTrainConfig

    config = VocoderTrainConfig(discriminators=("period", "resolution"), period_channels=(4, 8))
    discriminators = Discriminators(config)
    outputs = discriminators(torch.randn(2, 4001))  # a length no period divides
    assert len(outputs) == len(config.periods) + len(config.stft_resolutions)
    for period, features in zip(config.periods, outputs):
        assert [f.shape[1] for f in features] == [4, 8, 1]
        assert features[-1].shape[0] == 2 and features[-1].shape[-1] == period
    with pytest.raises(ValueError, match="unknown discriminators"):
        VocoderTrainConfig(discriminators=("wavelet",))


def test_interrupted_checkpoint_write_is_recovered(tmp_path):
    data = make_dataset(tmp_path / "data")
    train_vocoder(data, tmp_path / "run", tiny_train_config(), steps=2, show_progress=False)
    # A kill between the two renames of an atomic write leaves only the moved-aside old folder.
    (tmp_path / "run" / "checkpoint").rename(tmp_path / "run" / ".checkpoint.old-12345")
    with pytest.raises(FileExistsError):  # the put-back checkpoint is there to resume, not to overwrite
        train_vocoder(data, tmp_path / "run", None, steps=3, show_progress=False)
    assert train_vocoder(data, tmp_path / "run", None, steps=3, resume=True, show_progress=False).step == 3
    assert load_training_state(tmp_path / "run" / "checkpoint").meta["step"] == 3
    assert [row["step"] for row in read_log(tmp_path / "run")] == ["1", "2", "3"]


def test_fine_tuning_on_teacher_forced_mels_starts_from_the_given_vocoder(tiny_base, two_voice_corpus, tmp_path):
    """GTA fine-tuning: crops of the model's forced mels line up with the recording's samples, and a
    run with --init-from starts from that vocoder's weights (at a vanishing learning rate it stays there)."""
    from chorus.models.bundle import load_bundle
    from chorus.training.vocoder import AlignedSampler, train_vocoder_command

    bundle = load_bundle(tiny_base)
    sampler = AlignedSampler([two_voice_corpus], bundle, clips_per_voice=2)
    hop = bundle.mel_config.hop_length
    assert len(sampler.mels) == 4 and all(len(a) == len(m) * hop for a, m in zip(sampler.audio, sampler.mels))
    audio, mels = sampler.batch(np.random.default_rng(0), 6, frames=20)
    assert audio.shape == (6, 20 * hop) and mels.shape == (6, 20, bundle.mel_config.n_mels)
    for clip, mel in zip(audio, mels):  # each crop is one clip's frames [s, s+20) and samples [s*hop, (s+20)*hop)
        assert any(
            torch.equal(mel, m[s : s + 20]) and torch.equal(clip, a[s * hop : (s + 20) * hop])
            for m, a in zip(sampler.mels, sampler.audio)
            for s in range(len(m) - 19)
        )

    start = train_vocoder(two_voice_corpus, tmp_path / "start", tiny_train_config(), steps=2, show_progress=False)
    tuned = train_vocoder_command(
        [two_voice_corpus],
        tmp_path / "tuned",
        steps=2,
        resume=True,
        threads=1,
        init_from=start.out_dir,
        aligned_model=tiny_base,
        aligned_clips=2,
        learning_rate=1e-12,
    )
    before = load_file(start.out_dir / "vocoder.safetensors")
    after = load_file(tuned.out_dir / "vocoder.safetensors")
    assert all(torch.allclose(after[key], before[key], atol=1e-6) for key in before)
    saved = load_training_state(tuned.out_dir / "checkpoint").meta["config"]
    assert saved["init_from"] == str(start.out_dir) and saved["aligned_model"] == str(tiny_base)
    assert saved["vocoder"] == dataclasses.asdict(TINY_VOCOS)
    with pytest.raises(FileNotFoundError, match="no speaker folder named after"):
        AlignedSampler([tmp_path], bundle, clips_per_voice=1)

    # A metadata line whose clip is gone is skipped, as pretraining skips it (it had ended the run).
    broken = shutil.copytree(two_voice_corpus, tmp_path / "broken")
    gone = sorted((broken / "f2" / "wavs").glob("*.wav"))[0]
    gone.unlink()
    sampler = AlignedSampler([broken], bundle, clips_per_voice=2)
    assert len(sampler.mels) == 4 and sampler.skipped == [f"{gone}: audio file not found"], sampler.skipped


def test_adversarial_fine_tuning_starts_from_the_runs_discriminators_on_mixed_batches(
    tiny_base, two_voice_corpus, tmp_path
):
    """--init-from a GAN run takes its discriminators too; half of each batch is the model's forced mels."""
    config = tiny_train_config(discriminators=("period", "resolution"), discriminator_channels=4, period_channels=(4,))
    start = train_vocoder(two_voice_corpus, tmp_path / "start", config, steps=2, show_progress=False)
    tuned_config = replace(
        config,
        init_from=str(start.out_dir),
        aligned_model=str(tiny_base),
        aligned_clips_per_voice=2,
        aligned_fraction=0.5,
        learning_rate=1e-12,
    )
    tuned = train_vocoder(two_voice_corpus, tmp_path / "tuned", tuned_config, steps=1, show_progress=False)
    before = load_training_state(start.out_dir / "checkpoint").tensors
    after = load_training_state(tuned.out_dir / "checkpoint").tensors
    keys = [key for key in before if key.startswith("discriminator.")]
    assert keys and all(torch.allclose(after[key], before[key], atol=1e-6) for key in keys)
    assert np.isfinite(tuned.losses["loss"])
