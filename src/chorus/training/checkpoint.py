"""A training run's checkpoint: the model folder (:mod:`chorus.models.bundle`) plus its optimizer state.

Beside ``model.safetensors`` + ``config.json``, a run keeps ``training_state.safetensors`` +
``training_state.json`` (optimizer tensors, step, loss history) so it can resume exactly. The whole
folder is written to a temporary name and renamed into place, so a killed process never leaves a
half-written checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from chorus.atomic import atomic_write_folder
from chorus.models.bundle import ModelBundle, write_bundle_files


def save_checkpoint(bundle: ModelBundle, folder: str | Path, training_state: dict) -> None:
    """Write the model and a training state (``{"tensors": ..., "meta": ...}``, see
    :func:`pack_optimizer`) into one folder, atomically."""
    def write(temp: Path) -> None:
        write_bundle_files(bundle, temp)
        save_file(training_state["tensors"], str(temp / "training_state.safetensors"))
        (temp / "training_state.json").write_text(json.dumps(training_state["meta"], indent=1))
    atomic_write_folder(Path(folder), write)


def pack_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into tensors (for safetensors) and JSON-able metadata."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for param_id, values in state["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{param_id}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{param_id}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def unpack_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """Inverse of :func:`pack_optimizer`: a state dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, param_id, name = key.split(".", 2)
            state.setdefault(int(param_id), {})[name] = value
    for key, value in meta["scalars"].items():
        param_id, name = key.split(".", 1)
        state.setdefault(int(param_id), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def load_training_state(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict] | None:
    folder = Path(folder)
    if not (folder / "training_state.json").is_file():
        return None
    return load_file(str(folder / "training_state.safetensors")), json.loads((folder / "training_state.json").read_text())
