"""The vocoder interface, the registry of vocoder types, and saving/loading vocoder folders.

A saved vocoder is a folder with two files, never a pickle:

* ``vocoder.safetensors``: the module's ``state_dict`` (empty for vocoders without weights);
* ``vocoder.json``: ``{"format": 1, "type": <registered name>, "config": {...}, "mel_config": {...}}``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from chorus.atomic import atomic_write, atomic_write_text
from chorus.audio.mel import MelConfig

WEIGHTS_FILE = "vocoder.safetensors"
CONFIG_FILE = "vocoder.json"
FORMAT_VERSION = 1


class VocoderError(ValueError):
    """An unknown vocoder name, an unreadable vocoder folder, or a mel-config mismatch."""


class Vocoder(torch.nn.Module, ABC):
    """Log-mel ``[batch, frames, n_mels]`` -> waveform ``[batch, frames * hop_length]``.

    Subclasses set ``config_class`` (a dataclass of JSON-friendly scalars), take
    ``(config, mel_config)`` in ``__init__`` and implement :meth:`forward`. ``name`` is set by
    :func:`register_vocoder`; ``needs_weights = False`` lets :func:`load_vocoder` build it by name.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type]
    needs_weights: ClassVar[bool] = True

    def __init__(self, config: Any, mel_config: MelConfig = MelConfig()):
        super().__init__()
        self.config = config
        self.mel_config = mel_config

    @property
    def sample_rate(self) -> int:
        return self.mel_config.sample_rate

    @property
    def hop_length(self) -> int:
        return self.mel_config.hop_length

    @abstractmethod
    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        """``log_mel [batch, frames, n_mels]`` (natural log, as :class:`MelSpectrogram` makes it)
        -> ``audio [batch, frames * hop_length]``."""

    def vocode(self, log_mel: np.ndarray | torch.Tensor) -> np.ndarray:
        """Inference convenience: ``[frames, n_mels]`` or ``[batch, frames, n_mels]`` (numpy or
        torch, any device) -> float32 numpy audio ``[samples]`` or ``[batch, samples]``."""
        mel = torch.as_tensor(log_mel, dtype=torch.float32)
        squeeze = mel.dim() == 2
        if squeeze:
            mel = mel.unsqueeze(0)
        if mel.dim() != 3 or mel.shape[-1] != self.mel_config.n_mels:
            raise VocoderError(
                f"{self.name} vocoder expects log-mel [batch, frames, "
                f"{self.mel_config.n_mels}], got {list(log_mel.shape)}"
            )
        device = next(itertools.chain(self.parameters(), self.buffers()), torch.empty(0)).device
        with torch.inference_mode():
            audio = self(mel.to(device)).float().cpu().numpy()
        return audio[0] if squeeze else audio

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``vocoder.safetensors`` + ``vocoder.json`` into ``folder``; returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": FORMAT_VERSION,
            "type": self.name,
            "config": dataclasses.asdict(self.config),
            "mel_config": self.mel_config.to_dict(),
        }
        # contiguous() because safetensors refuses views; clone() because it refuses shared storage.
        tensors = {key: value.detach().cpu().contiguous().clone() for key, value in self.state_dict().items()}
        atomic_write(folder / WEIGHTS_FILE, lambda temp: save_file(tensors, str(temp)))
        atomic_write_text(folder / CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
        return folder


_REGISTRY: dict[str, type[Vocoder]] = {}
V = TypeVar("V", bound=type[Vocoder])


def register_vocoder(name: str) -> Callable[[V], V]:
    """Class decorator: make a :class:`Vocoder` subclass buildable and loadable as ``name``."""

    def decorator(cls: V) -> V:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise VocoderError(f"vocoder name {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_vocoders() -> list[str]:
    return sorted(_REGISTRY)


def vocoder_class(name: str) -> type[Vocoder]:
    """The class registered as ``name``; :class:`VocoderError` listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise VocoderError(
            f"unknown vocoder {name!r}; registered vocoders: {', '.join(registered_vocoders())}"
        ) from None


def build_vocoder(name: str, mel_config: MelConfig = MelConfig(), **config_fields: Any) -> Vocoder:
    """A fresh (untrained) vocoder: ``build_vocoder("vocos", dim=128)``."""
    cls = vocoder_class(name)
    try:
        config = cls.config_class(**config_fields)
    except TypeError as error:
        raise VocoderError(f"bad config for vocoder {name!r}: {error}") from None
    return cls(config, mel_config)


def load_vocoder(
    path_or_name: str | os.PathLike, mel_config: MelConfig | None = None, device: str | torch.device = "cpu"
) -> Vocoder:
    """A vocoder in eval mode from a saved folder, or by registered name if it needs no weights.

    ``mel_config`` is the acoustic model's: a saved vocoder trained on different mel features is
    refused, since it would turn them into noise without any error.
    """
    path = Path(path_or_name)
    if not path.is_dir():
        name = str(path_or_name)
        if name not in _REGISTRY:
            # Only the names that work alone: one needing weights ("vocos") is given as its folder.
            usable = [n for n in registered_vocoders() if not _REGISTRY[n].needs_weights]
            raise VocoderError(
                f"{name!r} is neither a vocoder folder nor a registered vocoder; by name: {', '.join(usable)}"
            )
        cls = _REGISTRY[name]
        if cls.needs_weights:
            raise VocoderError(
                f"vocoder {name!r} needs trained weights: pass the folder holding {WEIGHTS_FILE} and {CONFIG_FILE}"
            )
        return cls(cls.config_class(), mel_config or MelConfig()).to(device).eval()

    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
        saved_mel = MelConfig(**meta["mel_config"])
        cls = vocoder_class(meta["type"])
        config = cls.config_class(**meta["config"])
    except FileNotFoundError:
        raise VocoderError(f"{path}: no {CONFIG_FILE}; not a saved vocoder folder") from None
    except VocoderError as error:
        raise VocoderError(
            f"{path / CONFIG_FILE}: {error} (import the module that registers it before loading)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise VocoderError(f"{path / CONFIG_FILE}: unreadable vocoder config ({error!r})") from None
    if mel_config is not None and saved_mel != mel_config:
        differences = ", ".join(
            f"{field} {getattr(saved_mel, field)} != {getattr(mel_config, field)}"
            for field in saved_mel.to_dict()
            if getattr(saved_mel, field) != getattr(mel_config, field)
        )
        raise VocoderError(
            f"{path}: vocoder was trained on different mel features than the model's (vocoder vs model: {differences})"
        )

    vocoder = cls(config, saved_mel)
    try:
        vocoder.load_state_dict(load_file(str(path / WEIGHTS_FILE)), strict=True)
    except (OSError, RuntimeError, SafetensorError) as error:
        raise VocoderError(f"{path / WEIGHTS_FILE}: cannot load weights ({error})") from None
    return vocoder.to(device).eval()
