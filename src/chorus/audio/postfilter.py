"""A post-filter for an acoustic model's log-mels: undoes some of the over-smoothing that an L1-trained
model's spectra have (flattened dynamics over time, blurred harmonics against their valleys) before any
vocoder turns them into sound.

* ``global_variance``: each mel bin's deviation from its mean over the utterance is multiplied by it
  (the global-variance compensation of statistical parametric synthesis, Toda & Tokuda 2007, in its
  simplest, per-utterance form);
* ``contrast``: each frame's bins are spread around that frame's loudest bin by it, in the log domain,
  which is raising the mel magnitudes to that power: what Tacotron's ``S ** 1.5`` before Griffin-Lim does,
  here for any vocoder, with the loudest band's level kept.

1.0 leaves the mel untouched. The values a base ships with are in its ``config.json`` (``info.postfilter``),
chosen on the judges with the default vocoder (see the base's model card).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class MelPostFilter:
    global_variance: float = 1.0
    contrast: float = 1.0

    def __post_init__(self) -> None:
        if not (0 < self.global_variance <= 3 and 0 < self.contrast <= 3):
            raise ValueError(f"post-filter scales must be in (0, 3], got {self}")

    @property
    def identity(self) -> bool:
        return self.global_variance == 1.0 and self.contrast == 1.0

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        """``log_mel [frames, n_mels]`` or ``[batch, frames, n_mels]`` (each row one whole utterance) -> same."""
        if self.identity:
            return log_mel
        mean = log_mel.mean(-2, keepdim=True)  # per bin, over the utterance's frames
        filtered = mean + self.global_variance * (log_mel - mean)
        top = filtered.amax(-1, keepdim=True)  # per frame, its loudest bin
        return top + self.contrast * (filtered - top)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
