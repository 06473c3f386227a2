"""Activation rules of the adapter wrappers (:mod:`chorus.adapters`) for the memory prediction.

One rule per wrapper class, registered like any layer's (:func:`register_activation_rule`). Each
runs its base layer's rule (the original layer, another wrapper, or a whole attention; so nested
wrappers compose) and adds the ops of the wrapper's ``forward_with``, asking of each what autograd
saves. A frozen base therefore keeps only what its input's gradient needs (a Linear whose weight
does not train saves no input), and the adapter's own tensors are read through
:meth:`ShadowPass.parameter`, so they get gradients only where the step reaches them.
"""

from __future__ import annotations

from collections.abc import Callable

from chorus.adapters.bitfit import BiasDelta
from chorus.adapters.conditional_norm import ConditionalLayerNorm
from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.lora import LoraConv1d, LoraEmbedding, LoraLinear
from chorus.adapters.prefix import PrefixAttention
from chorus.adapters.residual import ResidualAdapter
from chorus.adapters.speaker import ProjectionDelta, SpeakerVector
from chorus.memory.predict import ShadowPass, ShadowTensor, register_activation_rule

AdapterRule = Callable[[ShadowPass, AdapterLayer, str, ShadowTensor], ShadowTensor]


def register_adapter_rule(*wrapper_types: type[AdapterLayer]) -> Callable[[AdapterRule], AdapterRule]:
    """Register ``rule(pass_, layer, name, x)``, the wrapper's forward with adapter ``name``, for
    ``wrapper_types``. Where the wrapper runs its base layer alone (no adapter of its own active, or
    the active one merged into the base weights) the base layer's rule applies instead."""
    def register(rule: AdapterRule) -> AdapterRule:
        def apply(pass_: ShadowPass, layer: AdapterLayer, x: ShadowTensor) -> ShadowTensor:
            if layer.routing is not None:
                raise ValueError("per-sample adapter routing is not predicted: set one active adapter "
                                 "(chorus.adapters.set_active) for the step")
            name = layer.active
            if layer.merged is not None or name is None or name not in layer.configs:
                return pass_.leaf(layer.base_layer, x)
            return rule(pass_, layer, name, x)
        for wrapper_type in wrapper_types:
            register_activation_rule(wrapper_type)(apply)
        return rule
    return register


@register_adapter_rule(LoraLinear)
def _lora_linear(pass_: ShadowPass, layer: LoraLinear, name: str, x: ShadowTensor) -> ShadowTensor:
    """x ``[..., in]`` -> ``[..., out]``: base(x) + linear(linear(x, A), B) * scaling. A saves x for
    its gradient, B saves A(x); the scaling is a Python number, which autograd's hooks never see."""
    update = pass_.linear(pass_.linear(x, layer.lora_A[name]["weight"]), layer.lora_B[name]["weight"])
    return pass_.elementwise(pass_.leaf(layer.base_layer, x), update)


@register_adapter_rule(LoraConv1d)
def _lora_conv1d(pass_: ShadowPass, layer: LoraConv1d, name: str, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, in, time]`` -> ``[batch, out, time']``: as :func:`_lora_linear`, with A a
    convolution like the base layer's and B a kernel-1 convolution."""
    base = innermost(layer)
    low = pass_.conv1d(x, layer.lora_A[name]["weight"], None, base.stride, base.padding, base.dilation)
    update = pass_.conv1d(low, layer.lora_B[name]["weight"])
    return pass_.elementwise(pass_.leaf(layer.base_layer, x), update)


@register_adapter_rule(LoraEmbedding)
def _lora_embedding(pass_: ShadowPass, layer: LoraEmbedding, name: str, ids: ShadowTensor) -> ShadowTensor:
    """ids ``[...]`` -> ``[..., embedding_dim]``: base(ids) + embedding(ids, A.T) @ B.T * scaling."""
    table = pass_.parameter(layer.lora_embedding_A[name])   # [r, num_embeddings], looked up transposed
    if table.requires_grad:
        pass_.save(ids)   # the indices, to scatter the gradient into A
    looked_up = pass_.new((*ids.shape, table.shape[0]), table.dtype, table.requires_grad)
    update = pass_.matmul_transposed(looked_up, layer.lora_embedding_B[name])
    return pass_.elementwise(pass_.leaf(layer.base_layer, ids), update)


@register_adapter_rule(ResidualAdapter)
def _residual(pass_: ShadowPass, layer: ResidualAdapter, name: str, x: ShadowTensor) -> ShadowTensor:
    """Same shapes as the wrapped layer: y + up(relu(down(y))) on the feature axis."""
    y = pass_.leaf(layer.base_layer, x)
    if layer.axis == 1:   # a Conv1d's channels move last and back: transposed views, nothing saved
        batch, channels, length = y.shape
        y = y.view(batch, length, channels)
    down, up = layer.adapter_down[name], layer.adapter_up[name]
    hidden = pass_.relu(pass_.linear(y, down["weight"], down["bias"]))
    out = pass_.elementwise(y, pass_.linear(hidden, up["weight"], up["bias"]))
    return out.view(batch, channels, length) if layer.axis == 1 else out


@register_adapter_rule(PrefixAttention)
def _prefix_attention(pass_: ShadowPass, layer: PrefixAttention, name: str, x: ShadowTensor) -> ShadowTensor:
    """x ``[batch, time, dim]`` -> ``[batch, time, dim]``; keys and values get ``n_prefix`` learned
    rows in front (concatenation saves nothing), the mask as many valid positions."""
    attention = layer.base_layer
    batch = x.shape[0]
    q = pass_.leaf(attention.q_proj, x)
    keys_values = []
    prefixes = (layer.prefix_key[name], layer.prefix_value[name])
    for prefix, projection in zip(prefixes, (attention.k_proj, attention.v_proj)):
        rows = pass_.parameter(prefix).view(batch, *prefix.shape)   # expanded over the batch: a view
        if rows.dtype != x.dtype:
            rows = pass_.new(rows.shape, x.dtype, rows.requires_grad)   # .to(x.dtype): a copy, nothing saved
        keys_values.append(pass_.cat(rows, pass_.leaf(projection, x)))
    out = pass_.attention(q, *keys_values, attention.n_heads, attention.dropout)
    return pass_.leaf(attention.out_proj, out)


@register_adapter_rule(ConditionalLayerNorm)
def _conditional_norm(pass_: ShadowPass, layer: ConditionalLayerNorm, name: str, x: ShadowTensor) -> ShadowTensor:
    """x ``[..., dim]`` -> ``[..., dim]``: base(x) + layer_norm(x) * scale + shift. The plain
    normalization is a second layer norm node (its own mean and std), kept for the scale's gradient."""
    normalized = pass_.layer_norm(x, len(innermost(layer).normalized_shape))
    scaled = pass_.mul(normalized, pass_.parameter(layer.norm_scale[name]))
    shifted = pass_.elementwise(scaled, pass_.parameter(layer.norm_shift[name]))
    return pass_.elementwise(pass_.leaf(layer.base_layer, x), shifted)


@register_adapter_rule(BiasDelta)
def _bias_delta(pass_: ShadowPass, layer: BiasDelta, name: str, x: ShadowTensor) -> ShadowTensor:
    # base(x) + delta: an addition saves nothing; the float32 delta promotes a bf16 output.
    return pass_.elementwise(pass_.leaf(layer.base_layer, x), pass_.parameter(layer.bias_delta[name]))


@register_adapter_rule(SpeakerVector)
def _speaker_vector(pass_: ShadowPass, layer: SpeakerVector, name: str, ids: ShadowTensor) -> ShadowTensor:
    """ids ``[batch]`` -> ``[batch, speaker_dim]``: the voice's vector expanded, a view of the
    parameter (what reads it saves no activation); the embedding table is not read at all."""
    vector = pass_.parameter(layer.speaker_vector[name])
    return vector.view(*ids.shape, vector.shape[-1])


@register_adapter_rule(ProjectionDelta)
def _projection_delta(pass_: ShadowPass, layer: ProjectionDelta, name: str, x: ShadowTensor) -> ShadowTensor:
    """x ``[..., in]`` -> ``[..., out]``: base(x) + x @ W_delta.T + b_delta."""
    delta = pass_.matmul_transposed(x, layer.projection_weight_delta[name])
    delta = pass_.elementwise(delta, pass_.parameter(layer.projection_bias_delta[name]))
    return pass_.elementwise(pass_.leaf(layer.base_layer, x), delta)
