"""A command's options as the fields of one dataclass, the command as a function of it.

Each field is one option: its type, default, flags and help in one place, where Typer would read them from a
signature of two dozen parameters. The command receives the dataclass built from what was given, so its
steps take one typed request rather than every option as an argument.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import typer

OPTION = "typer_option"  # the metadata key of a field's typer.Option
Options = TypeVar("Options")


def option(default: Any, *names: str, **settings: Any) -> Any:
    """A dataclass field that is the option ``typer.Option(default, *names, **settings)`` (``...``: a
    required option, and a field without a default)."""
    return given_option(typer.Option(default, *names, **settings))


def given_option(made: Any) -> Any:
    """A dataclass field for an option already made (one that several commands share)."""
    if made.default is ...:
        return dataclasses.field(metadata={OPTION: made})
    return dataclasses.field(default=made.default, metadata={OPTION: made})


def takes_options(options_class: type[Options]) -> Callable[[Callable[[Options], None]], Callable[..., None]]:
    """Give ``command(options)`` the signature Typer reads, one parameter per field of ``options_class`` in
    field order (the order --help lists them in), and call it with the dataclass of their values."""
    hints = typing.get_type_hints(options_class)
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=hints[field.name],
            default=field.metadata[OPTION],
        )
        for field in dataclasses.fields(options_class)
    ]

    def decorate(command: Callable[[Options], None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(**values: Any) -> None:
            command(options_class(**values))

        # Typer reads the parameters from the signature and their types from the annotations.
        run.__signature__ = inspect.Signature(parameters, return_annotation=None)
        run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters} | {"return": None}
        return run

    return decorate
