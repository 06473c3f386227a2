"""Prefix tuning (Li & Liang, 2021): learned key/value vectors prepended inside self-attention.

Every query may attend to ``n_prefix`` extra key/value pairs that belong to the voice; the base
projections stay frozen. Keys start small and random, values at zero, so a fresh prefix only shifts
a little attention mass onto nothing (not an exact no-op: the softmax is renormalized). Not mergeable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register
from chorus.models.acoustic import MultiHeadAttention


@dataclass
class PrefixConfig(MethodConfig):
    """n_prefix: key/value pairs per attention layer."""

    method = "prefix"
    targets: str | list[str] = field(
        default_factory=lambda: ["attn"], metadata={"help": f"{TARGETS_HELP}; default: attn"}
    )
    n_prefix: int = field(
        default=8, metadata={"help": "learned key/value pairs per attention layer", "option": "prefix-length"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_prefix <= 0:
            raise ValueError(f"n_prefix must be positive, got {self.n_prefix}")


class PrefixAttention(AdapterLayer):
    """Wraps :class:`~chorus.models.acoustic.MultiHeadAttention` and recomputes it with prefixes."""

    method = "prefix"
    adapter_attributes = ("prefix_key", "prefix_value")
    innermost_only = True

    def __init__(self, base_layer: MultiHeadAttention):
        super().__init__(base_layer)
        self.prefix_key = nn.ParameterDict()
        self.prefix_value = nn.ParameterDict()

    def add(self, name: str, config: PrefixConfig) -> None:
        self.configs[name] = config
        weight = innermost(self.base_layer.q_proj).weight
        dim = weight.shape[0]
        self.prefix_key[name] = nn.Parameter(
            0.02 * torch.randn(config.n_prefix, dim, device=weight.device, dtype=weight.dtype)
        )
        self.prefix_value[name] = nn.Parameter(
            torch.zeros(config.n_prefix, dim, device=weight.device, dtype=weight.dtype)
        )

    def forward_with(self, name, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, time, dim]``, mask ``[batch, time]`` -> ``[batch, time, dim]``."""
        attention = self.base_layer
        batch = x.shape[0]
        prefix_k = self.prefix_key[name].unsqueeze(0).expand(batch, -1, -1)
        prefix_v = self.prefix_value[name].unsqueeze(0).expand(batch, -1, -1)
        q = attention._heads(attention.q_proj(x))
        k = attention._heads(torch.cat([prefix_k.to(x.dtype), attention.k_proj(x)], dim=1))
        v = attention._heads(torch.cat([prefix_v.to(x.dtype), attention.v_proj(x)], dim=1))
        full_mask = torch.cat([mask.new_ones(batch, prefix_k.shape[1]), mask], dim=1)[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=full_mask, dropout_p=attention.dropout if self.training else 0.0
        )
        return attention.out_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))

    def pack(self, names):
        """``prefix_valid`` ``[K, n_prefix max]``: which prefix positions each voice has (voices with fewer
        are zero-padded, and zero keys would still draw attention, so padding is masked instead)."""
        lengths = torch.tensor(
            [self.configs[n].n_prefix if n in self.configs else 0 for n in names],
            device=innermost(self.base_layer.q_proj).weight.device,
        )
        return {"prefix_valid": torch.arange(int(lengths.max()), device=lengths.device) < lengths[:, None]}

    def forward_bank(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[batch, time, dim]``, mask ``[batch, time]`` -> ``[batch, time, dim]``. Base samples see
        every prefix position masked out, which is attention without prefixes."""
        attention = self.base_layer
        slot, used = self.bank.route(self.bank_index, x.shape[0])
        prefix_k = self.bank["prefix_key"][slot].to(x.dtype)  # [batch, n_prefix, dim]
        prefix_v = self.bank["prefix_value"][slot].to(x.dtype)
        valid = self.bank["prefix_valid"][slot] & used[:, None]  # [batch, n_prefix]
        q = attention._heads(attention.q_proj(x))
        k = attention._heads(torch.cat([prefix_k, attention.k_proj(x)], dim=1))
        v = attention._heads(torch.cat([prefix_v, attention.v_proj(x)], dim=1))
        full_mask = torch.cat([valid, mask], dim=1)[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=full_mask, dropout_p=attention.dropout if self.training else 0.0
        )
        return attention.out_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))

    def shadow_forward(self, pass_, name, x):
        """x ``[batch, time, dim]`` -> ``[batch, time, dim]``; keys and values get ``n_prefix`` learned
        rows in front (concatenation saves nothing), the mask as many valid positions."""
        attention = self.base_layer
        batch = x.shape[0]
        q = pass_.leaf(attention.q_proj, x)
        keys_values = []
        prefixes = (self.prefix_key[name], self.prefix_value[name])
        for prefix, projection in zip(prefixes, (attention.k_proj, attention.v_proj), strict=True):
            rows = pass_.parameter(prefix).view(batch, *prefix.shape)  # expanded over the batch: a view
            if rows.dtype != x.dtype:
                rows = pass_.new(rows.shape, x.dtype, rows.requires_grad)  # .to(x.dtype): a copy, nothing saved
            keys_values.append(pass_.cat(rows, pass_.leaf(projection, x)))
        out = pass_.attention(q, *keys_values, attention.n_heads, attention.dropout)
        return pass_.leaf(attention.out_proj, out)


def _example(k: int) -> PrefixConfig:
    """Test voice ``k``: 1-3 prefix pairs; voice 4 adapts the second block of each stack only."""
    return PrefixConfig(n_prefix=1 + k % 3, layers=[1] if k == 4 else None)


register(
    Method(
        "prefix",
        PrefixConfig,
        ((MultiHeadAttention, PrefixAttention),),
        learning_rate=5e-3,
        summary="learned key/value prefixes in every self-attention",
        example=_example,
    )
)
