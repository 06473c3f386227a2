"""Where a model runs: a device name checked before anything is loaded onto it, and the threads it runs on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count at ``count`` inside, and back at what it was after (a library call must
    not leave the caller's process on its own thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def checked_device(value: str) -> str:
    """``value`` if it is ``cpu``, ``cuda`` or ``cuda:N`` and this machine has it; ``ValueError`` saying which
    it is not (torch's own errors name every device type it knows, or fail an assertion deep in torch.cuda)."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{value!r} is not a device (cpu, cuda, cuda:N)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{value!r}: this machine has no CUDA device (torch {torch.__version__})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0 on")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{value!r}: Chorus runs on cpu or cuda")
    return value
