"""Whether a folder of recordings is one person: its clips' embeddings split in two groups, and the groups
compared.

The clips are split by two-means on the unit sphere, started from the two least alike. A folder is two
voices when each group holds a real share of the clips (:data:`MIN_SHARE`, two at least) and the groups'
centroids score under :data:`SAME_PERSON`. That threshold is set by ``bench/one_speaker.py`` on the
offline corpus's 36 pretraining voices, each folder alone at the sizes the check judges (the lowest score any
of them splits into, less a margin), and its figures are measured on other folders: the held-out voices,
alone, on two channels, mixed half and half, and with a few clips of another voice among theirs. The encoder's own same/different threshold (set on clip pairs) is no guide here: two espeak-ng
voices reading the same sentences score above it, and a centroid averages out the clips' noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_CLIPS = 4  # fewer clips than this cannot be split into two groups of two
# A folder of FEWEST_CHECKED clips or more is judged by up to CHECKED_CLIPS of them, spread over it, as
# bench/one_speaker.py calibrated the threshold at both ends; a smaller folder is not judged. Judging up to
# 48 (not 16) lets a few clips of another voice among a few dozen form their own group (3 of 26 had been
# 1 or 2 of the 16 checked: strays).
FEWEST_CHECKED = 16
CHECKED_CLIPS = 48
MIN_SHARE = 0.1  # of the clips: a smaller group is a stray clip or two, not a second voice
# bench/one_speaker.py's rule (the calibration folders' lowest score less 0.02) over both its runs: 0.659 at 16
# clips (ad8da0b; flite-kal16) and 0.741 at 16, 32 and 48 (the latest, another draw of the corpus).
SAME_PERSON = 0.639
_ROUNDS = 50


@dataclass(frozen=True)
class SpeakerSplit:
    """The two groups of a folder's clips (indices, the larger first) and the cosine of their centroids."""

    groups: tuple[tuple[int, ...], tuple[int, ...]]
    similarity: float


def spread(items: list, count: int = CHECKED_CLIPS) -> list:
    """``count`` of ``items`` spread evenly over them (a folder's clips from its start to its end), or all."""
    if len(items) <= count:
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, count).round().astype(int)]


def split(embeddings: np.ndarray) -> SpeakerSplit | None:
    """``embeddings`` ``[N, D]`` (unit rows, one per clip) in two groups of a real share each, or None when
    they do not split so. Two-means starts from the two least alike clips; when one of those is a stray (a
    cough, a noise, a clip on another microphone) its group is too small: those clips are set aside and
    the rest split again, so one odd clip cannot hide two voices."""
    kept = np.arange(len(embeddings))
    while len(kept) >= MIN_CLIPS:
        groups, similarity = _two_means(embeddings[kept])
        if groups is None:
            return None
        small = max(2, math.ceil(MIN_SHARE * len(kept)))
        if len(groups[1]) >= small:
            return SpeakerSplit((tuple(kept[list(groups[0])]), tuple(kept[list(groups[1])])), similarity)
        kept = kept[list(groups[0])]  # the strays set aside
    return None


def _two_means(embeddings: np.ndarray) -> tuple[tuple[tuple[int, ...], tuple[int, ...]] | None, float]:
    """Two groups of ``embeddings`` (the larger first) and their centroids' cosine; None when all fall in one."""
    similarity = embeddings @ embeddings.T
    first, second = np.unravel_index(np.argmin(similarity), similarity.shape)
    centroids = embeddings[[first, second]]
    for _ in range(_ROUNDS):
        nearest = np.argmax(embeddings @ centroids.T, axis=1)
        if nearest.min() == nearest.max():
            return None, 1.0
        moved = np.stack([embeddings[nearest == k].mean(0) for k in (0, 1)])
        moved /= np.linalg.norm(moved, axis=1, keepdims=True)
        converged = np.allclose(moved, centroids)
        centroids = moved
        if converged:
            break
    groups = sorted((tuple(np.flatnonzero(nearest == k).tolist()) for k in (0, 1)), key=len, reverse=True)
    return (groups[0], groups[1]), float(centroids[0] @ centroids[1])


def split_score(embeddings: np.ndarray) -> float:
    """The cosine of the centroids of ``embeddings``' two groups (:func:`split`); 1 when they do not split."""
    found = split(embeddings)
    return 1.0 if found is None else found.similarity


def two_voices(embeddings: np.ndarray, threshold: float = SAME_PERSON) -> SpeakerSplit | None:
    """The split of ``embeddings`` into two people's clips, or None when they are one person's as far as the
    check can tell."""
    found = split(embeddings)
    return found if found is not None and found.similarity < threshold else None
