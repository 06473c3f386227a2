"""Adapting a Piper generator (both recipes: aligned durations, and a posterior encoder) on a toy-size generator and two short clips."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from chorus.adapters import active_adapter, adapter_names, base_state_dict
from chorus.adapters.voice import VoiceError
from chorus.data.check import speech_seconds
from chorus.data.formats import discover
from chorus.models.piper_vits import PiperGenerator
from chorus.peers.piper import PiperVoiceConfig
from chorus.synthesis.bases.piper import load_piper_voice
from chorus.training.loss_log import read_log
from chorus.training.piper_adapt import (
    PLACEMENTS,
    VOICE,
    Adversary,
    PiperAdaptConfig,
    SegmentLoss,
    adapt_piper,
    align_durations,
    attach_voice,
    load_posterior,
    posterior_step_terms,
    prepare_clips,
    train,
    train_posterior,
)
from chorus.training.vocoder import load_discriminators
from conftest import tiny_piper_config

# Joe's layout (type-2 residual blocks, upsampling 8 x 8 x 4) at toy widths.
TINY = tiny_piper_config()
# Pad, start and end as Piper's maps have them; then the IPA symbols espeak-ng gives the test sentences.
SYMBOLS = "abcdefhijklmnoprstuvwzæðŋɐɑɔəɚɛɜɡɪɹʃʊʌʒˈˌː "
ID_MAP = {"_": [0], "^": [1], "$": [2], **{s: [3 + i] for i, s in enumerate(SYMBOLS)}}
TEXTS = ["Hello there.", "It is a fine day."]
NOISELESS = dict(noise_scale=0.0, length_scale=1.0, noise_w=0.0)


@pytest.fixture
def tiny() -> PiperGenerator:
    torch.manual_seed(0)
    voice = PiperVoiceConfig(sample_rate=22_050, language="en-us", id_map=ID_MAP)
    return PiperGenerator(TINY, voice).eval()


def speak(generator: PiperGenerator) -> torch.Tensor:
    ids = torch.tensor([generator.voice.text_ids(TEXTS[0])])
    with torch.inference_mode():
        return generator(ids, torch.tensor([ids.shape[1]]), **NOISELESS).audio


def test_aligned_durations_cover_the_recording(tiny, tone_clips) -> None:
    clips = prepare_clips(tiny, discover(tone_clips)[0])
    for clip in clips:
        assert clip.durations.min() >= 1 and len(clip.durations) == len(clip.ids)
        assert clip.frames * tiny.hop_length == len(clip.audio)
        assert torch.equal(align_durations(tiny, clip.ids, clip.audio), clip.durations)


# Each placement on the prior's mean; and the decoder alone on noisy latents (recomputed every step, no grad).
@pytest.mark.parametrize(("placement", "noise_scale"), [(p, 0.0) for p in PLACEMENTS] + [("decoder", 0.667)])
def test_only_the_voice_trains_and_the_base_stays_bit_identical(tiny, tone_clips, placement, noise_scale) -> None:
    clips = prepare_clips(tiny, discover(tone_clips)[0])
    before_audio = speak(tiny)
    before = {k: v.clone() for k, v in base_state_dict(tiny).items()}
    config = PiperAdaptConfig(
        placement=placement, steps=3, batch_size=2, segment_frames=16, learning_rate=1e-2, noise_scale=noise_scale
    )
    model, trainable = attach_voice(tiny, config)
    initial = [p.detach().clone() for p in trainable]
    train(model, clips, trainable, config)
    after = base_state_dict(tiny)
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert any(not torch.equal(p, q) for p, q in zip(trainable, initial)), "no adapter tensor moved"
    assert all(p.requires_grad == any(p is q for q in trainable) for p in tiny.parameters())
    with active_adapter(tiny, None):
        assert torch.equal(speak(tiny), before_audio)
    assert not torch.equal(speak(tiny), before_audio)


def test_full_fine_tuning_trains_a_copy(tiny, tone_clips) -> None:
    clips = prepare_clips(tiny, discover(tone_clips)[0])
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    config = PiperAdaptConfig(placement="full", steps=2, batch_size=2, segment_frames=16, learning_rate=1e-3)
    model, trainable = attach_voice(tiny, config)
    train(model, clips, trainable, config)
    assert model is not tiny and all(torch.equal(tiny.state_dict()[k], v) for k, v in before.items())
    assert any(not torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_the_loss_goes_down_on_one_clip(tiny, tone_clips) -> None:
    clips = prepare_clips(tiny, discover(tone_clips)[0][:1])
    # One window holding the whole clip: the same target every step, so the loss must fall.
    config = PiperAdaptConfig(
        placement="all", steps=20, batch_size=1, segment_frames=80, context_frames=0, learning_rate=1e-2, log_every=5
    )
    model, trainable = attach_voice(tiny, config)
    rows, steps, _ = train(model, clips, trainable, config)
    assert steps == 20 and rows[-1]["loss"] < 0.9 * rows[0]["loss"]


@pytest.mark.parametrize("recipe", ["posterior", "aligned"])
def test_a_saved_voice_loads_back_and_speaks_the_same(tiny, tone_clips, tiny_posterior, tmp_path, recipe) -> None:
    fresh = copy.deepcopy(tiny)
    config = PiperAdaptConfig(
        placement="all", recipe=recipe, posterior=tiny_posterior, steps=3, batch_size=2, segment_frames=16,
        learning_rate=1e-2, threads=torch.get_num_threads() + 1,
    )  # fmt: skip
    threads = torch.get_num_threads()
    result = adapt_piper(tone_clips, tiny, tmp_path / "voice", config, base_sha256="a" * 64)
    assert result.voice_dir is not None and (tmp_path / "voice.log.csv").is_file()
    # The posterior recipe measures the voice's pace and records the prior noise it speaks at.
    assert (result.card.length_scale != 1.0, result.card.noise_scale) == (
        (True, PiperAdaptConfig().speak_noise_scale) if recipe == "posterior" else (False, None)
    )
    assert result.card.trainable_parameters == sum(p.numel() for p in result.model.parameters() if p.requires_grad)
    # A copy trained: the caller's generator stays bare, to adapt again (a library user's probe: the second call
    # had found the first voice's adapter and refused), and torch's thread count is the caller's again.
    assert not adapter_names(tiny) and torch.get_num_threads() == threads
    # The speech a voice-activity detector hears, as the data check counts it (of these gliding tones, most).
    heard = sum(speech_seconds(*sf.read(u.audio_path, dtype="float32")) for u in discover(tone_clips)[0]) / 60
    assert result.card.speech_minutes == pytest.approx(heard, abs=0.002) and heard < result.card.data_minutes
    load_piper_voice(fresh, result.voice_dir, VOICE, base_sha256="a" * 64)
    assert torch.equal(speak(fresh), speak(result.model))
    with pytest.raises(VoiceError, match="was made on base"):
        load_piper_voice(copy.deepcopy(fresh), result.voice_dir, "other", base_sha256="b" * 64)


def test_the_posterior_step_is_the_one_training_takes(tiny, tone_clips, tiny_posterior) -> None:
    """posterior_step_terms, which chorus.memory.piper measures and predicts, is train_posterior's step: the
    first step's logged loss is the same step taken again on the same batch, windows and seeds."""
    clips = prepare_clips(tiny, discover(tone_clips)[0], align=False)
    config = PiperAdaptConfig(posterior=tiny_posterior, steps=1, batch_size=2, segment_frames=16, log_every=1)
    twin = copy.deepcopy(tiny)
    torch.manual_seed(0)
    model, trainable = attach_voice(tiny, config)
    posterior = load_posterior(config)
    torch.manual_seed(1)  # the posterior's draw of each latent
    rows, steps, _ = train_posterior(model, posterior, clips, trainable, config)

    torch.manual_seed(0)
    again, _ = attach_voice(twin, config)
    posterior = load_posterior(config).train()
    rng = np.random.default_rng(config.seed)  # the loop's draws: the batch, then each clip's window
    batch = [clips[i] for i in rng.choice(len(clips), size=2, replace=False)]
    starts = [int(rng.integers(0, max(1, c.frames - config.segment_frames) + 1)) for c in batch]
    torch.manual_seed(1)
    terms = posterior_step_terms(
        again.train(), posterior, SegmentLoss(again, config.stft_weight), batch, starts, config
    )
    assert steps == 1 and rows[0]["loss"] == round(float(terms["loss"].detach()), 4)


# A chorus train-vocoder checkpoint committed with the shipped vocoder's history (22,050 Hz, as joe).
VOCODER_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "vocoder-gta" / "checkpoint"


def test_the_adversary_trains_its_discriminators_and_passes_gradients_to_the_windows() -> None:
    adversary = Adversary.from_checkpoint(VOCODER_CHECKPOINT, 22_050)
    before = [p.detach().clone() for p in adversary.discriminators.parameters()]
    torch.manual_seed(0)
    generated = (0.1 * torch.randn(2, 4096)).requires_grad_()
    terms = adversary(generated, 0.1 * torch.randn(2, 4096))
    assert any(not torch.equal(p, q) for p, q in zip(adversary.discriminators.parameters(), before))
    own = [p.grad.clone() for p in adversary.discriminators.parameters()]  # their update's gradients
    (terms["adversarial"] + terms["feature_matching"]).backward()
    assert generated.grad is not None and generated.grad.abs().sum() > 0
    # The generator's terms added nothing to the discriminators' gradients (they were frozen for them).
    assert all(torch.equal(p.grad, g) for p, g in zip(adversary.discriminators.parameters(), own))


def test_discriminators_of_another_sample_rate_are_refused() -> None:
    with pytest.raises(ValueError, match="judge 22050 Hz audio; this base speaks at 16000 Hz"):
        Adversary.from_checkpoint(VOCODER_CHECKPOINT, 16_000)


def test_discriminators_join_the_posterior_recipe_only() -> None:
    with pytest.raises(ValueError, match="posterior recipe's loss only"):
        PiperAdaptConfig(recipe="aligned", discriminators=str(VOCODER_CHECKPOINT))


def test_a_folder_without_discriminators_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="no discriminators saved there"):
        load_discriminators(tmp_path)


def test_the_posterior_recipe_logs_the_adversarial_terms(tiny, tone_clips, tiny_posterior, tmp_path) -> None:
    config = PiperAdaptConfig(
        posterior=tiny_posterior, steps=2, batch_size=2, segment_frames=16, log_every=1,
        discriminators=str(VOCODER_CHECKPOINT),
    )  # fmt: skip
    result = adapt_piper(tone_clips, tiny, tmp_path / "voice", config, "a" * 64)
    logged = read_log(tmp_path / "voice.log.csv")
    assert result.card.steps == 2 and len(logged) == 2
    assert all(float(row["adversarial"]) > 0 and float(row["discriminator"]) > 0 for row in logged)
    assert result.card.notes["discriminators"] == str(VOCODER_CHECKPOINT)
