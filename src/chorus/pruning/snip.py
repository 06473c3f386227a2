"""``snip``: single-shot pruning at initialization by connection sensitivity (Lee et al. 2019). On a
freshly initialized model, a few batches' ``|dL/dw * w|`` rank every targeted weight; the smallest
``sparsity`` share over all layers is removed and the sparse network trained from scratch with the
mask fixed."""

from __future__ import annotations

import torch

from chorus.data.batching import collate
from chorus.models.losses import compute_losses, step_inputs
from chorus.pruning.loop import fresh_model, train
from chorus.pruning.masks import MaskSet, score_masks
from chorus.pruning.registry import Pruned, PruneJob, Technique, register
from chorus.pruning.targets import prunable_layers

SENSITIVITY_BATCHES = 4


def connection_sensitivity(model, layers, job: PruneJob) -> dict[str, torch.Tensor]:
    """``|g * w|`` per weight of ``layers``, the gradient summed over :data:`SENSITIVITY_BATCHES`
    training batches (with the first step's alignment prior, as training begins)."""
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    for positions in job.data.batches(job.budget.max_frames, job.budget.seed)[:SENSITIVITY_BATCHES]:
        batch = collate(job.data.cache, job.data.train[positions]).to(device)
        inputs = step_inputs(model, batch)
        out = model(**inputs, alignment_prior_weight=job.budget.prior_weight(0))
        compute_losses(model, out, inputs["mel"], inputs["text_lengths"])["total"].backward()
    scores = {name: (layer.weight.grad * layer.weight).abs().detach() for name, layer in layers.items()}
    model.zero_grad(set_to_none=True)
    return scores


def prune_at_initialization(job: PruneJob) -> Pruned:
    model = fresh_model(job.base, job.budget.seed)
    layers = prunable_layers(model, job.include, job.exclude)
    masks = MaskSet(layers, score_masks(connection_sensitivity(model, layers, job), job.sparsity))
    result = train(model, job.data, job.budget, masks=masks, title="snip: train from scratch", progress=job.progress)
    return Pruned(
        model,
        result.seconds,
        result.steps,
        {"validation": result.validation, "sensitivity_batches": SENSITIVITY_BATCHES},
    )


register(
    Technique(
        "snip",
        "connection sensitivity from a few batches at initialization, then the sparse network trained from scratch",
        from_scratch=True,
        default_steps=3000,
        run=prune_at_initialization,
    )
)
