"""``ump``: global unstructured magnitude pruning of the trained base, in one shot, then fine-tuning
with the mask fixed (the after-training baseline of "EPIC TTS Models")."""

from __future__ import annotations

import copy

from chorus.pruning.loop import train
from chorus.pruning.masks import MaskSet
from chorus.pruning.registry import Pruned, PruneJob, Technique, register
from chorus.pruning.targets import prunable_layers


def prune_magnitude(job: PruneJob) -> Pruned:
    model = copy.deepcopy(job.base.model)
    masks = MaskSet.by_global_magnitude(prunable_layers(model, job.include, job.exclude), job.sparsity)
    result = train(model, job.data, job.budget, masks=masks, title="ump: fine-tune", progress=job.progress)
    return Pruned(model, result.seconds, result.steps, {"fine_tune_validation": result.validation})


register(
    Technique(
        "ump",
        "global magnitude pruning of the trained base in one shot, then fine-tuning with the mask fixed",
        from_scratch=False,
        default_steps=300,
        run=prune_magnitude,
    )
)
