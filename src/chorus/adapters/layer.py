"""The wrapped layer every adapter method builds on: a base layer plus adapters keyed by name.

A wrapper replaces one module of the model (``encoder.layers.0.attn.q_proj`` becomes a wrapper whose
``base_layer`` is the original ``nn.Linear``). Each adapter (a voice) added to it keeps its tensors
under its own name, so many voices can live in one model; one of them, or none, is *active*.

Two ways to choose the adapter per forward:

* ``active``: one name for the whole batch (or None for the base alone);
* ``routing``: one name per sample, ``BASE`` for "no adapter". This is the slow, obviously-correct
  reference path (it runs the layer once per distinct name on that name's rows); batched banks
  are tested against it;
* ``bank_index``: one bank slot per sample (-1 for none) while the voices of a
  :class:`~chorus.adapters.bank.VoiceBank` are packed into ``bank``: the fast batched path
  (gather + batched matmul), which takes precedence over the two above.

Wrappers may nest when several methods target the same module (BitFit around LoRA around a Linear);
the innermost module is the original layer, reached through :func:`innermost`.

Adapter tensors are parameters in a few containers per wrapper (:class:`AdapterTensors`, or a
``ParameterDict`` for one tensor per adapter), never an ``nn.Module`` per adapter: the serving engine
keeps many voices resident, and each module would cost more Python heap than a small voice's tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

BASE = "__base__"  # routing name meaning "this sample uses no adapter"


class AdapterTensors(nn.Module):
    """Per adapter name, the same few named parameters (``weight``, ``bias`` ...), held directly by
    this one module; ``tensors[name]`` is ``{tensor name: Parameter}`` in ``tensor_names`` order.

    Why not a layer per adapter, as PEFT does (``lora_A[name] = nn.Linear(...)``): an ``nn.Module``
    costs about 2.3 KB of Python heap, a parameter about 0.25 KB, and a resident voice adapts tens of
    layers. With a module per adapter per layer, a LoRA voice's Python objects weighed almost as
    much as its tensors (114 KiB beside 144 KiB on the shipped base). The wrappers apply these
    tensors with functional ops (``F.linear``, ``F.conv1d``) in the layout those layers would have.

    Tensor ``weight`` of adapter ``ann`` is the parameter ``ann:weight`` (``register_parameter``
    refuses dots). The tensor names contain no ``:``, so what follows the last ``:`` tells them
    apart and adapter names containing ``:`` cannot collide.
    """

    def __init__(self, *tensor_names: str):
        super().__init__()
        if not tensor_names or any(":" in tensor_name for tensor_name in tensor_names):
            raise ValueError(f"tensor names must be given and contain no ':', got {tensor_names}")
        self.tensor_names = tensor_names

    @staticmethod
    def _key(name: str, tensor_name: str) -> str:
        return f"{name}:{tensor_name}"

    def __contains__(self, name: str) -> bool:
        return self._key(name, self.tensor_names[0]) in self._parameters

    def __getitem__(self, name: str) -> dict[str, nn.Parameter]:
        if name not in self:
            raise KeyError(name)
        return {tensor_name: self._parameters[self._key(name, tensor_name)] for tensor_name in self.tensor_names}

    def __setitem__(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Register ``tensors`` (one per tensor name) as adapter ``name``'s parameters."""
        if set(tensors) != set(self.tensor_names):
            raise ValueError(f"adapter {name!r} needs tensors {list(self.tensor_names)}, got {list(tensors)}")
        for tensor_name in self.tensor_names:
            self.register_parameter(self._key(name, tensor_name), nn.Parameter(tensors[tensor_name]))

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        for tensor_name in self.tensor_names:
            del self._parameters[self._key(name, tensor_name)]


class AdapterLayer(nn.Module):
    """Base class of all wrappers. Subclasses define ``method``, ``add`` and ``forward_with``, and
    where the method supports them ``forward_bank`` (banks), ``merged_base_tensors`` (merging),
    ``bank_merged_tensors`` (a bank slot folded into the weights: the Piper decoder's fused products run a
    bank's rows with it) and ``shadow_forward`` (the memory prediction).

    ``adapter_attributes`` names the :class:`AdapterTensors`/``ParameterDict`` attributes that hold
    per-adapter tensors (keyed by adapter name); saving, loading, freezing and removal use it.
    """

    method: str = ""
    adapter_attributes: tuple[str, ...] = ()
    mergeable: bool = False
    innermost_only: bool = False  # True for wrappers that recompute the layer (must sit next to it)

    def __init__(self, base_layer: nn.Module):
        super().__init__()
        self.base_layer = base_layer
        self.active: str | None = None
        self.routing: Sequence[str] | None = None
        self.merged: str | None = None
        self._saved_base: dict[str, torch.Tensor] = {}  # exact base tensors while an adapter is merged
        self.configs: dict[str, object] = {}
        self.bank: nn.Module | None = None  # a LayerBank (chorus.adapters.bank) while packed
        self.bank_index: torch.Tensor | None = None  # [batch] bank slot per sample (-1: base) while banked

    # -- per-method hooks ----------------------------------------------------------------------
    @classmethod
    def cannot_wrap(cls, layer: nn.Module) -> str | None:
        """Why this wrapper does not fit ``layer`` beyond its type (e.g. BitFit needs a bias), or None."""
        return None

    def add(self, name: str, config) -> None:
        """Create adapter ``name``'s tensors from its method config (initialized as a no-op where
        the method allows, so a fresh adapter leaves the output unchanged)."""
        raise NotImplementedError

    def forward_with(self, name: str, *args, **kwargs):
        """The layer's output with adapter ``name`` applied."""
        raise NotImplementedError

    def pack(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Fixed ``[K, ...]`` tensors (slot k = ``names[k]``) that this method's :meth:`forward_bank`
        needs besides the stacked adapter tensors (LoRA's scaling, the prefix lengths); raises where
        the bank path cannot reproduce this layer."""
        return {}

    def forward_bank(self, *args, **kwargs):
        """The layer's output with sample i's voice taken from slot ``bank_index[i]`` of ``bank``
        (gather + batched matmul, no loop over voices); same shapes as :meth:`forward_with`."""
        raise NotImplementedError

    def shadow_forward(self, pass_, name: str, x):
        """The memory rule: :meth:`forward_with` of adapter ``name`` replayed on shadow tensors.

        ``pass_`` is a :class:`chorus.memory.predict.ShadowPass` and ``x`` one of its shadow tensors
        (shape, dtype, requires-grad; duck-typed here, since the memory accounting sits above the
        adapters). The rule runs the base layer through ``pass_.leaf(self.base_layer, x)`` (so nested
        wrappers compose), applies the wrapper's own ops with the pass's op rules (``linear``,
        ``conv1d``, ``mul``, ``elementwise`` ...), which record what autograd saves, reads adapter
        tensors through ``pass_.parameter`` (so they get gradients only where the step reaches them),
        and returns the output. The prediction calls it only while adapter ``name`` is active and
        unmerged; otherwise the base layer's rule applies.
        """
        raise TypeError(f"{type(self).__name__} declares no memory rule (AdapterLayer.shadow_forward)")

    def merged_base_tensors(self, name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """For mergeable methods: new values of the innermost layer's tensors with ``name`` folded into
        ``tensors`` (the innermost layer's ``weight``, ``bias`` ..., as its own or as other wrappers left
        them); only the tensors the method changes."""
        raise ValueError(
            f"{self.method} adapters cannot be merged into the base weights "
            "(their effect is not a change of the base layer's tensors)"
        )

    def bank_merged_tensors(self, slot: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """:meth:`merged_base_tensors` of the voice in bank slot ``slot``, or None where the method has no
        such fold (its one-row forwards then run through :meth:`forward_bank`)."""
        return None

    def row_tensors(self, batch: int) -> tuple[nn.Module, dict[str, torch.Tensor]] | None:
        """(the innermost layer, its parameters with every adapter that applies folded in) for a forward of
        ``batch`` rows that all take the same adapters: one adapter active for the whole batch, none, one
        merged, or a bank or routing of one row. Running the innermost layer with these tensors gives this
        wrapper's output up to float rounding. None where a method's effect is not a change of those
        tensors, or rows differ. (Folded innermost first, as the forward applies them: for methods that do
        not commute, such as a gain around LoRA, the order matters.)

        A decoder that runs its convolutions its own way (the Piper decoder's products) reads them here;
        models sit below adapters, so it finds this method by name, not by type."""
        layer = innermost(self)
        tensors = own_tensors(layer)
        for wrapper in reversed(list(wrappers_of(self))):
            tensors = wrapper._fold_rows(batch, tensors)
            if tensors is None:
                return None
        return layer, tensors

    def _fold_rows(self, batch: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """``tensors`` with this wrapper's adapter for ``batch`` rows folded in (see :meth:`row_tensors`)."""
        if self.bank_index is not None:
            if batch != 1:
                return None
            slot, used = self.bank.route(self.bank_index, 1)
            if not bool(used[0]):
                return tensors
            folded = self.bank_merged_tensors(int(slot[0]), tensors)
        else:
            if self.routing is not None and (self.merged is not None or len(set(self.routing)) != 1):
                return None  # rows differ, or a routing forward that refuses merged weights
            name = self.routing[0] if self.routing is not None else self.active
            if self.merged is not None:
                # The weights hold it already; any other adapter: the forward's error, not a silent fold.
                return tensors if name == self.merged else None
            if name is None or name not in self.configs:  # the base alone, or a voice that leaves this layer
                return tensors
            if not self.mergeable:
                return None
            folded = self.merged_base_tensors(name, tensors)
        return None if folded is None else {**tensors, **folded}

    # -- bookkeeping ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.configs)

    def _containers(self) -> Iterator[AdapterTensors | nn.ParameterDict]:
        for attribute in self.adapter_attributes:
            yield getattr(self, attribute)

    def adapter_parameters(self, name: str) -> list[nn.Parameter]:
        params = []
        for container in self._containers():
            if name in container:
                entry = container[name]
                params += list(entry.values()) if isinstance(container, AdapterTensors) else [entry]
        return params

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s tensors, keyed relative to this layer without the adapter name
        (``lora_A.weight``, ``lora_embedding_A``), as PEFT saves them."""
        state = {}
        for attribute in self.adapter_attributes:
            container = getattr(self, attribute)
            if name not in container:
                continue
            entry = container[name]
            if isinstance(container, AdapterTensors):
                # Detached, as the state_dict of PEFT's sub-layers gives them (not .data): in-place
                # loads then bump the version counter, so autograd notices them.
                for key, value in entry.items():
                    state[f"{attribute}.{key}"] = value.detach()
            else:
                state[attribute] = entry.data
        return state

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Copy tensors saved by :meth:`adapter_state` into adapter ``name`` (shapes must match)."""
        own = self.adapter_state(name)
        missing, unexpected = set(own) - set(state), set(state) - set(own)
        if missing or unexpected:
            raise ValueError(
                f"{self.method} adapter tensors do not match: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        with torch.no_grad():
            for key, value in state.items():
                if own[key].shape != value.shape:
                    raise ValueError(
                        f"{key}: shape {tuple(value.shape)} does not fit {tuple(own[key].shape)} "
                        "(the adapter was made for another base model)"
                    )
                own[key].copy_(value)

    def remove(self, name: str) -> None:
        if self.merged == name:
            self.unmerge()
        for container in self._containers():
            if name in container:
                del container[name]
        self.configs.pop(name, None)
        if self.active == name:
            self.active = None

    # -- merge ---------------------------------------------------------------------------------
    def merge(self, name: str) -> None:
        """Fold adapter ``name`` into the base layer's tensors (a fast path when one voice is served).

        The exact base tensors are kept aside so :meth:`unmerge` restores them bit for bit.
        """
        if self.merged is not None:
            raise ValueError(f"adapter {self.merged!r} is already merged; unmerge it first")
        if name not in self.configs:
            raise KeyError(f"no adapter {name!r} in this layer")
        target = innermost(self)
        new_values = self.merged_base_tensors(name, own_tensors(target))
        with torch.no_grad():
            for key, value in new_values.items():
                tensor = getattr(target, key)
                self._saved_base[key] = tensor.detach().clone()
                tensor.copy_(value)
        self.merged = name

    def unmerge(self) -> None:
        if self.merged is None:
            return
        target = innermost(self)
        with torch.no_grad():
            for key, value in self._saved_base.items():
                getattr(target, key).copy_(value)
        self._saved_base.clear()
        self.merged = None

    # -- forward -------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.bank_index is not None:
            return self.forward_bank(*args, **kwargs)
        if self.routing is not None:
            return self._routed_forward(*args, **kwargs)
        name = self.active
        if self.merged is not None:
            if name != self.merged:
                raise RuntimeError(
                    f"adapter {self.merged!r} is merged into the base weights; unmerge it "
                    f"before using {name or 'the base'!r}"
                )
            return self.base_layer(*args, **kwargs)
        if name is None or name not in self.configs:  # a voice may leave this layer alone
            return self.base_layer(*args, **kwargs)
        return self.forward_with(name, *args, **kwargs)

    def _routed_forward(self, *args, **kwargs):
        """Reference path: each distinct name runs on its own rows; rows come back in order."""
        if self.merged is not None:
            raise RuntimeError("per-sample routing needs unmerged adapters")
        routing = list(self.routing)
        batch = len(routing)
        output = None
        for name in dict.fromkeys(routing):
            rows = torch.tensor([i for i, n in enumerate(routing) if n == name], dtype=torch.long)
            sub_args = [_rows(a, rows, batch) for a in args]
            sub_kwargs = {k: _rows(v, rows, batch) for k, v in kwargs.items()}
            # Wrappers inside this one (nested methods, adapted sub-layers) see only these rows:
            # they run with this group's adapter instead of routing a second time.
            inner = [m for m in self.base_layer.modules() if isinstance(m, AdapterLayer)]
            saved = [(m.routing, m.active) for m in inner]
            for module in inner:
                module.routing, module.active = None, (None if name == BASE else name)
            try:
                if name not in self.configs:  # BASE, or a voice that did not adapt this layer
                    part = self.base_layer(*sub_args, **sub_kwargs)
                else:
                    part = self.forward_with(name, *sub_args, **sub_kwargs)
            finally:
                for module, (routing_before, active_before) in zip(inner, saved):
                    module.routing, module.active = routing_before, active_before
            if output is None:
                output = part.new_empty((batch, *part.shape[1:]))
            output[rows.to(part.device)] = part
        return output


def _rows(value, rows: torch.Tensor, batch: int):
    """Select ``rows`` of batch-first tensors; anything else passes through."""
    if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == batch:
        return value[rows.to(value.device)]
    return value


def own_tensors(layer: nn.Module) -> dict[str, nn.Parameter]:
    """A layer's own parameters by name (``weight``, ``bias`` where it has one): what a merge folds into."""
    return dict(layer.named_parameters(recurse=False))


def innermost(module: nn.Module) -> nn.Module:
    """The original layer under any number of nested wrappers."""
    while isinstance(module, AdapterLayer):
        module = module.base_layer
    return module


def wrappers_of(module: nn.Module) -> Iterator[AdapterLayer]:
    """The wrappers of one module, outermost first."""
    while isinstance(module, AdapterLayer):
        yield module
        module = module.base_layer


def row_scopes(model: nn.Module) -> Callable[[int], AbstractContextManager[None]]:
    """``scope(row)``: a context in which the wrappers inside ``model`` take row ``row`` of their batch for the
    whole batch (a bank slot, a routing name narrowed to that row's; an active or merged adapter as it is),
    so that row can run through ``model`` by itself. For forwards that go row by row (the Piper decoder's
    products)."""
    wrappers = [module for module in model.modules() if isinstance(module, AdapterLayer)]

    @contextmanager
    def scope(row: int) -> Iterator[None]:
        saved = [(wrapper.bank_index, wrapper.routing) for wrapper in wrappers]
        try:
            for wrapper in wrappers:
                if wrapper.bank_index is not None:
                    if not 0 <= row < len(wrapper.bank_index):
                        raise IndexError(f"row {row} of a batch of {len(wrapper.bank_index)}")
                    wrapper.bank_index = wrapper.bank_index[row : row + 1]
                if wrapper.routing is not None:
                    wrapper.routing = [wrapper.routing[row]]
            yield
        finally:
            for wrapper, (bank_index, routing) in zip(wrappers, saved):
                wrapper.bank_index, wrapper.routing = bank_index, routing

    return scope
