"""Adapter-method options built from the registry: one ``--FIELD`` option per config field of a method.

Nothing here names a method or a field. For every registered method (:func:`chorus.adapters.method_names`),
each field of its config class beyond the shared :class:`~chorus.adapters.MethodConfig` ones becomes an
option named after the field, or after its ``metadata["option"]`` where the field's name is terse (LoRA's
``r`` is ``--rank``, prefix's ``n_prefix`` is ``--prefix-length``), with the field's ``metadata["help"]``. A field name that several methods share is one option, given to each chosen
method that has it. Adding a method (or a field) adds its options; there is no table to keep.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from chorus.adapters import FULL_FINE_TUNING, MethodConfig, get_method, method_names, split_methods

OPTION_TYPES = (int, float, bool, str)  # what one command-line value can hold
FIELDS_PARAMETER = "method_fields"  # the decorated command's parameter that receives the values


@dataclass(frozen=True)
class FieldOption:
    """One command-line option ``--name`` (a Python name): the config field ``field`` of every method in
    ``methods``."""

    name: str
    field: str
    kind: type
    methods: tuple[str, ...]
    help: str


def adapter_methods() -> list[str]:
    """The registered adapter methods (full fine-tuning is not one: it has no config)."""
    return [name for name in method_names() if name != FULL_FINE_TUNING]


def method_help(extra: str = "", *, full: bool = True) -> str:
    """Help of a ``--method`` option, listing the registered methods (and full fine-tuning if ``full``)."""
    listed = ", ".join(method_names() if full else adapter_methods())
    return f"Adapter method: {listed}; combine adapters with + (lora+speaker).{extra}"


def field_options() -> list[FieldOption]:
    """One option per method-specific config field name, across all registered methods."""
    shared = {f.name for f in dataclasses.fields(MethodConfig)}
    found: dict[tuple[str, str], list[tuple[str, type, str]]] = {}
    for method in adapter_methods():
        config_class = get_method(method).config_class
        hints = typing.get_type_hints(config_class)
        for field in dataclasses.fields(config_class):
            if field.name in shared:
                continue
            kind = hints[field.name]
            if kind not in OPTION_TYPES:
                raise TypeError(
                    f"{method} config field {field.name!r} is a {kind}; a command-line option "
                    f"holds one of: {', '.join(t.__name__ for t in OPTION_TYPES)}"
                )
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            text = field.metadata.get("help", f"the {field.name} field of its config").rstrip(".")
            option = field.metadata.get("option", field.name).replace("-", "_")
            found.setdefault((option, field.name), []).append(
                (method, kind, f"{method}: {text} (default {default!r}).")
            )
    options = []
    for (name, field_name), entries in found.items():
        kinds = {kind for _, kind, _ in entries}
        if len(kinds) > 1:
            raise TypeError(f"config field {field_name!r} has different types in {', '.join(m for m, _, _ in entries)}")
        options.append(
            FieldOption(
                name, field_name, kinds.pop(), tuple(m for m, _, _ in entries), " ".join(text for _, _, text in entries)
            )
        )
    if len({option.name for option in options}) < len(options):
        raise TypeError(
            "two config fields ask for the same option name: "
            f"{sorted((option.name, option.field) for option in options)}"
        )
    return options


def with_method_fields(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one option per :func:`field_options` entry to ``command``'s signature (Typer reads it), after
    its ``targets`` (or ``method``) option, and hand their values to ``command`` as its ``method_fields``
    argument (``{field: value}``, None where not given)."""
    options = field_options()
    hints = typing.get_type_hints(command)
    signature = inspect.signature(command)
    parameters = [
        parameter.replace(annotation=hints.get(parameter.name, parameter.annotation))
        for parameter in signature.parameters.values()
        if parameter.name != FIELDS_PARAMETER
    ]
    names = {parameter.name for parameter in parameters}
    clashes = names & {option.name for option in options}
    if clashes:
        raise TypeError(f"{command.__name__} already has options named like method config fields: {sorted(clashes)}")
    # Beside the method options the command names, so --help lists them together.
    after = next(
        (i for i, p in enumerate(parameters) if p.name == "targets"),
        next(i for i, p in enumerate(parameters) if p.name == "method"),
    )
    parameters[after + 1 : after + 1] = [
        inspect.Parameter(
            option.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=option.kind | None,
            default=typer.Option(None, help=option.help),
        )
        for option in options
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {option.name: kwargs.pop(option.name, None) for option in options}
        return command(*args, **kwargs, **{FIELDS_PARAMETER: values})

    wrapper.__signature__ = signature.replace(parameters=parameters)
    wrapper.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters} | {
        "return": hints.get("return")
    }
    return wrapper


def method_options(method: str, values: dict[str, Any], targets: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-method config fields (``{"lora": {"r": 2}}``) from the given option ``values`` and ``--targets``
    (for the first method): an option no chosen method has is an error."""
    chosen = split_methods(method)
    by_name = {option.name: option for option in field_options()}
    options: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if value is None:
            continue
        owners = by_name[name].methods
        takers = [m for m in chosen if m in owners]
        if not takers:
            raise ValueError(f"--{name.replace('_', '-')} applies to {', '.join(owners)}, not to --method {method}")
        for taker in takers:
            options.setdefault(taker, {})[by_name[name].field] = value
    if targets is not None:
        if chosen[0] == FULL_FINE_TUNING:  # it trains every weight: a pattern there was ignored without a word
            raise ValueError("--targets chooses the layers an adapter method adapts; --method full trains every layer")
        parsed = targets if targets.startswith("^") else [t.strip() for t in targets.split(",") if t.strip()]
        options.setdefault(chosen[0], {})["targets"] = parsed
    return options
