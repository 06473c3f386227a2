"""Pruning the base: five sparsity techniques ("EPIC TTS Models") behind one registry, and
:func:`prune_base`, which writes a pruned model folder that loads like the shipped base."""

from chorus.pruning import techniques  # noqa: F401  (registers every technique)
from chorus.pruning.run import PruneConfig, prune_base, sparsity_report

__all__ = ["PruneConfig", "prune_base", "sparsity_report"]
