"""A training run's checkpoint: the model's own files plus the training state, in one folder.

Every resumable loop (pretraining, the vocoder) saves through :func:`save_checkpoint` and reads back
through :func:`load_training_state`. Beside the model's files (``model.safetensors`` +
``config.json`` for an acoustic model, ``vocoder.safetensors`` + ``vocoder.json`` for a vocoder),
the folder keeps ``training_state.safetensors`` + ``training_state.json``: optimizer tensors and the
state dicts of modules that are not the model (a discriminator), and JSON metadata (step, loss
history, optimizer hyperparameters), so a run can resume exactly; no pickle anywhere. The whole
folder is written to a temporary name and renamed into place (:func:`chorus.atomic.atomic_write_folder`),
so a killed process never leaves a half-written checkpoint.

Tensor names: ``NAME.PARAM_INDEX.KEY`` for the optimizer ``NAME`` (``optimizer.3.exp_avg``; a state
nested one level deeper, as bitsandbytes' 8-bit ones are, ``optimizer.3.KEY.INNER``) and
``NAME.KEY`` for the module ``NAME``; an optimizer's param groups and non-tensor state go to the
metadata under its name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from chorus.atomic import atomic_write_folder, recover_interrupted_write

STATE_TENSORS = "training_state.safetensors"
STATE_META = "training_state.json"


def pack_optimizer(optimizer: torch.optim.Optimizer, prefix: str = "optimizer") -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into tensors ``{prefix}.{param index}.{name}`` (for safetensors)
    and JSON-able metadata (param groups, non-tensor state values)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for param_id, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, dict):  # bitsandbytes nests a parameter's quantized states in one dict
                for inner, tensor in value.items():
                    # Cloned: its quantization maps are one tensor shared by every parameter, and
                    # safetensors refuses shared memory.
                    tensors[f"{prefix}.{param_id}.{name}.{inner}"] = tensor.detach().clone().contiguous().cpu()
            elif torch.is_tensor(value):
                tensors[f"{prefix}.{param_id}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{param_id}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def unpack_optimizer(tensors: Mapping[str, torch.Tensor], meta: dict, prefix: str = "optimizer") -> dict:
    """Inverse of :func:`pack_optimizer`: a state dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith(f"{prefix}."):
            param_id, name = key.removeprefix(f"{prefix}.").split(".", 1)
            outer, _, inner = name.partition(".")  # a nested state (bitsandbytes) has a second part
            if inner:
                state.setdefault(int(param_id), {}).setdefault(outer, {})[inner] = value
            else:
                state.setdefault(int(param_id), {})[name] = value
    for key, value in meta["scalars"].items():
        param_id, name = key.split(".", 1)
        state.setdefault(int(param_id), {})[name] = value
    # JSON turned the betas tuples into lists; give the optimizer back what it saved.
    groups = [
        {**group, "betas": tuple(group["betas"])} if "betas" in group else dict(group) for group in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    folder: str | Path,
    write_model: Callable[[Path], object],
    meta: dict,
    optimizers: Mapping[str, torch.optim.Optimizer],
    modules: Mapping[str, nn.Module] | None = None,
) -> Path:
    """Write a checkpoint folder atomically and return it.

    ``write_model(temp_folder)`` writes the model's own files; ``meta`` is the loop's JSON-able state
    (step, ...); ``optimizers`` and ``modules`` are saved under their names (see the module docstring).
    """
    modules = modules or {}
    names = [*optimizers, *modules]
    # Names prefix tensor names and key metadata entries: each must pick out its own.
    if len(set(names)) != len(names) or set(names) & set(meta) or any("." in name for name in names):
        raise ValueError(
            f"optimizer and module names must be distinct, free of dots and not metadata keys: {names} / {sorted(meta)}"
        )
    tensors: dict[str, torch.Tensor] = {}
    full_meta = dict(meta)
    for name, optimizer in optimizers.items():
        optimizer_tensors, full_meta[name] = pack_optimizer(optimizer, name)
        tensors.update(optimizer_tensors)
    for name, module in modules.items():
        tensors.update(
            {f"{name}.{key}": value.detach().contiguous().cpu() for key, value in module.state_dict().items()}
        )

    def write(temp: Path) -> None:
        write_model(temp)
        save_file(tensors, str(temp / STATE_TENSORS))
        (temp / STATE_META).write_text(json.dumps(full_meta, indent=1))

    return atomic_write_folder(Path(folder), write)


@dataclass
class TrainingState:
    """What :func:`save_checkpoint` wrote beside the model: ``meta`` (the loop's metadata, plus one
    entry per optimizer) and ``tensors`` (optimizer and module tensors)."""

    meta: dict
    tensors: dict[str, torch.Tensor]

    def restore(
        self, optimizers: Mapping[str, torch.optim.Optimizer], modules: Mapping[str, nn.Module] | None = None
    ) -> None:
        """Load the saved state into ``optimizers`` and ``modules`` (in place), each by its name."""
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(unpack_optimizer(self.tensors, self.meta[name], name))
        for name, module in (modules or {}).items():
            module.load_state_dict(
                {
                    key.removeprefix(f"{name}."): value
                    for key, value in self.tensors.items()
                    if key.startswith(f"{name}.")
                }
            )


def load_training_state(folder: str | Path) -> TrainingState | None:
    """The training state saved in checkpoint ``folder``, or None when there is none. A write killed
    between its two renames is finished first (the last complete checkpoint is put back)."""
    folder = Path(folder)
    recover_interrupted_write(folder)
    if not (folder / STATE_META).is_file():
        return None
    return TrainingState(json.loads((folder / STATE_META).read_text()), load_file(str(folder / STATE_TENSORS)))
