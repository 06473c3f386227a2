"""Adapters: a voice as a small set of tensors beside a frozen base model.

One method per module (``lora``, ``residual``, ``prefix``, ``speaker``, ``cln``, ``bitfit``), each a
config dataclass plus wrappers registered by layer type, listed in :mod:`chorus.adapters.methods`;
generic injection by module-name pattern (:mod:`chorus.adapters.inject`); voice artifacts on disk
(:mod:`chorus.adapters.voice`). Full fine-tuning (``full``) is the baseline every method is measured
against.
"""

# The one list of methods: importing it registers them all, before anything looks one up by name.
import chorus.adapters.methods  # noqa: F401
from chorus.adapters.inject import (
    active_adapter,
    adapter_layers,
    adapter_names,
    adapter_state_dict,
    add_adapter,
    base_state_dict,
    find_targets,
    load_adapter_state_dict,
    mark_trainable,
    merge_adapter,
    remove_adapter,
    routed,
    set_active,
    unmerge_all,
)
from chorus.adapters.layer import BASE, AdapterLayer
from chorus.adapters.registry import (
    FULL_FINE_TUNING,
    MethodChoice,
    MethodConfig,
    all_methods,
    config_from_dict,
    get_method,
    method_names,
    parse_methods,
    split_methods,
)

__all__ = [
    "BASE",
    "FULL_FINE_TUNING",
    "AdapterLayer",
    "MethodChoice",
    "MethodConfig",
    "active_adapter",
    "adapter_layers",
    "adapter_names",
    "adapter_state_dict",
    "add_adapter",
    "all_methods",
    "base_state_dict",
    "config_from_dict",
    "find_targets",
    "get_method",
    "load_adapter_state_dict",
    "mark_trainable",
    "merge_adapter",
    "method_names",
    "parse_methods",
    "remove_adapter",
    "routed",
    "set_active",
    "split_methods",
    "unmerge_all",
]
