"""Naturalness judge: a predicted mean opinion score (MOS, 1-5) per clip, from ``distillmos``.

distillmos (Stahl & Gamper, 2025) is a small convolutional transformer distilled from XLS-R speech
quality models; its weights (``distill_mos_v7.pt``, 17 MB) ship inside the wheel, so it loads
offline. It takes 16 kHz mono audio and gives one score per clip.

distillmos imports ``torchaudio`` at module import, only for its own command line (file reading and
resampling); Chorus hands it arrays it resampled itself. The only ``torchaudio`` the package index has
for the pinned torch is a CUDA build that cannot load beside the CPU torch and, installed, breaks
transformers, so ``scripts/install.sh`` installs distillmos without its declared dependencies and no
``torchaudio`` at all. When a real ``torchaudio`` loads it is used as is; when it does not, distillmos
is imported with a placeholder ``torchaudio`` that raises on any use, removed again right after, so
no other import ever sees it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import sys
import types

import numpy as np
import soxr
import torch

from chorus.audio.io import SAMPLE_RATE

MOS_SAMPLE_RATE = 16_000


class _TorchaudioPlaceholder(types.ModuleType):
    """Stands in for a ``torchaudio`` that cannot load, while distillmos is imported."""

    def __init__(self, reason: str):
        super().__init__("torchaudio")
        self.reason = reason

    def __getattr__(self, name: str):
        raise ImportError(
            f"torchaudio.{name} is not available ({self.reason}); the naturalness judge passes audio arrays "
            "to distillmos and never needs it"
        )


@contextlib.contextmanager
def _torchaudio_for_import():
    """Within the block, ``import torchaudio`` gives the real module if it loads, else a placeholder."""
    try:
        importlib.import_module("torchaudio")
        yield
        return
    except (ImportError, OSError) as error:  # OSError: "Could not load this library" (ABI mismatch)
        reason = f"{type(error).__name__}: {error}"
    # A failed import can leave torchaudio's submodules half-initialized in sys.modules.
    for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
        del sys.modules[name]
    sys.modules["torchaudio"] = _TorchaudioPlaceholder(reason)
    try:
        yield
    finally:
        sys.modules.pop("torchaudio", None)


INSTALL_HINT = 'pip install --no-deps "distillmos==0.9.1" "xls-r-sqa==0.1.0" (as scripts/install.sh does)'


def naturalness_available() -> bool:
    """Whether distillmos is installed (without it, judges run without the naturalness score)."""
    return importlib.util.find_spec("distillmos") is not None


def load_distillmos() -> torch.nn.Module:
    """distillmos's ``ConvTransformerSQAModel`` with its shipped weights, in eval mode."""
    if not naturalness_available():
        raise ImportError(f"the naturalness judge needs distillmos: {INSTALL_HINT}")
    with _torchaudio_for_import():
        from distillmos import ConvTransformerSQAModel
    with contextlib.redirect_stdout(io.StringIO()):  # it prints where it loaded its weights from
        return ConvTransformerSQAModel().eval()


class NaturalnessJudge:
    """Predicted MOS of clips; the model loads on first use (~0.5 s), ~0.05 s per second of audio."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._model = load_distillmos().to(self.device)
        return self._model

    @torch.no_grad()
    def score(self, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
        """Predicted MOS (1 = bad .. 5 = excellent) of mono audio ``[samples]`` at ``sample_rate``."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not audio.size:
            raise ValueError("empty audio has no naturalness score")
        if sample_rate != MOS_SAMPLE_RATE:
            audio = soxr.resample(audio, sample_rate, MOS_SAMPLE_RATE, quality="HQ")
        waveform = torch.from_numpy(np.ascontiguousarray(audio)).to(self.device).unsqueeze(0)
        return float(self.model(waveform).reshape(-1)[0])
