"""The acoustic model's training objective, and the inputs of one teacher-forced pass.

Kept with the model (not in a training loop) because every loop (pretraining, adaptation, many
voices) and the memory accounting compute exactly these losses from exactly these inputs.
"""

from __future__ import annotations

import math

import torch

from chorus.data.batching import Batch
from chorus.models.acoustic import AcousticModel, AcousticOutput


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values [batch, time, ...]`` over positions where ``mask [batch, time]`` is True."""
    mask = mask.to(values.dtype)
    while mask.dim() < values.dim():
        mask = mask.unsqueeze(-1)
    denominator = mask.sum() * (values[0, 0].numel() if values.dim() > 2 else 1)
    return (values * mask).sum() / denominator.clamp(min=1)


def compute_losses(
    model: AcousticModel, out: AcousticOutput, target: torch.Tensor, text_lengths: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Losses of one teacher-forced pass; ``target`` is the normalized mel ``[batch, frames, n_mels]``.

    mel: L1 of the decoder output; prior: Gaussian NLL of the frames under the aligned prior means
    (trains the alignment); duration: MSE of log(1 + frames) against the searched alignment.
    """
    text_mask = torch.arange(out.durations.shape[1], device=target.device)[None] < text_lengths[:, None]
    losses = {
        "mel": masked_mean((out.mel - target).abs(), out.frame_mask),
        "prior": masked_mean(0.5 * (target - out.prior_mean) ** 2 + 0.5 * math.log(2 * math.pi), out.frame_mask),
        "duration": masked_mean((out.log_duration - torch.log1p(out.durations)) ** 2, text_mask),
    }
    for name in ("pitch", "energy"):
        prediction, target_value = getattr(out, name), getattr(out, f"{name}_target")
        if prediction is not None:
            losses[name] = masked_mean((prediction - target_value) ** 2, text_mask)
    losses["total"] = sum(losses.values())
    return losses


def frame_energy(normalized_mel: torch.Tensor) -> torch.Tensor:
    """Energy target: the mean normalized log-mel of each frame ``[batch, frames]``."""
    return normalized_mel.mean(-1)


def step_inputs(model: AcousticModel, batch: Batch) -> dict:
    """Keyword arguments of ``model(...)`` for a batch: normalized mel, pitch and energy targets, every
    tensor on the model's device (batches are collated on the CPU)."""
    device = model.mel_mean.device
    mel = model.normalize_mel(batch.mel.to(device))
    pitch = None
    if model.pitch is not None:
        if batch.pitch is None:
            raise ValueError(
                "the model predicts pitch but the feature cache has none: delete "
                "features.safetensors in the run folder to rebuild it with pitch"
            )
        pitch = model.normalize_pitch(batch.pitch.to(device))
    return dict(
        phonemes=batch.phonemes.to(device),
        text_lengths=batch.text_lengths.to(device),
        mel=mel,
        frame_lengths=batch.frame_lengths.to(device),
        speaker_ids=batch.speakers.to(device),
        pitch=pitch,
        energy=frame_energy(mel) if model.energy is not None else None,
    )
