"""Which weights a pruning technique may remove: patterns over the model's stable module names.

Default: the weight matrix of every ``Linear`` and ``Conv1d`` but the embeddings, the norms (which
have no matrix) and the output projection ``mel_proj`` (every frame of every voice passes through
it, and it is 0.3% of the weights). ``include`` / ``exclude`` are shell-style patterns
(``fnmatch``) over module names: ``--include 'decoder.*' --exclude '*.attn.*'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from torch import nn

DEFAULT_INCLUDE = ("*",)
DEFAULT_EXCLUDE = ("*embedding*", "*norm*", "mel_proj")


def matches(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether module ``name`` is matched by an ``include`` pattern and by no ``exclude`` one."""
    return any(fnmatchcase(name, p) for p in include) and not any(fnmatchcase(name, p) for p in exclude)


def prunable_layers(
    model: nn.Module, include: Sequence[str] = DEFAULT_INCLUDE, exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> dict[str, nn.Module]:
    """The ``Linear`` / ``Conv1d`` layers (by module name) whose ``weight`` is to be pruned;
    ``ValueError`` when the patterns match none."""
    layers = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear | nn.Conv1d) and matches(name, include, exclude)
    }
    if not layers:
        raise ValueError(f"no Linear or Conv1d layer matches --include {list(include)} --exclude {list(exclude)}")
    return layers
