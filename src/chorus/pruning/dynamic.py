"""``dynamic``: sparse training from scratch at a fixed sparsity with drop-and-regrow (RigL, Evci et al.
2020). Every layer starts at the target sparsity with a random mask; every ``UPDATE_EVERY`` steps
until ``END`` of the budget, each layer drops the share ``DROP * (1 + cos(pi t / T_end)) / 2`` of its
active weights with the smallest magnitude and grows as many inactive ones with the largest dense
gradient (grown weights start at zero: inactive weights are zero already), so the sparsity of every layer stays fixed."""

from __future__ import annotations

import math

import torch

from chorus.pruning.loop import fresh_model, train
from chorus.pruning.masks import MaskSet
from chorus.pruning.registry import Pruned, PruneJob, Technique, register
from chorus.pruning.targets import prunable_layers

UPDATE_EVERY = 100  # steps between mask updates (fewer for short budgets: at least ten updates)
DROP = 0.3  # share of a layer's active weights replaced at the first update (cosine-decayed)
END = 0.75  # share of the budget after which the masks stay fixed


def random_masks(layers, sparsity: float, seed: int) -> dict[str, torch.Tensor]:
    """Masks keeping a random ``1 - sparsity`` share of each layer's weights (the same share in each)."""
    generator = torch.Generator().manual_seed(seed)
    masks = {}
    for name, layer in layers.items():
        numel = layer.weight.numel()
        kept = torch.randperm(numel, generator=generator)[: max(1, round((1 - sparsity) * numel))]
        mask = torch.zeros(numel, dtype=torch.bool)
        mask[kept] = True
        masks[name] = mask.view_as(layer.weight).to(layer.weight.device)
    return masks


def drop_and_regrow(masks: MaskSet, fraction: float) -> int:
    """One RigL update of every layer (gradients must be the dense ones of the last backward);
    returns how many connections moved."""
    moved = 0
    with torch.no_grad():
        for name, layer in masks.layers.items():
            mask = masks.masks[name].flatten()
            weight, grad = layer.weight.flatten(), layer.weight.grad
            if grad is None:
                continue
            grad = grad.flatten()
            count = min(int(fraction * int(mask.sum())), int((~mask).sum()))
            if count == 0:
                continue
            dropped = torch.topk(torch.where(mask, weight.abs(), torch.inf), count, largest=False).indices
            grown = torch.topk(torch.where(mask, -torch.inf, grad.abs()), count).indices  # not the just-dropped
            mask = mask.clone()
            mask[dropped] = False
            mask[grown] = True
            masks.masks[name] = mask.view_as(layer.weight)
            moved += count
    return moved


def sparse_training(job: PruneJob) -> Pruned:
    model = fresh_model(job.base, job.budget.seed)
    layers = prunable_layers(model, job.include, job.exclude)
    masks = MaskSet(layers, random_masks(layers, job.sparsity, job.budget.seed))
    every = max(1, min(UPDATE_EVERY, job.budget.steps // 10))
    end = int(END * job.budget.steps)
    moved: list[int] = []

    def update(step: int) -> None:
        if step % every == 0 and step <= end:
            moved.append(drop_and_regrow(masks, DROP * (1 + math.cos(math.pi * step / max(end, 1))) / 2))

    result = train(
        model,
        job.data,
        job.budget,
        masks=masks,
        on_step=update,
        title="dynamic: sparse training",
        progress=job.progress,
    )
    return Pruned(
        model,
        result.seconds,
        result.steps,
        {
            "validation": result.validation,
            "mask_updates": len(moved),
            "connections_moved": sum(moved),
            "update_every": every,
        },
    )


register(
    Technique(
        "dynamic",
        "sparse training from scratch at the target sparsity, dropping small weights and regrowing by gradient (RigL)",
        from_scratch=True,
        default_steps=3000,
        run=sparse_training,
    )
)
