"""Memory-efficient training: documented flags that each state what they cost.

Training memory is weights + gradients + optimizer states + activations. The options here shrink
the last two:

* activations: ``checkpointing`` (rerun each block in backward) or ``reversible`` blocks (recompute
  block inputs from outputs; a model built with ``AcousticConfig.reversible``), and ``precision``
  ``"bf16"`` (autocast: activations mostly in bfloat16);
* optimizer states: ``optimizer`` ``"adamw8bit"`` / ``"adamw8bit-torchao"`` (Adam moments in 8 bits
  instead of 2 x fp32 per value).

:class:`chorus.recipe.MemoryOptions` holds them (plain data, with one-line help per field for a CLI);
``apply_memory_options`` sets them on a model; ``build_optimizer`` and ``autocast`` are what a training
loop calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from chorus.adapters.inject import adapter_tensors
from chorus.models.acoustic import AcousticModel, TransformerStack
from chorus.recipe import OPTIMIZERS, PRECISIONS, MemoryOptions
from chorus.training.frozen_layers import lighten_frozen_layers

# Every tensor gets 8-bit moments (see build_optimizer); a block of 256 values is the quantization unit.
BNB_MIN_8BIT_SIZE = 1


def autocast(precision: str, device: str | torch.device) -> AbstractContextManager:
    """The forward-pass context for ``precision``: ``"fp32"`` does nothing, ``"bf16"`` autocasts.

    Run forward and loss inside it and ``backward()`` outside (the usual autocast recipe). bfloat16
    keeps float32's exponent range, so no gradient scaler is needed, unlike float16.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def import_bitsandbytes():
    """bitsandbytes, imported without the warning its CPU backend logs when it cannot fetch a kernel from the
    Hugging Face Hub ("Failed to load CPU gemm_4bit_forward from kernels-community ..."): Chorus fetches nothing
    at run time, and its 8-bit optimizers need no 4-bit kernel."""
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    finally:
        logger.setLevel(level)
    return bitsandbytes


def build_optimizer(
    params_or_groups: Iterable[nn.Parameter] | Iterable[dict],
    name: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> torch.optim.Optimizer:
    """AdamW by ``name`` (see :data:`OPTIMIZERS`): full-precision or with 8-bit moments.

    ``params_or_groups`` is what any torch optimizer takes: parameters, or dicts of parameter groups.
    Only pass trainable parameters (frozen ones would still get states in some implementations).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    settings = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
    if name == "adamw":
        return torch.optim.AdamW(params_or_groups, **settings)
    if name == "adamw8bit":
        try:
            bitsandbytes = import_bitsandbytes()
        except ImportError as error:
            raise ImportError("optimizer 'adamw8bit' needs bitsandbytes: pip install bitsandbytes") from error
        # bitsandbytes keeps float32 moments for tensors under min_8bit_size values (4096 by default),
        # which is every adapter tensor here: the 8-bit states would apply to nothing an adapter trains.
        return bitsandbytes.optim.AdamW8bit(params_or_groups, min_8bit_size=BNB_MIN_8BIT_SIZE, **settings)
    try:
        from torchao.optim import AdamW8bit
    except Exception as error:  # a torchao built for another torch fails with more than ImportError
        raise ImportError(
            f"optimizer 'adamw8bit-torchao' needs a torchao release built for torch "
            f"{torch.__version__.split('+')[0]} (torchao 0.18 works with torch 2.13): "
            f"pip install --no-deps torchao ({type(error).__name__}: {error})"
        ) from error
    return AdamW8bit(params_or_groups, **settings)


def _tensor_bytes(tensor: torch.Tensor, seen: set[int]) -> int:
    """Bytes of ``tensor``, counting each tensor object once; tensor subclasses (torchao's 8-bit
    states report float32 but hold uint8 codes) are measured by the tensors they are made of."""
    if id(tensor) in seen:
        return 0
    seen.add(id(tensor))
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(tensor, name), seen) for name in names)
    return tensor.numel() * tensor.element_size()


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (moments, quantization maps and scales, steps).

    A tensor shared between parameters (bitsandbytes' quantization map) is counted once.
    """
    seen: set[int] = set()
    return sum(
        _tensor_bytes(value, seen)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


def apply_memory_options(model: AcousticModel, options: MemoryOptions) -> None:
    """Set ``options`` on ``model`` in place: checkpointing on every :class:`TransformerStack`.

    ``reversible`` cannot be switched on here: reversible blocks compute a different function, so
    it only asserts that ``model`` was built (and trained) with ``AcousticConfig.reversible``.
    ``optimizer`` and ``precision`` are for :func:`build_optimizer` and :func:`autocast`.
    """
    reversible_model = model.config.reversible
    if options.reversible and not reversible_model:
        raise ValueError(
            "reversible=True needs a base built with AcousticConfig(reversible=True): "
            "a base trained with plain blocks cannot run as a reversible stack (a "
            "different function); use checkpointing=True to save activation memory"
        )
    if options.checkpointing and reversible_model:
        raise ValueError(
            "checkpointing adds nothing to this base: its blocks are reversible and store no block activations already"
        )
    for module in model.modules():
        if isinstance(module, TransformerStack):
            module.gradient_checkpointing = options.checkpointing


def store_frozen_base(model: nn.Module, frozen_dtype: str) -> None:
    """Store what does not train in ``model`` as ``MemoryOptions.frozen_dtype`` says, in place (on
    adaptation's copy of the base, once its adapters are added): ``"bf16"``, frozen convolutions that
    save no input (:class:`~chorus.training.frozen_layers.FrozenConv1d`) and every other frozen parameter
    in bfloat16; ``"int8"``, frozen linear and convolution weights in 8 bits
    (:mod:`chorus.training.frozen_layers`) and the rest in bfloat16; ``"fp32"``, nothing."""
    lighten_frozen_layers(model, frozen_dtype)
    if frozen_dtype != "fp32":
        cast_frozen_parameters(model, torch.bfloat16)


def cast_frozen_parameters(model: nn.Module, dtype: torch.dtype) -> int:
    """Store every parameter of the base that does not train in ``dtype``; returns how many were cast.

    Layer norms keep float32 weights (a few numbers per layer): adapters that add float32 tensors to
    the residual stream (BitFit, conditional layer norm) make it float32, and the CPU layer norm
    refuses a float32 input with bfloat16 weights. Adapter tensors stay as they are, trained or not (a
    speaker vector that keeps its starting speaker's row is part of the voice, saved as it started).
    Buffers (normalization statistics) stay as they are.
    """
    keep = {id(p) for module in model.modules() if isinstance(module, nn.LayerNorm) for p in module.parameters()}
    keep |= {id(p) for p in adapter_tensors(model)}
    count = 0
    for parameter in model.parameters():
        if not parameter.requires_grad and parameter.dtype != dtype and id(parameter) not in keep:
            parameter.data = parameter.data.to(dtype)
            count += 1
    return count
