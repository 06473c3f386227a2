"""WORLD features and the DTW alignment shared by the MCD and pitch judges.

A synthesized clip and a real clip of the same sentence differ in timing, so frame-by-frame
comparison needs an alignment. Both clips are trimmed of leading and trailing silence (padding
differs between systems and would otherwise be aligned and scored), analysed with WORLD at a 5 ms
frame period, and aligned by dynamic time warping on the mel-cepstra without c0 (energy), so the
path follows what is said rather than how loud it is. MCD and F0 errors are then read along the
same path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.spatial.distance import cdist

with warnings.catch_warnings():
    # pyworld and pysptk import pkg_resources (setuptools<81 is pinned for them); the deprecation
    # notice is noise to our users.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    import pysptk
    import pyworld

FRAME_PERIOD_MS = 5.0
MCEP_ORDER = 24
# Leading/trailing audio quieter than this many dB below the clip's peak counts as silence.
SILENCE_TOP_DB = 40.0
# Fewer frames than this (50 ms) cannot be aligned meaningfully.
MIN_FRAMES = 10

F0Method = Literal["harvest", "dio"]


def trim_silence(audio: np.ndarray, sample_rate: int, top_db: float = SILENCE_TOP_DB) -> np.ndarray:
    """``audio`` ``[samples]`` without leading and trailing silence (frames ``top_db`` below the
    loudest frame's RMS, in ~46 ms frames every ~12 ms); empty if the clip is all zeros."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.any(audio):
        return audio[:0]
    frame = 1 << int(np.round(np.log2(sample_rate * 0.0464)))  # a power of two, 1024 at 22.05 kHz
    hop = frame // 4
    # Centred frames: frame k covers samples around k * hop, so boundaries map straight to samples.
    # Frame energies come from a running sum of squares: no [frames, frame] copy of long clips.
    energy = np.concatenate([[0.0], np.cumsum(np.pad(audio, frame // 2).astype(np.float64) ** 2)])
    starts = np.arange(0, len(energy) - frame, hop)
    power = (energy[starts + frame] - energy[starts]) / frame
    loud = np.flatnonzero(10 * np.log10(np.maximum(power, 1e-20) / power.max()) > -top_db)
    return audio[loud[0] * hop : min(len(audio), (loud[-1] + 1) * hop)]


@dataclass(frozen=True)
class WorldFeatures:
    """WORLD analysis of one (silence-trimmed) clip, one row per ``frame_period_ms`` frame.

    ``f0``: ``[frames]`` in Hz, 0 where unvoiced. ``mcep``: ``[frames, order + 1]`` mel-cepstrum of
    the spectral envelope, ``c0`` (log energy) first.
    """

    f0: np.ndarray
    mcep: np.ndarray
    sample_rate: int
    frame_period_ms: float = FRAME_PERIOD_MS

    @property
    def frames(self) -> int:
        return len(self.f0)


def world_features(
    audio: np.ndarray, sample_rate: int, *, f0_method: F0Method = "harvest", order: int = MCEP_ORDER, trim: bool = True
) -> WorldFeatures:
    """F0 and mel-cepstrum of mono audio ``[samples]`` at ``sample_rate``.

    ``f0_method``: "harvest" (default) makes fewer voicing errors, which the voicing metric depends
    on, at ~0.5x real time; "dio" (refined by StoneMask) is ~20x faster. The frequency-warping
    ``alpha`` of the mel-cepstrum is SPTK's standard choice for the rate (0.455 at 22.05 kHz, 0.41 at
    16 kHz). Raises ValueError when fewer than :data:`MIN_FRAMES` frames of sound remain.
    """
    if trim:
        audio = trim_silence(audio, sample_rate)
    x = np.ascontiguousarray(audio, dtype=np.float64)
    if len(x) < MIN_FRAMES * FRAME_PERIOD_MS / 1000 * sample_rate:
        raise ValueError(f"clip has {len(x) / sample_rate:.3f} s of sound; too short to analyse")
    if f0_method == "harvest":
        f0, times = pyworld.harvest(x, sample_rate, frame_period=FRAME_PERIOD_MS)
    elif f0_method == "dio":
        f0, times = pyworld.dio(x, sample_rate, frame_period=FRAME_PERIOD_MS)
        f0 = pyworld.stonemask(x, f0, times, sample_rate)
    else:
        raise ValueError(f"unknown f0_method {f0_method!r}; use 'harvest' or 'dio'")
    envelope = pyworld.cheaptrick(x, f0, times, sample_rate)
    mcep = pysptk.sp2mc(envelope, order, pysptk.util.mcepalpha(sample_rate))
    return WorldFeatures(f0=f0, mcep=mcep, sample_rate=sample_rate)


@dataclass(frozen=True)
class Alignment:
    """A DTW path between two clips' frames: ``path`` ``[steps, 2]`` of (synthesized, reference)
    frame indices, both non-decreasing, from (0, 0) to the last frame of each."""

    path: np.ndarray

    @property
    def synthesized(self) -> np.ndarray:
        """Synthesized frame index per step ``[steps]``."""
        return self.path[:, 0]

    @property
    def reference(self) -> np.ndarray:
        """Reference frame index per step ``[steps]``."""
        return self.path[:, 1]


def dtw_path(cost: np.ndarray) -> np.ndarray:
    """Minimum-cost monotonic path through a frame-distance matrix ``cost`` ``[n, m]`` with steps
    (1, 1), (1, 0), (0, 1) of equal weight; returns ``[steps, 2]`` index pairs from (0, 0) to
    (n - 1, m - 1).

    Written in numpy, one anti-diagonal at a time (every cell on it depends only on the two previous
    diagonals): librosa's numba version costs ~10 s of compilation in every fresh process.
    """
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)  # total[i + 1, j + 1]: best cost of a path ending at (i, j)
    total[0, 0] = 0.0
    for diagonal in range(n + m - 1):
        i = np.arange(max(0, diagonal - m + 1), min(n, diagonal + 1))
        j = diagonal - i
        best_previous = np.minimum(np.minimum(total[i, j], total[i, j + 1]), total[i + 1, j])
        total[i + 1, j + 1] = cost[i, j] + best_previous
    path = [(n - 1, m - 1)]
    i, j = n - 1, m - 1
    while i > 0 or j > 0:
        # Predecessors in order diagonal, up, left: ties go to the diagonal step.
        candidates = ((i - 1, j - 1), (i - 1, j), (i, j - 1))
        i, j = min(candidates, key=lambda cell: total[cell[0] + 1, cell[1] + 1])
        path.append((i, j))
    return np.array(path[::-1], dtype=np.int64)


def align(synthesized: WorldFeatures, reference: WorldFeatures) -> Alignment:
    """DTW on the mel-cepstra without c0 (Euclidean frame distance, which is what MCD measures)."""
    if synthesized.sample_rate != reference.sample_rate:
        raise ValueError(
            f"features at different rates ({synthesized.sample_rate} Hz vs "
            f"{reference.sample_rate} Hz); analyse both clips at one rate"
        )
    return Alignment(path=dtw_path(cdist(synthesized.mcep[:, 1:], reference.mcep[:, 1:])))


def analyse_pair(
    synthesized: np.ndarray, reference: np.ndarray, sample_rate: int, *, f0_method: F0Method = "harvest"
) -> tuple[WorldFeatures, WorldFeatures, Alignment]:
    """Features of both clips (``[samples]`` each, same rate) and their alignment, for MCD and pitch."""
    synth = world_features(synthesized, sample_rate, f0_method=f0_method)
    ref = world_features(reference, sample_rate, f0_method=f0_method)
    return synth, ref, align(synth, ref)
