"""Mel-cepstral distortion (MCD) between a synthesized clip and a real clip of the same sentence.

MCD [dB] = 10 / ln 10 * sqrt(2 * sum_{d=1..24} (c_d - c'_d)^2), averaged over the DTW-aligned frame
pairs of :mod:`chorus.evaluation.features` (WORLD envelope -> 24th-order mel-cepstrum, c0 excluded
because it is loudness, not timbre). Lower is closer; a clip against itself gives 0.
"""

from __future__ import annotations

import numpy as np

from chorus.evaluation.features import Alignment, F0Method, WorldFeatures, analyse_pair

_DB_SCALE = 10.0 / np.log(10.0) * np.sqrt(2.0)


def mcd_on_alignment(synthesized: WorldFeatures, reference: WorldFeatures, alignment: Alignment) -> float:
    """MCD in dB along an existing alignment (mean over its steps)."""
    diff = synthesized.mcep[alignment.synthesized, 1:] - reference.mcep[alignment.reference, 1:]
    return float(_DB_SCALE * np.mean(np.sqrt(np.sum(diff**2, axis=1))))


def mel_cepstral_distortion(
    synthesized: np.ndarray, reference: np.ndarray, sample_rate: int, *, f0_method: F0Method = "harvest"
) -> float:
    """MCD in dB between two mono clips ``[samples]`` at the same ``sample_rate``.

    To also score pitch on the same alignment, call :func:`~chorus.evaluation.features.analyse_pair`
    once and pass its results to :func:`mcd_on_alignment` and
    :func:`~chorus.evaluation.pitch.pitch_errors_on_alignment`.
    """
    return mcd_on_alignment(*analyse_pair(synthesized, reference, sample_rate, f0_method=f0_method))
