"""Frozen layers that cost less memory in training, for adapters on a frozen base.

Two costs of a frozen base that plain PyTorch layers pay for nothing:

* **A frozen convolution saves its input.** ``convolution_backward`` is one autograd node for the
  input, weight and bias, and it keeps the input whatever needs a gradient, though only the weight's
  gradient reads it. Behind a trained adapter each feed-forward keeps its two inputs (2.8 MB a decoder
  block at batch 8 x 300 in bf16) that backward never uses. :class:`FrozenConv1d` computes only the
  input's gradient, from the weight: it saves no tensor. (A frozen ``nn.Linear`` saves only its weight
  already: addmm keeps its input only for the weight's gradient.)
* **The weights themselves.** :class:`Int8Linear` and :class:`Int8Conv1d` store each weight in 8
  bits, one float32 scale per output channel (symmetric absmax: ``w ~ q * scale``, error at most half
  a step, ``absmax / 254`` of the channel), a quarter of float32 and half of bfloat16, as QLoRA trains
  adapters on a 4-bit base. The weight is dequantized (in float32, then cast to the compute dtype) for
  the forward and again for the backward, so no dequantized copy is saved.

Each computes its layer's function with the weight it holds (:meth:`compute_weight`): outputs and input
gradients are those of ``nn.Conv1d`` / ``nn.Linear`` on that weight (the same kernels; tested equal).
Under autocast the weight is used in the autocast dtype, as autocast would cast it. They train nothing:
:func:`lighten_frozen_layers` swaps them in for layers whose parameters are all frozen (adapters wrap
the originals, reaching them as ``base_layer``; the swap replaces that child too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chorus.recipe import FROZEN_DTYPES


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul or convolution of ``x`` runs in here: autocast's where it is on, else x's."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _FrozenWeightOp(torch.autograd.Function):
    """``layer``'s op on x with its weight read, not saved: backward reads the weight again and
    returns x's gradient only (the layer's tensors are frozen)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: FrozenLayer) -> torch.Tensor:
        dtype = _compute_dtype(x)
        ctx.layer, ctx.input_shape, ctx.dtype = layer, x.shape, dtype
        return layer.op(x.to(dtype), layer.compute_weight(dtype), layer.compute_bias(dtype))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        layer = ctx.layer
        return layer.input_gradient(grad.to(ctx.dtype), layer.compute_weight(ctx.dtype), ctx.input_shape), None


class FrozenLayer(nn.Module):
    """What the frozen layers share: the op through :class:`_FrozenWeightOp` while x needs a gradient
    (otherwise the plain op, which autograd does not record)."""

    @property
    def weight_shape(self) -> torch.Size:
        raise NotImplementedError

    def compute_weight(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def compute_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.to(dtype)

    def op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def input_gradient(self, grad: torch.Tensor, weight: torch.Tensor, input_shape: torch.Size) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _FrozenWeightOp.apply(x, self)
        dtype = _compute_dtype(x)
        return self.op(x.to(dtype), self.compute_weight(dtype), self.compute_bias(dtype))


class _Conv1dOp:
    """``F.conv1d`` with the layer's stride, padding and dilation, and its input gradient."""

    def op(self, x, weight, bias):
        return F.conv1d(x, weight, bias, self.stride, self.padding, self.dilation)

    def input_gradient(self, grad, weight, input_shape):
        # The kernel autograd's convolution node runs for the input alone.
        return torch.nn.grad.conv1d_input(input_shape, weight, grad, self.stride, self.padding, self.dilation)


class _LinearOp:
    """``F.linear`` and its input gradient."""

    def op(self, x, weight, bias):
        return F.linear(x, weight, bias)

    def input_gradient(self, grad, weight, input_shape):
        return grad @ weight


def _int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ``[out, ...]`` -> (int8 values of its shape, float32 scale ``[out]``), symmetric absmax per
    output channel; a channel of zeros gets scale 1."""
    absmax = weight.detach().float().abs().flatten(1).amax(dim=1)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    shape = (-1,) + (1,) * (weight.dim() - 1)
    values = torch.round(weight.detach().float() / scale.view(shape)).clamp_(-127, 127).to(torch.int8)
    return values, scale


def _conv_geometry(layer: FrozenLayer, conv: nn.Conv1d) -> None:
    """Give ``layer`` the stride, padding and dilation of ``conv`` (one that the frozen ops can run)."""
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError("only ungrouped, zero-padded Conv1d layers with numeric padding")
    layer.stride, layer.padding, layer.dilation = conv.stride, conv.padding, conv.dilation


class _Int8Weight(FrozenLayer):
    """A frozen layer whose weight is stored in 8 bits: ``weight_int8`` of the weight's shape, ``weight_scale``
    ``[out]``; its bias as it was."""

    def _store(self, layer: nn.Conv1d | nn.Linear) -> None:
        values, scale = _int8(layer.weight)
        self.register_buffer("weight_int8", values)
        self.register_buffer("weight_scale", scale)
        self.bias = layer.bias

    @property
    def weight_shape(self):
        return self.weight_int8.shape

    def compute_weight(self, dtype):
        scale = self.weight_scale.view(-1, *[1] * (self.weight_int8.dim() - 1))
        return (self.weight_int8.float() * scale).to(dtype)


class FrozenConv1d(_Conv1dOp, FrozenLayer):
    """A frozen ``nn.Conv1d`` that saves no input for backward (its weight and bias as they were)."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        _conv_geometry(self, conv)
        self.weight, self.bias = conv.weight, conv.bias

    @property
    def weight_shape(self):
        return self.weight.shape

    def compute_weight(self, dtype):
        return self.weight.to(dtype)


class Int8Conv1d(_Conv1dOp, _Int8Weight):
    """A frozen ``nn.Conv1d`` whose weight is stored in 8 bits; saves no input for backward."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        _conv_geometry(self, conv)
        self._store(conv)


class Int8Linear(_LinearOp, _Int8Weight):
    """A frozen ``nn.Linear`` whose weight is stored in 8 bits; saves nothing for backward."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self._store(linear)


def lighten_frozen_layers(model: nn.Module, frozen_dtype: str) -> int:
    """Swap the layers of ``model`` whose parameters are all frozen for lighter ones, in place: every such
    ``nn.Conv1d`` for :class:`FrozenConv1d` (``frozen_dtype`` ``"bf16"``) or :class:`Int8Conv1d`
    (``"int8"``), and with ``"int8"`` every such ``nn.Linear`` for :class:`Int8Linear`; ``"fp32"``
    changes nothing. Returns how many were swapped. Only for a model that trains adapters and is then
    thrown away (adaptation's copy): the int8 layers keep no full-precision weight."""
    if frozen_dtype not in FROZEN_DTYPES:
        raise ValueError(f"frozen_dtype must be one of {', '.join(FROZEN_DTYPES)}, got {frozen_dtype!r}")
    if frozen_dtype == "fp32":
        return 0
    swaps = {nn.Conv1d: FrozenConv1d if frozen_dtype == "bf16" else Int8Conv1d}
    if frozen_dtype == "int8":
        swaps[nn.Linear] = Int8Linear
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            lighter = swaps.get(type(child))
            if lighter is not None and not any(p.requires_grad for p in child.parameters()):
                setattr(parent, name, lighter(child))
                count += 1
    return count
