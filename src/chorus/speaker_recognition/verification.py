"""Speaker verification scores: equal error rate and minimum detection cost of a list of trials, and
the trials of a file in VoxCeleb's format scored by an encoder (``chorus speaker eval``).

A trial is a score (higher: more likely the same speaker) and a label (True: the same speaker).
The ROC curve comes from scikit-learn; EER is where the miss rate equals the false-alarm rate
(interpolated between the two ROC points around it); minDCF is NIST SRE's normalized detection cost
``min over thresholds of (C_miss P_miss p + C_fa P_fa (1 - p)) / min(C_miss p, C_fa (1 - p))`` with
p = ``p_target`` (0.01 and 0.05 are usual). An encoder's threshold is the EER point of its held-out
trials (:func:`chorus.training.speaker_encoder.train_speaker_encoder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_curve

from chorus.speaker_recognition.bundle import EncoderBundle


@dataclass(frozen=True)
class VerificationScores:
    eer: float  # equal error rate, 0..1
    eer_threshold: float  # the score where misses and false alarms are equal
    min_dcf: float  # normalized minimum detection cost at p_target
    p_target: float
    trials: int
    targets: int  # same-speaker trials


def _rates(scores: Sequence[float], same: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scores, same = np.asarray(scores, dtype=np.float64), np.asarray(same, dtype=bool)
    if scores.shape != same.shape or scores.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D and as long: {scores.shape} and {same.shape}")
    if same.all() or not same.any():
        raise ValueError("trials need both same-speaker and different-speaker pairs")
    false_alarm, hit, thresholds = roc_curve(same, scores)
    # roc_curve's first threshold is +inf (nothing accepted): just above the highest score instead, so that an
    # equal-error point next to it interpolates to a number (ties at the top score had made the threshold NaN).
    thresholds[~np.isfinite(thresholds)] = np.nextafter(scores.max(), np.inf)
    return false_alarm, 1.0 - hit, thresholds


def verification_scores(
    scores: Sequence[float], same: Sequence[bool], p_target: float = 0.01, c_miss: float = 1.0, c_fa: float = 1.0
) -> VerificationScores:
    """EER and minDCF of the trials (``ValueError`` without both kinds of trial, or a prior not inside (0, 1))."""
    if not 0 < p_target < 1:
        raise ValueError(f"the prior of a same-speaker trial must lie strictly between 0 and 1, got {p_target:g}")
    false_alarm, miss, thresholds = _rates(scores, same)
    # The first index where misses drop to or below false alarms; interpolate between it and the one before.
    i = int(np.argmax(miss <= false_alarm))
    if i == 0:
        eer, threshold = float(miss[0]), float(thresholds[0])
    else:
        gap_before = miss[i - 1] - false_alarm[i - 1]
        gap_after = false_alarm[i] - miss[i]
        w = gap_before / (gap_before + gap_after) if gap_before + gap_after > 0 else 0.0
        eer = float(false_alarm[i - 1] + w * (false_alarm[i] - false_alarm[i - 1]))
        threshold = float(thresholds[i - 1] + w * (thresholds[i] - thresholds[i - 1]))
    cost = c_miss * miss * p_target + c_fa * false_alarm * (1 - p_target)
    min_dcf = float(cost.min() / min(c_miss * p_target, c_fa * (1 - p_target)))
    labels = np.asarray(same, dtype=bool)
    return VerificationScores(eer, threshold, min_dcf, p_target, len(labels), int(labels.sum()))


def read_trials(path: Path) -> list[tuple[bool, Path, Path]]:
    """The trials of a file of lines ``LABEL A B`` (1 same speaker, 0 different; paths relative to the
    file): ``(same, a, b)`` each; ``ValueError`` naming the first malformed line."""
    trials = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("0", "1"):
            raise ValueError(f"{path}:{number}: expected 'LABEL A B' with LABEL 0 or 1, got {line[:80]!r}")
        trials.append((parts[0] == "1", path.parent / parts[1], path.parent / parts[2]))
    return trials


def score_trials(
    bundle: EncoderBundle, trials: Sequence[tuple[bool, Path, Path]], p_target: float = 0.01
) -> VerificationScores:
    """EER and minDCF of ``trials`` (from :func:`read_trials`) by ``bundle``: every file embedded once."""
    files = sorted({p for _, a, b in trials for p in (a, b)})
    rows = dict(zip(files, bundle.embed(files)))
    return verification_scores(
        [bundle.score(rows[a], rows[b]) for _, a, b in trials], [s for s, _, _ in trials], p_target
    )
