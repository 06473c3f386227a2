"""Whether a folder of recordings is one person: its clips' embeddings split in two groups, and the groups
compared.

The clips are split by two-means on the unit sphere, started from the two least alike. A folder is two
voices when each group holds a real share of the clips (:data:`MIN_SHARE`, two at least) and the groups'
centroids score under :data:`SAME_PERSON`. That threshold is set by ``bench/one_speaker.py`` on the
offline corpus's 36 pretraining voices, each folder alone (the lowest score any of them splits into, less a
margin), and its figures are measured on other folders: the held-out voices, alone, on two channels and
mixed. The encoder's own same/different threshold (set on clip pairs) is no guide here: two espeak-ng
voices reading the same sentences score above it, and a centroid averages out the clips' noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_CLIPS = 4  # fewer clips than this cannot be split into two groups of two
MIN_SHARE = 0.1  # of the clips: a smaller group is a stray clip or two, not a second voice
SAME_PERSON = 0.726  # bench/results/one_speaker: the calibration folders' lowest score (0.746), less 0.02
_ROUNDS = 50


@dataclass(frozen=True)
class SpeakerSplit:
    """The two groups of a folder's clips (indices, the larger first) and the cosine of their centroids."""

    groups: tuple[tuple[int, ...], tuple[int, ...]]
    similarity: float


def split(embeddings: np.ndarray) -> SpeakerSplit | None:
    """``embeddings`` ``[N, D]`` (unit rows, one per clip) in two groups, or None when they do not split
    into two of a real share each."""
    count = len(embeddings)
    if count < MIN_CLIPS:
        return None
    similarity = embeddings @ embeddings.T
    first, second = np.unravel_index(np.argmin(similarity), similarity.shape)
    centroids = embeddings[[first, second]]
    for _ in range(_ROUNDS):
        nearest = np.argmax(embeddings @ centroids.T, axis=1)
        if nearest.min() == nearest.max():
            return None
        moved = np.stack([embeddings[nearest == k].mean(0) for k in (0, 1)])
        moved /= np.linalg.norm(moved, axis=1, keepdims=True)
        converged = np.allclose(moved, centroids)
        centroids = moved
        if converged:
            break
    groups = sorted((tuple(np.flatnonzero(nearest == k).tolist()) for k in (0, 1)), key=len, reverse=True)
    if len(groups[1]) < max(2, math.ceil(MIN_SHARE * count)):
        return None
    return SpeakerSplit((groups[0], groups[1]), float(centroids[0] @ centroids[1]))


def split_score(embeddings: np.ndarray) -> float:
    """The cosine of the centroids of ``embeddings``' two groups (:func:`split`); 1 when they do not split."""
    found = split(embeddings)
    return 1.0 if found is None else found.similarity


def two_voices(embeddings: np.ndarray, threshold: float = SAME_PERSON) -> SpeakerSplit | None:
    """The split of ``embeddings`` into two people's clips, or None when they are one person's as far as the
    check can tell."""
    found = split(embeddings)
    return found if found is not None and found.similarity < threshold else None
