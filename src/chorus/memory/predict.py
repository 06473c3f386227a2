"""Analytic memory of one training step, per category, for any size (the model may be on ``meta``).

Four categories, in bytes:

* **weights**: every parameter and buffer, as stored.
* **gradients**: one tensor per trainable parameter (``requires_grad``) that the forward reads, in
  the parameter's dtype (a parameter the step never reads, like the speaker table behind an active
  speaker vector, gets no gradient).
* **optimizer states**: what the optimizer keeps per parameter with a gradient after its first step.
* **activations**: every tensor autograd keeps for backward at the end of the forward pass (model
  and losses), counted once per storage, parameters and buffers excluded. Under bf16 autocast this
  includes the bf16 copies of float32 weights that autocast makes and the matmuls save.

A bf16 frozen base (``frozen_dtype="bf16"``: every parameter that does not train stored in bfloat16)
halves those weights and changes the activations: its matmuls read the weights as they are (no
copies), its frozen convolutions save nothing (:class:`~chorus.training.frozen_layers.FrozenConv1d`),
and the residual stream itself turns bfloat16 (bf16 embeddings, positions cast to them, bf16 layer
norms with bf16 statistics), and with it the alignment path and the targets computed from it. An int8
frozen base (``"int8"``) stores the frozen linear and convolution weights in 8 bits (those layers save
nothing either) and the rest as the bf16 base does. The shadow tensors carry dtypes, so the rules
follow whatever dtypes the model has.

The activation count is a shadow forward pass: it follows :class:`AcousticModel.forward` and
``compute_losses`` op by op with shapes, dtypes and a requires-grad flag instead of data, and asks of
each op what autograd saves for it, given which of its inputs require grad. Modules are applied
through rules registered per module type (:func:`register_activation_rule`): the layers and the
attention and feed-forward of the acoustic model, while every adapter wrapper of
:mod:`chorus.adapters` declares its own (:meth:`~chorus.adapters.AdapterLayer.shadow_forward`),
applied by one generic rule. The rules are those of torch 2.13 on CPU, found by reading the saved
tensors of every node of a real step (see ``tests/memory/test_memory.py`` and ``tests/memory/test_memory_adapters.py``,
which check prediction against measurement). A training step is assumed: dropout with ``p > 0`` is active.

With gradient checkpointing (``TransformerStack.gradient_checkpointing``), each FFT block of the
encoder and decoder is recomputed during backward (non-reentrant ``torch.utils.checkpoint``): the
forward keeps only each block's inputs, and ``recompute`` holds what the largest block saves again
while its own backward runs (live for one block at a time, on top of ``activations``). Reversible
stacks (``AcousticConfig.reversible``) keep the two coupling outputs per stack; their ``recompute``
is the largest branch (attention or feed-forward of one block) rebuilt in backward. ``recompute``
is part of the total; :mod:`chorus.memory.measure` measures it by rerunning each rebuilt block or
branch under its hooks.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import nn

from chorus.adapters.layer import AdapterLayer
from chorus.models.acoustic import (
    AcousticModel,
    ConvFeedForward,
    FFTBlock,
    MultiHeadAttention,
    TransformerStack,
    VarianceEmbedding,
    VariancePredictor,
)
from chorus.recipe import OPTIMIZERS, MemoryOptions
from chorus.training.efficiency import BNB_MIN_8BIT_SIZE, store_frozen_base
from chorus.training.frozen_layers import FrozenConv1d, FrozenLayer, Int8Conv1d


@dataclass
class MemoryBreakdown:
    """Bytes per category of one training step (see the module docstring for what each counts)."""

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    recompute: int = 0  # checkpointing only: one block's activations, rebuilt during its backward

    @property
    def total(self) -> int:
        """Sum of the categories: an upper bound on the step's peak (activations are freed while
        gradients are produced, so the true peak is lower)."""
        return sum(getattr(self, f.name) for f in fields(self))

    def categories(self) -> dict[str, int]:
        """``{"weights": ..., "gradients": ..., "optimizer_states": ..., "activations": ...}``, plus
        ``recompute`` when checkpointing adds any."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.recompute:
            del values["recompute"]
        return values


# -- shadow tensors ------------------------------------------------------------------------------


class _Storage:
    """One allocation; tensors that are views of each other share it (identity is what counts)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


@dataclass
class ShadowTensor:
    """Shape, dtype and requires-grad of a tensor of the step, and the storage it lives in."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    storage: _Storage

    def view(self, *shape: int) -> ShadowTensor:
        """A view (reshape, transpose, unsqueeze, expand ...): same storage, new shape."""
        return ShadowTensor(tuple(shape), self.dtype, self.requires_grad, self.storage)

    def detach(self) -> ShadowTensor:
        return ShadowTensor(self.shape, self.dtype, False, self.storage)


def _trains(*parameters: torch.Tensor | None) -> bool:
    return any(p is not None and p.requires_grad for p in parameters)


class ShadowPass:
    """Walks a forward pass on shadow tensors and records the storages autograd would save.

    ``autocast`` is the lower-precision dtype of ``torch.autocast`` (bf16) or None for fp32.
    ``used`` collects the parameters the forward reads (shared with the passes of checkpointed or
    reversible blocks, whose parameters are read too): only those get gradients.
    """

    def __init__(
        self,
        autocast: torch.dtype | None = None,
        checkpointing: bool = False,
        used: dict[int, torch.Tensor] | None = None,
    ):
        self.autocast = autocast
        self.checkpointing = checkpointing
        self._saved: dict[int, _Storage] = {}
        self.recompute = 0
        self.used: dict[int, torch.Tensor] = {} if used is None else used

    def inner(self) -> ShadowPass:
        """A pass of its own for a block rebuilt in backward (same precision, same parameter record)."""
        return ShadowPass(self.autocast, used=self.used)

    @property
    def saved_bytes(self) -> int:
        return sum(storage.nbytes for storage in self._saved.values())

    def save(self, *tensors: ShadowTensor) -> None:
        for tensor in tensors:
            self._saved[id(tensor.storage)] = tensor.storage

    def new(self, shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool = False) -> ShadowTensor:
        """A freshly allocated tensor."""
        return ShadowTensor(tuple(shape), dtype, requires_grad, _Storage(math.prod(shape) * dtype.itemsize))

    def parameter(self, parameter: torch.Tensor) -> ShadowTensor:
        """A parameter an op reads directly (not through a layer's rule). Its storage is a weight, not
        an activation, so saving it (or a view of it) adds nothing."""
        self._read(parameter)
        return ShadowTensor(tuple(parameter.shape), parameter.dtype, parameter.requires_grad, _Storage(0))

    def _read(self, *parameters: torch.Tensor | None) -> None:
        """Record parameters the forward reads (only those get gradients); None: no bias."""
        self.used.update((id(p), p) for p in parameters if p is not None)

    # -- op rules ----------------------------------------------------------------------------
    def cast(self, x: ShadowTensor) -> ShadowTensor:
        """The input an autocast op computes with: a new lower-precision copy of float32 tensors."""
        if self.autocast is None or x.dtype != torch.float32:
            return x
        return self.new(x.shape, self.autocast, x.requires_grad)

    def save_weight(self, weight: torch.Tensor) -> None:
        """A matmul/conv saves its weight: the parameter itself where no cast is needed (fp32, or a
        frozen base already stored in the autocast dtype: not an activation), a fresh low-precision
        copy of a float32 weight under autocast (an activation)."""
        if self.autocast is not None and weight.dtype == torch.float32:
            self.save(self.new(tuple(weight.shape), self.autocast))

    @staticmethod
    def _result_dtype(a: ShadowTensor, b: ShadowTensor) -> torch.dtype:
        # Type promotion as it occurs here: float32 with bfloat16 gives float32.
        return torch.float32 if torch.float32 in (a.dtype, b.dtype) else a.dtype

    def elementwise(self, a: ShadowTensor, b: ShadowTensor) -> ShadowTensor:
        """add/sub: nothing saved; the result broadcasts to ``a``'s shape."""
        return self.new(a.shape, self._result_dtype(a, b), a.requires_grad or b.requires_grad)

    def mul(self, a: ShadowTensor, b: ShadowTensor) -> ShadowTensor:
        """Each factor is saved for the other's gradient; the result has ``a``'s shape. (A Python
        number as a factor is no tensor to autograd's hooks: nothing is saved.)"""
        if a.requires_grad:
            self.save(b)
        if b.requires_grad:
            self.save(a)
        return self.new(a.shape, self._result_dtype(a, b), a.requires_grad or b.requires_grad)

    def cat(self, a: ShadowTensor, b: ShadowTensor) -> ShadowTensor:
        """``torch.cat([a, b], dim=1)`` of ``[batch, n, dim]`` tensors: nothing saved, a new tensor
        in the promoted dtype."""
        return self.new(
            (a.shape[0], a.shape[1] + b.shape[1], *a.shape[2:]),
            self._result_dtype(a, b),
            a.requires_grad or b.requires_grad,
        )

    def relu(self, x: ShadowTensor) -> ShadowTensor:
        out = self.new(x.shape, x.dtype, x.requires_grad)
        if x.requires_grad:
            self.save(out)  # relu saves its result
        return out

    def dropout(self, x: ShadowTensor, p: float) -> ShadowTensor:
        """CPU dropout multiplies by a scaled float noise tensor of the input's shape (saved)."""
        if p == 0:
            return x
        return self.mul(x, self.new(x.shape, x.dtype))

    def matmul_transposed(self, x: ShadowTensor, weight: torch.Tensor) -> ShadowTensor:
        """``x @ weight.T`` with ``weight`` a parameter ``[out, in]`` read directly (not by a Linear):
        x ``[..., in]`` -> ``[..., out]``. x is saved for the weight's gradient and ``weight.T`` for
        x's; under autocast ``weight.T`` is a view, which autocast does not cache, so a fresh
        low-precision copy is what gets saved."""
        w = self.parameter(weight)
        x_in = self.cast(x)
        if w.requires_grad:
            self.save(x_in)
        if x.requires_grad:
            self.save(self.cast(w))
        return self.new((*x.shape[:-1], weight.shape[0]), x_in.dtype, x.requires_grad or w.requires_grad)

    def linear(self, x: ShadowTensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> ShadowTensor:
        """``F.linear(x, weight, bias)`` (an ``nn.Linear``'s forward, or adapter tensors applied as
        one): x ``[..., in]``, weight ``[out, in]``, bias ``[out]`` -> ``[..., out]``.

        addmm saves its input only for the weight's gradient, the weight only for the input's. (A
        transposed input, a Conv1d output seen time-major behind a residual adapter, goes through
        matmul, which saves a contiguous copy instead: as many bytes, and nothing else saves the view.)
        """
        self._read(weight, bias)
        x_in = self.cast(x)
        if weight.requires_grad:
            self.save(x_in)
        if x.requires_grad:
            self.save_weight(weight)
        requires_grad = x.requires_grad or _trains(weight, bias)
        return self.new((*x.shape[:-1], weight.shape[0]), x_in.dtype, requires_grad)

    def conv1d(
        self,
        x: ShadowTensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: tuple[int] = (1,),
        padding: tuple[int] = (0,),
        dilation: tuple[int] = (1,),
    ) -> ShadowTensor:
        """``F.conv1d`` (an ``nn.Conv1d``'s forward, or adapter tensors applied as one): x ``[batch,
        in, length]``, weight ``[out, in, kernel]`` -> ``[batch, out, length']``.

        convolution_backward saves input and weight whenever the node exists, whatever needs a gradient.
        """
        self._read(weight, bias)
        x_in = self.cast(x)
        requires_grad = x.requires_grad or _trains(weight, bias)
        if requires_grad:
            self.save(x_in)
            self.save_weight(weight)
        (padding,), (stride,), (dilation,), kernel = padding, stride, dilation, weight.shape[-1]
        length = (x.shape[-1] + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        return self.new((x.shape[0], weight.shape[0], length), x_in.dtype, requires_grad)

    def layer_norm(
        self,
        x: ShadowTensor,
        normalized_dims: int,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> ShadowTensor:
        """``F.layer_norm`` over the last ``normalized_dims`` axes, with or without affine parameters.

        Runs in its input's dtype (autocast leaves it alone on CPU); saves the input and a mean and
        reciprocal std per row whenever the node exists: float32 beside a float32 weight, else in
        the input's dtype (a bf16 input without a weight, or with a bf16 frozen base's, gets bf16
        statistics).

        Raises ValueError for a float32 input with lower-precision affine parameters, which CPU
        layer norm refuses ("mixed dtype (CPU): expect parameter to have scalar type of Float"): a
        bf16 frozen base behind an adapter that adds float32 tensors to the residual stream.
        """
        if weight is not None and x.dtype == torch.float32 and weight.dtype != torch.float32:
            raise ValueError(
                f"a layer norm with {weight.dtype} parameters gets a float32 input, which "
                "torch refuses on CPU: this step would fail (a bf16 frozen base with an "
                "adapter whose float32 output reaches a frozen layer norm, as cln, bitfit and "
                "a trained speaker projection do; such a base needs its layer norms kept in "
                "float32)"
            )
        requires_grad = x.requires_grad or _trains(weight, bias)
        if requires_grad:
            rows = x.shape[:-normalized_dims]
            stats = torch.float32 if weight is not None and weight.dtype == torch.float32 else x.dtype
            self.save(x, self.new((*rows, 1), stats), self.new((*rows, 1), stats))
        return self.new(x.shape, x.dtype, requires_grad)

    def attention(self, q: ShadowTensor, k: ShadowTensor, v: ShadowTensor, heads: int, dropout: float) -> ShadowTensor:
        """``F.scaled_dot_product_attention`` with a bool key mask on heads split from q
        ``[batch, time, dim]`` and k, v ``[batch, keys, dim]``; returns the heads merged back,
        ``[batch, time, dim]`` (the output projection's input)."""
        batch, length, dim = q.shape
        keys = k.shape[1]
        # Autocast runs attention in the lower precision: float32 inputs (keys with a float32
        # prefix) get a cast copy, which is what the kernel keeps.
        q, k, v = self.cast(q), self.cast(k), self.cast(v)
        requires_grad = q.requires_grad or k.requires_grad or v.requires_grad
        dtype = q.dtype
        if dropout == 0:
            # A bool mask and no dropout select the CPU flash kernel: it saves q, k, v, its output
            # (laid out [batch, time, heads, dim], so out_proj's input is a view of it), a float32
            # logsumexp per row and the mask converted to the query's dtype.
            out = self.new((batch, length, dim), dtype, requires_grad)
            if requires_grad:
                self.save(
                    q, k, v, out, self.new((batch, heads, length), torch.float32), self.new((batch, 1, 1, keys), dtype)
                )
            return out
        # Dropout selects the math path, which on CPU computes in float32 whatever the inputs. Its
        # two matmuls each save one factor per other factor that needs a gradient: a scaled copy of
        # q (for k's) and of k (for q's); the dropped weights (for v's) and a copy of v (for the
        # weights'). The softmax result and the dropout noise are saved whenever the scores need a
        # gradient. (q, k and v all need one or none, except beside a learned prefix.)
        scores_grad = q.requires_grad or k.requires_grad
        per_head, scores = dim // heads, (batch, heads, length, keys)
        for needed, shape in (
            (k.requires_grad, (batch * heads, length, per_head)),
            (q.requires_grad, (batch * heads, keys, per_head)),
            (scores_grad, scores),
            (scores_grad, scores),
            (v.requires_grad, scores),
            (scores_grad, (batch * heads, keys, per_head)),
        ):
            if needed:
                self.save(self.new(shape, torch.float32))
        # Heads back to [batch, time, dim]: a copy, which out_proj saves.
        return self.new((batch, length, dim), dtype, requires_grad)

    def bmm(self, a: ShadowTensor, b: ShadowTensor) -> ShadowTensor:
        """``[n, i, k] @ [n, k, j]``: each (cast) factor is saved for the other's gradient."""
        a_in, b_in = self.cast(a), self.cast(b)
        if a.requires_grad:
            self.save(b_in)
        if b.requires_grad:
            self.save(a_in)
        return self.new((a.shape[0], a.shape[1], b.shape[2]), a_in.dtype, a.requires_grad or b.requires_grad)

    def leaf(self, module: nn.Module, x: ShadowTensor) -> ShadowTensor:
        """Apply ``module`` to ``x`` through the rule registered for its type (a layer, the model's
        attention or feed-forward, an adapter wrapper ...); the module's own parameters are read."""
        for cls in type(module).__mro__:
            if cls in _LEAF_RULES:
                self.used.update((id(p), p) for p in module.parameters(recurse=False))
                return _LEAF_RULES[cls](self, module, x)
        supported = ", ".join(sorted(cls.__name__ for cls in _LEAF_RULES))
        raise TypeError(
            f"no activation rule for {type(module).__name__} (supported: {supported}); "
            "add one with chorus.memory.register_activation_rule"
        )


LeafRule = Callable[[ShadowPass, nn.Module, ShadowTensor], ShadowTensor]
_LEAF_RULES: dict[type, LeafRule] = {}


def register_activation_rule(module_type: type) -> Callable[[LeafRule], LeafRule]:
    """Teach the prediction what a module type saves for backward (a layer of a new model; adapter
    wrappers need none: each declares its rule as :meth:`AdapterLayer.shadow_forward`).

    The rule gets the pass, the module and its input, calls ``pass_.save`` for what autograd keeps
    and returns the output; subclasses of ``module_type`` use it unless they have their own.
    """

    def register(rule: LeafRule) -> LeafRule:
        _LEAF_RULES[module_type] = rule
        return rule

    return register


@register_activation_rule(nn.Linear)
def _linear(pass_: ShadowPass, module: nn.Linear, x: ShadowTensor) -> ShadowTensor:
    return pass_.linear(x, module.weight, module.bias)


@register_activation_rule(nn.Conv1d)
def _conv1d(pass_: ShadowPass, module: nn.Conv1d, x: ShadowTensor) -> ShadowTensor:
    return pass_.conv1d(x, module.weight, module.bias, module.stride, module.padding, module.dilation)


@register_activation_rule(FrozenLayer)
def _frozen_layer(pass_: ShadowPass, module: FrozenLayer, x: ShadowTensor) -> ShadowTensor:
    """A frozen layer of :mod:`chorus.training.frozen_layers`: it saves nothing (its backward reads its weight
    again); the output is in the compute dtype (autocast's, else x's)."""
    out = module.weight_shape[0]
    if isinstance(module, (FrozenConv1d, Int8Conv1d)):
        (padding,), (stride,), (dilation,), kernel = (
            module.padding,
            module.stride,
            module.dilation,
            module.weight_shape[-1],
        )
        shape = (x.shape[0], out, (x.shape[-1] + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1)
    else:
        shape = (*x.shape[:-1], out)
    return pass_.new(shape, pass_.autocast or x.dtype, x.requires_grad)


@register_activation_rule(nn.LayerNorm)
def _layer_norm(pass_: ShadowPass, module: nn.LayerNorm, x: ShadowTensor) -> ShadowTensor:
    return pass_.layer_norm(x, len(module.normalized_shape), module.weight, module.bias)


@register_activation_rule(nn.Embedding)
def _embedding(pass_: ShadowPass, module: nn.Embedding, ids: ShadowTensor) -> ShadowTensor:
    if module.weight.requires_grad:
        pass_.save(ids)  # the indices, to scatter the gradient into the table
    return pass_.new((*ids.shape, module.embedding_dim), module.weight.dtype, module.weight.requires_grad)


@register_activation_rule(AdapterLayer)
def _adapter(pass_: ShadowPass, layer: AdapterLayer, x: ShadowTensor) -> ShadowTensor:
    """Any adapter wrapper: its own rule (:meth:`AdapterLayer.shadow_forward`) with its active adapter;
    where it runs its base layer alone (no adapter of its own active, or the active one merged into
    the base weights) the base layer's rule."""
    if layer.routing is not None:
        raise ValueError(
            "per-sample adapter routing is not predicted: set one active adapter "
            "(chorus.adapters.set_active) for the step"
        )
    name = layer.active
    if layer.merged is not None or name is None or name not in layer.configs:
        return pass_.leaf(layer.base_layer, x)
    return layer.shadow_forward(pass_, name, x)


# -- the acoustic model, op by op (mirrors chorus.models.acoustic) --------------------------------


@register_activation_rule(MultiHeadAttention)
def _attention(pass_: ShadowPass, attn: MultiHeadAttention, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, time, dim]`` -> ``[batch, time, dim]`` (the key mask is implied by x's shape)."""
    q, k, v = (pass_.leaf(proj, x) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    return pass_.leaf(attn.out_proj, pass_.attention(q, k, v, attn.n_heads, attn.dropout))


@register_activation_rule(ConvFeedForward)
def _feed_forward(pass_: ShadowPass, ff: ConvFeedForward, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, time, dim]`` -> ``[batch, time, dim]`` (a transposed view of the last conv's output)."""
    batch, length, dim = x.shape
    keep = pass_.new((batch, 1, length), x.dtype)
    hidden = pass_.relu(pass_.leaf(ff.conv1, pass_.mul(x.view(batch, dim, length), keep)))
    hidden = pass_.mul(pass_.dropout(hidden, ff.dropout.p), keep)
    return pass_.leaf(ff.conv2, hidden).view(batch, length, dim)


def _block(pass_: ShadowPass, block: FFTBlock, x: ShadowTensor) -> ShadowTensor:
    batch, length, _ = x.shape
    x = pass_.elementwise(x, pass_.dropout(pass_.leaf(block.attn, pass_.leaf(block.norm1, x)), block.dropout.p))
    x = pass_.elementwise(x, pass_.dropout(pass_.leaf(block.ff, pass_.leaf(block.norm2, x)), block.dropout.p))
    return pass_.mul(x, pass_.new((batch, length, 1), x.dtype))


def _checkpointed_block(pass_: ShadowPass, block: FFTBlock, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    # The forward keeps the block's inputs (hidden states and bool mask) and nothing inside it.
    pass_.save(x, mask)
    inner = pass_.inner()
    inner.save(x, mask)  # unpacked again for the recompute: already counted
    out = _block(inner, block, x)
    pass_.recompute = max(pass_.recompute, inner.saved_bytes - x.storage.nbytes - mask.storage.nbytes)
    return out


def _rebuilt_branch(pass_: ShadowPass, norm: nn.Module, layer: nn.Module, x: ShadowTensor) -> ShadowTensor:
    """One branch of the coupling, ``layer(norm(x))`` zeroed at padding, as backward rebuilds it from
    ``x`` ``[batch, time, dim]``: raises ``pass_.recompute`` to what it saves; returns its output
    (the forward keeps none of it, but its dtype carries into the coupling's sums)."""
    batch, length, _ = x.shape
    inner = pass_.inner()
    inputs = inner.new(x.shape, x.dtype, True)
    out = inner.mul(inner.leaf(layer, inner.leaf(norm, inputs)), inner.new((batch, length, 1), x.dtype))
    pass_.recompute = max(pass_.recompute, inner.saved_bytes - inputs.storage.nbytes)
    return out


def _reversible_blocks(pass_: ShadowPass, stack: TransformerStack, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    # The coupling saves its two outputs and the bool mask; backward rebuilds one branch (attention
    # or feed-forward of one block) at a time from them: ``recompute`` is the largest branch. The
    # outputs follow the stream's dtype (bfloat16 behind a bf16 frozen base, until a float32 branch
    # output promotes it), so the branches are walked in order for it.
    requires_grad = x.requires_grad or any(p.requires_grad for p in stack.layers.parameters())
    x1 = x2 = x
    for block in stack.layers:
        x1 = pass_.elementwise(x1, _rebuilt_branch(pass_, block.norm1, block.attn, x2))
        x2 = pass_.elementwise(x2, _rebuilt_branch(pass_, block.norm2, block.ff, x1))
    y1, y2 = (pass_.new(x.shape, y.dtype, requires_grad) for y in (x1, x2))
    if requires_grad:
        pass_.save(y1, y2, mask)
    return pass_.elementwise(y1, y2)  # (y1 + y2) / 2: dividing by a Python number saves no tensor


def _stack(pass_: ShadowPass, stack: TransformerStack, x: ShadowTensor, mask: ShadowTensor) -> ShadowTensor:
    batch, length, _ = x.shape
    x = pass_.elementwise(x, pass_.new((length, x.shape[-1]), x.dtype))  # + positions (made per call, not saved)
    if stack.reversible and len(stack.layers):
        x = _reversible_blocks(pass_, stack, x, mask)
    else:
        for block in stack.layers:
            x = _checkpointed_block(pass_, block, x, mask) if pass_.checkpointing else _block(pass_, block, x)
    return pass_.mul(pass_.leaf(stack.norm, x), pass_.new((batch, length, 1), x.dtype))


def _variance_predictor(pass_: ShadowPass, predictor: VariancePredictor, x: ShadowTensor) -> ShadowTensor:
    batch, length, _ = x.shape
    keep = pass_.new((batch, length, 1), x.dtype)
    h = x
    for conv, norm in ((predictor.conv1, predictor.norm1), (predictor.conv2, predictor.norm2)):
        h = pass_.mul(h, keep)
        h = pass_.relu(pass_.leaf(conv, h.view(batch, h.shape[-1], length)))
        h = pass_.leaf(norm, h.view(batch, length, h.shape[1]))
        h = pass_.dropout(h, predictor.dropout.p)
    out = pass_.leaf(predictor.proj, h)
    return pass_.mul(out.view(batch, length), pass_.new((batch, length), x.dtype))


def _variance_embedding(
    pass_: ShadowPass, variance: VarianceEmbedding, h: ShadowTensor, target: ShadowTensor
) -> tuple[ShadowTensor, ShadowTensor]:
    """Returns (h + embedded target, prediction); ``target`` ``[batch, text]`` is the token-averaged
    value (teacher forcing)."""
    batch, length, dim = h.shape
    prediction = _variance_predictor(pass_, variance.predictor, h)
    embedded = pass_.leaf(variance.embed, target.view(batch, 1, length))
    return pass_.elementwise(h, embedded.view(batch, length, dim)), prediction


def _masked_mean(pass_: ShadowPass, values: ShadowTensor, mask_shape: tuple[int, ...]) -> None:
    summed = pass_.mul(values, pass_.new(mask_shape, values.dtype))
    if summed.requires_grad:
        pass_.save(pass_.new((), values.dtype))  # the clamped denominator of the division


def _squared_error(pass_: ShadowPass, a: ShadowTensor, b: ShadowTensor) -> ShadowTensor:
    difference = pass_.elementwise(a, b)
    if difference.requires_grad:
        pass_.save(difference)  # pow saves its base
    return pass_.new(difference.shape, difference.dtype, difference.requires_grad)


def _acoustic_step(pass_: ShadowPass, model: AcousticModel, batch: int, text: int, frames: int) -> None:
    """``model(**inputs)`` then ``compute_losses`` of chorus.training.pretrain, on shadow tensors."""
    config = model.config
    phonemes = pass_.new((batch, text), torch.int64)
    text_mask, frame_mask = pass_.new((batch, text), torch.bool), pass_.new((batch, frames), torch.bool)
    target = pass_.new((batch, frames, config.n_mels), torch.float32)

    speaker = pass_.leaf(model.speaker_proj, pass_.leaf(model.speaker_embedding, pass_.new((batch,), torch.int64)))
    speaker = speaker.view(batch, 1, speaker.shape[-1])
    h = _stack(pass_, model.encoder, pass_.leaf(model.symbol_embedding, phonemes), text_mask)
    h = pass_.mul(pass_.elementwise(h, speaker), pass_.new((batch, text, 1), h.dtype))
    prior_token = pass_.leaf(model.prior_proj, h)
    # The alignment, searched without gradients, in h's dtype (bfloat16 behind a bf16 frozen base);
    # the targets made from it (log(1 + durations), token-averaged pitch and energy) share it.
    path = pass_.new((batch, text, frames), h.dtype)
    path_t = path.view(batch, frames, text)
    prior_mean = pass_.bmm(path_t, prior_token)
    log_duration = _variance_predictor(pass_, model.duration_predictor, h.detach())
    predictions = []
    for variance in (model.pitch, model.energy):
        if variance is not None:
            h, prediction = _variance_embedding(pass_, variance, h, pass_.new((batch, text), path.dtype))
            predictions.append(prediction)
    expanded = pass_.elementwise(pass_.bmm(path_t, h), speaker)
    out = _stack(pass_, model.decoder, pass_.mul(expanded, pass_.new((batch, frames, 1), h.dtype)), frame_mask)
    mel = pass_.mul(pass_.leaf(model.mel_proj, out), pass_.new((batch, frames, 1), h.dtype))

    difference = pass_.elementwise(mel, target)
    if difference.requires_grad:
        pass_.save(difference)  # abs saves its input
    _masked_mean(pass_, pass_.new(difference.shape, difference.dtype, difference.requires_grad), (batch, frames, 1))
    # The prior NLL's 0.5 * (...) saves a Python scalar, not a tensor.
    _masked_mean(pass_, _squared_error(pass_, target, prior_mean), (batch, frames, 1))
    for prediction in (log_duration, *predictions):
        _masked_mean(pass_, _squared_error(pass_, prediction, pass_.new((batch, text), path.dtype)), (batch, text))


# -- weights, gradients, optimizer states -----------------------------------------------------------


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s values (meta tensors too)."""
    return tensor.numel() * tensor.element_size()


def predicted_optimizer_states(parameters: list[torch.Tensor], optimizer: str) -> int:
    """Bytes of optimizer state for ``parameters`` (the trainable ones) after the first step.

    ``optimizer`` is a name of :data:`chorus.recipe.OPTIMIZERS`.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZERS)})")
    total = 0
    for p in parameters:
        n = p.numel()
        if optimizer == "adamw":
            # exp_avg and exp_avg_sq like the parameter, and a float32 step counter.
            total += 2 * nbytes(p) + 4
        elif optimizer == "adamw8bit":
            # bitsandbytes (optim/optimizer.py, Optimizer2State.init_state): uint8 moments and one
            # float32 absmax per block of 256 from min_8bit_size values up (build_optimizer sets it to
            # BNB_MIN_8BIT_SIZE), float32 moments below; the step is a Python int.
            total += 2 * n + 2 * 4 * math.ceil(n / 256) if n >= BNB_MIN_8BIT_SIZE else 2 * 4 * n
        else:
            # torchao (optim/adam.py, subclass_8bit.py): uint8 codes, a float32 scale per block of
            # 256 and a 256-entry float32 quantile map per moment, only for 4096+ values that fill
            # whole blocks; a float32 step tensor.
            quantized = n >= 4096 and n % 256 == 0
            total += (2 * (n + 4 * (n // 256) + 4 * 256) if quantized else 2 * nbytes(p)) + 4
    if optimizer == "adamw8bit" and any(p.numel() >= BNB_MIN_8BIT_SIZE for p in parameters):
        total += 2 * 4 * 256  # bitsandbytes' two quantile maps, shared by all tensors
    return total


def predict_memory(
    model: AcousticModel,
    *,
    batch: int,
    text_length: int,
    frames: int,
    options: MemoryOptions | None = None,
) -> MemoryBreakdown:
    """Predict the memory of one training step of ``model`` without running it.

    Args:
        model: the acoustic model, on any device (``meta`` builds any size without allocating).
            The parameters with ``requires_grad`` (those the forward reads) are the ones trained:
            that is how a method (full fine-tuning, a frozen base with adapters, with the voice's
            adapter active) enters the prediction.
        batch: utterances per batch; text_length: padded phoneme count; frames: padded mel frames.
        options: the training run's memory options (default :class:`MemoryOptions`): its
            ``optimizer``; ``precision`` ``"bf16"``: forward and losses under a bfloat16 autocast,
            float32 weights (:func:`chorus.training.efficiency.autocast`); ``checkpointing``: every FFT
            block recomputed in backward (see the module docstring); ``frozen_dtype`` ``"bf16"`` or
            ``"int8"``: what does not train stored lighter
            (:func:`chorus.training.efficiency.store_frozen_base`, as adaptation does); the
            prediction casts a copy of ``model``, ``model`` is unchanged. ``reversible`` is ``model``'s
            own (``AcousticConfig.reversible``).
    """
    options = options or MemoryOptions()
    if frames < text_length:
        raise ValueError(f"frames ({frames}) must be at least text_length ({text_length}): every token gets a frame")
    if options.frozen_dtype != "fp32":
        # On the meta device a copy costs nothing; meta tensors change dtype (and are quantized) like real ones.
        model = copy.deepcopy(model)
        store_frozen_base(model, options.frozen_dtype)
    pass_ = ShadowPass(torch.bfloat16 if options.precision == "bf16" else None, options.checkpointing)
    _acoustic_step(pass_, model, batch, text_length, frames)
    trainable = [p for p in pass_.used.values() if p.requires_grad]
    return breakdown(model, trainable, predicted_optimizer_states(trainable, options.optimizer), pass_)


def breakdown(
    model: nn.Module, trainable: list[torch.Tensor], optimizer_states: int, pass_: ShadowPass
) -> MemoryBreakdown:
    """The categories of a predicted step: ``model``'s parameters and buffers, a gradient per
    ``trainable`` parameter, the optimizer's states, and what ``pass_`` saved and rebuilt."""
    return MemoryBreakdown(
        weights=sum(nbytes(t) for t in model.parameters()) + sum(nbytes(b) for b in model.buffers()),
        gradients=sum(nbytes(p) for p in trainable),
        optimizer_states=optimizer_states,
        activations=pass_.saved_bytes,
        recompute=pass_.recompute,
    )
