"""Length-bucketed batches: utterances of similar length together, capped by total frames.

Padding is the main waste on a CPU; sorting into buckets and capping a batch by padded frames (not by
count) keeps every step about the same cost whatever the clip lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chorus.data.features import FeatureCache


def make_batches(
    frames: np.ndarray, max_frames: int, *, max_items: int = 64, seed: int = 0, shuffle: bool = True
) -> list[np.ndarray]:
    """Group indices so that ``len(batch) * longest_in_batch <= max_frames`` (at least one item).

    Items are sorted by length with a little noise (so batches differ between epochs), cut greedily,
    and the batch order is shuffled.
    """
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0, 0.1, len(frames)) * frames if shuffle else np.zeros(len(frames))
    order = np.argsort(frames + noise, kind="stable")
    batches, current, longest = [], [], 0
    for index in order:
        candidate = max(longest, frames[index])
        if current and (candidate * (len(current) + 1) > max_frames or len(current) >= max_items):
            batches.append(np.asarray(current))
            current, candidate = [], frames[index]
        current.append(index)
        longest = candidate
    if current:
        batches.append(np.asarray(current))
    if shuffle:
        rng.shuffle(batches)
    return batches


@dataclass
class Batch:
    phonemes: torch.Tensor  # [batch, text] int64, 0 = padding
    text_lengths: torch.Tensor  # [batch]
    mel: torch.Tensor  # [batch, frames, n_mels] raw log-mel, zero padded
    frame_lengths: torch.Tensor  # [batch]
    speakers: torch.Tensor  # [batch]
    pitch: torch.Tensor | None = None  # [batch, frames] log F0, zero padded (when the cache has it)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            self.phonemes.to(device),
            self.text_lengths.to(device),
            self.mel.to(device),
            self.frame_lengths.to(device),
            self.speakers.to(device),
            None if self.pitch is None else self.pitch.to(device),
        )


def collate(cache: FeatureCache, indices: np.ndarray) -> Batch:
    items = [cache.item(int(i)) for i in indices]
    text_lengths = torch.tensor([len(item[0]) for item in items])
    frame_lengths = torch.tensor([len(item[1]) for item in items])
    phonemes = torch.zeros(len(items), int(text_lengths.max()), dtype=torch.long)
    mel = torch.zeros(len(items), int(frame_lengths.max()), items[0][1].shape[1])
    pitch = None if cache.pitch is None else torch.zeros(len(items), int(frame_lengths.max()))
    for row, (ids, frames, _, log_f0) in enumerate(items):
        phonemes[row, : len(ids)] = torch.from_numpy(ids)
        mel[row, : len(frames)] = torch.from_numpy(frames)
        if pitch is not None:
            pitch[row, : len(log_f0)] = torch.from_numpy(log_f0)
    speakers = torch.tensor([item[2] for item in items])
    return Batch(phonemes, text_lengths, mel, frame_lengths, speakers, pitch)
