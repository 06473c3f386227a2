"""The model artifact: a folder of safetensors + JSON (never pickle), and what loads it.

A model folder holds ``model.safetensors`` (weights and normalization buffers; a pruned model's sparse
weights as kept values + bitmask, see :mod:`chorus.models.sparse_storage`) and ``config.json``
(model config, text front end with its symbol table, mel settings, speaker names, provenance).
Writes go to a temporary folder that is renamed into place, so a killed process never leaves a
half-written model. This lives with the model, not with the training loops, so that synthesis and
serving load a model without importing training code; a training run's optimizer state is added
to the same folder by :mod:`chorus.training.checkpoint`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from chorus.atomic import atomic_write_folder, recover_interrupted_write
from chorus.audio.mel import MelConfig
from chorus.audio.postfilter import MelPostFilter
from chorus.models import sparse_storage
from chorus.models.acoustic import AcousticModel, build_model
from chorus.models.config import AcousticConfig
from chorus.models.speaker_mix import mix_vector, parse_mix
from chorus.text import TextFrontEnd

MODEL_FORMAT = "chorus-acoustic"
MODEL_FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, corrupted or of another format; the message says which."""


@dataclass
class ModelBundle:
    """Everything needed to use a trained acoustic model; what ``config.json`` describes."""

    model: AcousticModel
    front_end: TextFrontEnd
    mel_config: MelConfig
    speakers: list[str]
    default_speaker: str
    info: dict = field(default_factory=dict)  # provenance: data, steps, wall time ...
    weights_sha256: str = ""  # of model.safetensors when loaded from disk; voices record it

    @property
    def postfilter(self) -> MelPostFilter:
        """The post-filter this base's spectra go through before a vocoder (``info.postfilter``; none if unset)."""
        return MelPostFilter(**self.info.get("postfilter", {}))

    def speaker_index(self, name: str) -> int:
        """The row of speaker ``name`` (case aside: "Flite-RMS" is "flite-rms"); ``KeyError`` with the names
        it looks like, else all of them."""
        for candidate in (name, name.lower()):
            if candidate in self.speakers:
                return self.speakers.index(candidate)
        close = difflib.get_close_matches(name.lower(), self.speakers, n=3, cutoff=0.6)
        if close:
            raise KeyError(
                f"unknown speaker {name!r}; did you mean {' or '.join(map(repr, close))}? (chorus speakers lists all)"
            )
        raise KeyError(f"unknown speaker {name!r}; this model has: {', '.join(self.speakers)}")

    def speaker_mix(self, spec: str) -> torch.Tensor:
        """The speaker vector ``[speaker_dim]`` of a blend such as ``"flite-rms(2)+festival-kal(1)"``
        (:mod:`chorus.models.speaker_mix`); ``KeyError`` for a name that is not a speaker of this model."""
        parts = []
        for name, weight in parse_mix(spec):
            if name not in self.speakers:
                raise KeyError(
                    f"speaker blend {spec!r}: {name!r} is not a speaker of this model (blends take base speakers; "
                    f"an adapted voice cannot be blended): {', '.join(self.speakers)}"
                )
            parts.append((self.speakers.index(name), weight))
        return mix_vector(self.speaker_table(), parts)

    def speaker_table(self) -> torch.Tensor:
        """The base's speaker vectors ``[n_speakers, speaker_dim]``, under any adapter wrapping the table."""
        table = self.model.speaker_embedding
        while hasattr(table, "base_layer"):  # an adapter's wrapper (chorus.adapters.layer.AdapterLayer)
            table = table.base_layer
        return table.weight.detach()

    def config_dict(self) -> dict:
        return {
            "format": MODEL_FORMAT,
            "version": MODEL_FORMAT_VERSION,
            "model": self.model.config.to_dict(),
            "front_end": self.front_end.to_dict(),
            "mel": self.mel_config.to_dict(),
            "speakers": self.speakers,
            "default_speaker": self.default_speaker,
            "info": self.info,
        }


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


MODEL_FILES = ("config.json", "model.safetensors")  # what a model folder holds


def write_bundle_files(bundle: ModelBundle, folder: Path) -> None:
    """Write ``model.safetensors`` and ``config.json`` into an existing (temporary) folder."""
    config_file, weights_file = MODEL_FILES
    state = {k: v.detach().contiguous().cpu() for k, v in bundle.model.state_dict().items()}
    tensors, packed = sparse_storage.pack(state)  # a pruned model's zeros take a bit each
    save_file(tensors, str(folder / weights_file), metadata={"format": MODEL_FORMAT, **packed})
    (folder / config_file).write_text(json.dumps(bundle.config_dict(), indent=2))


def save_bundle(bundle: ModelBundle, folder: str | Path) -> None:
    """Write the model folder atomically (see :func:`chorus.atomic.atomic_write_folder`)."""
    atomic_write_folder(Path(folder), lambda temp: write_bundle_files(bundle, temp))


def load_bundle(folder: str | Path, device: str | torch.device = "cpu") -> ModelBundle:
    """Load a model folder written by :func:`save_bundle`; refuses anything else with a clear error."""
    folder = Path(folder)
    recover_interrupted_write(folder)
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{folder}: missing {path.name} (not a Chorus model folder)")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{config_path}: corrupted JSON ({error})") from error
    if config.get("format") != MODEL_FORMAT:
        raise CheckpointError(f"{config_path}: format {config.get('format')!r} is not {MODEL_FORMAT!r}")
    if config.get("version", 0) > MODEL_FORMAT_VERSION:
        raise CheckpointError(
            f"{config_path}: format version {config['version']} is newer than this "
            f"Chorus understands ({MODEL_FORMAT_VERSION}); upgrade chorus"
        )
    try:
        model_config = AcousticConfig.from_dict(config["model"])
        front_end = TextFrontEnd.from_dict(config["front_end"])
        mel_config = MelConfig(**config["mel"])
        speakers, default_speaker = list(config["speakers"]), config["default_speaker"]
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_path}: invalid model config ({type(error).__name__}: {error})") from error
    try:
        with safe_open(str(weights_path), "pt", device=str(device)) as weights:
            state = sparse_storage.unpack(
                {name: weights.get_tensor(name) for name in weights.keys()}, weights.metadata()
            )
    except Exception as error:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"{weights_path}: cannot read weights ({error})") from error
    # The config's sizes are checked against the weights on a model with no storage before any is allocated: a
    # config saying 3,000,000 speakers took 768 MB before its weights were found not to fit.
    try:
        planned = build_model(model_config, "meta")
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:  # sizes torch cannot build (36.0, 2**62)
        raise CheckpointError(f"{config_path}: invalid model config ({type(error).__name__}: {error})") from error
    _check_fit(planned, state, weights_path)
    model = build_model(model_config, device)
    model.load_state_dict(state)
    model.eval()
    return ModelBundle(
        model, front_end, mel_config, speakers, default_speaker, config.get("info", {}), file_sha256(weights_path)
    )


def _check_fit(model: torch.nn.Module, state: dict[str, torch.Tensor], weights_path: Path) -> None:
    """``CheckpointError`` unless ``state`` holds exactly ``model``'s tensors (built on "meta") in their shapes."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_path}: weights do not match the config (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    wrong = [
        f"{key} {tuple(value.shape)} (the config makes {tuple(expected[key].shape)})"
        for key, value in state.items()
        if value.shape != expected[key].shape
    ]
    if wrong:
        raise CheckpointError(f"{weights_path}: weights do not match the config: {', '.join(wrong[:3])}")


@torch.no_grad()
def teacher_forced_mel(
    bundle: ModelBundle, text: str, recorded_mel: torch.Tensor, speaker: int, model: AcousticModel | None = None
) -> torch.Tensor:
    """Log-mel ``[frames, n_mels]`` of ``text`` in speaker ``speaker`` (index) with the timing that
    alignment search finds in ``recorded_mel`` ``[frames, n_mels]``: training's teacher-forced pass,
    so the output lines up frame for frame with the recording (same number of frames). ``model``:
    another model than ``bundle.model`` (a fully fine-tuned voice's) with the bundle's front end."""
    model = (model or bundle.model).eval()
    device = model.mel_mean.device
    phonemes = torch.tensor(bundle.front_end.encode([text]), device=device)
    mel = model.normalize_mel(torch.as_tensor(recorded_mel, dtype=torch.float32, device=device)).unsqueeze(0)
    out = model(
        phonemes,
        torch.tensor([phonemes.shape[1]], device=device),
        mel,
        torch.tensor([mel.shape[1]], device=device),
        speaker_ids=torch.tensor([speaker], device=device),
    )
    return model.denormalize_mel(out.mel)[0]
