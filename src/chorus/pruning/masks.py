"""Masks of unstructured pruning: which entries of each pruned weight are kept.

Masks are computed with ``torch.nn.utils.prune`` (global magnitude over all pruned layers), then
held by :class:`MaskSet`, which keeps the pruned entries at zero through training: their gradients
are zeroed before each optimizer step (so no optimizer state builds up behind them) and the weights
multiplied by the mask after it. The weights stay plain parameters, so the state dict, the adapters
and the dense gradient that drop-and-regrow needs are the model's usual ones.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import prune


class MaskSet:
    """``masks[name]``: a bool tensor shaped like layer ``name``'s weight, True where kept."""

    def __init__(self, layers: dict[str, nn.Module], masks: dict[str, torch.Tensor]):
        self.layers = layers
        self.masks = masks
        self.apply()

    @classmethod
    def by_global_magnitude(cls, layers: dict[str, nn.Module], sparsity: float) -> MaskSet:
        """Remove the ``sparsity`` share of the smallest-magnitude weights over all ``layers`` together
        (``prune.global_unstructured`` with L1: one threshold, so layers end up pruned unevenly)."""
        return cls(layers, global_magnitude_masks(layers, sparsity))

    @torch.no_grad()
    def apply(self) -> None:
        """Zero the pruned entries of every weight."""
        for name, layer in self.layers.items():
            layer.weight.mul_(self.masks[name])

    @torch.no_grad()
    def mask_gradients(self) -> None:
        """Zero the pruned entries' gradients (call before the optimizer step)."""
        for name, layer in self.layers.items():
            if layer.weight.grad is not None:
                layer.weight.grad.mul_(self.masks[name])

    def sparsity(self) -> dict[str, float]:
        """Share of removed entries per layer."""
        return {name: 1.0 - float(mask.float().mean()) for name, mask in self.masks.items()}


def global_magnitude_masks(layers: dict[str, nn.Module], sparsity: float) -> dict[str, torch.Tensor]:
    """Masks removing the ``sparsity`` share of the smallest ``|w|`` over all ``layers`` together.
    The layers are left as they were (``torch.nn.utils.prune``'s re-parametrization is undone)."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    parameters = [(layer, "weight") for layer in layers.values()]
    total = sum(layer.weight.numel() for layer in layers.values())
    if round(sparsity * total) >= total:  # torch rounds the share to a count: 0.9999999 had removed every weight
        raise ValueError(
            f"sparsity {sparsity} removes all {total:,} targeted weights: a sparsity under {(total - 0.5) / total!r} "
            "keeps one"
        )
    prune.global_unstructured(parameters, pruning_method=prune.L1Unstructured, amount=sparsity)
    masks = {}
    for name, layer in layers.items():
        masks[name] = layer.weight_mask.bool()
        prune.remove(layer, "weight")  # weight = weight_orig * mask, back to one plain parameter
    return masks


def score_masks(scores: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """Masks keeping the largest ``1 - sparsity`` share of ``scores`` over all layers together
    (``prune.global_unstructured`` on the scores, as on weights)."""
    holders = {name: _Holder(score) for name, score in scores.items()}
    return global_magnitude_masks(holders, sparsity)


class _Holder(nn.Module):
    """A module whose ``weight`` is a score tensor, so ``torch.nn.utils.prune`` can rank scores."""

    def __init__(self, score: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(score.detach().abs().clone(), requires_grad=False)
