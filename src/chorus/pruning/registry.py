"""Technique registry: each pruning technique is one module that ends with one :func:`register` call;
:mod:`chorus.pruning.techniques` is the one list that imports them all. The registry imports none.

A technique gets a :class:`PruneJob` (the trained base, the training data, the target sparsity, the
step budget, which layers) and returns a :class:`Pruned` model: the same architecture with zeros
(unstructured) or a physically smaller one (structured).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from chorus.models.acoustic import AcousticModel
from chorus.models.bundle import ModelBundle
from chorus.pruning.loop import Budget, TrainingData


@dataclass
class PruneJob:
    base: ModelBundle  # the trained base; from-scratch techniques take only its sizes and statistics
    data: TrainingData
    sparsity: float  # share of the targeted weights (or, structured, of the channels) to remove
    budget: Budget
    include: Sequence[str]
    exclude: Sequence[str]
    progress: bool = True


@dataclass
class Pruned:
    model: AcousticModel
    train_seconds: float  # inside training steps, every phase together
    steps: int  # training steps taken, every phase together
    details: dict = field(default_factory=dict)  # what the technique did, for the model's config


@dataclass(frozen=True)
class Technique:
    name: str
    summary: str  # one line for `chorus prune --help`
    from_scratch: bool  # trains a fresh model (compare with a dense model trained on the same budget)
    default_steps: int
    run: Callable[[PruneJob], Pruned]


_TECHNIQUES: dict[str, Technique] = {}


def register(technique: Technique) -> Technique:
    if technique.name in _TECHNIQUES:
        raise ValueError(f"pruning technique {technique.name!r} is registered twice")
    _TECHNIQUES[technique.name] = technique
    return technique


def get_technique(name: str) -> Technique:
    try:
        return _TECHNIQUES[name]
    except KeyError:
        raise ValueError(f"unknown pruning technique {name!r}; known: {', '.join(sorted(_TECHNIQUES))}") from None


def technique_names() -> list[str]:
    return list(_TECHNIQUES)
