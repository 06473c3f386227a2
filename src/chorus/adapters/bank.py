"""Voice banks: the adapters of K voices stacked per layer, so one batch serves (or trains) many voices.

Name-keyed adapters (:mod:`chorus.adapters.layer`) hold one voice per key; per-sample routing over
them runs each layer once per distinct voice, which is slow when a batch mixes many voices. A bank
stacks each wrapped layer's adapter tensors on a leading voice axis (LoRA ``lora_A.weight`` of K
voices becomes ``[K, r, in]``) and every sample picks its voice by a slot index ``voice_index
[batch]`` (-1: the base alone): gather + batched matmul, as punica's SGMV does for LoRA, with no
loop over voices or samples. The per-sample routing path stays the reference the bank is tested
against.

Tensors of different sizes (LoRA ranks, bottleneck widths, prefix lengths) are zero-padded at the end
of each axis; each method's ``forward_bank`` makes that padding an exact no-op (zero rows and
columns for LoRA and residual adapters, a key mask for prefixes), and its gradient is exactly zero,
so training keeps it zero. A voice that does not adapt a layer has an all-zero slot there and is
marked absent, so that layer gives it the base output.

Typical use::

    bank = pack_bank(model, ["ann", "bob", "cy"])            # after add_adapter / apply_voice of each
    with banked(model, bank, ["bob", BASE, "ann", "bob"]):   # or a [batch] long tensor of slots
        mel = model.infer(phonemes, lengths, speaker_ids=speakers).mel
    bank.remove()

To train K voices in one job, add each voice with :func:`~chorus.adapters.inject.add_adapter` (which
initializes it as its method does), ``pack_bank(..., trainable=True)``, optimize
``bank.parameters()`` on mixed batches inside :func:`banked`, then :meth:`VoiceBank.unpack` and save
each voice with :func:`~chorus.adapters.voice.save_voice`. The bank tensors live inside the wrappers
(``<layer>.bank``), so they move with ``model.to(...)`` and are parameters of the blocks that hold
them (the reversible stack routes gradients to block parameters only).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from chorus.adapters.inject import adapter_layers, adapter_names
from chorus.adapters.layer import BASE, AdapterLayer

BASE_SLOT = -1  # voice_index value: this sample uses no adapter


class LayerBank(nn.Module):
    """One wrapper's adapter tensors for K voices, keyed as :meth:`AdapterLayer.adapter_state` keys them.

    ``bank[key]`` is ``[K, *padded shape of key]``; method constants (``pack``) are buffers; ``present``
    ``[K]`` says which voices adapt this layer. With ``trains`` (``[K]`` bool, trainable banks only)
    the stacked tensors are parameters whose gradient is kept only in the slots of voices whose config
    trains them (a speaker vector kept fixed stays fixed).
    """

    def __init__(
        self,
        stacked: dict[str, torch.Tensor],
        constants: dict[str, torch.Tensor],
        present: torch.Tensor,
        trains: torch.Tensor | None,
    ):
        super().__init__()
        # Tensors computed elsewhere (a voice space's hypernetwork) can stand in for the stacked ones.
        self.generated: dict[str, torch.Tensor] | None = None
        self._attributes = {key: key.replace(".", "_") for key in [*stacked, *constants]}
        device = next(iter(stacked.values())).device
        requires_grad = trains is not None and bool(trains.any())
        for key, value in stacked.items():
            self.register_parameter(self._attributes[key], nn.Parameter(value, requires_grad=requires_grad))
        for key, value in constants.items():
            self.register_buffer(self._attributes[key], value, persistent=False)
        self.register_buffer("present", present.to(device), persistent=False)
        if requires_grad and not bool(trains.all()):
            self.register_buffer("trains", trains.to(device), persistent=False)
            for key in stacked:
                self[key].register_hook(self._keep_trained_slots)

    def __getitem__(self, key: str) -> torch.Tensor:
        if self.generated is not None and key in self.generated:
            return self.generated[key]
        return getattr(self, self._attributes[key])

    def _keep_trained_slots(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        if grad is None:  # a custom backward (the reversible stack) may report "no gradient" as None
            return None
        return grad * self.trains.view(-1, *[1] * (grad.dim() - 1)).to(grad.dtype)

    def route(self, voice_index: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """voice_index ``[batch]`` -> (slot ``[batch]`` long, safe to gather with; used ``[batch]`` bool:
        the sample's voice adapts this layer). Samples not ``used`` must get the base output."""
        if voice_index.shape != (batch,):
            raise ValueError(
                f"voice_index has shape {tuple(voice_index.shape)}, but this layer sees a batch of "
                f"{batch} (bank layers need batch-first inputs)"
            )
        voice_index = voice_index.to(self.present.device)
        slot = voice_index.clamp(min=0)
        return slot, (voice_index >= 0) & self.present[slot]


def _stack(layer: AdapterLayer, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Each adapter tensor of ``names`` (zeros for voices without one here), zero-padded to the largest
    shape and stacked: key -> ``[K, *shape]``."""
    states = [layer.adapter_state(name) if name in layer.configs else None for name in names]
    present = [state for state in states if state is not None]
    stacked = {}
    for key, reference in present[0].items():
        shape = [max(sizes) for sizes in zip(*(state[key].shape for state in present))]
        bank = reference.new_zeros(len(names), *shape)
        for slot, state in enumerate(states):
            if state is not None:
                bank[slot][_region(state[key])] = state[key]
        stacked[key] = bank
    return stacked


def _region(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The leading block of a padded slot that holds ``tensor``."""
    return tuple(slice(0, size) for size in tensor.shape)


def _trains(layer: AdapterLayer, name: str) -> bool:
    return name in layer.configs and layer.configs[name].trains() and bool(layer.adapter_parameters(name))


@dataclass
class VoiceBank:
    """Handle on the banks packed into a model's wrappers; slot k is voice ``names[k]``."""

    names: list[str]
    layers: list[tuple[str, AdapterLayer]]  # (canonical layer name, wrapper holding a LayerBank)

    def index(self, names: Sequence[str]) -> torch.Tensor:
        """Voice names (``BASE`` for none) -> ``[batch]`` long slots; an unknown voice is an error."""
        slots = {name: slot for slot, name in enumerate(self.names)}
        unknown = sorted(set(names) - set(slots) - {BASE})
        if unknown:
            raise KeyError(f"voice(s) {unknown} are not in this bank (it holds {', '.join(self.names)})")
        return torch.tensor([BASE_SLOT if name == BASE else slots[name] for name in names], dtype=torch.long)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable bank tensors (for an optimizer)."""
        for _, layer in self.layers:
            yield from (p for p in layer.bank.parameters() if p.requires_grad)

    def snapshot(self, slot: int) -> list[torch.Tensor]:
        """Copies of slot ``slot``'s tensors in every layer (a voice's state, e.g. its best so far)."""
        return [tensor[slot].detach().clone() for _, layer in self.layers for tensor in layer.bank.parameters()]

    def restore(self, slot: int, values: list[torch.Tensor]) -> None:
        """Put back a :meth:`snapshot` of slot ``slot``."""
        tensors = [tensor for _, layer in self.layers for tensor in layer.bank.parameters()]
        with torch.no_grad():
            for tensor, value in zip(tensors, values, strict=True):
                tensor[slot].copy_(value)

    def unpack(self) -> None:
        """Write the bank's values back into each voice's name-keyed adapter tensors (e.g. after
        training, before :func:`~chorus.adapters.voice.save_voice`)."""
        with torch.no_grad():
            for _, layer in self.layers:
                for slot, name in enumerate(self.names):
                    if name in layer.configs:
                        for key, tensor in layer.adapter_state(name).items():
                            tensor.copy_(layer.bank[key][slot][_region(tensor)])

    def remove(self) -> None:
        """Drop the bank tensors from the model (call :meth:`unpack` first to keep trained values)."""
        for _, layer in self.layers:
            layer.bank, layer.bank_index = None, None
        self.layers = []


def pack_bank(model: nn.Module, names: Sequence[str], trainable: bool = False) -> VoiceBank:
    """Stack voices ``names`` (already added to ``model``) into a bank in every wrapper that any of them
    adapts. The bank is a copy: the name-keyed adapters stay as they are until :meth:`VoiceBank.unpack`.

    With ``trainable`` the stacked tensors are parameters that require grad (see :class:`LayerBank`
    for voices whose config keeps a tensor fixed); otherwise they are frozen parameters. Freeze the
    base before packing: freezing every parameter of the model afterwards freezes the bank too.
    """
    names = list(names)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"a bank needs distinct voice names, got {names}")
    missing = sorted(set(names) - adapter_names(model))
    if missing:
        raise KeyError(f"no adapter(s) {missing} in the model")
    layers = [(path, layer) for path, layer in adapter_layers(model) if any(n in layer.configs for n in names)]
    for path, layer in layers:
        if layer.bank is not None or layer.merged is not None:
            raise ValueError(f"{path}: already holds a bank or a merged adapter; remove or unmerge it first")
    # All banks are built before any is installed, so a layer the bank path cannot serve leaves the
    # model as it was.
    banks = [
        LayerBank(
            _stack(layer, names),
            layer.pack(names),
            torch.tensor([n in layer.configs for n in names]),
            torch.tensor([_trains(layer, n) for n in names]) if trainable else None,
        )
        for _, layer in layers
    ]
    for (_, layer), layer_bank in zip(layers, banks):
        layer.bank = layer_bank
    return VoiceBank(names, layers)


@contextmanager
def banked(model: nn.Module, bank: VoiceBank, voice_index: torch.Tensor | Sequence[str]):
    """Run ``model`` with sample i using bank slot ``voice_index[i]`` (``[batch]`` long, -1 for the
    base; or voice names, ``BASE`` for none) in every layer; wrappers outside the bank act as the base.

    The backward of a banked forward must run inside the same block too: checkpointed and reversible
    stacks recompute layers in backward and read ``bank_index`` again.
    """
    if not bank.layers:
        raise ValueError("this bank was removed from its model; pack the voices again")
    if not torch.is_tensor(voice_index):
        voice_index = bank.index(voice_index)
    if voice_index.dtype != torch.long or voice_index.dim() != 1:
        raise ValueError(
            f"voice_index must be a [batch] long tensor, got {voice_index.dtype} {tuple(voice_index.shape)}"
        )
    if voice_index.numel() and (voice_index.min() < BASE_SLOT or voice_index.max() >= len(bank.names)):
        raise ValueError(f"voice_index values must be in {BASE_SLOT}..{len(bank.names) - 1}")
    voice_index = voice_index.to(bank.layers[0][1].bank.present.device)  # once, not in every layer
    in_bank = {id(layer) for _, layer in bank.layers}
    layers = [layer for _, layer in adapter_layers(model)]
    if any(layer.merged is not None for layer in layers):
        raise ValueError("a bank runs on the exact base weights: unmerge every adapter first")
    saved = [(layer.active, layer.routing) for layer in layers]
    for layer in layers:
        layer.active, layer.routing = None, None
        if id(layer) in in_bank:
            layer.bank_index = voice_index
    try:
        yield
    finally:
        for layer, (active, routing) in zip(layers, saved):
            layer.active, layer.routing, layer.bank_index = active, routing, None
