"""``parp``: Prune-Adjust-Re-Prune (Lai et al. 2021). Prune the trained base by global magnitude,
fine-tune with the pruned weights free to come back (they start at zero and move with their
gradients), then prune again by magnitude to the target sparsity."""

from __future__ import annotations

import copy

import torch

from chorus.pruning.loop import train
from chorus.pruning.masks import MaskSet, global_magnitude_masks
from chorus.pruning.registry import Pruned, PruneJob, Technique, register
from chorus.pruning.targets import prunable_layers


def prune_adjust_reprune(job: PruneJob) -> Pruned:
    model = copy.deepcopy(job.base.model)
    layers = prunable_layers(model, job.include, job.exclude)
    first = global_magnitude_masks(layers, job.sparsity)
    with torch.no_grad():
        for name, layer in layers.items():
            layer.weight.mul_(first[name])
    adjusted = train(model, job.data, job.budget, title="parp: adjust", progress=job.progress)  # no mask
    final = MaskSet.by_global_magnitude(layers, job.sparsity)
    pruned_first = sum(int((~mask).sum()) for mask in first.values())
    came_back = sum(int((~first[name] & final.masks[name]).sum()) for name in layers)
    return Pruned(
        model,
        adjusted.seconds,
        adjusted.steps,
        {
            "adjust_validation": adjusted.validation,
            "came_back": came_back / max(pruned_first, 1),  # share of the first prune's zeros kept at the end
        },
    )


register(
    Technique(
        "parp",
        "prune the trained base, fine-tune with pruned weights free to come back, prune again to the target",
        from_scratch=False,
        default_steps=300,
        run=prune_adjust_reprune,
    )
)
