"""The speaker encoder: shapes and unit-length embeddings for every trunk, the reversible stages'
gradients against plain autograd, activation memory flat in depth, and the AAM head's margin."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from chorus.adapters.voice import SPEAKER_FILE, WEIGHTS_FILE
from chorus.models.reversible import couple
from chorus.speaker_recognition.encoder import AdditiveAngularMargin, SpeakerEncoder, SpeakerEncoderConfig, Stage
from conftest import SMALL_SPEAKER_ENCODER, grads, saved_bytes, tiny_speaker_train_config

SMALL = SMALL_SPEAKER_ENCODER


@pytest.mark.parametrize("arch,depth", [("resnet", 10), ("resnet", 18), ("df-resnet", 56)])
@pytest.mark.parametrize("reversible", [False, True])
def test_embeddings_are_unit_vectors_for_any_length(arch, depth, reversible):
    torch.manual_seed(0)
    encoder = SpeakerEncoder(SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible, **SMALL)).eval()
    for frames in (40, 57):
        embedding = encoder(torch.randn(3, frames, 16))
        assert embedding.shape == (3, 16)
        torch.testing.assert_close(embedding.norm(dim=-1), torch.ones(3))


@pytest.mark.parametrize("arch", ["resnet", "df-resnet"])
def test_reversible_stage_gradients_equal_plain_autograd(arch):
    torch.manual_seed(0)
    stage = Stage(arch, 4, 8, blocks=3, stride=2, groups=2, rev=True).double()
    x = torch.randn(2, 4, 16, 20, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 8, 8, 10, dtype=torch.float64)
    (stage(x) * weight).sum().backward()
    ours, ours_x = grads(stage), x.grad.clone()
    stage.zero_grad(set_to_none=True)
    x.grad = None
    h = stage.transition(x)
    reference = torch.cat(couple(tuple(stage.blocks), *h.chunk(2, dim=1)), dim=1)  # plain autograd
    (reference * weight).sum().backward()
    assert ours.keys() == grads(stage).keys()
    for name, grad in grads(stage).items():
        torch.testing.assert_close(ours[name], grad, msg=name)
    torch.testing.assert_close(ours_x, x.grad)


def test_reversible_activation_memory_does_not_grow_with_depth():
    mel = torch.randn(2, 48, 16)

    def trunk_bytes(reversible: bool, arch: str, depth: int) -> int:
        torch.manual_seed(0)
        encoder = SpeakerEncoder(SpeakerEncoderConfig(arch=arch, depth=depth, reversible=reversible, **SMALL))
        return saved_bytes(lambda: encoder(mel))[0]

    for arch, depths in (("resnet", (10, 18, 34)), ("df-resnet", (56, 110))):
        reversible = [trunk_bytes(True, arch, d) for d in depths]
        plain = [trunk_bytes(False, arch, d) for d in depths]
        assert len(set(reversible)) == 1, (arch, reversible)  # flat: only stage outputs and transitions
        assert plain == sorted(plain) and plain[0] < plain[-1], (arch, plain)
        assert reversible[-1] < plain[-1] / 2, (arch, reversible, plain)


def test_aam_head_penalizes_the_true_class_by_its_margin():
    head = AdditiveAngularMargin(4, 3, margin=0.3, scale=10.0)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3, 4))
    embedding = torch.nn.functional.normalize(torch.tensor([[1.0, 0.5, 0.0, 0.0]]), dim=-1)
    plain = head.logits(embedding)
    margined = head.logits(embedding, torch.tensor([0]))
    theta = torch.acos(plain[0, 0] / 10.0)
    torch.testing.assert_close(margined[0, 0], 10.0 * torch.cos(theta + 0.3))
    torch.testing.assert_close(margined[0, 1:], plain[0, 1:])
    assert head(embedding, torch.tensor([0])) > torch.nn.functional.cross_entropy(plain, torch.tensor([0]))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="depth 19 is not one of 10, 18, 34, 50"):
        SpeakerEncoderConfig(depth=19)
    with pytest.raises(ValueError, match="unknown speaker encoder arch"):
        SpeakerEncoderConfig(arch="tdnn")
    with pytest.raises(ValueError, match="multiple of 2 x groups"):
        SpeakerEncoderConfig(channels=(8, 8, 16, 18), groups=2)
    config = SpeakerEncoderConfig(**SMALL)
    assert SpeakerEncoderConfig.from_dict(config.to_dict()) == config


def test_the_margin_is_zero_then_ramps_to_its_value():
    from chorus.training.speaker_encoder import SpeakerTrainConfig, margin_at

    config = SpeakerTrainConfig(corpus="", out="", steps=100, margin=0.2, margin_start=0.5, margin_full=0.8)
    margins = [margin_at(config, step) for step in range(1, 101)]
    assert margins[:51] == [0.0] * 51  # steps 1-51: done fraction 0.0-0.5
    assert margins[80:] == pytest.approx([0.2] * 20)
    assert all(a <= b for a, b in zip(margins, margins[1:]))
    assert margins[65] == pytest.approx(0.2 * (0.65 - 0.5) / 0.3)
    with pytest.raises(ValueError, match="margin_start <= margin_full"):
        SpeakerTrainConfig(corpus="", out="", margin_start=0.9, margin_full=0.5)


def test_eer_and_min_dcf():
    from chorus.speaker_recognition.verification import verification_scores

    perfect = verification_scores([0.9, 0.8, 0.2, 0.1], [True, True, False, False])
    assert perfect.eer == 0.0 and perfect.min_dcf == 0.0 and perfect.trials == 4 and perfect.targets == 2
    assert 0.2 < perfect.eer_threshold <= 0.8
    # One of four targets scores below one of four non-targets: at the crossing, 1 miss and 1 false alarm in 4.
    mixed = verification_scores([0.9, 0.8, 0.7, 0.3, 0.6, 0.2, 0.1, 0.0], [True] * 4 + [False] * 4)
    assert mixed.eer == pytest.approx(0.25)
    # minDCF at p=0.5 with unit costs is P_miss + P_fa at the best threshold: accept above 0.6, one miss of four.
    assert verification_scores(
        [0.9, 0.8, 0.7, 0.3, 0.6, 0.2, 0.1, 0.0], [True] * 4 + [False] * 4, p_target=0.5
    ).min_dcf == pytest.approx(0.25)
    rng = np.random.default_rng(0)
    chance = verification_scores(rng.normal(size=4000), rng.random(4000) < 0.5)
    assert 0.45 < chance.eer < 0.55
    with pytest.raises(ValueError, match="both same-speaker and different-speaker"):
        verification_scores([0.1, 0.2], [True, True])


@pytest.mark.parametrize("name", ["adam8bit", "sgd8bit"])
def test_8bit_optimizers_keep_every_state_of_every_tensor_in_8_bits(name):
    from chorus.training.speaker_encoder import speaker_optimizer

    encoder = SpeakerEncoder(SpeakerEncoderConfig(**SMALL))
    optimizer = speaker_optimizer(list(encoder.parameters()), name, 1e-3, 0.0)
    encoder(torch.randn(2, 40, 16)).sum().backward()
    optimizer.step()
    small = [p for p in encoder.parameters() if p.numel() < 4096]
    assert small  # bitsandbytes' default would keep these in 32 bits
    for p in encoder.parameters():
        states = [v for k, v in optimizer.state[p].items() if k.startswith("state")]
        assert states and all(s.dtype == torch.uint8 and s.shape == p.shape for s in states), (name, p.shape)


def test_training_saves_an_encoder_that_embeds_and_loads_back(two_voice_corpus, tmp_path):
    from chorus.speaker_recognition.bundle import load_encoder
    from chorus.training.speaker_encoder import train_speaker_encoder

    config = _tiny_config(two_voice_corpus, tmp_path / "encoder", steps=3, segment_frames=64, augment_copies=1)
    folder = train_speaker_encoder(config, progress=False)
    bundle = load_encoder(folder)
    assert bundle.info["speakers"] == 2 and bundle.info["train_clips"] == 2 * 4 * 2  # 4 clips + 1 copy each
    assert bundle.info["calibration"]["trials"] == 6 and -1 <= bundle.threshold <= 1
    clips = sorted((two_voice_corpus / "m3" / "wavs").glob("*.wav"))[:2]
    embeddings = bundle.embed(clips)
    assert embeddings.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    (folder / "encoder.safetensors").write_bytes(b"damaged")
    with pytest.raises(ValueError, match="cannot load the encoder's weights"):
        load_encoder(folder)


def test_speaker_commands(two_voice_corpus, tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app

    runner = CliRunner()
    encoder = tmp_path / "encoder"
    result = runner.invoke(
        app, ["speaker", "train", str(two_voice_corpus), "--out", str(encoder), "--steps", "1", "--depth", "10"]
    )
    assert result.exit_code == 0 and "held-out EER" in result.output, result.output
    m3 = sorted((two_voice_corpus / "m3" / "wavs").glob("*.wav"))
    f2 = sorted((two_voice_corpus / "f2" / "wavs").glob("*.wav"))
    out = tmp_path / "e.npy"
    result = runner.invoke(
        app, ["speaker", "embed", str(m3[0]), str(f2[0]), str(m3[1]), "--out", str(out), "--encoder", str(encoder)]
    )
    assert result.exit_code == 0, result.output
    rows = np.load(out)
    assert rows.shape == (3, 128)
    result = runner.invoke(app, ["speaker", "verify", str(m3[0]), str(m3[1]), "--encoder", str(encoder)])
    assert result.exit_code == 0 and "score" in result.output and "threshold" in result.output
    expected = float(rows[0] @ rows[2])
    assert f"score {expected:.3f}" in result.output  # the same embedding as `embed` gives
    trials = tmp_path / "trials.txt"
    trials.write_text(f"1 {m3[0]} {m3[1]}\n0 {m3[0]} {f2[0]}\n0 {m3[1]} {f2[1]}\n1 {f2[0]} {f2[1]}\n")
    result = runner.invoke(app, ["speaker", "eval", str(trials), "--encoder", str(encoder)])
    assert result.exit_code == 0 and "4 trials (2 same speaker): EER" in result.output, result.output
    trials.write_text("yes a b\n")
    result = runner.invoke(app, ["speaker", "eval", str(trials), "--encoder", str(encoder)])
    assert result.exit_code == 2 and "expected 'LABEL A B'" in " ".join(result.output.split())
    result = runner.invoke(app, ["speaker", "verify", str(m3[0]), str(m3[1]), "--encoder", str(tmp_path)])
    assert result.exit_code == 2 and "no speaker encoder here" in " ".join(result.output.split())


def test_eval_judges_similarity_with_the_encoder_beside_resemblyzer(two_voice_corpus, tmp_path):
    from typer.testing import CliRunner

    from chorus.cli import app
    from chorus.evaluation.report import EvalItem, Judges, evaluate_pairs
    from chorus.evaluation.similarity import EncoderJudge
    from chorus.speaker_recognition.bundle import EncoderBundle, save_encoder

    torch.manual_seed(0)
    bundle = EncoderBundle(SpeakerEncoder(SpeakerEncoderConfig(**{**SMALL, "n_mels": 80})))
    m3 = sorted((two_voice_corpus / "m3" / "wavs").glob("*.wav"))
    f2 = sorted((two_voice_corpus / "f2" / "wavs").glob("*.wav"))
    items = [EvalItem(f"{i}", clip, "text", speaker_references=[m3[0]]) for i, clip in enumerate([m3[0], f2[0]])]
    judges = Judges(whisper=None, speaker=None, naturalness=None, encoder=EncoderJudge(bundle))
    rows = evaluate_pairs(items, judges, progress=False).rows
    assert rows[0].encoder_similarity == pytest.approx(1.0, abs=1e-5)  # the reference itself
    assert rows[1].encoder_similarity < rows[0].encoder_similarity and rows[1].speaker_similarity is None
    folder = save_encoder(bundle, tmp_path / "encoder")
    clips = tmp_path / "clips"
    clips.mkdir()
    (clips / "a.wav").write_bytes(m3[1].read_bytes())
    (clips / "metadata.csv").write_text("a|The birch canoe slid on the smooth planks.\n")
    result = CliRunner().invoke(
        app,
        [
            "eval",
            str(clips),
            "--references",
            str(two_voice_corpus / "m3"),
            "--speaker-encoder",
            str(folder),
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["rows"][0]["encoder_similarity"] is not None and saved["rows"][0]["speaker_similarity"] is not None


def test_speaker_map_recovers_a_linear_map_and_picks_the_nearest_speaker():
    from chorus.speaker_recognition.start import fit_speaker_map

    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(30, 8))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    truth = rng.normal(size=(8, 4))
    vectors = embeddings @ truth + 0.5 + rng.normal(scale=0.01, size=(30, 4))
    mapping = fit_speaker_map(embeddings, vectors)
    assert mapping.leave_one_out_error < 0.01 and mapping.ridge <= 0.1
    probe = embeddings[7] + 0.01 * rng.normal(size=8)
    assert mapping.nearest(probe) == 7
    np.testing.assert_allclose(mapping.vector(probe), probe / np.linalg.norm(probe) @ truth + 0.5, atol=0.1)
    with pytest.raises(ValueError, match="at least 2 base speakers"):
        fit_speaker_map(embeddings[:1], vectors[:1])


def test_adapt_starts_from_the_speaker_encoder(tiny_base, new_voice_data, tmp_path):
    from safetensors.torch import load_file

    from chorus.adapters import parse_methods
    from chorus.data.formats import discover
    from chorus.models.bundle import load_bundle
    from chorus.recipe import AdaptConfig
    from chorus.speaker_recognition.bundle import EncoderBundle, save_encoder
    from chorus.speaker_recognition.start import speaker_map
    from chorus.training.adapt import adapt

    torch.manual_seed(0)
    encoder = EncoderBundle(SpeakerEncoder(SpeakerEncoderConfig(**{**SMALL, "n_mels": 80})))
    folder = save_encoder(encoder, tmp_path / "encoder")
    config = AdaptConfig(methods=parse_methods("lora"), steps=2, speaker_encoder=str(folder), max_frames=1500)
    result = adapt(new_voice_data, load_bundle(tiny_base), tmp_path / "voice", config, progress=False)
    notes = result.card.notes
    assert notes["start"] == "speaker encoder" and -1 <= notes["start_similarity"] <= 1
    # The card says how close the new voice's speech is to its own clips, by the same encoder.
    assert -1 <= result.card.metrics["encoder_similarity_to_clips"] <= 1
    # The voice's (frozen) speaker vector is where the map puts the clips' mean embedding.
    bundle = load_bundle(tiny_base)
    mapping = speaker_map(bundle, encoder)
    utterances, _ = discover(new_voice_data)  # the clips adapt embeds: the first 16, in this order
    embedding = encoder.embed([u.audio_path for u in utterances[:16]]).mean(0)
    assert notes["speaker_vector_start"] == bundle.speakers[mapping.nearest(embedding)]
    # A plain-LoRA voice keeps its untrained speaker vector apart from PEFT's weights (SPEAKER_FILE).
    tensors = {}
    for name in (WEIGHTS_FILE, SPEAKER_FILE):
        if (result.voice_dir / name).is_file():
            tensors |= load_file(str(result.voice_dir / name))
    [vector] = [v for k, v in tensors.items() if "speaker_vector" in k]
    torch.testing.assert_close(vector.flatten(), torch.from_numpy(mapping.vector(embedding)), atol=1e-5, rtol=1e-5)


_tiny_config = tiny_speaker_train_config


@pytest.mark.parametrize("optimizer", ["adam", "adam8bit"])  # 8-bit: bitsandbytes' nested states
def test_resuming_from_the_checkpoint_follows_the_uninterrupted_run(two_voice_corpus, tmp_path, monkeypatch, optimizer):
    from safetensors.torch import load_file

    import chorus.training.speaker_encoder as training
    from chorus.training.loss_log import read_log
    from chorus.training.speaker_encoder import CHECKPOINT, train_speaker_encoder

    straight = train_speaker_encoder(
        _tiny_config(two_voice_corpus, tmp_path / "straight", optimizer=optimizer), progress=False
    )

    def killed_after_saving(*args, **kwargs):  # the run dies right after its first checkpoint (step 2)
        save_checkpoint(*args, **kwargs)
        raise KeyboardInterrupt

    save_checkpoint = training.save_checkpoint
    monkeypatch.setattr(training, "save_checkpoint", killed_after_saving)
    half = tmp_path / "half"
    with pytest.raises(KeyboardInterrupt):
        train_speaker_encoder(_tiny_config(two_voice_corpus, half, optimizer=optimizer), progress=False)
    monkeypatch.setattr(training, "save_checkpoint", save_checkpoint)
    assert (half / CHECKPOINT / "training_state.safetensors").is_file() and (straight / "loss.png").is_file()
    assert not (half / "encoder.safetensors").exists()
    resumed = train_speaker_encoder(
        _tiny_config(two_voice_corpus, tmp_path / "resumed", optimizer=optimizer), progress=False, resume=half
    )
    ours, theirs = load_file(str(resumed / "encoder.safetensors")), load_file(str(straight / "encoder.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], msg=name)
    head = "head.weight"
    torch.testing.assert_close(
        load_file(str(resumed / CHECKPOINT / "training_state.safetensors"))[head],
        load_file(str(straight / CHECKPOINT / "training_state.safetensors"))[head],
    )
    straight_log, resumed_log = read_log(straight / "loss.csv"), read_log(tmp_path / "resumed" / "loss.csv")
    assert [r["loss"] for r in straight_log] == [r["loss"] for r in read_log(half / "loss.csv")] + [
        r["loss"] for r in resumed_log
    ]
    assert [int(r["step"]) for r in resumed_log] == [3, 4]
    # The encoder, checkpoint and loss curve share the run folder.
    assert {"encoder.safetensors", "config.json", CHECKPOINT, "loss.csv", "loss.png"} <= {
        p.name for p in resumed.iterdir()
    }
    with pytest.raises(ValueError, match="these fields differ: margin"):
        train_speaker_encoder(
            _tiny_config(two_voice_corpus, tmp_path / "other", optimizer=optimizer, margin=0.3), resume=half
        )
    with pytest.raises(ValueError, match="no speaker encoder checkpoint"):
        train_speaker_encoder(_tiny_config(two_voice_corpus, tmp_path / "other"), resume=tmp_path)


def test_training_crops_are_augmented_on_the_fly(two_voice_corpus):
    from chorus.audio.augment import Augmentation
    from chorus.audio.mel import MelConfig
    from chorus.training.speaker_encoder import prepare_clips, training_crop

    mel_config = MelConfig()
    config = _tiny_config(two_voice_corpus, "", augment_share=1.0, augmentation=Augmentation(channel=1.0))
    clips = prepare_clips(config, mel_config, progress=False)
    assert clips.augmentations == 0 and all(a.dtype == np.float16 for s in clips.train for a in s)
    rng = np.random.default_rng(0)
    crops = [training_crop(clips, 0, config, mel_config, rng) for _ in range(12)]
    assert all(mel.shape == (48, 80) for mel, _ in crops)
    assert all(any(d.startswith("channel") for d in done) for _, done in crops)
    clean = _tiny_config(two_voice_corpus, "", augment_share=0.0)
    assert all(training_crop(clips, 1, clean, mel_config, rng)[1] == [] for _ in range(5))
    # A phone line leaves nothing above 4 kHz in the mel (fmax 8 kHz: the top bins).
    phone = _tiny_config(
        two_voice_corpus,
        "",
        augment_share=1.0,
        augmentation=Augmentation(
            speed=0.0, tempo=0.0, reverb=0.0, noise=0.0, mic=0.0, channel=1.0, channels=("phone",)
        ),
    )
    mel, done = training_crop(clips, 0, phone, mel_config, rng)
    plain, _ = training_crop(clips, 0, clean, mel_config, np.random.default_rng(1))
    assert done == ["channel phone"] and mel[:, -10:].mean() < plain[:, -10:].mean() - 2.0


def test_speaker_commands_refuse_what_they_cannot_judge(two_voice_corpus, tmp_path):
    """A researcher's probe: two empty files, or silence against itself, were 'same speaker' (exit 0) through
    --encoder, and embed gave them unit vectors; a run's checkpoint verified at its placeholder threshold 0.5;
    training into a run folder replaced its run without a word; a bad --out or --p-target was found after (or
    instead of) the work; --threads 0 was a traceback; a corpus given by another path to the same folder was
    'another corpus'; --steps under the checkpoint's step went on silently."""
    import soundfile as sf
    from typer.testing import CliRunner

    from chorus.cli import app

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["speaker", *args], env={"COLUMNS": "400"})
        return result.exit_code, " ".join(result.output.split())

    encoder = tmp_path / "run"
    train = ["train", str(two_voice_corpus), "--out", str(encoder), "--steps", "2", "--depth", "10"]
    assert run(*train)[0] == 0
    empty, silence = tmp_path / "empty.wav", tmp_path / "silence.wav"
    sf.write(empty, np.zeros(0, np.float32), 22_050)
    sf.write(silence, np.zeros(3 * 22_050, np.float32), 22_050)
    speech = sorted((two_voice_corpus / "m3" / "wavs").glob("*.wav"))[0]
    for args in (["verify", str(empty), str(empty)], ["verify", str(silence), str(speech)]):
        code, said = run(*args, "--encoder", str(encoder))
        assert code == 2 and "cannot tell" in said and "of speech heard" in said, said
    code, said = run("embed", str(speech), str(silence), "--out", str(tmp_path / "e.npy"), "--encoder", str(encoder))
    assert code == 2 and f"{silence}: 0.0 s of speech heard" in said and not (tmp_path / "e.npy").exists()
    assert "no folder" in run("embed", str(speech), "--out", str(tmp_path / "nowhere" / "e.npy"))[1]
    assert "strictly between 0 and 1" in run("eval", str(tmp_path / "trials.txt"), "--p-target", "1")[1]
    code, said = run("verify", str(speech), str(speech), "--encoder", str(encoder / "checkpoint"))
    assert code == 2 and "never calibrated" in said, said
    code, said = run(*train)
    assert code == 2 and f"holds a run already (its checkpoint at step 2): --resume {encoder}" in said, said
    assert "threads must be positive" in run(*train[:2], "--out", str(tmp_path / "t"), "--threads", "0")[1]
    # The same corpus by its absolute path, one step on; then fewer steps than the checkpoint's
    absolute = [
        "train",
        str(two_voice_corpus.resolve()),
        "--out",
        str(encoder),
        "--depth",
        "10",
        "--resume",
        str(encoder),
    ]
    assert run(*absolute, "--steps", "3")[0] == 0
    code, said = run(*absolute, "--steps", "1")
    assert code == 2 and "its checkpoint is at step 3; --steps 1 is fewer" in said, said
    # A run's checkpoint judges trials (eval needs no threshold), and a run begun with --init resumes without it
    trials = tmp_path / "trials.txt"
    f2 = sorted((two_voice_corpus / "f2" / "wavs").glob("*.wav"))[0]
    trials.write_text(f"1 {speech} {speech}\n0 {speech} {f2}\n")
    assert run("eval", str(trials), "--encoder", str(encoder / "checkpoint"))[0] == 0
    tuned = tmp_path / "tuned"
    assert run("train", str(two_voice_corpus), "--out", str(tuned), "--steps", "2", "--init", str(encoder))[0] == 0
    assert run("train", str(two_voice_corpus), "--out", str(tuned), "--steps", "3", "--resume", str(tuned))[0] == 0
    assert json.loads((tuned / "config.json").read_text())["info"]["initialized_from"]["folder"] == str(encoder)


def test_ctrl_c_saves_the_speaker_encoders_step_and_resume_goes_on(two_voice_corpus, tmp_path, monkeypatch):
    """Ctrl-C had lost every step since the last checkpoint, without a word (up to 99 at the defaults)."""
    import signal

    from chorus.training.interrupts import RunInterrupted
    from chorus.training.speaker_encoder import CHECKPOINT, _SpeakerEncoderRecipe, train_speaker_encoder

    step = _SpeakerEncoderRecipe._optimizer_step

    def interrupted_at_3(self, mels, labels):
        loss = step(self, mels, labels)
        if self.step == 3:
            signal.raise_signal(signal.SIGINT)
        return loss

    monkeypatch.setattr(_SpeakerEncoderRecipe, "_optimizer_step", interrupted_at_3)
    config = _tiny_config(two_voice_corpus, tmp_path / "run", steps=6, checkpoint_every=100)
    with pytest.raises(RunInterrupted, match="--resume") as interrupted:
        train_speaker_encoder(config, progress=False)
    assert interrupted.value.step == 3 and not (tmp_path / "run" / "encoder.safetensors").exists()
    from chorus.training.checkpoint import load_training_state

    assert load_training_state(tmp_path / "run" / CHECKPOINT).meta["step"] == 3
    monkeypatch.undo()
    folder = train_speaker_encoder(config, progress=False, resume=tmp_path / "run")
    assert json.loads((folder / "config.json").read_text())["info"]["resumed_from_step"] == 3


def test_an_equal_error_threshold_next_to_the_top_score_is_a_number():
    """Ties at the top score had interpolated towards roc_curve's +inf threshold: NaN, which a trained encoder
    would have saved as its threshold."""
    from chorus.speaker_recognition.verification import verification_scores

    scores = verification_scores([0.5, 0.5, 0.5, 0.5], [1, 1, 0, 0])  # the probe's: threshold nan
    assert scores.eer == 0.5 and scores.eer_threshold == pytest.approx(0.5)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        verification_scores([0.2, 0.8], [0, 1], p_target=0)


def test_a_long_clip_is_embedded_in_pieces_under_the_bound(monkeypatch):
    """One pass over a 10-minute clip had held 1.8 GB: a clip over the bound goes through in equal pieces under
    it, their embeddings weighted by length and made unit again; a clip under it is one pass, as before."""
    from chorus.speaker_recognition import bundle as bundle_module
    from chorus.speaker_recognition.bundle import EncoderBundle

    torch.manual_seed(0)
    bundle = EncoderBundle(SpeakerEncoder(SpeakerEncoderConfig(**{**SMALL, "n_mels": 80})).eval())
    rate = bundle.mel_config.sample_rate
    audio = np.random.default_rng(0).standard_normal(int(2.5 * rate)).astype(np.float32) * 0.1
    whole = bundle.embed([audio])[0]
    passes = []
    forward = bundle.encoder.forward
    monkeypatch.setattr(bundle.encoder, "forward", lambda mel: passes.append(mel.shape[1]) or forward(mel))
    monkeypatch.setattr(bundle_module, "LONGEST_PASS_SECONDS", 1.0)
    pieced = bundle.embed([audio])[0]
    assert len(passes) == 3 and max(passes) <= rate // bundle.mel_config.hop_length + 1, passes
    pieces = np.array_split(audio, 3)
    expected = sum(p.size * bundle.embed([p])[0] for p in pieces)  # each piece alone is under the bound
    np.testing.assert_allclose(pieced, expected / np.linalg.norm(expected), atol=1e-6)
    assert np.linalg.norm(pieced) == pytest.approx(1.0, abs=1e-6) and not np.allclose(pieced, whole, atol=1e-3)
    short = audio[: rate // 2]
    passes.clear()
    np.testing.assert_array_equal(bundle.embed([short])[0], bundle.encoder(_mel(bundle, short))[0].detach().numpy())
    assert len(passes) == 2  # the short clip in one pass (and the reference's own)


def _mel(bundle, audio: np.ndarray) -> torch.Tensor:
    from chorus.audio.mel import log_mel

    return torch.from_numpy(log_mel(audio, bundle.mel_config)).unsqueeze(0)
