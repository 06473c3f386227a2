"""The posterior recipe's parts: a posterior encoder distilled from a Piper voice, the flow's training
direction, the prior's likelihood and KL, and the recipe's step loop on a toy-size generator."""

from __future__ import annotations

import math

import pytest
import torch

from chorus.adapters import base_state_dict
from chorus.corpus.build import heldout_sentence_ids
from chorus.corpus.text import training_sentences
from chorus.models.piper_posterior import PosteriorEncoder, linear_spectrogram
from chorus.text.normalize import normalize_text
from chorus.training.piper_adapt import (
    PiperAdaptConfig,
    attach_voice,
    prepare_clips,
    prior_kl,
    prior_log_likelihood,
    train_posterior,
)
from chorus.training.piper_posterior import DistillConfig, distill_posterior, distillation_sentences
from conftest import tiny_piper_generator


def test_the_flow_encodes_what_it_decodes() -> None:
    generator = tiny_piper_generator()
    z = torch.randn(2, generator.config.inter_channels, 30)
    mask = torch.ones(2, 1, 30)
    mask[1, :, 20:] = 0
    z = z * mask
    with torch.no_grad():
        z_p = generator.flow.encode(z, mask)
        assert not torch.allclose(z_p, z)
        torch.testing.assert_close(generator.flow(z_p, mask), z, atol=1e-5, rtol=0)


def test_the_spectrogram_has_one_column_per_latent_frame() -> None:
    audio = torch.randn(2, 40 * 256)
    spec = linear_spectrogram(audio, 1024, 256)
    assert spec.shape == (2, 513, 40)


def test_prior_log_likelihood_is_each_frame_under_each_phoneme() -> None:
    torch.manual_seed(0)
    z_p, m_p, logs_p = torch.randn(2, 4, 7), torch.randn(2, 4, 3), 0.3 * torch.randn(2, 4, 3)
    got = prior_log_likelihood(z_p, m_p, logs_p)
    normal = torch.distributions.Normal(m_p[:, :, :, None], torch.exp(logs_p)[:, :, :, None])
    expected = normal.log_prob(z_p[:, :, None, :]).sum(1)  # [B, T, F]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_prior_kl_is_zero_only_where_the_posterior_sits_on_the_prior() -> None:
    m = torch.randn(1, 4, 5)
    logs = torch.zeros(1, 4, 5)
    mask = torch.ones(1, 1, 5)
    # A draw exactly at the prior's mean with the prior's own spread: KL's estimate is -0.5 per channel.
    assert math.isclose(float(prior_kl(m, logs, m, logs, mask)), -0.5 * 4, abs_tol=1e-6)
    assert float(prior_kl(m + 1, logs, m, logs, mask)) > float(prior_kl(m, logs, m, logs, mask))


def test_distillation_never_reads_a_heldout_sentence() -> None:
    reserved = {normalize_text(text, warn=False) for i, text in training_sentences() if i in heldout_sentence_ids()}
    chosen = distillation_sentences(200)
    assert len(chosen) == 200 and not reserved & set(chosen)


def test_a_distilled_posterior_learns_and_loads_back(tmp_path) -> None:
    generator = tiny_piper_generator()
    config = DistillConfig(sentences=3, steps=30, batch_size=4, segment_frames=16, n_layers=2, threads=1, log_every=10)
    encoder = distill_posterior(generator, config, tmp_path / "posterior", base_name="tiny")
    rows = (tmp_path / "posterior" / "loss.csv").read_text().splitlines()
    first, last = (float(row.split(",")[2]) for row in (rows[1], rows[-1]))
    assert last < first
    audio = torch.randn(1, 20 * generator.hop_length) * 0.1
    again = PosteriorEncoder.load(tmp_path / "posterior")
    torch.testing.assert_close(again(audio, sample=False)[1], encoder(audio, sample=False)[1])


@pytest.mark.parametrize("placement", ["text+flow", "all"])
def test_the_posterior_recipe_trains_the_voice_and_the_posterior_only(tone_clips, tiny_posterior, placement) -> None:
    from chorus.data.formats import discover

    generator = tiny_piper_generator()
    clips = prepare_clips(generator, discover(tone_clips)[0], align=False)
    assert all(c.durations is None and c.frames * 256 == len(c.audio) for c in clips)
    before = {k: v.clone() for k, v in base_state_dict(generator).items()}
    config = PiperAdaptConfig(
        placement=placement, recipe="posterior", steps=12, batch_size=2, segment_frames=16, learning_rate=1e-2,
        posterior_learning_rate=1e-3, log_every=4,
    )  # fmt: skip
    model, trainable = attach_voice(generator, config)
    encoder = PosteriorEncoder.load(tiny_posterior)
    initial = [p.detach().clone() for p in (*trainable, *encoder.parameters())]
    rows, steps, _ = train_posterior(model, encoder, clips, trainable, config)
    after = base_state_dict(generator)
    assert all(torch.equal(after[k], before[k]) for k in before)
    moved = [not torch.equal(p, q) for p, q in zip((*trainable, *encoder.parameters()), initial)]
    assert any(moved[: len(trainable)]) and any(moved[len(trainable) :])
    assert steps == 12 and {"kl", "mel_l1"} <= set(rows[0]) and rows[-1]["loss"] < rows[0]["loss"]


def test_the_shipped_posterior_reads_joes_latent() -> None:
    from chorus.training.piper_adapt import load_posterior

    encoder = load_posterior(PiperAdaptConfig())
    assert (encoder.config.inter_channels, encoder.config.hop_length) == (192, 256)
    assert all(p.dtype == torch.float32 for p in encoder.parameters())  # shipped as float16, trained in float32
    z, m, logs, mask = encoder(torch.zeros(1, 10 * 256), sample=False)
    assert z.shape == (1, 192, 10) and torch.equal(z, m)
