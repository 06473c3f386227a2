"""The acoustic model: shapes, alignment search, sizes on the meta device, checkpoints."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from chorus.audio.mel import MelConfig
from chorus.models.acoustic import (
    build_model,
    count_parameters,
)
from chorus.models.alignment import durations_to_path, monotonic_alignment_search
from chorus.models.bundle import CheckpointError, ModelBundle, load_bundle, save_bundle
from chorus.models.config import AcousticConfig
from chorus.text import TextFrontEnd
from conftest import tiny_batch, tiny_config, tiny_model


def brute_force_best_path(log_prob):
    """Best monotonic path by enumerating every duration split (tiny sizes only)."""
    n_text, n_frames = log_prob.shape
    best, best_durations = -float("inf"), None
    for cuts in itertools.combinations(range(1, n_frames), n_text - 1):
        bounds = (0, *cuts, n_frames)
        score = sum(log_prob[i, bounds[i] : bounds[i + 1]].sum() for i in range(n_text))
        if score > best:
            best, best_durations = score, [bounds[i + 1] - bounds[i] for i in range(n_text)]
    return best_durations


@pytest.mark.parametrize("n_text,n_frames", [(1, 4), (3, 3), (3, 7), (4, 9)])
def test_alignment_search_finds_the_best_monotonic_path(n_text, n_frames):
    torch.manual_seed(n_text * 10 + n_frames)
    log_prob = torch.randn(1, n_text, n_frames)
    path = monotonic_alignment_search(log_prob, torch.tensor([n_text]), torch.tensor([n_frames]))
    assert path.sum(1).eq(1).all(), "every frame belongs to exactly one token"
    assert path[0].sum(-1).tolist() == brute_force_best_path(log_prob[0])


def test_alignment_search_respects_lengths_and_refuses_impossible_ones():
    log_prob = torch.randn(2, 4, 10)
    path = monotonic_alignment_search(log_prob, torch.tensor([4, 2]), torch.tensor([10, 5]))
    assert path[1, 2:].sum() == 0 and path[1, :, 5:].sum() == 0
    assert path[1].sum() == 5
    with pytest.raises(ValueError, match="fewer frames"):
        monotonic_alignment_search(log_prob, torch.tensor([4, 4]), torch.tensor([10, 3]))


def test_durations_to_path_expands_in_order():
    path = durations_to_path(torch.tensor([[2, 1, 3]]))
    assert path.shape == (1, 3, 6)
    assert path[0].argmax(0).tolist() == [0, 0, 1, 2, 2, 2]


def test_forward_shapes_and_masks():
    model, batch = tiny_model(), tiny_batch()
    out = model(**batch)
    mel, frame_lengths = batch["mel"], batch["frame_lengths"]
    assert out.mel.shape == mel.shape and out.prior_mean.shape == mel.shape
    assert out.durations.sum(-1).tolist() == frame_lengths.tolist(), "alignment covers every frame"
    assert out.mel[1, frame_lengths[1] :].abs().sum() == 0, "padded frames are zero"
    assert out.log_duration.shape == batch["phonemes"].shape


def test_training_step_reduces_loss_and_inference_runs():
    from chorus.models.losses import compute_losses

    model, batch = tiny_model(), tiny_batch()
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    losses = []
    for _ in range(30):
        out = model(**batch)
        loss = compute_losses(model, out, batch["mel"], batch["text_lengths"])["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    model.eval()
    out = model.infer(batch["phonemes"], batch["text_lengths"], speaker_ids=batch["speaker_ids"])
    assert out.mel.shape[0] == len(batch["phonemes"]) and out.mel.shape[2] == 80
    assert (out.durations[0] >= 1).all()
    assert out.frame_mask.sum(-1).tolist() == out.durations.sum(-1).long().tolist()


def test_a_sequence_longer_than_the_positions_is_decoded_in_crossfaded_windows():
    """A long sentence read slowly (5,205 frames at speed 0.25) or expanded by numbers (7,472) passed the
    decoder's 4,096 positions: ValueError, a failed request or a cut stream. Past them the decoder runs in
    overlapping windows; within them nothing changes."""
    model = tiny_model(max_positions=64).eval()
    phonemes, lengths = torch.randint(1, 40, (2, 12), generator=torch.Generator().manual_seed(2)), torch.tensor([12, 3])
    durations = torch.tensor([[15] * 12, [1, 1, 1] + [0] * 9])  # 180 frames, and an item that ends at once
    with torch.no_grad():
        long = model.infer(phonemes, lengths, speaker_ids=torch.tensor([0, 1]), durations=durations)
        assert long.mel.shape[1] == 180 and torch.isfinite(long.mel).all()
        assert long.mel[1, 3:].abs().sum() == 0, "padding stays zero"
        short = torch.tensor([[5] * 12, [1, 1, 1] + [0] * 9])  # 60 frames: the plain decoder, as before
        plain = model.infer(phonemes, lengths, speaker_ids=torch.tensor([0, 1]), durations=short).mel
        windows = model._decode_in_windows
        model._decode_in_windows = None  # never called within the positions
        assert torch.equal(model.infer(phonemes, lengths, speaker_ids=torch.tensor([0, 1]), durations=short).mel, plain)
        model._decode_in_windows = windows
        # An item within the positions, batched with one past them, is decoded as it would be alone (a review:
        # the whole batch went through the windows, and a 48-frame item moved by up to 1.0 in the mel).
        fits = torch.tensor([[4] * 12, [16, 16, 16] + [0] * 9])  # 48 frames: past a window less its overlap
        alone = model.infer(phonemes, lengths, speaker_ids=torch.tensor([0, 1]), durations=fits).mel[1, :48]
        mixed = torch.stack([durations[0], fits[1]])
        batched = model.infer(phonemes, lengths, speaker_ids=torch.tensor([0, 1]), durations=mixed).mel[1, :48]
        torch.testing.assert_close(batched, alone)
    with pytest.raises(ValueError, match="exceeds max_positions"):  # the stack itself keeps its bound
        model.decoder(torch.zeros(1, 65, model.config.d_model), torch.ones(1, 65, dtype=torch.bool))


def test_speaker_vectors_go_through_the_same_projection_as_the_table():
    model, batch = tiny_model().eval(), tiny_batch()
    ids = batch["speaker_ids"]
    by_id = model.infer(batch["phonemes"], batch["text_lengths"], speaker_ids=ids)
    by_vector = model.infer(batch["phonemes"], batch["text_lengths"], speaker_vectors=model.speaker_embedding(ids))
    assert torch.equal(by_id.mel, by_vector.mel)
    with pytest.raises(ValueError, match="exactly one"):
        model.speaker_condition(ids, model.speaker_embedding(ids))
    with pytest.raises(ValueError, match="out of range"):
        model.speaker_condition(torch.tensor([model.config.n_speakers]))


def test_energy_predictor_is_optional_and_trained_from_targets():
    model, batch = tiny_model(use_energy=True), tiny_batch()
    with pytest.raises(ValueError, match="targets"):
        model(**batch)
    out = model(**batch, energy=batch["mel"].mean(-1))
    assert out.energy.shape == out.energy_target.shape == batch["phonemes"].shape


def test_module_names_are_predictable_for_adapters():
    names = dict(tiny_model().named_modules())
    for name in (
        "encoder.layers.0.attn.q_proj",
        "encoder.layers.0.attn.v_proj",
        "decoder.layers.0.ff.conv1",
        "decoder.layers.0.norm2",
        "duration_predictor.conv1",
        "speaker_proj",
    ):
        assert name in names


def test_any_size_builds_on_the_meta_device_without_memory():
    config = AcousticConfig(
        d_model=1536,
        n_heads=16,
        encoder_layers=12,
        decoder_layers=12,
        ff_hidden=6144,
        ff_kernel=3,
        predictor_hidden=512,
    )
    model = build_model(config, "meta")
    assert next(model.parameters()).is_meta
    assert 450e6 < count_parameters(model) < 2e9


def test_config_validation_and_round_trip():
    config = tiny_config()
    assert AcousticConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="divisible"):
        AcousticConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown"):
        AcousticConfig.from_dict({"d_model": 32, "colour": "red"})


def _bundle():
    return ModelBundle(tiny_model().eval(), TextFrontEnd(), MelConfig(), ["a", "b"], "b", {"steps": 1})


def test_checkpoint_round_trip_is_exact(tmp_path):
    bundle = _bundle()
    save_bundle(bundle, tmp_path / "model")
    loaded = load_bundle(tmp_path / "model")
    for (name, a), (_, b) in zip(bundle.model.state_dict().items(), loaded.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.speakers == ["a", "b"] and loaded.default_speaker == "b"
    assert loaded.front_end.symbols == bundle.front_end.symbols
    assert not list(tmp_path.glob(".*")), "no temporary folders left behind"


def test_checkpoint_errors_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match="missing config.json"):
        load_bundle(tmp_path)
    save_bundle(_bundle(), tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_bundle(tmp_path / "model")
    save_bundle(_bundle(), tmp_path / "other")
    config = json.loads((tmp_path / "other" / "config.json").read_text())
    config["format"] = "something-else"
    (tmp_path / "other" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="format"):
        load_bundle(tmp_path / "other")


def test_beta_binomial_prior_is_a_diagonal_distribution_over_tokens():
    from chorus.models.alignment import beta_binomial_log_prior

    prior = beta_binomial_log_prior(torch.tensor([5, 3]), torch.tensor([20, 9]), 5, 20)
    assert torch.allclose(prior[0].exp().sum(0), torch.ones(20), atol=1e-5)
    assert prior[1, 3:].abs().sum() == 0 and prior[1, :, 9:].abs().sum() == 0
    path = monotonic_alignment_search(prior, torch.tensor([5, 3]), torch.tensor([20, 9]))
    assert path[0].sum(-1).tolist() == [4, 4, 4, 4, 4] and path[1, :3].sum(-1).tolist() == [3, 3, 3]


def test_alignment_prior_weight_fades_out():
    from chorus.training.pretrain import PretrainConfig, alignment_prior_weight

    config = PretrainConfig(data="x", out="y", alignment_prior_steps=100)
    assert [alignment_prior_weight(s, config) for s in (0, 50, 100, 500)] == [1.0, 0.5, 0.0, 0.0]


def test_a_config_whose_sizes_the_weights_do_not_have_is_refused_before_anything_is_allocated(tmp_path):
    """A model folder from elsewhere: a config declaring 2**40 speakers over weights of 2 (the model was built,
    768 MB for 3,000,000 speakers, before the weights were found not to fit; 2**40 cannot be built at all)."""
    save_bundle(_bundle(), tmp_path / "model")
    config_path = tmp_path / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["model"]["n_speakers"] = 2**40
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"weights do not match the config: .*\(the config makes"):
        load_bundle(tmp_path / "model")
    for size in (2.0, 2**62):  # sizes torch cannot build: a clear error, not its TypeError or RuntimeError
        config["model"]["n_speakers"] = size
        config_path.write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match="invalid model config"):
            load_bundle(tmp_path / "model")
    config["model"]["n_speakers"], config["model"]["decoder_layers"] = 2, 40  # layers the weights lack
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing"):
        load_bundle(tmp_path / "model")
