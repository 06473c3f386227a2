"""``structured``: remove whole feed-forward neurons, attention heads and predictor channels by their
L-n norm, physically shrink the layers (smaller ``Conv1d`` / ``Linear``, recorded in
``AcousticConfig.layer_sizes``), then fine-tune.

Groups, by the names ``layer_sizes`` uses (``include`` / ``exclude`` match them):

* ``<stack>.layers.<i>.ff``: hidden channels of the feed-forward (``conv1``'s outputs, ``conv2``'s
  inputs), scored by the L-n norm of each ``conv1`` filter (``torch.nn.utils.prune.ln_structured``);
  the ``sparsity`` share of each block's channels goes.
* ``<stack>.layers.<i>.attn``: attention heads, scored by the L-n norm of the head's q/k/v rows and
  ``out_proj`` columns, ranked over all blocks together (a block has only ``n_heads`` of them); the
  ``sparsity`` share of all heads goes, each block keeping one at least.
* ``<predictor>.conv1`` / ``.conv2``: a variance predictor's channels (a filter's L-n norm), with
  the LayerNorm after each conv cut to the same channels.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn
from torch.nn.utils import prune

from chorus.models.acoustic import AcousticModel, build_model
from chorus.pruning.loop import train
from chorus.pruning.registry import Pruned, PruneJob, Technique, register
from chorus.pruning.targets import matches

NORM = 2  # the L-n norm that ranks channels and heads


def kept_filters(conv: nn.Conv1d, sparsity: float) -> torch.Tensor:
    """Indices of the output channels of ``conv`` that stay: the ``1 - sparsity`` share with the
    largest L-n norm (at least one), in order."""
    count = conv.out_channels - max(1, round((1 - sparsity) * conv.out_channels))
    probe = copy.deepcopy(conv)  # ln_structured re-parametrizes the module it is given
    prune.ln_structured(probe, "weight", amount=count, n=NORM, dim=0)
    return torch.nonzero(probe.weight_mask.flatten(1).any(1)).flatten()


@torch.no_grad()
def head_scores(attn: nn.Module) -> torch.Tensor:
    """``[heads]`` L-n norm of each head's q/k/v rows and out_proj columns."""
    dim = attn.head_dim
    parts = [proj.weight.view(attn.n_heads, dim, -1).flatten(1) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]
    parts.append(attn.out_proj.weight.view(-1, attn.n_heads, dim).transpose(0, 1).flatten(1))
    return torch.cat(parts, dim=1).norm(p=NORM, dim=1)


def kept_heads(blocks: dict[str, nn.Module], sparsity: float) -> dict[str, torch.Tensor]:
    """Heads that stay per attention module: the ``sparsity`` share of all heads with the smallest
    norms go, over all blocks together, each block keeping one."""
    ranked = sorted(
        (float(score), name, head) for name, attn in blocks.items() for head, score in enumerate(head_scores(attn))
    )
    remaining = {name: attn.n_heads for name, attn in blocks.items()}
    removed: set[tuple[str, int]] = set()
    target = round(sparsity * sum(remaining.values()))
    for _, name, head in ranked:
        if len(removed) == target:
            break
        if remaining[name] > 1:
            removed.add((name, head))
            remaining[name] -= 1
    return {
        name: torch.tensor([h for h in range(attn.n_heads) if (name, h) not in removed])
        for name, attn in blocks.items()
    }


def channel_plan(model: AcousticModel, sparsity: float, include, exclude) -> dict[str, torch.Tensor]:
    """What stays of every group the patterns select: group name (a ``layer_sizes`` key) -> kept
    channel or head indices."""
    plan: dict[str, torch.Tensor] = {}
    attention: dict[str, nn.Module] = {}
    for stack in ("encoder", "decoder"):
        for i, block in enumerate(getattr(model, stack).layers):
            name = f"{stack}.layers.{i}"
            if matches(f"{name}.ff", include, exclude):
                plan[f"{name}.ff"] = kept_filters(block.ff.conv1, sparsity)
            if matches(f"{name}.attn", include, exclude):
                attention[f"{name}.attn"] = block.attn
    plan.update(kept_heads(attention, sparsity) if attention else {})
    for predictor_name, predictor in _predictors(model):
        for conv in ("conv1", "conv2"):
            if matches(f"{predictor_name}.{conv}", include, exclude):
                plan[f"{predictor_name}.{conv}"] = kept_filters(getattr(predictor, conv), sparsity)
    if not plan:
        raise ValueError(
            f"no feed-forward, attention or predictor group matches --include {include} --exclude {exclude}"
        )
    return plan


def _predictors(model: AcousticModel):
    yield "duration_predictor", model.duration_predictor
    for name in ("pitch", "energy"):
        if getattr(model, name) is not None:
            yield f"{name}.predictor", getattr(model, name).predictor


def shrink(model: AcousticModel, plan: dict[str, torch.Tensor]) -> AcousticModel:
    """A new, smaller model holding only the kept channels and heads of ``model`` (same function
    where nothing was removed)."""
    state = {name: value.clone() for name, value in model.state_dict().items()}

    def cut(name: str, index: torch.Tensor, dim: int) -> None:
        state[name] = state[name].index_select(dim, index.to(state[name].device))

    sizes = dict(model.config.layer_sizes)
    for group, kept in plan.items():
        if group.endswith(".ff"):
            cut(f"{group}.conv1.weight", kept, 0)
            cut(f"{group}.conv1.bias", kept, 0)
            cut(f"{group}.conv2.weight", kept, 1)
        elif group.endswith(".attn"):
            dim = model.config.d_model // model.config.n_heads
            rows = (kept[:, None] * dim + torch.arange(dim)).flatten()
            for proj in ("q_proj", "k_proj", "v_proj"):
                cut(f"{group}.{proj}.weight", rows, 0)
                cut(f"{group}.{proj}.bias", rows, 0)
            cut(f"{group}.out_proj.weight", rows, 1)
        else:  # <predictor>.conv1 / .conv2, the LayerNorm after it, and the next layer's inputs
            predictor, conv = group.rsplit(".", 1)
            norm, after = ("norm1", "conv2") if conv == "conv1" else ("norm2", "proj")
            for tensor in (f"{conv}.weight", f"{conv}.bias", f"{norm}.weight", f"{norm}.bias"):
                cut(f"{predictor}.{tensor}", kept, 0)
            cut(f"{predictor}.{after}.weight", kept, 1)
        sizes[group] = len(kept)
    smaller = build_model(dataclasses.replace(model.config, layer_sizes=sizes), model.mel_mean.device)
    smaller.load_state_dict(state)
    return smaller.eval()


def prune_structured(job: PruneJob) -> Pruned:
    plan = channel_plan(job.base.model, job.sparsity, job.include, job.exclude)
    model = shrink(job.base.model, plan)
    result = train(model, job.data, job.budget, title="structured: fine-tune", progress=job.progress)
    return Pruned(
        model,
        result.seconds,
        result.steps,
        {"fine_tune_validation": result.validation, "norm": NORM, "layer_sizes": model.config.layer_sizes},
    )


register(
    Technique(
        "structured",
        "remove whole feed-forward neurons, attention heads and predictor channels by L-n norm, shrink the layers, fine-tune",
        from_scratch=False,
        default_steps=300,
        run=prune_structured,
    )
)
