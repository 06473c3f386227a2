"""Reversible (RevNet) coupling of a sequence of blocks that stores no block activations.

A reversible block is a module with two branch methods ``f(x, *context)`` and ``g(x, *context)``,
each mapping a tensor to one of the same shape. Per block: ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)``.
Forward keeps only the last block's two outputs; backward walks the blocks in reverse, recovers each
block's inputs from its outputs (``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)``) and back-propagates through
F and G rebuilt on them (Gomez et al. 2017). Activation memory is then O(1) in depth, for about one
extra forward of every block per step. Inputs are recovered by subtraction, so in float32 gradients
match plain autograd to rounding (exactly, to float64 rounding, in float64).

Used by the acoustic model's transformer stacks (both streams start as the same input) and by the
speaker encoder's reversible residual stages (the channels split in two).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from torch import nn
from torch.autograd.function import once_differentiable


def couple(
    blocks: Sequence[nn.Module], x1: torch.Tensor, x2: torch.Tensor, context: tuple = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coupling computed plainly (what :func:`reversible` computes, with autograd's usual memory)."""
    for block in blocks:
        x1 = x1 + block.f(x2, *context)
        x2 = x2 + block.g(x1, *context)
    return x1, x2


def reversible(
    blocks: Sequence[nn.Module], x1: torch.Tensor, x2: torch.Tensor, context: tuple = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coupling of ``blocks`` on (x1, x2); with grad enabled, through :class:`_Reversible` (no block
    activations kept). ``context``: tensors every branch also takes (a mask), never differentiated.

    Every parameter of the blocks gets its gradient (frozen ones none); anything else F or G
    differentiate (a tensor reached other than as a parameter of the block) would silently get none.
    """
    if not torch.is_grad_enabled() or not blocks:
        return couple(blocks, x1, x2, context)
    params = (p for block in blocks for p in block.parameters())
    return _Reversible.apply(x1, x2, tuple(blocks), context, *params)


def reversible_halves(blocks: Sequence[nn.Module], x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The coupling of ``blocks`` on the two halves of ``x`` along ``dim``, returned joined again
    (``cat([y1, y2], dim)``, the shape of ``x``). What backward needs is that one joined output, so a
    layer after it that saves its input (a convolution) shares the storage instead of keeping a copy."""
    if not torch.is_grad_enabled() or not blocks:
        return torch.cat(couple(blocks, *x.chunk(2, dim=dim)), dim=dim)
    params = (p for block in blocks for p in block.parameters())
    return _ReversibleJoined.apply(x, dim, tuple(blocks), *params)


def _autocast_state(device_type: str) -> tuple | None:
    """The autocast settings in force for ``device_type`` (None where autocast does not exist, e.g. meta)."""
    if not torch.amp.is_autocast_available(device_type):
        return None
    return device_type, torch.get_autocast_dtype(device_type), torch.is_autocast_enabled(device_type)


class _Reversible(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, blocks, context, *params):
        y1, y2 = couple(blocks, x1, x2, context)
        ctx.blocks = blocks
        # Backward must rebuild F and G in the precision forward used, or the recovered inputs
        # drift from the true ones; the engine does not carry the caller's autocast state over.
        ctx.autocast = _autocast_state(x1.device.type)
        ctx.save_for_backward(y1, y2, *context)  # saved (not kept on ctx): counted like any saved tensor
        return y1, y2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad1, grad2):
        y1, y2, *context = ctx.saved_tensors
        grad1, grad2, param_grads = _blocks_backward(
            ctx.blocks, y1, y2, grad1, grad2, context, ctx.needs_input_grad[4:], ctx.autocast
        )
        return (
            grad1 if ctx.needs_input_grad[0] else None,
            grad2 if ctx.needs_input_grad[1] else None,
            None,
            None,
            *param_grads,
        )


class _ReversibleJoined(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, blocks, *params):
        y = torch.cat(couple(blocks, *x.chunk(2, dim=dim)), dim=dim)
        ctx.blocks, ctx.dim = blocks, dim
        ctx.autocast = _autocast_state(x.device.type)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        y1, y2 = y.chunk(2, dim=ctx.dim)
        grad1, grad2 = grad.chunk(2, dim=ctx.dim)
        grad1, grad2, param_grads = _blocks_backward(
            ctx.blocks, y1, y2, grad1, grad2, (), ctx.needs_input_grad[3:], ctx.autocast
        )
        grad_x = torch.cat([grad1, grad2], dim=ctx.dim) if ctx.needs_input_grad[0] else None
        return (grad_x, None, None, *param_grads)


def _blocks_backward(blocks, y1, y2, grad1, grad2, context, needs_param_grad, autocast):
    """Backward through the coupling of ``blocks`` from its outputs (y1, y2) and their gradients:
    walks the blocks in reverse, recovering each block's inputs by subtraction. Returns the gradients
    of the coupling's inputs (x1, x2) and of every block parameter in order (None where not needed)."""
    param_grads: list[torch.Tensor | None] = [None] * len(needs_param_grad)
    end = len(needs_param_grad)
    for block in reversed(blocks):
        block_params = list(block.parameters())
        start = end - len(block_params)
        wanted = [i for i in range(start, end) if needs_param_grad[i]]
        tensors = [block_params[i - start] for i in wanted]
        g, grad_y1, g_grads = _branch_backward(block.g, y1, context, grad2, tensors, autocast)
        x2 = y2 - g
        grad1 = grad1 + grad_y1  # y1 reached the loss directly and through y2 = x2 + G(y1)
        f, grad_x2, f_grads = _branch_backward(block.f, x2, context, grad1, tensors, autocast)
        x1 = y1 - f
        grad2 = grad2 + grad_x2  # x2 reached y2 directly and y1 through F
        for i, *grads in zip(wanted, g_grads, f_grads):
            for grad in grads:
                if grad is not None:
                    param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
        y1, y2, end = x1, x2, start
    return grad1, grad2, param_grads


def _branch_backward(branch, inputs, context, grad_out, tensors, autocast):
    """Rebuild ``out = branch(inputs, *context)`` and back-propagate ``grad_out`` through it.

    Returns (out detached, grad w.r.t. inputs, grads w.r.t. ``tensors`` (None where unused)).
    """
    precision = (
        nullcontext() if autocast is None else torch.autocast(autocast[0], dtype=autocast[1], enabled=autocast[2])
    )
    with torch.enable_grad(), precision:
        inputs = inputs.detach().requires_grad_(True)
        out = branch(inputs, *context)
    grad_in, *grads = torch.autograd.grad(out, (inputs, *tensors), grad_out, allow_unused=True)
    return out.detach(), grad_in, grads
