"""LoRA (Hu et al., 2021): a low-rank update ``W + (alpha / r) * B @ A`` learned beside frozen weights.

Tensors are laid out exactly as PEFT lays them out (``lora_A.weight``/``lora_B.weight``, the weights
of PEFT's ``lora_A``/``lora_B`` sub-layers, for Linear and Conv1d; ``lora_embedding_A``/``lora_embedding_B``
for Embedding; A random, B zero, so a fresh adapter is a no-op), which is what lets PEFT and Chorus
load each other's LoRA files. Chorus keeps them as parameters (:class:`AdapterTensors`) and applies
them functionally, not as a sub-layer per voice, so resident voices cost little Python heap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from chorus.adapters.layer import AdapterLayer, AdapterTensors, innermost
from chorus.adapters.registry import TARGETS_HELP, Method, MethodConfig, register

# Query, value and output projections of every attention (the LoRA paper found query and value
# enough): at rank 4 a voice is under 1% of the shipped base's size.
DEFAULT_TARGETS = ["q_proj", "v_proj", "out_proj"]


@dataclass
class LoraConfig(MethodConfig):
    """r: rank of the update; alpha: its scale (update = alpha / r * B @ A, or alpha / sqrt(r) with
    ``use_rslora``). Default targets: the query, value and output projections of every attention
    (add ``k_proj``, ``conv1``/``conv2`` for keys and the feed-forward and predictor convolutions)."""

    method = "lora"
    targets: str | list[str] = field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        metadata={"help": f"{TARGETS_HELP}; default: {', '.join(DEFAULT_TARGETS)}"},
    )
    r: int = field(default=4, metadata={"help": "rank of the update", "option": "rank"})
    alpha: float = field(default=8.0, metadata={"help": "scale of the update: alpha / r"})
    use_rslora: bool = field(default=False, metadata={"help": "scale by alpha / sqrt(r) instead (rank-stabilized)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.r <= 0:
            raise ValueError(f"LoRA rank r must be positive, got {self.r}")

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


class _LoraLayer(AdapterLayer):
    method = "lora"
    mergeable = True
    _bank_keys: tuple[str, str] = ("lora_A.weight", "lora_B.weight")  # A's and B's keys in a bank

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.scaling: dict[str, float] = {}

    def add(self, name: str, config: LoraConfig) -> None:
        self.configs[name] = config
        self.scaling[name] = config.scaling
        weight = innermost(self).weight
        self._create(name, config.r, weight.device, weight.dtype)

    def _create(self, name: str, r: int, device, dtype) -> None:
        raise NotImplementedError

    def merged_base_tensors(self, name, tensors):
        weight = tensors["weight"]
        return {"weight": weight + self.delta_weight(name).to(weight.dtype)}

    def delta_weight(self, name: str) -> torch.Tensor:
        """Adapter ``name``'s update ``scaling * B @ A`` in the base weight's layout."""
        return self._delta(*self._factors(name), self.scaling[name])

    def bank_merged_tensors(self, slot, tensors):
        """The update of bank slot ``slot`` folded into ``tensors["weight"]`` (zero-padded ranks add 0)."""
        weight = tensors["weight"]
        a, b = (self.bank[key][slot] for key in self._bank_keys)
        return {"weight": weight + self._delta(a, b, self.bank["scaling"][slot]).to(weight.dtype)}

    def _factors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Adapter ``name``'s (A, B)."""
        raise NotImplementedError

    @staticmethod
    def _delta(a: torch.Tensor, b: torch.Tensor, scaling) -> torch.Tensor:
        """``scaling * B @ A`` laid out as the base weight."""
        raise NotImplementedError

    def pack(self, names):
        """``scaling`` ``[K]``: each voice's alpha / r, applied per sample so the bank's A and B stay in
        PEFT's layout (unpacking is a copy; gradients match the name-keyed adapters')."""
        weight = innermost(self).weight
        return {
            "scaling": torch.tensor(
                [self.scaling.get(name, 0.0) for name in names], dtype=weight.dtype, device=weight.device
            )
        }

    def _bank_gather(self, batch: int, key_b: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot ``[batch]``, each sample's B ``[batch, out, r, ...]`` times its voice's scaling, zero
        where the base alone applies). Scaling the small gathered B, not the output, lets the update be
        added in the same batched matmul (baddbmm)."""
        slot, used = self.bank.route(self.bank_index, batch)
        scale = self.bank["scaling"][slot] * used
        b = self.bank[key_b][slot]
        return slot, b * scale.view(-1, *[1] * (b.dim() - 1))

    def remove(self, name: str) -> None:
        super().remove(name)
        self.scaling.pop(name, None)


class _LoraSublayers(_LoraLayer):
    """LoRA whose A and B are the weights of layers in PEFT (Linear and Conv1d), applied here as those
    layers would apply them: output = base(x) + B(A(x)) * scale."""

    adapter_attributes = ("lora_A", "lora_B")

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.lora_A = AdapterTensors("weight")
        self.lora_B = AdapterTensors("weight")

    def _create(self, name, r, device, dtype):
        """A random as PEFT initializes it (``nn.Linear``/``nn.Conv1d``'s kaiming uniform), B zero."""
        shape_a, shape_b = self._shapes(r)
        a = torch.empty(shape_a, device=device, dtype=dtype)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.lora_A[name] = {"weight": a}
        self.lora_B[name] = {"weight": torch.zeros(shape_b, device=device, dtype=dtype)}

    def _shapes(self, r: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(A's shape, B's shape) at rank ``r``."""
        raise NotImplementedError

    def _low_rank_update(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """B(A(x)) of adapter ``name``, unscaled; the base layer's output shape."""
        raise NotImplementedError

    def _factors(self, name):
        return self.lora_A[name]["weight"], self.lora_B[name]["weight"]

    def forward_with(self, name, x, *args, **kwargs):
        """x ``[..., in]`` (Linear) or ``[batch, in, time]`` (Conv1d) -> the base layer's output shape."""
        return self.base_layer(x, *args, **kwargs) + self._low_rank_update(name, x) * self.scaling[name]


class LoraLinear(_LoraSublayers):
    """A ``[r, in]``, B ``[out, r]``."""

    def _shapes(self, r):
        base = innermost(self)
        return (r, base.in_features), (base.out_features, r)

    def _low_rank_update(self, name, x):
        """x ``[..., in]`` -> ``[..., out]``."""
        return F.linear(F.linear(x, self.lora_A[name]["weight"]), self.lora_B[name]["weight"])

    def forward_bank(self, x, *args, **kwargs):
        """x ``[batch, ..., in]`` -> ``[batch, ..., out]``: per sample ``x A[v]^T B[v]^T * scaling[v]``."""
        y = self.base_layer(x, *args, **kwargs)
        batch = x.shape[0]
        slot, b = self._bank_gather(batch, "lora_B.weight")  # b [batch, out, r]
        low = torch.bmm(
            x.reshape(batch, -1, x.shape[-1]), self.bank["lora_A.weight"][slot].transpose(1, 2)
        )  # [batch, n, r]
        return torch.baddbmm(y.reshape(batch, -1, y.shape[-1]), low, b.transpose(1, 2)).view(y.shape)

    @staticmethod
    def _delta(a, b, scaling):
        return b @ a * scaling  # [out, r] @ [r, in]

    def shadow_forward(self, pass_, name, x):
        """x ``[..., in]`` -> ``[..., out]``: base(x) + linear(linear(x, A), B) * scaling. A saves x for
        its gradient, B saves A(x); the scaling is a Python number, which autograd's hooks never see."""
        update = pass_.linear(pass_.linear(x, self.lora_A[name]["weight"]), self.lora_B[name]["weight"])
        return pass_.elementwise(pass_.leaf(self.base_layer, x), update)


class LoraConv1d(_LoraSublayers):
    """A ``[r, in, kernel]`` is a convolution with the base layer's kernel, stride, padding and
    dilation; B ``[out, r, 1]`` mixes channels (kernel 1), as in PEFT."""

    def _shapes(self, r):
        base = innermost(self)
        if base.groups != 1:
            raise TypeError("LoRA supports Conv1d with groups=1 only")
        return (r, base.in_channels, *base.kernel_size), (base.out_channels, r, 1)

    def _low_rank_update(self, name, x):
        """x ``[batch, in, time]`` -> ``[batch, out, time']``."""
        base = innermost(self)
        low = F.conv1d(x, self.lora_A[name]["weight"], None, base.stride, base.padding, base.dilation)
        return F.conv1d(low, self.lora_B[name]["weight"])

    def forward_bank(self, x, *args, **kwargs):
        """x ``[batch, in, time]`` -> ``[batch, out, time']``. Each sample's A is the kernel of its own
        group of one grouped convolution (so stride, padding and dilation are the base layer's, as for
        the name-keyed A); B then mixes channels by bmm."""
        y = self.base_layer(x, *args, **kwargs)
        base = innermost(self)
        batch, channels, time = x.shape
        slot, b = self._bank_gather(batch, "lora_B.weight")  # b [batch, out, r, 1]
        a = self.bank["lora_A.weight"][slot]  # [batch, r, in, kernel]
        low = F.conv1d(
            x.reshape(1, batch * channels, time),
            a.reshape(-1, channels, a.shape[-1]),
            None,
            base.stride,
            base.padding,
            base.dilation,
            groups=batch,
        )  # [1, batch * r, time']
        return torch.baddbmm(y, b[..., 0], low.view(batch, a.shape[1], -1))

    @staticmethod
    def _delta(a, b, scaling):
        return torch.einsum("or,rik->oik", b[:, :, 0], a) * scaling  # [out, r, 1] after [r, in, k]

    def shadow_forward(self, pass_, name, x):
        """x ``[batch, in, time]`` -> ``[batch, out, time']``: as :meth:`LoraLinear.shadow_forward`, with
        A a convolution like the base layer's and B a kernel-1 convolution."""
        base = innermost(self)
        low = pass_.conv1d(x, self.lora_A[name]["weight"], None, base.stride, base.padding, base.dilation)
        update = pass_.conv1d(low, self.lora_B[name]["weight"])
        return pass_.elementwise(pass_.leaf(self.base_layer, x), update)


class LoraEmbedding(_LoraLayer):
    """A is ``[r, num_embeddings]`` (zero), B is ``[embedding_dim, r]`` (random), as in PEFT."""

    adapter_attributes = ("lora_embedding_A", "lora_embedding_B")
    _bank_keys = ("lora_embedding_A", "lora_embedding_B")

    def __init__(self, base_layer: nn.Module):
        super().__init__(base_layer)
        self.lora_embedding_A = nn.ParameterDict()
        self.lora_embedding_B = nn.ParameterDict()

    def _create(self, name, r, device, dtype):
        base = innermost(self)
        self.lora_embedding_A[name] = nn.Parameter(torch.zeros(r, base.num_embeddings, device=device, dtype=dtype))
        self.lora_embedding_B[name] = nn.Parameter(torch.randn(base.embedding_dim, r, device=device, dtype=dtype))

    def forward_with(self, name, ids, *args, **kwargs):
        """ids ``[...]`` -> ``[..., embedding_dim]``."""
        base = innermost(self)
        looked_up = F.embedding(
            ids,
            self.lora_embedding_A[name].T,
            base.padding_idx,
            base.max_norm,
            base.norm_type,
            base.scale_grad_by_freq,
            base.sparse,
        )
        return self.base_layer(ids, *args, **kwargs) + looked_up @ self.lora_embedding_B[name].T * self.scaling[name]

    def pack(self, names):
        base = innermost(self)
        if base.max_norm is not None or base.scale_grad_by_freq or base.sparse:
            raise NotImplementedError(
                "LoRA banks support Embedding layers without max_norm, scale_grad_by_freq and sparse gradients only"
            )
        return super().pack(names)

    def forward_bank(self, ids, *args, **kwargs):
        """ids ``[batch, ...]`` -> ``[batch, ..., embedding_dim]``: each (sample, id) gathers its column
        of the sample's A, then B by bmm."""
        y = self.base_layer(ids, *args, **kwargs)
        base = innermost(self)
        batch = ids.shape[0]
        slot, b = self._bank_gather(batch, "lora_embedding_B")  # b [batch, dim, r]
        table = self.bank["lora_embedding_A"].transpose(1, 2)  # [K, num_embeddings, r]
        looked = table[slot.view(batch, *[1] * (ids.dim() - 1)), ids]  # [batch, ..., r]
        if base.padding_idx is not None:
            # As F.embedding with padding_idx: the padding id is looked up but passes no gradient.
            looked = torch.where((ids == base.padding_idx).unsqueeze(-1), looked.detach(), looked)
        return torch.baddbmm(
            y.reshape(batch, -1, y.shape[-1]), looked.reshape(batch, -1, looked.shape[-1]), b.transpose(1, 2)
        ).view(y.shape)

    def _factors(self, name):
        return self.lora_embedding_A[name], self.lora_embedding_B[name]

    @staticmethod
    def _delta(a, b, scaling):
        return (b @ a).T * scaling  # [num_embeddings, dim]

    def shadow_forward(self, pass_, name, ids):
        """ids ``[...]`` -> ``[..., embedding_dim]``: base(ids) + embedding(ids, A.T) @ B.T * scaling."""
        table = pass_.parameter(self.lora_embedding_A[name])  # [r, num_embeddings], looked up transposed
        if table.requires_grad:
            pass_.save(ids)  # the indices, to scatter the gradient into A
        looked_up = pass_.new((*ids.shape, table.shape[0]), table.dtype, table.requires_grad)
        update = pass_.matmul_transposed(looked_up, self.lora_embedding_B[name])
        return pass_.elementwise(pass_.leaf(self.base_layer, ids), update)


def _example(k: int) -> LoraConfig:
    """Test voice ``k``: ranks 1-4, alphas and rsLoRA vary; even voices adapt attention, the first
    feed-forward convolution, the symbol embedding and the mel projection, odd ones keys, the second
    convolution and the speaker projection."""
    return LoraConfig(
        r=1 + k % 4,
        alpha=2.0 + k,
        use_rslora=k == 3,
        targets=(
            ["q_proj", "v_proj", "out_proj", "conv1", "symbol_embedding", "mel_proj"]
            if k % 2 == 0
            else ["k_proj", "conv2", "speaker_proj"]
        ),
    )


register(
    Method(
        "lora",
        LoraConfig,
        ((nn.Linear, LoraLinear), (nn.Conv1d, LoraConv1d), (nn.Embedding, LoraEmbedding)),
        learning_rate=2e-3,
        summary="low-rank updates of attention and feed-forward weights",
        example=_example,
    )
)
