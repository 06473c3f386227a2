"""Generic injection into any ``nn.Module``: find target layers by name, wrap them, manage adapters.

Module names are *canonical*: the names of the original model, whatever wrappers have been inserted
(``encoder.layers.0.attn.q_proj``, never ``...q_proj.base_layer``), so targets, saved keys and
PEFT's key layout all speak of the same modules.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from chorus.adapters.layer import AdapterLayer, innermost, wrappers_of
from chorus.adapters.registry import ALL_LAYERS, MethodConfig, get_method, module_pattern


def _matches(name: str, pattern: str | list[str] | None) -> bool:
    if pattern is None:
        return False
    if isinstance(pattern, str):
        return module_pattern(pattern).fullmatch(name) is not None
    return any(name == item or name.endswith("." + item) for item in pattern)


def _in_layers(name: str, layers: list[int] | None) -> bool:
    return layers is None or any(f".layers.{index}." in f".{name}." for index in layers)


def named_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(canonical name, outermost module at that name) for every module below ``model``; the inside
    of wrappers (their adapter tensors) is skipped."""

    def walk(module: nn.Module, prefix: str):
        for child_name, child in innermost(module).named_children():
            path = f"{prefix}{child_name}"
            yield path, child
            yield from walk(child, path + ".")

    yield from walk(model, "")


def adapter_layers(model: nn.Module) -> Iterator[tuple[str, AdapterLayer]]:
    """(canonical name, wrapper) for every wrapper, nested ones included."""
    for name, module in named_layers(model):
        for wrapper in wrappers_of(module):
            yield name, wrapper


def _resolve(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module that holds ``name``'s last segment as an attribute, and that segment."""
    *parents, leaf = name.split(".")
    holder = model
    for part in parents:
        holder = getattr(innermost(holder), part)
    return innermost(holder), leaf


def find_targets(model: nn.Module, config: MethodConfig) -> list[str]:
    """Canonical names of the layers ``config`` adapts. Explicitly named layers of an unsupported
    type raise a TypeError listing the supported types; ``"all"`` just skips them."""
    method = get_method(config.method)
    chosen = []
    for name, module in named_layers(model):
        if config.targets == ALL_LAYERS:
            if not method.supports(innermost(module)):
                continue
        elif not _matches(name, config.targets):
            continue
        if _matches(name, config.exclude) or not _in_layers(name, config.layers):
            continue
        method.wrapper_for(innermost(module), name)  # refuses unsupported types by name
        chosen.append(name)
    if not chosen:
        raise ValueError(
            f"{config.method}: targets {config.targets!r} (exclude {config.exclude!r}, layers "
            f"{config.layers}) match no module of {type(model).__name__}"
        )
    return chosen


def planned_shapes(model: nn.Module, configs: Sequence[MethodConfig]) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors :func:`add_adapter` would give ``model`` for ``configs``, keyed as
    :func:`adapter_state_dict` keys them, found by wrapping a copy of each target layer whose tensors are on the
    meta device: nothing is allocated, whatever sizes the configs declare (a voice folder from elsewhere declared
    a rank of 100,000 over tensors of rank 4, and 3.9 GB went before its weights were found not to fit)."""
    shapes = {}
    for config in configs:
        method = get_method(config.method)
        for target in find_targets(model, config):
            holder, leaf = _resolve(model, target)
            layer = _on_meta(innermost(getattr(holder, leaf)))
            wrapper = method.wrapper_for(layer, target)(layer)
            wrapper.add(_PLANNED, config)
            shapes.update(
                {f"{target}.{key}": tuple(value.shape) for key, value in wrapper.adapter_state(_PLANNED).items()}
            )
    return shapes


_PLANNED = "planned"


def _on_meta(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (shapes, no storage), each wrapper
    inside it replaced by a copy of the layer it wraps: a block's children carry every loaded voice's adapters,
    which copied one by one took 1.5-2.3 s with 1,000 voices loaded (the engine's lock held meanwhile)."""
    memo: dict[int, object] = {}

    def plan(inner: nn.Module) -> None:
        for parameter in inner.parameters(recurse=False):
            memo[id(parameter)] = nn.Parameter(parameter.detach().to("meta"), requires_grad=parameter.requires_grad)
        for buffer in inner.buffers(recurse=False):
            memo[id(buffer)] = buffer.to("meta")
        for child in inner.children():
            if isinstance(child, AdapterLayer):
                memo[id(child)] = _on_meta(innermost(child))
            else:
                plan(child)

    plan(module)
    return copy.deepcopy(module, memo)


def add_adapter(model: nn.Module, name: str, configs: Sequence[MethodConfig]) -> dict[str, list[str]]:
    """Add adapter ``name`` made of one or more methods; returns {method: adapted layer names}.

    All targets are resolved before anything is changed, so a bad pattern leaves the model as it was.
    """
    if not name or name.startswith("__") or "." in name:
        raise ValueError(f"invalid adapter name {name!r} (no dots, not starting with '__')")
    if name in adapter_names(model):
        raise ValueError(f"the model already has an adapter named {name!r}")
    plan = [(config, find_targets(model, config)) for config in configs]
    for config, targets in plan:
        method = get_method(config.method)
        for target in targets:
            holder, leaf = _resolve(model, target)
            outer = getattr(holder, leaf)
            existing = next((w for w in wrappers_of(outer) if w.method == method.name), None)
            if existing is None:
                wrapper_class = method.wrapper_for(innermost(outer), target)
                if wrapper_class.innermost_only:
                    # Methods that recompute the layer (prefix attention) sit right around the original.
                    chain = list(wrappers_of(outer))
                    existing = wrapper_class(innermost(outer))
                    if chain:
                        chain[-1].base_layer = existing
                    else:
                        setattr(holder, leaf, existing)
                else:
                    existing = wrapper_class(outer)
                    setattr(holder, leaf, existing)
            existing.add(name, config)
    return {config.method: targets for config, targets in plan}


def adapter_names(model: nn.Module) -> set[str]:
    return {n for _, layer in adapter_layers(model) for n in layer.names()}


def remove_adapter(model: nn.Module, name: str) -> None:
    """Delete adapter ``name`` everywhere; wrappers left without adapters are unwrapped."""
    for _, layer in list(adapter_layers(model)):
        layer.remove(name)
    for path, module in list(named_layers(model)):
        if not any(layer.names() for layer in wrappers_of(module)) and isinstance(module, AdapterLayer):
            holder, leaf = _resolve(model, path)
            setattr(holder, leaf, innermost(module))


def set_active(model: nn.Module, name: str | None) -> None:
    """Use adapter ``name`` for the whole batch (None: the base alone)."""
    if name is not None and name not in adapter_names(model):
        raise KeyError(f"no adapter {name!r}; the model has: {', '.join(sorted(adapter_names(model))) or 'none'}")
    for _, layer in adapter_layers(model):
        layer.active = name


@contextmanager
def active_adapter(model: nn.Module, name: str | None):
    """Temporarily :func:`set_active`."""
    previous = {id(layer): layer.active for _, layer in adapter_layers(model)}
    set_active(model, name)
    try:
        yield
    finally:
        for _, layer in adapter_layers(model):
            layer.active = previous.get(id(layer))


@contextmanager
def routed(model: nn.Module, names: Sequence[str]):
    """Per-sample adapters: row ``i`` of every batch uses ``names[i]`` (``BASE`` for none)."""
    from chorus.adapters.layer import BASE

    unknown = set(names) - adapter_names(model) - {BASE}
    if unknown:
        raise KeyError(f"no adapter(s) {sorted(unknown)} in the model")
    for _, layer in adapter_layers(model):
        layer.routing = list(names)
    try:
        yield
    finally:
        for _, layer in adapter_layers(model):
            layer.routing = None


def adapter_tensors(model: nn.Module) -> list[nn.Parameter]:
    """Every adapter tensor of every voice in ``model``, trained or not (a speaker vector kept at its start)."""
    return [
        parameter
        for _, layer in adapter_layers(model)
        for attribute in layer.adapter_attributes
        for parameter in getattr(layer, attribute).parameters()
    ]


def adapter_state_dict(model: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Adapter ``name``'s tensors keyed ``<canonical layer>.<tensor>`` (no adapter name, as PEFT saves)."""
    state = {}
    for path, layer in adapter_layers(model):
        for key, value in layer.adapter_state(name).items():
            state[f"{path}.{key}"] = value
    if not state:
        raise KeyError(f"no adapter {name!r} in the model")
    return state


def load_adapter_state_dict(model: nn.Module, name: str, state: dict[str, torch.Tensor]) -> None:
    """Fill adapter ``name`` (already added with the same configs) from :func:`adapter_state_dict` output."""
    expected = adapter_state_dict(model, name)
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        raise ValueError(
            f"adapter tensors do not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    for path, layer in adapter_layers(model):
        prefix = path + "."
        own = layer.adapter_state(name)
        if own:
            layer.load_adapter_state(name, {k: state[prefix + k] for k in own})


def mark_trainable(model: nn.Module, name: str) -> list[nn.Parameter]:
    """Freeze everything, then let adapter ``name``'s trained tensors learn; returns them."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    trainable = []
    for _, layer in adapter_layers(model):
        if name in layer.configs and layer.configs[name].trains():
            for parameter in layer.adapter_parameters(name):
                parameter.requires_grad_(True)
                trainable.append(parameter)
    return trainable


def merge_adapter(model: nn.Module, name: str) -> None:
    """Fold adapter ``name`` into the base weights of every layer it adapts (all must be mergeable)."""
    layers = [layer for _, layer in adapter_layers(model) if name in layer.configs]
    not_mergeable = sorted({layer.method for layer in layers if not layer.mergeable})
    if not_mergeable:
        raise ValueError(f"adapter {name!r} uses {', '.join(not_mergeable)}, which cannot be merged")
    # Each layer's wrappers innermost first, as the forward applies them: for methods that do not commute
    # (a gain around LoRA) the order matters, and unmerge_all, outermost first, then restores each save in turn.
    for _, module in named_layers(model):
        for layer in reversed(list(wrappers_of(module))):
            if name in layer.configs:
                layer.merge(name)
    set_active(model, name)


def unmerge_all(model: nn.Module) -> None:
    """Restore the exact base weights."""
    for _, layer in adapter_layers(model):
        layer.unmerge()


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The original model's state dict (canonical keys, no adapter tensors), e.g. to save a full copy."""
    state = {}
    for path, module in [("", model), *named_layers(model)]:
        base = innermost(module)
        prefix = f"{path}." if path else ""
        for key, value in base.named_parameters(recurse=False):
            state[prefix + key] = value
        for key, value in base.named_buffers(recurse=False):
            if key not in base._non_persistent_buffers_set:
                state[prefix + key] = value
    return state
