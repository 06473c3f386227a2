"""Model sizes by name for memory accounting: the shipped base, a 506M-parameter configuration, or
a JSON file of :class:`~chorus.models.config.AcousticConfig` fields."""

from __future__ import annotations

import json
from pathlib import Path

from chorus.models.config import AcousticConfig

# 506M parameters: a size where one full fine-tuning step no longer fits a 12 GB card.
LARGE_500M = dict(
    d_model=1024, n_heads=16, encoder_layers=8, decoder_layers=9, ff_hidden=4096, predictor_hidden=1024, speaker_dim=256
)


def model_config_by_name(name: str) -> AcousticConfig:
    """``"shipped"``, ``"500m"`` or the path of a JSON file of AcousticConfig fields."""
    if name == "shipped":
        from chorus.synthesis import DEFAULT_BASE

        return AcousticConfig.from_dict(json.loads((DEFAULT_BASE / "config.json").read_text())["model"])
    if name == "500m":
        return AcousticConfig(**LARGE_500M)
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"model size {name!r}: not 'shipped', '500m' or a JSON file")
    return AcousticConfig.from_dict(json.loads(path.read_text()))
