"""A voice space: a voice as a short vector z that generates its whole adapter.

A linear hypernetwork shared by all voices maps ``z`` (``dim`` numbers, tens) to every adapter
tensor of a voice: ``T(z) = center_T + basis_T @ z`` for each tensor T (LoRA A and B of every
targeted layer, the speaker vector ...). It is learned over many voices at once (each with its own
z, see :mod:`chorus.training.voice_space_training`); a new voice then fits only its z, which needs far less
audio than fitting the adapter itself. The generated tensors have the usual adapter layout, so a
voice made this way is saved and served as any other voice folder.

Saved as ``voice_space.safetensors`` (centers, bases, the training voices' z and, where a speaker
encoder is installed, their speaker embeddings and a linear map from an embedding to z) +
``voice_space.json`` (dim, method configs, tensor shapes, the training voices' names, base model hash,
the speaker encoder that made the embeddings).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from chorus.adapters.bank import VoiceBank
from chorus.adapters.registry import MethodConfig, config_from_dict
from chorus.atomic import atomic_write_folder

SPACE_FORMAT = "chorus-voice-space"
SPACE_FILES = ("voice_space.json", "voice_space.safetensors")  # what a voice space folder holds, and all it holds


class VoiceSpace(nn.Module):
    """``generate(z [K, dim]) -> {canonical tensor key: [K, *shape]}`` for the adapter of ``configs``."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], dim: int, configs: list[MethodConfig], base_model_sha256: str = ""
    ):
        super().__init__()
        self.shapes, self.dim, self.configs = dict(shapes), dim, list(configs)
        self.base_model_sha256 = base_model_sha256
        self.keys = sorted(shapes)
        self.center = nn.ParameterList(nn.Parameter(torch.zeros(shapes[k])) for k in self.keys)
        self.basis = nn.ParameterList(nn.Parameter(torch.zeros(math.prod(shapes[k]), dim)) for k in self.keys)
        # The training voices: their names and z [K, dim], set once training ends. Their mean
        # speaker embeddings ([K, D], by ``embedder``) and the linear map from a d-vector to z are set by
        # fit_embedding_map (optional: empty without the judges).
        self.voice_names: list[str] = []
        # Which speaker encoder made voice_embeddings: "resemblyzer", or "chorus-speaker-encoder:<sha256>".
        self.embedder = "resemblyzer"
        self.register_buffer("voice_z", torch.zeros(0, dim))
        self.register_buffer("voice_embeddings", torch.zeros(0))
        self.register_buffer("embedding_to_z", torch.zeros(0))

    @classmethod
    def from_bank(
        cls,
        bank: VoiceBank,
        dim: int,
        configs: list[MethodConfig],
        base_model_sha256: str = "",
        basis_scale: float = 1e-3,
    ) -> VoiceSpace:
        """A space shaped like one slot of ``bank``; centers start at the mean of the bank's voices
        (their initial adapters), bases small and random so every direction of z has a gradient."""
        values = {
            f"{path}.{key}": layer.bank[key].detach()
            for path, layer in bank.layers
            for key in layer.adapter_state(layer.names()[0])
        }
        space = cls({k: tuple(v.shape[1:]) for k, v in values.items()}, dim, configs, base_model_sha256)
        with torch.no_grad():
            for index, key in enumerate(space.keys):
                space.center[index].copy_(values[key].mean(0))
                space.basis[index].normal_(std=basis_scale)
        return space

    def generate(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """z ``[K, dim]`` -> each adapter tensor for the K voices, ``[K, *shape]``."""
        return {
            key: center + (z @ basis.T).view(z.shape[0], *center.shape)
            for key, center, basis in zip(self.keys, self.center, self.basis)
        }

    def voice_tensors(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """One voice's adapter tensors (canonical keys, as :func:`~chorus.adapters.adapter_state_dict`)."""
        return {key: value[0].detach() for key, value in self.generate(z.view(1, -1)).items()}

    def set_voices(self, names: list[str], z: torch.Tensor) -> None:
        """Record the training voices' names and their learned z ``[K, dim]``."""
        if z.shape != (len(names), self.dim):
            raise ValueError(f"z of shape {tuple(z.shape)} for {len(names)} voices of a dim-{self.dim} space")
        self.voice_names, self.voice_z = list(names), z.detach().clone()

    def z_from_embedding(self, embedding: torch.Tensor) -> torch.Tensor | None:
        """A starting z for a voice from its mean speaker speaker embedding ``[D]``, if the map was fitted."""
        if self.embedding_to_z.numel() == 0:
            return None
        return torch.cat([embedding, embedding.new_ones(1)]) @ self.embedding_to_z

    def nearest_voice(self, embedding: torch.Tensor) -> int | None:
        """Index of the training voice whose embedding is closest (cosine) to ``embedding`` ``[256]``;
        None if the space kept no embeddings."""
        if self.voice_embeddings.numel() == 0:
            return None
        return int(torch.nn.functional.cosine_similarity(self.voice_embeddings, embedding.view(1, -1)).argmax())

    def fit_embedding_map(self, embeddings: torch.Tensor, ridge: float = 1e-2) -> None:
        """Keep the training voices' embeddings ``[K, d]`` and fit least squares (ridge) from an embedding
        (+ bias) to their z."""
        if len(embeddings) != len(self.voice_z):
            raise ValueError(f"{len(embeddings)} embeddings for {len(self.voice_z)} training voices")
        features = torch.cat([embeddings, embeddings.new_ones(len(embeddings), 1)], dim=1).double()
        gram = features.T @ features + ridge * torch.eye(features.shape[1], dtype=torch.float64)
        self.embedding_to_z = torch.linalg.solve(gram, features.T @ self.voice_z.double()).float()
        self.voice_embeddings = embeddings.detach().float().clone()

    def save(self, folder: str | Path) -> Path:
        tensors = {f"center.{k}": c.detach().contiguous() for k, c in zip(self.keys, self.center)}
        tensors |= {f"basis.{k}": b.detach().contiguous() for k, b in zip(self.keys, self.basis)}
        tensors |= {
            name: getattr(self, name).contiguous() for name in ("voice_z", "voice_embeddings", "embedding_to_z")
        }
        meta = {
            "format": SPACE_FORMAT,
            "version": 1,
            "dim": self.dim,
            "configs": [c.to_dict() for c in self.configs],
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "voices": self.voice_names,
            "base_model_sha256": self.base_model_sha256,
            "embedder": self.embedder,
        }

        def write(temp: Path) -> None:
            save_file(tensors, str(temp / SPACE_FILES[1]))
            (temp / SPACE_FILES[0]).write_text(json.dumps(meta, indent=1))
            (temp / SPACE_FILES[1]).chmod((temp / SPACE_FILES[0]).stat().st_mode)  # safetensors writes 0600

        return atomic_write_folder(folder, write)

    @classmethod
    def load(cls, folder: str | Path) -> tuple[VoiceSpace, torch.Tensor, list[str]]:
        """(space, the training voices' z ``[K, dim]``, their names)."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / SPACE_FILES[0]).read_text())
            tensors = load_file(str(folder / SPACE_FILES[1]))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{folder}: not a readable voice space ({error})") from error
        if meta.get("format") != SPACE_FORMAT:
            raise ValueError(f"{folder}: not a voice space (format {meta.get('format')!r})")
        space = cls(
            {k: tuple(v) for k, v in meta["shapes"].items()},
            meta["dim"],
            [config_from_dict(c) for c in meta["configs"]],
            meta.get("base_model_sha256", ""),
        )
        with torch.no_grad():
            for index, key in enumerate(space.keys):
                space.center[index].copy_(tensors[f"center.{key}"])
                space.basis[index].copy_(tensors[f"basis.{key}"])
        space.set_voices(meta["voices"], tensors["voice_z"])
        space.embedding_to_z = tensors["embedding_to_z"]
        # Spaces saved before the d-vectors were kept have none: they cannot start from the nearest voice.
        space.voice_embeddings = tensors.get("voice_embeddings", torch.zeros(0))
        space.embedder = meta.get("embedder", "resemblyzer")  # spaces saved before it was recorded
        return space, space.voice_z, space.voice_names


@contextmanager
def generated(bank: VoiceBank, tensors: dict[str, torch.Tensor]):
    """Make ``bank`` serve ``tensors`` (canonical key -> ``[K, *shape]``) instead of its own values."""
    for path, layer in bank.layers:
        # Keys of layers nested below this one come along too; this layer never looks them up.
        layer.bank.generated = {
            key[len(path) + 1 :]: value for key, value in tensors.items() if key.startswith(path + ".")
        }
    try:
        yield
    finally:
        for _, layer in bank.layers:
            layer.bank.generated = None
