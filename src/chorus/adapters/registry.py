"""Method registry: each adapter method registers its config class, its wrappers by layer type and
its test examples; the registry imports none of them.

A method is one module (``lora.py``, ``residual.py`` ...) that ends with one :func:`register` call;
:mod:`chorus.adapters.methods` is the one list that imports them all (as PEFT lists its tuners in
``tuners/__init__.py``), and the package imports that list, so every method is known by name. The
injection code knows nothing about any method: it matches module names against the config's
targets and asks the method which wrapper fits each layer's type (an ordered dispatch that fails
with the list of supported types, or with the wrapper's reason for refusing a layer of such a type).
"""

from __future__ import annotations

import difflib
import functools
import numbers
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import re2
from torch import nn

from chorus.adapters.layer import AdapterLayer
from chorus.typed_fields import wrong_fields

ALL_LAYERS = "all"  # targets value: every layer of a type the method supports
MAX_SIZE = 1 << 16  # the largest size (rank, bottleneck, prefix length) a config may hold: far past any layer's width

# Help texts of the fields every method shares (each method repeats ``targets`` with its own default).
TARGETS_HELP = (
    "modules to adapt: names or name suffixes, a regular expression (RE2) matching the whole name, or "
    "'all' (every layer of a supported type)"
)
EXCLUDE_HELP = "modules to skip, in the same forms as targets"
LAYERS_HELP = "adapt only inside these block indices (.layers.<i>.); default: every block"


@functools.lru_cache(maxsize=256)
def module_pattern(pattern: str, what: str = "targets") -> re2._Regexp:
    """``pattern`` compiled by RE2, which matches in time linear in the name whatever the pattern: a voice folder
    from elsewhere carries its targets, and Python's ``re`` backtracks exponentially on some patterns (a
    171-byte voice held a server's every request). RE2 has no look-arounds or back-references; a pattern with
    them is refused, naming the error."""
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as error:
        reason = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
        raise ValueError(
            f"{what} {pattern!r} is not a regular expression Chorus reads (RE2 syntax): {reason}"
        ) from None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is raised with its reason; RE2 would also print it to stderr


@dataclass
class MethodConfig:
    """Fields every method shares: which modules it adapts.

    targets: a string is a regular expression that must match the whole module name
        (``r"encoder\\.layers\\.\\d+\\.attn\\.q_proj"``); a list holds names or name suffixes
        (``["q_proj", "v_proj"]`` matches ``decoder.layers.3.attn.q_proj``), as in PEFT;
        ``"all"`` takes every layer of a supported type.
    exclude: the same forms; matching modules are skipped.
    layers: only modules inside these block indices (``.layers.<i>.``), None = all.

    Every field a user may set carries ``metadata={"help": ...}``: the command line makes its options
    from ``dataclasses.fields(config_class)``.
    """

    method: ClassVar[str] = ""
    targets: str | list[str] = field(default=ALL_LAYERS, metadata={"help": TARGETS_HELP})
    exclude: str | list[str] | None = field(default=None, metadata={"help": EXCLUDE_HELP})
    layers: list[int] | None = field(default=None, metadata={"help": LAYERS_HELP})

    def __post_init__(self) -> None:
        """Refuse values of the wrong type (a config may come from a voice folder made elsewhere) and patterns
        that do not compile."""
        wrong = wrong_fields(self)
        if wrong:
            raise ValueError(f"{self.method} config: {'; '.join(wrong)}")
        for name in ("targets", "exclude"):
            pattern = getattr(self, name)
            if isinstance(pattern, str) and pattern != ALL_LAYERS:
                module_pattern(pattern, name)
        if self.layers is not None and any(index < 0 for index in self.layers):
            raise ValueError(f"{self.method} config: layers {self.layers} holds a negative block index")
        # Sizes (a rank, a bottleneck, a prefix length) are allocated per layer: a config from elsewhere that asks
        # for 2**62 overflowed torch's size arithmetic, and one of 10**5 took gigabytes before its weights were read.
        too_big = [
            f"{item.name} {value}"
            for item in fields(self)
            if isinstance(value := getattr(self, item.name), numbers.Integral)
            and not isinstance(value, bool)
            and value > MAX_SIZE
        ]
        if too_big:
            raise ValueError(
                f"{self.method} config: {', '.join(too_big)} over the largest size Chorus builds ({MAX_SIZE:,})"
            )

    def to_dict(self) -> dict:
        return {"method": self.method, **asdict(self)}

    def trains(self) -> bool:
        """Whether this method's tensors are trained (the speaker vector may be kept fixed)."""
        return True


@dataclass(frozen=True)
class Method:
    """What the rest of Chorus knows of a method.

    wrappers: ordered ``(layer type, wrapper class)`` pairs; the first whose type matches and whose
        wrapper accepts the layer wins. Each wrapper also declares its memory rule
        (:meth:`AdapterLayer.shadow_forward`).
    example: the config of test voice ``k`` (k = 0, 1, ... 5) on the Chorus model: sizes and targets
        vary with ``k``, so that a bank of them pads tensors and has absent slots; ``example(0)`` is
        the method's representative case. The tests parametrize over the registry with it.
    """

    name: str
    config_class: type[MethodConfig]
    wrappers: tuple[tuple[type[nn.Module], type[AdapterLayer]], ...]
    learning_rate: float  # default learning rate for `chorus adapt`
    summary: str  # one line for help texts
    example: Callable[[int], MethodConfig]

    def wrapper_for(self, layer: nn.Module, name: str) -> type[AdapterLayer]:
        refusals = []
        for layer_type, wrapper in self.wrappers:
            if isinstance(layer, layer_type):
                reason = wrapper.cannot_wrap(layer)
                if reason is None:
                    return wrapper
                refusals.append(reason)
        if refusals:
            raise TypeError(f"{self.name} cannot adapt {name!r} ({type(layer).__name__}): {'; '.join(refusals)}")
        supported = ", ".join(t.__name__ for t, _ in self.wrappers)
        raise TypeError(f"{self.name} cannot adapt {name!r} ({type(layer).__name__}); it supports: {supported}")

    def supports(self, layer: nn.Module) -> bool:
        return any(isinstance(layer, t) and w.cannot_wrap(layer) is None for t, w in self.wrappers)

    @property
    def mergeable(self) -> bool:
        """Whether every wrapper of the method folds into the base weights."""
        return all(wrapper.mergeable for _, wrapper in self.wrappers)


FULL_FINE_TUNING = "full"  # the baseline: not an adapter, every base weight trains on a copy
_METHODS: dict[str, Method] = {}  # in registration order: the order of chorus.adapters.methods


def register(method: Method) -> Method:
    """Make ``method`` known by name (a method module calls this once, at import)."""
    if method.name in _METHODS or method.name == FULL_FINE_TUNING:
        raise ValueError(f"adapter method {method.name!r} is already registered")
    if method.config_class.method != method.name:
        raise ValueError(
            f"{method.config_class.__name__}.method is {method.config_class.method!r}, not {method.name!r}"
        )
    _METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in _METHODS:
        close = difflib.get_close_matches(str(name).lower(), method_names(), n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ValueError(f"unknown adapter method {name!r}; {hint}choose from: {', '.join(method_names())}")
    return _METHODS[name]


def method_names() -> list[str]:
    """Names of the adapter methods, sorted, then ``full`` (full fine-tuning)."""
    return sorted(_METHODS) + [FULL_FINE_TUNING]


def all_methods() -> list[Method]:
    """The adapter methods in registration order (full fine-tuning is no method)."""
    return list(_METHODS.values())


def config_from_dict(data: dict) -> MethodConfig:
    """Rebuild a method config saved by :meth:`MethodConfig.to_dict`; unknown fields are refused."""
    data = dict(data)
    method = get_method(data.pop("method", ""))
    known = {f.name for f in fields(method.config_class)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {method.name} config fields: {sorted(unknown)}")
    return method.config_class(**data)


def split_methods(spec: str) -> list[str]:
    """The method names of ``spec``: one method, or several joined by ``+`` (``lora+speaker``), as a
    user writes them; ``ValueError`` when it names none."""
    names = [name.strip() for name in spec.split("+") if name.strip()]
    if not names:
        raise ValueError("no adaptation method given")
    return names


@dataclass(frozen=True)
class MethodChoice:
    """The methods of one adaptation as typed configs, in the order given; or full fine-tuning
    (``full``, no adapter config: every base weight trains on a copy)."""

    configs: tuple[MethodConfig, ...] = ()
    full: bool = False

    @property
    def names(self) -> list[str]:
        return [FULL_FINE_TUNING] if self.full else [config.method for config in self.configs]

    @property
    def spec(self) -> str:
        """As a user writes it: ``lora+speaker``."""
        return "+".join(self.names)


def parse_methods(spec: str, options: Mapping[str, Mapping[str, Any]] | None = None) -> MethodChoice:
    """The methods of ``spec`` (``lora+speaker``; ``full``) with their config fields from ``options``
    (``{"lora": {"r": 4}}``), parsed once where a user gives them. ``ValueError`` for an unknown method, a
    method named twice, full fine-tuning combined with adapters, options of a method not chosen, or a bad option."""
    names, options = split_methods(spec), options or {}
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # "lora+lora" had trained one LoRA and recorded two
        raise ValueError(f"each method once: {', '.join(repeated)} is named twice in {spec!r}")
    if FULL_FINE_TUNING in names and len(names) > 1:
        raise ValueError("full fine-tuning trains every weight; it is not combined with adapters")
    unknown_options = set(options) - set(names)
    if unknown_options:
        raise ValueError(f"options given for methods not chosen: {sorted(unknown_options)}")
    if names == [FULL_FINE_TUNING]:
        return MethodChoice(full=True)
    configs = []
    for name in names:
        try:
            configs.append(get_method(name).config_class(**options.get(name, {})))
        except TypeError as error:
            raise ValueError(f"bad options for {name}: {error}") from error
    return MethodChoice(tuple(configs))
