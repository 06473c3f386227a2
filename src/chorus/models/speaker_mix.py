"""Blends of the base's speakers: ``"flite-rms(2)+festival-kal(1)"`` is the speaker vector
``(2 * e[flite-rms] + 1 * e[festival-kal]) / 3``, fed where a speaker's row would be.

The model takes any ``speaker_dim`` vector through the same projection as its table's rows, so a
weighted mean of rows is a voice between them. Only base speakers blend: an adapted voice changes
weights inside the model, which a speaker vector cannot carry.
"""

from __future__ import annotations

import re

import torch

_PART = re.compile(r"^\s*([^()+\s]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*$")


def is_mix(spec: str) -> bool:
    """Whether ``spec`` is written as a blend (has a ``+`` or a weight in parentheses)."""
    return isinstance(spec, str) and ("+" in spec or "(" in spec)


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """``"a(2)+b(1)"`` -> ``[("a", 2/3), ("b", 1/3)]`` (weights normalized; a missing weight is 1).

    Raises ``ValueError`` naming what is wrong."""
    parts = []
    for piece in spec.split("+"):
        match = _PART.match(piece)
        if match is None:
            raise ValueError(f"speaker blend {spec!r}: {piece.strip()!r} is not NAME or NAME(WEIGHT)")
        weight = float(match.group(2)) if match.group(2) is not None else 1.0
        if weight <= 0:
            raise ValueError(f"speaker blend {spec!r}: weights must be positive")
        parts.append((match.group(1), weight))
    names = [name for name, _ in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"speaker blend {spec!r}: a speaker appears twice")
    total = sum(weight for _, weight in parts)
    if total == float("inf"):  # 400 nines read as inf: the blend would be nan, and the model fail on it
        raise ValueError(f"speaker blend {spec[:200]!r}: a weight is too large")
    return [(name, weight / total) for name, weight in parts]


def mix_vector(table: torch.Tensor, parts: list[tuple[int, float]]) -> torch.Tensor:
    """The weighted mean ``[speaker_dim]`` of rows of the speaker ``table`` ``[n_speakers, speaker_dim]``."""
    rows = torch.tensor([index for index, _ in parts], device=table.device)
    weights = torch.tensor([weight for _, weight in parts], dtype=table.dtype, device=table.device)
    return (weights[:, None] * table[rows]).sum(0)
