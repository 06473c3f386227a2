"""Monotonic alignment search (Glow-TTS): the most likely monotonic, surjective text-to-frame path.

The alignment is learned inside the model, so any recording with a transcript can be used without an
external aligner. The search runs on the CPU with numba; it sees no gradients.
"""

from __future__ import annotations

import numba
import numpy as np
import torch


@numba.njit(cache=True, nogil=True)
def _search_one(log_prob: np.ndarray, path: np.ndarray, n_text: int, n_frames: int) -> None:
    """Fill ``path[:n_text, :n_frames]`` (zeros on entry) with the best monotonic path (in place)."""
    neg_inf = -1e9
    value = np.full((n_text, n_frames), neg_inf, dtype=np.float32)
    value[0, 0] = log_prob[0, 0]
    for j in range(1, n_frames):
        # Token i can be active at frame j only if i <= j and the remaining tokens fit in the rest.
        low = max(0, n_text - (n_frames - j))
        high = min(n_text - 1, j)
        for i in range(low, high + 1):
            stay = value[i, j - 1]
            advance = value[i - 1, j - 1] if i > 0 else neg_inf
            value[i, j] = log_prob[i, j] + (stay if stay >= advance else advance)
    i = n_text - 1
    for j in range(n_frames - 1, -1, -1):
        path[i, j] = 1
        if i > 0 and (i == j or value[i - 1, j - 1] > value[i, j - 1]):
            i -= 1


def monotonic_alignment_search(
    log_prob: torch.Tensor, text_lengths: torch.Tensor, frame_lengths: torch.Tensor
) -> torch.Tensor:
    """Hard alignment for a batch.

    Args:
        log_prob: ``[batch, text, frames]`` log-likelihood of each frame under each token.
        text_lengths, frame_lengths: ``[batch]`` valid lengths (each frame count >= text count).
    Returns:
        ``[batch, text, frames]`` 0/1 path (float, on ``log_prob``'s device); each valid frame is
        assigned to exactly one token and every token gets at least one frame.
    """
    values = log_prob.detach().float().cpu().numpy()
    paths = np.zeros(values.shape, dtype=np.float32)
    for b, (n_text, n_frames) in enumerate(zip(text_lengths.tolist(), frame_lengths.tolist())):
        if n_frames < n_text:
            raise ValueError(f"utterance {b} has fewer frames ({n_frames}) than tokens ({n_text})")
        _search_one(values[b], paths[b], int(n_text), int(n_frames))
    return torch.from_numpy(paths).to(log_prob.device)


def durations_to_path(durations: torch.Tensor, n_frames: int | None = None) -> torch.Tensor:
    """Integer durations ``[batch, text]`` -> 0/1 path ``[batch, text, frames]``.

    Frames beyond an utterance's total duration are unassigned (all-zero columns).
    """
    ends = torch.cumsum(durations, dim=1)
    starts = ends - durations
    total = int(ends[:, -1].max().item()) if n_frames is None else n_frames
    frames = torch.arange(total, device=durations.device).view(1, 1, -1)
    return ((frames >= starts.unsqueeze(-1)) & (frames < ends.unsqueeze(-1))).float()


def beta_binomial_log_prior(
    text_lengths: torch.Tensor, frame_lengths: torch.Tensor, n_text: int, n_frames: int, scale: float = 1.0
) -> torch.Tensor:
    """A near-diagonal alignment prior (RAD-TTS): ``[batch, text, frames]`` log-probabilities.

    Frame j of T is spread over the N tokens by a beta-binomial centred on token j*N/T. Added to the
    alignment log-likelihood early in training, it gives the search a sensible monotonic path while
    the prior means are still random, which is what lets the encoder start learning phonemes at all.
    Padding positions are 0.
    """
    from scipy.special import betaln, gammaln

    prior = np.zeros((len(text_lengths), n_text, n_frames), dtype=np.float32)
    for b, (n, t) in enumerate(zip(text_lengths.tolist(), frame_lengths.tolist())):
        k = np.arange(n)[:, None]
        j = np.arange(1, t + 1)[None, :]
        alpha, beta = scale * j, scale * (t - j + 1)
        prior[b, :n, :t] = (
            gammaln(n) - gammaln(k + 1) - gammaln(n - k) + betaln(k + alpha, n - 1 - k + beta) - betaln(alpha, beta)
        )
    return torch.from_numpy(prior)
