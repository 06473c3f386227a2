"""Piper's VITS generator in PyTorch: any Piper voice (``voice.onnx`` + ``voice.onnx.json``) as a module.

    ids [B, T] ──enc_p──> hidden, m_p, logs_p ──dp (reverse, noise_w)──> log durations
        durations = ceil(exp(logw) * length_scale) ──> expand m_p, logs_p to frames
        z_p = m_p + noise * exp(logs_p) * noise_scale ──flow (reverse)──> z ──dec (HiFi-GAN)──> audio

VITS (Kim et al. 2021) as Piper trains and exports it (``piper_train/vits``): a relative-position
transformer text encoder, a stochastic duration predictor (rational-quadratic spline flows), a
mean-only residual-coupling flow and a HiFi-GAN decoder. Only the inference path exists here: Piper's
ONNX export carries no posterior encoder and no discriminators.

Module and parameter names are Piper's (``enc_p.encoder.attn_layers.0.conv_q.weight``...), so the state
dict reads like the ONNX initializers and adapters target layers by the names Piper's papers and
checkpoints use. Sizes are read from the graph (initializer shapes and the attributes of its ``Conv``
nodes), so every single-speaker Piper quality (x_low, low, medium, high) loads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from chorus.peers.piper import PiperVoiceConfig

LRELU_SLOPE = 0.1  # HiFi-GAN's
POST_SLOPE = 0.01  # its last activation's, before conv_post: PyTorch's default
# The spline flows' constants (Durkan et al. 2019, as VITS sets them); none is stored in the graph.
TAIL_BOUND = 5.0
MIN_BIN_WIDTH = MIN_BIN_HEIGHT = MIN_DERIVATIVE = 1e-3
# Piper's default (noise_scale, length_scale, noise_w), for a generator built without a voice's json.
PIPER_SCALES = (0.667, 1.0, 0.8)


@dataclass(frozen=True)
class PiperVitsConfig:
    """The generator's sizes, as :func:`read_config` finds them in a voice's graph."""

    n_symbols: int  # rows of the phoneme embedding
    hidden_channels: int  # text encoder width (192 in every Piper quality but x_low's 96)
    filter_channels: int  # text encoder FFN width
    n_heads: int
    n_layers: int  # text encoder blocks
    kernel_size: int  # FFN convolution width
    window_size: int  # relative attention reaches this many positions each side
    inter_channels: int  # latent z channels (the flow's and decoder's input)
    flow_couplings: int  # residual coupling layers (a channel flip after each)
    flow_wn_layers: int  # WaveNet layers in each coupling
    flow_kernel_size: int
    flow_dilation_rate: int
    dp_filter_channels: int
    dp_kernel_size: int
    dp_layers: int  # dilated depth-separable conv layers (dilation kernel**i)
    dp_flows: int  # spline flows Piper trains; the export keeps the last dp_flows - 1 (see DurationPredictor)
    dp_bins: int  # spline bins
    resblock: str  # HiFi-GAN residual block type: "1" (two convs per dilation) or "2" (one)
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    sample_rate: int

    def __post_init__(self) -> None:
        if self.hidden_channels % self.n_heads:
            raise ValueError(f"hidden_channels {self.hidden_channels} is not a multiple of n_heads {self.n_heads}")
        if self.resblock not in ("1", "2"):
            raise ValueError(f"resblock must be '1' or '2', not {self.resblock!r}")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("one dilation tuple per resblock kernel size")
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise ValueError("one kernel size per upsample rate")

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame (256 in every Piper quality)."""
        return math.prod(self.upsample_rates)


# A seed for the generator's noise: one generator for the whole batch, or one per row (see draw_noise).
Noise = torch.Generator | Sequence[torch.Generator] | None
RowScope = Callable[[int], AbstractContextManager[None]]  # row -> the context that row runs in by itself


def draw_noise(
    shape: tuple[int, int, int], lengths: torch.Tensor, generator: Noise, like: torch.Tensor
) -> torch.Tensor:
    """Standard normal noise ``[batch, channels, time]`` on ``like``'s device and dtype.

    With one generator (or None) the batch is one draw. With one generator per row, each row draws its own
    ``[channels, lengths[row]]`` (zero past it): a row's noise is then the same whichever rows share its
    batch, so a server that batches requests speaks each one as the library does alone.
    """
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)
    if len(generator) != shape[0]:
        raise ValueError(f"{len(generator)} noise generators for a batch of {shape[0]}")
    noise = like.new_zeros(shape)
    for row, (seed, length) in enumerate(zip(generator, lengths.tolist())):
        noise[row, :, :length] = torch.randn((shape[1], length), generator=seed, device=seed.device).to(like)
    return noise


# ---------------------------------------------------------------- text encoder (enc_p)


class LayerNorm(nn.Module):
    """LayerNorm over the channels of ``[batch, channels, time]`` (Piper's ``gamma``/``beta`` names)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.transpose(1, -1), self.gamma.shape, self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


class RelativeAttention(nn.Module):
    """Multi-head self-attention with relative position embeddings shared by the heads (Shaw et al.
    2018): within ``window_size`` positions each side a learned key and value per distance is added."""

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads, self.k_channels, self.window_size = n_heads, channels // n_heads, window_size
        # 1x1 convolutions, not Linear: Piper's layers, so weights map one to one and keep their names.
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, length = x.shape
        return x.view(batch, self.n_heads, self.k_channels, length).transpose(2, 3)

    def _to_absolute(self, relative: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, 2w+1]`` by distance -> ``[B, H, T, T]``: ``out[i, j] = relative[i, j - i + w]`` within
        the window, 0 outside it (Piper pads and reshapes to the same values)."""
        length, window = relative.shape[2], self.window_size
        position = torch.arange(length, device=relative.device)
        distance = position[None, :] - position[:, None]
        index = (distance + window).clamp(0, 2 * window).expand(*relative.shape[:2], -1, -1)
        return relative.gather(3, index) * (distance.abs() <= window)

    def _to_relative(self, absolute: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, T]`` -> ``[B, H, T, 2w+1]`` by distance: ``out[i, r] = absolute[i, i + r - w]`` where
        that column exists, else 0."""
        length, window = absolute.shape[2], self.window_size
        column = torch.arange(length, device=absolute.device)[:, None] + torch.arange(
            -window, window + 1, device=absolute.device
        )
        index = column.clamp(0, length - 1).expand(*absolute.shape[:2], -1, -1)
        return absolute.gather(3, index) * ((column >= 0) & (column < length))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, channels, time]``, attn_mask ``[batch, 1, time, time]`` (1 = both valid) -> same as x."""
        batch, channels, length = x.shape
        query = self._heads(self.conv_q(x)) / math.sqrt(self.k_channels)  # [B, H, T, d]
        key, value = self._heads(self.conv_k(x)), self._heads(self.conv_v(x))
        relative_logits = query @ self.emb_rel_k.transpose(1, 2)  # [B, H, T, 2w+1]
        scores = query @ key.transpose(2, 3) + self._to_absolute(relative_logits)
        # -1e4 as Piper masks: exp underflows to an exact 0 either way.
        weights = F.softmax(scores.masked_fill(attn_mask == 0, -1e4), dim=-1)
        out = weights @ value + self._to_relative(weights) @ self.emb_rel_v
        return self.conv_o(out.transpose(2, 3).reshape(batch, channels, length))


class FeedForward(nn.Module):
    """Two 'same'-padded convolutions with a ReLU between, inputs masked (Piper's ``FFN``)."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.padding = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, channels, time]``, mask ``[batch, 1, time]`` -> ``[batch, channels, time]``."""
        x = torch.relu(self.conv_1(F.pad(x * mask, self.padding)))
        return self.conv_2(F.pad(x * mask, self.padding)) * mask


class Encoder(nn.Module):
    """Post-norm transformer blocks: attention, LayerNorm, FFN, LayerNorm (Piper's ``attentions.Encoder``)."""

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        hidden, blocks = config.hidden_channels, range(config.n_layers)
        self.attn_layers = nn.ModuleList(RelativeAttention(hidden, config.n_heads, config.window_size) for _ in blocks)
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hidden) for _ in blocks)
        self.ffn_layers = nn.ModuleList(FeedForward(hidden, config.filter_channels, config.kernel_size) for _ in blocks)
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hidden) for _ in blocks)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, hidden, time]``, mask ``[batch, 1, time]`` -> ``[batch, hidden, time]``."""
        attn_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        x = x * mask
        for attn, norm_1, ffn, norm_2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = norm_1(x + attn(x, attn_mask))
            x = norm_2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's mean and log-scale per phoneme."""

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        self.emb = nn.Embedding(config.n_symbols, config.hidden_channels)
        self.encoder = Encoder(config)
        self.proj = nn.Conv1d(config.hidden_channels, 2 * config.inter_channels, 1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids ``[batch, time]``, mask ``[batch, 1, time]`` -> hidden ``[batch, hidden, time]``,
        m_p and logs_p ``[batch, inter, time]``."""
        x = self.emb(ids).transpose(1, 2) * math.sqrt(self.emb.embedding_dim)
        x = self.encoder(x * mask, mask)
        m_p, logs_p = (self.proj(x) * mask).chunk(2, dim=1)
        return x, m_p, logs_p


# ---------------------------------------------------------------- stochastic duration predictor (dp)


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation kernel**i), each with two LayerNorms and GELUs."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        dilations = [kernel_size**i for i in range(n_layers)]
        self.convs_sep = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations
        )
        self.convs_1x1 = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in dilations)
        self.norms_1 = nn.ModuleList(LayerNorm(channels) for _ in dilations)
        self.norms_2 = nn.ModuleList(LayerNorm(channels) for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[batch, channels, time]`` (+ conditioning g, same shape), mask ``[batch, 1, time]``."""
        if g is not None:
            x = x + g
        for sep, norm_1, conv, norm_2 in zip(self.convs_sep, self.norms_1, self.convs_1x1, self.norms_2):
            y = F.gelu(norm_1(sep(x * mask)))
            x = x + F.gelu(norm_2(conv(y)))
        return x * mask


def rational_quadratic_inverse(
    inputs: torch.Tensor, widths: torch.Tensor, heights: torch.Tensor, derivatives: torch.Tensor
) -> torch.Tensor:
    """The inverse of a monotonic rational-quadratic spline on [-TAIL_BOUND, TAIL_BOUND], identity outside
    (linear tails), as VITS's ``transforms.py`` (Durkan et al. 2019) computes it.

    inputs ``[...]``; unnormalized widths and heights ``[..., bins]``, inner derivatives ``[..., bins - 1]``.
    The spline is evaluated on every element (inputs clamped into the interval) and the tails selected
    after, instead of Piper's boolean indexing: the same arithmetic per element, one shape throughout.
    """
    bins = widths.shape[-1]
    tail = math.log(math.expm1(1 - MIN_DERIVATIVE))  # softplus(tail) + MIN_DERIVATIVE = 1 at both ends
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(derivatives, (1, 1), value=tail))

    def knots(unnormalized: torch.Tensor, minimum: float) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = minimum + (1 - minimum * bins) * F.softmax(unnormalized, dim=-1)
        cumulative = 2 * TAIL_BOUND * F.pad(torch.cumsum(sizes, dim=-1), (1, 0)) - TAIL_BOUND
        cumulative[..., 0], cumulative[..., -1] = -TAIL_BOUND, TAIL_BOUND
        return cumulative, cumulative[..., 1:] - cumulative[..., :-1]

    cumwidths, widths = knots(widths, MIN_BIN_WIDTH)
    cumheights, heights = knots(heights, MIN_BIN_HEIGHT)
    y = inputs.clamp(-TAIL_BOUND, TAIL_BOUND)
    # The bin each input falls in; the top edge nudged up so that y == TAIL_BOUND lands in the last bin.
    edges = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + 1e-6], dim=-1)
    index = (torch.sum(y[..., None] >= edges, dim=-1) - 1)[..., None]

    def at(table: torch.Tensor) -> torch.Tensor:
        return table.gather(-1, index)[..., 0]

    delta = heights / widths
    x_k, w_k, y_k, h_k, s_k = at(cumwidths), at(widths), at(cumheights), at(heights), at(delta)
    d_k, d_k1 = at(derivatives), at(derivatives[..., 1:])
    offset = y - y_k
    curve = d_k + d_k1 - 2 * s_k
    a = offset * curve + h_k * (s_k - d_k)
    b = h_k * d_k - offset * curve
    c = -s_k * offset
    # The numerically stable root of a theta^2 + b theta + c = 0 in [0, 1].
    theta = (2 * c) / (-b - torch.sqrt(b.pow(2) - 4 * a * c))
    inside = (inputs >= -TAIL_BOUND) & (inputs <= TAIL_BOUND)
    return torch.where(inside, theta * w_k + x_k, inputs)


class ConvFlow(nn.Module):
    """A spline coupling on two channels: channel 0 (through DDSConv, conditioned on the text) sets the
    spline that transforms channel 1. Only the inverse (sampling) direction is implemented."""

    def __init__(self, filter_channels: int, kernel_size: int, n_layers: int, bins: int) -> None:
        super().__init__()
        self.filter_channels, self.bins = filter_channels, bins
        self.pre = nn.Conv1d(1, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, 3 * bins - 1, 1)

    def forward(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """z ``[batch, 2, time]``, mask ``[batch, 1, time]``, g ``[batch, filter, time]`` -> ``[batch, 2, time]``."""
        z0, z1 = z[:, :1], z[:, 1:]
        h = self.proj(self.convs(self.pre(z0), mask, g=g)) * mask
        h = h.unsqueeze(1).transpose(2, 3)  # [B, 1, T, 3 * bins - 1]
        scale = math.sqrt(self.filter_channels)
        widths, heights = h[..., : self.bins] / scale, h[..., self.bins : 2 * self.bins] / scale
        z1 = rational_quadratic_inverse(z1, widths, heights, h[..., 2 * self.bins :])
        return torch.cat([z0, z1], dim=1) * mask


class ElementwiseAffine(nn.Module):
    """``y = m + exp(logs) * x`` per channel; inverted here."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def forward(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return (z - self.m) * torch.exp(-self.logs) * mask


class Flip(nn.Module):
    """Reverse the channel order, so the next coupling transforms the other half."""

    def forward(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(z, [1])


class DurationPredictor(nn.Module):
    """VITS's stochastic duration predictor, sampling direction: noise ``[batch, 2, time]`` through the
    inverted flows, conditioned on the text encoder's hidden states, gives log durations.

    ``flows`` keeps Piper's indices (affine, then a spline flow and a flip per ``dp_flows``). Sampling
    skips ``flows.1``, a spline that only changes the channel thrown away, so Piper's export has no
    weights for it; an empty placeholder holds its place so later names stay Piper's.
    """

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        channels = config.dp_filter_channels
        self.pre = nn.Conv1d(config.hidden_channels, channels, 1)
        self.convs = DDSConv(channels, config.dp_kernel_size, config.dp_layers)
        self.proj = nn.Conv1d(channels, channels, 1)
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for index in range(config.dp_flows):
            spline = (
                ConvFlow(channels, config.dp_kernel_size, config.dp_layers, config.dp_bins) if index else nn.Identity()
            )
            flows += [spline, Flip()]
        self.flows = nn.ModuleList(flows)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, noise_w: float, generator: Noise = None) -> torch.Tensor:
        """x ``[batch, hidden, time]``, mask ``[batch, 1, time]`` -> log durations ``[batch, 1, time]``;
        ``generator``: see :func:`draw_noise`."""
        x = self.proj(self.convs(self.pre(x), mask)) * mask
        shape = (x.shape[0], 2, x.shape[2])
        if noise_w:
            z = draw_noise(shape, mask.sum((1, 2)).long(), generator, x) * noise_w
        else:
            z = x.new_zeros(shape)
        for flow in reversed(self.flows[2:]):
            z = flow(z, mask, g=x)
        return self.flows[0](z, mask)[:, :1]


# ---------------------------------------------------------------- flow


class WaveNet(nn.Module):
    """Non-causal WaveNet: gated dilated convolutions with residual and skip outputs (Piper's ``WN``)."""

    def __init__(self, channels: int, kernel_size: int, dilation_rate: int, n_layers: int) -> None:
        super().__init__()
        self.channels = channels
        dilations = [dilation_rate**i for i in range(n_layers)]
        self.in_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels, kernel_size, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations
        )
        # The last layer has no residual half: its output is all skip.
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(channels, 2 * channels if i < n_layers - 1 else channels, 1) for i in range(n_layers)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, channels, time]``, mask ``[batch, 1, time]`` -> skip sum ``[batch, channels, time]``."""
        output = torch.zeros_like(x)
        last = len(self.in_layers) - 1
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            gate = in_layer(x)
            acts = res_skip(torch.tanh(gate[:, : self.channels]) * torch.sigmoid(gate[:, self.channels :]))
            if i < last:
                x = (x + acts[:, : self.channels]) * mask
                output = output + acts[:, self.channels :]
            else:
                output = output + acts
        return output * mask


class CouplingLayer(nn.Module):
    """Mean-only affine coupling: half the channels (through a WaveNet) shift the other half."""

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        half, hidden = config.inter_channels // 2, config.hidden_channels
        self.pre = nn.Conv1d(half, hidden, 1)
        self.enc = WaveNet(hidden, config.flow_kernel_size, config.flow_dilation_rate, config.flow_wn_layers)
        self.post = nn.Conv1d(hidden, half, 1)

    def forward(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """The inverse: z ``[batch, inter, time]``, mask ``[batch, 1, time]`` -> same shape."""
        return self._couple(z, mask, -1.0)

    def encode(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The training direction (a latent towards the prior): same shapes as :meth:`forward`."""
        return self._couple(z, mask, 1.0)

    def _couple(self, z: torch.Tensor, mask: torch.Tensor, sign: float) -> torch.Tensor:
        z0, z1 = z.chunk(2, dim=1)
        shift = self.post(self.enc(self.pre(z0) * mask, mask)) * mask
        return torch.cat([z0, (z1 + sign * shift) * mask], dim=1)


class Flow(nn.Module):
    """Couplings each followed by a channel flip (Piper's ``ResidualCouplingBlock``), run inverted."""

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        self.flows = nn.ModuleList(
            layer for _ in range(config.flow_couplings) for layer in (CouplingLayer(config), Flip())
        )

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """z_p ``[batch, inter, frames]`` -> z, mask ``[batch, 1, frames]``."""
        for flow in reversed(self.flows):
            z = flow(z, mask)
        return z

    def encode(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The training direction, z -> z_p (VITS's ``flow(z)``): a recording's latent in the prior's
        space, where the text encoder's Gaussians judge it. Exactly :meth:`forward`'s inverse."""
        for flow in self.flows:
            z = flow.encode(z, mask) if isinstance(flow, CouplingLayer) else flow(z, mask)
        return z


# ---------------------------------------------------------------- decoder (dec)

# Without gradients, on one CPU thread, the decoder's convolutions run as one matrix product per kernel tap
# (BLAS's sgemm on shifted views of the input, no im2col copy), block by block of columns. There oneDNN ran
# HiFi-GAN's shapes at 15-35 GFLOP/s where sgemm gets 45-70 (joe's last stage: 32 channels, kernels 5 and
# 7, ~50k samples; its transposed convolutions likewise), so joe took 1.6x onnxruntime's time (im2col +
# sgemm) per sentence; 1.3x with these. With gradients the modules are PyTorch's convolutions, whose
# backward keeps one saved input, not one per tap.

# Output columns per block times (in + out channels): each block's input and output (2 MB in float32)
# stay in a core's L2 cache across its taps instead of every tap streaming the whole signal from memory
# (on joe's last stage whole-signal taps took 1.5-1.7x onnxruntime's time, blocks this size 0.9-1.1x).
BLOCK_FLOATS = 2**19


def by_products(x: torch.Tensor) -> bool:
    """Whether the decoder's convolutions of ``x`` run as matrix products: on the CPU, with no gradient
    recorded, outside autocast (whose casts the products would miss), on one thread. Only one thread was
    measured; with more, BLAS splits every block's product across them, a small share each, where
    oneDNN's threaded convolution splits the whole signal."""
    return (
        x.device.type == "cpu"
        and torch.get_num_threads() == 1
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
    )


def shifted_products(
    x: torch.Tensor,
    matrices: torch.Tensor,
    shifts: Sequence[int],
    bias: torch.Tensor | None,
    length: int,
    slope: float | None = None,
    mask: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[:, :, t] = bias + sum_j matrices[j] @ a[:, :, t + shifts[j]] + residual[:, :, t]`` for ``t <
    length``, where ``a = leaky_relu(x, slope) * mask`` (either left out when None) and reads as zero
    outside x: x ``[batch, in, time]``, matrices ``[taps, out, in]``, bias ``[out]``, mask ``[batch, 1,
    time]``, residual ``[batch, out, length]`` -> ``[batch, out, length]``. No gradients.

    Item by item and block of columns by block: the activation is taken on the block's input window,
    each tap updates only the columns its shifted input covers, and the residual is added last, so a
    residual unit (activation, convolution, sum) passes over the signal once, in cache, and gives the
    same bits as its three steps one after the other."""
    x = x.contiguous()
    samples = x.shape[2]
    out = x.new_empty(x.shape[0], matrices.shape[1], length)
    step = max(1, BLOCK_FLOATS // (x.shape[1] + matrices.shape[1]))
    for row, (item, result) in enumerate(zip(x, out)):
        for start in range(0, length, step):
            stop = min(length, start + step)
            block = result[:, start:stop]
            if bias is None:
                block.zero_()
            else:
                block.copy_(bias[:, None].expand_as(block))
            first, last = max(0, start + min(shifts)), min(samples, stop + max(shifts))
            window = item[:, first:last] if slope is None else F.leaky_relu(item[:, first:last], slope)
            if mask is not None:
                window = window * mask[row, :, first:last]
            for matrix, shift in zip(matrices, shifts):
                low, high = max(start, -shift), min(stop, samples - shift)
                if low < high:
                    result[:, low:high].addmm_(matrix, window[:, low + shift - first : high + shift - first])
            if residual is not None:
                block.add_(residual[row, :, start:stop])
    return out


class TapConv1d(nn.Conv1d):
    """``nn.Conv1d`` (stride 1, one group, numeric zero padding) that runs as :func:`shifted_products` where
    :func:`by_products` allows: the same parameters and names, the output up to float rounding."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.stride != (1,) or self.groups != 1 or self.padding_mode != "zeros" or isinstance(self.padding, str):
            raise ValueError("TapConv1d takes stride 1, one group and numeric zero padding only")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[batch, in, time]`` -> ``[batch, out, time']``."""
        return self.unit(x) if by_products(x) else super().forward(x)

    def unit(
        self,
        x: torch.Tensor,
        slope: float | None = None,
        mask: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``conv(leaky_relu(x, slope) * mask) + residual`` in one pass (:func:`shifted_products`, no
        gradients): x ``[batch, in, time]``, mask ``[batch, 1, time]``, residual ``[batch, out, time']``
        (each left out when None) -> ``[batch, out, time']``. ``tensors``: the ``weight`` and ``bias`` to
        run with instead of the layer's own (an adapter's folded in, :func:`conv_tensors`)."""
        (kernel,), (dilation,), (padding,) = self.kernel_size, self.dilation, self.padding
        weight, bias = (self.weight, self.bias) if tensors is None else (tensors["weight"], tensors.get("bias"))
        if (bias is None) != (self.bias is None):
            raise ValueError("the tensors given must have a bias exactly where the layer has one")
        shifts = [tap * dilation - padding for tap in range(kernel)]
        length = x.shape[2] + 2 * padding - dilation * (kernel - 1)
        taps = weight.permute(2, 0, 1).contiguous()  # [kernel, out, in]: one matrix per tap
        return shifted_products(x, taps, shifts, bias, length, slope, mask, residual)


def routes_rows(model: nn.Module) -> bool:
    """Whether an adapter inside ``model`` sends rows of a batch to different voices (a voice bank's slots, a
    routing of several names): :class:`chorus.adapters.layer.AdapterLayer`'s ``bank_index`` and ``routing``,
    read by name (models sit below adapters)."""
    return any(
        getattr(module, "bank_index", None) is not None or len(set(getattr(module, "routing", None) or ())) > 1
        for module in model.modules()
    )


def conv_tensors(conv: nn.Module, batch: int) -> tuple[TapConv1d, dict[str, torch.Tensor] | None] | None:
    """The :class:`TapConv1d` that ``conv`` runs for a forward of ``batch`` rows and the tensors to run it with
    (None: its own), or None where its output is not that layer's with other tensors. ``conv`` is the layer,
    or an adapter's wrapper around it (:class:`chorus.adapters.layer.AdapterLayer`, whose ``row_tensors``
    folds in the adapters that apply, as a merge would; models sit below adapters, so it is found by name)."""
    if type(conv) is TapConv1d:
        return conv, None
    found = getattr(conv, "row_tensors", lambda _batch: None)(batch)
    if found is None or type(found[0]) is not TapConv1d:
        return None
    return found


class PhaseConvTranspose1d(nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` (dilation 1, one group, no output padding) that runs phase by phase where
    :func:`by_products` allows: the same parameters and names, the output up to float rounding.

    Output sample ``m * stride + r`` (phase r) only hears the taps ``j`` with ``(j - padding) % stride == r``,
    each reading input frame ``m - (j - padding) // stride``. Phases whose taps read the same frames are
    one :func:`shifted_products`, their taps' weights stacked, interleaved into the output after (joe's
    kernel 2 * stride: two such groups of stride / 2 phases, two taps each)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.dilation != (1,) or self.groups != 1 or self.output_padding != (0,) or self.padding_mode != "zeros":
            raise ValueError("PhaseConvTranspose1d takes dilation 1, one group, no output padding, zero padding")

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """x ``[batch, in, time]`` -> ``[batch, out, (time - 1) * stride - 2 * padding + kernel]``."""
        (kernel,), (stride,), (padding,) = self.kernel_size, self.stride, self.padding
        # A kernel shorter than the stride leaves phases no tap reaches: PyTorch's own for that layout.
        if not by_products(x) or output_size is not None or kernel < stride:
            return super().forward(x, output_size)
        batch, channels = x.shape[0], self.out_channels
        length = (x.shape[2] - 1) * stride - 2 * padding + kernel
        frames = -(-length // stride)
        taps_of: dict[int, list[tuple[int, int]]] = {phase: [] for phase in range(stride)}
        for tap in range(kernel):
            frame_offset, phase = divmod(tap - padding, stride)
            taps_of[phase].append((frame_offset, tap))
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for phase, taps in taps_of.items():
            taps.sort()
            groups.setdefault(tuple(offset for offset, _ in taps), []).append((phase, [tap for _, tap in taps]))
        weight = self.weight.permute(2, 1, 0)  # [kernel, out, in]
        out = x.new_empty(batch, channels, frames, stride)
        for offsets, members in groups.items():
            # matrices[i]: the i-th tap of every phase in the group, stacked phase after phase.
            matrices = torch.stack([torch.cat([weight[taps[i]] for _, taps in members]) for i in range(len(offsets))])
            bias = None if self.bias is None else self.bias.repeat(len(members))
            phased = shifted_products(x, matrices, [-offset for offset in offsets], bias, frames)
            phases = [phase for phase, _ in members]
            # A run of consecutive phases (joe's are) is written through a slice, not a gather.
            run = phases == list(range(phases[0], phases[-1] + 1))
            index = slice(phases[0], phases[-1] + 1) if run else phases
            out[..., index] = phased.view(batch, len(members), channels, frames).permute(0, 2, 3, 1)
        return out.view(batch, channels, frames * stride)[..., :length]


class ResBlock(nn.Module):
    """HiFi-GAN residual block. Type "1": per dilation a dilated conv then an undilated one (``convs1``,
    ``convs2``); type "2": one dilated conv per dilation (``convs``). Inputs of every conv are masked
    when a mask is given, so padding in a batch reads as the zero padding a lone utterance gets."""

    def __init__(self, kind: str, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()

        def conv(dilation: int) -> nn.Conv1d:
            return TapConv1d(
                channels, channels, kernel_size, dilation=dilation, padding=dilation * (kernel_size - 1) // 2
            )

        self.kind = kind
        if kind == "1":
            self.convs1 = nn.ModuleList(conv(d) for d in dilations)
            self.convs2 = nn.ModuleList(conv(1) for _ in dilations)
        else:
            self.convs = nn.ModuleList(conv(d) for d in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x ``[batch, channels, samples]``, mask ``[batch, 1, samples]`` or None -> same shape as x."""
        stages = zip(self.convs1, self.convs2) if self.kind == "1" else ((conv,) for conv in self.convs)
        for stage in stages:
            found = [conv_tensors(conv, x.shape[0]) for conv in stage] if by_products(x) else [None]
            if all(found):
                # Activation, convolution and residual sum in one pass (TapConv1d.unit): the same bits as
                # the steps below, or, through adapters that fold into the weights, their output up to rounding.
                y = x
                for i, (conv, tensors) in enumerate(found):
                    y = conv.unit(y, LRELU_SLOPE, mask, x if i == len(stage) - 1 else None, tensors)
                x = y
                continue
            y = x
            for conv in stage:
                y = F.leaky_relu(y, LRELU_SLOPE)
                y = conv(y if mask is None else y * mask)
            # Without gradients the sum takes the conv's fresh output in place (the same sum, one less
            # allocation of a whole signal).
            x = x + y if torch.is_grad_enabled() else y.add_(x)
        return x if mask is None else x * mask


class Decoder(nn.Module):
    """HiFi-GAN generator: latent frames -> waveform, upsampled by ``hop_length`` in all."""

    def __init__(self, config: PiperVitsConfig) -> None:
        super().__init__()
        channels = config.upsample_initial_channel
        self.conv_pre = nn.Conv1d(config.inter_channels, channels, 7, padding=3)
        self.rates = config.upsample_rates
        self.ups = nn.ModuleList(
            PhaseConvTranspose1d(channels >> i, channels >> (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes))
        )
        self.resblocks = nn.ModuleList(
            ResBlock(config.resblock, channels >> (i + 1), k, d)
            for i in range(len(self.ups))
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.kernels = len(config.resblock_kernel_sizes)
        self.conv_post = TapConv1d(channels >> len(self.ups), 1, 7, padding=3, bias=False)

    def forward(
        self, z: torch.Tensor, lengths: torch.Tensor | None = None, row_scope: RowScope | None = None
    ) -> torch.Tensor:
        """z ``[batch, inter, frames]`` (zero past each length) -> audio ``[batch, frames * hop]``.

        ``lengths`` (frames, ``[batch]``) when items differ in length: every conv input is then masked
        past its item's end, as a lone item's zero padding would be. (Piper masks only z: in its batches
        the last samples of a shorter item hear the padding's activations, up to ~1e-4 on joe.)

        Where the convolutions run as products (:func:`by_products`) a batch is decoded row by row, each
        at its own length: the products go row by row anyway, and a row alone needs no mask and reads no
        padding. ``row_scope(row)``: the context row ``row`` runs in by itself (adapters that route each
        row to its own voice narrow to that row's: :func:`chorus.adapters.layer.row_scopes`); without one,
        a batch whose adapters route rows apart is decoded whole."""
        if z.shape[0] == 1 or not by_products(z) or (row_scope is None and routes_rows(self)):
            return self._decode(z, lengths)
        frames = [z.shape[2]] * z.shape[0] if lengths is None else lengths.tolist()
        hop = math.prod(self.rates)
        audio = z.new_zeros(z.shape[0], z.shape[2] * hop)
        for row, length in enumerate(frames):
            if length == 0:  # nothing to say: the row stays silent
                continue
            with nullcontext() if row_scope is None else row_scope(row):
                audio[row, : length * hop] = self._decode(z[row : row + 1, :, :length], None)[0]
        return audio

    def _decode(self, z: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """:meth:`forward` of the whole batch at once."""
        mask = None if lengths is None else sequence_mask(lengths, z.shape[2])
        # Without gradients the activations and sums below reuse tensors nothing else holds (each a fresh
        # output of the op before): the same values, fewer whole-signal allocations.
        inplace = not torch.is_grad_enabled()
        x = self.conv_pre(z)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x if mask is None else x * mask, LRELU_SLOPE, inplace))
            if mask is not None:
                mask = mask.repeat_interleave(self.rates[i], dim=2)
            blocks = self.resblocks[i * self.kernels : (i + 1) * self.kernels]
            total = blocks[0](x, mask)
            for block in blocks[1:]:
                total = total.add_(block(x, mask)) if inplace else total + block(x, mask)
            x = total.div_(self.kernels) if inplace else total / self.kernels
        found = conv_tensors(self.conv_post, x.shape[0]) if by_products(x) else None
        if found is None:
            x = self.conv_post(F.leaky_relu(x, inplace=inplace))
        else:  # the activation in the convolution's pass; its default slope, as Piper's
            conv, tensors = found
            x = conv.unit(x, POST_SLOPE, tensors=tensors)
        x = x.tanh_() if inplace else torch.tanh(x)
        return (x if mask is None else x * mask)[:, 0]


# ---------------------------------------------------------------- the generator


@dataclass
class PiperOutput:
    """What :meth:`PiperGenerator.forward` returns.

    audio ``[batch, samples]`` (zero past each item's length), audio_lengths ``[batch]`` samples,
    durations ``[batch, time]`` latent frames per phoneme id (``hop_length`` samples each; zero at padding).
    """

    audio: torch.Tensor
    audio_lengths: torch.Tensor
    durations: torch.Tensor


def sequence_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """``[batch]`` lengths -> ``[batch, 1, length]`` float mask, 1 at valid positions."""
    return (torch.arange(length, device=lengths.device)[None, :] < lengths[:, None]).unsqueeze(1).float()


class PiperGenerator(nn.Module):
    """A Piper voice's VITS generator: phoneme ids in, audio and per-phoneme durations out.

    Build it from a voice with :meth:`from_piper`; ``voice`` then holds the json's phoneme map and default
    scales (``generator.voice.text_ids("Hello.")`` makes ids as Piper does).
    """

    def __init__(self, config: PiperVitsConfig, voice: PiperVoiceConfig | None = None) -> None:
        super().__init__()
        self.config, self.voice = config, voice
        self.enc_p = TextEncoder(config)
        self.dp = DurationPredictor(config)
        self.flow = Flow(config)
        self.dec = Decoder(config)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @classmethod
    def from_piper(cls, onnx_path: str | Path, json_path: str | Path | None = None) -> PiperGenerator:
        """Load a Piper voice: its sizes and weights from ``onnx_path``, its phoneme map from the json
        beside it (``voice.onnx.json``) unless ``json_path`` names another."""
        graph = read_piper_graph(onnx_path)
        voice = PiperVoiceConfig.read(json_path or f"{onnx_path}.json")
        if voice.num_speakers > 1 or any(name.startswith("emb_g.") for name in graph.weights):
            raise ValueError(f"{onnx_path}: multi-speaker Piper voices are not supported yet (single-speaker only)")
        try:
            config = read_config(graph, voice.sample_rate)
        except (KeyError, IndexError) as error:  # a weight or convolution a Piper VITS export has
            raise ValueError(f"{onnx_path}: not a Piper VITS export (nothing at {error})") from None
        if voice.largest_id >= config.n_symbols:  # an IndexError when it was first spoken
            raise ValueError(
                f"{json_path or f'{onnx_path}.json'}: phoneme_id_map holds id {voice.largest_id}, "
                f"past the {config.n_symbols} symbols of {onnx_path}: not this voice's config"
            )
        # Built on the meta device: no time spent drawing random weights that are replaced at once.
        with torch.device("meta"):
            model = cls(config, voice)
        model.load_state_dict(piper_state_dict(graph, model), assign=True)
        return model.eval()

    def forward(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        noise_scale: float | torch.Tensor | None = None,
        length_scale: float | torch.Tensor | None = None,
        noise_w: float | None = None,
        generator: Noise = None,
        row_scope: RowScope | None = None,
    ) -> PiperOutput:
        """Speak a batch of phoneme-id sequences.

        ids ``[batch, time]`` (any valid id, e.g. 0, past each length), lengths ``[batch]``. The scales default to the
        voice's (its json's ``inference``); at noise_scale = noise_w = 0 the result is deterministic and
        matches Piper's onnxruntime output for the same ids. ``length_scale`` and ``noise_scale`` may be tensors
        ``[batch, 1, 1]`` (each row its own pace, its own prior noise). ``generator`` seeds the noise: one for
        the batch, or one per row (:func:`draw_noise`). ``row_scope``: see :meth:`Decoder.forward`.
        """
        defaults = (self.voice.noise_scale, self.voice.length_scale, self.voice.noise_w) if self.voice else PIPER_SCALES
        noise_scale = defaults[0] if noise_scale is None else noise_scale
        length_scale = defaults[1] if length_scale is None else length_scale
        noise_w = defaults[2] if noise_w is None else noise_w

        z, frame_lengths, durations = self.latent(ids, lengths, None, noise_scale, length_scale, noise_w, generator)
        padded = bool((frame_lengths < z.shape[2]).any())
        audio = self.dec(z, frame_lengths if padded else None, row_scope)
        return PiperOutput(audio, frame_lengths * self.hop_length, durations.long())

    def predicted_durations(
        self,
        hidden: torch.Tensor,
        text_mask: torch.Tensor,
        length_scale: float | torch.Tensor = 1.0,
        noise_w: float = 0.0,
        generator: Noise = None,
    ) -> torch.Tensor:
        """Frames per phoneme id from the duration predictor: the text encoder's hidden ``[batch, hidden,
        time]`` and text_mask ``[batch, 1, time]`` -> durations ``[batch, time]`` (float, whole numbers)."""
        logw = self.dp(hidden, text_mask, noise_w, generator)
        return torch.ceil(torch.exp(logw) * text_mask * length_scale)[:, 0]

    def latent(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        durations: torch.Tensor | None = None,
        noise_scale: float | torch.Tensor = 0.0,
        length_scale: float | torch.Tensor = 1.0,
        noise_w: float = 0.0,
        generator: Noise = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder's input: ids ``[batch, time]``, lengths ``[batch]`` -> z ``[batch, inter, frames]``
        (zero past each item's frames), frame_lengths ``[batch]``, durations ``[batch, time]`` (float).

        ``durations`` (frames per id ``[batch, time]``) replace the duration predictor's: adaptation
        decodes a recording's text with the recording's own aligned durations, so the generated audio
        lines up with the recording frame for frame.
        """
        text_mask = sequence_mask(lengths, ids.shape[1])
        hidden, m_p, logs_p = self.enc_p(ids, text_mask)
        if durations is None:
            durations = self.predicted_durations(hidden, text_mask, length_scale, noise_w, generator)
        else:
            durations = durations.to(m_p.dtype) * text_mask[:, 0]
        frame_lengths = durations.sum(dim=1).clamp_min(1).long()
        frames = int(frame_lengths.max())
        frame_mask = sequence_mask(frame_lengths, frames)

        # Each frame reads the phoneme whose span covers it (Piper multiplies by a one-hot path: same values).
        ends = torch.cumsum(durations, dim=1)
        positions = torch.arange(frames, device=ids.device, dtype=ends.dtype).repeat(len(ids), 1)
        owner = torch.searchsorted(ends, positions, right=True)
        owner = owner.clamp(max=ids.shape[1] - 1)[:, None, :].expand(-1, m_p.shape[1], -1)
        m_p, logs_p = m_p.gather(2, owner) * frame_mask, logs_p.gather(2, owner) * frame_mask
        if torch.is_tensor(noise_scale) or noise_scale:
            noise = draw_noise(tuple(m_p.shape), frame_lengths, generator, m_p)
            m_p = m_p + noise * torch.exp(logs_p) * noise_scale
        return self.flow(m_p, frame_mask) * frame_mask, frame_lengths, durations


# ---------------------------------------------------------------- reading the ONNX graph


@dataclass
class PiperGraph:
    """What the loader needs of a Piper ``.onnx``: float initializers by name, and every Conv and
    ConvTranspose by the module path its node name spells (``/flow/flows.6/enc/in_layers.0/Conv`` ->
    ``flow.flows.6.enc.in_layers.0``): its weight and bias initializer names and its attributes."""

    weights: dict[str, np.ndarray]
    convs: dict[str, tuple[list[str], dict[str, list[int] | int]]]
    embedding: str  # the initializer the text encoder's Gather reads (exported under the name "sid")
    consumers: dict[str, list[str]]  # initializer -> op types that read it


def read_piper_graph(path: str | Path) -> PiperGraph:
    """Read a Piper ``.onnx`` (needs the ``onnx`` package): its float weights and its convolutions."""
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as error:
        raise ImportError("loading a Piper voice needs 'pip install onnx'") from error
    try:
        graph = onnx.load(str(path)).graph
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and onnx's own: a truncated or corrupt file
        raise ValueError(f"{path}: not a readable ONNX file ({type(error).__name__}: {error})") from None
    weights = {
        tensor.name: numpy_helper.to_array(tensor)
        for tensor in graph.initializer
        if tensor.data_type == onnx.TensorProto.FLOAT
    }
    convs, consumers, embedding = {}, {}, None
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
        if node.op_type in ("Conv", "ConvTranspose"):
            module = node.name.strip("/").rsplit("/", 1)[0].replace("/", ".")
            attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            convs[module] = (list(node.input[1:]), attributes)
        if node.op_type == "Gather" and node.name == "/enc_p/emb/Gather":
            embedding = node.input[0]
    if embedding is None:
        raise ValueError(f"{path}: no /enc_p/emb/Gather node: not a Piper VITS export")
    return PiperGraph(weights, convs, embedding, consumers)


def _indices(weights: dict[str, np.ndarray], pattern: str) -> list[int]:
    """Sorted distinct integers captured by ``pattern`` (one group) over the weight names."""
    return sorted({int(m.group(1)) for name in weights if (m := re.fullmatch(pattern, name))})


def read_config(graph: PiperGraph, sample_rate: int) -> PiperVitsConfig:
    """The generator's sizes from initializer shapes and Conv attributes (strides, dilations)."""
    w, convs = graph.weights, graph.convs
    n_symbols, hidden = w[graph.embedding].shape
    rel_k = w["enc_p.encoder.attn_layers.0.emb_rel_k"]  # [1 (shared by heads), 2 * window + 1, k_channels]
    ffn = w["enc_p.encoder.ffn_layers.0.conv_1.weight"]  # [filter, hidden, kernel]
    couplings = _indices(w, r"flow\.flows\.(\d+)\.pre\.weight")
    coupling = f"flow.flows.{couplings[0]}"
    if w[f"{coupling}.post.weight"].shape[0] != w[f"{coupling}.pre.weight"].shape[1]:
        raise ValueError("the flow's couplings are not mean-only (Piper's always are): not a Piper VITS export")
    wn_layers = len(_indices(w, rf"{re.escape(coupling)}\.enc\.in_layers\.(\d+)\.bias"))
    first_wn = convs[f"{coupling}.enc.in_layers.0"][1]
    flow_dilation = convs[f"{coupling}.enc.in_layers.1"][1]["dilations"][0] if wn_layers > 1 else 1
    splines = _indices(w, r"dp\.flows\.(\d+)\.pre\.weight")
    ups = _indices(w, r"dec\.ups\.(\d+)\.weight")
    blocks = _indices(w, r"dec\.resblocks\.(\d+)\..*")
    kind = "1" if "dec.resblocks.0.convs1.0.weight" in w else "2"
    kernels = len(blocks) // len(ups)
    first_convs = "convs1" if kind == "1" else "convs"
    return PiperVitsConfig(
        n_symbols=n_symbols,
        hidden_channels=hidden,
        filter_channels=ffn.shape[0],
        n_heads=hidden // rel_k.shape[2],
        n_layers=len(_indices(w, r"enc_p\.encoder\.attn_layers\.(\d+)\.conv_q\.weight")),
        kernel_size=ffn.shape[2],
        window_size=(rel_k.shape[1] - 1) // 2,
        inter_channels=w["enc_p.proj.weight"].shape[0] // 2,
        flow_couplings=len(couplings),
        flow_wn_layers=wn_layers,
        flow_kernel_size=first_wn["kernel_shape"][0],
        flow_dilation_rate=flow_dilation,
        dp_filter_channels=w["dp.pre.weight"].shape[0],
        dp_kernel_size=w["dp.convs.convs_sep.0.weight"].shape[2],
        dp_layers=len(_indices(w, r"dp\.convs\.convs_sep\.(\d+)\.weight")),
        # Spline flows sit at odd indices 1, 3, ...; the export drops flows.1 (see DurationPredictor).
        dp_flows=(splines[-1] + 1) // 2,
        dp_bins=(w[f"dp.flows.{splines[0]}.proj.weight"].shape[0] + 1) // 3,
        resblock=kind,
        resblock_kernel_sizes=tuple(w[f"dec.resblocks.{j}.{first_convs}.0.weight"].shape[2] for j in range(kernels)),
        resblock_dilation_sizes=tuple(
            tuple(
                convs[f"dec.resblocks.{j}.{first_convs}.{k}"][1]["dilations"][0]
                for k in _indices(w, rf"dec\.resblocks\.{j}\.{first_convs}\.(\d+)\.weight")
            )
            for j in range(kernels)
        ),
        upsample_rates=tuple(convs[f"dec.ups.{i}"][1]["strides"][0] for i in ups),
        upsample_kernel_sizes=tuple(w[f"dec.ups.{i}.weight"].shape[2] for i in ups),
        upsample_initial_channel=w["dec.conv_pre.weight"].shape[0],
        sample_rate=sample_rate,
    )


def piper_state_dict(graph: PiperGraph, model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` from the graph's initializers; fails naming any parameter without a
    weight, any weight without a parameter, and any shape that differs.

    Three kinds of weights are not under their module names: the phoneme embedding, exported as ``sid``
    (Piper's export names four inputs but passes three, and the spare name landed on the first
    parameter), found as what the ``/enc_p/emb/Gather`` node reads; the flow's WaveNet weights, whose
    weight norm the export folded into anonymous tensors, found as the weight input of the Conv node
    named by module path; and ``dp.flows.0.logs``, folded into the constant ``exp(-logs)`` its inverse
    multiplies by. Everything else in the graph is a scalar or an integer constant of the traced code
    (shapes, eps, sqrt(hidden))."""
    w, found = graph.weights, {}
    found["enc_p.emb.weight"] = graph.embedding
    for path, (inputs, _) in graph.convs.items():
        for name, kind in zip(inputs, ("weight", "bias")):
            found[f"{path}.{kind}"] = name
    for name in w:
        if re.fullmatch(r"(enc_p|dp|flow|dec)\..+", name):
            found[name] = name
    values = {key: w[name] for key, name in found.items() if name in w}
    folded = "/dp/flows.0/Exp_output_0"
    if "dp.flows.0.logs" not in w and folded in w and graph.consumers.get(folded) == ["Mul"]:
        values["dp.flows.0.logs"] = -np.log(w[folded].astype(np.float64)).astype(np.float32)
        found["dp.flows.0.logs"] = folded

    expected = model.state_dict()
    used = set(found.values())
    leftover = sorted(name for name, value in w.items() if name not in used and value.size > 1)
    missing = sorted(set(expected) - set(values))
    unexpected = sorted(set(values) - set(expected))
    wrong = sorted(k for k in set(values) & set(expected) if tuple(values[k].shape) != tuple(expected[k].shape))
    problems = [
        f"{label}: {', '.join(names)}"
        for label, names in (
            ("parameters with no weight in the graph", missing),
            ("weights with no parameter", unexpected + leftover),
            ("shapes that differ", [f"{k} {tuple(values[k].shape)} != {tuple(expected[k].shape)}" for k in wrong]),
        )
        if names
    ]
    if problems:
        raise ValueError("the Piper graph does not map onto the generator: " + "; ".join(problems))
    return {key: torch.tensor(values[key]) for key in expected}
