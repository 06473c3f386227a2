"""The multi-speaker acoustic model: phonemes + speaker -> log-mel frames, non-autoregressive.

    phoneme ids ──embed──> encoder (FFT blocks) ──> h ──+ speaker ──> prior mean mu (mel space)
                                                      │                 │  MAS (training)
                                                      ├─> duration predictor (log frames)
                                                      └─> expand by durations ──> decoder ──> mel

Alignment is learned inside the model (Glow-TTS / Grad-TTS prior + monotonic alignment search), so
user recordings need no external aligner. Speakers are given either as rows of an embedding table or
directly as vectors; both go through one projection (``speaker_proj``), so a new voice can be a
vector. Module names are stable (``encoder.layers.0.attn.q_proj`` ...) so adapters can target them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from chorus.models.alignment import (
    beta_binomial_log_prior,
    durations_to_path,
    monotonic_alignment_search,
)
from chorus.models.config import AcousticConfig
from chorus.models.reversible import reversible


def lengths_to_mask(lengths: torch.Tensor, max_length: int | None = None) -> torch.Tensor:
    """``[batch]`` lengths -> ``[batch, max_length]`` bool mask, True at valid positions."""
    max_length = int(lengths.max().item()) if max_length is None else max_length
    return torch.arange(max_length, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def sinusoidal_positions(n_positions: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[n_positions, dim]`` float32 fixed sinusoidal position table (Vaswani et al.)."""
    position = torch.arange(n_positions, device=device).unsqueeze(1).float()
    scale = torch.exp(torch.arange(0, dim, 2, device=device).float() * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim, device=device)
    table[:, 0::2] = torch.sin(position * scale)
    table[:, 1::2] = torch.cos(position * scale)
    return table


class MultiHeadAttention(nn.Module):
    """Self-attention with separate q/k/v/out projections (named so adapters can target them).

    ``heads`` of width ``dim // n_heads`` each; fewer than ``n_heads`` after structured pruning
    (q/k/v then project to ``heads * dim // n_heads`` and ``out_proj`` from it).
    """

    def __init__(self, dim: int, n_heads: int, dropout: float, heads: int | None = None):
        super().__init__()
        self.n_heads = n_heads if heads is None else heads
        self.head_dim = dim // n_heads
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(dim, inner)
        self.k_proj = nn.Linear(dim, inner)
        self.v_proj = nn.Linear(dim, inner)
        self.out_proj = nn.Linear(inner, dim)
        self.dropout = dropout

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, time, dim]``, mask ``[batch, time]`` (True = valid) -> ``[batch, time, dim]``."""
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        attn_mask = mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class ConvFeedForward(nn.Module):
    """Position-wise feed-forward as two 1-D convolutions over time (FastSpeech)."""

    def __init__(self, dim: int, hidden: int, kernel: int, dropout: float):
        super().__init__()
        self.conv1 = nn.Conv1d(dim, hidden, kernel, padding=kernel // 2)
        self.conv2 = nn.Conv1d(hidden, dim, kernel, padding=kernel // 2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, time, dim]`` -> ``[batch, time, dim]``; padded steps are zeroed before each conv."""
        keep = mask.unsqueeze(1).to(x.dtype)
        hidden = F.relu(self.conv1(x.transpose(1, 2) * keep))
        return self.conv2(self.dropout(hidden) * keep).transpose(1, 2)


class FFTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ff(norm(x)). ``name`` (``encoder.layers.0``)
    finds the block's own widths in ``config.layer_sizes``."""

    def __init__(self, config: AcousticConfig, name: str = ""):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        heads = config.size(f"{name}.attn", config.n_heads)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout, heads)
        self.norm2 = nn.LayerNorm(config.d_model)
        hidden = config.size(f"{name}.ff", config.ff_hidden)
        self.ff = ConvFeedForward(config.d_model, hidden, config.ff_kernel, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), mask))
        x = x + self.dropout(self.ff(self.norm2(x), mask))
        return x * mask.unsqueeze(-1).to(x.dtype)

    # The two branches of the reversible coupling (AcousticConfig.reversible) reuse this block's
    # sub-layers, so parameter names, and the adapters that target them, are the same either way.
    def attention_branch(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """F: ``attn(norm1(x))`` zeroed at padding; x ``[batch, time, dim]`` -> ``[batch, time, dim]``."""
        return self.attn(self.norm1(x), mask) * mask.unsqueeze(-1).to(x.dtype)

    def feed_forward_branch(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """G: ``ff(norm2(x))`` zeroed at padding; x ``[batch, time, dim]`` -> ``[batch, time, dim]``."""
        return self.ff(self.norm2(x), mask) * mask.unsqueeze(-1).to(x.dtype)

    f, g = attention_branch, feed_forward_branch  # the branches chorus.models.reversible couples


class TransformerStack(nn.Module):
    """Sinusoidal positions + FFT blocks + final norm. ``[batch, time, dim]`` in and out.

    Two ways to spend compute on saving activation memory in training:

    * ``gradient_checkpointing`` (attribute, default False; neither config nor checkpoint): each
      block runs under ``torch.utils.checkpoint`` while grad is enabled, so only block inputs are
      stored and every block's forward runs again in backward: ~one extra forward of each block per
      step (~25-35% slower). Same function, same gradients; dropout RNG is replayed.
    * ``config.reversible``: the blocks form a reversible stack (see :mod:`chorus.models.reversible`):
      ``(x1, x2) = (x, x)``, per block ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)`` with F / G the
      block's attention / feed-forward sub-layers, output ``norm((y1 + y2) / 2)``. Block activations
      are recomputed from the outputs in backward, so their memory is O(1) in depth, for about the
      cost of checkpointing. A different function from the plain stack: only for bases trained with
      it. Needs dropout 0 (the config refuses otherwise); ``gradient_checkpointing`` is ignored.
      Inputs are recovered by subtraction, so in float32 gradients match plain autograd only to
      rounding (exactly, to float64 rounding, in float64).

    Both recompute in backward: module state read in forward (an active adapter, per-sample
    routing) must not change between a forward and its backward.
    """

    def __init__(self, config: AcousticConfig, n_layers: int, name: str = ""):
        super().__init__()
        # Positions are made per call for the sequence at hand, not stored: a table of
        # max_positions rows would be 3 MiB per stack, resident in every model and in every
        # training step's weights, for sequences a few hundred steps long.
        self.max_positions, self.dim = config.max_positions, config.d_model
        self.layers = nn.ModuleList(FFTBlock(config, f"{name}.layers.{i}") for i in range(n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.reversible = config.reversible
        self.gradient_checkpointing = False

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        """``[length, dim]`` float32 sinusoidal positions of the first ``length`` steps."""
        if length > self.max_positions:
            raise ValueError(f"sequence of {length} steps exceeds max_positions ({self.max_positions})")
        return sinusoidal_positions(length, self.dim, device)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.positions(x.shape[1], x.device).to(x.dtype)
        if self.reversible and len(self.layers):
            y1, y2 = reversible(tuple(self.layers), x, x, (mask,))
            x = (y1 + y2) / 2
        else:
            for layer in self.layers:
                if self.gradient_checkpointing and torch.is_grad_enabled():
                    x = checkpoint(layer, x, mask, use_reentrant=False)
                else:
                    x = layer(x, mask)
        return self.norm(x) * mask.unsqueeze(-1).to(x.dtype)


class VariancePredictor(nn.Module):
    """Two conv layers + linear: one scalar per phoneme (log-duration, pitch or energy). ``name``
    (``duration_predictor``) finds its own widths in ``config.layer_sizes``."""

    def __init__(self, config: AcousticConfig, name: str = ""):
        super().__init__()
        kernel = config.predictor_kernel
        hidden1 = config.size(f"{name}.conv1", config.predictor_hidden)
        hidden2 = config.size(f"{name}.conv2", config.predictor_hidden)
        self.conv1 = nn.Conv1d(config.d_model, hidden1, kernel, padding=kernel // 2)
        self.norm1 = nn.LayerNorm(hidden1)
        self.conv2 = nn.Conv1d(hidden1, hidden2, kernel, padding=kernel // 2)
        self.norm2 = nn.LayerNorm(hidden2)
        self.proj = nn.Linear(hidden2, 1)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, text, dim]`` -> ``[batch, text]`` (zero at padding)."""
        keep = mask.unsqueeze(-1).to(x.dtype)
        h = self.dropout(self.norm1(F.relu(self.conv1((x * keep).transpose(1, 2))).transpose(1, 2)))
        h = self.dropout(self.norm2(F.relu(self.conv2((h * keep).transpose(1, 2))).transpose(1, 2)))
        return self.proj(h).squeeze(-1) * mask.to(x.dtype)


class VarianceEmbedding(nn.Module):
    """Optional phoneme-level pitch or energy: a predictor, and a 1-D conv that embeds the value."""

    def __init__(self, config: AcousticConfig, name: str = ""):
        super().__init__()
        self.predictor = VariancePredictor(config, f"{name}.predictor")
        self.embed = nn.Conv1d(1, config.d_model, kernel_size=3, padding=1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor, target: torch.Tensor | None, scale: float = 1.0):
        """Returns (h + embedding of the value, prediction ``[batch, text]``).

        The target is used when given (teacher forcing), the prediction otherwise.
        """
        prediction = self.predictor(h, mask)
        value = target if target is not None else prediction * scale
        return h + self.embed(value.unsqueeze(1)).transpose(1, 2), prediction


@dataclass
class AcousticOutput:
    """Tensors of one forward pass. Mels are in the model's normalized space unless noted."""

    mel: torch.Tensor  # [batch, frames, n_mels] decoder output (normalized)
    frame_mask: torch.Tensor  # [batch, frames] True at valid frames
    log_duration: torch.Tensor  # [batch, text] predicted log(1 + frames)
    durations: torch.Tensor  # [batch, text] frames per token used to expand (MAS or predicted)
    prior_mean: torch.Tensor | None = None  # [batch, frames, n_mels] aligned prior mean (training)
    pitch: torch.Tensor | None = None  # [batch, text] predicted pitch (if enabled)
    energy: torch.Tensor | None = None  # [batch, text] predicted energy (if enabled)
    pitch_target: torch.Tensor | None = None  # [batch, text] token-averaged targets (training)
    energy_target: torch.Tensor | None = None


class AcousticModel(nn.Module):
    """Non-autoregressive multi-speaker TTS acoustic model. See the module docstring for the flow."""

    def __init__(self, config: AcousticConfig):
        super().__init__()
        self.config = config
        self.symbol_embedding = nn.Embedding(config.n_symbols, config.d_model, padding_idx=0)
        self.speaker_embedding = nn.Embedding(config.n_speakers, config.speaker_dim)
        self.speaker_proj = nn.Linear(config.speaker_dim, config.d_model)
        self.encoder = TransformerStack(config, config.encoder_layers, "encoder")
        self.prior_proj = nn.Linear(config.d_model, config.n_mels)
        self.duration_predictor = VariancePredictor(config, "duration_predictor")
        self.pitch = VarianceEmbedding(config, "pitch") if config.use_pitch else None
        self.energy = VarianceEmbedding(config, "energy") if config.use_energy else None
        self.decoder = TransformerStack(config, config.decoder_layers, "decoder")
        self.mel_proj = nn.Linear(config.d_model, config.n_mels)
        # Normalization statistics live in the checkpoint so features never drift from the weights.
        self.register_buffer("mel_mean", torch.zeros(config.n_mels))
        self.register_buffer("mel_std", torch.ones(config.n_mels))
        self.register_buffer("pitch_stats", torch.tensor([0.0, 1.0]))  # log-F0 mean, std (use_pitch)
        nn.init.normal_(self.speaker_embedding.weight, std=0.3)

    # -- normalization -------------------------------------------------------------------------
    def normalize_mel(self, log_mel: torch.Tensor) -> torch.Tensor:
        return (log_mel - self.mel_mean) / self.mel_std

    def denormalize_mel(self, mel: torch.Tensor) -> torch.Tensor:
        return mel * self.mel_std + self.mel_mean

    def normalize_pitch(self, log_f0: torch.Tensor) -> torch.Tensor:
        return (log_f0 - self.pitch_stats[0]) / self.pitch_stats[1]

    # -- pieces --------------------------------------------------------------------------------
    def speaker_condition(
        self, speaker_ids: torch.Tensor | None = None, speaker_vectors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[batch]`` ids or ``[batch, speaker_dim]`` vectors -> ``[batch, 1, d_model]``."""
        if (speaker_ids is None) == (speaker_vectors is None):
            raise ValueError("give exactly one of speaker_ids or speaker_vectors")
        if speaker_vectors is None:
            if speaker_ids.numel() and (speaker_ids.min() < 0 or speaker_ids.max() >= self.config.n_speakers):
                raise ValueError(f"speaker id out of range 0..{self.config.n_speakers - 1}")
            speaker_vectors = self.speaker_embedding(speaker_ids)
        return self.speaker_proj(speaker_vectors).unsqueeze(1)

    def encode(self, phonemes: torch.Tensor, text_mask: torch.Tensor, speaker: torch.Tensor):
        """Returns (h ``[batch, text, d_model]`` with speaker added, prior mean ``[batch, text, n_mels]``)."""
        h = self.encoder(self.symbol_embedding(phonemes), text_mask)
        h = (h + speaker) * text_mask.unsqueeze(-1).to(h.dtype)
        return h, self.prior_proj(h)

    @staticmethod
    def alignment_log_prob(prior_mean: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        """Unit-variance Gaussian log-likelihood of every frame under every token.

        prior_mean ``[batch, text, n_mels]``, mel ``[batch, frames, n_mels]`` -> ``[batch, text, frames]``
        (constant terms dropped: they do not change the best path).
        """
        return -0.5 * (prior_mean.pow(2).sum(-1, keepdim=True) + mel.pow(2).sum(-1).unsqueeze(1)) + torch.bmm(
            prior_mean, mel.transpose(1, 2)
        )

    def decode(
        self, h: torch.Tensor, path: torch.Tensor, frame_mask: torch.Tensor, speaker: torch.Tensor
    ) -> torch.Tensor:
        """Expand token states by the 0/1 path ``[batch, text, frames]`` and decode to mel (normalized)."""
        expanded = torch.bmm(path.transpose(1, 2), h) + speaker
        x = expanded * frame_mask.unsqueeze(-1).to(h.dtype)
        if x.shape[1] <= self.decoder.max_positions:
            out = self.decoder(x, frame_mask)
        else:  # only the items past the positions are decoded in windows; the others as they would be alone
            out = torch.zeros_like(x)
            lengths = frame_mask.sum(dim=1)
            long = lengths > self.decoder.max_positions
            if not long.all():
                fit = int(lengths[~long].max())
                out[~long, :fit] = self.decoder(x[~long, :fit], frame_mask[~long, :fit])
            if long.any():  # padding alone can make a batch wider than the positions
                out[long] = self._decode_in_windows(x[long], frame_mask[long])
        return self.mel_proj(out) * frame_mask.unsqueeze(-1).to(h.dtype)

    def _decode_in_windows(self, x: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        """The decoder over ``x`` ``[batch, frames, dim]`` longer than its positions reach (a long sentence
        read slowly, or one that numbers expand: "$1,234,567.67, ..." made 7,472 frames, and the request
        failed): windows of ``max_positions // 2`` frames, each overlapping the next by an eighth of that,
        crossfaded linearly. Shorter sequences never come here, so their output is the plain decoder's."""
        window = self.decoder.max_positions // 2
        overlap = max(1, window // 8)
        if window <= overlap:
            raise ValueError(f"max_positions {self.decoder.max_positions} is too few to decode in windows (4 at least)")
        total = x.shape[1]
        rise = torch.linspace(0, 1, overlap + 2, dtype=x.dtype, device=x.device)[1:-1]
        out = torch.zeros_like(x)
        start = 0
        while True:
            end = min(start + window, total)
            mask = frame_mask[:, start:end]
            # A batch item that has ended before this window has no frame to attend to (its rows would be
            # nan); it attends to its padding instead, which the caller's mask zeroes.
            mask = mask | ~mask.any(dim=1, keepdim=True)
            weight = torch.ones(end - start, dtype=x.dtype, device=x.device)
            if start:
                weight[:overlap] = rise
            if end < total:
                weight[-overlap:] = rise.flip(0)
            out[:, start:end] += self.decoder(x[:, start:end], mask) * weight[None, :, None]
            if end == total:
                return out
            start = end - overlap

    def _variances(self, h, text_mask, pitch_target, energy_target, pitch_scale=1.0, energy_scale=1.0):
        pitch = energy = None
        if self.pitch is not None:
            h, pitch = self.pitch(h, text_mask, pitch_target, pitch_scale)
        if self.energy is not None:
            h, energy = self.energy(h, text_mask, energy_target, energy_scale)
        return h, pitch, energy

    # -- training and inference ----------------------------------------------------------------
    def forward(
        self,
        phonemes: torch.Tensor,
        text_lengths: torch.Tensor,
        mel: torch.Tensor,
        frame_lengths: torch.Tensor,
        speaker_ids: torch.Tensor | None = None,
        speaker_vectors: torch.Tensor | None = None,
        pitch: torch.Tensor | None = None,
        energy: torch.Tensor | None = None,
        alignment_prior_weight: float = 0.0,
    ) -> AcousticOutput:
        """Teacher-forced pass for training.

        Args:
            phonemes: ``[batch, text]`` symbol ids (0 = padding); text_lengths ``[batch]``.
            mel: ``[batch, frames, n_mels]`` normalized log-mel targets; frame_lengths ``[batch]``.
            speaker_ids ``[batch]`` or speaker_vectors ``[batch, speaker_dim]``.
            pitch, energy: optional frame-level targets ``[batch, frames]``, averaged per token here.
            alignment_prior_weight: weight of a near-diagonal prior added to the alignment search
                (see :func:`beta_binomial_log_prior`); used early in pretraining, 0 afterwards.
        """
        text_mask = lengths_to_mask(text_lengths, phonemes.shape[1])
        frame_mask = lengths_to_mask(frame_lengths, mel.shape[1])
        speaker = self.speaker_condition(speaker_ids, speaker_vectors)
        h, prior_token = self.encode(phonemes, text_mask, speaker)
        # The search compares log-likelihoods summed over 80 mels: in float32 even under a bf16
        # autocast, whose 8-bit mantissa would blur which token explains a frame best.
        with torch.no_grad(), torch.autocast(mel.device.type, enabled=False):
            log_prob = self.alignment_log_prob(prior_token.detach().float(), mel.float())
            if alignment_prior_weight > 0:
                log_prob = log_prob + alignment_prior_weight * beta_binomial_log_prior(
                    text_lengths, frame_lengths, phonemes.shape[1], mel.shape[1]
                ).to(log_prob.device)
            path = monotonic_alignment_search(log_prob, text_lengths, frame_lengths).to(h.dtype)
        durations = path.sum(-1)
        prior_mean = torch.bmm(path.transpose(1, 2), prior_token)
        # Durations are learned from the alignment, without pushing gradients into the encoder
        # through this path (Glow-TTS), which keeps the alignment from chasing the predictor.
        log_duration = self.duration_predictor(h.detach(), text_mask)
        pitch_target, energy_target = self._token_average(pitch, path), self._token_average(energy, path)
        if (self.pitch is not None and pitch_target is None) or (self.energy is not None and energy_target is None):
            raise ValueError("this model predicts pitch/energy: pass frame-level pitch/energy targets")
        h, pitch_pred, energy_pred = self._variances(h, text_mask, pitch_target, energy_target)
        mel_out = self.decode(h, path, frame_mask, speaker)
        return AcousticOutput(
            mel_out,
            frame_mask,
            log_duration,
            durations,
            prior_mean,
            pitch_pred,
            energy_pred,
            pitch_target,
            energy_target,
        )

    @staticmethod
    def _token_average(frame_values: torch.Tensor | None, path: torch.Tensor) -> torch.Tensor | None:
        """Frame-level ``[batch, frames]`` -> token-level ``[batch, text]`` mean over aligned frames."""
        if frame_values is None:
            return None
        total = torch.bmm(path, frame_values.unsqueeze(-1).to(path.dtype)).squeeze(-1)
        return total / path.sum(-1).clamp(min=1)

    @torch.no_grad()
    def infer(
        self,
        phonemes: torch.Tensor,
        text_lengths: torch.Tensor,
        speaker_ids: torch.Tensor | None = None,
        speaker_vectors: torch.Tensor | None = None,
        length_scale: float = 1.0,
        pitch_scale: float = 1.0,
        energy_scale: float = 1.0,
        durations: torch.Tensor | None = None,
    ) -> AcousticOutput:
        """Synthesize. ``length_scale`` > 1 speaks slower. Returns normalized mels; see ``denormalize_mel``.

        ``durations`` ``[batch, text]`` (frames per token) replaces the predicted timing, e.g. a real
        recording's searched alignment or another speaker's predicted durations (``length_scale`` is
        then not applied).
        """
        text_mask = lengths_to_mask(text_lengths, phonemes.shape[1])
        speaker = self.speaker_condition(speaker_ids, speaker_vectors)
        h, _ = self.encode(phonemes, text_mask, speaker)
        log_duration = self.duration_predictor(h, text_mask)
        if durations is None:
            durations = torch.clamp(torch.round((torch.exp(log_duration) - 1) * length_scale), min=1)
        durations = durations.to(log_duration.dtype) * text_mask.to(log_duration.dtype)
        h, pitch, energy = self._variances(h, text_mask, None, None, pitch_scale, energy_scale)
        frame_lengths = durations.sum(-1).long()
        path = durations_to_path(durations.long()).to(h.dtype)
        frame_mask = lengths_to_mask(frame_lengths, path.shape[-1])
        mel = self.decode(h, path, frame_mask, speaker)
        return AcousticOutput(mel, frame_mask, log_duration, durations, None, pitch, energy)


def build_model(config: AcousticConfig, device: str | torch.device = "cpu") -> AcousticModel:
    """Build on ``device``; ``"meta"`` builds any size without allocating memory (to count parameters)."""
    with torch.device(device):
        return AcousticModel(config)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
