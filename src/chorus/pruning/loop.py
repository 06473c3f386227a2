"""The training loop every pruning technique shares: fine-tuning a pruned base, or training a sparse
(or, as the baseline, dense) model from scratch, on a corpus' feature cache.

One loop and one schedule for every technique, so the rows of a comparison differ only in what they
prune: linear warm-up to ``learning_rate``, then a linear fall to 0 at ``steps`` (short runs end
annealed, as the shipped base's schedule did). Masks (:class:`~chorus.pruning.masks.MaskSet`) keep
pruned weights at zero; ``on_step`` lets a technique change them (drop-and-regrow) after the
backward pass, while the dense gradient is still there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from chorus.data.batching import collate, make_batches
from chorus.data.features import FeatureCache
from chorus.models.acoustic import AcousticModel, build_model
from chorus.models.bundle import ModelBundle
from chorus.models.losses import compute_losses, step_inputs
from chorus.pruning.masks import MaskSet
from chorus.training.pretrain import base_optimizer, evaluate, split_validation
from chorus.training.progress import step_progress


@dataclass(frozen=True)
class Budget:
    """How long and how a model trains. ``alignment_prior_steps``: the near-diagonal alignment prior
    fades out over these first steps (from scratch only: a trained base aligns on its own)."""

    steps: int
    learning_rate: float
    warmup: int
    alignment_prior_steps: int = 0
    max_frames: int = 4_800
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 1234

    def rate(self, step: int) -> float:
        """The learning rate of step ``step`` (1-based)."""
        if step <= self.warmup:
            return self.learning_rate * step / max(self.warmup, 1)
        return self.learning_rate * max(0.0, (self.steps - step) / max(self.steps - self.warmup, 1))

    def prior_weight(self, step: int) -> float:
        if self.alignment_prior_steps <= 0:
            return 0.0
        return max(0.0, 1.0 - step / self.alignment_prior_steps)


@dataclass
class TrainingData:
    """A feature cache split into training and validation utterances (two per speaker held out)."""

    cache: FeatureCache
    train: np.ndarray
    validation: np.ndarray

    @classmethod
    def split(cls, cache: FeatureCache, seed: int = 1234) -> TrainingData:
        return cls(cache, *split_validation(cache, 2, seed))

    def batches(self, max_frames: int, seed: int) -> list[np.ndarray]:
        """One epoch of training batches (positions into ``train``)."""
        return make_batches(self.cache.frames()[self.train], max_frames, seed=seed)


@dataclass
class TrainResult:
    steps: int
    seconds: float  # inside training steps (batches, forward, backward, optimizer, masks)
    validation: dict[str, float]  # mean losses on the held-out utterances after the last step


def train(
    model: AcousticModel,
    data: TrainingData,
    budget: Budget,
    *,
    masks: MaskSet | None = None,
    on_step: Callable[[int], None] | None = None,
    title: str = "train",
    progress: bool = True,
) -> TrainResult:
    """Train ``model`` in place for ``budget.steps`` steps (0: only evaluate). ``on_step(step)`` runs
    after each backward pass, before the masks and the optimizer step."""
    torch.manual_seed(budget.seed)
    device = next(model.parameters()).device
    optimizer = base_optimizer(model, budget.learning_rate, budget.weight_decay)  # the base's own
    model.train()
    step, epoch, seconds = 0, 0, 0.0
    with step_progress(title, progress) as bar:
        task = bar.add_task("steps", total=budget.steps, status="")
        while step < budget.steps:
            for positions in data.batches(budget.max_frames, budget.seed + epoch):
                if step >= budget.steps:
                    break
                started = time.perf_counter()
                batch = collate(data.cache, data.train[positions]).to(device)
                step += 1
                for group in optimizer.param_groups:
                    group["lr"] = budget.rate(step)
                inputs = step_inputs(model, batch)
                out = model(**inputs, alignment_prior_weight=budget.prior_weight(step))
                losses = compute_losses(model, out, inputs["mel"], inputs["text_lengths"])
                optimizer.zero_grad(set_to_none=True)
                losses["total"].backward()
                if on_step is not None:
                    on_step(step)
                if masks is not None:
                    masks.mask_gradients()
                torch.nn.utils.clip_grad_norm_(model.parameters(), budget.grad_clip)
                optimizer.step()
                if masks is not None:
                    masks.apply()  # weight decay moves pruned zeros too
                seconds += time.perf_counter() - started
                bar.update(task, completed=step, status=f"mel {losses['mel'].item():.3f}")
            epoch += 1
    validation = evaluate(model, data.cache, data.validation, device, budget.max_frames) if len(data.validation) else {}
    model.eval()
    return TrainResult(step, seconds, validation)


def fresh_model(base: ModelBundle, seed: int) -> AcousticModel:
    """A newly initialized model of ``base``'s sizes, with its normalization statistics (what the
    from-scratch techniques train)."""
    torch.manual_seed(seed)
    model = build_model(base.model.config, base.model.mel_mean.device)
    with torch.no_grad():
        for name in ("mel_mean", "mel_std", "pitch_stats"):
            getattr(model, name).copy_(getattr(base.model, name))
    return model
