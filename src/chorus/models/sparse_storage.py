"""Compact storage of sparse weights in safetensors: the kept values and a bitmask, not the zeros.

A tensor whose share of non-zero entries is at most :data:`PACK_DENSITY` is stored as two entries:
``<name>.__kept`` (its non-zero values, 1-D, in its own dtype, row-major order) and ``<name>.__mask``
(one bit per entry, ``numpy.packbits`` order, uint8). The file's metadata ``packed`` maps each packed
name to its shape, so a reader that does not know this format fails loudly (the names are missing)
instead of loading zeros. Dense tensors, and every tensor of a dense model, are stored as they are.
Bytes on disk: ``nnz * itemsize + numel / 8`` instead of ``numel * itemsize``.
"""

from __future__ import annotations

import json

import numpy as np
import torch

PACK_DENSITY = 0.9  # pack a tensor at or below this share of non-zero entries (dense models stay plain)
KEPT, MASK = ".__kept", ".__mask"
METADATA_KEY = "packed"


def pack(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``state`` with its sparse floating-point tensors packed; returns (tensors, metadata entries)."""
    tensors: dict[str, torch.Tensor] = {}
    shapes: dict[str, list[int]] = {}
    for name, tensor in state.items():
        nonzero = tensor != 0
        if tensor.is_floating_point() and tensor.numel() >= 64 and nonzero.float().mean() <= PACK_DENSITY:
            tensors[name + KEPT] = tensor[nonzero].contiguous()
            tensors[name + MASK] = torch.from_numpy(np.packbits(nonzero.flatten().numpy()))
            shapes[name] = list(tensor.shape)
        else:
            tensors[name] = tensor
    return tensors, ({METADATA_KEY: json.dumps(shapes)} if shapes else {})


def unpack(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> dict[str, torch.Tensor]:
    """The inverse of :func:`pack`: the full tensors, zeros restored (``ValueError`` if damaged)."""
    shapes = json.loads((metadata or {}).get(METADATA_KEY, "{}"))
    state = {name: tensor for name, tensor in tensors.items() if not name.endswith((KEPT, MASK))}
    for name, shape in shapes.items():
        try:
            kept, bits = tensors[name + KEPT], tensors[name + MASK]
        except KeyError as error:
            raise ValueError(f"packed tensor {name!r} lacks {error.args[0]!r}") from None
        numel = int(np.prod(shape))
        nonzero = torch.from_numpy(np.unpackbits(bits.numpy(), count=numel).astype(bool))
        if int(nonzero.sum()) != kept.numel():
            raise ValueError(
                f"packed tensor {name!r}: its mask keeps {int(nonzero.sum())} values, it holds {kept.numel()}"
            )
        full = torch.zeros(numel, dtype=kept.dtype, device=kept.device)
        full[nonzero.to(kept.device)] = kept
        state[name] = full.view(shape)
    return state
