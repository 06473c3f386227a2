"""Method registry: each adapter method registers its config class and its wrappers by layer type.

A method module (``lora.py``, ``residual.py`` ...) calls :func:`register` once at import. The
injection code knows nothing about any method: it matches module names against the config's
targets and asks the method which wrapper fits each layer's type (an ordered dispatch that fails
with the list of supported types).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from torch import nn

from chorus.adapters.layer import AdapterLayer

ALL_LAYERS = "all"   # targets value: every layer of a type the method supports


@dataclass
class MethodConfig:
    """Fields every method shares: which modules it adapts.

    targets: a string is a regular expression that must match the whole module name
        (``r"encoder\\.layers\\.\\d+\\.attn\\.q_proj"``); a list holds names or name suffixes
        (``["q_proj", "v_proj"]`` matches ``decoder.layers.3.attn.q_proj``), as in PEFT;
        ``"all"`` takes every layer of a supported type.
    exclude: the same forms; matching modules are skipped.
    layers: only modules inside these block indices (``.layers.<i>.``), None = all.
    """

    method: ClassVar[str] = ""
    targets: str | list[str] = ALL_LAYERS
    exclude: str | list[str] | None = None
    layers: list[int] | None = None

    def to_dict(self) -> dict:
        return {"method": self.method, **asdict(self)}

    def trains(self) -> bool:
        """Whether this method's tensors are trained (the speaker vector may be kept fixed)."""
        return True


@dataclass(frozen=True)
class Method:
    name: str
    config_class: type[MethodConfig]
    wrappers: tuple[tuple[type[nn.Module], type[AdapterLayer]], ...]   # ordered: first isinstance wins
    learning_rate: float          # default learning rate for `chorus adapt`
    summary: str                  # one line for help texts

    def wrapper_for(self, layer: nn.Module, name: str) -> type[AdapterLayer]:
        for layer_type, wrapper in self.wrappers:
            if isinstance(layer, layer_type) and wrapper.can_wrap(layer):
                return wrapper
        supported = ", ".join(t.__name__ for t, _ in self.wrappers)
        raise TypeError(f"{self.name} cannot adapt {name!r} ({type(layer).__name__}); "
                        f"it supports: {supported}" + (" (with a bias)" if self.name == "bitfit" else ""))

    def supports(self, layer: nn.Module) -> bool:
        return any(isinstance(layer, t) and w.can_wrap(layer) for t, w in self.wrappers)


METHODS: dict[str, Method] = {}
FULL_FINE_TUNING = "full"   # the baseline: not an adapter, every base weight trains on a copy


def register(method: Method) -> Method:
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    _load_methods()
    if name not in METHODS:
        raise ValueError(f"unknown adapter method {name!r}; choose from: "
                         f"{', '.join(sorted(METHODS) + [FULL_FINE_TUNING])}")
    return METHODS[name]


def method_names() -> list[str]:
    _load_methods()
    return sorted(METHODS) + [FULL_FINE_TUNING]


def config_from_dict(data: dict) -> MethodConfig:
    """Rebuild a method config saved by :meth:`MethodConfig.to_dict`; unknown fields are refused."""
    data = dict(data)
    method = get_method(data.pop("method", ""))
    known = {f.name for f in fields(method.config_class)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {method.name} config fields: {sorted(unknown)}")
    return method.config_class(**data)


def _load_methods() -> None:
    # Importing the method modules registers them (one method, one module).
    from chorus.adapters import (  # noqa: F401
        bitfit,
        conditional_norm,
        lora,
        prefix,
        residual,
        speaker,
    )
