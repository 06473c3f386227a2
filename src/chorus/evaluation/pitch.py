"""Pitch judges: F0 RMSE and voicing error against a real clip of the same sentence.

F0 comes from WORLD (harvest by default) and is compared frame by frame along the same DTW path as
MCD (:mod:`chorus.evaluation.features`), so both metrics judge the same frame pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chorus.evaluation.features import Alignment, F0Method, WorldFeatures, analyse_pair


@dataclass(frozen=True)
class PitchErrors:
    """``f0_rmse_hz`` over aligned frames voiced in both clips (NaN if there are none, counted in
    ``voiced_frames``); ``voicing_error``: fraction of aligned frames whose voiced/unvoiced
    decision differs."""

    f0_rmse_hz: float
    voicing_error: float
    voiced_frames: int


def _aligned_f0(
    synthesized: WorldFeatures, reference: WorldFeatures, alignment: Alignment
) -> tuple[np.ndarray, np.ndarray]:
    """F0 of both clips per alignment step, ``[steps]`` each."""
    return synthesized.f0[alignment.synthesized], reference.f0[alignment.reference]


def f0_rmse_hz(synthesized: WorldFeatures, reference: WorldFeatures, alignment: Alignment) -> float:
    """Root-mean-square F0 difference in Hz over aligned frames voiced in both; NaN if none are."""
    synth, ref = _aligned_f0(synthesized, reference, alignment)
    both = (synth > 0) & (ref > 0)
    if not both.any():
        return float("nan")
    return float(np.sqrt(np.mean((synth[both] - ref[both]) ** 2)))


def voicing_error(synthesized: WorldFeatures, reference: WorldFeatures, alignment: Alignment) -> float:
    """Fraction of aligned frames voiced in one clip and unvoiced in the other, in [0, 1]."""
    synth, ref = _aligned_f0(synthesized, reference, alignment)
    return float(np.mean((synth > 0) != (ref > 0)))


def pitch_errors_on_alignment(
    synthesized: WorldFeatures, reference: WorldFeatures, alignment: Alignment
) -> PitchErrors:
    """Both pitch metrics along an existing alignment."""
    synth, ref = _aligned_f0(synthesized, reference, alignment)
    return PitchErrors(
        f0_rmse_hz=f0_rmse_hz(synthesized, reference, alignment),
        voicing_error=voicing_error(synthesized, reference, alignment),
        voiced_frames=int(np.sum((synth > 0) & (ref > 0))),
    )


def pitch_errors(
    synthesized: np.ndarray, reference: np.ndarray, sample_rate: int, *, f0_method: F0Method = "harvest"
) -> PitchErrors:
    """Pitch metrics of two mono clips ``[samples]`` at the same ``sample_rate``."""
    return pitch_errors_on_alignment(*analyse_pair(synthesized, reference, sample_rate, f0_method=f0_method))
