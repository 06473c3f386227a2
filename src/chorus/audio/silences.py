"""Long recordings cut into clips at their silences (onboarding without transcripts: each clip then goes to
Whisper, and the upload counts the speech the clips will hold)."""

from __future__ import annotations

import librosa
import numpy as np


def split_at_silences(
    audio: np.ndarray, sample_rate: int, max_seconds: float = 12.0, min_seconds: float = 1.0, top_db: float = 35.0
) -> list[np.ndarray]:
    """Clips of ``audio`` ``[samples]``: stretches of speech between silences, joined while they fit in
    ``max_seconds``; a longer stretch is cut at its quietest 20 ms. Pieces under ``min_seconds`` join
    a neighbour."""
    limit = int(max_seconds * sample_rate)
    spans = [list(s) for s in librosa.effects.split(audio, top_db=top_db, frame_length=1024, hop_length=256)]
    if not spans:
        return []
    pieces: list[list[int]] = []
    for start, end in spans:
        while end - start > limit:  # one stretch too long: cut at its quietest window in the last half
            window = int(0.02 * sample_rate)
            search = audio[start + limit // 2 : start + limit]
            energy = np.convolve(search**2, np.ones(window), mode="valid")
            cut = start + limit // 2 + int(np.argmin(energy)) + window // 2
            pieces.append([start, cut])
            start = cut
        if pieces and end - pieces[-1][0] <= limit and start - pieces[-1][1] < int(0.6 * sample_rate):
            pieces[-1][1] = end  # a short pause inside a sentence: one clip
        else:
            pieces.append([start, end])
    merged: list[list[int]] = []
    for start, end in pieces:
        if merged and (end - start < min_seconds * sample_rate) and end - merged[-1][0] <= limit:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    pad = int(0.1 * sample_rate)
    return [audio[max(0, s - pad) : min(len(audio), e + pad)] for s, e in merged if e - s >= 0.3 * sample_rate]
